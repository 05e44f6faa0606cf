"""The analysis plan of notebook 05 (``data/results/family_plan.md``), run on the family's store.

Does R at 2L rank how much perplexity rises past L, across the trained settings of
``experiments.FAMILY``, and beyond what the BCA switch alone tells? The units that are resampled
are the trained settings (each with all its seeds and its BCA twin); the points that are ranked
are *configurations*, a setting evaluated without or with BCA, at their seed means.

- :func:`family_points`: one :class:`Point` per configuration from the stored ŝ and per-position
  NLL (via :func:`attnres_helpers.store.records`).
- :func:`run_plan`: the plan's test, baselines and within-mask checks (:class:`PlanResult`).
- :func:`verdict`: the plan's "what counts as support", as sentences built from the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Container
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike

from .encoding_registry import ENCODINGS
from .metric import Boundary, HeadMode
from .stats import (
    BootstrapResult,
    CorrelationResult,
    PermutationTestResult,
    cluster_bootstrap_spearmans,
    design_resolution,
    group_mean_baseline,
    partial_spearman,
    percentile_interval,
    spearman,
    spearman_permutation_test,
)
from .store import COPY_GAIN_COLUMNS, Profile, records

PREDICTOR = "R(2L) upper"  # the plan's primary predictor
OUTCOME = "rise 2L"  # the plan's primary outcome
SECONDARY_OUTCOME = "rise 4L"
PLAN_RESAMPLING = {"n_resamples": 10000, "confidence_level": 0.95, "rng": 0}


@dataclass(frozen=True)
class Point:
    """One configuration at its seed means.

    ``setting``: the FAMILY label (the resampled unit); ``family``: its encoding; ``values``: column
    -> seed mean, with columns ``R(2L) upper`` (primary predictor), ``R(2L) mean`` (the paper's layer
    mean), ``R(L) upper``, ``design R(2L)``, ``rise 2L`` and ``rise 4L`` (perplexity past L over
    perplexity before L in the same 2L or 4L windows); ``per_seed``: column -> {seed: value}.
    """

    setting: str
    family: str
    bca: bool
    values: dict
    per_seed: dict = field(repr=False)

    @property
    def name(self) -> str:
        return self.setting + (" +BCA" if self.bca else "")


def _run_values(recs: list[dict], L: int) -> dict:
    """Per-run columns from one run's records at one mask setting (head mode and boundary fixed)."""
    by = {(r["eval_len"], r["layer"]): r for r in recs}
    values = {}
    for key, column in COPY_GAIN_COLUMNS.items():
        gain = next((r.get(key) for r in recs if r.get(key) is not None), None)
        if gain is not None:
            values[column] = gain
    for k, name in ((2, "2L"), (4, "4L")):
        r = by.get((k * L, "mean"))
        if r is not None and r["perplexity_past_L"] is not None:
            values[f"rise {name}"] = r["perplexity_past_L"] / r["perplexity_first_L"]
            values[f"ppl past L {name}"] = r["perplexity_past_L"]
    for (k, layer), column in {
        (2, "upper"): "R(2L) upper",
        (2, "mean"): "R(2L) mean",
        (1, "upper"): "R(L) upper",
    }.items():
        if (k * L, layer) in by:
            values[column] = by[(k * L, layer)]["resolution"]
            if by[(k * L, layer)].get("resolution_sink_free") is not None:
                values[column + " sink-free"] = by[(k * L, layer)]["resolution_sink_free"]
    if "R(2L) upper" in values and values.get("R(L) upper", 0) > 0:
        values["drop upper"] = values["R(2L) upper"] / values["R(L) upper"]
    return values


def _check_family_run(p: Profile) -> None:
    """A family run has a ``config`` label (a string), an ``encoding`` with a design-time curve and its
    ``model`` configuration (a dict); else one error naming the run and the field."""
    config, encoding = p.meta.get("config"), p.meta["encoding"]
    if config is None:
        raise ValueError(f"run {p.run!r} has no 'config' label: not a family store")
    if not isinstance(config, str) or not config:
        raise ValueError(f"run {p.run!r}: config must be a setting's label (a string), got {config!r}")
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise ValueError(f"run {p.run!r}: encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    model = p.meta.get("model")
    if not isinstance(model, dict):  # its design-time curve is read from it
        raise ValueError(f"run {p.run!r}: model must be the run's model configuration (a dict), got {model!r}")


def family_points(
    profiles: list[Profile],
    head_mode: HeadMode = "mean-scores",
    boundary: Boundary = "zero",
    min_seeds: int = 1,
    curves: dict | None = None,
    seeds: Container[int] | None = None,
) -> list[Point]:
    """One :class:`Point` per (setting, BCA) in ``profiles`` (the family store), in store order.

    Runs without a ``config`` label (a string), or whose encoding has no design-time curve, are refused
    before anything is computed; configurations with fewer than ``min_seeds`` seeds are left out;
    ``seeds``: only these seeds (None: all). With ``curves`` (the store's copy probe,
    :func:`store.load_curves`) the points gain ``copy past L`` and ``copy within L``.
    """
    if not profiles:
        raise ValueError("no profiles: train the family first (python -m attnres_helpers family-v2)")
    if seeds is not None:
        profiles = [p for p in profiles if p.meta["seed"] in seeds]
    for p in profiles:
        _check_family_run(p)
    recs = [
        r for r in records(profiles, boundary, head_modes=(head_mode,), curves=curves) if isinstance(r["layer"], str)
    ]
    groups: dict[tuple[str, bool], dict[int, list[dict]]] = {}
    for r in recs:
        groups.setdefault((r["config"], r["bca"]), {}).setdefault(r["seed"], []).append(r)
    points = []
    for (setting, bca), seeds in groups.items():
        if len(seeds) < min_seeds:
            continue
        first = next(iter(seeds.values()))[0]
        per_seed: dict[str, dict[int, float]] = {}
        for seed, run_recs in seeds.items():
            for column, value in _run_values(run_recs, first["train_len"]).items():
                per_seed.setdefault(column, {})[seed] = value
        design = design_resolution(first["encoding"], first["model"], first["train_len"], bca, head_mode, boundary)[1]
        values = {column: float(np.mean(list(v.values()))) for column, v in per_seed.items()}
        points.append(Point(setting, first["encoding"], bca, {**values, "design R(2L)": design}, per_seed))
    return points


def extra_seed_points(
    profiles: list[Profile],
    extra_seeds: Collection[int],
    curves: dict | None = None,
    seeds: Collection[int] | None = None,
) -> tuple[list[Point], list[str]]:
    """Plan v2's labelled secondary analysis: the points of :func:`family_points`, each configuration the
    mean of ``seeds`` (None: ``V2_SEEDS``) and ``extra_seeds`` where its setting has all of them, else
    of ``seeds`` alone; and the settings that have them all (sorted). Never the primary analysis, which
    takes ``seeds`` only."""
    seeds = V2_SEEDS if seeds is None else seeds
    have: dict[str, set[int]] = {}
    for p in profiles:
        have.setdefault(p.meta.get("config"), set()).add(p.meta["seed"])
    full = sorted(s for s, got in have.items() if s is not None and set(seeds) | set(extra_seeds) <= got)
    kept = [
        p
        for p in profiles
        if p.meta["seed"] in seeds or (p.meta["seed"] in extra_seeds and p.meta.get("config") in full)
    ]
    return family_points(kept, curves=curves), full


def column(points: list[Point], name: str) -> np.ndarray:
    """One column over the points; a clear error if some point lacks it."""
    missing = [p.name for p in points if name not in p.values]
    if missing:
        raise ValueError(f"column {name!r} is missing for {', '.join(missing)}")
    return np.array([p.values[name] for p in points], dtype=np.float64)


def bca_indicator(points: list[Point]) -> np.ndarray:
    return np.array([float(p.bca) for p in points])


def _cluster_correlations(
    predictors: dict[str, np.ndarray], outcome: np.ndarray, clusters, n_resamples: int, confidence_level: float, rng
) -> tuple[dict[str, CorrelationResult], np.ndarray]:
    """:class:`~attnres_helpers.stats.CorrelationResult` of each predictor with the outcome (ρ with its
    cluster-bootstrap interval over settings), and the replicates (n_resamples, predictors)."""
    names = list(predictors)
    reps = cluster_bootstrap_spearmans([predictors[k] for k in names], outcome, clusters, n_resamples, rng)
    return {
        k: CorrelationResult(
            spearman(predictors[k], outcome), percentile_interval(reps[:, j], confidence_level), len(outcome)
        )
        for j, k in enumerate(names)
    }, reps


def cluster_correlations(
    predictors: dict[str, np.ndarray],
    outcome: np.ndarray,
    clusters: ArrayLike,
    n_resamples: int = 10000,
    confidence_level: float = 0.95,
    rng: int | np.random.Generator | None = 0,
) -> dict[str, CorrelationResult]:
    """:class:`~attnres_helpers.stats.CorrelationResult` of each predictor with the outcome, all on the same
    cluster resamples."""
    return _cluster_correlations(predictors, outcome, clusters, n_resamples, confidence_level, rng)[0]


def subset_correlation(
    sub: list[Point],
    predictor: str,
    outcome: str,
    n_resamples: int = 10000,
    confidence_level: float = 0.95,
    rng: int | np.random.Generator | None = 0,
) -> CorrelationResult:
    """ρ of ``predictor`` with ``outcome`` over the points ``sub`` (one mask setting, one family), with its
    cluster-bootstrap interval over their settings."""
    return cluster_correlations(
        {predictor: column(sub, predictor)},
        column(sub, outcome),
        [p.setting for p in sub],
        n_resamples,
        confidence_level,
        rng,
    )[predictor]


@dataclass(frozen=True)
class PlanResult:
    """Everything the plan asks for, for one outcome."""

    outcome: str
    primary: CorrelationResult  # with the permutation p-value
    baselines: dict[str, CorrelationResult]  # name -> ρ with the outcome (same resamples as the primary)
    within: dict[bool, CorrelationResult]  # BCA off / on -> ρ of the primary predictor within that setting
    partial_given_bca: float
    beats_bca: BootstrapResult  # |ρ_R| − |ρ_BCA| and its interval
    settings: int
    seeds: dict[str, int]  # configuration name -> seeds


def run_plan(
    points: list[Point],
    outcome: str = OUTCOME,
    predictor: str = PREDICTOR,
    n_resamples: int = 10000,
    confidence_level: float = 0.95,
    rng: int | np.random.Generator | None = 0,
) -> PlanResult:
    """The plan's test of ``predictor`` against ``outcome`` over the configurations in ``points``.

    - primary: Spearman's ρ, cluster-bootstrap interval over settings, two-sided permutation p;
    - baselines on the same resamples: the BCA indicator, the in-sample family mean of the outcome,
      the family + BCA mean, design-time R(2L) and the layer-mean R(2L);
    - within BCA off and within BCA on: ρ with its own cluster interval; the partial ρ given BCA;
    - |ρ_R| − |ρ_BCA| with its interval (resampled together).
    """
    y, settings = column(points, outcome), [p.setting for p in points]
    families = np.array([p.family for p in points])
    bca = bca_indicator(points)
    predictors = {
        predictor: column(points, predictor),
        "BCA indicator": bca,
        "family mean": group_mean_baseline(y, families),
        "family + BCA mean": group_mean_baseline(y, np.char.add(families, np.where(bca > 0, " +BCA", ""))),
        "design R(2L)": column(points, "design R(2L)"),
        "R(2L) mean": column(points, "R(2L) mean"),
    }
    common = {"n_resamples": n_resamples, "rng": rng}
    cors, reps = _cluster_correlations(predictors, y, settings, n_resamples, confidence_level, rng)
    test = spearman_permutation_test(predictors[predictor], y, **common)
    primary = replace(cors.pop(predictor), pvalue=test.pvalue)
    diff = np.abs(reps[:, 0]) - np.abs(reps[:, 1])  # columns in the order of `predictors`: R, then BCA
    beats = BootstrapResult(
        abs(primary.statistic) - abs(cors["BCA indicator"].statistic), percentile_interval(diff, confidence_level)
    )
    within = {
        flag: subset_correlation(
            [p for p in points if p.bca == flag], predictor, outcome, confidence_level=confidence_level, **common
        )
        for flag in (False, True)
    }
    return PlanResult(
        outcome,
        primary,
        cors,
        within,
        partial_spearman(predictors[predictor], y, bca),
        beats,
        len(set(settings)),
        {p.name: len(p.per_seed.get(outcome, {})) for p in points},
    )


SUPPORT = "R predicts, beyond the mask"
MASK_ONLY = "R tracks the mask, no evidence beyond it"
NO_SUPPORT = "no support"
MIXED = "mixed: the pooled test holds, and only within BCA on is there evidence"


def verdict(result: PlanResult) -> tuple[str, list[str]]:
    """The plan's category for ``result`` and the sentences that say why, built from its numbers.

    Categories (family_plan.md, "What counts as support"): :data:`SUPPORT` (pooled ρ < 0 with its
    interval excluding 0 and p < 0.05, and ρ within BCA off < 0 with its interval excluding 0);
    :data:`MASK_ONLY` (the pooled test holds but neither within-mask interval excludes 0, or they
    disagree in sign); :data:`NO_SUPPORT` (the pooled interval includes 0, p ≥ 0.05, or ρ ≥ 0). A
    case the plan did not name (pooled holds, within-off does not, within-on does) is :data:`MIXED`.
    """
    pr, off, on = result.primary, result.within[False], result.within[True]
    pooled = pr.statistic < 0 and pr.confidence_interval.high < 0 and pr.pvalue is not None and pr.pvalue < 0.05
    lines = [f"Pooled over {pr.n} configurations of {result.settings} trained settings: {pr}."]
    lines.append(f"Within BCA off: {off}. Within BCA on: {on}. Partial ρ given BCA: {result.partial_given_bca:+.2f}.")
    if not pooled:
        category = NO_SUPPORT
        why = (
            "ρ is not negative"
            if pr.statistic >= 0
            else "its interval includes 0"
            if not pr.confidence_interval.high < 0
            else f"p = {pr.pvalue:.3g} ≥ 0.05"
        )
        lines.append(f"The pooled test fails ({why}).")
    elif off.statistic < 0 and off.confidence_interval.high < 0:
        category = SUPPORT
        lines.append("The pooled test holds, and within BCA off R still ranks the rise with an interval below 0.")
    elif (not off.excludes_zero and not on.excludes_zero) or (np.sign(off.statistic) != np.sign(on.statistic)):
        category = MASK_ONLY
        lines.append(
            "The pooled test holds, but neither within-mask interval excludes 0 (or their signs differ): "
            "R separates the masks, with no evidence that it ranks configurations beyond them."
        )
    else:
        category = MIXED
        lines.append(
            "The pooled test holds; within BCA off the interval includes 0, within BCA on it does not. "
            "The plan names no such case; it is reported as mixed."
        )
    bca = result.baselines["BCA indicator"]
    d, (lo, hi) = result.beats_bca.statistic, result.beats_bca.confidence_interval
    beats = lo > 0
    lines.append(
        f"The BCA indicator alone: {bca}. |ρ_R| − |ρ_BCA| = {d:+.2f} [{lo:+.2f}, {hi:+.2f}]: R "
        + ("beats the indicator." if beats else "does not beat the indicator.")
    )
    return category, lines


# ---------------------------------------------------------------------------------------------- plan v2

V2_PLAN = "data/results/family_plan_v2.md"
V2_PREDICTOR = "R(2L) upper"
V2_SECONDARY_PREDICTORS = ("drop upper", "R(2L) mean", "design R(2L)")
V2_OUTCOMES = {"rise 2L": -1, "copy past L": +1}  # outcome -> the sign of ρ(R, outcome) that supports R
V2_SEEDS = (0, 1, 2)  # the primary analysis (seeds 3 and 4 enter a labelled secondary one only)
WITHIN_FAMILIES = ("rope", "xpos", "alibi")  # families with at least 4 settings
PREDICTS = "R predicts, beyond the mask"
TRACKS_MASK = "R tracks the mask; inconclusive beyond it"
INCONCLUSIVE = "inconclusive"
AGAINST = "evidence against"
UNNAMED = "a case the plan does not name"


@dataclass(frozen=True)
class V2Result:
    """One predictor against one outcome under plan v2 (every interval on the same cluster resamples)."""

    predictor: str
    outcome: str
    sign: int  # the sign of ρ that supports R
    bca_off_only: bool  # the copy outcome's primary test is over the BCA-off configurations only
    primary: CorrelationResult  # pvalue: the permutation within mask setting (for BCA off only: plain)
    unrestricted: PermutationTestResult  # the permutation over all points, printed beside it
    within: dict  # mask setting -> CorrelationResult (pooled tests only)
    within_family: dict  # family -> CorrelationResult over its BCA-off settings
    partial_given_bca: float | None
    baselines: dict  # name -> CorrelationResult with the outcome
    beats_bca: BootstrapResult | None  # |ρ_R| − |ρ_BCA| and its interval (pooled tests only)
    settings: int


def _supports(c: CorrelationResult, sign: int) -> bool:
    return (c.confidence_interval.low > 0) if sign > 0 else (c.confidence_interval.high < 0)


def _against(c: CorrelationResult, sign: int) -> bool:
    return (c.confidence_interval.high < 0) if sign > 0 else (c.confidence_interval.low > 0)


def evaluate_v2(
    points: list[Point],
    predictor: str,
    outcome: str,
    n_resamples: int = 10000,
    confidence_level: float = 0.95,
    rng: int | np.random.Generator | None = 0,
    bca_off_only: bool | None = None,
    sign: int | None = None,
) -> V2Result:
    """Plan v2's test of ``predictor`` against ``outcome``: Spearman's ρ, a cluster-bootstrap interval over
    trained settings, the permutation p within mask setting (the unrestricted one beside it), ρ within
    each mask setting and within each family of WITHIN_FAMILIES (BCA off), the partial ρ given BCA, and
    the baselines (BCA indicator, family mean, family + BCA mean, and the other predictors) on the same
    resamples. ``bca_off_only`` (default: for the copy outcome) restricts the test to BCA off; ``sign`` (the
    sign of ρ that supports R) defaults to the outcome's in V2_OUTCOMES, and is needed for any other outcome."""
    if sign is None and outcome not in V2_OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of plan v2's {sorted(V2_OUTCOMES)}: give its sign")
    sign = V2_OUTCOMES[outcome] if sign is None else sign
    bca_off_only = outcome == "copy past L" if bca_off_only is None else bca_off_only
    pts = [p for p in points if not p.bca] if bca_off_only else list(points)
    y, settings = column(pts, outcome), [p.setting for p in pts]
    families = np.array([p.family for p in pts])
    bca = bca_indicator(pts)
    predictors = {predictor: column(pts, predictor)}
    for other in (V2_PREDICTOR, *V2_SECONDARY_PREDICTORS):
        if other != predictor:
            predictors[other] = column(pts, other)
    predictors["family mean"] = group_mean_baseline(y, families)
    if not bca_off_only:
        predictors["BCA indicator"] = bca
        predictors["family + BCA mean"] = group_mean_baseline(y, np.char.add(families, np.where(bca > 0, " +BCA", "")))
    # a baseline that is constant over these points (one family only) ranks nothing: left out
    predictors = {k: v for k, v in predictors.items() if k == predictor or np.ptp(v) > 0}
    common = {"n_resamples": n_resamples, "rng": rng}
    cors, reps = _cluster_correlations(predictors, y, settings, n_resamples, confidence_level, rng)
    strata = None if bca_off_only else bca
    within_strata = spearman_permutation_test(predictors[predictor], y, strata=strata, **common)
    unrestricted = spearman_permutation_test(predictors[predictor], y, **common)
    primary = replace(cors.pop(predictor), pvalue=within_strata.pvalue)
    within, beats, partial = {}, None, None
    if not bca_off_only:
        names = list(predictors)
        diff = np.abs(reps[:, 0]) - np.abs(reps[:, names.index("BCA indicator")])
        beats = BootstrapResult(
            abs(primary.statistic) - abs(cors["BCA indicator"].statistic), percentile_interval(diff, confidence_level)
        )
        partial = partial_spearman(predictors[predictor], y, bca)
        for flag in (False, True):
            sub = [p for p in pts if p.bca == flag]
            within[flag] = subset_correlation(sub, predictor, outcome, confidence_level=confidence_level, **common)
    within_family = {}
    for family in WITHIN_FAMILIES:
        sub = [p for p in pts if p.family == family and not p.bca]
        if len(sub) >= 4:
            within_family[family] = subset_correlation(
                sub, predictor, outcome, confidence_level=confidence_level, **common
            )
    return V2Result(
        predictor,
        outcome,
        sign,
        bca_off_only,
        primary,
        unrestricted,
        within,
        within_family,
        partial,
        cors,
        beats,
        len(set(settings)),
    )


def verdict_v2(result: V2Result) -> tuple[str, list[str]]:
    """Plan v2's category for ``result`` (with its predicted sign) and the sentences that say why."""
    pr, sign = result.primary, result.sign
    side = "above" if sign > 0 else "below"
    where = "over the BCA-off configurations" if result.bca_off_only else "pooled over both mask settings"
    lines = [
        f"{result.predictor} against {result.outcome}, {where} ({result.settings} trained settings): {pr}; "
        f"the unrestricted permutation p = {result.unrestricted.pvalue:.3g} (labelled; the plan's p is "
        f"{'plain' if result.bca_off_only else 'within mask setting'}). Support needs ρ {side} 0."
    ]
    holds = _supports(pr, sign) and pr.pvalue is not None and pr.pvalue < 0.05
    if _against(pr, sign):
        category = AGAINST
        lines.append(
            f"The interval excludes 0 on the wrong side: higher R goes with a {'smaller' if sign > 0 else 'larger'} "
            f"{result.outcome} here."
        )
    elif not holds:
        category = INCONCLUSIVE
        why = "its interval crosses 0" if not _supports(pr, sign) else f"p = {pr.pvalue:.3g} ≥ 0.05"
        lines.append(f"The primary test does not hold ({why}).")
    elif result.bca_off_only:
        category = PREDICTS
        lines.append("The primary test holds: within BCA off, R ranks the outcome with an interval excluding 0.")
    else:
        off = result.within[False]
        lines.append(
            f"Within BCA off: {off}. Within BCA on: {result.within[True]}. "
            f"Partial ρ given BCA: {result.partial_given_bca:+.2f}."
        )
        if _supports(off, sign):
            category = PREDICTS
            lines.append(
                "The pooled test holds, and within BCA off R still ranks the outcome with an interval excluding 0."
            )
        elif _against(off, sign):
            category = UNNAMED
            lines.append("The pooled test holds, but within BCA off the interval excludes 0 on the wrong side.")
        else:
            category = TRACKS_MASK
            lines.append(
                "The pooled test holds, but within BCA off the interval crosses 0: no evidence beyond the mask."
            )
    if result.beats_bca is not None:
        d, (lo, hi) = result.beats_bca.statistic, result.beats_bca.confidence_interval
        bca = result.baselines["BCA indicator"]
        lines.append(
            f"The BCA indicator alone: {bca}. |ρ_R| − |ρ_BCA| = {d:+.2f} [{lo:+.2f}, {hi:+.2f}]: R "
            + ("beats the indicator." if lo > 0 else "does not beat the indicator.")
        )
    if "family mean" in result.baselines:
        lines.append(f"The family-mean baseline: {result.baselines['family mean']}.")
    return category, lines


def base_bound(L_context: int) -> float:
    """Men et al. 2024's minimum RoPE base for a context of ``L_context`` tokens: 0.0424 · C^1.628."""
    return 0.0424 * L_context**1.628


def base_bound_table(points: list[Point], L: int, outcomes: Collection[str] = tuple(V2_OUTCOMES)) -> list[dict]:
    """For each RoPE setting (BCA off): its base, log(base / base_min(2L)), the bound's categorical
    prediction (keeps the 2L context when base >= base_min(2L)) and the observed outcomes."""
    rows = []
    for p in points:
        if p.family != "rope" or p.bca:
            continue
        base = float(p.setting.rsplit(" ", 1)[-1])
        rows.append(
            {
                "setting": p.setting,
                "base": base,
                "log base / bound": math.log(base / base_bound(2 * L)),
                "predicted to keep 2L": base >= base_bound(2 * L),
                **{o: p.values.get(o) for o in outcomes},
            }
        )
    return sorted(rows, key=lambda r: r["base"])


def regime_check(points: list[Point], rope: str = "rope base 10000", alibi: str = "alibi slopes x1") -> dict:
    """Plan v2's regime check: per seed, is RoPE's perplexity past L (same 2L windows, BCA off) above
    ALiBi's? ``{"seeds": {seed: (rope, alibi)}, "worse": n, "of": m, "holds": n >= 2, "state": ...}``,
    the state "holds" (worse in at least 2 of the plan's 3 seeds), "does not hold" (not worse in 2) or
    "undecided" (too few seeds measured yet to say either)."""
    by = {p.setting: p for p in points if not p.bca}
    if rope not in by or alibi not in by:
        raise ValueError(f"the regime check needs {rope!r} and {alibi!r} without BCA")
    a, b = by[rope].per_seed["ppl past L 2L"], by[alibi].per_seed["ppl past L 2L"]
    seeds = {s: (a[s], b[s]) for s in sorted(set(a) & set(b))}
    worse = sum(x > y for x, y in seeds.values())
    state = "holds" if worse >= 2 else "does not hold" if len(seeds) - worse >= 2 else "undecided"
    return {"seeds": seeds, "worse": worse, "of": len(seeds), "holds": worse >= 2, "state": state}
