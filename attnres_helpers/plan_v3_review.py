"""Plan v3 read again after its data (notebooks 07 and 08): every part of the plan's prediction against the
measurement, and the exploratory checks a re-analysis asked for. Nothing here is part of plan v3's test;
notebook 08 labels each of these *exploratory* ("written after the data").

Every number is a query over the configurations store (:mod:`attnres_helpers.configured_store`) through
:func:`attnres_helpers.configured_analysis.per_window`, the plan's own per-window quantities:

- :func:`kinds`: the kind of each configuration (as trained, rescaled RoPE, masked), read from the store's
  own record of each configuration's RoPE parameters and mask at 2L.
- :func:`kind_test`: how well a grouping by kind orders an outcome (Spearman's ρ with its exact p), and
  whether R adds anything within kinds (ρ with y permuted only within each kind, every such ordering
  enumerated: :func:`attnres_helpers.stats.spearman_permutation_test` with strata).
- :func:`paired_difference`: the difference of one quantity between two configurations, window by
  window (they share the windows), with its window-bootstrap interval.
- :func:`sink_free_rows`: R(L) and the drop R(2L)/R(L) without the first-token sink, beside the plan's
  quantities with it.
- :func:`prediction_rows`: each part of plan v3's written prediction, what was measured, and whether it held.
- :func:`without_configurations`: plan v3's cross-configuration ρ with some configurations left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .configured_analysis import PERMUTATIONS, per_window, verdict
from .configured_store import ConfiguredStore
from .stats import (
    BootstrapResult,
    CorrelationResult,
    PermutationTestResult,
    bootstrap_mean,
    percentile_interval,
    spearman_permutation_test,
)

KIND_ORDER = ("as trained", "masked", "rescaled")  # chosen after the data: the kinds by mean NLL rise, largest first


def kinds(store: ConfiguredStore) -> dict[str, str]:
    """{configuration: kind} from the store's record of each configuration at 2L: RoPE parameters replaced
    ("rescaled"), a mask other than causal ("masked"), or neither ("as trained")."""
    out = {}
    for name in store.configurations():
        info = store.about["entries"].get(f"{name}/{2 * store.train_len}")
        if info is None:
            continue
        out[name] = "rescaled" if info["rope"] else "masked" if info["mask"]["kind"] != "causal" else "as trained"
    return out


def window_means(store: ConfiguredStore, key: str, names: list[str] | None = None) -> np.ndarray:
    """The plan's quantity ``key`` (a key of :func:`per_window`) averaged over windows, per configuration."""
    names = store.configurations() if names is None else names
    return np.array([float(np.nanmean(per_window(store, n)[key])) for n in names])


@dataclass(frozen=True)
class KindTest:
    outcome: str
    predictor: str
    n: int
    kind: PermutationTestResult  # the kind, coded 0, 1, 2 in KIND_ORDER, against the outcome: ρ and its exact p
    # (not a test: the order was chosen after the data)
    within: PermutationTestResult  # the predictor's ρ with the outcome, its p from orderings within kinds only
    orderings: int  # how many such orderings there are (all counted)


def kind_test(store: ConfiguredStore, outcome: str = "NLL rise", predictor: str = "R(2L)") -> KindTest:
    """The kind grouping against ``outcome`` over the configurations, and ``predictor`` tested within kinds."""
    of = kinds(store)
    names = list(of)
    y, x = window_means(store, outcome, names), window_means(store, predictor, names)
    code = np.array([KIND_ORDER.index(of[n]) for n in names], float)
    strata = [of[n] for n in names]
    orderings = math.prod(math.factorial(strata.count(k)) for k in set(strata))
    kind = spearman_permutation_test(code, y, n_resamples=PERMUTATIONS)
    within = spearman_permutation_test(x, y, n_resamples=max(orderings, PERMUTATIONS), strata=strata)
    return KindTest(outcome, predictor, len(names), kind, within, orderings)


def paired_difference(
    store: ConfiguredStore, a: str, b: str, key: str = "NLL rise", n_resamples: int = 10_000, rng: int = 0
) -> BootstrapResult:
    """``key`` of configuration ``a`` minus that of ``b``, window by window (the same windows), as the mean
    over windows with its window-bootstrap 95% interval (:func:`attnres_helpers.stats.bootstrap_mean`)."""
    va, vb = per_window(store, a)[key], per_window(store, b)[key]
    if va.shape != vb.shape:
        raise ValueError(f"{a} and {b} have {len(va)} and {len(vb)} windows of {key}: not paired")
    return bootstrap_mean(va - vb, n_resamples=n_resamples, rng=rng)


def _ratio(num: np.ndarray, den: np.ndarray, n_resamples: int, rng: int) -> BootstrapResult:
    """mean(num) / mean(den) over two independent sets of windows, each resampled with replacement."""
    d_num = np.random.default_rng(rng + 1).integers(0, len(num), size=(n_resamples, len(num)))
    d_den = np.random.default_rng(rng).integers(0, len(den), size=(n_resamples, len(den)))
    boot = num[d_num].mean(-1) / den[d_den].mean(-1)
    return BootstrapResult(float(num.mean() / den.mean()), percentile_interval(boot, 0.95, "the ratio"))


def sink_free_rows(store: ConfiguredStore, n_resamples: int = 10_000, rng: int = 0) -> list[dict[str, BootstrapResult]]:
    """Per configuration with both lengths: R(L), R(2L) and the drop R(2L)/R(L), with and without the
    first-token sink, each with its window-bootstrap interval (windows of L and of 2L resampled apart)."""
    rows = []
    for name in store.configurations():
        v = per_window(store, name)
        if "R(L)" not in v or "R(2L)" not in v:
            continue
        row = {"configuration": name}
        for suffix in ("", " sink-free"):
            for key in (f"R(L){suffix}", f"R(2L){suffix}"):
                row[key] = bootstrap_mean(v[key], n_resamples=n_resamples, rng=rng)
            row[f"drop{suffix}"] = _ratio(v[f"R(2L){suffix}"], v[f"R(L){suffix}"], n_resamples, rng)
        rows.append(row)
    return rows


def without_configurations(store: ConfiguredStore, predictor: str, outcome: str, left_out) -> PermutationTestResult:
    """Plan v3's ρ between window means over the configurations measured at 2L but ``left_out``, and its
    permutation p (exact up to 9 configurations)."""
    names = [n for n in kinds(store) if n not in set(left_out)]
    x, y = window_means(store, predictor, names), window_means(store, outcome, names)
    return spearman_permutation_test(x, y, n_resamples=PERMUTATIONS)


def _held(ok: bool | None) -> str:
    return "partly" if ok is None else "yes" if ok else "no"


def prediction_rows(
    summaries: dict[str, dict[str, BootstrapResult]],
    tests: list[CorrelationResult],
    valid: bool,
    labels: dict[str, str],
) -> list[dict[str, str]]:
    """Every part of plan v3's written prediction (``configurations_plan_v3.md``, last section): what it
    said, what the store says (from :func:`attnres_helpers.configured_analysis.summary` and ``test_rows``),
    and whether it held ("yes", "no" or "partly")."""
    value = {n: {k: e.statistic for k, e in row.items()} for n, row in summaries.items() if "NLL rise" in row}
    rise = {n: v["NLL rise"] for n, v in value.items()}
    by_rise = sorted(rise, key=rise.get, reverse=True)
    name = lambda n: labels.get(n, n)  # noqa: E731
    rows = []

    def add(part, predicted, measured, ok):
        rows.append({"part": part, "predicted": predicted, "measured": measured, "held": _held(ok)})

    first, second = by_rise[0] == "as-trained", by_rise[1] == "bca"
    add(
        "NLL rise: order",
        "largest for as trained, then BCA",
        "; ".join(f"{name(n)} {rise[n]:+.3f}" for n in by_rise),
        None if first != second else first,
    )
    small = ("pi-2", "yarn-2", "ntk-2", "streaming")
    add(
        "NLL rise: small",
        "small (below BCA's rise) for PI, YaRN, dynamic NTK and StreamingLLM",
        "; ".join(f"{name(n)} {rise[n]:+.3f}" for n in small) + f"; BCA {rise['bca']:+.3f}",
        _all_or_part([rise[n] < rise["bca"] for n in small]),
    )
    pk = {n: summaries[n]["passkey past L"] for n in value}
    near0 = ("as-trained", "bca", "bca-sink", "streaming")
    add(
        "passkey past L: near 0",
        "near 0 for as trained, BCA, BCA + sink and StreamingLLM",
        "; ".join(f"{name(n)} {pk[n].statistic:.3f}" for n in near0),
        _all_or_part([pk[n].confidence_interval.high <= 0.05 for n in near0]),
    )
    add(
        "passkey past L: above 0",
        "above 0 for YaRN and dynamic NTK",
        "; ".join(f"{name(n)} {pk[n]}" for n in ("yarn-2", "ntk-2")) + " (mean [95% window-bootstrap interval])",
        _all_or_part([pk[n].confidence_interval.low > 0 for n in ("yarn-2", "ntk-2")]),
    )
    add(
        "passkey past L: PI lower",
        "lower for PI than for YaRN and dynamic NTK",
        f"PI {pk['pi-2'].statistic:.3f} "
        f"(its ceiling control at 2L: {summaries['pi-2']['ceiling at 2L'].statistic:.2f})",
        pk["pi-2"].statistic < min(pk["yarn-2"].statistic, pk["ntk-2"].statistic),
    )
    r2 = {n: value[n]["R(2L)"] for n in value}
    kept = ("bca-sink", "streaming")
    add(
        "R(2L) and the first token",
        "high wherever the first token stays visible at far distances, low under BCA",
        "; ".join(f"{name(n)} {r2[n]:.4f}" for n in (*kept, "bca")),
        all(r2[n] > r2["bca"] for n in kept),
    )
    by = {(t.outcome, t.predictor): t for t in tests}
    for outcome, predicted, allowed in (
        ("passkey past L", "inconclusive or evidence against", ("inconclusive", "evidence against")),
        ("NLL rise", "inconclusive", ("inconclusive",)),
    ):
        got = verdict(by[outcome, "R(2L)"], valid)
        add(f"verdict, {outcome}", predicted, got, got in allowed)
    r, reach = by["passkey past L", "R(2L)"], by["passkey past L", "reach"]
    add(
        "reach against R, passkey past L",
        "the reach indicator orders it at least as well as R(2L)",
        f"reach ρ {reach.statistic:+.2f}, R(2L) ρ {r.statistic:+.2f}",
        abs(reach.statistic) >= abs(r.statistic),
    )
    return rows


def _all_or_part(flags: list[bool]) -> bool | None:
    return True if all(flags) else False if not any(flags) else None
