"""One pretrained RoPE model under training-free configurations (plans v3 and v4, notebook 08).

A real model's attention can be changed at inference without retraining in three ways, and each
configuration is one entry of :data:`CONFIGURATIONS` that says all three (sizes as fractions of the
model's L, so one entry serves any model):

- **frequencies**: `transformers`' RoPE parameters (``ROPE_INIT_FUNCTIONS``: ``linear`` is position
  interpolation, Chen et al. 2023; ``dynamic`` is dynamic NTK; ``yarn`` is YaRN, Peng et al. 2023), or a
  new base (static NTK-aware scaling, θ·α^(d/(d−2)));
- **positions**: a :class:`Remap` (one of :data:`REMAPS`) keeps the true positions for pairs closer than
  its window and gives every token a second position for the pairs beyond it; the two score matrices are
  merged by distance before the softmax (Self-Extend, Jin et al. 2024; ReRoPE and leaky ReRoPE, Su 2023;
  LM-Infinite's distance cap, Han et al. 2023);
- **the mask** (:class:`attnres_helpers.masks.Mask`): BCA, a window, each keeping the first tokens or not.

Each entry also records its **kind** (:data:`KINDS`), the strata of plan v4's within-kind test. Every list
of configurations is derived from the registry. Within :func:`applied` the model computes its attention
through :mod:`.configured_attention` (query blocks over the keys each block can see):

    with applied(model, CONFIGURATIONS["self-extend-8-8"], train_len=8192):
        ...   # every attention layer now attends as Self-Extend does
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..masks import Mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

KINDS = ("as-trained", "rescaled", "remapped", "masked", "windowed")


def self_extend_positions(pos: torch.Tensor, window: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-Extend's grouped positions (``datamllab/LongLM``, ``self_extend_patch/Llama.py``): query
    ``i // G + W − W / G``, key ``j // G`` (true division in the shift, as the patch writes it; the
    registry's pairs have G dividing W, where it equals the ``W − W // G`` of the paper's description)."""
    return pos // group + window - window / group, pos // group


def rerope_positions(pos: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ReRoPE (``bojone/rerope``): every query at ``w``, every key at 0, so every far pair is at distance w."""
    return torch.full_like(pos, window), torch.zeros_like(pos)


def leaky_rerope_positions(pos: torch.Tensor, window: int, slope: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Leaky ReRoPE (``bojone/rerope``, leaky patch): query ``i/k + w − w/k``, key ``j/k``, so a far pair
    at distance d is at ``w + (d − w)/k``."""
    return pos.double() / slope + window - window / slope, pos.double() / slope


REMAPS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "self-extend": self_extend_positions,
    "rerope": rerope_positions,
    "leaky-rerope": leaky_rerope_positions,
}


@dataclass(frozen=True)
class Remap:
    """Pairs at distance < ``window`` keep their true positions; farther pairs take each token's far
    position from ``REMAPS[rule](positions, window, *params)``."""

    rule: str
    window: int
    params: tuple[int, ...] = ()

    def __post_init__(self):
        if self.rule not in REMAPS:
            raise ValueError(f"unknown position remap {self.rule!r}; known: {', '.join(REMAPS)}")
        if self.window < 1:
            raise ValueError(f"a remap's window must be at least 1 token, got {self.window}")

    def far_positions(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(query positions, key positions) (T,) for the far pairs of a window of T tokens."""
        return REMAPS[self.rule](torch.arange(T), self.window, *self.params)

    def distance(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """The distance RoPE sees for query i and key j (i ≥ j), written from the rule's definition."""
        pq, pk = REMAPS[self.rule](torch.arange(int(max(i.max(), j.max())) + 1), self.window, *self.params)
        return torch.where(i - j < self.window, (i - j).double(), (pq[i] - pk[j]).double())

    def as_dict(self) -> dict:
        return {"rule": self.rule, "window": self.window, "params": list(self.params)}


@dataclass(frozen=True)
class Configuration:
    """``rope``: RoPE parameters that replace the model's (``rope_theta`` kept), or None; ``base_factor``:
    a static NTK-aware base θ·α^(d/(d−2)) for α = base_factor; ``remap``: (rule, window as a fraction of
    L, params) or None; ``mask``: (kind, size as a fraction of L, sinks). ``same_as_trained_up_to_L``:
    inside L this configuration computes exactly what the model as trained computes (the tests check it),
    so it is measured once there."""

    name: str
    label: str
    kind: str
    rope: dict | None = None
    base_factor: float | None = None
    remap: tuple[str, float, tuple[int, ...]] | None = None
    mask: tuple[str, float | None, int] = ("causal", None, 0)
    same_as_trained_up_to_L: bool = False
    notes: str = field(default="", compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.rope is not None and self.base_factor is not None:
            raise ValueError(f"{self.name}: a RoPE type and a new base are two ways to say one thing; give one")

    def rope_for(self, theta: float, train_len: int, head_dim: int = 64) -> dict | None:
        """The RoPE parameters this configuration gives a model of base ``theta``, context ``train_len``
        and head size ``head_dim``; None where it keeps the model's."""
        if self.base_factor is not None:
            return {"rope_type": "default", "rope_theta": theta * self.base_factor ** (head_dim / (head_dim - 2))}
        if self.rope is None:
            return None
        rope = {**self.rope, "rope_theta": theta}
        if "original_max_position_embeddings" in rope:
            rope["original_max_position_embeddings"] = train_len
        return rope

    def remap_for(self, train_len: int) -> Remap | None:
        if self.remap is None:
            return None
        rule, fraction, params = self.remap
        return Remap(rule, int(round(fraction * train_len)), tuple(params))

    def mask_for(self, train_len: int) -> Mask:
        kind, fraction, sinks = self.mask
        return Mask(kind, None if fraction is None else int(round(fraction * train_len)), sinks)


def _yarn(factor: float) -> dict:
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": None}


CONFIGURATIONS = {
    c.name: c
    for c in (
        Configuration("as-trained", "as trained", "as-trained", same_as_trained_up_to_L=True),
        Configuration("pi-2", "position interpolation ×2", "rescaled", rope={"rope_type": "linear", "factor": 2.0}),
        Configuration("yarn-2", "YaRN ×2", "rescaled", rope=_yarn(2.0)),
        Configuration("yarn-4", "YaRN ×4", "rescaled", rope=_yarn(4.0)),
        Configuration(
            "ntk-2",
            "dynamic NTK ×2",
            "rescaled",
            rope={"rope_type": "dynamic", "factor": 2.0},
            same_as_trained_up_to_L=True,
            notes="transformers rescales the base only for sequences longer than max_position_embeddings",
        ),
        Configuration("ntk-static-2", "static NTK-aware base ×2", "rescaled", base_factor=2.0),
        Configuration("self-extend-8-8", "Self-Extend W = L/8, G = 8", "remapped", remap=("self-extend", 1 / 8, (8,))),
        Configuration(
            "self-extend-16-16", "Self-Extend W = L/16, G = 16", "remapped", remap=("self-extend", 1 / 16, (16,))
        ),
        Configuration("rerope-4", "ReRoPE w = L/4", "remapped", remap=("rerope", 1 / 4, ())),
        Configuration(
            "leaky-rerope-4-16", "leaky ReRoPE w = L/4, k = 16", "remapped", remap=("leaky-rerope", 1 / 4, (16,))
        ),
        Configuration("bca-4", "BCA (blocks of L/4)", "masked", mask=("bca", 0.25, 0)),
        Configuration("bca", "BCA (blocks of L/2)", "masked", mask=("bca", 0.5, 0), same_as_trained_up_to_L=True),
        Configuration(
            "bca-sink", "BCA keeping the first 4 tokens", "masked", mask=("bca", 0.5, 4), same_as_trained_up_to_L=True
        ),
        Configuration(
            "window", "a window of L, no sinks", "windowed", mask=("window", 1.0, 0), same_as_trained_up_to_L=True
        ),
        Configuration(
            "streaming",
            "first 4 tokens + window of L",
            "windowed",
            mask=("window", 1.0, 4),
            same_as_trained_up_to_L=True,
            notes="StreamingLLM's mask at the text's positions: its official code also moves every cached key to "
            "its position in the cache (pos_shift), which puts the sinks just beyond the window; lm-infinite's cap "
            "is the closer match",
        ),
        Configuration(
            "lm-infinite",
            "LM-Infinite: first 10 tokens + window of L, distance capped at L",
            "windowed",
            remap=("rerope", 1.0, ()),
            mask=("window", 1.0, 10),
            same_as_trained_up_to_L=True,
        ),
    )
}
NAMES = tuple(CONFIGURATIONS)
PLAN_V3 = ("as-trained", "pi-2", "yarn-2", "ntk-2", "bca", "bca-sink", "streaming")  # plan v3's seven


def rotary_module(model: PreTrainedModel):
    """The model's one rotary embedding module; a one-line error for a model with none or several."""
    base = model.base_model
    found = [
        name for name, m in base.named_children() if "rotary" in name.lower() or "rotary" in type(m).__name__.lower()
    ]
    if found != ["rotary_emb"]:
        what = "no rotary embedding" if not found else f"rotary modules {', '.join(found)}"
        raise ValueError(
            f"{model.config.model_type} has {what}: a configuration needs one RoPE module to reconfigure "
            "(models with two RoPE bases, such as Gemma 3, are not supported)"
        )
    return base.rotary_emb


def check_config(config, configuration: Configuration) -> None:
    """A one-line ValueError if a model of this `transformers` config cannot take ``configuration``,
    before any weight is read: it needs one RoPE (``rope_parameters`` with one ``rope_theta``)."""
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) or not isinstance(rope.get("rope_theta"), (int, float)):
        kind = "several RoPE bases (one per layer type)" if isinstance(rope, dict) and rope else "no rotary embedding"
        raise ValueError(
            f"{config.model_type} has {kind}: configuration {configuration.name!r} needs one RoPE base to "
            "reconfigure (models with two RoPE bases, such as Gemma 3, are not supported)"
        )


def check_applies(model: PreTrainedModel, configuration: Configuration) -> None:
    """A one-line ValueError if ``configuration`` cannot be applied to ``model`` (before any work)."""
    if configuration.name not in CONFIGURATIONS or CONFIGURATIONS[configuration.name] != configuration:
        raise ValueError(f"unknown configuration {configuration.name!r}; known: {', '.join(NAMES)}")
    rotary = rotary_module(model)
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    if rotary.inv_freq.numel() * 2 != head_dim:
        raise ValueError(
            f"{model.config.model_type} rotates {rotary.inv_freq.numel() * 2} of its {head_dim} head dimensions "
            "(partial rotary): the configurations rotate whole heads"
        )


class _Unrotated(torch.nn.Module):
    """A rotary module that rotates by nothing (cos 1, sin 0): q and k reach the attention function as
    projected, and :mod:`.configured_attention` rotates them by the configuration's positions."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*position_ids.shape, self.head_dim)
        return torch.ones(shape, dtype=x.dtype, device=x.device), torch.zeros(shape, dtype=x.dtype, device=x.device)

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim


@contextmanager
def applied(model: PreTrainedModel, configuration: Configuration, train_len: int) -> Iterator[None]:
    """Within the block, ``model`` attends as ``configuration`` says (its frequencies, positions and mask,
    through :mod:`.configured_attention`); the model's parameters, rotary module and attention
    implementation are restored afterwards."""
    from . import configured_attention

    check_applies(model, configuration)
    base = model.base_model
    before_params, before_module = dict(model.config.rope_parameters), base.rotary_emb
    head_dim = before_module.inv_freq.numel() * 2
    rope = configuration.rope_for(before_params["rope_theta"], train_len, head_dim)
    try:
        if rope is not None:
            model.config.rope_parameters = rope
        rotary = before_module
        if rope is not None:  # on the model's device
            rotary = type(before_module)(config=model.config).to(before_module.inv_freq.device)
        base.rotary_emb = _Unrotated(head_dim)
        with configured_attention.attending(
            model, rotary, configuration.remap_for(train_len), configuration.mask_for(train_len)
        ):
            yield
    finally:
        model.config.rope_parameters = before_params
        base.rotary_emb = before_module
