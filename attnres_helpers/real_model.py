"""Notebook 07's queries and figures over the real models' stores (one per entry of :mod:`hf.models`).

Every number is a query over stored profiles (head-averaged ŝ, key-0 scores and per-position NLL of each
model at several lengths, :mod:`attnres_helpers.hf.pretrained`): R per layer with and without the
first-token sink (:meth:`store.Profile.layer_resolutions`), the softmax weight R sees at the farthest
distance (:func:`tables.last_distance_weights`), and the NLL before and past L in the same windows.
Where a store keeps each window's values (Gemma's), a row carries a window-bootstrap interval
(:func:`stats.bootstrap_mean`); the layers are grouped by the span their ŝ has (:func:`attention_spans`:
a sliding-window layer's ŝ is undefined past its window), and the sink experiment
(:mod:`attnres_helpers.hf.sinks`) is read per arrangement.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from .metric import Boundary, mean_over_heads
from .stats import BootstrapResult, bootstrap_mean
from .store import Profile
from .tables import last_distance_weights


def by_length(profiles: list[Profile]) -> dict[tuple[int, bool], Profile]:
    """One run's profiles by (eval length, BCA). Profiles of several runs are refused (a multi-run store's
    lengths would overwrite each other): pass one run's, ``[p for p in profiles if p.run == name]``."""
    runs = list(dict.fromkeys(p.run for p in profiles))
    if len(runs) != 1:
        named = ", ".join(map(repr, runs[:3])) + (", ..." if len(runs) > 3 else "")
        raise ValueError(
            f"these helpers read one run's profiles, got profiles of {len(runs)} runs ({named}): "
            "pass [p for p in profiles if p.run == name]"
        )
    return {(p.eval_len, p.bca): p for p in profiles}


def causal(of: dict[tuple[int, bool], Profile], T: int) -> Profile:
    """The causal profile at length ``T`` of :func:`by_length`'s ``of``; a length not measured is one error
    naming the run and the lengths it has."""
    if (T, False) not in of:
        p = next(iter(of.values()))
        measured = sorted(t for t, bca in of if not bca)
        raise ValueError(f"run {p.run!r} has no causal profile at T = {T!r}; it has {measured}")
    return of[T, False]


def causal_resolutions(of: dict[tuple[int, bool], Profile], T: int, sink: bool = True) -> torch.Tensor:
    """R of every layer (mean-scores, boundary zero) of the causal profile at ``T``, with or without the
    sink; without it, a store that has no key-0 scores is one error naming the run."""
    p = causal(of, T)
    r = p.layer_resolutions(sink=sink)
    if r is None:
        raise ValueError(f"run {p.run!r} has no key-0 scores: its store holds no R without the sink")
    return r


def windows_of(p: Profile) -> int | None:
    """How many windows the profile's mean is over (run metadata ``windows``); None where not recorded."""
    windows = p.meta.get("windows")
    return windows.get(str(p.eval_len)) if isinstance(windows, dict) else None


def length_rows(profiles: list[Profile], boundary: Boundary = "zero") -> list[dict]:
    """One row per (length, mask) of one run: the layer-mean R with and without the sink, the share of R
    the sink carries (these two None where the store has no key-0 scores), the largest weight at n = T − 1
    over layers, the same-window NLL before and past L, and the windows (:func:`windows_of`)."""
    rows = []
    for (T, bca), p in sorted(by_length(profiles).items()):
        L = p.meta["train_len"]
        with_sink, free = p.layer_resolutions(boundary=boundary), p.layer_resolutions(boundary=boundary, sink=False)
        r, r_free = float(with_sink.mean()), None if free is None else float(free.mean())
        rows.append(
            {
                "T": T,
                "mask": "BCA" if bca else "causal",
                "windows": windows_of(p),
                "R": r,
                "R sink-free": r_free,
                "sink share": None if r_free is None else 1 - share(r_free, r),
                "max p(T−1)": float(last_distance_weights(p).max()),
                "NLL < L": float(p.nll[:L].mean()),
                "NLL ≥ L": float(p.nll[L:].mean()) if T > L else None,
            }
        )
    return rows


def layer_rows(profiles: list[Profile], lengths: list[int], sink: bool = True) -> list[dict]:
    """One row per layer of one run: R at each causal length (with or without the sink), and R(2L)/R(L)."""
    of = by_length(profiles)
    if not lengths:
        raise ValueError("lengths must name at least one measured length")
    L = profiles[0].meta["train_len"]
    per = {T: causal_resolutions(of, T, sink) for T in lengths}
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
        per = torch.stack([causal_resolutions(of, T, sink) for T in lengths])  # (lengths, layers)
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
        p = torch.softmax(mean_over_heads(causal(of, T).s_hat.double())[layer], -1).numpy()
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
    windows = windows_of(causal(of, T))
    ax.axvline(L, color="0.4", ls=":", lw=1)
    ax.text(L, ax.get_ylim()[1], " L (its context)", va="top", fontsize=9, color="0.3")
    ax.set(
        xlabel="position in the window",
        ylabel=f"NLL (nats a token), running mean of {window}",
        title=f"the same {'' if windows is None else f'{windows} '}windows of T = {T} tokens",
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
        s = mean_over_heads(causal(of, T).s_hat.double())[layer]
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


def attention_spans(profile: Profile) -> list[int]:
    """Per layer, how many distances its ŝ is defined at: T for a full-attention layer, the window w for
    a sliding-window layer (ŝ is -inf from n = w on, where no query attends)."""
    finite = torch.isfinite(profile.s_hat).all(1)  # (layers, T): every head defined at n
    return [int(row.sum()) for row in finite]


def layer_kinds(profile: Profile) -> dict[str, list[int]]:
    """The layers grouped by span at ``profile``'s length: "global" (ŝ defined at every distance),
    "window w" for each sliding window w, and "all"."""
    spans = attention_spans(profile)
    kinds = {"global": [i for i, s in enumerate(spans) if s == profile.eval_len]}
    for w in sorted({s for s in spans if s < profile.eval_len}):
        kinds[f"window {w}"] = [i for i, s in enumerate(spans) if s == w]
    return {**kinds, "all": list(range(len(spans)))}


def window_rows(
    profiles: list[Profile],
    window_values: dict[str, dict[str, torch.Tensor]],
    n_resamples: int = 10_000,
    confidence_level: float = 0.95,
    rng: int = 0,
) -> list[dict]:
    """One row per (run, length, layer kind): the mean over windows of each window's layer-mean R, with
    and without the sink, and of its mean NLL, each with a window-bootstrap interval
    (:func:`stats.bootstrap_mean`). The kinds are those of the run's longest length (at T = w a
    sliding layer of window w sees every distance, and is still counted as one)."""
    longest = {p.run: p for p in sorted(profiles, key=lambda p: p.eval_len)}  # where every window has bitten
    rows = []
    for p in sorted(profiles, key=lambda p: (p.run, p.eval_len, p.bca)):
        values = window_values[p.key]
        for kind, layers in layer_kinds(longest[p.run]).items():
            if not layers:
                continue
            est = {
                name: bootstrap_mean(values[key][:, layers].mean(1).numpy(), n_resamples, confidence_level, rng)
                for name, key in (("R", "r"), ("R sink-free", "r_sink_free"))
            }
            est["NLL"] = bootstrap_mean(values["nll"].numpy(), n_resamples, confidence_level, rng)
            rows.append({"run": p.run, "T": p.eval_len, "layers": f"{kind} ({len(layers)})", **est})
    return rows


def sink_rows(
    sinks: dict[str, torch.Tensor], kinds: dict[str, list[int]], at: int, n_resamples: int = 10_000, rng: int = 0
) -> list[dict]:
    """One row per (arrangement, layer kind) of one model's sink experiment: the attention weight on key 0
    and on key ``at``, averaged over the kind's layers, with window-bootstrap intervals."""
    rows = []
    for arrangement, weights in sinks.items():  # (windows, layers, 2)
        for kind, layers in kinds.items():
            if layers:
                mean = weights[:, layers].mean(1).numpy()  # (windows, 2)
                rows.append(
                    {
                        "arrangement": arrangement,
                        "layers": f"{kind} ({len(layers)})",
                        "weight on key 0": bootstrap_mean(mean[:, 0], n_resamples, rng=rng),
                        f"weight on key {at}": bootstrap_mean(mean[:, 1], n_resamples, rng=rng),
                    }
                )
    return rows


def side_by_side_rows(stores: dict[str, list[Profile]], lengths: list[int]) -> list[dict]:
    """Each model at each of ``lengths`` (causal): T as a fraction of its L, and the layer-mean R of the
    window-mean ŝ with and without the sink (the estimator every store has), and the perplexity."""
    rows = []
    for title, profiles in stores.items():
        of = by_length(profiles)
        for T in lengths:
            p = causal(of, T)
            r, free = p.layer_resolutions(), p.layer_resolutions(sink=False)  # free: None without key-0 scores
            rows.append(
                {
                    "model": title,
                    "T": T,
                    "T / L": f"1/{p.meta['train_len'] // T}"
                    if T < p.meta["train_len"]
                    else f"{T // p.meta['train_len']}",
                    "R": float(r.mean()),
                    "R sink-free": None if free is None else float(free.mean()),
                    "perplexity": math.exp(float(p.nll.mean())),
                }
            )
    return rows


def span_figure(rows: list[dict], run: str) -> Figure:
    """Window-mean R against T per layer kind, with the sink (left) and without it (right), with the
    window-bootstrap intervals of :func:`window_rows`."""
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6), sharey=True)
    kinds = list(dict.fromkeys(r["layers"] for r in rows if r["run"] == run))
    for ax, name in zip(axes, ("R", "R sink-free")):
        for i, kind in enumerate(kinds):
            mine = [r for r in rows if r["run"] == run and r["layers"] == kind]
            T = [r["T"] for r in mine]
            value = np.array([r[name].statistic for r in mine])
            low, high = np.array([r[name].confidence_interval for r in mine]).T
            err = np.array([value - low, high - value])
            style = {"color": "black", "lw": 2.5} if kind.startswith("all") else {"color": plt.get_cmap("tab10")(i)}
            ax.errorbar(T, value, yerr=err, marker="o", capsize=3, label=kind, **style)
        ax.set(xscale="log", yscale="log", xlabel="evaluation length T (tokens)", title=f"{name}, per window")
        ax.set_xticks(T, [str(t) for t in T], fontsize=8)
        ax.minorticks_off()
    axes[0].set_ylabel("R (mean-scores, boundary zero)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def estimate_cell(e: BootstrapResult, digits: int = 3) -> str:
    """'value [low, high]' for a table cell."""
    low, high = e.confidence_interval
    return f"{e.statistic:.{digits}g} [{low:.{digits}g}, {high:.{digits}g}]"
