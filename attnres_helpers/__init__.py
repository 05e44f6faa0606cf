"""attnres: a teaching companion for attention resolution (Sun et al. 2022, xPos)."""

from .encodings import DESIGN_CURVES, default_params, resolution_pair, score_curve
from .metric import (
    BOUNDARIES,
    HEAD_MODES,
    ScoreAccumulator,
    average_resolution,
    expected_scores,
    layer_resolution,
    resolution,
)

__all__ = [
    "DESIGN_CURVES",
    "default_params",
    "resolution_pair",
    "score_curve",
    "BOUNDARIES",
    "HEAD_MODES",
    "ScoreAccumulator",
    "average_resolution",
    "expected_scores",
    "layer_resolution",
    "resolution",
]
