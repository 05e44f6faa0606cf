"""The design-time explorer's figures: one encoding (:class:`SingleFigure`) and several at their defaults
(:class:`CompareFigure`), both blitted: an update redraws only the artists that change."""

from __future__ import annotations

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullLocator

from ..encodings import DESIGN_CURVES
from .design import check_length
from .render import FONT_PT, BlitFigure, min_max_decimate, new_figure, region


def distance_ticks(L: int, marked: bool = True) -> tuple[list[float], list[str]]:
    """x ticks of the design-time panels, drawn in units of L: positions n/L and labels in distances.

    Ticks at n = 0, ⌊L/2⌋, L, L + ⌊L/2⌋, 2L; the labels are the distances themselves, with
    "(L)" and "(2L)" marking the training length and twice it when ``marked`` (the compare
    plot's narrower panels leave the marks to their titles).
    """
    check_length(L)
    n = [0, L // 2, L, L + L // 2, 2 * L]
    labels = [str(v) for v in n]
    if marked:
        labels[2], labels[4] = f"{L} (L)", f"{2 * L} (2L)"
    return [v / L for v in n], labels


def symlog_label(value: float, _pos: int | None = None) -> str:
    """Tick labels of the compare plot's symlog axis: 0, −1, −10, −100, −1000 (a true minus sign)."""
    if value == 0:
        return "0"
    text = f"{abs(value):.0f}" if abs(value) >= 1 else f"{abs(value):g}"
    return ("−" if value < 0 else "") + text


class DistanceLabels:
    """The distance tick labels of one axis drawn in units of L: fixed ticks, and five Text artists
    (animated) that :meth:`set` rewrites for each L. Drawing five texts costs a fraction of an axis
    draw, so a change of L stays a blit. The first label starts just right of the axis' left edge and
    the last ends at its right edge, so the labels stay between the two."""

    def __init__(self, ax, marked: bool = True):
        self.marked = marked
        positions, _ = distance_ticks(2, marked)  # the positions n/L do not depend on L (to rounding)
        ax.set_xticks(positions, [""] * len(positions))
        transform = ax.get_xaxis_transform()  # x in data units, y in axes units
        pad = ax.xaxis.get_tick_padding()  # tick length and label pad, in points
        last = len(positions) - 1
        self.texts = [
            ax.annotate(
                "",
                (x, 0),
                xycoords=transform,
                xytext=(1 if i == 0 else 0, -pad - 1),
                textcoords="offset points",
                va="top",
                ha="left" if i == 0 else "right" if i == last else "center",
                fontsize=FONT_PT,
            )
            for i, x in enumerate(positions)
        ]

    def set(self, L: int) -> None:
        positions, labels = distance_ticks(L, self.marked)
        for text, x, label in zip(self.texts, positions, labels):
            text.set_text(label)
            text.xy = (x, 0)


class SingleFigure(BlitFigure):
    """s[n] (left) and softmax weights (right) of one encoding against n/L, with blitting.

    Distances are drawn in units of L, so everything but the curves, the score axis and the
    distance tick labels (frames, the L mark, the fixed weight axis, titles, legend) is the
    same for every state: it is drawn once into a background. The score axis (its range
    rounded to its ticks) and the distance labels are two cached layers, redrawn only when that
    range or L changes; an update draws the curves over them, a few milliseconds. The PNG is
    900 × 330 pixels, shown at that size.
    """

    WEIGHT_RANGE = (1e-12, 2.0)

    def __init__(self):
        self.fig = new_figure(9.0, 3.3)
        self.ax_s, self.ax_w = self.fig.subplots(
            1, 2, gridspec_kw=dict(left=0.085, right=0.985, bottom=0.16, top=0.9, wspace=0.22)
        )
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
        self.ax_s.yaxis.set_major_locator(MaxNLocator(5))
        self.fig.text(
            0.008, 0.53, "score", rotation=90, va="center", fontsize=FONT_PT + 1
        )  # static, unlike an axis label
        self.ax_w.set_title("softmax weights of the last query (log scale)", fontsize=FONT_PT + 1)
        self.ax_w.set(yscale="log", ylim=self.WEIGHT_RANGE)
        self.ax_w.yaxis.set_major_locator(LogLocator(numticks=7))
        self.ax_w.yaxis.set_minor_locator(NullLocator())
        self.ax_w.legend(loc="upper right", fontsize=FONT_PT)
        self.distances = [DistanceLabels(ax) for ax in (self.ax_s, self.ax_w)]
        self.ax_s.xaxis.labelpad = FONT_PT + 4  # room for the distance labels, drawn as texts
        self.ax_w.xaxis.labelpad = FONT_PT + 4
        self.ax_s.yaxis.get_offset_text().set_horizontalalignment("right")  # "1e8" stays left of the axis, in its layer
        split, top, right = self.ax_s.bbox.x0 + 1, self.fig.bbox.y1, self.fig.bbox.x1
        self.groups = (
            ((self.ax_s.yaxis,), region(0, 0, split, top)),  # the score axis, left of the left panel
            (tuple(t for d in self.distances for t in d.texts), region(split, 0, right, self.ax_s.bbox.y0)),
        )
        self.animated = (self.heads, self.line_s, self.line_L, self.line_2L)
        # the background is drawn by the first render, which sets the title (it names the encoding)

    @staticmethod
    def title_for(state: dict) -> str:
        """The score panel's title: the encoding, and how heads are drawn only where there are several."""
        note = " (ALiBi: heads thin, mean bold)" if state["curve"].ndim == 2 else ""
        return f"design-time score s[n] of {state['name']}{note}"

    def render(self, state: dict) -> bytes:
        title = self.title_for(state)  # the frame: redrawn on a change of encoding, not on each update
        self.set_frame(title, lambda: self.ax_s.set_title(title, fontsize=FONT_PT + 1))
        L, curve, profile = state["L"], state["curve"], state["profile"]
        low, high = float(curve.min()), float(curve.max())
        pad = 0.05 * (high - low) or 1.0
        ticks = self.ax_s.yaxis.get_major_locator().tick_values(low - pad, high + pad)
        ylim = (float(ticks[0]), float(ticks[-1]))  # rounded to the ticks: it changes less often than the curve
        for labels in self.distances:
            labels.set(L)
        self.ax_s.set_ylim(*ylim)
        x = np.arange(2 * L) / L  # (2L,) distance in units of L
        self.line_s.set_data(*min_max_decimate(x, profile))
        self.heads.set_segments(np.stack(min_max_decimate(x, curve), axis=-1) if curve.ndim == 2 else [])  # (H, M, 2)
        self.line_L.set_data(*min_max_decimate(x[:L], state["weights_L"]))
        self.line_2L.set_data(*min_max_decimate(x, state["weights_2L"]))
        return self.blit(ylim, L)


CURVE_STYLES = {name: encoding.style for name, encoding in DESIGN_CURVES.items()}  # each curve's look


class CompareFigure(BlitFigure):
    """Several encodings at their defaults: s[n] − s[0] (symlog), softmax weights over 2L, (R(L), R(2L)) bars.

    Every axis range is fixed (the registry defaults bound s[n] − s[0] to [−1000, 0] for
    L <= 2048; weights and R on fixed log axes), and each encoding owns its lines and bars,
    so an update only toggles, moves and redraws them (a blit, not a full draw); the distance
    labels are a cached layer, redrawn when L changes, and the legend (below the curves) and bar
    labels are redrawn into the background when the selection changes. The PNG is 900 × 370 pixels.
    """

    SCORE_RANGE = (-1000.0, 1.0)
    R_RANGE = (1e-8, 1.0)

    def __init__(self):
        self.fig = new_figure(9.0, 3.7)
        self.ax_s, self.ax_w, self.ax_r = self.fig.subplots(
            1, 3, gridspec_kw=dict(left=0.075, right=0.99, bottom=0.3, top=0.85, wspace=0.33)
        )
        for ax in (self.ax_s, self.ax_w):
            ax.set_xlim(0, 2)
            ax.axvline(1, color="k", linestyle="--", linewidth=1)
            ax.set_xlabel("distance n", fontsize=FONT_PT)
        for ax in self.fig.axes:
            ax.tick_params(labelsize=FONT_PT)
        self.ax_s.set_yscale("symlog", linthresh=1.0, linscale=0.6)
        self.ax_s.set_ylim(*self.SCORE_RANGE)
        self.ax_s.yaxis.set_major_locator(FixedLocator([0, -1, -10, -100, -1000]))
        self.ax_s.yaxis.set_major_formatter(FuncFormatter(symlog_label))
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
            style = CURVE_STYLES[name]
            (self.lines_s[name],) = self.ax_s.plot([], [], label=name, **style)
            (self.lines_w[name],) = self.ax_w.plot(
                [], [], label=name, **{k: v for k, v in style.items() if not k.startswith("marker")}
            )
        bottom = self.R_RANGE[0]
        self.bars_L = self.ax_r.bar(
            np.arange(len(DESIGN_CURVES)) - 0.2, 1.0, width=0.4, bottom=bottom, color="C0", label="R(L)"
        )
        self.bars_2L = self.ax_r.bar(
            np.arange(len(DESIGN_CURVES)) + 0.2, 1.0, width=0.4, bottom=bottom, color="C1", label="R(2L)"
        )
        self.ax_r.legend(
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncol=2,
            fontsize=FONT_PT + 1,
            frameon=False,
            title="the pair, not one number",
            title_fontsize=FONT_PT + 1,
            borderaxespad=0.2,
        )
        self.legend = None
        self.distances = [DistanceLabels(ax, marked=False) for ax in (self.ax_s, self.ax_w)]
        for ax in (self.ax_s, self.ax_w):
            ax.xaxis.labelpad = FONT_PT + 4
        self.groups = ((tuple(t for d in self.distances for t in d.texts), self.fig.bbox),)
        self.animated = (*self.lines_s.values(), *self.lines_w.values(), *self.bars_L.patches, *self.bars_2L.patches)
        # the background is drawn by the first render, which sets the selection (legend and bar labels)

    def _select(self, names: tuple) -> None:
        """Show the chosen encodings' artists, in order, with the legend and bar labels for them (drawn into
        the background by :meth:`set_frame`, on a change of selection only)."""
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
        self.ax_r.set_xticks(
            range(len(names)), names, rotation=40, ha="right", rotation_mode="anchor", fontsize=FONT_PT
        )
        if self.legend is not None:
            self.legend.remove()
        self.legend = self.fig.legend(
            handles=[self.lines_s[n] for n in names],
            loc="lower left",
            bbox_to_anchor=(0.005, 0.0),
            fontsize=FONT_PT,
            ncol=4,
            handlelength=3.0,
            frameon=False,
            columnspacing=1.2,
        )

    def render(self, states: list[dict]) -> bytes:
        names = tuple(s["name"] for s in states)
        if len(set(names)) != len(names):
            raise ValueError(f"each encoding may be compared once, got {list(names)}")
        self.set_frame(names, lambda: self._select(names))
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
        return self.blit(L)
