"""Notebook 08's figures and tables over the configurations store (plan v3): the R pair against each
outcome with window-bootstrap intervals, R per layer, and passkey accuracy by distance."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .configured_store import ConfiguredStore
from .passkey import KINDS
from .stats import BootstrapResult

TABLE_COLUMNS = (
    "R(L)",
    "R(2L)",
    "R(2L) sink-free",
    "drop",
    "NLL < L",
    "NLL ≥ L",
    "NLL rise",
    "passkey ≤ L/2 at L",
    "passkey past L",
)


def _error(e: BootstrapResult) -> list[list[float]]:
    """The interval as matplotlib's asymmetric error bar: [[below], [above]] the statistic."""
    return [[e.statistic - e.confidence_interval.low], [e.confidence_interval.high - e.statistic]]


def _point(ax, x: BootstrapResult, y: BootstrapResult, **style) -> None:
    """One configuration at (x, y) with both window-bootstrap intervals as error bars."""
    ax.errorbar(x.statistic, y.statistic, xerr=_error(x), yerr=_error(y), fmt="o", capsize=2, **style)


def table_rows(summaries: dict[str, dict[str, BootstrapResult]], labels: dict[str, str]) -> list[dict]:
    """One row per configuration: each plan quantity as "value [low, high]"."""
    return [
        {"configuration": labels.get(name, name), **{k: _cell(row[k]) for k in TABLE_COLUMNS}}
        for name, row in summaries.items()
    ]


def _cell(e: BootstrapResult) -> str:
    digits = 3 if abs(e.statistic) >= 0.01 or e.statistic == 0 else 4
    low, high = e.confidence_interval
    return f"{e.statistic:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def pair_figure(summaries: dict[str, dict[str, BootstrapResult]], labels: dict[str, str]) -> Figure:
    """R(2L) with the sink (filled) and without it (open) against the NLL rise past L (left) and
    passkey accuracy past L (right), one colour per configuration, window-bootstrap 95% intervals."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    colours = plt.get_cmap("tab10")
    for ax, outcome in zip(axes, ("NLL rise", "passkey past L")):
        for i, (name, row) in enumerate(summaries.items()):
            y = row[outcome]
            for key, face in (("R(2L)", colours(i)), ("R(2L) sink-free", "white")):
                label = labels.get(name, name) if key == "R(2L)" else None
                _point(ax, row[key], y, color=colours(i), mfc=face, ms=7, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("layer-mean R(2L): with the sink (filled), without (open)")
        ax.set_ylabel(
            {"NLL rise": "NLL past L − NLL before L (nats)", "passkey past L": "passkey accuracy, d > L"}[outcome]
        )
        ax.grid(alpha=0.3)
    axes[1].set_ylim(-0.05, 1.05)
    axes[0].legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def layer_figure(store: ConfiguredStore, labels: dict[str, str], names: list[str]) -> Figure:
    """R per layer (mean over windows) at L (dashed, the model as trained and PI/YaRN) and at 2L (solid)
    for every configuration, with the sink (left) and without it (right), on a log axis."""
    L = store.train_len
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    colours = plt.get_cmap("tab10")
    for ax, field in zip(axes, ("window_r", "window_r_sink_free")):
        for i, name in enumerate(names):
            at_2L = getattr(store.entry(name, 2 * L), field).double().mean(0).numpy()
            ax.plot(at_2L, color=colours(i), lw=1.4, label=f"{labels.get(name, name)}, 2L")
            if (name, L) in store.entries:
                at_L = getattr(store.entries[(name, L)], field).double().mean(0).numpy()
                ax.plot(at_L, color=colours(i), lw=1, ls="--", label=f"{labels.get(name, name)}, L")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title("with the sink" if field == "window_r" else "without the first-token entries", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("R (mean over windows)")
    axes[1].legend(fontsize=7, ncol=2, loc="best")
    fig.tight_layout()
    return fig


def distance_figure(store: ConfiguredStore, labels: dict[str, str], names: list[str]) -> Figure:
    """Passkey accuracy by distance at 2L (every configuration) and at L (the model as trained, dashed),
    with the ceiling and absent controls at the sides; L marked."""
    L = store.train_len
    fig, ax = plt.subplots(figsize=(8, 3.8))
    colours = plt.get_cmap("tab10")
    trial = KINDS.index("trial")

    def curve(entry):
        d = entry.passkey["distance"].numpy()
        passed = entry.passed().numpy()
        kinds = entry.passkey["kind"].numpy()
        ds = sorted(set(d[kinds == trial].tolist()))
        return ds, [passed[(kinds == trial) & (d == x)].mean() for x in ds]

    for i, name in enumerate(names):
        ds, acc = curve(store.entry(name, 2 * L))
        ax.plot(ds, acc, marker="o", color=colours(i), label=labels.get(name, name))
    ds, acc = curve(store.entry("as-trained", L))
    ax.plot(ds, acc, marker="s", color="black", ls="--", label="as trained, windows of L")
    ax.axvline(L, color="0.4", ls=":", lw=1)
    ax.set_xlabel("distance d from the key to the query (tokens)")
    ax.set_ylabel("passkey accuracy (exact match)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="best")
    fig.tight_layout()
    return fig


def controls(store: ConfiguredStore, names: list[str]) -> list[dict]:
    """Per configuration and length: the ceiling and absent controls' accuracy (the chance and the ceiling)."""
    L = store.train_len
    rows = []
    for name in names:
        for T in (L, 2 * L):
            try:
                e = store.entry(name, T)
            except KeyError:
                continue
            passed, kinds = e.passed().numpy(), e.passkey["kind"].numpy()
            rows.append(
                {
                    "configuration": name,
                    "T": T,
                    "windows": e.windows,
                    **{kind: float(np.mean(passed[kinds == KINDS.index(kind)])) for kind in ("ceiling", "absent")},
                }
            )
    return rows


# ------------------------------------------------------------------------------------------ plan v4

KIND_COLOURS = {
    "as-trained": "black",
    "rescaled": "tab:blue",
    "remapped": "tab:green",
    "masked": "tab:orange",
    "windowed": "tab:purple",
}
V4_OUTCOME_LABELS = {
    "NLL rise": "NLL past L − NLL before L (nats)",
    "near past L": "near retrieval, query past L",
    "far": "far retrieval (d > L)",
}


def kinds_figure(
    summary: dict[str, dict[str, BootstrapResult]], kinds: dict[str, str], predictor: str = "R(2L)"
) -> Figure:
    """``predictor`` against each plan-v4 outcome, one point per configuration coloured by its kind,
    window-bootstrap 95% intervals on both axes; R on a log axis."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharex=True)
    for ax, outcome in zip(axes, V4_OUTCOME_LABELS):
        for name, row in summary.items():
            x, y = row[predictor], row[outcome]
            _point(ax, x, y, color=KIND_COLOURS[kinds[name]], ms=6)
            ax.annotate(name, (x.statistic, y.statistic), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_ylabel(V4_OUTCOME_LABELS[outcome])
        ax.set_xlabel(f"layer-mean {predictor}")
        ax.grid(alpha=0.3)
        if outcome != "NLL rise":
            ax.set_ylim(-0.05, 1.05)
    if all(row[predictor].confidence_interval.low > 0 for row in summary.values()):
        axes[0].set_xscale("log")
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=k) for k, c in KIND_COLOURS.items()]
    axes[-1].legend(handles=handles, fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def stored_layers_figure(store: ConfiguredStore, names: list[str], kinds: dict[str, str]) -> Figure:
    """R per layer at 2L from each configuration's stored window-mean ŝ, with the sink (left) and without
    the first-token entries (right), coloured by kind, on a log axis."""
    T = 2 * store.train_len
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, sink in zip(axes, (True, False)):
        for name in names:
            r = store.entry(name, T).profile().layer_resolutions(sink=sink).numpy()
            ax.plot(r, color=KIND_COLOURS[kinds[name]], lw=1, alpha=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title("with the sink" if sink else "without the first-token entries", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("R(2L) of the stored window-mean ŝ")
    handles = [plt.Line2D([], [], color=c, label=k) for k, c in KIND_COLOURS.items()]
    axes[1].legend(handles=handles, fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def sink_plateau_figure(store: ConfiguredStore, names: list[str], layer: int) -> Figure:
    """One layer's stored ŝ at 2L against distance for a few configurations, with (solid) and without
    (dashed) the first-token entries, and softmax(ŝ)'s weight beyond L: where a mask leaves only the
    sink pairs past some distance, ŝ there is the sink's score, and its plateau takes the weight."""
    from .metric import sink_free_scores

    T = 2 * store.train_len
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours = plt.get_cmap("tab10")
    n = np.arange(T)
    for i, name in enumerate(names):
        p = store.entry(name, T).profile()
        s = p.s_hat[layer, 0].double()
        free = sink_free_scores(s, p.key0[layer, 0].double(), p.pair_counts())
        axes[0].plot(n, s.numpy(), color=colours(i), lw=1, label=name)
        axes[0].plot(n, free.numpy(), color=colours(i), lw=1, ls="--")
        weight = softmax_weight_beyond(s.numpy())
        axes[1].plot(n, weight, color=colours(i), lw=1, label=name)
    axes[0].set_xlabel("distance n")
    axes[0].set_ylabel(f"ŝ[n], layer {layer} (dashed: without the first-token entries)")
    axes[1].set_xlabel("distance n")
    axes[1].set_ylabel("softmax(ŝ) weight at distances ≥ n")
    for ax in axes:
        ax.axvline(store.train_len, color="0.4", ls=":", lw=1)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def softmax_weight_beyond(s: np.ndarray) -> np.ndarray:
    """softmax(s) summed from each index to the end (masked distances, -inf, weigh 0)."""
    finite = np.isfinite(s)
    w = np.where(finite, np.exp(np.where(finite, s, -np.inf) - np.nanmax(np.where(finite, s, np.nan))), 0.0)
    w = w / w.sum()
    return w[::-1].cumsum()[::-1]
