"""Figures for the notebooks: small functions that draw on a matplotlib Axes and return it.

R of a measured ŝ is never computed here: it is the store's query
(:meth:`attnres_helpers.store.Profile.layer_resolutions`, through :func:`attnres_helpers.tables.scores_profile`
for bare arrays), and heads are averaged as R averages them (:func:`attnres_helpers.metric.mean_over_heads`).
R of an illustrative profile (notebook 01) or of a design-time curve is computed from that profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .encodings import resolution_pair, score_curve
from .files import atomic_write
from .metric import Boundary, HeadMode, mean_over_heads, resolution

if TYPE_CHECKING:
    from .store import Profile


# Figures of the notebooks are drawn for JupyterLab's display width (about 950 px): at most
# DISPLAY_WIDTH inches wide at dpi 100, so they are shown at their own size, with no text below
# MIN_FONT points.
DISPLAY_WIDTH = 9.5  # inches
MIN_FONT = 9  # points


# Everything savefig reads from rcParams, fixed, so that a figure's PNG does not depend on the session's
# settings (a notebook backend, a matplotlibrc): with the same figure, the same bytes.
SAVE_RC = {
    "savefig.bbox": "standard",
    "savefig.pad_inches": 0.1,
    "savefig.transparent": False,
    "savefig.orientation": "portrait",
}


def save_png_atomic(fig: Figure, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` as a PNG at ``path`` atomically (:func:`attnres_helpers.files.atomic_write`),
    so a reader never sees a half-written file, and deterministically: no PNG text chunks (no
    "Software" version tag, no date), a white background, and every savefig setting fixed
    (:data:`SAVE_RC`), so the same figure gives the same bytes on every run and in every session, and
    a tracked figure that a notebook rewrites leaves ``git status`` clean."""
    path = Path(path)

    def write(tmp: Path) -> None:
        with matplotlib.rc_context(SAVE_RC):
            fig.savefig(tmp, format="png", dpi=dpi, facecolor="white", edgecolor="white", metadata={"Software": None})

    atomic_write(path, write)
    return path


# --- example score profiles, and R against temperature ----------------------------------


def example_profiles(N: int) -> dict[str, np.ndarray]:
    """Named score profiles s[n], n = 0..N-1, used to illustrate R(s) (notebook 01, README)."""
    n = np.arange(N, dtype=np.float64)
    return {
        "steep decay, s = −n": -n,
        "gentle decay, s = −n/4": -n / 4,
        "decay then rebound, s = 3cos(2πn/N)": 3 * np.cos(2 * np.pi * n / N),
        "flat, s = 0": np.zeros(N),
    }


def plot_weight_profiles(profiles: dict[str, np.ndarray], ax: Axes | None = None, boundary: Boundary = "zero") -> Axes:
    """Softmax weights p_n = e^{s[n]} / Σ_j e^{s[j]} of named profiles against distance n, with R(s) in the legend."""
    ax = plt.gca() if ax is None else ax
    for name, s in profiles.items():
        s = np.asarray(s, dtype=np.float64)
        p = np.exp(s - s.max())
        ax.plot(np.arange(len(s)), p / p.sum(), label=f"{name}   R = {float(resolution(s, boundary)):.2g}")
    ax.set(xlabel="distance n", ylabel="attention weight $p_n$ (log scale)", yscale="log", ylim=(1e-5, 30))
    ax.legend(fontsize=8, loc="upper right")
    return ax


def plot_resolution_vs_temperature(
    shape: np.ndarray,
    temperatures: np.ndarray,
    lengths: tuple[int, ...],
    ax: Axes | None = None,
    boundary: Boundary = "zero",
) -> Axes:
    """R(s[:N] / τ) against the temperature τ for one score shape s, one curve per length N (log scale;
    the dotted lines are each N's flat-profile floor 1/N², for boundary "zero")."""
    ax = plt.gca() if ax is None else ax
    shape = np.asarray(shape, dtype=np.float64)
    temperatures = np.asarray(temperatures, dtype=np.float64)
    for N in lengths:
        r = resolution(shape[None, :N] / temperatures[:, None], boundary)  # (len(temperatures),)
        line = ax.plot(temperatures, r, label=f"N = {N}")[0]
        if boundary == "zero":
            ax.axhline(
                1 / N**2,
                color=line.get_color(),
                linestyle=":",
                linewidth=1,
                label=f"flat profile, 1/N² = {1 / N**2:.1e}",
            )
    ax.set(xscale="log", yscale="log", xlabel="temperature τ (scores divided by τ)", ylabel="R (log scale)")
    ax.legend()
    return ax


def readme_resolution_figure(N: int = 64, n_temperatures: int = 61) -> Figure:
    """README figure: (left) weights and R of :func:`example_profiles`; (right) R of s[n] = −log(1+n)
    divided by a temperature τ, at N and 2N distances."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    plot_weight_profiles(example_profiles(N), ax=left)
    left.set_title(f"Same N = {N}, different shapes")
    temperatures = np.geomspace(0.1, 10, n_temperatures)
    plot_resolution_vs_temperature(-np.log1p(np.arange(2 * N)), temperatures, (N, 2 * N), ax=right)
    right.set_title("Same shape s = −log(1+n), different scale and length")
    fig.tight_layout()
    return fig


# --- design-time curves of the encodings ------------------------------------------------


def plot_design_curve(
    name: str,
    L: int,
    ax: Axes | None = None,
    boundary: Boundary = "zero",
    head_mode: HeadMode = "mean-scores",
    **params: float,
) -> Axes:
    """Design-time s[n] of one encoding over distances 0..2L−1 (ALiBi: heads thin, head mean bold),
    the training length L dashed, and the pair (R(L), R(2L)) in the title."""
    ax = plt.gca() if ax is None else ax
    r_L, r_2L = resolution_pair(name, L, head_mode, boundary, **params)  # checks L (as given) first
    curve = score_curve(name, 2 * L, **params)  # (2L,) or (H, 2L)
    n = np.arange(2 * L)
    if curve.ndim == 2:
        ax.plot(n, curve.T, color="C0", alpha=0.3, linewidth=0.8)
        ax.plot(n, curve.mean(axis=0), color="C0", label="head mean")
    else:
        ax.plot(n, curve, color="C0")
    ax.axvline(L, color="k", linestyle="--", linewidth=1)
    ax.set(xlabel="distance n", ylabel="s[n]", xlim=(0, 2 * L))
    ax.set_title(f"{name}: R(L) = {r_L:.4f}, R(2L) = {r_2L:.4f}", fontsize="medium")
    return ax


def plot_resolution_pairs(names: list[str], r_L: list[float], r_2L: list[float], ax: Axes | None = None) -> Axes:
    """Grouped bars: R at the training length L and at 2L side by side, one group per encoding."""
    ax = plt.gca() if ax is None else ax
    x = np.arange(len(names))
    ax.bar(x - 0.2, r_L, width=0.4, label="R(L)")
    ax.bar(x + 0.2, r_2L, width=0.4, label="R(2L)")
    ax.set_xticks(x, names, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("R")
    ax.legend(fontsize="small")
    return ax


def encoding_gallery(
    L: int, names: list[str], ncols: int = 4, boundary: Boundary = "zero", head_mode: HeadMode = "mean-scores"
) -> Figure:
    """One :func:`plot_design_curve` panel per encoding, at its registry defaults."""
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.0 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        plot_design_curve(name, L, ax=ax, boundary=boundary, head_mode=head_mode)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


# --- trained models: measured profiles, per-layer R, perplexity -----------------------------

LINE_STYLES = ("-", "--", ":", "-.")


def _heads_averaged(s_hat: np.ndarray | torch.Tensor) -> np.ndarray:
    """ŝ (layers, H, T) averaged over heads as mean-scores R averages them (a distance masked in
    some heads is averaged over the others; -inf where masked in every head): (layers, T) float64."""
    s = s_hat.double() if isinstance(s_hat, torch.Tensor) else torch.as_tensor(np.asarray(s_hat, dtype=np.float64))
    return mean_over_heads(s).numpy()


def plot_measured_profiles(
    profiles: dict[str, np.ndarray | torch.Tensor], train_len: int, ax: Axes | None = None, title: str = ""
) -> Axes:
    """Measured ŝ[n] of one model, heads averaged, against distance n: one colour per layer and one
    line style per entry of ``profiles = {label: s_hat (layers, H, T)}`` (e.g. T = L and T = 2L),
    with the training length L marked. Masked distances (ŝ = -inf, under BCA) leave a gap."""
    ax = plt.gca() if ax is None else ax
    if not 1 <= len(profiles) <= len(LINE_STYLES):
        raise ValueError(f"profiles must hold 1 to {len(LINE_STYLES)} entries, got {len(profiles)}")
    for style, (label, s_hat) in zip(LINE_STYLES, profiles.items()):
        per_layer = _heads_averaged(s_hat)  # (layers, T)
        per_layer = np.where(np.isfinite(per_layer), per_layer, np.nan)
        for layer, s in enumerate(per_layer):
            ax.plot(
                np.arange(len(s)),
                s,
                color=f"C{layer}",
                linestyle=style,
                linewidth=1,
                label=f"layer {layer}" if style == LINE_STYLES[0] else None,
            )
        ax.plot([], [], color="gray", linestyle=style, label=label)
    ax.axvline(train_len, color="k", alpha=0.4, linewidth=3, label="training length L")
    ax.set(xlabel="distance n", ylabel=r"$\hat{s}[n]$ (heads averaged)", title=title)
    ax.legend(fontsize="x-small")
    return ax


def measured_profile_gallery(
    profiles: dict[str, dict[str, np.ndarray | torch.Tensor]], train_len: int, ncols: int = 3
) -> Figure:
    """One :func:`plot_measured_profiles` panel per model: ``profiles = {name: {label: s_hat}}``."""
    nrows = -(-len(profiles) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    for ax, (name, by_label) in zip(axes.flat, profiles.items()):
        plot_measured_profiles(by_label, train_len, ax=ax, title=name)
    for ax in axes.flat[len(profiles) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def plot_stat_bars(
    rows: list[dict],
    columns: list[str] | tuple[str, ...],
    category: str = "encoding",
    ax: Axes | None = None,
    ylabel: str = "R",
    errors: str = "spread",
) -> Axes:
    """Grouped bars from table rows (attnres_helpers.tables): one group per row, named by
    ``row[category]``, one bar per column at the seed mean, an error bar and each seed as a dot.
    A missing value (None) is marked "n/a".

    ``errors="spread"``: ± the seed spread (sample standard deviation). ``errors="range"``: from
    the smallest to the largest seed value, which stays positive and so suits a log axis (a
    spread larger than the mean would reach below zero)."""
    if errors not in ("spread", "range"):
        raise ValueError(f"errors must be 'spread' or 'range', got {errors!r}")
    ax = plt.gca() if ax is None else ax
    x = np.arange(len(rows))
    width = 0.8 / len(columns)
    for j, column in enumerate(columns):
        centres = x + (j - (len(columns) - 1) / 2) * width
        stats = [row.get(column) for row in rows]
        present = [i for i, stat in enumerate(stats) if stat is not None]
        means = np.array([stats[i].mean for i in present])
        if errors == "range":
            yerr = np.array(
                [
                    [stats[i].mean - min(stats[i].values) for i in present],
                    [max(stats[i].values) - stats[i].mean for i in present],
                ]
            ).reshape(2, -1)
        else:
            yerr = [stats[i].spread or 0.0 for i in present]
        ax.bar(centres[present], means, width=width, color=f"C{j}", label=column, yerr=yerr, capsize=2)
        for i in present:
            ax.scatter(np.full(len(stats[i].values), centres[i]), stats[i].values, color="k", s=6, zorder=3)
        for i in sorted(set(range(len(rows))) - set(present)):
            ax.text(centres[i], 0, "n/a", ha="center", va="bottom", fontsize=MIN_FONT, rotation=90)
    ax.set_xticks(x, [str(row[category]) for row in rows])
    ax.axhline(0, color="k", linewidth=0.5)
    ax.set(xlabel=category, ylabel=ylabel)
    ax.legend(fontsize=MIN_FONT)
    return ax


def layer_resolution_figure(
    records: list[dict],
    encodings: list[str],
    head_mode: HeadMode = "mean-scores",
    columns: tuple[str, ...] = ("R(L)", "R(2L)"),
    reference: str | None = "alibi",
    ncols: int = 3,
    reference_column: str | None = None,
    width: float = DISPLAY_WIDTH,
    row_height: float = 2.9,
) -> Figure:
    """Per-layer R of each encoding, one panel each, on a log axis (bars at the seed mean, error
    bars from the smallest to the largest seed, a dot per seed), so that ALiBi's 0.003 and RoPE's
    0.2 are both readable; the axis starts a factor of 3 below the smallest seed value.
    With ``reference``, that encoding's per-layer R at ``reference_column`` (default: the last
    column) is drawn in every other panel as a dotted step line: the level each layer has to stay
    above. The legend goes into the first free panel, or into the first panel if none is free.
    ``width`` in inches (default: JupyterLab's display width at dpi 100); text is >= MIN_FONT pt."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from .tables import layer_table

    reference_column = columns[-1] if reference_column is None else reference_column
    nrows = -(-len(encodings) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, row_height * nrows), squeeze=False, sharey=True)
    ref_rows = layer_table(records, reference, head_mode) if reference in encodings else None
    smallest = np.inf
    for ax, encoding in zip(axes.flat, encodings):
        rows = layer_table(records, encoding, head_mode)
        plot_stat_bars(rows, columns, category="layer", ax=ax, errors="range")
        smallest = min([smallest] + [v for row in rows for c in columns if row.get(c) for v in row[c].values if v > 0])
        ax.set_yscale("log")
        if ref_rows is not None and encoding != reference:
            level = [row[reference_column].mean for row in ref_rows]
            ax.step(
                np.arange(len(level) + 1) - 0.5,
                level + level[-1:],
                where="post",
                color="k",
                linestyle=":",
                linewidth=1.5,
            )
        ax.set_title(encoding, fontsize=10)
        ax.set_xlabel("layer", fontsize=MIN_FONT + 0.5)
        ax.set_ylabel(f"R ({head_mode}, log)" if ax in axes[:, 0] else "", fontsize=MIN_FONT + 0.5)
        ax.tick_params(labelsize=MIN_FONT)
        ax.get_legend().remove()
    if np.isfinite(smallest):
        axes.flat[0].set_ylim(bottom=smallest / 3)
    handles = [Patch(color=f"C{j}", label=c) for j, c in enumerate(columns)]
    handles.append(Line2D([], [], marker="o", linestyle="", color="k", markersize=3, label="one seed"))
    handles.append(Line2D([], [], color="k", linewidth=1, label="min–max over seeds"))
    if ref_rows is not None:
        handles.append(Line2D([], [], color="k", linestyle=":", linewidth=1.5, label=f"{reference} {reference_column}"))
    free = axes.flat[len(encodings) :]
    for ax in free:
        ax.set_visible(False)
    if len(free):
        fig.tight_layout()
        box = free[0].get_position()
        fig.legend(
            handles=handles,
            loc="center",
            bbox_to_anchor=(box.x0 + box.width / 2, box.y0 + box.height / 2),
            fontsize=10,
            frameon=False,
        )
    else:
        axes.flat[0].legend(handles=handles, fontsize=MIN_FONT, loc="lower left")
        fig.tight_layout()
    return fig


def _scores_of(s_hat: Profile | np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    from .store import Profile

    return s_hat.s_hat if isinstance(s_hat, Profile) else s_hat


def _per_layer_R(s_hat: Profile | np.ndarray | torch.Tensor, train_len: int, boundary: Boundary) -> list[float]:
    """Per-layer mean-scores R of a profile (a stored Profile, or bare ŝ wrapped into one): the store's query."""
    from .store import Profile
    from .tables import scores_profile

    profile = s_hat if isinstance(s_hat, Profile) else scores_profile(s_hat, train_len)
    return profile.layer_resolutions("mean-scores", boundary).tolist()


def _layer_softmax(s_hat: Profile | np.ndarray | torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Heads-averaged ŝ (layers, T) with masked distances as NaN, and p = softmax over distances."""
    per_layer = _heads_averaged(_scores_of(s_hat))  # (layers, T)
    finite = np.isfinite(per_layer)
    masked = np.where(finite, per_layer, -np.inf)
    p = np.exp(masked - masked.max(-1, keepdims=True))
    return np.where(finite, per_layer, np.nan), p / p.sum(-1, keepdims=True)


def plot_layer_softmax(
    s_hat: Profile | np.ndarray | torch.Tensor,
    train_len: int,
    ax: Axes | None = None,
    title: str = "",
    boundary: Boundary = "zero",
) -> Axes:
    """The softmax weights p_n = softmax(ŝ)[n] of each layer (heads averaged), on a log axis, with
    each layer's R in the legend and L marked: what R sees. Masked distances (p_n = 0) leave a gap.
    ``s_hat`` is a stored Profile or its ŝ (layers, H, T); R is the store's query (mean-scores)."""
    ax = plt.gca() if ax is None else ax
    _, p = _layer_softmax(s_hat)
    for layer, (w, r) in enumerate(zip(p, _per_layer_R(s_hat, train_len, boundary))):
        ax.plot(
            np.arange(len(w)),
            np.where(w > 0, w, np.nan),
            color=f"C{layer}",
            linewidth=1,
            label=f"layer {layer}: R = {r:.3g}",
        )
    ax.axvline(train_len, color="k", alpha=0.4, linewidth=3)
    ax.set(xlabel="distance n", ylabel=r"$p_n$ = softmax($\hat{s}$) (log)", yscale="log", title=title)
    ax.legend(fontsize=MIN_FONT, ncol=2 if len(p) > 4 else 1, columnspacing=1.0, handlelength=1.5)
    return ax


def plot_layer_weights(
    s_hat: Profile | np.ndarray | torch.Tensor,
    train_len: int,
    axes: np.ndarray | list[Axes] | None = None,
    title: str = "",
    boundary: Boundary = "zero",
) -> np.ndarray | list[Axes]:
    """What R sees in one model at one eval length: left, ŝ[n] per layer (heads averaged); right,
    :func:`plot_layer_softmax`. ``s_hat`` is a stored Profile or its ŝ (layers, H, T)."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(DISPLAY_WIDTH, 3.2))
    ax_s, ax_p = axes
    scores, _ = _layer_softmax(s_hat)
    for layer, s in enumerate(scores):
        ax_s.plot(np.arange(len(s)), s, color=f"C{layer}", linewidth=1, label=f"layer {layer}")
    ax_s.axvline(train_len, color="k", alpha=0.4, linewidth=3)
    ax_s.set(xlabel="distance n", ylabel=r"$\hat{s}[n]$ (heads averaged)", title=title)
    plot_layer_softmax(s_hat, train_len, ax_p, f"{title}: what R sees", boundary)
    for ax in axes:
        ax.title.set_fontsize(10)
        ax.xaxis.label.set_fontsize(MIN_FONT + 0.5)
        ax.yaxis.label.set_fontsize(MIN_FONT + 0.5)
        ax.tick_params(labelsize=MIN_FONT)
    return axes


def layer_weights_figure(
    s_hats: dict[str, Profile | np.ndarray | torch.Tensor],
    train_len: int,
    boundary: Boundary = "zero",
    width: float = DISPLAY_WIDTH,
    row_height: float = 2.9,
) -> Figure:
    """One row of :func:`plot_layer_weights` per model: ``s_hats = {title: s_hat (layers, H, T)}``.
    ``width`` in inches (default: JupyterLab's display width at dpi 100)."""
    fig, axes = plt.subplots(len(s_hats), 2, figsize=(width, row_height * len(s_hats)), squeeze=False)
    for row, (title, s_hat) in zip(axes, s_hats.items()):
        plot_layer_weights(s_hat, train_len, row, title=title, boundary=boundary)
    fig.tight_layout()
    return fig


def plot_training_losses(losses: dict[str, list], ax: Axes | None = None, smooth: int = 50) -> Axes:
    """Training loss curves, ``losses = {label: [per-step losses of each seed, ...]}``: one colour
    per label, one line per seed, each a running mean over ``smooth`` steps centred on its step."""
    ax = plt.gca() if ax is None else ax
    if smooth < 1:
        raise ValueError(f"smooth must be >= 1, got {smooth}")
    for i, (label, runs) in enumerate(losses.items()):
        for j, run in enumerate(runs):
            run = np.asarray(run, dtype=np.float64)
            averaged = np.convolve(run, np.ones(smooth) / smooth, mode="valid")  # (steps − smooth + 1,)
            ax.plot(
                np.arange(len(averaged)) + (smooth - 1) / 2,
                averaged,
                color=f"C{i}",
                linewidth=1,
                label=label if j == 0 else None,
            )
    ax.set_xlabel("step", fontsize=MIN_FONT + 0.5)
    ax.set_ylabel("training loss (nats/byte)", fontsize=MIN_FONT + 0.5)
    ax.tick_params(labelsize=MIN_FONT)
    ax.legend(fontsize=MIN_FONT)
    return ax


def plot_position_perplexity(
    nll: dict[str, np.ndarray | torch.Tensor], train_len: int, ax: Axes | None = None, smooth: int = 1
) -> Axes:
    """Perplexity at each position of the window, exp of the mean next-token NLL averaged over
    ``smooth`` neighbouring positions, one line per entry of ``nll = {label: (T,)}``; L marked."""
    ax = plt.gca() if ax is None else ax
    if smooth < 1:
        raise ValueError(f"smooth must be >= 1, got {smooth}")
    for label, values in nll.items():
        values = np.asarray(values, dtype=np.float64)
        averaged = np.convolve(values, np.ones(smooth) / smooth, mode="valid")  # (T − smooth + 1,)
        ax.plot(np.arange(len(averaged)) + (smooth - 1) / 2, np.exp(averaged), label=label, linewidth=1)
    from matplotlib.ticker import FuncFormatter

    ax.axvline(train_len, color="k", alpha=0.4, linewidth=3, label="training length L")
    ax.set(xlabel="position in the window", ylabel="perplexity (log scale)", yscale="log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 40, not 4×10¹
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(labelsize=MIN_FONT)
    ax.legend(fontsize=MIN_FONT, ncol=2)
    return ax


def plot_mask(
    mask: np.ndarray | torch.Tensor, ax: Axes | None = None, title: str = "", block: int | None = None
) -> Axes:
    """A (T, T) attention mask laid out [query, key], allowed pairs dark; block edges drawn when given."""
    ax = plt.gca() if ax is None else ax
    mask = np.asarray(mask, dtype=np.float64)
    ax.imshow(mask, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    for edge in range(block or len(mask), len(mask), block or len(mask)):
        ax.axhline(edge - 0.5, color="C3", linewidth=0.8)
        ax.axvline(edge - 0.5, color="C3", linewidth=0.8)
    ax.set(xlabel="key j", ylabel="query i", title=title)
    for axis in (ax.xaxis, ax.yaxis):  # positions are integers: no tick at 2.5, 7.5, ...
        axis.set_major_locator(MaxNLocator(integer=True))
    return ax


PAIR_FIGURE_COLUMNS = ("R(L)", "R(2L)", "R(2L)+BCA", "R(4L)")


def pair_figure(records: list[dict], width: float = DISPLAY_WIDTH, row_height: float = 2.8) -> Figure:
    """The pair table of notebook 03 as one figure: a panel per (layers, head convention), "mean" (the
    paper's form) and "upper" (above the first) against mean-scores and mean-R; grouped bars of R(L), R(2L),
    R(2L) with BCA and R(4L) at the seed mean, error bars from the smallest to the largest seed and a dot per
    seed, on a log axis; the paper's R(L) and R(2L) (Table 3, typed in, layer means) as black marks in the
    layer-mean panels."""
    from matplotlib.lines import Line2D

    from .metric import HEAD_MODES
    from .tables import pair_table

    fig, axes = plt.subplots(2, 2, figsize=(width, 2 * row_height), sharey=True, squeeze=False)
    width_bar = 0.8 / len(PAIR_FIGURE_COLUMNS)
    for r, layer in enumerate(("mean", "upper")):
        for c, head_mode in enumerate(HEAD_MODES):
            ax, rows = axes[r, c], pair_table(records, head_mode, layer)
            plot_stat_bars(rows, PAIR_FIGURE_COLUMNS, category="encoding", ax=ax, errors="range")
            ax.set_yscale("log")
            if layer == "mean":
                for j, column in ((0, "paper R(L)"), (1, "paper R(2L)")):
                    x = np.arange(len(rows)) + (j - (len(PAIR_FIGURE_COLUMNS) - 1) / 2) * width_bar
                    paper = [(xi, row.get(column)) for xi, row in zip(x, rows) if row.get(column) is not None]
                    if paper:
                        ax.scatter(*zip(*paper), marker="_", s=120, color="k", zorder=4, linewidths=2)
            ax.set_title(f"layers {layer!r}, {head_mode}", fontsize=10)
            ax.set_xlabel("")
            ax.tick_params(labelsize=MIN_FONT)
            ax.get_legend().remove()
    handles, labels = axes[0, 0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="k", linewidth=1))
    labels.append("min–max over seeds")
    handles.append(Line2D([], [], marker="_", linestyle="", color="k", markersize=12, markeredgewidth=2))
    labels.append("paper (Table 3, typed in; layer means)")
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=MIN_FONT, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
