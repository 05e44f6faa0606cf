"""Figures for the notebooks: small functions that draw on a matplotlib Axes and return it."""

import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from .encodings import resolution_pair, score_curve
from .resolution import resolution


def save_png_atomic(fig, path, dpi: int = 100) -> Path:
    """Write ``fig`` as a PNG at ``path`` through a temporary file in the same folder and
    ``os.replace``, so a reader never sees a half-written file. No version metadata: same bytes on rerun."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".png")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=dpi, metadata={"Software": None})
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


# --- notebook 01: deriving resolution ---------------------------------------------------


def example_profiles(N: int) -> dict:
    """Named score profiles s[n], n = 0..N-1, used to illustrate R(s) (notebook 01, README)."""
    n = np.arange(N, dtype=np.float64)
    return {
        "steep decay, s = −n": -n,
        "gentle decay, s = −n/4": -n / 4,
        "decay then rebound, s = 3cos(2πn/N)": 3 * np.cos(2 * np.pi * n / N),
        "flat, s = 0": np.zeros(N),
    }


def plot_weight_profiles(profiles: dict, ax=None, boundary: str = "zero"):
    """Softmax weights p_n = e^{s[n]} / Σ_j e^{s[j]} of named profiles against distance n, with R(s) in the legend."""
    ax = plt.gca() if ax is None else ax
    for name, s in profiles.items():
        s = np.asarray(s, dtype=np.float64)
        p = np.exp(s - s.max())
        ax.plot(np.arange(len(s)), p / p.sum(), label=f"{name}   R = {float(resolution(s, boundary)):.2g}")
    ax.set(xlabel="distance n", ylabel="attention weight $p_n$ (log scale)", yscale="log", ylim=(1e-5, 30))
    ax.legend(fontsize=8, loc="upper right")
    return ax


def plot_resolution_vs_temperature(shape, temperatures, lengths, ax=None, boundary: str = "zero"):
    """R(s[:N] / τ) against the temperature τ for one score shape s, one curve per length N (log scale;
    the dotted lines are each N's flat-profile floor 1/N², for boundary "zero")."""
    ax = plt.gca() if ax is None else ax
    shape = np.asarray(shape, dtype=np.float64)
    temperatures = np.asarray(temperatures, dtype=np.float64)
    for N in lengths:
        r = resolution(shape[None, :N] / temperatures[:, None], boundary)  # (len(temperatures),)
        line = ax.plot(temperatures, r, label=f"N = {N}")[0]
        if boundary == "zero":
            ax.axhline(1 / N**2, color=line.get_color(), linestyle=":", linewidth=1, label=f"flat profile, 1/N² = {1 / N**2:.1e}")
    ax.set(xscale="log", yscale="log", xlabel="temperature τ (scores divided by τ)", ylabel="R (log scale)")
    ax.legend()
    return ax


def readme_resolution_figure(N: int = 64, n_temperatures: int = 61):
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


# --- notebook 02: design-time curves of the encodings ------------------------------------


def plot_design_curve(name: str, L: int, ax=None, boundary: str = "zero", head_mode: str = "mean-scores", **params):
    """Design-time s[n] of one encoding over distances 0..2L−1 (ALiBi: heads thin, head mean bold),
    the training length L dashed, and the pair (R(L), R(2L)) in the title."""
    ax = plt.gca() if ax is None else ax
    curve = score_curve(name, 2 * L, **params)  # (2L,) or (H, 2L)
    n = np.arange(2 * L)
    if curve.ndim == 2:
        ax.plot(n, curve.T, color="C0", alpha=0.3, linewidth=0.8)
        ax.plot(n, curve.mean(axis=0), color="C0", label="head mean")
    else:
        ax.plot(n, curve, color="C0")
    ax.axvline(L, color="k", linestyle="--", linewidth=1)
    r_L, r_2L = resolution_pair(name, L, head_mode, boundary, **params)
    ax.set(xlabel="distance n", ylabel="s[n]", xlim=(0, 2 * L))
    ax.set_title(f"{name}: R(L) = {r_L:.4f}, R(2L) = {r_2L:.4f}", fontsize="medium")
    return ax


def plot_resolution_pairs(names, r_L, r_2L, ax=None):
    """Grouped bars: R at the training length L and at 2L side by side, one group per encoding."""
    ax = plt.gca() if ax is None else ax
    x = np.arange(len(names))
    ax.bar(x - 0.2, r_L, width=0.4, label="R(L)")
    ax.bar(x + 0.2, r_2L, width=0.4, label="R(2L)")
    ax.set_xticks(x, names, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("R")
    ax.legend(fontsize="small")
    return ax


def encoding_gallery(L: int, names, ncols: int = 4, boundary: str = "zero", head_mode: str = "mean-scores"):
    """One :func:`plot_design_curve` panel per encoding, at its registry defaults."""
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.0 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        plot_design_curve(name, L, ax=ax, boundary=boundary, head_mode=head_mode)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig
