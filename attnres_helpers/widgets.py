"""Two ipywidgets explorers: design-time score curves (notebook 02) and trained models' ŝ (notebook 04).

The update logic is in pure functions that run without a kernel: :func:`explorer_state`,
:func:`readout_html`, :func:`explorer_notes`, :func:`compare_states`, :func:`compare_readout_html`
for the design-time explorer, :func:`trained_catalogue`, :func:`trained_state` and
:func:`trained_readout_html` for the trained one. The widgets only wire controls to them and
draw persistent matplotlib figures (Agg, no pyplot) into ``Image`` widgets as PNGs rendered at
the pixel size they are shown at. The design-time figures blit: an update redraws only the
artists that change. CSS classes (``attnres-readout``, ``attnres-slider-<name>``,
``attnres-error``, ``attnres-plot``, ...) let tests and a browser find the parts.
:func:`save_default_image` writes a picture of either explorer in its default state, the
static fallback shown where no kernel runs (GitHub, nbviewer).
"""

from __future__ import annotations

import html
import io
import math
import numbers
import re
import textwrap
from pathlib import Path

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullLocator
from PIL import Image as PILImage

from .encodings import DESIGN_CURVES, Param, _check_length, curve_pair, default_params, score_curve
from .files import atomic_write
from .metric import BOUNDARIES, HEAD_MODES, Boundary, HeadMode, layer_resolution, mean_over_heads, resolution

L_RANGE = (16, 2048, 16)  # (min, max, step) of the training-length slider; 2L reaches 4096
SIG_DIGITS = 3  # significant figures of the readouts
RATIO_FLOOR = 1e-12  # below this R(L) the ratio R(2L)/R(L) is reported as undefined
DEFAULT_BOUNDARY: Boundary = "zero"
DEFAULT_HEAD_MODE: HeadMode = "mean-scores"
SLIDER_LABELS = {"heads": "number of heads"}  # a parameter's slider label, where it differs from its name
HEAD_NOTE = "head convention: only ALiBi's per-head curves (2 or more heads) depend on it"
COMPARE_DEFAULT = ("sinusoidal", "rope", "xpos", "alibi", "kerple-log", "t5")
FIGURE_DPI = 100  # figures are rendered at FIGURE_DPI and shown at their pixel size: no rescaling
FONT_PT = 9  # the smallest font in the explorers' figures
NONZERO_PARAMS = {  # parameters whose zero flattens the curve: their sliders start one step above zero
    name: {key for key in encoding.params if key in ("scale", "a", "bias_decay") or (name == "kerple-log" and key == "p")}
    for name, encoding in DESIGN_CURVES.items()
}
INERT_PARAMS = {("nope", "scale"): "NoPE's scale is disabled: its curve is s[n] = 0, and scale multiplies zero"}
TWIN_NOTE = (
    "sinusoidal and RoPE have the same design-time curve, by design (section 4 of this notebook): "
    "they differ only in what training does with the position signal"
)
FLAT_WARNING = (
    "the curve is flat: every s[n] is equal, so it carries no position signal and R is 1/N² "
    "under boundary \"zero\", 0 under \"drop\"{why}"
)


# --------------------------------------------------------------------------- pure update logic


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max())
    return e / e.sum()


def explorer_state(name: str, L: int, params: dict | None = None, boundary: Boundary = "zero", head_mode: HeadMode = "mean-scores") -> dict:
    """Everything one explorer view shows: the curve over 0..2L-1, softmax weights, R at L and 2L.

    ``profile`` is the curve that is plotted (ALiBi's heads averaged); ``weights_L`` and
    ``weights_2L`` are the softmax of the profile over windows of L and 2L distances,
    i.e. the attention of the last query of each window.
    """
    _check_length(L, "L")  # before doubling it, so a message names the L that was given
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


def format_sig(x: float, digits: int = SIG_DIGITS) -> str:
    """``x`` to ``digits`` significant figures: scientific below 1e-3 (and from 1e4), "0" for zero.

    ``format_sig(0.0088687) == "0.00887"``, ``format_sig(9.5367e-07) == "9.54e-07"``,
    ``format_sig(1.0) == "1.00"``; NaN reads "undefined".
    """
    x = float(x)
    if math.isnan(x):
        return "undefined"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    scientific = f"{x:.{digits - 1}e}"
    rounded = float(scientific)
    if not 1e-3 <= abs(rounded) < 1e4:
        return scientific
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:.{decimals}f}"


def format_ratio(r_L: float, ratio: float) -> str:
    """R(2L)/R(L) as shown: :func:`format_sig`, or "undefined" with the reason when R(L) is (near) zero."""
    if math.isnan(ratio):
        return "undefined (R(L) = 0)" if r_L == 0 else f"undefined (R(L) < {RATIO_FLOOR:.0e})"
    return format_sig(ratio)


def _pair_text(r_L: float, r_2L: float, ratio: float) -> str:
    return (
        f"R(L) = {format_sig(r_L)} &nbsp;·&nbsp; R(2L) = {format_sig(r_2L)} &nbsp;·&nbsp; "
        f"R(2L)/R(L) = {format_ratio(r_L, ratio)}"
    )


def readout_html(state: dict) -> str:
    """The live readout: R at L, at 2L and their ratio, to 3 significant figures (:func:`format_sig`)."""
    return f"<b>{html.escape(state['name'])}</b> &nbsp; {_pair_text(state['R_L'], state['R_2L'], state['ratio'])}"


def compare_states(names, L: int, boundary: Boundary = "zero", head_mode: HeadMode = "mean-scores") -> list[dict]:
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
        for b in states[i + 1:]:
            if a["profile"].shape == b["profile"].shape and np.allclose(a["profile"], b["profile"], rtol=1e-12, atol=1e-12):
                pairs.append((a["name"], b["name"]))
    return pairs


def compare_readout_html(states: list[dict]) -> str:
    """One line per encoding (name, R(L), R(2L), ratio), then a line per pair of coinciding curves."""
    rows = [f"<b>{html.escape(s['name'])}</b>: {_pair_text(s['R_L'], s['R_2L'], s['ratio'])}" for s in states]
    for first, second in coinciding(states):
        why = " (identical by design)" if {first, second} == {"sinusoidal", "rope"} else ""
        rows.append(f"<i>{html.escape(second)} coincides with {html.escape(first)}{why}: drawn dashed over it</i>")
    return "<br>".join(rows)


def explorer_notes(state: dict) -> tuple[list[str], list[str]]:
    """(notes, warnings) for one explorer view, as plain one-line texts.

    Notes: a disabled parameter's reason (NoPE's scale), the sinusoidal/RoPE twin. Warnings:
    a flat curve (any parameter choice that makes every s[n] equal, e.g. RoPE's rho = 0).
    """
    name = state["name"]
    notes = [reason for (encoding, _), reason in INERT_PARAMS.items() if encoding == name]
    if name in ("sinusoidal", "rope"):
        notes.append(TWIN_NOTE)
    warnings = []
    if state["flat"]:
        why = ": NoPE has no positional term" if name == "nope" else ": a parameter at zero (e.g. rho = 0) removed the position signal"
        warnings.append(FLAT_WARNING.format(why=why))
    return notes, warnings


def help_html(L: int = 1024, scale: float | None = None) -> str:
    """The explorer's legend: what R near 0, 0.1 and 0.9 means, and why design-time R is small at the defaults.

    The shares are computed: one distance holding a share p of the weight and the rest spread
    evenly over the other N − 1 gives R = p² − p·q + q² with q = (1 − p)/(N − 1) (boundary
    "zero"), so R ≈ p² and p ≈ √R for large N.
    """
    _check_length(L, "L")
    scale = default_params("rope")["scale"] if scale is None else scale
    share = {r: math.sqrt(r) for r in (0.9, 0.1)}
    return (
        "<div style='font-size:0.92em; line-height:1.35'>"
        "<b>Reading R</b> (R < 1 always; notebook 01 §3)<br>"
        f"• <b>R ≈ 0.9</b>: one distance takes nearly all the weight (a single peak holding p ≈ {share[0.9]:.2f} of it)."
        "<br>"
        f"• <b>R ≈ 0.1</b>: the nearest distances stand out (a peak holding p ≈ {share[0.1]:.2f}), "
        "the rest is spread.<br>"
        "• <b>R ≈ 0</b>: neighbouring distances get nearly equal weight; attention cannot tell n from n + 1.<br>"
        "<b>Why so small at the defaults?</b> A distance stands out only if its score beats the others by "
        f"about ln N nats (ln {L} ≈ {math.log(L):.1f}, ln {2 * L} ≈ {math.log(2 * L):.1f}). "
        f"RoPE's scores span at most 2 × scale = {2 * scale:g} nats and change slowly near n = 0, so "
        "neighbouring weights are nearly equal. R also depends on the temperature: multiply the scores "
        "(the <i>scale</i> slider) and it rises by orders of magnitude. "
        "<a href='01_deriving_resolution.ipynb' target='_blank'>Notebook 01, section 5</a> "
        "(<i>R depends on the scale of the scores, and on N</i>) explains both."
        "</div>"
    )


def error_html(exc: Exception) -> str:
    return f"<b>{type(exc).__name__}</b>: {html.escape(str(exc))} &nbsp;(the plot and readout were not updated)"


# --------------------------------------------------------------------------- figures


def _png(fig: Figure) -> bytes:
    """The canvas as it stands (no redraw) as a PNG at its pixel size (fast zlib level: a few ms)."""
    width, height = fig.canvas.get_width_height()
    buffer = io.BytesIO()
    image = PILImage.frombuffer("RGBA", (width, height), fig.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    image.convert("RGB").save(buffer, format="png", compress_level=1)
    return buffer.getvalue()


def _figure(width_in: float, height_in: float) -> Figure:
    fig = Figure(figsize=(width_in, height_in), dpi=FIGURE_DPI)
    FigureCanvasAgg(fig)
    return fig


def figure_layout(fig: Figure) -> widgets.Layout:
    """An ``Image`` layout that shows the figure at its pixel size (narrower only if the page is)."""
    width, height = fig.canvas.get_width_height()
    return widgets.Layout(width=f"{width}px", max_width="100%", height="auto")


def min_max_decimate(x: np.ndarray, y: np.ndarray, buckets: int = 400):
    """Fewer points that draw the same picture: ``x (N,)``, ``y (..., N) -> (..., M), (..., M)``.

    Cuts the distances into ``buckets`` runs of k points and keeps each run's minimum
    and maximum, in order (the tail that does not fill a run is kept whole). A line
    through them spans the same values in every run, so at ~1 run per pixel column it
    looks the same as the full line, at a fraction of the drawing time.
    """
    if isinstance(buckets, bool) or not isinstance(buckets, numbers.Integral) or buckets < 1:
        raise ValueError(f"buckets must be >= 1 (an integer count of runs), got {buckets!r}")
    N = y.shape[-1]
    k = N // buckets
    if k < 3:
        return np.broadcast_to(x, y.shape), y
    kept = buckets * k
    runs = y[..., :kept].reshape(*y.shape[:-1], buckets, k)  # (..., buckets, k)
    low, high = runs.argmin(-1), runs.argmax(-1)  # (..., buckets)
    pairs = np.stack([np.minimum(low, high), np.maximum(low, high)], axis=-1) + k * np.arange(buckets)[:, None]
    tail = np.broadcast_to(np.arange(kept, N), (*y.shape[:-1], N - kept))
    index = np.concatenate([pairs.reshape(*y.shape[:-1], 2 * buckets), tail], axis=-1)  # (..., M)
    return x[index], np.take_along_axis(y, index, axis=-1)


def distance_ticks(L: int, marked: bool = True) -> tuple[list[float], list[str]]:
    """x ticks of the design-time panels, drawn in units of L: positions n/L and labels in distances.

    Ticks at n = 0, ⌊L/2⌋, L, L + ⌊L/2⌋, 2L; the labels are the distances themselves, with
    "(L)" and "(2L)" marking the training length and twice it when ``marked`` (the compare
    plot's narrower panels leave the marks to their titles).
    """
    _check_length(L, "L")
    n = [0, L // 2, L, L + L // 2, 2 * L]
    labels = [str(v) for v in n]
    if marked:
        labels[2], labels[4] = f"{L} (L)", f"{2 * L} (2L)"
    return [v / L for v in n], labels


def _symlog_label(value: float, _pos=None) -> str:
    """Tick labels of the compare plot's symlog axis: 0, −1, −10, −100, −1000 (a true minus sign)."""
    if value == 0:
        return "0"
    text = f"{abs(value):.0f}" if abs(value) >= 1 else f"{abs(value):g}"
    return ("−" if value < 0 else "") + text


class _BlitFigure:
    """A figure whose static parts are drawn once into a background; an update draws only ``animated``."""

    fig: Figure
    animated: tuple

    def _redraw_background(self) -> None:
        for artist in self.animated:
            artist.set_animated(True)
        self.fig.canvas.draw()
        self.background = self.fig.canvas.copy_from_bbox(self.fig.bbox)

    def _blit(self) -> bytes:
        self.fig.canvas.restore_region(self.background)
        for artist in self.animated:
            if artist.get_visible():
                self.fig.draw_artist(artist)
        return _png(self.fig)


class DistanceLabels:
    """The distance tick labels of one axis drawn in units of L: fixed ticks, and five Text artists
    (animated) that :meth:`set` rewrites for each L. Drawing five texts costs a fraction of an axis
    draw, so a change of L stays a blit."""

    def __init__(self, ax, marked: bool = True):
        self.marked = marked
        positions, _ = distance_ticks(2, marked)  # the positions n/L do not depend on L (to rounding)
        ax.set_xticks(positions, [""] * len(positions))
        transform = ax.get_xaxis_transform()  # x in data units, y in axes units
        pad = ax.xaxis.get_tick_padding()  # tick length and label pad, in points
        self.texts = [
            ax.annotate("", (x, 0), xycoords=transform, xytext=(0, -pad - 1), textcoords="offset points", va="top",
                        ha="right" if i == len(positions) - 1 else "center", fontsize=FONT_PT)
            for i, x in enumerate(positions)
        ]

    def set(self, L: int) -> None:
        positions, labels = distance_ticks(L, self.marked)
        for text, x, label in zip(self.texts, positions, labels):
            text.set_text(label)
            text.xy = (x, 0)


class SingleFigure(_BlitFigure):
    """s[n] (left) and softmax weights (right) of one encoding against n/L, with blitting.

    Distances are drawn in units of L, so everything but the curves, the score axis and the
    distance tick labels (frames, the L mark, the fixed weight axis, titles, legend) is the
    same for every state: it is drawn once into a background. An update restores it and
    draws only the animated artists, which keeps a redraw to a few milliseconds. The PNG
    is 900 × 330 pixels, shown at that size.
    """

    WEIGHT_RANGE = (1e-12, 2.0)

    def __init__(self):
        self.fig = _figure(9.0, 3.3)
        self.ax_s, self.ax_w = self.fig.subplots(1, 2, gridspec_kw=dict(left=0.085, right=0.985, bottom=0.16, top=0.9, wspace=0.22))
        for ax in (self.ax_s, self.ax_w):
            ax.set_xlim(0, 2)
            ax.set_xlabel("distance n", fontsize=FONT_PT + 1)
            ax.tick_params(labelsize=FONT_PT)
            ax.axvline(1, color="k", linestyle="--", linewidth=1)
        self.heads = LineCollection([], colors="C0", alpha=0.3, linewidths=0.8)
        self.ax_s.add_collection(self.heads)
        (self.line_s,) = self.ax_s.plot([], [], color="C0")
        (self.line_L,) = self.ax_w.plot([], [], color="C0", label="window of L distances")
        (self.line_2L,) = self.ax_w.plot([], [], color="C1", alpha=0.8, linestyle="--", label="window of 2L distances")
        self.title = None  # the score panel's title, set by the first render (it names the encoding)
        self.ax_s.yaxis.set_major_locator(MaxNLocator(5))
        self.fig.text(0.008, 0.53, "score", rotation=90, va="center", fontsize=FONT_PT + 1)  # static, unlike an axis label
        self.ax_w.set_title("softmax weights of the last query (log scale)", fontsize=FONT_PT + 1)
        self.ax_w.set(yscale="log", ylim=self.WEIGHT_RANGE)
        self.ax_w.yaxis.set_major_locator(LogLocator(numticks=7))
        self.ax_w.yaxis.set_minor_locator(NullLocator())
        self.ax_w.legend(loc="upper right", fontsize=FONT_PT)
        self.distances = [DistanceLabels(ax) for ax in (self.ax_s, self.ax_w)]
        self.ax_s.xaxis.labelpad = FONT_PT + 4  # room for the distance labels, drawn as texts
        self.ax_w.xaxis.labelpad = FONT_PT + 4
        self.animated = (self.heads, self.line_s, self.ax_s.yaxis, self.line_L, self.line_2L,
                         *(t for d in self.distances for t in d.texts))
        self._set_title("design-time score s[n]")

    @staticmethod
    def title_for(state: dict) -> str:
        """The score panel's title: the encoding, and how heads are drawn only where there are several."""
        note = " (ALiBi: heads thin, mean bold)" if state["curve"].ndim == 2 else ""
        return f"design-time score s[n] of {state['name']}{note}"

    def _set_title(self, title: str) -> None:
        """Redraw the static background with a new title (on a change of encoding, not on each update)."""
        if title == self.title:
            return
        self.title = title
        self.ax_s.set_title(title, fontsize=FONT_PT + 1)
        self._redraw_background()

    def render(self, state: dict) -> bytes:
        self._set_title(self.title_for(state))
        L, curve, profile = state["L"], state["curve"], state["profile"]
        for labels in self.distances:
            labels.set(L)
        x = np.arange(2 * L) / L  # (2L,) distance in units of L
        self.line_s.set_data(*min_max_decimate(x, profile))
        self.heads.set_segments(np.stack(min_max_decimate(x, curve), axis=-1) if curve.ndim == 2 else [])  # (H, M, 2)
        self.line_L.set_data(*min_max_decimate(x[:L], state["weights_L"]))
        self.line_2L.set_data(*min_max_decimate(x, state["weights_2L"]))
        low, high = float(curve.min()), float(curve.max())
        pad = 0.05 * (high - low) or 1.0
        self.ax_s.set_ylim(low - pad, high + pad)
        return self._blit()


# one look per encoding, so that curves stay apart where they overlap (RoPE dashed over sinusoidal)
CURVE_STYLES = {
    "sinusoidal": dict(color="C0", linestyle="-", linewidth=3.0, alpha=0.55),
    "rope": dict(color="C1", linestyle=(0, (4, 2)), linewidth=1.6),
    "xpos": dict(color="C2", linestyle=":", linewidth=2.0, marker="^", markevery=0.12, markersize=4),
    "alibi": dict(color="C3", linestyle="-", linewidth=1.4),
    "nope": dict(color="C7", linestyle="-.", linewidth=1.4),
    "kerple-log": dict(color="C4", linestyle=(0, (6, 1, 1, 1)), linewidth=1.4, marker="o", markevery=0.12, markersize=3),
    "kerple-power": dict(color="C5", linestyle=(0, (1, 1)), linewidth=1.6),
    "t5": dict(color="C6", linestyle="--", linewidth=1.4, marker="s", markevery=0.12, markersize=3),
}


class CompareFigure(_BlitFigure):
    """Several encodings at their defaults: s[n] − s[0] (symlog), softmax weights over 2L, (R(L), R(2L)) bars.

    Every axis range is fixed (the registry defaults bound s[n] − s[0] to [−1000, 0] for
    L <= 2048; weights and R on fixed log axes), and each encoding owns its lines and bars,
    so an update only toggles, moves and redraws them, the distance labels, the legend
    (below the curves) and the bar labels: a blit, not a full draw. The PNG is 900 × 370 pixels.
    """

    SCORE_RANGE = (-1000.0, 1.0)
    R_RANGE = (1e-8, 1.0)

    def __init__(self):
        self.fig = _figure(9.0, 3.7)
        self.ax_s, self.ax_w, self.ax_r = self.fig.subplots(1, 3, gridspec_kw=dict(left=0.075, right=0.99, bottom=0.3, top=0.85, wspace=0.33))
        for ax in (self.ax_s, self.ax_w):
            ax.set_xlim(0, 2)
            ax.axvline(1, color="k", linestyle="--", linewidth=1)
            ax.set_xlabel("distance n", fontsize=FONT_PT)
        for ax in self.fig.axes:
            ax.tick_params(labelsize=FONT_PT)
        self.ax_s.set_yscale("symlog", linthresh=1.0, linscale=0.6)
        self.ax_s.set_ylim(*self.SCORE_RANGE)
        self.ax_s.yaxis.set_major_locator(FixedLocator([0, -1, -10, -100, -1000]))
        self.ax_s.yaxis.set_major_formatter(FuncFormatter(_symlog_label))
        self.ax_s.yaxis.set_minor_locator(NullLocator())
        self.ax_s.set_title("s[n] − s[0] (symlog), L dashed", fontsize=FONT_PT + 1)
        self.ax_w.set(yscale="log", ylim=SingleFigure.WEIGHT_RANGE)
        self.ax_w.yaxis.set_major_locator(LogLocator(numticks=5))
        self.ax_w.yaxis.set_minor_locator(NullLocator())
        self.ax_w.set_title("softmax weights, window 2L (log)", fontsize=FONT_PT + 1)
        self.ax_r.set(yscale="log", ylim=self.R_RANGE, xlim=(-0.6, len(DESIGN_CURVES) - 0.4))
        self.ax_r.yaxis.set_major_locator(LogLocator(numticks=5))
        self.ax_r.yaxis.set_minor_locator(NullLocator())
        self.ax_r.set_ylabel("R (log)", fontsize=FONT_PT)
        self.lines_s, self.lines_w, self.bars = {}, {}, {}
        for name in DESIGN_CURVES:
            style = CURVE_STYLES.get(name, {})
            (self.lines_s[name],) = self.ax_s.plot([], [], label=name, **style)
            (self.lines_w[name],) = self.ax_w.plot([], [], label=name, **{k: v for k, v in style.items() if not k.startswith("marker")})
        bottom = self.R_RANGE[0]
        self.bars_L = self.ax_r.bar(np.arange(len(DESIGN_CURVES)) - 0.2, 1.0, width=0.4, bottom=bottom, color="C0", label="R(L)")
        self.bars_2L = self.ax_r.bar(np.arange(len(DESIGN_CURVES)) + 0.2, 1.0, width=0.4, bottom=bottom, color="C1", label="R(2L)")
        self.ax_r.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=FONT_PT + 1, frameon=False,
                         title="the pair, not one number", title_fontsize=FONT_PT + 1, borderaxespad=0.2)
        self.legend = None
        self.shown: tuple = ()
        self.distances = [DistanceLabels(ax, marked=False) for ax in (self.ax_s, self.ax_w)]
        for ax in (self.ax_s, self.ax_w):
            ax.xaxis.labelpad = FONT_PT + 4
        self.animated = (
            *self.lines_s.values(), *self.lines_w.values(), *self.bars_L.patches, *self.bars_2L.patches,
            *(t for d in self.distances for t in d.texts),
        )
        self._redraw_background()

    def _select(self, names: tuple) -> None:
        """Show the chosen encodings' artists, in order, and rebuild the legend and bar labels into
        the background (a full draw, on a change of selection only)."""
        if names == self.shown:
            return
        self.shown = names
        for name in DESIGN_CURVES:
            self.lines_s[name].set_visible(name in names)
            self.lines_w[name].set_visible(name in names)
        for i, name in enumerate(DESIGN_CURVES):
            visible = name in names
            position = names.index(name) if visible else i
            for bars, offset in ((self.bars_L, -0.2), (self.bars_2L, 0.2)):
                bars.patches[i].set_visible(visible)
                bars.patches[i].set_x(position + offset - 0.2)
        self.ax_r.set_xlim(-0.6, max(len(names), 2) - 0.4)
        self.ax_r.set_xticks(range(len(names)), names, rotation=40, ha="right", rotation_mode="anchor", fontsize=FONT_PT)
        if self.legend is not None:
            self.legend.remove()
        self.legend = self.fig.legend(handles=[self.lines_s[n] for n in names], loc="lower left", bbox_to_anchor=(0.005, 0.0),
                                      fontsize=FONT_PT, ncol=4, handlelength=3.0, frameon=False, columnspacing=1.2)
        self._redraw_background()

    def render(self, states: list[dict]) -> bytes:
        names = tuple(s["name"] for s in states)
        if len(set(names)) != len(names):
            raise ValueError(f"each encoding may be compared once, got {list(names)}")
        self._select(names)
        L = states[0]["L"]
        for labels in self.distances:
            labels.set(L)
        x = np.arange(2 * L) / L
        floor = self.R_RANGE[0]
        for state in states:
            name, profile = state["name"], state["profile"]
            self.lines_s[name].set_data(*min_max_decimate(x, np.clip(profile - profile[0], *self.SCORE_RANGE)))
            self.lines_w[name].set_data(*min_max_decimate(x, state["weights_2L"]))
            i = list(DESIGN_CURVES).index(name)
            for bars, r in ((self.bars_L, state["R_L"]), (self.bars_2L, state["R_2L"])):
                bars.patches[i].set_height(max(0.0, min(r, 1.0) - floor))  # R <= 0 (boundary "drop") draws no bar
        return self._blit()


# --------------------------------------------------------------------------- the design-time widget


def find_by_class(widget, css_class: str):
    """The first widget in the tree under ``widget`` that carries ``css_class`` (None if none does)."""
    if css_class in getattr(widget, "_dom_classes", ()):
        return widget
    return next((hit for child in getattr(widget, "children", ()) if (hit := find_by_class(child, css_class)) is not None), None)


def slider_bounds(name: str, key: str) -> tuple[float, float]:
    """The slider range of one parameter: the registry's, with the low end one step above zero
    for parameters whose zero would flatten the curve (:data:`NONZERO_PARAMS`)."""
    param = DESIGN_CURVES[name].params[key]
    low = param.low
    if key in NONZERO_PARAMS.get(name, ()) and low <= 0:
        low = param.step
    return low, param.high


def param_slider(name: str, param: Param, encoding: str | None = None) -> widgets.Widget:
    """A slider for one registry parameter, with CSS class ``attnres-slider-<name>``.

    With ``encoding`` given, its range comes from :func:`slider_bounds` (no zero that
    flattens the curve), and a parameter that cannot act (:data:`INERT_PARAMS`) is disabled.
    """
    low, high = (param.low, param.high) if encoding is None else slider_bounds(encoding, name)
    reason = INERT_PARAMS.get((encoding, name))
    common = dict(description=SLIDER_LABELS.get(name, name), continuous_update=False, style={"description_width": "8em"},
                  disabled=reason is not None, tooltip=reason or "")
    if param.kind == "int":
        slider = widgets.IntSlider(value=param.default, min=low, max=high, step=param.step, **common)
    elif param.kind == "log":
        slider = widgets.FloatLogSlider(
            value=param.default, base=10, min=math.log10(low), max=math.log10(high), step=param.step, readout_format=".3g", **common
        )
    else:
        slider = widgets.FloatSlider(value=param.default, min=low, max=high, step=param.step, readout_format=".2f", **common)
    return slider.add_class(f"attnres-slider-{name}")


def _lines_html(lines: list[str], style: str = "") -> str:
    return "<br>".join(f"<span style='{style}'>{html.escape(line, quote=False)}</span>" for line in lines)


def explorer(name: str = "rope", L: int = 1024) -> widgets.VBox:
    """The interactive explorer: encoding, its sliders, L, a plot and the live (R(L), R(2L)) readout.

    "single" mode shows one encoding; "compare" overlays several at their defaults and
    draws their (R(L), R(2L)) pairs as grouped bars. Errors appear in the widget.
    "reset to defaults" (CSS class ``attnres-reset``) restores the encoding's parameters,
    L (the one the explorer was opened with), the boundary and the head convention.
    Controls that cannot act are disabled with a one-line reason (the head convention for
    single-head curves, NoPE's scale); a flat curve raises a visible warning; a legend
    beside the controls says how to read R. L has a wide slider and a number box, linked.
    """
    default_params(name)  # raises ValueError for an unknown encoding, listing the known ones
    if isinstance(L, bool) or not isinstance(L, int) or not L_RANGE[0] <= L <= L_RANGE[1]:
        raise ValueError(f"L must be an integer in [{L_RANGE[0]}, {L_RANGE[1]}] (the slider's range), got {L!r}")
    mode = widgets.ToggleButtons(options=["single", "compare"], value="single", description="mode").add_class("attnres-mode")
    encoding = widgets.Dropdown(options=list(DESIGN_CURVES), value=name, description="encoding").add_class("attnres-encoding")
    chosen = widgets.SelectMultiple(options=list(DESIGN_CURVES), value=COMPARE_DEFAULT, rows=len(DESIGN_CURVES),
                                    description="compare").add_class("attnres-compare-choice")
    length = widgets.IntSlider(value=L, min=L_RANGE[0], max=L_RANGE[1], step=L_RANGE[2], description="L (train)",
                               continuous_update=False, readout=False, layout=widgets.Layout(width="430px"))
    length.add_class("attnres-slider-L")
    length_box = widgets.BoundedIntText(value=L, min=L_RANGE[0], max=L_RANGE[1], step=1, layout=widgets.Layout(width="90px"),
                                        tooltip=f"any integer in [{L_RANGE[0]}, {L_RANGE[1]}]").add_class("attnres-L-box")
    widgets.link((length, "value"), (length_box, "value"))
    boundary = widgets.Dropdown(options=BOUNDARIES, value=DEFAULT_BOUNDARY, description="boundary").add_class("attnres-boundary")
    head_mode = widgets.Dropdown(
        options=HEAD_MODES, value=DEFAULT_HEAD_MODE, description="head convention", style={"description_width": "8em"},
        layout=widgets.Layout(width="300px", flex="0 0 auto"),
    ).add_class("attnres-head-mode")
    head_note = widgets.HTML().add_class("attnres-head-note")
    reset = widgets.Button(description="reset to defaults", tooltip="the encoding's parameters, L, boundary and head convention")
    reset.add_class("attnres-reset")
    summary = widgets.HTML()
    params_box = widgets.VBox()
    notes = widgets.HTML().add_class("attnres-note")
    warning = widgets.HTML(layout=widgets.Layout(display="none")).add_class("attnres-warning")
    help_box = widgets.HTML(help_html(L), layout=widgets.Layout(width="330px", margin="0 0 0 12px")).add_class("attnres-help")
    readout = widgets.HTML().add_class("attnres-readout")
    error = widgets.HTML(layout=widgets.Layout(display="none")).add_class("attnres-error")
    single_figure, compare_figure = SingleFigure(), CompareFigure()
    plot = widgets.Image(format="png", layout=figure_layout(single_figure.fig)).add_class("attnres-plot")
    sliders: dict[str, widgets.Widget] = {}
    holding = []  # non-empty while several controls are set at once: one update at the end

    def show_head_convention(states):
        multi = any(s["multi_head"] for s in states)
        head_mode.disabled = not multi
        head_note.value = "" if multi else f"<i>{html.escape(HEAD_NOTE)}</i>"

    def show_notes(note_lines, warning_lines):
        notes.value = _lines_html(note_lines, "font-style:italic")
        warning.value = _lines_html(warning_lines, "color:#a40000; font-weight:bold")
        warning.layout.display = None if warning_lines else "none"

    def update(_=None):
        if holding:
            return
        try:
            if mode.value == "single":
                state = explorer_state(encoding.value, length.value, {k: s.value for k, s in sliders.items()}, boundary.value, head_mode.value)
                show_head_convention([state])
                show_notes(*explorer_notes(state))
                readout.value, plot.value = readout_html(state), single_figure.render(state)
                plot.layout.width = figure_layout(single_figure.fig).width
            else:
                states = compare_states(chosen.value, length.value, boundary.value, head_mode.value)
                show_head_convention(states)
                flat = [s["name"] for s in states if s["flat"]]
                show_notes([], [f"flat curve{'s' if len(flat) > 1 else ''} (no position signal): {', '.join(flat)}"] if flat else [])
                readout.value, plot.value = compare_readout_html(states), compare_figure.render(states)
                plot.layout.width = figure_layout(compare_figure.fig).width
        except Exception as exc:  # shown in the widget: a callback's traceback would be lost
            error.value, error.layout.display = error_html(exc), None
        else:
            error.value, error.layout.display = "", "none"

    def rebuild_sliders(_=None):
        for slider in sliders.values():
            slider.close()
        sliders.clear()
        sliders.update({key: param_slider(key, param, encoding.value) for key, param in DESIGN_CURVES[encoding.value].params.items()})
        for slider in sliders.values():
            slider.observe(update, names="value")
        params_box.children = tuple(sliders.values())
        summary.value = f"<i>{html.escape(DESIGN_CURVES[encoding.value].summary)}</i>"
        update()

    def reset_to_defaults(_=None):
        holding.append(True)
        try:
            for key, param in DESIGN_CURVES[encoding.value].params.items():
                sliders[key].value = param.default
            length.value, boundary.value, head_mode.value = L, DEFAULT_BOUNDARY, DEFAULT_HEAD_MODE
        finally:
            holding.pop()
        update()

    def switch_mode(_=None):
        single = mode.value == "single"
        for box in (encoding, summary, params_box):
            box.layout.display = None if single else "none"
        chosen.layout.display = "none" if single else None
        update()

    encoding.observe(rebuild_sliders, names="value")
    reset.on_click(reset_to_defaults)
    mode.observe(switch_mode, names="value")
    for control in (length, boundary, head_mode, chosen):
        control.observe(update, names="value")
    chosen.layout.display = "none"
    rebuild_sliders()
    controls = widgets.VBox([
        mode, widgets.HBox([encoding, summary]), chosen, widgets.HBox([length, length_box]),
        widgets.HBox([boundary, head_mode]), head_note, params_box, notes, reset,
    ])
    root = widgets.VBox([widgets.HBox([controls, help_box]), readout, warning, error, plot]).add_class("attnres-explorer")
    root.reset_to_defaults = reset_to_defaults  # the button's handler, for code and tests
    return root


# --------------------------------------------------------------------------- the trained-model explorer

EVAL_MULTIPLES = (1, 2, 4)  # the eval lengths the trained explorer offers, in units of L
NO_BCA_REASON = {
    "sinusoidal": "BCA is disabled for sinusoidal: absolute positions are added once at the input, so there is "
                  "no window-relative version, and the store holds no BCA profiles for it (section 1)",
}


def trained_catalogue(store_path=None) -> dict:
    """The stored measurements indexed for the trained explorer: no model is loaded.

    Returns ``{"path", "index": {(encoding, seed, eval_len, bca): Profile}, "encodings", "seeds":
    {encoding: [seed, ...]}, "train_len", "layers", "heads"}``. Every run must share one training
    length and one (layers, heads) shape, since the controls offer one set of each.
    """
    from . import experiments
    from .store import load_profiles

    path = experiments.STORE if store_path is None else store_path
    profiles, _ = load_profiles(path)
    index, seeds = {}, {}
    for p in profiles:
        encoding, seed = p.meta["encoding"], p.meta["seed"]
        index[(encoding, seed, p.eval_len, p.bca)] = p
        seeds.setdefault(encoding, set()).add(seed)
    train_lens = {p.meta["train_len"] for p in profiles}
    shapes = {tuple(p.s_hat.shape[:2]) for p in profiles}
    if len(train_lens) != 1 or len(shapes) != 1:
        raise ValueError(f"store {path}: the trained explorer needs one training length and one (layers, heads) shape, "
                         f"got training lengths {sorted(train_lens)} and shapes {sorted(shapes)}")
    (layers, heads), = shapes
    return {"path": str(path), "index": index, "encodings": list(dict.fromkeys(p.meta["encoding"] for p in profiles)),
            "seeds": {e: sorted(s) for e, s in seeds.items()}, "train_len": train_lens.pop(), "layers": layers, "heads": heads}


def _check_choice(value, options, what: str):
    if isinstance(value, bool) or value not in options:
        raise ValueError(f"{what} must be one of {list(options)}, got {value!r}")
    return value


def trained_state(catalogue: dict, encoding: str, seed: int, layer="mean", head="mean", eval_multiple: int = 1,
                  bca: bool = False) -> dict:
    """What the trained explorer shows for one choice of controls, from stored ŝ and NLL only.

    ``layer`` and ``head`` are indices or ``"mean"``. Returns the profile chosen, its layers'
    scores ``scores (l, T)`` (heads combined by the mean over heads, masked distances as -inf;
    l = every layer for ``layer="mean"``), the softmax weights ``weights (l, T)``, the per-position
    perplexity ``ppl (T,)`` = exp(NLL), the perplexities before and past L, and ``R``:
    ``{(head_mode, boundary): R}`` for every head convention and boundary. R is exactly what
    :func:`attnres_helpers.store.records` reports for that run, eval length, mask and layer
    (``"mean"``: the mean of the per-layer R, as in Table 3). For one head, R is that head's R
    under both conventions (there is nothing to average).
    """
    from .store import perplexities

    encoding = _check_choice(encoding, catalogue["encodings"], "encoding")
    seed = _check_choice(seed, catalogue["seeds"][encoding], f"seed (for {encoding})")
    layer = _check_choice(layer, ["mean", *range(catalogue["layers"])], "layer")
    head = _check_choice(head, ["mean", *range(catalogue["heads"])], "head")
    eval_multiple = _check_choice(eval_multiple, EVAL_MULTIPLES, "eval_multiple (eval length in units of L)")
    if not isinstance(bca, bool):
        raise ValueError(f"bca must be True or False, got {bca!r}")
    L = catalogue["train_len"]
    key = (encoding, seed, eval_multiple * L, bca)
    if key not in catalogue["index"]:
        reason = NO_BCA_REASON.get(encoding, "") if bca else ""
        raise ValueError(f"the store holds no profile for {encoding}, seed {seed}, eval length {eval_multiple}L = "
                         f"{eval_multiple * L}, {'BCA' if bca else 'causal'}" + (f" ({reason})" if reason else ""))
    profile = catalogue["index"][key]
    s_hat = profile.s_hat.double()  # (layers, H, T)
    chosen = s_hat if head == "mean" else s_hat[:, head:head + 1, :]  # (layers, h, T)
    R = {}
    for head_mode in HEAD_MODES:
        for boundary in BOUNDARIES:
            per_layer = layer_resolution(chosen, head_mode, boundary)  # (layers,)
            R[head_mode, boundary] = float(per_layer.mean()) if layer == "mean" else float(per_layer[layer])
    layers = list(range(catalogue["layers"])) if layer == "mean" else [layer]
    scores = mean_over_heads(chosen[layers])  # (l, T): the mean-scores convention, masked distances stay -inf
    weights = torch.softmax(scores, dim=-1).numpy()  # (l, T)
    scores = scores.numpy()
    nll = profile.nll.numpy()
    return {
        "run": profile.run, "encoding": encoding, "seed": seed, "layer": layer, "head": head, "layers": layers,
        "train_len": L, "eval_len": profile.eval_len, "eval_multiple": eval_multiple, "bca": bca,
        "scores": scores, "weights": weights, "ppl": np.exp(nll), **perplexities(profile.nll, L), "R": R,
    }


def trained_readout_html(state: dict) -> str:
    """The trained explorer's readout: the configuration, R under both head conventions and both
    boundaries (3 significant figures), and perplexity before and past L in the same windows."""
    k, L = state["eval_multiple"], state["train_len"]
    T = f"T = {'' if k == 1 else k}L = {state['eval_len']}"
    layer = "layer mean" if state["layer"] == "mean" else f"layer {state['layer']}"
    head = "heads: convention below" if state["head"] == "mean" else f"head {state['head']}"
    cell = "style='padding:0 10px; text-align:right'"
    rows = "".join(
        f"<tr><td style='padding:0 10px'>{mode}</td>"
        + "".join(f"<td {cell}>{format_sig(state['R'][mode, b])}</td>" for b in BOUNDARIES) + "</tr>"
        for mode in HEAD_MODES
    )
    one_head = "<br><i>one head: both conventions give this head's R</i>" if state["head"] != "mean" else ""
    past = state["perplexity_past_L"]
    ppl = (f"perplexity: positions &lt; L {format_sig(state['perplexity_first_L'])}"
           + (f" · positions ≥ L {format_sig(past)}" if past is not None else " · (no positions ≥ L at T = L)"))
    return (
        f"<b>{html.escape(state['encoding'])}, seed {state['seed']}</b> · {layer} · {head} · {T} · "
        f"{'BCA' if state['bca'] else 'causal'}"
        f"<table style='margin:2px 0'><tr><th style='padding:0 10px; text-align:left'>R</th>"
        + "".join(f"<th {cell}>boundary {b}</th>" for b in BOUNDARIES) + f"</tr>{rows}</table>"
        f"{ppl}{one_head}"
    )


class TrainedFigure:
    """ŝ[n] per layer, the softmax weights p_n (log), and perplexity by position, each with L marked.

    Redrawn in full on each change (the trained explorer follows menus, not a slider drag).
    The PNG is 900 × 300 pixels, shown at that size.
    """

    def __init__(self):
        self.fig = _figure(9.0, 3.0)
        self.axes = self.fig.subplots(1, 3, gridspec_kw=dict(left=0.065, right=0.99, bottom=0.17, top=0.88, wspace=0.3))

    def render(self, state: dict) -> bytes:
        ax_s, ax_w, ax_p = self.axes
        for ax in self.axes:
            ax.cla()
            ax.tick_params(labelsize=FONT_PT)
        L, T = state["train_len"], state["eval_len"]
        n = np.arange(T)
        for i, (layer, s, w) in enumerate(zip(state["layers"], state["scores"], state["weights"])):
            style = dict(color=f"C{layer}", linewidth=1.2, linestyle=("-", "--", ":", "-.")[i % 4])
            ax_s.plot(n, np.where(np.isfinite(s), s, np.nan), label=f"layer {layer}", **style)
            ax_w.plot(n, np.where(w > 0, w, np.nan), **style)
        ax_p.plot(n, state["ppl"], color="C0", linewidth=1)
        for ax in self.axes:
            ax.axvline(L, color="k", linestyle="--", linewidth=1)
            ax.set_xlim(0, T)
            ax.set_xticks([0, L // 2, L, *range(2 * L, T + 1, L)], ["0", str(L // 2), f"{L} (L)", *map(str, range(2 * L, T + 1, L))])
            ax.xaxis.get_major_ticks()[-1].label1.set_horizontalalignment("right")
            ax.set_xlabel("distance n" if ax is not ax_p else "position", fontsize=FONT_PT)
        heads = "heads averaged" if state["head"] == "mean" else f"head {state['head']}"
        ax_s.set_title(f"ŝ[n], {heads}", fontsize=FONT_PT + 1)
        ax_s.legend(fontsize=FONT_PT, loc="best")
        ax_w.set_yscale("log")
        ax_w.set_title("softmax weights p_n (log)", fontsize=FONT_PT + 1)
        ax_p.set_yscale("log")
        ax_p.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax_p.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "235" else ""))
        ax_p.set_title("perplexity by position (log)", fontsize=FONT_PT + 1)
        self.fig.canvas.draw()
        return _png(self.fig)


def trained_explorer(store_path=None) -> widgets.VBox:
    """Explore the stored ŝ and per-position NLL of the trained models (notebook 04); no model is loaded.

    Controls: encoding, seed, layer (or mean), head (or mean), eval length (L, 2L, 4L) and BCA
    (disabled, with its reason, where the store has no BCA profiles: sinusoidal). The readout
    (class ``attnres-trained-readout``) gives R under both head conventions and both
    boundaries, from :func:`trained_state`.
    """
    catalogue = trained_catalogue(store_path)
    L, first = catalogue["train_len"], catalogue["encodings"][0]
    default = "rope" if "rope" in catalogue["encodings"] else first
    encoding = widgets.Dropdown(options=catalogue["encodings"], value=default, description="encoding").add_class("attnres-t-encoding")
    seed = widgets.Dropdown(options=catalogue["seeds"][default], description="seed").add_class("attnres-t-seed")
    layer = widgets.Dropdown(options=[("mean", "mean")] + [(str(i), i) for i in range(catalogue["layers"])], value="mean",
                             description="layer").add_class("attnres-t-layer")
    head = widgets.Dropdown(options=[("mean", "mean")] + [(str(i), i) for i in range(catalogue["heads"])], value="mean",
                            description="head").add_class("attnres-t-head")
    eval_multiple = widgets.ToggleButtons(options=[(f"{'' if k == 1 else k}L = {k * L}", k) for k in EVAL_MULTIPLES], value=2,
                                          description="eval length").add_class("attnres-t-eval")
    bca = widgets.Checkbox(value=False, description="BCA (blockwise causal attention)", indent=False).add_class("attnres-t-bca")
    bca_note = widgets.HTML().add_class("attnres-t-bca-note")
    readout = widgets.HTML().add_class("attnres-trained-readout")
    error = widgets.HTML(layout=widgets.Layout(display="none")).add_class("attnres-error")
    figure = TrainedFigure()
    plot = widgets.Image(format="png", layout=figure_layout(figure.fig)).add_class("attnres-trained-plot")
    holding = []

    def update(_=None):
        if holding:
            return
        try:
            state = trained_state(catalogue, encoding.value, seed.value, layer.value, head.value, eval_multiple.value, bca.value)
            readout.value, plot.value = trained_readout_html(state), figure.render(state)
        except Exception as exc:
            error.value, error.layout.display = error_html(exc), None
        else:
            error.value, error.layout.display = "", "none"

    def switch_encoding(_=None):
        holding.append(True)
        try:
            seeds = catalogue["seeds"][encoding.value]
            if seed.value not in seeds:
                seed.value = None
            seed.options = seeds
            if seed.value is None:
                seed.value = seeds[0]
            reason = NO_BCA_REASON.get(encoding.value) if not any(
                key[0] == encoding.value and key[3] for key in catalogue["index"]) else None
            if reason:
                bca.value = False
            bca.disabled = reason is not None
            bca_note.value = f"<i>{html.escape(reason, quote=False)}</i>" if reason else ""
        finally:
            holding.pop()
        update()

    encoding.observe(switch_encoding, names="value")
    for control in (seed, layer, head, eval_multiple, bca):
        control.observe(update, names="value")
    switch_encoding()
    controls = widgets.VBox([widgets.HBox([encoding, seed]), widgets.HBox([layer, head]), eval_multiple,
                             widgets.HBox([bca, bca_note])])
    return widgets.VBox([controls, readout, error, plot]).add_class("attnres-trained-explorer")


# --------------------------------------------------------------------------- static pictures


def _text_strip(text: str, width_px: int) -> PILImage.Image:
    """A white strip with ``text`` (a few lines) drawn by matplotlib at FONT_PT + 1."""
    text = "\n".join(textwrap.fill(line, 150) for line in text.split("\n"))
    lines = text.count("\n") + 1
    fig = _figure(width_px / FIGURE_DPI, (0.22 * lines + 0.12))
    fig.text(0.01, 0.5, text, va="center", ha="left", fontsize=FONT_PT + 1, family="DejaVu Sans")
    fig.canvas.draw()
    return PILImage.open(io.BytesIO(_png(fig)))


def _visible_text(markup: str) -> str:
    """The text a browser shows for a readout's HTML, one line per <br> or table row."""
    text = re.sub(r"</tr>|<br\s*/?>|<table", "\n\\g<0>", markup)
    text = re.sub(r"</t[dh]>", "   ", text)
    text = re.sub(r"<[^>]+>", "", text)
    lines = [" ".join(html.unescape(line).split()) for line in text.split("\n")]
    return "\n".join(line for line in lines if line)


def default_picture(which: str = "explorer", store_path=None) -> bytes:
    """A PNG of one explorer in its default state: the readout's text above the plot the widget shows.

    ``which`` is ``"explorer"`` (notebook 02: RoPE, L = 1024) or ``"trained"`` (notebook 04:
    the trained explorer's defaults).
    """
    if which == "explorer":
        state = explorer_state("rope", 1024)
        figure, text = SingleFigure(), _visible_text(readout_html(state))
        notes, _ = explorer_notes(state)
        text += "\n" + "\n".join(notes)
    elif which == "trained":
        catalogue = trained_catalogue(store_path)
        default = "rope" if "rope" in catalogue["encodings"] else catalogue["encodings"][0]
        state = trained_state(catalogue, default, catalogue["seeds"][default][0], eval_multiple=2)
        figure, text = TrainedFigure(), _visible_text(trained_readout_html(state))
    else:
        raise ValueError(f"which must be 'explorer' or 'trained', got {which!r}")
    plot = PILImage.open(io.BytesIO(figure.render(state)))
    header = _text_strip("a picture of the widget in its default state (run the notebook for the live one)\n" + text, plot.width)
    picture = PILImage.new("RGB", (plot.width, header.height + plot.height), "white")
    picture.paste(header.convert("RGB"), (0, 0))
    picture.paste(plot.convert("RGB"), (0, header.height))
    buffer = io.BytesIO()
    picture.quantize(colors=128).save(buffer, format="png", optimize=True)
    return buffer.getvalue()


def save_default_image(path, which: str = "explorer", store_path=None) -> Path:
    """Write :func:`default_picture` to ``path`` atomically (the notebooks' static fallback)."""
    data = default_picture(which, store_path)
    path = Path(path)
    atomic_write(path, lambda tmp: tmp.write_bytes(data))
    return path
