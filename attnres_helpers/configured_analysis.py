"""Plan v3 as code (``data/results/configurations_plan_v3.md``, notebook 08): one model's configurations
side by side, each number with a window-bootstrap interval, and the test across configurations.

Every number is a query over the store of :mod:`attnres_helpers.configured_store`: per-window layer R
(with and without the first-token sink), per-window NLL by block and per-trial passkey scores. A
**window bootstrap** resamples the windows of a length with replacement, jointly for every configuration
(they share the windows), ``n_resamples`` times, and gives the percentile interval at
``confidence_level`` (scipy.stats' names). The test across configurations is Spearman's ρ with the
exact permutation p over every ordering of the configurations (two-sided, mid-ranks;
:func:`attnres_helpers.stats.spearman_permutation_test`, sampled beyond :data:`PERMUTATIONS` orderings), as a
:class:`attnres_helpers.stats.CorrelationResult`; each number with its interval a
:class:`attnres_helpers.stats.BootstrapResult`.
"""

from __future__ import annotations

import math

import numpy as np

from .configured_store import ConfiguredStore, nll_mean
from .passkey import KINDS
from .stats import (
    BootstrapResult,
    ConfidenceInterval,
    CorrelationResult,
    constant_rows,
    percentile_interval,
    spearman_permutation_test,
    spearman_rows,
)

VALIDITY = {"within_L": 0.5, "ceiling": 0.9, "absent": 0.05}  # plan v3's validity bars
WITHIN_L_FRACTION = 0.5
L_WINDOW_KEYS = ("R(L)", "R(L) sink-free", "passkey ≤ L/2 at L", "ceiling at L", "absent at L")  # from windows of L
PERMUTATIONS = math.factorial(9)  # every ordering of up to 9 configurations counted; this many sampled beyond


def window_draws(n_windows: int, n_resamples: int, rng) -> np.ndarray:
    """(n_resamples, n_windows) window indices drawn with replacement."""
    return np.random.default_rng(rng).integers(0, n_windows, size=(n_resamples, n_windows))


def _estimate(per_window: np.ndarray, draws: np.ndarray, confidence_level: float, ratio_of=None) -> BootstrapResult:
    """Mean over windows (or the ratio of two such means) with the interval over ``draws``."""
    if ratio_of is None:
        boot = per_window[draws].mean(-1)
        return BootstrapResult(float(per_window.mean()), percentile_interval(boot, confidence_level, "the mean"))
    num, den = per_window, ratio_of
    boot = num[draws[0]].mean(-1) / den[draws[1]].mean(-1)
    return BootstrapResult(float(num.mean() / den.mean()), percentile_interval(boot, confidence_level, "the ratio"))


def per_window(store: ConfiguredStore, configuration: str) -> dict[str, np.ndarray]:
    """Each plan quantity of one configuration, one value per window (of L or of 2L, as named); the
    quantities of a length not yet measured are absent."""
    L = store.train_len
    out = {}
    for T, tag in ((L, "L"), (2 * L, "2L")):
        try:
            entry = store.entry(configuration, T)
        except KeyError:
            continue
        out[f"R({tag})"] = entry.window_r.double().mean(-1).numpy()
        out[f"R({tag}) sink-free"] = entry.window_r_sink_free.double().mean(-1).numpy()
        passed, kinds, d = entry.passed().numpy(), entry.passkey["kind"].numpy(), entry.passkey["distance"].numpy()
        trials = kinds == KINDS.index("trial")
        out[f"passkey ≤ L/2 at {tag}"] = fraction_passed(passed, trials & (d <= WITHIN_L_FRACTION * L))
        for kind in ("ceiling", "absent"):
            out[f"{kind} at {tag}"] = fraction_passed(passed, kinds == KINDS.index(kind))
        if T == 2 * L:
            mask = store.about["entries"][f"{entry.configuration}/{T}"]["mask"]
            out["reach"] = np.full(entry.windows, float(mask["kind"] == "causal"))  # every earlier key seen at 2L
            out["passkey past L"] = fraction_passed(passed, trials & (d > L))
            out["NLL < L"] = nll_mean(entry, 0, L).numpy()
            out["NLL ≥ L"] = nll_mean(entry, L, 2 * L).numpy()
            out["NLL rise"] = out["NLL ≥ L"] - out["NLL < L"]
    return out


def fraction_passed(passed: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per window, the fraction of the masked trials that passed (NaN where a window has none)."""
    n = mask.sum(-1)
    return np.where(n > 0, (passed & mask).sum(-1) / np.maximum(n, 1), np.nan)


def summary(
    store: ConfiguredStore, n_resamples: int = 10_000, confidence_level: float = 0.95, rng: int = 0
) -> dict[str, dict[str, BootstrapResult]]:
    """{configuration: {quantity: BootstrapResult}} for every configuration in the store (the quantities of the
    lengths it has); the drop R(2L)/R(L) is the ratio of the two window means. Windows are resampled
    jointly for every configuration: the same draws wherever the window count is the same."""
    draws = {}  # the same draws for every configuration: by (length, window count)

    def of(key: str, n: int) -> np.ndarray:
        at = "L" if key in L_WINDOW_KEYS else "2L"
        if (at, n) not in draws:
            draws[(at, n)] = window_draws(n, n_resamples, rng + (at == "2L"))
        return draws[(at, n)]

    out = {}
    for name in store.configurations():
        values = per_window(store, name)
        row = {k: _estimate(v, of(k, len(v)), confidence_level) for k, v in values.items()}
        if "R(L)" in values and "R(2L)" in values:
            pair = (of("R(2L)", len(values["R(2L)"])), of("R(L)", len(values["R(L)"])))
            row["drop"] = _estimate(values["R(2L)"], pair, confidence_level, ratio_of=values["R(L)"])
        out[name] = row
    return out


def _has_both(store: ConfiguredStore, name: str, L: int) -> bool:
    try:
        store.entry(name, L), store.entry(name, 2 * L)
    except KeyError:
        return False
    return True


def cross_test(
    store: ConfiguredStore,
    predictor: str,
    outcome: str,
    n_resamples: int = 10_000,
    confidence_level: float = 0.95,
    rng: int = 0,
    permutations: int = PERMUTATIONS,
) -> CorrelationResult:
    """ρ over the configurations between the window means of ``predictor`` and ``outcome``, its permutation
    p (exact while n! ≤ ``permutations``), and its window-bootstrap interval (windows resampled jointly;
    resamples where either side is constant are left out). ρ and p are NaN where a side is constant."""
    L = store.train_len
    names = [c for c in store.configurations() if _has_both(store, c, L)]
    values = {c: per_window(store, c) for c in names}
    # the windows every configuration has (a run still under way leaves some one window ahead)
    W_L, W_2L = (min(len(values[c][k]) for c in names) for k in ("R(L)", "R(2L)"))
    values = {c: {k: v[: W_L if k in L_WINDOW_KEYS else W_2L] for k, v in vals.items()} for c, vals in values.items()}

    def mean(c: str, key: str, d_L: np.ndarray, d_2L: np.ndarray) -> np.ndarray:
        """Over the windows a draw names: (W,) indices -> a mean, (B, W) -> (B,) means."""
        v = values[c]
        if key == "drop":
            return v["R(2L)"][d_2L].mean(axis=-1) / v["R(L)"][d_L].mean(axis=-1)
        return np.nanmean(v[key][d_L if key in L_WINDOW_KEYS else d_2L], axis=-1)

    all_L, all_2L = np.arange(W_L), np.arange(W_2L)
    x = np.array([mean(c, predictor, all_L, all_2L) for c in names])
    y = np.array([mean(c, outcome, all_L, all_2L) for c in names])
    rho, p, exact = math.nan, math.nan, False
    if np.ptp(x) > 0 and np.ptp(y) > 0:  # else a side is constant: nothing to rank
        test = spearman_permutation_test(x, y, n_resamples=permutations)
        rho, p, exact = test.statistic, test.pvalue, math.factorial(len(x)) <= permutations
    d_L, d_2L = window_draws(W_L, n_resamples, rng), window_draws(W_2L, n_resamples, rng + 1)
    xb = np.stack([mean(c, predictor, d_L, d_2L) for c in names], axis=1)  # (B, configurations)
    yb = np.stack([mean(c, outcome, d_L, d_2L) for c in names], axis=1)
    kept = ~constant_rows(xb) & ~constant_rows(yb)  # a row with a NaN is kept: spearman_rows refuses it
    boot = spearman_rows(xb[kept], yb[kept])
    a = 100 * (1 - confidence_level) / 2
    low, high = np.percentile(boot, [a, 100 - a]) if len(boot) else (math.nan, math.nan)
    largest_tie = max(np.unique(np.round(y, 12), return_counts=True)[1])
    return CorrelationResult(
        rho,
        ConfidenceInterval(float(low), float(high)),
        len(names),
        p,
        predictor,
        outcome,
        exact,
        largest_tie=int(largest_tie),
    )


def validity(summaries: dict[str, dict[str, BootstrapResult]]) -> tuple[bool, str]:
    """Plan v3's validity check on the model as trained at T = L: (passes, the sentence that says so)."""
    row = summaries["as-trained"]
    within, ceiling, absent = row["passkey ≤ L/2 at L"], row["ceiling at L"], row["absent at L"]
    checks = [
        within.statistic >= VALIDITY["within_L"] and within.confidence_interval.low > absent.statistic,
        ceiling.statistic >= VALIDITY["ceiling"],
        absent.statistic <= VALIDITY["absent"],
    ]
    ok = all(checks)
    text = (
        f"SmolLM2 as trained at T = L: passkey accuracy at d ≤ L/2 {within} (bar ≥ {VALIDITY['within_L']}, "
        f"lower end above the absent control), ceiling control {ceiling} (bar ≥ {VALIDITY['ceiling']}), "
        f"absent control {absent} (bar ≤ {VALIDITY['absent']}): "
        + ("the probe is valid." if ok else "the probe fails its validity check; passkey numbers are descriptive only.")
    )
    return ok, text


EXPECTED_SIGN = {"NLL rise": -1, "passkey past L": +1}


def verdict(test: CorrelationResult, valid: bool = True) -> str:
    """Plan v3's category for one outcome from its test."""
    if test.outcome == "passkey past L" and (not valid or test.largest_tie >= 5):
        return "inconclusive"
    if math.isnan(test.statistic):
        return "inconclusive"
    if test.pvalue < 0.05 and test.excludes_zero:
        return "supports" if np.sign(test.statistic) == EXPECTED_SIGN[test.outcome] else "evidence against"
    return "inconclusive"


PREDICTORS = ("R(2L)", "R(2L) sink-free", "drop")  # the primary first
BASELINES = ("R(L)", "reach")
OUTCOMES = ("NLL rise", "passkey past L")


def test_rows(store: ConfiguredStore, n_resamples: int = 10_000, rng: int = 0) -> list[CorrelationResult]:
    """Every predictor and baseline against both outcomes (:func:`cross_test`); empty until at least
    three configurations have both lengths."""
    L = store.train_len
    if sum(_has_both(store, c, L) for c in store.configurations()) < 3:
        return []
    out = []
    for outcome in OUTCOMES:
        for predictor in PREDICTORS + BASELINES:
            try:
                out.append(cross_test(store, predictor, outcome, n_resamples, rng=rng))
            except ValueError:  # a constant side (e.g. every configuration at one value): no ranking
                continue
    return out


def test_table(tests: list[CorrelationResult]) -> list[dict]:
    """One row per test for a table: outcome, predictor, n, rho, low, high, p and largest_tie."""
    return [
        {
            "outcome": t.outcome,
            "predictor": t.predictor,
            "n": t.n,
            "rho": t.statistic,
            "low": t.confidence_interval.low,
            "high": t.confidence_interval.high,
            "p": t.pvalue,
            "largest_tie": t.largest_tie,
        }
        for t in tests
    ]


def verdict_text(tests: list[CorrelationResult], valid: bool) -> list[str]:
    """One sentence per outcome: the plan's category for the primary predictor, its numbers, and whether
    the reach indicator orders the outcome at least as well."""
    lines = []
    for outcome in OUTCOMES:
        primary = next((t for t in tests if t.outcome == outcome and t.predictor == PREDICTORS[0]), None)
        if primary is None:
            lines.append(f"{outcome}: not enough configurations measured at both lengths for the test yet.")
            continue
        reach = next((t for t in tests if t.outcome == outcome and t.predictor == "reach"), None)
        category = verdict(primary, valid)
        text = (
            f"{outcome}: **{category}**. R(2L) with the sink against {outcome} over {primary.n} configurations: "
            f"ρ = {primary.statistic:+.2f}, window-bootstrap 95% interval "
            f"[{primary.confidence_interval.low:+.2f}, {primary.confidence_interval.high:+.2f}], "
            f"{'exact' if primary.exact else 'sampled'} permutation p = {primary.pvalue:.3f}"
        )
        if outcome == "passkey past L" and primary.largest_tie >= 5:
            text += f"; {primary.largest_tie} configurations share one accuracy, too few distinct values to rank"
        if outcome == "passkey past L" and not valid:
            text += "; the probe failed its validity check, so this outcome is descriptive only"
        if reach is not None and not math.isnan(reach.statistic):
            as_well = abs(reach.statistic) >= abs(primary.statistic)
            text += f". The reach indicator alone: ρ = {reach.statistic:+.2f} (p = {reach.pvalue:.3f}), " + (
                "at least as strong as R." if as_well else "weaker than R."
            )
        else:
            text += "."
        lines.append(text)
    return lines
