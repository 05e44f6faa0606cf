"""Notebook 07's queries and figures over the real model's store (``data/results/pretrained.safetensors``).

Every number is a query over stored profiles (head-averaged ŝ, key-0 scores and per-position NLL of
SmolLM2-135M at several lengths, :mod:`attnres_helpers.hf.pretrained`): R per layer with and without
the first-token sink (:meth:`store.Profile.layer_resolutions`), the softmax weight R sees at the farthest
distance (:func:`tables.last_distance_weights`), and the NLL before and past L in the same windows.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from .metric import Boundary, mean_over_heads
from .store import Profile
from .tables import last_distance_weights


def by_length(profiles: list[Profile]) -> dict[tuple[int, bool], Profile]:
    """The profiles by (eval length, BCA)."""
    return {(p.eval_len, p.bca): p for p in profiles}


def length_rows(profiles: list[Profile], boundary: Boundary = "zero") -> list[dict]:
    """One row per (length, mask): the layer-mean R with and without the sink, the share of R the sink
    carries, the largest weight at n = T − 1 over layers, and the same-window NLL before and past L."""
    rows = []
    for (T, bca), p in sorted(by_length(profiles).items()):
        L = p.meta["train_len"]
        with_sink, free = p.layer_resolutions(boundary=boundary), p.layer_resolutions(boundary=boundary, sink=False)
        rows.append(
            {
                "T": T,
                "mask": "BCA" if bca else "causal",
                "windows": p.meta["windows"][str(T)],
                "R": float(with_sink.mean()),
                "R sink-free": float(free.mean()),
                "sink share": 1 - float(free.mean()) / float(with_sink.mean()),
                "max p(T−1)": float(last_distance_weights(p).max()),
                "NLL < L": float(p.nll[:L].mean()),
                "NLL ≥ L": float(p.nll[L:].mean()) if T > L else None,
            }
        )
    return rows


def layer_rows(profiles: list[Profile], lengths: list[int], sink: bool = True) -> list[dict]:
    """One row per layer: R at each causal length (with or without the sink), and R(2L)/R(L)."""
    of = by_length(profiles)
    L = profiles[0].meta["train_len"]
    per = {T: of[(T, False)].layer_resolutions(sink=sink) for T in lengths}
    rows = []
    for layer in range(len(per[lengths[0]])):
        row = {"layer": layer, **{f"R({T})": float(per[T][layer]) for T in lengths}}
        if L in per and 2 * L in per:
            row["R(2L)/R(L)"] = float(per[2 * L][layer] / per[L][layer])
        rows.append(row)
    return rows


def resolution_length_figure(profiles: list[Profile], lengths: list[int], layers: list[int]) -> Figure:
    """R against T, with the sink (left) and without it (right): the layer mean bold, each layer in
    ``layers`` as a thin line, every other layer light grey; L marked."""
    of = by_length(profiles)
    L = profiles[0].meta["train_len"]
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.8), sharey=True)
    colours = plt.get_cmap("tab10")
    for ax, sink in zip(axes, (True, False)):
        per = torch.stack([of[(T, False)].layer_resolutions(sink=sink) for T in lengths])  # (lengths, layers)
        for layer in range(per.shape[1]):
            if layer not in layers:
                ax.plot(lengths, per[:, layer], color="0.85", lw=0.8, zorder=1)
        for i, layer in enumerate(layers):
            ax.plot(lengths, per[:, layer], color=colours(i), lw=1.2, marker=".", label=f"layer {layer}", zorder=2)
        ax.plot(lengths, per.mean(1), color="black", lw=2.5, marker="o", label="layer mean", zorder=3)
        ax.axvline(L, color="0.4", ls=":", lw=1)
        ax.text(L, 0.02, " L", color="0.3", fontsize=9, va="bottom", transform=ax.get_xaxis_transform())
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="evaluation length T (tokens)",
            title="with the first-token sink" if sink else "without the sink (entries (n, 0) removed)",
        )
        ax.set_xticks(lengths, [f"{T}" for T in lengths], fontsize=8)
        ax.minorticks_off()
    axes[0].set_ylabel("R (mean-scores, boundary zero)")
    axes[1].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def last_distance_figure(profiles: list[Profile], layer: int, lengths: list[int]) -> Figure:
    """Where the weight of softmax(ŝ) sits in ``layer`` (heads averaged, as mean-scores R sees it), on
    a log axis, at each causal length; the single entry at n = T − 1 (the last query on key 0) marked,
    and the flat weight 1/T dotted."""
    of = by_length(profiles)
    fig, ax = plt.subplots(figsize=(9.5, 3.6))
    for i, T in enumerate(lengths):
        p = torch.softmax(mean_over_heads(of[(T, False)].s_hat.double())[layer], -1).numpy()
        colour = plt.get_cmap("viridis")(i / max(1, len(lengths) - 1))
        ax.plot(np.arange(1, T + 1), p, color=colour, lw=1, label=f"T = {T}")
        ax.plot([T], [p[-1]], marker="*", ms=12, color=colour, markeredgecolor="black", zorder=3)
        ax.hlines(1 / T, 1, T, colors=colour, linestyles=":", lw=0.8)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="distance n + 1 (log axis)",
        ylabel="softmax weight p_n",
        title=f"layer {layer}: the star is n = T − 1, a diagonal of one entry (the last query on key 0); dotted: 1/T",
        ylim=(1e-12, 2),
    )
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def position_nll_figure(profiles: list[Profile], T: int, window: int = 256) -> Figure:
    """The per-position NLL of the same T-token windows, causal and with BCA, as a running mean over
    ``window`` positions; L marked."""
    of = by_length(profiles)
    L = profiles[0].meta["train_len"]
    fig, ax = plt.subplots(figsize=(9.5, 3.2))
    for bca, style in ((False, "-"), (True, "--")):
        if (T, bca) not in of:
            continue
        nll = of[(T, bca)].nll.numpy()
        smooth = np.convolve(nll, np.ones(window) / window, mode="valid")
        ax.plot(np.arange(len(smooth)) + window // 2, smooth, ls=style, lw=1.3, label="BCA" if bca else "causal")
    ax.axvline(L, color="0.4", ls=":", lw=1)
    ax.text(L, ax.get_ylim()[1], " L (its context)", va="top", fontsize=9, color="0.3")
    ax.set(
        xlabel="position in the window",
        ylabel=f"NLL (nats a token), running mean of {window}",
        title=f"the same {of[(T, False)].meta['windows'][str(T)]} windows of T = {T} tokens",
    )
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def sink_score_rows(profiles: list[Profile], layer: int, lengths: list[int], far: int = 10) -> list[dict]:
    """In ``layer`` (heads averaged): ŝ at n = T − 1 (the sink entry) and at n = T − ``far``, per length:
    whether past L the sink fades or the rest of the far profile rises to meet it."""
    of = by_length(profiles)
    rows = []
    for T in lengths:
        s = mean_over_heads(of[(T, False)].s_hat.double())[layer]
        rows.append(
            {
                "T": T,
                "ŝ[T−1]": float(s[-1]),
                f"ŝ[T−{far}]": float(s[-far]),
                "gap (nats)": float(s[-1] - s[-far]),
                "p(T−1)": float(torch.softmax(s, -1)[-1]),
            }
        )
    return rows


def share(part: float, whole: float) -> float:
    """part / whole, NaN where whole is 0."""
    return part / whole if whole else math.nan
