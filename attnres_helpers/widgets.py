"""An ipywidgets explorer of design-time score curves and their resolution pair (notebook 02).

The update logic is in pure functions, :func:`explorer_state`, :func:`readout_html`,
:func:`compare_states` and :func:`compare_readout_html`, that run without a kernel; the
widget only wires sliders to them and draws a persistent matplotlib figure (Agg, no
pyplot) into an ``Image`` widget, so an update redraws artists instead of building a
figure. CSS classes (``attnres-readout``, ``attnres-slider-<name>``, ``attnres-error``,
``attnres-plot``) let a browser test find the parts.
"""

from __future__ import annotations

import html
import io
import math
import numbers

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullLocator
from PIL import Image as PILImage

from .encodings import DESIGN_CURVES, Param, _check_length, curve_pair, default_params, score_curve
from .plots import plot_resolution_pairs
from .metric import BOUNDARIES, HEAD_MODES, Boundary, HeadMode

L_RANGE = (16, 2048, 16)  # (min, max, step) of the training-length slider; 2L reaches 4096
SIG_DIGITS = 3  # significant figures of the readouts
RATIO_FLOOR = 1e-12  # below this R(L) the ratio R(2L)/R(L) is reported as undefined
DEFAULT_BOUNDARY: Boundary = "zero"
DEFAULT_HEAD_MODE: HeadMode = "mean-scores"
SLIDER_LABELS = {"heads": "number of heads"}  # a parameter's slider label, where it differs from its name
HEAD_NOTE = "head convention: only ALiBi's per-head curves (2 or more heads) depend on it"
COMPARE_DEFAULT = ("sinusoidal", "rope", "xpos", "alibi", "kerple-log", "t5")


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


def compare_readout_html(states: list[dict]) -> str:
    rows = (f"<b>{html.escape(s['name'])}</b>: {_pair_text(s['R_L'], s['R_2L'], s['ratio'])}" for s in states)
    return "<br>".join(rows)


def error_html(exc: Exception) -> str:
    return f"<b>{type(exc).__name__}</b>: {html.escape(str(exc))} &nbsp;(the plot and readout were not updated)"


# --------------------------------------------------------------------------- figures


def _jpeg(fig: Figure) -> bytes:
    """The canvas as it stands (no redraw) as a JPEG: ~2 ms against ~10 ms for a PNG of the same size."""
    width, height = fig.canvas.get_width_height()
    buffer = io.BytesIO()
    image = PILImage.frombuffer("RGBA", (width, height), fig.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    image.convert("RGB").save(buffer, format="jpeg", quality=92, subsampling=0)
    return buffer.getvalue()


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


class SingleFigure:
    """s[n] (left) and softmax weights (right) of one encoding against n/L, with blitting.

    Distances are drawn in units of L, so everything but the curves and the score axis
    (frames, x axes, the L mark, the fixed weight axis, titles, legend) is the same for
    every state: it is drawn once into a background. An update restores it and draws
    only the animated artists, the lines and the score axis's ticks (text is the
    costly part of an Agg draw), which keeps a redraw to a few milliseconds.
    """

    WEIGHT_RANGE = (1e-12, 2.0)

    def __init__(self):
        self.fig = Figure(figsize=(10, 3.4), dpi=72)
        FigureCanvasAgg(self.fig)
        self.ax_s, self.ax_w = self.fig.subplots(1, 2, gridspec_kw=dict(left=0.085, right=0.98, bottom=0.15, top=0.9, wspace=0.24))
        for ax in (self.ax_s, self.ax_w):
            ax.set_xlim(0, 2)
            ax.set_xticks([0, 0.5, 1, 1.5, 2], ["0", "L/2", "L", "3L/2", "2L"])
            ax.set_xlabel("distance n")
            ax.axvline(1, color="k", linestyle="--", linewidth=1)
        self.heads = LineCollection([], colors="C0", alpha=0.3, linewidths=0.8)
        self.ax_s.add_collection(self.heads)
        (self.line_s,) = self.ax_s.plot([], [], color="C0")
        (self.line_L,) = self.ax_w.plot([], [], color="C0", label="window of L distances")
        (self.line_2L,) = self.ax_w.plot([], [], color="C1", alpha=0.8, label="window of 2L distances")
        self.title = None  # the score panel's title, set by the first render (it names the encoding)
        self.ax_s.yaxis.set_major_locator(MaxNLocator(5))
        self.fig.text(0.01, 0.52, "score", rotation=90, va="center")  # static, unlike an axis label
        self.ax_s.yaxis.set_label_coords(-0.1, 0.5)  # fixed: no tick-label measuring on each draw
        self.ax_w.set_title("softmax weights of the last query (log scale)", fontsize="medium")
        self.ax_w.set(yscale="log", ylim=self.WEIGHT_RANGE)
        self.ax_w.yaxis.set_major_locator(LogLocator(numticks=7))
        self.ax_w.yaxis.set_minor_locator(NullLocator())
        self.ax_w.legend(loc="upper right", fontsize="small")
        self.animated = (self.heads, self.line_s, self.ax_s.yaxis, self.line_L, self.line_2L)
        for artist in self.animated:
            artist.set_animated(True)
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
        self.ax_s.set_title(title, fontsize="medium")
        self.fig.canvas.draw()
        self.background = self.fig.canvas.copy_from_bbox(self.fig.bbox)

    def render(self, state: dict) -> bytes:
        self._set_title(self.title_for(state))
        L, curve, profile = state["L"], state["curve"], state["profile"]
        x = np.arange(2 * L) / L  # (2L,) distance in units of L
        self.line_s.set_data(*min_max_decimate(x, profile))
        self.heads.set_segments(np.stack(min_max_decimate(x, curve), axis=-1) if curve.ndim == 2 else [])  # (H, M, 2)
        self.line_L.set_data(*min_max_decimate(x[:L], state["weights_L"]))
        self.line_2L.set_data(*min_max_decimate(x, state["weights_2L"]))
        low, high = float(curve.min()), float(curve.max())
        pad = 0.05 * (high - low) or 1.0
        self.ax_s.set_ylim(low - pad, high + pad)
        self.fig.canvas.restore_region(self.background)
        for artist in self.animated:
            self.fig.draw_artist(artist)
        return _jpeg(self.fig)


class CompareFigure:
    """Several encodings at their defaults: s[n] − s[0] overlaid, softmax weights over 2L, (R(L), R(2L)) bars.

    Redrawn in full on each change (a few hundred ms): it follows the selection, not a slider drag.
    """

    def __init__(self):
        self.fig = Figure(figsize=(13, 3.6), dpi=72)
        FigureCanvasAgg(self.fig)
        self.axes = self.fig.subplots(1, 3, gridspec_kw=dict(left=0.06, right=0.99, bottom=0.22, top=0.9, wspace=0.25))

    def render(self, states: list[dict]) -> bytes:
        ax_s, ax_w, ax_r = self.axes
        for ax in self.axes:
            ax.cla()
        L = states[0]["L"]
        n = np.arange(2 * L)
        for state in states:
            ax_s.plot(n, state["profile"] - state["profile"][0], label=state["name"])
            ax_w.plot(n, state["weights_2L"], label=state["name"])
        for ax in (ax_s, ax_w):
            ax.axvline(L, color="k", linestyle="--", linewidth=1)
            ax.set(xlim=(0, 2 * L), xlabel="distance n")
        ax_s.set(yscale="symlog", ylabel="s[n] − s[0] (symlog)", title=f"registry defaults, L = {L} dashed")
        ax_s.legend(fontsize="small")
        ax_w.set(yscale="log", ylim=SingleFigure.WEIGHT_RANGE, ylabel="softmax weight, window 2L")
        plot_resolution_pairs([s["name"] for s in states], [s["R_L"] for s in states], [s["R_2L"] for s in states], ax=ax_r)
        ax_r.set_title("the pair, not one number")
        self.fig.canvas.draw()
        return _jpeg(self.fig)


# --------------------------------------------------------------------------- widget


def find_by_class(widget, css_class: str):
    """The first widget in the tree under ``widget`` that carries ``css_class`` (None if none does)."""
    if css_class in getattr(widget, "_dom_classes", ()):
        return widget
    return next((hit for child in getattr(widget, "children", ()) if (hit := find_by_class(child, css_class)) is not None), None)


def param_slider(name: str, param: Param) -> widgets.Widget:
    """A slider for one registry parameter, with CSS class ``attnres-slider-<name>``."""
    common = dict(description=SLIDER_LABELS.get(name, name), continuous_update=False, style={"description_width": "8em"})
    if param.kind == "int":
        slider = widgets.IntSlider(value=param.default, min=param.low, max=param.high, step=param.step, **common)
    elif param.kind == "log":
        slider = widgets.FloatLogSlider(
            value=param.default, base=10, min=math.log10(param.low), max=math.log10(param.high), step=param.step, readout_format=".3g", **common
        )
    else:
        slider = widgets.FloatSlider(value=param.default, min=param.low, max=param.high, step=param.step, readout_format=".2f", **common)
    return slider.add_class(f"attnres-slider-{name}")


def explorer(name: str = "rope", L: int = 1024) -> widgets.VBox:
    """The interactive explorer: encoding, its sliders, L, a plot and the live (R(L), R(2L)) readout.

    "single" mode shows one encoding; "compare" overlays several at their defaults and
    draws their (R(L), R(2L)) pairs as grouped bars. Errors appear in the widget.
    "reset to defaults" (CSS class ``attnres-reset``) restores the encoding's parameters,
    L (the one the explorer was opened with), the boundary and the head convention; the
    head-convention menu is disabled, with a one-line reason, while no curve shown has
    several heads.
    """
    default_params(name)  # raises ValueError for an unknown encoding, listing the known ones
    if isinstance(L, bool) or not isinstance(L, int) or not L_RANGE[0] <= L <= L_RANGE[1]:
        raise ValueError(f"L must be an integer in [{L_RANGE[0]}, {L_RANGE[1]}] (the slider's range), got {L!r}")
    mode = widgets.ToggleButtons(options=["single", "compare"], value="single", description="mode")
    encoding = widgets.Dropdown(options=list(DESIGN_CURVES), value=name, description="encoding")
    chosen = widgets.SelectMultiple(options=list(DESIGN_CURVES), value=COMPARE_DEFAULT, rows=len(DESIGN_CURVES), description="compare")
    length = widgets.IntSlider(value=L, min=L_RANGE[0], max=L_RANGE[1], step=L_RANGE[2], description="L (train)", continuous_update=False)
    length.add_class("attnres-slider-L")
    boundary = widgets.Dropdown(options=BOUNDARIES, value=DEFAULT_BOUNDARY, description="boundary")
    head_mode = widgets.Dropdown(
        options=HEAD_MODES, value=DEFAULT_HEAD_MODE, description="head convention", style={"description_width": "8em"}
    ).add_class("attnres-head-mode")
    head_note = widgets.HTML().add_class("attnres-head-note")
    reset = widgets.Button(description="reset to defaults", tooltip="the encoding's parameters, L, boundary and head convention")
    reset.add_class("attnres-reset")
    summary = widgets.HTML()
    params_box = widgets.VBox()
    readout = widgets.HTML().add_class("attnres-readout")
    error = widgets.HTML(layout=widgets.Layout(display="none")).add_class("attnres-error")
    plot = widgets.Image(format="jpeg").add_class("attnres-plot")
    single_figure, compare_figure = SingleFigure(), CompareFigure()
    sliders: dict[str, widgets.Widget] = {}
    holding = []  # non-empty while several controls are set at once: one update at the end

    def show_head_convention(states):
        multi = any(s["multi_head"] for s in states)
        head_mode.disabled = not multi
        head_note.value = "" if multi else f"<i>{html.escape(HEAD_NOTE)}</i>"

    def update(_=None):
        if holding:
            return
        try:
            if mode.value == "single":
                state = explorer_state(encoding.value, length.value, {k: s.value for k, s in sliders.items()}, boundary.value, head_mode.value)
                show_head_convention([state])
                readout.value, plot.value = readout_html(state), single_figure.render(state)
            else:
                states = compare_states(chosen.value, length.value, boundary.value, head_mode.value)
                show_head_convention(states)
                readout.value, plot.value = compare_readout_html(states), compare_figure.render(states)
        except Exception as exc:  # shown in the widget: a callback's traceback would be lost
            error.value, error.layout.display = error_html(exc), None
        else:
            error.value, error.layout.display = "", "none"

    def rebuild_sliders(_=None):
        for slider in sliders.values():
            slider.close()
        sliders.clear()
        sliders.update({key: param_slider(key, param) for key, param in DESIGN_CURVES[encoding.value].params.items()})
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
    controls = widgets.VBox(
        [mode, widgets.HBox([encoding, summary]), chosen, length, widgets.HBox([boundary, head_mode, head_note]), params_box, reset]
    )
    root = widgets.VBox([controls, readout, error, plot]).add_class("attnres-explorer")
    root.reset_to_defaults = reset_to_defaults  # the button's handler, for code and tests
    return root

