"""Design-time R against the measurement (issue 41, notebook 10): the shipped design-time store
(:mod:`attnres_helpers.design_store`) beside every entry of a configurations store, per layer and layer
mean; the tables, Spearman's ρ across configurations with its window-bootstrap interval, where the two part
by more than a factor, and design-time R(2L) as plan v4's secondary predictor.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from .design_store import DesignStore
from .design_time import design_lengths, model_form, score


def position_only(configuration, train_len: int) -> bool:
    """Whether a configuration changes only the distance RoPE sees, as a function of n alone, and keeps
    every pair at each distance it allows (no remap, or ReRoPE's and leaky ReRoPE's clamp; a causal mask or a
    window without sinks): there layer 0's design-time ŝ is its measured ŝ at T ≤ L (the tests check it)."""
    remap, mask = configuration.remap_for(train_len), configuration.mask_for(train_len)
    return (remap is None or remap.rule in ("rerope", "leaky-rerope")) and mask.kind != "bca" and mask.sinks == 0


def against_measured(design: DesignStore, measured, configurations: Mapping[str, object]) -> list[dict]:
    """Design-time against measured R for every (configuration, T) of a configurations store (plan v4 on:
    :func:`attnres_helpers.configured_store.load`) at T = L and 2L, in the store's order; at T = L only where
    the store measured the configuration itself (elsewhere it is the model as trained there). Each row:
    ``configuration``, ``T``, ``length`` ("L" or "2L"), ``design`` and ``design_sink_free`` (layers,) from
    the design store, ``measured`` and ``measured_sink_free`` (layers,) the mean over windows of each
    window's R (plan v4's predictor), ``window_r`` and ``window_r_sink_free`` (W, layers), ``windows``.
    ``configurations``: the registry (:data:`attnres_helpers.hf.configurations.CONFIGURATIONS`)."""
    L = measured.train_len
    if L != design.train_len:
        raise ValueError(f"the design store's L = {design.train_len} is not the measured store's L = {L}")
    corr, rows = design.correlations(), []
    for name in measured.configurations():
        if name not in configurations:
            raise ValueError(f"the measured store's configuration {name!r} is not in the registry")
        forms = {T: model_form(design.model, configurations[name], L, T) for T in (L, 2 * L)}
        lengths = design_lengths(corr, forms)
        for tag, T in (("L", L), ("2L", 2 * L)):
            entry = measured.entries.get((name, T))
            if entry is None:
                continue
            got = lengths[T]
            window_r, window_free = entry.window_r.double(), entry.window_r_sink_free.double()
            rows.append(
                {
                    "configuration": name,
                    "T": T,
                    "length": tag,
                    "design": got["r"],
                    "design_sink_free": got["r_sink_free"],
                    "measured": window_r.mean(0),
                    "measured_sink_free": window_free.mean(0),
                    "window_r": window_r,
                    "window_r_sink_free": window_free,
                    "windows": entry.windows,
                }
            )
    return rows


def score_rows(rows: list[dict], length: str = "2L", sink: bool = True, **kwargs) -> dict:
    """:func:`score` over the rows of one length (:func:`against_measured`), with or without the sink."""
    tag = "" if sink else "_sink_free"
    picked = [r for r in rows if r["length"] == length]
    design = {r["configuration"]: r["design" + tag] for r in picked}
    measured = {r["configuration"]: r["measured" + tag] for r in picked}
    windows = min((r["windows"] for r in picked), default=0)
    window_r = {r["configuration"]: r["window_r" + tag][:windows] for r in picked}
    return score(design, measured, window_r, **kwargs)


DESIGN_KEY = "design-time R(2L)"  # plan v4's secondary predictor, as a quantity of plan_v4.Collected


def with_design(data, design_r2l: Mapping[str, float]):
    """Plan v4's collected quantities (:func:`attnres_helpers.plan_v4.collect`) with design-time R(2L) (the
    layer mean) as one more predictor, the same value in every window (it is computed once, from one pass
    as trained: its window-bootstrap replicates are constant)."""
    from .plan_v4 import Collected

    missing = [n for n in data.names if n not in design_r2l]
    if missing:
        raise ValueError(f"no design-time R(2L) for {', '.join(missing)}")
    W = data.values["R(2L)"].shape[1]
    column = np.array([[float(design_r2l[n])] * W for n in data.names])
    return Collected(data.names, data.kinds, {**data.values, DESIGN_KEY: column})


def secondary_predictor(data, design_r2l: Mapping[str, float], n_resamples: int = 10_000, rng: int = 0) -> list[dict]:
    """Plan v4's secondary predictor design-time R(2L) beside the measured R(2L), per outcome: the
    across-configuration test of each (:func:`attnres_helpers.plan_v4.across`, as the plan reports every
    secondary) and, *exploratory* (the plan gives verdicts only from the primary's within-kind test), the
    within-kind test of design-time R(2L) with the category the primary's rule would give it."""
    from . import plan_v4

    data = with_design(data, design_r2l)
    valid, _ = plan_v4.validity(data)
    rows = []
    for outcome in plan_v4.OUTCOMES:
        design = plan_v4.across(data, DESIGN_KEY, outcome, n_resamples, rng=rng)
        measured = plan_v4.across(data, plan_v4.PRIMARY, outcome, n_resamples, rng=rng)
        within = plan_v4.within_kinds(data, DESIGN_KEY, outcome, n_resamples, rng=rng)
        tied = plan_v4.tied_in_every_kind(data, outcome)
        rows.append(
            {
                "outcome": outcome,
                "design": design,
                "measured": measured,
                "within": within,
                "exploratory verdict": plan_v4.verdict(within, valid, tied),
            }
        )
    return rows


def comparison_rows(rows: list[dict], layer: int | None = None) -> list[dict]:
    """Table rows (strings, 3 significant figures) of :func:`against_measured`'s rows: design and measured R
    and their ratio, with and without the first-token entries, for the layer mean or one ``layer``."""
    from .widgets.text import format_sig

    pick = (lambda t: float(t.mean())) if layer is None else (lambda t: float(t[layer]))  # noqa: E731
    out = []
    for r in rows:
        row = {"configuration": r["configuration"], "T": r["length"], "windows": str(r["windows"])}
        for tag, label in (("", ""), ("_sink_free", " no sink")):
            design, measured = pick(r["design" + tag]), pick(r["measured" + tag])
            row |= {
                f"design{label}": format_sig(design),
                f"measured{label}": format_sig(measured),
                f"ratio{label}": format_sig(design / measured) if measured > 0 else "n/a",
            }
        out.append(row)
    return out


def off_by(rows: list[dict], length: str = "2L", factor: float = 2.0, sink: bool = True) -> dict[str, list[int]]:
    """{configuration: the layers where design-time R at ``length`` is off the measured by more than
    ``factor`` either way}, for the configurations that have any."""
    tag = "" if sink else "_sink_free"
    out = {}
    for r in rows:
        if r["length"] == length:
            ratio = r["design" + tag] / r["measured" + tag]
            layers = torch.nonzero((ratio > factor) | (ratio < 1 / factor)).flatten().tolist()
            if layers:
                out[r["configuration"]] = layers
    return out
