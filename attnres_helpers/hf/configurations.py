"""One pretrained RoPE model under several inference-time configurations (plan v3, notebook 08).

A real model's encoding can be changed at inference without retraining, through `transformers`' RoPE
parameters (``ROPE_INIT_FUNCTIONS``: ``linear`` is position interpolation, Chen et al. 2023;
``dynamic`` is dynamic NTK scaling; ``yarn`` is YaRN, Peng et al. 2023), and so can its mask
(:mod:`attnres_helpers.masks`: BCA, a StreamingLLM window that keeps the first tokens). Each entry of
:data:`CONFIGURATIONS` is one such configuration, and every list of configurations is derived from it.
Sizes are given as fractions of the model's L, so the same entry serves any model.

    with applied(model, CONFIGURATIONS["yarn-2"], train_len=8192) as mask:
        ...   # the model now rotates by YaRN; ``mask`` is the Mask to hand it (or None: causal)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..masks import Mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Configuration:
    """``rope``: the RoPE parameters that replace the model's (``rope_theta`` kept), or None;
    ``mask``: (kind, size as a fraction of L, sinks). ``same_as_trained_up_to_L``: inside L this
    configuration computes exactly what the model as trained computes (so it is measured once there)."""

    name: str
    label: str
    rope: dict | None = None
    mask: tuple[str, float | None, int] = ("causal", None, 0)
    same_as_trained_up_to_L: bool = False
    notes: str = field(default="", compare=False)

    def rope_for(self, theta: float, train_len: int) -> dict | None:
        """The RoPE parameters this configuration gives a model of base ``theta`` and context ``train_len``."""
        if self.rope is None:
            return None
        rope = {**self.rope, "rope_theta": theta}
        if "original_max_position_embeddings" in rope:
            rope["original_max_position_embeddings"] = train_len
        return rope

    def mask_for(self, train_len: int) -> Mask:
        kind, fraction, sinks = self.mask
        return Mask(kind, None if fraction is None else int(round(fraction * train_len)), sinks)


CONFIGURATIONS = {
    c.name: c
    for c in (
        Configuration("as-trained", "as trained", same_as_trained_up_to_L=True),
        Configuration("pi-2", "position interpolation ×2", rope={"rope_type": "linear", "factor": 2.0}),
        Configuration(
            "yarn-2", "YaRN ×2", rope={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": None}
        ),
        Configuration(
            "ntk-2",
            "dynamic NTK ×2",
            rope={"rope_type": "dynamic", "factor": 2.0},
            same_as_trained_up_to_L=True,
            notes="transformers rescales the base only for sequences longer than max_position_embeddings",
        ),
        Configuration("bca", "BCA (blocks of L/2)", mask=("bca", 0.5, 0), same_as_trained_up_to_L=True),
        Configuration("bca-sink", "BCA keeping the first 4 tokens", mask=("bca", 0.5, 4), same_as_trained_up_to_L=True),
        Configuration(
            "streaming", "first 4 tokens + window of L", mask=("window", 1.0, 4), same_as_trained_up_to_L=True
        ),
    )
}
NAMES = tuple(CONFIGURATIONS)


def _rotary(model: PreTrainedModel):
    base = model.base_model
    if not hasattr(base, "rotary_emb"):
        raise ValueError(f"{model.config.model_type} has no rotary embedding module to reconfigure")
    return base


@contextmanager
def applied(model: PreTrainedModel, configuration: Configuration, train_len: int) -> Iterator[Mask | None]:
    """Within the block, ``model`` rotates by the configuration's RoPE parameters; yields its Mask
    (None for the causal mask). The model's own parameters and rotary module are restored afterwards."""
    if configuration.name not in CONFIGURATIONS or CONFIGURATIONS[configuration.name] != configuration:
        raise ValueError(f"unknown configuration {configuration.name!r}; known: {', '.join(NAMES)}")
    mask = configuration.mask_for(train_len)
    if configuration.rope is None:
        yield None if mask.kind == "causal" and not mask.sinks else mask
        return
    base = _rotary(model)
    before_params, before_module = dict(model.config.rope_parameters), base.rotary_emb
    model.config.rope_parameters = configuration.rope_for(before_params["rope_theta"], train_len)
    try:
        base.rotary_emb = type(before_module)(config=model.config)
        yield None if mask.kind == "causal" and not mask.sinks else mask
    finally:
        model.config.rope_parameters = before_params
        base.rotary_emb = before_module
