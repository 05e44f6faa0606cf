"""attnres: a teaching companion for attention resolution (Sun et al. 2022, xPos)."""

from .resolution import (
    BOUNDARIES,
    HEAD_MODES,
    ScoreAccumulator,
    average_resolution,
    expected_scores,
    layer_resolution,
    resolution,
)

__all__ = [
    "BOUNDARIES",
    "HEAD_MODES",
    "ScoreAccumulator",
    "average_resolution",
    "expected_scores",
    "layer_resolution",
    "resolution",
]
