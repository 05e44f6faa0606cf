"""The trainable encodings, one entry each: everything outside the model's maths that an encoding needs
(the shape of ``encodings.DESIGN_CURVES``).

An entry says which design-time curve of ``encodings.DESIGN_CURVES`` stands for the trained model and
with which parameters (:func:`design_params`, for ``stats.design_resolution``), what kind of position it
is (:attr:`TrainableEncoding.position`: whether BCA applies), how many bias parameters it learns, and how
notebooks show it (its colour in notebook 05's figures, its row in the tables). ``model.MODEL_ENCODINGS``,
``TABLE_ORDER`` (the tables) and ``family_plots.FAMILY_COLOURS`` are read from here. What the encoding
does in the model is ``positions.ENCODING_POSITIONS[name]``, in the shape of `transformers`'
``ROPE_INIT_FUNCTIONS``: a name maps to an object of one interface, which the model calls without
branching on the name. This module needs no torch (a command line can list the names without it).

To add an encoding: its entry here and its :class:`positions.Position` in ``positions.ENCODING_POSITIONS``
(an existing one where it is of an existing kind, a new class beside the others where not), and, if its
design-time curve is new, the curve in ``encodings.DESIGN_CURVES``. ``tests/test_encoding_registry.py``
says what is missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

T5_BUCKETS = 32  # T5's causal buckets (Raffel et al. 2020, §2.1): 16 exact distances, 16 log-spaced

Position = Literal["absolute", "rotary", "bias", "none"]
POSITIONS: tuple[Position, ...] = ("absolute", "rotary", "bias", "none")


@dataclass(frozen=True)
class TrainableEncoding:
    """One trainable encoding.

    - ``design_curve``: its key in ``encodings.DESIGN_CURVES``; a learned bias is taken at its
      initialisation (plan v2): T5's zero table is NoPE's flat curve, KERPLE's p = a = 1 the kerple-log curve.
    - ``design_params``: a ModelConfig as a dict (``cfg.to_dict()``) -> the keyword arguments of
      ``encodings.resolution_pair`` for that curve.
    - ``position``: its kind, "absolute" (added to the input once; BCA cannot apply), "rotary" (q and k
      rotated), "bias" (added to the scores) or "none" (the causal mask carries position); what it does
      is its ``positions.ENCODING_POSITIONS`` entry.
    - ``learned_per_head``: learned bias parameters per head in each layer (0 for none).
    - ``colour``: its matplotlib colour in notebook 05's figures; ``table_order``: its row in the tables.
    """

    name: str
    design_curve: str
    design_params: Callable[[dict], dict]
    position: Position
    learned_per_head: int
    colour: str
    table_order: int

    @property
    def relative(self) -> bool:
        """Whether BCA applies: it needs a relative encoding, and absolute positions are added at the input."""
        return self.position != "absolute"


def _rotary(model: dict) -> dict:
    """head_dim = d_model / n_head, base = rope_base and scale = √head_dim: the curve q·R_n k / √d for
    q = k = ones (the design curve's default scale 8 is √64)."""
    head_dim = model["d_model"] // model["n_head"]
    return {"head_dim": head_dim, "base": float(model["rope_base"]), "scale": math.sqrt(head_dim)}


def _xpos(model: dict) -> dict:
    """RoPE's, with gamma = xpos_gamma and scale_base = xpos_scale_base (an integer in the design curve)."""
    scale_base = float(model["xpos_scale_base"])
    if not scale_base.is_integer():
        raise ValueError(f"xpos_scale_base must be a whole number for the design curve, got {scale_base:g}")
    return {**_rotary(model), "gamma": float(model["xpos_gamma"]), "scale_base": int(scale_base)}


def _alibi(model: dict) -> dict:
    """heads = n_head, scale = alibi_slope_scale (the curve is −scale·m_h·n)."""
    return {"heads": model["n_head"], "scale": float(model["alibi_slope_scale"])}


def _curve_defaults(model: dict) -> dict:
    """The design curve's defaults (sinusoidal: the cosine sum at d = 64, scale 8; the model adds its table
    to width-d_model embeddings, which no design curve follows exactly)."""
    return {}


def _kerple_init(model: dict) -> dict:
    """KERPLE's initialisation, p = a = 1."""
    return {"p": 1.0, "a": 1.0}


# In the order of notebook 05's legends; table_order puts the seed card's rows (rope, sinusoidal, alibi) first.
ENCODINGS: dict[str, TrainableEncoding] = {
    e.name: e
    for e in (
        TrainableEncoding("rope", "rope", _rotary, "rotary", 0, "C0", 0),
        TrainableEncoding("xpos", "xpos", _xpos, "rotary", 0, "C1", 3),
        TrainableEncoding("alibi", "alibi", _alibi, "bias", 0, "C2", 2),
        TrainableEncoding("sinusoidal", "sinusoidal", _curve_defaults, "absolute", 0, "C3", 1),
        TrainableEncoding("nope", "nope", _curve_defaults, "none", 0, "C4", 4),
        TrainableEncoding("t5", "nope", _curve_defaults, "bias", T5_BUCKETS, "C5", 6),
        TrainableEncoding("kerple", "kerple-log", _kerple_init, "bias", 2, "C6", 5),  # p_h and a_h
    )
}
TABLE_ORDER = tuple(sorted(ENCODINGS, key=lambda name: ENCODINGS[name].table_order))
DEFAULT_ENCODING = "rope"  # ModelConfig's encoding when none is given


def design_params(encoding: str, model: dict) -> dict:
    """The keyword arguments of ``encodings.resolution_pair`` that describe a trained model's encoding at
    design time (its entry's ``design_params``); ``model`` is its ModelConfig as a dict."""
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise ValueError(f"no design-time curve for encoding {encoding!r}; known: {', '.join(ENCODINGS)}")
    return ENCODINGS[encoding].design_params(model)
