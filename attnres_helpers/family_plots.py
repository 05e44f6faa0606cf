"""Notebook 05's figures: predictors against outcomes, one point per configuration of the family.

Spearman's ρ sees only ranks, so its picture is ranks against ranks (:func:`rank_rank_figure`, labels
placed so none overlaps, the legend where it covers the fewest points), and :func:`copy_curve_figure` the
copy probe's gain against the gap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text

from .encoding_registry import ENCODINGS
from .plots import DISPLAY_WIDTH, MIN_FONT

if TYPE_CHECKING:
    from .analysis import Point

FAMILY_COLOURS = {name: e.colour for name, e in ENCODINGS.items()}  # in the legends' order


def short_label(point: Point) -> str:
    """A configuration's name shortened for a crowded plot: 'rope 100', 'xpos γ0.1', 'alibi ×0.25 +B'."""
    name = (
        point.setting.replace("rope base ", "rope ")
        .replace("alibi slopes x", "alibi ×")
        .replace("xpos B 64, gamma ", "xpos γ")
        .replace("xpos B ", "xpos B")
        .replace("sinusoidal", "sin")
        .replace("kerple log", "kerple")
        .replace("t5 bias", "t5")
    )
    return name + (" +B" if point.bca else "")


def place_labels(
    ax: Axes, xy: list[tuple[float, float]], labels: list[str], colours: list[str], fontsize: float = MIN_FONT
) -> list[Text]:
    """Annotate each point of ``xy`` (data coordinates) with its label, trying offsets around it in
    turn and keeping the first whose text box overlaps no label placed before and no point; where
    none is free, the offset with the least overlap. Returns the Text objects."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    points = ax.transData.transform(np.asarray(xy, dtype=float))  # (n, 2) display pixels
    r = fontsize * fig.dpi / 72 * 0.5  # a marker's half-size, in pixels
    taken = [(x - r, y - r, x + r, y + r) for x, y in points]
    offsets = [(4, 3), (4, -12), (-4, 3), (-4, -12), (4, 10), (4, -20), (-4, 10), (-4, -20), (0, 16), (0, -26)]

    def overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
        return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))

    texts = []
    for (x, y), label, colour in zip(xy, labels, colours):
        best = None
        for dx, dy in offsets:
            text = ax.annotate(
                label,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=fontsize,
                color=colour,
                ha="left" if dx >= 0 else "right",
            )
            box = text.get_window_extent(renderer)
            box = (box.x0, box.y0, box.x1, box.y1)
            cost = sum(overlap(box, other) for other in taken)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, text, box)
            else:
                text.remove()
            if cost == 0:
                break
        taken.append(best[2])
        texts.append(best[1])
    return texts


def _family_legend(ax: Axes, points: list[Point]) -> None:
    """Colour by family, hollow for BCA; matplotlib places it where it covers the fewest plotted points."""
    from matplotlib.lines import Line2D

    families = [f for f in FAMILY_COLOURS if any(p.family == f for p in points)]
    handles = [Line2D([], [], marker="o", linestyle="", color=FAMILY_COLOURS[f], label=f) for f in families]
    handles.append(Line2D([], [], marker="o", linestyle="", color="gray", mfc="white", label="with BCA (+B)"))
    ax.legend(handles=handles, loc="best", fontsize=MIN_FONT, framealpha=0.9)


def rank_rank_figure(points: list[Point], predictor: str, outcome: str, title: str = "") -> Figure:
    """Rank of ``outcome`` against rank of ``predictor`` (1 = smallest, ties averaged), one labelled
    point per configuration (analysis.Point): the picture of Spearman's ρ, which only sees ranks, so
    no outlier squeezes the rest. Colour: family; hollow: evaluated with BCA."""
    from .analysis import column
    from .stats import average_ranks, spearman

    x, y = column(points, predictor), column(points, outcome)
    rx, ry = average_ranks(x), average_ranks(y)
    fig, ax = plt.subplots(figsize=(DISPLAY_WIDTH, 7.0))
    colours = [FAMILY_COLOURS.get(p.family, "C7") for p in points]
    for p, a, b, c in zip(points, rx, ry, colours):
        ax.plot(a, b, "o", ms=6, color=c, mfc="white" if p.bca else c)
    n = len(points)
    ax.set(
        xlim=(0, n + 4),
        ylim=(0, n + 2),
        xlabel=f"rank of {predictor} (1 = lowest)",
        ylabel=f"rank of {outcome} (1 = smallest rise)",
    )
    fig.canvas.draw()
    place_labels(ax, list(zip(rx, ry)), [short_label(p) for p in points], colours)
    _family_legend(ax, points)
    ax.set_title(title or f"Spearman ρ = {spearman(x, y):+.2f} over n = {n} configurations", fontsize=10)
    fig.tight_layout()
    return fig


def copy_curve_figure(curves: dict, points_meta: dict, train_len: int, bca: bool = False) -> Figure:
    """The copy probe's gain against the gap g (the two copies S + g apart), one line per setting (seed
    mean over the runs in ``curves``), coloured by family; L and 2L marked on the distance axis.
    ``curves``: (run, bca) -> probe.CopyCurve; ``points_meta``: run -> (setting, family)."""
    by_setting: dict[str, list] = {}
    for (run, flag), curve in curves.items():
        if flag == bca and run in points_meta:
            by_setting.setdefault(points_meta[run], []).append(curve)
    fig, ax = plt.subplots(figsize=(DISPLAY_WIDTH, 4.2))
    for (_setting, family), group in sorted(by_setting.items()):
        gaps = np.array(group[0].gaps)
        gain = np.mean([c.gains().mean(1).numpy() for c in group], axis=0)
        ax.plot(gaps, gain, marker=".", lw=1, color=FAMILY_COLOURS.get(family, "C7"), alpha=0.8)
    for multiple, label in ((1, "L"), (2, "2L")):
        ax.axvline(multiple * train_len, color="0.5", ls=":", lw=1)
        ax.text(
            multiple * train_len,
            0.98,
            f" g = {label}",
            transform=ax.get_xaxis_transform(),
            va="top",
            fontsize=MIN_FONT,
            color="0.3",
        )
    ax.axhline(0, color="0.5", lw=0.7)
    families = sorted({f for _, f in by_setting})
    from matplotlib.lines import Line2D

    ax.legend(
        handles=[Line2D([], [], color=FAMILY_COLOURS.get(f, "C7"), label=f) for f in families],
        fontsize=MIN_FONT,
        loc="upper right",
    )
    ax.set(
        xlabel="gap g between the copies (tokens); the window is [span][gap][span], T = 2·32 + g",
        ylabel="copy gain (nats a byte)",
        title=("with BCA" if bca else "causal mask") + ": what the first copy is worth, one line per setting",
    )
    ax.title.set_fontsize(10)
    fig.tight_layout()
    return fig
