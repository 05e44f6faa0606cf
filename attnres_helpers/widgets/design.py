"""The design-time explorer's update logic (notebook 02), as pure functions that run without a kernel.

:func:`explorer_state` is everything one view shows, :func:`readout_html` its readout,
:func:`explorer_notes` what cannot act or has no position signal, :func:`help_html` how to read R
and why it is small for the encoding shown; :func:`compare_states`, :func:`coinciding`,
:func:`close_on_plot` and :func:`compare_readout_html` serve compare mode. R comes from
:func:`attnres_helpers.encodings.curve_pair` on the design-time curves.
"""

from __future__ import annotations

import html
import math
import numbers
from functools import lru_cache

import numpy as np

from ..encodings import DESIGN_CURVES, alibi_slopes, curve_pair, default_params, score_curve, t5_buckets
from ..metric import Boundary, HeadMode
from .text import RATIO_FLOOR, format_sig, pair_text

L_RANGE = (16, 2048, 16)  # (min, max, step) of the training-length slider; 2L reaches 4096
DEFAULT_BOUNDARY: Boundary = "zero"
DEFAULT_HEAD_MODE: HeadMode = "mean-scores"
SLIDER_LABELS = {"heads": "number of heads"}  # a parameter's slider label, where it differs from its name
HEAD_NOTE = "head convention: only ALiBi's per-head curves (2 or more heads) depend on it"
COMPARE_DEFAULT = ("sinusoidal", "rope", "xpos", "alibi", "kerple-log", "t5")
ROTARY = ("sinusoidal", "rope", "xpos")  # cosine-sum curves: not monotone in n
NONZERO_PARAMS = {  # parameters whose zero flattens the curve: their sliders start one step above zero
    name: {
        key for key in encoding.params if key in ("scale", "a", "bias_decay") or (name == "kerple-log" and key == "p")
    }
    for name, encoding in DESIGN_CURVES.items()
}
INERT_PARAMS = {("nope", "scale"): "NoPE's scale is disabled: its curve is s[n] = 0, and scale multiplies zero"}
TWIN_NOTE = (
    "sinusoidal and RoPE have the same design-time curve, by design (section 4 of this notebook): "
    "they differ only in what training does with the position signal"
)
FLAT_WARNING = (
    "the curve is flat: every s[n] is equal, so it carries no position signal and R is 1/N² "
    'under boundary "zero", 0 under "drop"{why}'
)
T5_NOTE = (
    "max_distance starts above num_buckets // 2 = {exact}: T5 gives the first num_buckets // 2 distances a "
    "bucket each, so its log-spaced buckets need max_distance beyond them"
)
CLOSE_SCORE_NATS = 20.0  # compare mode: curves whose s[n] − s[0] stay within this share one thin band of the plot


def check_length(L: int | np.integer, name: str = "L") -> int:
    """``L`` as an int (numpy integers accepted); an error naming ``name`` unless it is an integer >= 2."""
    if isinstance(L, bool) or not isinstance(L, numbers.Integral) or L < 2:
        raise ValueError(f"{name} must be an integer >= 2 (distances 0..{name}-1), got {L!r}")
    return int(L)


def check_explorer_length(L: int | np.integer) -> int:
    """``L`` as an int if the explorer's slider can show it (:data:`L_RANGE`), else a one-line error."""
    low, high, _ = L_RANGE
    if isinstance(L, bool) or not isinstance(L, numbers.Integral) or not low <= L <= high:
        raise ValueError(
            f"L must be an integer in [{low}, {high}] (the slider's range; 2L reaches {2 * high}), got {L!r}"
        )
    return int(L)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max())
    return e / e.sum()


def explorer_state(
    name: str, L: int, params: dict | None = None, boundary: Boundary = "zero", head_mode: HeadMode = "mean-scores"
) -> dict:
    """Everything one explorer view shows: the curve over 0..2L-1, softmax weights, R at L and 2L.

    ``profile`` is the curve that is plotted (ALiBi's heads averaged); ``weights_L`` and
    ``weights_2L`` are the softmax of the profile over windows of L and 2L distances,
    i.e. the attention of the last query of each window.
    """
    L = check_length(L)  # before doubling it, so a message names the L that was given
    params = dict(params or {})
    curve = score_curve(name, 2 * L, **params)  # (2L,) or (H, 2L)
    profile = curve.mean(axis=0) if curve.ndim == 2 else curve  # (2L,)
    r_L, r_2L = curve_pair(curve, L, head_mode, boundary)
    return {
        "name": name,
        "multi_head": curve.ndim == 2 and curve.shape[0] > 1,
        "flat": bool(np.ptp(curve) <= 1e-12 * max(1.0, float(np.abs(curve).max()))),
        "L": L,
        "params": {**default_params(name), **params},
        "boundary": boundary,
        "head_mode": head_mode,
        "curve": curve,
        "profile": profile,
        "weights_L": _softmax(profile[:L]),
        "weights_2L": _softmax(profile),
        "R_L": r_L,
        "R_2L": r_2L,
        "ratio": r_2L / r_L if abs(r_L) >= RATIO_FLOOR else math.nan,
    }


def readout_html(state: dict) -> str:
    """The live readout: R at L, at 2L and their ratio, to 3 significant figures (:func:`format_sig`)."""
    return f"<b>{html.escape(state['name'])}</b> &nbsp; {pair_text(state['R_L'], state['R_2L'], state['ratio'])}"


def compare_states(
    names: list[str] | tuple[str, ...], L: int, boundary: Boundary = "zero", head_mode: HeadMode = "mean-scores"
) -> list[dict]:
    """One :func:`explorer_state` per encoding, each at its registry defaults.

    ``names`` is a list (or tuple) of encoding names; a single string is refused rather
    than read as a sequence of one-letter names.
    """
    if isinstance(names, str):
        raise ValueError(f"names must be a list of encoding names, got a string {names!r} (write [{names!r}])")
    if not names:
        raise ValueError("choose at least one encoding to compare")
    return [explorer_state(name, L, None, boundary, head_mode) for name in names]


def coinciding(states: list[dict]) -> list[tuple[str, str]]:
    """Pairs (earlier, later) of encodings whose plotted profiles are equal to float64 rounding.

    RoPE and sinusoidal coincide at their defaults, by design; a compare plot draws the
    later one dashed over the earlier and says so.
    """
    pairs = []
    for i, a in enumerate(states):
        for b in states[i + 1 :]:
            if a["profile"].shape == b["profile"].shape and np.allclose(
                a["profile"], b["profile"], rtol=1e-12, atol=1e-12
            ):
                pairs.append((a["name"], b["name"]))
    return pairs


def close_on_plot(states: list[dict]) -> dict | None:
    """The encodings that share one thin band of the compare plot, and why; None if fewer than two do.

    The plot's score axis is fixed (down to −1000 nats, for ALiBi's steep heads), so curves
    whose s[n] − s[0] stay within :data:`CLOSE_SCORE_NATS` over 0..2L-1 lie nearly on top of
    each other there, and so do their softmax weights, which then stay within a small factor of
    uniform. Returns ``{"names", "span": the largest |s[n] − s[0]| among them, "factor": the
    largest w·2L or 1/(w·2L) among their weights}``.
    """
    close = [s for s in states if float(np.abs(s["profile"] - s["profile"][0]).max()) <= CLOSE_SCORE_NATS]
    if len(close) < 2:
        return None
    span = max(float(np.abs(s["profile"] - s["profile"][0]).max()) for s in close)
    factor = max(float(np.abs(np.log(s["weights_2L"] * s["weights_2L"].size)).max()) for s in close)
    return {"names": [s["name"] for s in close], "span": span, "factor": math.exp(factor)}


def compare_readout_html(states: list[dict]) -> str:
    """One line per encoding (name, R(L), R(2L), ratio), then a line per pair of coinciding curves and
    one naming the curves that lie close together on the plot, with the reason (:func:`close_on_plot`)."""
    rows = [f"<b>{html.escape(s['name'])}</b>: {pair_text(s['R_L'], s['R_2L'], s['ratio'])}" for s in states]
    for first, second in coinciding(states):
        why = " (identical by design)" if {first, second} == {"sinusoidal", "rope"} else ""
        rows.append(f"<i>{html.escape(second)} coincides with {html.escape(first)}{why}: drawn dashed over it</i>")
    close = close_on_plot(states)
    if close is not None:
        names = close["names"]
        listed = ", ".join(names[:-1]) + " and " + names[-1]
        rows.append(
            f"<i>{html.escape(listed)} lie close together on these axes: each s[n] stays within "
            f"{format_sig(close['span'])} nats of its s[0] over 0..2L-1, a thin band of a score axis fixed to reach "
            f"−1000 nats, so their softmax weights stay within a factor {format_sig(close['factor'])} "
            "of uniform (1/2L); "
            "the R bars tell them apart</i>"
        )
    return "<br>".join(rows)


def explorer_notes(state: dict) -> tuple[list[str], list[str]]:
    """(notes, warnings) for one explorer view, as plain one-line texts.

    Notes: a disabled parameter's reason (NoPE's scale), the sinusoidal/RoPE twin, T5's lower end
    of max_distance, what the boundary menu changes (:func:`boundary_note`). Warnings: a flat curve
    (any parameter choice that makes every s[n] equal, e.g. RoPE's rho = 0).
    """
    name = state["name"]
    notes = [reason for (encoding, _), reason in INERT_PARAMS.items() if encoding == name]
    if name in ("sinusoidal", "rope"):
        notes.append(TWIN_NOTE)
    if name == "t5":
        notes.append(T5_NOTE.format(exact=state["params"]["num_buckets"] // 2))
    notes.append(boundary_note(state))
    warnings = []
    if state["flat"]:
        why = (
            ": NoPE has no positional term"
            if name == "nope"
            else ": a parameter at zero (e.g. rho = 0) removed the position signal"
        )
        warnings.append(FLAT_WARNING.format(why=why))
    return notes, warnings


def boundary_gap(state: dict) -> float:
    """R_zero − R_drop at 2L: Eq. 3's last term p_{N−1}(p_{N−1} − 0), the last distance's weight squared (of
    the head-mean profile under mean-scores; the mean over heads of each head's under mean-R)."""
    curve = state["curve"]
    if state["head_mode"] == "mean-R" and curve.ndim == 2:
        return float(np.mean([_softmax(head)[-1] ** 2 for head in curve]))
    return float(state["weights_2L"][-1] ** 2)


def boundary_note(state: dict) -> str:
    """What the boundary menu changes in this view, in numbers: the gap at 2L, and whether the readout's
    digits can show it."""
    gap, r_2L = boundary_gap(state), abs(state["R_2L"])
    shown = r_2L == 0 or gap >= 0.5 * 10 ** (math.floor(math.log10(r_2L)) - 2)  # 3 significant figures
    return f'boundary: "zero" and "drop" differ at 2L by p(2L−1)², the last weight squared: {gap:.2g}' + (
        "" if shown else ", below the readout's 3 significant figures"
    )


def _monotone_reason(state: dict) -> str:
    """Why the weight on n = 0 is small, for an encoding whose scores never rise with distance."""
    name, params, L = state["name"], state["params"], state["L"]
    if name == "alibi":
        m = params["scale"] * float(alibi_slopes(params["heads"]).mean())
        return (
            f"The head-mean bias falls m̄ = {m:.3g} nats a distance (the mean of its {params['heads']} head slopes), "
            f"so each weight is e^(−m̄) = {math.exp(-m):.3g} of the one before it, whatever the window."
        )
    if name == "kerple-log":
        return (
            f"Its weights fall as a power law, (1 + a·n)^(−p·scale) with a = {params['a']:g} and p·scale = "
            f"{params['p'] * params['scale']:g}: the slowly falling tail holds most of the weight."
        )
    if name == "kerple-power":
        s = state["profile"]
        return (
            f"Its scores −a·n^p (p = {params['p']:g}) fall {s[0] - s[1]:.3g} nats from n = 0 to 1, then ever more "
            "slowly: the far distances keep a share of the weight."
        )
    if name == "t5":
        exact = params["num_buckets"] // 2
        buckets = t5_buckets(L, params["num_buckets"], params["max_distance"])
        shared = int((buckets == params["num_buckets"] - 1).sum())
        return (
            f"Its bias falls only bias_decay × scale = {params['bias_decay'] * params['scale']:g} nats a bucket; the "
            f"first {exact} distances have a bucket each, the others share log-spaced buckets, and {shared} of the "
            f"{L} distances share the last one (flat beyond max_distance = {params['max_distance']})."
        )
    return f"Its curve is flat: every distance gets p = 1/{L}, so there is no position signal to resolve."


@lru_cache(maxsize=64)
def why_small_html(name: str, L: int) -> str:
    """Why R is small at ``name``'s registry defaults at training length ``L``, with its numbers computed."""
    state = explorer_state(name, L)
    weights, ln = state["weights_L"], f"ln {L} ≈ {math.log(L):.1f}, ln {2 * L} ≈ {math.log(2 * L):.1f}"
    heading = f"<b>Why so small for {html.escape(name)} at its defaults?</b> "
    if name in ROTARY:
        decay = " (its decay ζ^(n/B) only shrinks them)" if name == "xpos" else ""
        body = (
            f"A distance stands out only if its score beats the others by about ln N nats ({ln}). "
            f"{name}'s scores span at most 2 × scale = {2 * state['params']['scale']:g} nats{decay} and change "
            "slowly near n = 0, so neighbouring weights are nearly equal: the largest weight at L is "
            f"max p = {format_sig(weights.max())}, and R ≤ max p."
        )
    else:
        p0 = float(weights[0])
        body = (
            f"Its scores never rise with distance, so R ≤ p_0², with p_0 the weight on n = 0 (boundary zero: the "
            f"sum telescopes). At L = {L}, p_0 = {format_sig(p0)}, so R(L) ≤ {format_sig(p0 * p0)} "
            f"(it is {format_sig(state['R_L'])}). " + _monotone_reason(state)
        )
    temperature = (
        ""
        if name == "nope"
        else (
            " R also depends on the temperature: multiply the scores (the <i>scale</i> slider) and it rises "
            "by orders of "
            "magnitude."
        )
    )
    return (
        heading
        + html.escape(body, quote=False)
        + temperature
        + " <a href='01_deriving_resolution.ipynb' target='_blank'>Notebook 01, section 5</a> "
        "(<i>R depends on the scale of the scores, and on N</i>) explains both."
    )


def help_html(L: int = 1024, name: str | None = "rope") -> str:
    """The explorer's legend: what R near 0, 0.1 and 0.9 means, and why R is small for ``name`` at its
    defaults (:func:`why_small_html`; ``name=None`` in compare mode).

    The shares are computed: one distance holding a share p of the weight and the rest spread
    evenly over the other N − 1 gives R = p² − p·q + q² with q = (1 − p)/(N − 1) (boundary
    "zero"), so R ≈ p² and p ≈ √R for large N.
    """
    L = check_length(L)
    share = {r: math.sqrt(r) for r in (0.9, 0.1)}
    why = (
        why_small_html(name, L)
        if name is not None
        else ("<b>Why so small?</b> Choose one encoding in single mode: this panel then says why its R is small.")
    )
    return (
        "<div style='font-size:0.92em; line-height:1.35'>"
        "<b>Reading R</b> (R < 1 always; notebook 01 §3)<br>"
        "• <b>R ≈ 0.9</b>: one distance takes nearly all the weight "
        f"(a single peak holding p ≈ {share[0.9]:.2f} of it)."
        "<br>"
        f"• <b>R ≈ 0.1</b>: the nearest distances stand out (a peak holding p ≈ {share[0.1]:.2f}), "
        "the rest is spread.<br>"
        "• <b>R ≈ 0</b>: neighbouring distances get nearly equal weight; attention cannot tell n from n + 1.<br>"
        f"{why}</div>"
    )


def slider_bounds(name: str, key: str, params: dict | None = None) -> tuple[float, float]:
    """The slider range of one parameter: the registry's, with the low end one step above zero
    for parameters whose zero would flatten the curve (:data:`NONZERO_PARAMS`), and T5's
    max_distance starting on the first slider step above num_buckets // 2 (``params``: the
    other sliders' values; the defaults where missing)."""
    param = DESIGN_CURVES[name].params[key]
    low = param.low
    if key in NONZERO_PARAMS.get(name, ()) and low <= 0:
        low = param.step
    if (name, key) == ("t5", "max_distance"):
        exact = {**default_params(name), **(params or {})}["num_buckets"] // 2
        if low <= exact:
            low = param.low + param.step * ((exact - param.low) // param.step + 1)
    return low, param.high
