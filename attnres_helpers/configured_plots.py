"""Notebook 08's figures and tables over the configurations store (plan v3): the R pair against each
outcome with window-bootstrap intervals, R per layer, and passkey accuracy by distance."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .configured_analysis import Estimate
from .configured_store import ConfiguredStore
from .passkey import KINDS

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


def table_rows(summaries: dict[str, dict[str, Estimate]], labels: dict[str, str]) -> list[dict]:
    """One row per configuration: each plan quantity as "value [low, high]"."""
    return [
        {"configuration": labels.get(name, name), **{k: _cell(row[k]) for k in TABLE_COLUMNS}}
        for name, row in summaries.items()
    ]


def _cell(e: Estimate) -> str:
    digits = 3 if abs(e.value) >= 0.01 or e.value == 0 else 4
    return f"{e.value:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def pair_figure(summaries: dict[str, dict[str, Estimate]], labels: dict[str, str]) -> Figure:
    """R(2L) with the sink (filled) and without it (open) against the NLL rise past L (left) and
    passkey accuracy past L (right), one colour per configuration, window-bootstrap 95% intervals."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    colours = plt.get_cmap("tab10")
    for ax, outcome in zip(axes, ("NLL rise", "passkey past L")):
        for i, (name, row) in enumerate(summaries.items()):
            y = row[outcome]
            for key, face in (("R(2L)", colours(i)), ("R(2L) sink-free", "white")):
                x = row[key]
                ax.errorbar(
                    x.value,
                    y.value,
                    xerr=[[x.value - x.low], [x.high - x.value]],
                    yerr=[[y.value - y.low], [y.high - y.value]],
                    fmt="o",
                    color=colours(i),
                    mfc=face,
                    ms=7,
                    capsize=2,
                    label=labels.get(name, name) if key == "R(2L)" else None,
                )
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
