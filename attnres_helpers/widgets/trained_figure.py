"""The trained explorer's figure: ŝ[n] per layer, the softmax weights p_n (log) and perplexity by position."""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

from .render import FONT_PT, BlitFigure, new_figure

LINESTYLES = ("-", "--", ":", "-.")  # one per layer shown, so that overlapping layers stay apart
MAX_LEGEND = 8  # more layers than this (a real model's 30) get no legend: it would cover the panel
MINOR_LABEL_DECADES = 2  # the perplexity axis labels its minor ticks (2, 3, 5 x 10^k) over at most this many


def length_ticks(L: int, max_len: int) -> tuple[list[int], list[str]]:
    """x ticks of the trained figure, whose axes span 0..max_len whatever the eval length: 0 and
    L·2^k (labelled "128 (L)", "256 (2L)", "512 (4L)", ...) up to max_len. Multiples of L in between
    (3L) carry no label: at 4L their labels would run into their neighbours'."""
    ticks, k = [0], 1
    while k * L <= max_len:
        ticks.append(k * L)
        k *= 2
    return ticks, ["0"] + [f"{n} ({'' if n == L else n // L}L)" for n in ticks[1:]]


def _ppl_label(value: float, _pos=None) -> str:
    return f"{value:g}"


def _ppl_minor_label(value: float, _pos=None) -> str:
    return f"{value:g}" if f"{value:g}"[0] in "235" else ""


class TrainedFigure(BlitFigure):
    """ŝ[n] per layer, the softmax weights p_n (log), and perplexity by position, each with L marked.

    The x axes span the longest eval length the store holds and the y ranges come with the state
    (:func:`attnres_helpers.widgets.trained.plot_limits`, fixed over eval lengths and masks), so
    BCA on and off, or T = L, 2L and 4L, are drawn on the same axes; distances a shorter window
    does not reach are shaded. Frames, x ticks and the L marks are drawn once into a background;
    the y axes and the score panel's title are a cached layer over it, redrawn when the layer,
    head or run changes; an update draws the curves and the legend (a blit). The PNG is
    900 × 300 pixels, shown at that size.
    """

    def __init__(self):
        self.fig = new_figure(9.0, 3.0)
        self.axes = self.fig.subplots(
            1, 3, gridspec_kw=dict(left=0.065, right=0.985, bottom=0.17, top=0.88, wspace=0.3)
        )
        self.ax_s, self.ax_w, self.ax_p = self.axes
        self.lines_s, self.lines_w, self.marks, self.shades, self.legend = [], [], [], [], None
        (self.line_p,) = self.ax_p.plot([], [], color="C0", linewidth=1)
        for ax in self.axes:
            ax.tick_params(labelsize=FONT_PT)
            ax.set_xlabel("distance n" if ax is not self.ax_p else "position", fontsize=FONT_PT, labelpad=2)
            self.shades.append(
                ax.axvspan(0, 0, color="0.75", alpha=0.45, linewidth=0)
            )  # distances this T does not reach
        self.ax_s.yaxis.set_major_locator(MaxNLocator(5))
        self.ax_w.set_yscale("log")
        self.ax_w.yaxis.set_major_locator(LogLocator(numticks=6))
        self.ax_w.yaxis.set_minor_locator(NullLocator())
        self.ax_w.set_title("softmax weights p_n (log)", fontsize=FONT_PT + 1)
        self.ax_p.set_yscale("log")
        self.ax_p.yaxis.set_major_formatter(FuncFormatter(_ppl_label))
        self.ax_p.yaxis.set_minor_formatter(FuncFormatter(_ppl_minor_label))
        self.ax_p.set_title("perplexity by position (log)", fontsize=FONT_PT + 1)
        self.ax_s.set_title(" ", fontsize=FONT_PT + 1)

    @property
    def animated(self) -> tuple:
        return (
            *self.shades,
            *self.lines_s,
            *self.lines_w,
            self.line_p,
            *([self.legend] if self.legend is not None else []),
        )

    @property
    def groups(self) -> tuple:
        return (((*(ax.yaxis for ax in self.axes), self.ax_s.title), self.fig.bbox),)

    def _frame_artists(self, L: int, max_len: int, layers: int) -> None:
        """Ticks, L marks and one line per layer for a store's L, longest eval length and layer count
        (drawn into the background by :meth:`set_frame`)."""
        for line in self.lines_s + self.lines_w + self.marks:
            line.remove()
        self.lines_s = [self.ax_s.plot([], [], linewidth=1.2, label=f"layer {i}")[0] for i in range(layers)]
        self.lines_w = [self.ax_w.plot([], [], linewidth=1.2)[0] for _ in range(layers)]
        ticks, labels = length_ticks(L, max_len)
        self.marks = [ax.axvline(L, color="k", linestyle="--", linewidth=1) for ax in self.axes]
        for ax in self.axes:
            ax.set_xlim(0, max_len)
            ax.set_xticks(ticks, labels)
            ax.set_xticks(range(L, max_len + 1, L), minor=True)
            for i, tick in enumerate(ax.xaxis.get_major_ticks()):  # ticks outlive a frame: set every one's alignment
                tick.label1.set_horizontalalignment("right" if i == len(ticks) - 1 else "center")

    def _set_legend(self, layers: list[int]) -> None:
        shown = [self.lines_s[i] for i in range(len(layers))] if len(layers) <= MAX_LEGEND else []
        if self.legend is not None and [t.get_text() for t in self.legend.get_texts()] == [
            line.get_label() for line in shown
        ]:
            return
        if self.legend is not None:
            self.legend.remove()
            self.legend = None
        if not shown:
            return
        self.legend = self.ax_s.legend(
            handles=shown,
            fontsize=FONT_PT,
            loc="upper right",
            ncol=2,
            handlelength=1.8,
            columnspacing=0.8,
            borderpad=0.3,
            framealpha=0.7,
        )
        self.legend.set_animated(True)

    def render(self, state: dict) -> bytes:
        limits, T = state["limits"], state["eval_len"]
        frame = (state["train_len"], limits["max_len"], state["n_layers"])
        self.set_frame(frame, lambda: self._frame_artists(*frame))
        n = np.arange(T)
        for i, (line_s, line_w) in enumerate(zip(self.lines_s, self.lines_w)):
            visible = i < len(state["layers"])
            line_s.set_visible(visible)
            line_w.set_visible(visible)
            if not visible:
                continue
            layer, s, w = state["layers"][i], state["scores"][i], state["weights"][i]
            style = dict(color=f"C{layer}", linestyle=LINESTYLES[i % len(LINESTYLES)])
            line_s.set_data(n, np.where(np.isfinite(s), s, np.nan))
            line_w.set_data(n, np.where(w > 0, w, np.nan))
            line_s.set(label=f"layer {layer}", **style)
            line_w.set(**style)
        self.line_p.set_data(n, state["ppl"])
        for shade in self.shades:
            shade.set_x(T)
            shade.set_width(limits["max_len"] - T)
            shade.set_visible(T < limits["max_len"])
        heads = "heads averaged" if state["head"] == "mean" else f"head {state['head']}"
        many = len(state["layers"]) > MAX_LEGEND  # no legend: the title says how many layers are drawn
        title = f"ŝ[n], {heads}" + (f", {len(state['layers'])} layers" if many else "")
        layer_key = (limits["scores"], limits["weights"], limits["ppl"], title)
        self.ax_s.set_ylim(*limits["scores"])
        self.ax_w.set_ylim(*limits["weights"])
        self.ax_p.set_ylim(*limits["ppl"])
        low, high = limits["ppl"]
        wide = high > low * 10**MINOR_LABEL_DECADES
        self.ax_p.yaxis.set_minor_formatter(NullFormatter() if wide else FuncFormatter(_ppl_minor_label))
        self.ax_s.set_title(title, fontsize=FONT_PT + 1)
        self._set_legend(state["layers"])
        return self.blit(layer_key)
