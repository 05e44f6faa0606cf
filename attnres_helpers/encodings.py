"""Design-time score curves s[n] of position encodings, and their resolution pair.

Sun et al. 2022 (§3.1) note that s[n], the expected pre-softmax score at token distance
n, follows from an encoding's own form, so R(s) is "available at design time". Each
function below returns s[n] for n = 0..N-1 under an assumption stated in its docstring
(for the rotary forms: the paper's Figure 1, equal |q_i k_i| in every dimension).

Every encoding has a ``scale``: a multiplier on the scores (an inverse temperature).
R is not invariant to it (it is invariant to adding a constant), so a design-time R
is a statement about the shape *and* the temperature you assumed.

``DESIGN_CURVES`` lists each encoding's parameters with defaults and (low, high, step)
ranges; :func:`score_curve` and :func:`resolution_pair` check values against it, and
the explorer's sliders are built from it. Called directly, the curve functions bound
every scale-like parameter (``scale``, ALiBi's ``slope``, KERPLE's ``p`` and ``a``, T5's
``bias_decay``) by :data:`SCALE_LIMIT` in magnitude.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral, Real

import numpy as np
import torch
from numpy.typing import ArrayLike

from .metric import Boundary, HeadMode, layer_resolution, resolution
from .model import alibi_slopes as model_alibi_slopes

# --------------------------------------------------------------------------- checks

SCALE_LIMIT = 1e6
"""Bound on |scale-like parameter| for the curve functions. Far past any sensible temperature
(from ~40 nats per distance on, the softmax puts all its weight on n = 0 and R is 1 to float64
precision), and small enough that s[n] and the differences the softmax takes stay finite."""


def _check_length(value, name: str = "N") -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 2:
        raise ValueError(f"{name} must be an integer >= 2 (distances 0..{name}-1), got {value!r}")


def _check_real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_at_least(value, name: str, low: float, strict: bool = False) -> float:
    value = _check_real(value, name)
    if value < low or (strict and value == low):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {low:g}, got {value:g}")
    return value


def _check_scale_like(value, name: str, low: float = -SCALE_LIMIT, strict: bool = False) -> float:
    """A finite number >= ``low`` (> if ``strict``) and <= :data:`SCALE_LIMIT`."""
    value = _check_at_least(value, name, low, strict) if low > -SCALE_LIMIT else _check_real(value, name)
    if not -SCALE_LIMIT <= value <= SCALE_LIMIT:
        bracket = "(" if strict else "["
        raise ValueError(f"{name} must lie in {bracket}{low:g}, {SCALE_LIMIT:g}], got {value:g}")
    return value


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _rotary_cosines(N: int, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos(n θ_i) as ``(N, d/2)`` and the distances ``n (N,)``, θ_i = base^{-2i/d}."""
    _check_length(N)
    if isinstance(head_dim, bool) or not isinstance(head_dim, Integral) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even integer >= 2 for a rotary form, got {head_dim!r}")
    base = _check_at_least(base, "base", 1.0, strict=True)
    theta = base ** (-np.arange(0, head_dim, 2) / head_dim)  # (d/2,)
    n = np.arange(N, dtype=np.float64)  # (N,)
    return np.cos(np.outer(n, theta)), n  # (N, d/2)


# --------------------------------------------------------------------------- curves


def rope_score_curve(
    N: int, head_dim: int = 64, base: float = 10000.0, rho: float = 1.0, scale: float = 8.0
) -> np.ndarray:
    """RoPE (Su et al., RoFormer eq. 15): s[n] = scale · rho · (2/d) Σ_{i<d/2} cos(n θ_i), θ_i = base^{-2i/d}.

    Normalisation: the mean over the d/2 frequencies, so s[0] = scale · rho and ``scale``
    is the distance-0 score in nats. q = k = ones rotated by n and scaled the usual way
    gives q·R_n k / √d = (2/√d) Σ cos(n θ_i) = √d · mean_i cos(n θ_i): the default
    scale 8 = √64 is exactly that at d = 64 (at another d, pass scale = √d to keep it).

    rho = 1 is the paper's Figure 1 (q = k = ones). Random alignment: for q, k with
    unit-variance coordinates, independent across coordinates, and corr(q_j, k_j) = rho,
    E[q·R_n k] = Σ_i cos(n θ_i)(E[q_2i k_2i] + E[q_2i+1 k_2i+1]) + sin terms whose
    cross-coordinate expectations vanish = 2 rho Σ_i cos(n θ_i), i.e. rho times the
    ones curve. At design time alignment is therefore indistinguishable from the scale.
    (As in the paper's s[n], the expectation is of the score, before the softmax.)
    """
    cosines, _ = _rotary_cosines(N, head_dim, base)
    rho = _check_real(rho, "rho")
    if not -1.0 <= rho <= 1.0:
        raise ValueError(f"rho is a correlation and must lie in [-1, 1], got {rho:g}")
    return _check_scale_like(scale, "scale") * rho * cosines.mean(axis=1)  # (N,)


def sinusoidal_score_curve(N: int, head_dim: int = 64, base: float = 10000.0, scale: float = 8.0) -> np.ndarray:
    """Sinusoidal absolute (Vaswani et al. 2017): the position–position term of q·k.

    With identity projections, PE(m)·PE(m−n) = Σ_i [sin(mω_i) sin((m−n)ω_i) + cos(mω_i)
    cos((m−n)ω_i)] = Σ_{i<d/2} cos(n ω_i), ω_i = base^{-2i/d}, whatever m is. Normalised
    like :func:`rope_score_curve` (mean over frequencies, s[0] = scale), this is the
    *same curve* as RoPE's: the two differ in what training does with the position
    signal (added to the input and mixed by learned projections, or rotated into every
    q·k), not in the design-time form.
    """
    cosines, _ = _rotary_cosines(N, head_dim, base)
    return _check_scale_like(scale, "scale") * cosines.mean(axis=1)  # (N,)


def xpos_score_curve(
    N: int, head_dim: int = 64, base: float = 10000.0, gamma: float = 0.4, scale_base: float = 512.0, scale: float = 8.0
) -> np.ndarray:
    """xPos (Sun et al. 2022, Eq. 9; torchscale ``xpos_relative_position.py``), Figure 1's curve.

    s[n] = scale · (2/d) Σ_{i<d/2} cos(n θ_i) ζ_i^{n/B}, ζ_i = (2i/d + γ)/(1 + γ), B = scale_base.
    The query at m is scaled by ζ^{m/B} and the key at m−n by ζ^{−(m−n)/B}, so each
    dimension pair's score carries ζ_i^{n/B}. q = k = ones, normalised like RoPE
    (s[0] = scale). As γ → ∞, ζ_i → 1 and this is RoPE's curve.
    """
    cosines, n = _rotary_cosines(N, head_dim, base)
    gamma = _check_at_least(gamma, "gamma", 0.0, strict=True)
    scale_base = _check_at_least(scale_base, "scale_base", 0.0, strict=True)
    zeta = (np.arange(0, head_dim, 2) / head_dim + gamma) / (1.0 + gamma)  # (d/2,)
    decay = np.exp(np.outer(n / scale_base, np.log(zeta)))  # (N, d/2): ζ_i^{n/B}
    return _check_scale_like(scale, "scale") * (cosines * decay).mean(axis=1)  # (N,)


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi head slopes (Press et al. 2022): 2^{-8h/H}, h = 1..H (other H as in the official code),
    as float64 numpy: the trained model's :func:`attnres_helpers.model.alibi_slopes`, one formula for both."""
    return model_alibi_slopes(_check_int(heads, "heads", 1), torch.float64).numpy()  # (H,)


def alibi_score_curve(N: int, heads: int = 8, slope: float | None = None, scale: float = 1.0) -> np.ndarray:
    """ALiBi (Press et al. 2022): s_h[n] = −scale · m_h · n, the bias alone (content scores equal).

    Returns ``(H, N)`` with the standard slopes :func:`alibi_slopes` (``heads``), or
    ``(N,)`` for one given ``slope`` in [0, :data:`SCALE_LIMIT`]. Average heads with
    :func:`attnres_helpers.metric.layer_resolution`: ``"mean-scores"`` is one
    geometric profile with the mean slope, ``"mean-R"`` averages each head's R.
    Each profile is geometric in e^{s}, so R has a closed form (see the tests).
    """
    _check_length(N)
    scale = _check_scale_like(scale, "scale")
    if slope is None:
        slopes = alibi_slopes(heads)[:, None]  # (H, 1)
    else:
        slopes = np.asarray(_check_scale_like(slope, "slope", 0.0))
    return -scale * slopes * np.arange(N)  # (H, N) or (N,)


def nope_score_curve(N: int, scale: float = 1.0) -> np.ndarray:
    """NoPE (Haviv et al. 2022; Kazemnejad et al. 2023): no positional term, s[n] = 0.

    Flat, so ``scale`` does nothing and R is 1/N² (boundary "zero") or 0 ("drop"):
    the only design-time signal left is the boundary convention. Position is still in
    the model through the causal mask (query i sees exactly i+1 keys, so it can count),
    but what a NoPE model does with that is learned, not visible in its form.
    """
    _check_length(N)
    _check_scale_like(scale, "scale")
    return np.zeros(N)  # (N,)


def kerple_log_score_curve(N: int, p: float = 1.0, a: float = 1.0, scale: float = 1.0) -> np.ndarray:
    """KERPLE, logarithmic variant (Chi et al. 2022): s[n] = −scale · p · log(1 + a n), p, a >= 0.

    e^{s} = (1 + a n)^{−scale·p}, a power law: at scale · p <= 1 its tail mass grows
    without bound with N, so R keeps falling as the window grows.
    """
    _check_length(N)
    p = _check_scale_like(p, "p", 0.0)
    a = _check_scale_like(a, "a", 0.0)
    return -_check_scale_like(scale, "scale") * p * np.log1p(a * np.arange(N))  # (N,)


def kerple_power_score_curve(N: int, p: float = 0.5, a: float = 1.0, scale: float = 1.0) -> np.ndarray:
    """KERPLE, power variant (Chi et al. 2022): s[n] = −scale · a · n^p, 0 < p <= 2, a >= 0.

    p = 1 is ALiBi with one slope a; p < 1 decays slower than ALiBi far away.
    """
    _check_length(N)
    p = _check_at_least(p, "p", 0.0, strict=True)
    if p > 2.0:
        raise ValueError(f"p must lie in (0, 2] for KERPLE's power kernel, got {p:g}")
    a = _check_scale_like(a, "a", 0.0)
    return -_check_scale_like(scale, "scale") * a * np.arange(N, dtype=np.float64) ** p  # (N,)


def t5_buckets(N: int, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """T5's causal relative-position bucket of each distance n = 0..N-1 (Raffel et al. 2020).

    The first num_buckets//2 distances get their own bucket, the rest are log-spaced up
    to max_distance; every distance beyond shares the last bucket.
    """
    _check_length(N)
    num_buckets = _check_int(num_buckets, "num_buckets", 2)
    exact = num_buckets // 2
    max_distance = _check_int(max_distance, "max_distance", 1)
    if max_distance <= exact:
        raise ValueError(f"max_distance must exceed num_buckets // 2 = {exact}, got {max_distance}")
    n = np.arange(N)
    log_spaced = exact + (
        np.log(np.maximum(n, exact) / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    ).astype(np.int64)
    return np.where(n < exact, n, np.minimum(log_spaced, num_buckets - 1))  # (N,)


def t5_score_curve(
    N: int, num_buckets: int = 32, max_distance: int = 128, bias_decay: float = 0.2, scale: float = 1.0
) -> np.ndarray:
    """T5 relative bias from a monotone profile over its buckets: s[n] = −scale · bias_decay · bucket(n).

    T5 learns one scalar per bucket (and head); a bias falling linearly in the bucket
    index is our stand-in (the default 0.2 nats a bucket is illustrative, not learned).
    Beyond max_distance the curve is flat, so its tail mass grows linearly with N.
    """
    buckets = t5_buckets(N, num_buckets, max_distance)
    bias_decay = _check_scale_like(bias_decay, "bias_decay", 0.0)
    return -_check_scale_like(scale, "scale") * bias_decay * buckets  # (N,)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Param:
    """One slider-able parameter: its default and the range the explorer and score_curve accept.

    ``kind`` is "float", "int" or "log" (log: a slider over log10 of the value, ``step``
    in decades).
    """

    default: float
    low: float
    high: float
    step: float
    kind: str = "float"

    def check(self, name: str, value: object) -> None:
        number = _check_real(value, name)
        if self.kind == "int" and (isinstance(value, bool) or not isinstance(value, Integral)):
            raise ValueError(f"{name} must be an integer in [{self.low:g}, {self.high:g}], got {value!r}")
        if not self.low <= number <= self.high:
            raise ValueError(f"{name}={number:g} is outside its range [{self.low:g}, {self.high:g}]")


@dataclass(frozen=True)
class Encoding:
    curve: Callable
    params: dict  # name -> Param, in slider order
    summary: str
    # its look in the design explorer's plots (matplotlib line keywords): curves stay apart where they
    # overlap (RoPE dashed over sinusoidal)
    style: dict = field(default_factory=dict)


_HEAD_DIM = Param(64, 2, 256, 2, "int")
_BASE = Param(10000.0, 10.0, 1e7, 0.1, "log")
_ROTARY_SCALE = Param(8.0, 0.0, 32.0, 0.25)
_BIAS_SCALE = Param(1.0, 0.0, 4.0, 0.05)

DESIGN_CURVES: dict[str, Encoding] = {
    "sinusoidal": Encoding(
        sinusoidal_score_curve,
        {"head_dim": _HEAD_DIM, "base": _BASE, "scale": _ROTARY_SCALE},
        "absolute sin/cos, position–position term: the same cosine sum as RoPE",
        style=dict(color="C0", linestyle="-", linewidth=3.0, alpha=0.55),
    ),
    "rope": Encoding(
        rope_score_curve,
        {"head_dim": _HEAD_DIM, "base": _BASE, "rho": Param(1.0, -1.0, 1.0, 0.05), "scale": _ROTARY_SCALE},
        "rotary, q = k = ones (rho = 1) or q, k with correlation rho",
        style=dict(color="C1", linestyle=(0, (4, 2)), linewidth=1.6),
    ),
    "xpos": Encoding(
        xpos_score_curve,
        {
            "head_dim": _HEAD_DIM,
            "base": _BASE,
            "gamma": Param(0.4, 0.05, 10.0, 0.05),
            "scale_base": Param(512, 16, 8192, 16, "int"),
            "scale": _ROTARY_SCALE,
        },
        "rotary with per-frequency decay ζ_i^{n/B}",
        style=dict(color="C2", linestyle=":", linewidth=2.0, marker="^", markevery=0.12, markersize=4),
    ),
    "alibi": Encoding(
        alibi_score_curve,
        {"heads": Param(8, 1, 64, 1, "int"), "scale": _BIAS_SCALE},
        "linear bias −m_h·n with geometric head slopes",
        style=dict(color="C3", linestyle="-", linewidth=1.4),
    ),
    "nope": Encoding(
        nope_score_curve,
        {"scale": _BIAS_SCALE},
        "no positional term: flat",
        style=dict(color="C7", linestyle="-.", linewidth=1.4),
    ),
    "kerple-log": Encoding(
        kerple_log_score_curve,
        {"p": Param(1.0, 0.0, 8.0, 0.05), "a": Param(1.0, 0.0, 8.0, 0.05), "scale": _BIAS_SCALE},
        "bias −p·log(1 + a·n)",
        style=dict(color="C4", linestyle=(0, (6, 1, 1, 1)), linewidth=1.4, marker="o", markevery=0.12, markersize=3),
    ),
    "kerple-power": Encoding(
        kerple_power_score_curve,
        {"p": Param(0.5, 0.05, 2.0, 0.05), "a": Param(1.0, 0.0, 8.0, 0.05), "scale": _BIAS_SCALE},
        "bias −a·n^p",
        style=dict(color="C5", linestyle=(0, (1, 1)), linewidth=1.6),
    ),
    "t5": Encoding(
        t5_score_curve,
        {
            "num_buckets": Param(32, 2, 128, 2, "int"),
            "max_distance": Param(128, 4, 4096, 4, "int"),
            "bias_decay": Param(0.2, 0.0, 2.0, 0.05),
            "scale": _BIAS_SCALE,
        },
        "bucketed relative bias, flat beyond max_distance",
        style=dict(color="C6", linestyle="--", linewidth=1.4, marker="s", markevery=0.12, markersize=3),
    ),
}


def _encoding(name: str) -> Encoding:
    if not isinstance(name, str):
        raise ValueError(
            f"the encoding name must be a string, got {type(name).__name__} {name!r}; "
            f"known encodings: {', '.join(DESIGN_CURVES)}"
        )
    if name not in DESIGN_CURVES:
        raise ValueError(f"unknown encoding {name!r}; known encodings: {', '.join(DESIGN_CURVES)}")
    return DESIGN_CURVES[name]


def default_params(name: str) -> dict:
    """The registry defaults of one encoding, as keyword arguments."""
    return {key: param.default for key, param in _encoding(name).params.items()}


def score_curve(name: str, N: int, **params: float) -> np.ndarray:
    """s[n] for n = 0..N-1 of encoding ``name``: ``(N,)``, or ``(H, N)`` for ALiBi's heads.

    Parameters missing from ``params`` take the registry defaults; each given one must
    be a keyword of that encoding and, if the registry lists it, inside its range.
    """
    encoding = _encoding(name)
    _check_length(N)
    accepted = [key for key in inspect.signature(encoding.curve).parameters if key != "N"]
    for key, value in params.items():
        if key not in accepted:
            raise ValueError(f"{name} has no parameter {key!r}; its parameters: {', '.join(accepted)}")
        if key in encoding.params:
            encoding.params[key].check(key, value)
    return encoding.curve(N, **{**default_params(name), **params})


def resolution_pair(
    name: str, L: int, head_mode: HeadMode = "mean-scores", boundary: Boundary = "zero", **params: float
) -> tuple[float, float]:
    """(R at L, R at 2L): R of the curve over distances 0..L-1 and over 0..2L-1.

    Every curve here depends on n alone, so the curve over 0..L-1 is the first half of
    the one over 0..2L-1 and is computed once. Per-head curves (ALiBi) are combined with
    :func:`layer_resolution` under ``head_mode`` ("mean-scores" or "mean-R").
    """
    _check_length(L, "L")
    return curve_pair(score_curve(name, 2 * L, **params), L, head_mode, boundary)


def curve_pair(
    curve: ArrayLike | torch.Tensor, L: int, head_mode: HeadMode = "mean-scores", boundary: Boundary = "zero"
) -> tuple[float, float]:
    """(R over distances 0..L-1, R over all of ``curve``), for a curve ``(2L,)`` or ``(H, 2L)``.

    The curve must hold exactly 2L distances on its last axis (as :func:`resolution_pair`
    and the explorer build it); any other length raises ValueError, since the second
    number would then not be R at 2L.
    """
    _check_length(L, "L")
    if not hasattr(curve, "shape"):
        curve = np.asarray(curve, dtype=np.float64)
    if curve.ndim not in (1, 2):
        raise ValueError(f"curve must have shape (2L,) or (H, 2L), got shape {tuple(curve.shape)}")
    if curve.shape[-1] != 2 * L:
        raise ValueError(
            f"curve must have 2L = {2 * L} distances on its last axis for L = {L}, got {curve.shape[-1]} "
            f"(shape {tuple(curve.shape)})"
        )
    return tuple(float(curve_resolution(curve[..., :N], head_mode, boundary)) for N in (L, curve.shape[-1]))


def curve_resolution(
    curve: np.ndarray | torch.Tensor, head_mode: HeadMode = "mean-scores", boundary: Boundary = "zero"
) -> np.ndarray | torch.Tensor:
    """R of one design-time curve ``(N,)``, or of per-head curves ``(H, N)`` under ``head_mode``."""
    if curve.ndim == 2:
        return layer_resolution(curve, head_mode, boundary)
    return resolution(curve, boundary)
