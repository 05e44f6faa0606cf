"""Plan v4 as code (``data/results/configurations_plan_v4.md``): does R order training-free configurations
of one real model, within their kinds, better than the kind, perplexity and attention entropy do?

Every number is a query over the configurations store (:mod:`attnres_helpers.configured_store`): per
window of L and of 2L, the layer-mean R with and without the first-token entries, the NLL by block, the
attention entropy by block, and every passkey trial. :func:`collect` gathers one value per (configuration,
window) for each quantity of the plan; the tests resample **windows** (jointly for every configuration,
which share them) for their intervals and permute **configurations** for their p-values:

- :func:`across`: Spearman's ρ over the configurations, its two-sided permutation p by
  ``scipy.stats.permutation_test`` (exact when every ordering is counted, sampled beyond), its window
  bootstrap interval;
- :func:`within_kinds`: the primary test: the kinds' ρ's averaged (weighted by kind size), its p from
  permutations within kinds (:func:`attnres_helpers.stats.stratified_permutation_test`: exact up to
  :data:`PERMUTATIONS` orderings, that many sampled beyond), its window-bootstrap interval;
- :func:`head_to_head`: R(2L) against a rival predictor (the NLL past L, the entropy past L) on the same
  resamples: the difference of their |ρ| and R's partial ρ given the rival;
- :func:`prediction_rows`: the plan's prediction, word for word, beside what the data show (nothing scored).

Results are :mod:`attnres_helpers.stats`' types, with scipy's field names (``statistic``, ``pvalue``,
``confidence_interval``): a test is a :class:`~attnres_helpers.stats.CorrelationResult`, a number with its
interval a :class:`~attnres_helpers.stats.BootstrapResult`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import permutation_test

from .configured_analysis import fraction_passed, window_draws
from .configured_store import NLL_BLOCK, ConfiguredStore, nll_mean
from .passkey import FAR_FRACTIONS, KEY_DIGITS, KINDS, NEAR_FRACTIONS
from .paths import CONFIGURATIONS_PLAN_V4
from .stats import (
    BootstrapResult,
    ConfidenceInterval,
    CorrelationResult,
    average_ranks,
    partial_spearman,
    percentile_interval,
    stratified_permutation_test,
)

REACH = {"as-trained": 1.0, "rescaled": 1.0, "remapped": 1.0, "masked": 0.0, "windowed": 0.0}  # every key at 2L
VALIDITY = {"near inside L": 0.5, "ceiling": 0.9, "absent": 0.05}  # the model as trained, windows of L
BROKEN_CEILING = 0.9  # a configuration whose ceiling past L is below this is broken
OUTCOMES = ("NLL rise", "near past L", "far")
EXPECTED_SIGN = {"NLL rise": -1, "near past L": +1, "far": +1}
PRIMARY = "R(2L)"
PREDICTORS = (PRIMARY, "R(2L) sink-free", "drop")
BASELINES = ("NLL ≥ L", "entropy ≥ L", "R(L)", "reach")
RIVALS = ("NLL ≥ L", "entropy ≥ L")
L_KEYS = ("R(L)", "R(L) sink-free", "near at L", "ceiling at L", "absent at L")  # from the windows of L
PERMUTATIONS = 99_999  # orderings counted exactly up to this many (the plan's "at most 100,000": no product of
# factorials lies between), this many sampled beyond


def per_window(store: ConfiguredStore, configuration: str) -> dict[str, np.ndarray]:
    """Each plan quantity of one configuration, one value per window (of L or of 2L as named)."""
    L = store.train_len
    near = {int(round(f * L)) for f in NEAR_FRACTIONS}
    far = {int(round(f * L)) for f in FAR_FRACTIONS}
    out = {}
    for T, tag in ((L, "L"), (2 * L, "2L")):
        entry = store.entry(configuration, T)
        out[f"R({tag})"] = entry.window_r.double().mean(-1).numpy()
        out[f"R({tag}) sink-free"] = entry.window_r_sink_free.double().mean(-1).numpy()
        passed, kinds = entry.passed().numpy(), entry.passkey["kind"].numpy()
        d, at = entry.passkey["distance"].numpy(), entry.passkey["query_at"].numpy()
        trial, ceiling, absent = (kinds == KINDS.index(k) for k in ("trial", "ceiling", "absent"))
        is_near = trial & np.isin(d, list(near))
        if T == L:
            out["near at L"] = fraction_passed(passed, is_near)
            out["ceiling at L"] = fraction_passed(passed, ceiling)
            out["absent at L"] = fraction_passed(passed, absent)
            continue
        out["near past L"] = fraction_passed(passed, is_near & (at >= L))
        out["near inside L"] = fraction_passed(passed, is_near & (at < L))
        out["far"] = fraction_passed(passed, trial & np.isin(d, list(far)))
        out["ceiling past L"] = fraction_passed(passed, ceiling & (at >= L))
        out["ceiling inside L"] = fraction_passed(passed, ceiling & (at < L))
        out["absent"] = fraction_passed(passed, absent)
        out["NLL < L"] = nll_mean(entry, 0, L).numpy()
        out["NLL ≥ L"] = nll_mean(entry, L, 2 * L).numpy()
        out["NLL rise"] = out["NLL ≥ L"] - out["NLL < L"]
        if entry.window_entropy is not None:
            out["entropy ≥ L"] = entry.window_entropy[..., L // NLL_BLOCK :].double().mean((-1, -2)).numpy()
        out["reach"] = np.full(entry.windows, REACH[entry.kind])
    return out


def trials_by_distance(store: ConfiguredStore, configuration: str, T: int) -> list[dict]:
    """Every passkey trial of one (configuration, T), pooled over windows by distance and by where the query
    sits (inside L or past it), with the absent-key control last: ``trials``, ``exact`` (every digit top-1,
    the plan's outcome), ``digits`` (the share of digits top-1, which moves before exact match does) and
    ``logprob`` (the key's mean log-probability, teacher-forced). The absent control's ``digits`` is what
    guessing gives, the floor a retrieval has to clear."""
    entry = store.entry(configuration, T)
    kinds, d = entry.passkey["kind"].numpy(), entry.passkey["distance"].numpy()
    inside = entry.passkey["query_at"].numpy() < store.train_len
    correct, logprob = entry.passkey["correct"].double().numpy(), entry.passkey["logprob"].double().numpy()
    groups = [
        (
            f"d = {dist}",
            "inside L" if where else "past L",
            (kinds == KINDS.index("trial")) & (d == dist) & (inside == where),
        )
        for dist in sorted(set(d[kinds == KINDS.index("trial")].tolist()))
        for where in (True, False)
    ] + [("absent key", "anywhere", kinds == KINDS.index("absent"))]
    return [
        {
            "distance": name,
            "query": where,
            "trials": int(pick.sum()),
            "exact": float((correct[pick] == KEY_DIGITS).mean()),
            "digits": float(correct[pick].mean() / KEY_DIGITS),
            "logprob": float(logprob[pick].mean()),
        }
        for name, where, pick in groups
        if pick.any()
    ]


@dataclass(frozen=True)
class Collected:
    """Per quantity, (configurations, windows) values over the windows every configuration has."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]
    values: dict[str, np.ndarray]

    def windows(self, key: str) -> int:
        return self.values[key].shape[1]

    def means(self, key: str, draws_L: np.ndarray | None = None, draws_2L: np.ndarray | None = None) -> np.ndarray:
        """(C,) window means, or (B, C) over draws of window indices (B, W) of each length; ``drop`` is
        the ratio of the means of R(2L) and R(L)."""
        if key == "drop":
            return self.means("R(2L)", draws_L, draws_2L) / self.means("R(L)", draws_L, draws_2L)
        v = self.values[key]  # (C, W)
        draws = draws_L if key in L_KEYS else draws_2L
        if draws is None:
            return np.nanmean(v, axis=-1)
        return np.nanmean(v[:, draws], axis=-1).T  # (C, B, W) -> (B, C)

    def without(self, dropped: set[str]) -> Collected:
        keep = [i for i, n in enumerate(self.names) if n not in dropped]
        return Collected(
            tuple(self.names[i] for i in keep),
            tuple(self.kinds[i] for i in keep),
            {k: v[keep] for k, v in self.values.items()},
        )


def collect(store: ConfiguredStore) -> Collected:
    """Every configuration measured at both lengths, each quantity cut to the windows all of them have
    (a run under way leaves some a window ahead)."""
    L = store.train_len
    names = []
    for name in store.configurations():
        try:
            store.entry(name, L), store.entry(name, 2 * L)
        except KeyError:
            continue
        names.append(name)
    rows = [per_window(store, n) for n in names]
    keys = [k for k in rows[0] if all(k in r for r in rows)] if rows else []
    values = {k: np.stack([r[k][: min(len(q[k]) for q in rows)] for r in rows]) for k in keys}
    kinds = tuple(store.entry(n, 2 * L).kind or "as-trained" for n in names)
    return Collected(tuple(names), kinds, values)


def _rho_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's ρ of each pair of rows (..., n) (Pearson's r of average ranks); NaN where a row is constant."""
    rx, ry = (r - r.mean(-1, keepdims=True) for r in (average_ranks(x), average_ranks(y)))
    norm = np.sqrt((rx**2).sum(-1) * (ry**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 1e-12, (rx * ry).sum(-1) / np.where(norm > 0, norm, 1), np.nan)


NAN_INTERVAL = ConfidenceInterval(math.nan, math.nan)


def _interval(replicates: np.ndarray, confidence_level: float) -> ConfidenceInterval:
    replicates = replicates[~np.isnan(replicates)]
    if len(replicates) == 0:
        return NAN_INTERVAL
    return percentile_interval(replicates, confidence_level)


def _boot(data: Collected, keys: tuple[str, ...], n_resamples: int, rng: int) -> list[np.ndarray]:
    """(B, C) means of each key over the same window draws (windows of L and of 2L drawn apart)."""
    d_L = window_draws(data.windows("R(L)"), n_resamples, rng)
    d_2L = window_draws(data.windows("R(2L)"), n_resamples, rng + 1)
    return [data.means(k, d_L, d_2L) for k in keys]


def across(
    data: Collected,
    predictor: str,
    outcome: str,
    n_resamples: int = 10_000,
    confidence_level: float = 0.95,
    rng: int = 0,
    permutations: int = PERMUTATIONS,
) -> CorrelationResult:
    """Spearman's ρ of the predictor's and the outcome's window means over the configurations; the
    two-sided p of ``scipy.stats.permutation_test`` (pairings: exact when n! ≤ ``permutations``; its own
    two-sided p, twice the smaller one-sided one, as the plan names it); the window-bootstrap percentile
    interval (resamples where a side is constant left out)."""
    x, y = data.means(predictor), data.means(outcome)
    rho = float(_rho_rows(x, y))
    if math.isnan(rho):
        return CorrelationResult(math.nan, NAN_INTERVAL, len(x), math.nan, predictor, outcome)
    test = permutation_test(
        (x,),
        lambda a, axis=-1: _rho_rows(a, np.broadcast_to(y, a.shape)),
        permutation_type="pairings",
        n_resamples=permutations,
        alternative="two-sided",
        vectorized=True,
        rng=np.random.default_rng(rng),
    )
    xb, yb = _boot(data, (predictor, outcome), n_resamples, rng)
    exact = math.factorial(len(x)) <= permutations
    interval = _interval(_rho_rows(xb, yb), confidence_level)
    return CorrelationResult(rho, interval, len(x), float(test.pvalue), predictor, outcome, exact)


def _within(x: np.ndarray, y: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """The kinds' ρ's averaged with weights n_k over the kinds where both sides vary: (..., C) -> (...)."""
    if not groups:  # no kind of at least 3: nothing to average
        return np.full(np.broadcast_shapes(x.shape, y.shape)[:-1], np.nan)
    rhos = np.stack([_rho_rows(x[..., g], y[..., g]) for g in groups], -1)  # (..., kinds)
    weights = np.array([len(g) for g in groups], dtype=float)
    defined = ~np.isnan(rhos)
    total = (defined * weights).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, np.where(defined, rhos, 0.0) @ weights / np.where(total > 0, total, 1), np.nan)


def _kind_groups(data: Collected) -> list[tuple[str, np.ndarray]]:
    """(kind, indices of its configurations) for each kind of at least 3 configurations, in name order."""
    kinds = sorted({k for k in data.kinds if data.kinds.count(k) >= 3})
    return [(k, np.flatnonzero(np.array(data.kinds) == k)) for k in kinds]


def each_kind(data: Collected, predictor: str, outcome: str) -> dict[str, float]:
    """Spearman's ρ of predictor and outcome inside each kind of at least 3 configurations: the terms that
    :func:`within_kinds` averages (NaN where a side is constant in the kind)."""
    x, y = data.means(predictor), data.means(outcome)
    return {k: float(_rho_rows(x[g], y[g])) for k, g in _kind_groups(data)}


def within_kinds(
    data: Collected,
    predictor: str,
    outcome: str,
    n_resamples: int = 10_000,
    confidence_level: float = 0.95,
    rng: int = 0,
    permutations: int = PERMUTATIONS,
) -> CorrelationResult:
    """Plan v4's primary test: within each kind of at least 3 configurations, Spearman's ρ of predictor
    and outcome; their mean weighted by kind size over the kinds where both vary (``strata``: the kinds
    that entered); the two-sided p from permuting the outcome only within kinds (every ordering when there
    are at most ``permutations``, else that many random ones, p = (1 + #as extreme)/(1 + permutations):
    :func:`attnres_helpers.stats.stratified_permutation_test` of the mean's absolute value); the
    window-bootstrap interval (a kind constant in a resample drops out of that resample's mean)."""
    x, y = data.means(predictor), data.means(outcome)
    groups = [g for _, g in _kind_groups(data)]
    observed = float(_within(x, y, groups))
    entered = tuple(k for k, rho in each_kind(data, predictor, outcome).items() if not math.isnan(rho))
    if math.isnan(observed):
        return CorrelationResult(math.nan, NAN_INTERVAL, len(x), math.nan, predictor, outcome, strata=entered)
    strata = -1 - np.arange(len(y))  # a kind of fewer than 3 is not permuted: each of its points alone
    for i, g in enumerate(groups):
        strata[g] = i
    test = stratified_permutation_test(
        y, lambda a: np.abs(_within(np.broadcast_to(x, a.shape), a, groups)), strata, permutations, rng
    )
    exact = math.prod(math.factorial(len(g)) for g in groups) <= permutations
    xb, yb = _boot(data, (predictor, outcome), n_resamples, rng)
    interval = _interval(_within(xb, yb, groups), confidence_level)
    return CorrelationResult(observed, interval, len(x), test.pvalue, predictor, outcome, exact, entered)


@dataclass(frozen=True)
class HeadToHead:
    """R against a rival predictor for one outcome, on the same window resamples."""

    outcome: str
    rival: str
    difference: BootstrapResult  # |ρ(R, outcome)| − |ρ(rival, outcome)|
    partial: BootstrapResult  # R's partial ρ with the outcome given the rival


def _partial_rows(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    r_xy, r_xz, r_yz = _rho_rows(x, y), _rho_rows(x, z), _rho_rows(y, z)
    denominator = (1 - r_xz**2) * (1 - r_yz**2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 1e-12, (r_xy - r_xz * r_yz) / np.sqrt(np.maximum(denominator, 1e-300)), np.nan)


def head_to_head(
    data: Collected,
    outcome: str,
    rival: str,
    predictor: str = PRIMARY,
    n_resamples: int = 10_000,
    confidence_level: float = 0.95,
    rng: int = 0,
) -> HeadToHead:
    """Does ``predictor`` add to ``rival``? The difference of their |ρ| with the outcome and the partial
    ρ given the rival (:func:`stats.partial_spearman`), each with a paired window-bootstrap interval."""
    x, y, z = data.means(predictor), data.means(outcome), data.means(rival)
    difference = abs(float(_rho_rows(x, y))) - abs(float(_rho_rows(z, y)))
    try:
        partial = partial_spearman(x, y, z)
    except ValueError:
        partial = math.nan
    xb, yb, zb = _boot(data, (predictor, outcome, rival), n_resamples, rng)
    diffs = np.abs(_rho_rows(xb, yb)) - np.abs(_rho_rows(zb, yb))
    return HeadToHead(
        outcome,
        rival,
        BootstrapResult(difference, _interval(diffs, confidence_level)),
        BootstrapResult(partial, _interval(_partial_rows(xb, yb, zb), confidence_level)),
    )


def summary(data: Collected, n_resamples: int = 10_000, confidence_level: float = 0.95, rng: int = 0) -> dict:
    """{configuration: {quantity: BootstrapResult}}: each window mean with its window-bootstrap interval (empty
    while no configuration has both lengths)."""
    if not data.names:
        return {}
    out = {name: {} for name in data.names}
    keys = [*data.values, "drop"]
    for key, boot in zip(keys, _boot(data, tuple(keys), n_resamples, rng)):
        point = data.means(key)
        for c, name in enumerate(data.names):
            out[name][key] = BootstrapResult(float(point[c]), _interval(boot[:, c], confidence_level))
    return out


def broken(data: Collected) -> list[str]:
    """The configurations whose ceiling control past L is below :data:`BROKEN_CEILING`."""
    ceiling = data.means("ceiling past L")
    return [n for n, c in zip(data.names, ceiling) if c < BROKEN_CEILING]


def validity(data: Collected) -> tuple[bool, dict[str, float]]:
    """Plan v4's check on the model as trained at T = L: near retrieval ≥ 0.5, ceiling ≥ 0.9, absent ≤ 0.05."""
    i = data.names.index("as-trained")
    got = {k: float(data.means(k)[i]) for k in ("near at L", "ceiling at L", "absent at L")}
    ok = (
        got["near at L"] >= VALIDITY["near inside L"]
        and got["ceiling at L"] >= VALIDITY["ceiling"]
        and got["absent at L"] <= VALIDITY["absent"]
    )
    return ok, got


def verdict(test: CorrelationResult, valid: bool = True, tied_in_every_kind: bool = False) -> str:
    """Plan v4's category for one outcome from its within-kind test."""
    if test.outcome != "NLL rise" and not valid or tied_in_every_kind or math.isnan(test.statistic):
        return "inconclusive"
    low, high = test.confidence_interval
    if test.pvalue < 0.05 and (low > 0 or high < 0):
        return "supports" if np.sign(test.statistic) == EXPECTED_SIGN[test.outcome] else "evidence against"
    return "inconclusive"


def tied_in_every_kind(data: Collected, outcome: str) -> bool:
    y = data.means(outcome)
    return all(np.ptp(y[g]) < 1e-12 for _, g in _kind_groups(data))


def verdicts(data: Collected, n_resamples: int = 10_000, rng: int = 0) -> list[dict]:
    """One row per outcome: the primary's within-kind test and verdict, the same without the broken
    configurations, the across-configuration tests of R and of each baseline, and the head-to-heads."""
    valid, _ = validity(data)
    dropped = set(broken(data))
    rows = []
    for outcome in OUTCOMES:
        within = within_kinds(data, PRIMARY, outcome, n_resamples, rng=rng)
        tied = tied_in_every_kind(data, outcome)
        row = {"outcome": outcome, "within": within, "verdict": verdict(within, valid, tied), "broken": sorted(dropped)}
        if dropped:
            rest = data.without(dropped)
            within_rest = within_kinds(rest, PRIMARY, outcome, n_resamples, rng=rng)
            row["within without broken"] = within_rest
            row["verdict without broken"] = verdict(within_rest, valid, tied_in_every_kind(rest, outcome))
        keys = [k for k in (*PREDICTORS, *BASELINES) if k in data.values or k == "drop"]
        row["across"] = {k: across(data, k, outcome, n_resamples, rng=rng) for k in keys if k != outcome}
        if outcome != "NLL rise":
            row["head to head"] = [head_to_head(data, outcome, r, n_resamples=n_resamples, rng=rng) for r in RIVALS]
        rows.append(row)
    return rows


# what each bullet of the plan's prediction names, in the plan's order
PREDICTED = ("broken", "far", "near past L", "NLL rise", PRIMARY, "tests")


def plan_prediction(plan: Path = CONFIGURATIONS_PLAN_V4) -> list[str]:
    """The bullets of the plan's "Prediction, written before the data", word for word (one line each, code
    marks dropped), one per entry of :data:`PREDICTED`."""
    section = plan.read_text().split("## Prediction, written before the data", 1)[-1].split("\n## ", 1)[0]
    bullets = [" ".join(b.split()).replace("`", "") for b in section.split("\n- ")[1:]]
    if len(bullets) != len(PREDICTED):
        raise ValueError(f"{plan}: {len(bullets)} bullets under its prediction, expected {len(PREDICTED)}")
    return bullets


def _by_kind(data: Collected, key: str) -> str:
    """Each kind's configurations with their window means of ``key``, highest first."""
    means = dict(zip(data.names, data.means(key)))
    parts = []
    for kind in dict.fromkeys(data.kinds):
        names = sorted((n for n, k in zip(data.names, data.kinds) if k == kind), key=lambda n: -means[n])
        parts.append(f"{kind}: " + ", ".join(f"{n} {means[n]:.3g}" for n in names))
    return "; ".join(parts)


def _ranked(data: Collected, key: str, highest_first: bool) -> str:
    means = data.means(key)
    order = np.argsort(-means if highest_first else means, kind="stable")
    return ", ".join(f"{data.names[i]} {means[i]:.3g}" for i in order)


def prediction_rows(data: Collected, verdict_rows: list[dict]) -> list[dict[str, str]]:
    """Plan v4's prediction, item by item (:func:`plan_prediction`, the plan's words), beside what the data show:
    the quantity it names by kind or ranked, and for the tests the verdicts (:func:`verdicts`' rows), |ρ| of
    R(2L) and of the NLL past L across configurations, and the head-to-head intervals. Nothing here
    judges whether a prediction held: its words were not written to be scored, and scoring them now
    would be a rule written after the data."""
    by_outcome = {row["outcome"]: row for row in verdict_rows}
    retrieval = [o for o in ("near past L", "far") if o in by_outcome]
    tests = "; ".join(f"{o}: {row['verdict']}" for o, row in by_outcome.items())
    for o in retrieval:
        row = by_outcome[o]
        r, nll = row["across"][PRIMARY].statistic, row["across"]["NLL ≥ L"].statistic
        h = next(h for h in row["head to head"] if h.rival == "NLL ≥ L").difference
        low, high = h.confidence_interval
        tests += f"; {o} across: |ρ| R(2L) {abs(r):.2f}, NLL ≥ L {abs(nll):.2f}, difference [{low:+.2f}, {high:+.2f}]"
    observed = {
        "broken": "broken (ceiling past L below 0.9): " + (", ".join(broken(data)) or "none"),
        "far": _by_kind(data, "far"),
        "near past L": _by_kind(data, "near past L"),
        "NLL rise": "highest first: " + _ranked(data, "NLL rise", highest_first=True),
        PRIMARY: "lowest first: " + _ranked(data, PRIMARY, highest_first=False),
        "tests": "verdicts within kinds: " + tests,
    }
    return [
        {"prediction (plan v4)": words, "what the data show": observed[key]}
        for key, words in zip(PREDICTED, plan_prediction(), strict=True)
    ]
