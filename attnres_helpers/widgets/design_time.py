"""Design-time R of a real model, live (notebook 10): pick a family of training-free configurations, slide its
parameter, and see SmolLM2's design-time R pair and ŝ move, with the measured points where plan v4's store
has them. No model is loaded: the model's part is the shipped design-time store
(:func:`attnres_helpers.design_store.load_store`), the configuration's part its own form
(:func:`attnres_helpers.design_time.model_form`).

:func:`design_time_catalogue` loads both stores once; :func:`design_time_state` is what one choice of
controls shows (pure, no kernel); :func:`design_time_readout_html` its readout; :func:`design_time_explorer`
wires the controls (classes ``attnres-dt-family``, ``attnres-dt-param``, ``attnres-dt-layer``, the readout
``attnres-dt-readout`` and the plot ``attnres-dt-plot``). :func:`layer_ratio_figure` draws where the
approximation fails, layer by layer.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as widgets
import numpy as np
import torch

from .. import design_time as dt
from ..design_store import load_store
from ..paths import STORES
from .render import FONT_PT, BlitFigure, figure_pane, min_max_decimate, new_figure, serialized, state_update
from .text import format_sig

LABEL_STYLE = {"description_width": "initial"}
TOGGLE_STYLE = {**LABEL_STYLE, "button_width": "auto"}


@dataclass(frozen=True)
class Family:
    """One family of configurations with one parameter: its slider (low, high, step, default), what the
    parameter is, and the registry's entries on the slider ({value: name})."""

    name: str
    parameter: str
    low: float
    high: float
    step: float
    default: float
    registry: dict

    def values(self) -> list[float]:
        count = int(round((self.high - self.low) / self.step))
        return [round(self.low + i * self.step, 6) for i in range(count + 1)]


FAMILIES = {
    f.name: f
    for f in (
        Family("PI", "factor", 1.0, 8.0, 0.5, 2.0, {2.0: "pi-2"}),
        Family("YaRN", "factor", 1.0, 8.0, 0.5, 2.0, {2.0: "yarn-2", 4.0: "yarn-4"}),
        Family("dynamic NTK", "factor", 1.0, 8.0, 0.5, 2.0, {2.0: "ntk-2"}),
        Family("static NTK", "base factor α", 1.0, 8.0, 0.5, 2.0, {2.0: "ntk-static-2"}),
        Family(
            "Self-Extend", "group G (W = L/G)", 2.0, 32.0, 2.0, 8.0, {8.0: "self-extend-8-8", 16.0: "self-extend-16-16"}
        ),
        Family("ReRoPE", "window w / L", 0.0625, 1.0, 0.0625, 0.25, {0.25: "rerope-4"}),
        Family("leaky ReRoPE", "slope k (w = L/4)", 2.0, 32.0, 2.0, 16.0, {16.0: "leaky-rerope-4-16"}),
        Family("BCA", "block / L", 0.125, 1.0, 0.125, 0.5, {0.25: "bca-4", 0.5: "bca"}),
        Family("window", "first tokens kept (window of L)", 0.0, 10.0, 1.0, 4.0, {0.0: "window", 4.0: "streaming"}),
    )
}


def configuration(family: str, value: float):
    """The configuration of ``family`` at its parameter ``value``, as a registry entry would write it (the
    tests check that the registry's own entries come back at their values)."""
    from ..hf.configurations import Configuration

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    f, v = FAMILIES[family], float(value)
    if not f.low <= v <= f.high:
        raise ValueError(f"{family}'s {f.parameter} must be in [{f.low:g}, {f.high:g}], got {value!r}")
    name = f"{family} {v:g}"
    kinds = {"PI": "rescaled", "YaRN": "rescaled", "dynamic NTK": "rescaled", "static NTK": "rescaled"}
    kind = kinds.get(family, "masked" if family == "BCA" else "windowed" if family == "window" else "remapped")
    rope = remap = None
    mask = ("causal", None, 0)
    if family == "PI":
        rope = {"rope_type": "linear", "factor": v}
    elif family == "YaRN":
        rope = {"rope_type": "yarn", "factor": v, "original_max_position_embeddings": None}
    elif family == "dynamic NTK":
        rope = {"rope_type": "dynamic", "factor": v}
    elif family == "Self-Extend":
        remap = ("self-extend", 1 / v, (int(v),))
    elif family == "ReRoPE":
        remap = ("rerope", v, ())
    elif family == "leaky ReRoPE":
        remap = ("leaky-rerope", 1 / 4, (int(v),))
    elif family == "BCA":
        mask = ("bca", v, 0)
    elif family == "window":
        mask = ("window", 1.0, int(v))
    base = v if family == "static NTK" else None
    return Configuration(name, name, kind, rope=rope, base_factor=base, remap=remap, mask=mask)


def design_time_catalogue(design_store: str | Path | None = None, measured_store: str | Path | None = None) -> dict:
    """Both stores, read once: ``{"design": DesignStore, "corr": its Correlations (interpolated once),
    "measured": ConfiguredStore or None, "L", "layers", "cache": {}}``."""
    from ..configured_store import load

    design = load_store(STORES["design_time"] if design_store is None else design_store)
    path = STORES["configurations_v4"] if measured_store is None else measured_store
    measured = load(path) if Path(path).is_file() else None
    corr = design.correlations()
    corr.planar_dtype = torch.float32  # R within ~1e-6 of float64's (the tests check it), at half the traffic
    corr.planar("bulk"), corr.planar("key0")  # the layout every change sums in, made now rather than at the first
    return {"design": design, "corr": corr, "measured": measured, "L": design.train_len, "layers": corr.layers}


def _measured(catalogue: dict, name: str, T: int):
    store = catalogue["measured"]
    return None if store is None else store.entries.get((name, T))


def design_time_state(catalogue: dict, family: str, value: float, layer: int = 0) -> dict:
    """What the explorer shows for one choice: the design-time R pair (layer mean and ``layer``, with and
    without the first-token entries), ŝ of ``layer`` at 2L, and the measured values of the registry's entry
    at this value where the measured store has it (R: the mean over windows of each window's R; ŝ: the
    stored window mean). Every R is :func:`attnres_helpers.design_time.design_r`'s."""
    L, layers = catalogue["L"], catalogue["layers"]
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < layers:
        raise ValueError(f"layer must be an integer in 0..{layers - 1}, got {layer!r}")
    config = configuration(family, value)
    forms = {T: dt.model_form(catalogue["design"].model, config, L, T) for T in (L, 2 * L)}
    lengths = dt.design_lengths(catalogue["corr"], forms)
    design = {"L": lengths[L], "2L": lengths[2 * L]}
    name = FAMILIES[family].registry.get(round(float(value), 6))
    measured, s_measured = {}, None
    if name is not None:
        for tag, T in (("L", L), ("2L", 2 * L)):
            entry = _measured(catalogue, name, T) or (
                _measured(catalogue, "as-trained", T) if T == L and _same_as_trained_at_L(name) else None
            )
            if entry is not None:
                measured[tag] = {
                    "r": entry.window_r.double().mean(0),
                    "r_sink_free": entry.window_r_sink_free.double().mean(0),
                    "windows": entry.windows,
                }
                if tag == "2L" and entry.s_hat is not None:
                    s_measured = entry.s_hat[layer].double().numpy()
    return {
        "family": family,
        "value": float(value),
        "parameter": FAMILIES[family].parameter,
        "layer": int(layer),
        "L": L,
        "registry": name,
        "r": {tag: {k: d[k] for k in ("r", "r_sink_free")} for tag, d in design.items()},
        "s_hat": design["2L"]["s_hat"][layer].numpy(),
        "measured": measured,
        "s_measured": s_measured,
        "approximate": dt.approximations(forms[2 * L], 2 * L, L, True),
    }


def _same_as_trained_at_L(name: str) -> bool:
    from ..hf.configurations import CONFIGURATIONS

    return CONFIGURATIONS[name].same_as_trained_up_to_L


def design_time_readout_html(state: dict) -> str:
    """The readout: the configuration, the design-time R pair (layer mean and the chosen layer, with and
    without the sink, 3 significant figures), and the measured pair where the store has it."""
    layer = state["layer"]
    cell = "style='padding:0 10px; text-align:right'"

    def row(label: str, values: dict) -> str:
        cells = []
        for tag in ("L", "2L"):
            for key in ("r", "r_sink_free"):
                v = values.get(tag)
                cells.append(
                    "n/a" if v is None else f"{format_sig(float(v[key].mean()))} / {format_sig(float(v[key][layer]))}"
                )
        return f"<tr><td style='padding:0 10px'>{label}</td>" + "".join(f"<td {cell}>{c}</td>" for c in cells) + "</tr>"

    heads = ["R(L)", "R(L) no sink", "R(2L)", "R(2L) no sink"]
    windows = {d["windows"] for d in state["measured"].values()}
    measured = (
        row(
            f"measured ({html.escape(state['registry'])}, {min(windows)} window{'s' if min(windows) > 1 else ''})",
            state["measured"],
        )
        if state["measured"]
        else ""
    )
    where = "" if state["registry"] else " (no registry entry at this value: nothing measured)"
    return (
        f"<b>{html.escape(state['family'])}, {html.escape(state['parameter'])} = {state['value']:g}</b>{where} · "
        f"cells: layer mean / layer {layer}"
        f"<table style='margin:2px 0'><tr><th style='padding:0 10px; text-align:left'></th>"
        + "".join(f"<th {cell}>{h}</th>" for h in heads)
        + f"</tr>{row('design time', state['r'])}{measured}</table>"
        + "<i>approximate at 2L: "
        + html.escape("; ".join(state["approximate"]))
        + "</i>"
    )


class DesignTimeFigure(BlitFigure):
    """ŝ[n] of one layer at 2L (design time, and measured where it exists) and the layer-mean R pair
    against the family's parameter (design time now; measured registry entries), 900 × 300 pixels."""

    def __init__(self):
        self.fig = new_figure(9.0, 3.0)
        self.ax_s, self.ax_r = self.fig.subplots(
            1, 2, gridspec_kw=dict(left=0.07, right=0.985, bottom=0.17, top=0.88, wspace=0.22, width_ratios=[1.6, 1])
        )
        for ax in (self.ax_s, self.ax_r):
            ax.tick_params(labelsize=FONT_PT)
        self.ax_s.set_xlabel("distance n (T = 2L)", fontsize=FONT_PT, labelpad=2)
        self.ax_r.set_yscale("log")
        self.ax_r.set_ylim(1e-4, 1.0)
        self.ax_r.set_title("layer-mean R: design filled, measured open", fontsize=FONT_PT + 1)
        (self.s_design,) = self.ax_s.plot([], [], color="C0", linewidth=1.0, label="design time")
        (self.s_measured,) = self.ax_s.plot([], [], color="0.45", linewidth=0.8, linestyle="--", label="measured")
        self.points = {
            (tag, kind): self.ax_r.plot([], [], marker, color=color, markersize=7, fillstyle=fill, linestyle="none")[0]
            for tag, color in (("L", "C1"), ("2L", "C0"))
            for kind, marker, fill in (("design", "o", "full"), ("measured", "s", "none"))
        }
        self.legend = self.ax_s.legend(handles=[self.s_design, self.s_measured], fontsize=FONT_PT, loc="upper right")
        self.ax_r.plot([], [], "o", color="C1", label="R(L)")
        self.ax_r.plot([], [], "o", color="C0", label="R(2L)")
        self.ax_r.legend(fontsize=FONT_PT, loc="lower right")

    @property
    def animated(self) -> tuple:
        return (self.s_design, self.s_measured, *self.points.values(), self.ax_s.title)

    @property
    def groups(self) -> tuple:
        return (((self.ax_s.yaxis, self.ax_r.xaxis), self.fig.bbox),)

    def _frame_artists(self, L: int, family: Family) -> None:
        """Ticks for L and the family's parameter axis (drawn into the background by :meth:`set_frame`)."""
        self.ax_s.set_xlim(0, 2 * L)
        self.ax_s.set_xticks([0, L, 2 * L], ["0", f"{L} (L)", f"{2 * L} (2L)"])
        pad = family.step
        self.ax_r.set_xlim(family.low - pad, family.high + pad)
        self.ax_r.set_xlabel(family.parameter, fontsize=FONT_PT, labelpad=2)

    def render(self, state: dict) -> bytes:
        family = FAMILIES[state["family"]]
        self.set_frame((state["L"], family.name), lambda: self._frame_artists(state["L"], family))
        n = np.arange(2 * state["L"])
        curves = [state["s_hat"]] + ([state["s_measured"]] if state["s_measured"] is not None else [])
        finite = np.concatenate([c[np.isfinite(c)] for c in curves])
        low, high = math.floor(finite.min()) - 1, math.ceil(finite.max()) + 1
        for line, curve in zip((self.s_design, self.s_measured), (state["s_hat"], state["s_measured"])):
            line.set_visible(curve is not None)
            if curve is not None:
                x, y = min_max_decimate(n, np.where(np.isfinite(curve), curve, np.nan), 450)
                line.set_data(x, y)
        for (tag, kind), line in self.points.items():
            source = state["r"] if kind == "design" else state["measured"]
            if tag in source:
                line.set_data([state["value"]], [max(float(source[tag]["r"].mean()), 1e-4)])
            line.set_visible(tag in source)
        title = f"ŝ[n], layer {state['layer']}, {state['family']} {state['value']:g}"
        self.ax_s.set_ylim(low, high)
        self.ax_s.set_title(title, fontsize=FONT_PT + 1)
        return self.blit((low, high, family.name))


def design_time_explorer(design_store: str | Path | None = None, measured_store: str | Path | None = None):
    """The widget: family (toggle buttons), its parameter (a slider), the layer whose ŝ and R are shown (a
    slider), the readout and the figure. Every change recomputes the design-time pair at L and 2L from the
    store (tens of milliseconds; ``benchmarks/bench_design_time.py --widget`` times it)."""
    catalogue = design_time_catalogue(design_store, measured_store)
    first = FAMILIES["YaRN"]
    family = widgets.ToggleButtons(options=list(FAMILIES), value=first.name, description="family", style=TOGGLE_STYLE)
    family.add_class("attnres-dt-family")
    param = widgets.FloatSlider(
        value=first.default,
        min=first.low,
        max=first.high,
        step=first.step,
        description=first.parameter,
        style=LABEL_STYLE,
        readout_format=".4g",
        continuous_update=True,
        layout=widgets.Layout(width="520px"),
    ).add_class("attnres-dt-param")
    layer = widgets.IntSlider(value=0, min=0, max=catalogue["layers"] - 1, description="layer", style=LABEL_STYLE)
    layer.add_class("attnres-dt-layer")
    readout = widgets.HTML().add_class("attnres-dt-readout")
    error, figure, plot, show_error, drawer = figure_pane(DesignTimeFigure, "attnres-dt-plot")
    holding = []
    update = state_update(
        lambda: design_time_state(catalogue, family.value, param.value, layer.value),
        readout,
        design_time_readout_html,
        show_error,
        drawer,
        holding,
    )

    @serialized
    def switch_family(_: dict | None = None) -> None:
        f = FAMILIES[family.value]
        holding.append(True)
        try:
            param.min, param.max = min(param.min, f.low), max(param.max, f.high)  # never clamps the value
            param.step, param.value = f.step, f.default
            param.min, param.max = f.low, f.high
            param.description = f.parameter
        finally:
            holding.pop()
        update()

    family.observe(switch_family, names="value")
    param.observe(update, names="value")
    layer.observe(update, names="value")
    update(at_once=True)
    root = widgets.VBox([family, widgets.HBox([param, layer]), readout, error, plot]).add_class("attnres-dt-explorer")
    root.drawer = drawer  # how many plots were drawn, for tests and the benchmark
    root.controls = {"family": family, "param": param, "layer": layer, "readout": readout, "plot": plot}
    return root


# --------------------------------------------------------------------------- the notebook's static figures


def layer_ratio_figure(rows: list[dict], length: str = "2L"):
    """Where design time fails, layer by layer: log2(design / measured R) at ``length`` for every
    configuration (rows of :func:`attnres_helpers.design_time.against_measured`), with the first-token
    entries (left) and without them (right). A pyplot figure (the notebook shows it)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    picked = [r for r in rows if r["length"] == length]
    if not picked:
        raise ValueError(f"no configuration has a measurement at {length}")
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.32 * len(picked) + 1.9), sharey=True)
    fig.suptitle(f"log2(design-time R({length}) / measured R({length})), per layer")
    for ax, tag, title in zip(axes, ("", "_sink_free"), ("with the first-token entries", "without them")):
        ratio = torch.stack([r["design" + tag] / r["measured" + tag] for r in picked]).log2().numpy()
        image = ax.imshow(ratio, aspect="auto", cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -4.0, 4.0))
        ax.set_yticks(range(len(picked)), [r["configuration"] for r in picked])
        ax.set_xlabel("layer")
        ax.set_title(title)
    fig.colorbar(image, ax=axes, shrink=0.9, label="log2 ratio (0: equal; ±1: a factor of 2)")
    return fig
