"""Generic rank statistics, and the design-time R of a trained model's encoding.

- Spearman's ρ with ties at average ranks (:func:`average_ranks`, :func:`spearman`), from
  ``scipy.stats`` (``rankdata``, ``spearmanr``) with this project's input checks.
- A cluster bootstrap over trained settings (:func:`cluster_bootstrap_spearmans`): every cluster,
  with all its points, is drawn with replacement, and the draws are shared between predictors, so
  a difference of two ρ's is resampled as one statistic; :func:`percentile_interval` turns the
  resamples into an interval, and :func:`spearman_cluster_bootstrap` does both for one predictor.
- A two-sided permutation test of ρ (:func:`spearman_permutation_test`: ``scipy.stats.permutation_test``,
  exact where the orderings are few, sampled beyond), with strata the permutation within strata
  (:func:`stratified_permutation_test`, for any statistic); the partial rank correlation given a third
  variable (:func:`partial_spearman`), and the group-mean baseline (:func:`group_mean_baseline`).
- A window bootstrap of a mean (:func:`bootstrap_mean`): the windows of one measurement drawn with
  replacement, the percentile interval of their mean.

Results have one type per kind, with scipy.stats' field names: :class:`BootstrapResult` (a statistic with
its bootstrap ``confidence_interval``, a :class:`ConfidenceInterval` with ``low`` and ``high``),
:class:`PermutationTestResult` (``statistic``, ``pvalue``, ``null_distribution``) and
:class:`CorrelationResult` (a rank correlation with its interval and, where computed, its p).
- :func:`design_resolution`: the design-time (R(L), R(2L)) of a trained model's encoding, from its
  ModelConfig and its entry in :mod:`attnres_helpers.encoding_registry`.

Parameter names follow scipy.stats (``n_resamples``, ``confidence_level``, ``rng``). What scipy lacks
is written here on its ranks: the cluster bootstrap over settings (``scipy.stats.bootstrap`` resamples
points, not clusters) and the permutation within strata (``scipy.stats.permutation_test`` permutes
all points), with scipy's definitions: exact when every ordering is at most ``n_resamples``, else
``n_resamples`` random ones with p = (1 + #as extreme) / (1 + n_resamples). The family
analysis of notebook 05 itself lives in :mod:`attnres_helpers.analysis`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import permutation_test, rankdata, spearmanr

from .encoding_registry import ENCODINGS, design_params
from .encodings import resolution_pair
from .metric import Boundary, HeadMode

# --------------------------------------------------------------------------- Spearman's ρ


def average_ranks(x: ArrayLike) -> np.ndarray:
    """1-based ranks along the last axis, tied values sharing the mean of the ranks they span
    (``scipy.stats.rankdata``, method "average"): rank_i = #{j : x_j < x_i} + (#{j : x_j = x_i} + 1) / 2.
    E.g. [10, 20, 20, 5] -> [2, 3.5, 3.5, 1]."""
    return rankdata(np.asarray(x, dtype=np.float64), axis=-1)


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman's rank correlation ρ of two samples (Spearman 1904).

    ρ = Σ (r_i − r̄)(q_i − q̄) / √(Σ (r_i − r̄)² Σ (q_i − q̄)²), with r, q the average ranks of x
    and y (:func:`average_ranks`), i.e. Pearson's r of the ranks. Without ties this is
    1 − 6 Σ (r_i − q_i)² / (n (n² − 1)). ρ = 1 for any increasing relation, −1 for a decreasing one.
    Undefined (ValueError) for fewer than 3 points, non-finite values, or a constant input.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(f"x and y must be 1-D, got shapes {x.shape} and {y.shape}")
    if len(x) != len(y):
        raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
    if len(x) < 3:
        raise ValueError(f"a rank correlation needs at least 3 points, got {len(x)}")
    for name, values in (("x", x), ("y", y)):
        if not np.isfinite(values).all():
            raise ValueError(f"{name} holds non-finite values (NaN or inf): {values}")
        if np.all(values == values[0]):
            raise ValueError(f"{name} is constant, so its ranks carry no order and Spearman's ρ is undefined")
    return float(np.clip(spearmanr(x, y).statistic, -1.0, 1.0))


def constant_rows(values: np.ndarray) -> np.ndarray:
    """Which rows of ``values (B, n)`` hold one value only: ``(B,)`` bool (a row with a NaN is not constant:
    NaN equals nothing)."""
    return (values == values[:, :1]).all(axis=1)


def spearman_rows(x: ArrayLike, y: ArrayLike) -> np.ndarray:
    """Spearman's ρ of each pair of rows, ``(B, n), (B, n) -> (B,)``: :func:`spearman` of ``x[b]`` and
    ``y[b]`` for every b at once (Pearson's r of the rows' average ranks), for bootstrap resamples.
    Undefined (ValueError) as :func:`spearman` is: fewer than 3 columns, a non-finite value, a constant row.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or x.shape != y.shape:
        raise ValueError(f"x and y must be 2-D of one shape, got shapes {x.shape} and {y.shape}")
    if x.shape[1] < 3:
        raise ValueError(f"a rank correlation needs at least 3 points, got {x.shape[1]}")
    for name, values in (("x", x), ("y", y)):
        if not np.isfinite(values).all():
            raise ValueError(
                f"{name} holds non-finite values (NaN or inf) in {(~np.isfinite(values)).any(1).sum()} rows"
            )
        constant = constant_rows(values)
        if constant.any():
            raise ValueError(f"{name} is constant in {constant.sum()} rows, where Spearman's ρ is undefined")
    rx, ry = (r - r.mean(axis=1, keepdims=True) for r in (average_ranks(x), average_ranks(y)))  # (B, n)
    return np.clip((rx * ry).sum(axis=1) / np.sqrt((rx**2).sum(axis=1) * (ry**2).sum(axis=1)), -1.0, 1.0)


# --------------------------------------------------------------------------- design-time R


def design_resolution(
    encoding: str,
    model: dict,
    L: int,
    bca: bool = False,
    head_mode: HeadMode = "mean-scores",
    boundary: Boundary = "zero",
) -> tuple[float, float]:
    """Design-time (R(L), R(2L)) of a trained model's encoding: its entry's curve and parameters in
    :mod:`attnres_helpers.encoding_registry`, from ``model``, its ModelConfig as a dict (``cfg.to_dict()``).

    With BCA no query sees a key L or more positions back (blocks of L/2), so the 2L profile is
    the L profile followed by e^{s} = 0, and with boundary "zero" R(2L) = R(L) exactly.
    """
    params = design_params(encoding, model)  # a one-line error for an encoding with no entry
    r_L, r_2L = resolution_pair(ENCODINGS[encoding].design_curve, L, head_mode, boundary, **params)
    return (r_L, r_L) if bca else (r_L, r_2L)


# --------------------------------------------------------------------------- cluster bootstrap, permutation, partial ρ


MAX_RESAMPLES = 10**6  # a bound on the draws held at once: 10**9 cluster draws would need about 156 GiB


def _check_resampling(n_resamples, rng, confidence_level=None) -> np.random.Generator:
    """Validate scipy-style resampling arguments; the numpy Generator that ``rng`` names."""
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if n_resamples > MAX_RESAMPLES:
        raise ValueError(f"n_resamples must be at most {MAX_RESAMPLES:,} (the plan uses 10,000), got {n_resamples:,}")
    if confidence_level is not None and not (
        isinstance(confidence_level, (int, float, np.floating))
        and not isinstance(confidence_level, bool)
        and 0 < confidence_level < 1
    ):
        raise ValueError(f"confidence_level must lie in (0, 1), got {confidence_level!r}")
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        return np.random.default_rng(rng)
    raise ValueError(f"rng must be an integer seed, None or a numpy Generator, got {rng!r}")


def _weighted_rank_correlation(x: np.ndarray, y: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Spearman's ρ of every resample, ``(B,)``, where resample b holds ``counts[b, i]`` copies of
    point i (``counts`` (B, n)); equal to :func:`spearman` of the expanded data. The average rank of
    each copy of i is Σ_j m_j [x_j < x_i] + (Σ_j m_j [x_j = x_i] + 1)/2, and ρ is the Pearson r of
    the ranks weighted by m. NaN where a resample's x or y is constant."""
    m = counts.astype(np.float64)
    total = m.sum(axis=1, keepdims=True)  # (B, 1)

    def ranks(v: np.ndarray) -> np.ndarray:
        below = (v[None, :] < v[:, None]).astype(np.float64)  # (n, n): [v_j < v_i] at [i, j]
        tied = (v[None, :] == v[:, None]).astype(np.float64)
        return m @ below.T + (m @ tied.T + 1) / 2  # (B, n)

    def centred(r: np.ndarray) -> np.ndarray:
        return r - (m * r).sum(axis=1, keepdims=True) / total

    rx, ry = centred(ranks(x)), centred(ranks(y))
    present = m > 0
    constant = (np.where(present, x, -np.inf).max(axis=1) == np.where(present, x, np.inf).min(axis=1)) | (
        np.where(present, y, -np.inf).max(axis=1) == np.where(present, y, np.inf).min(axis=1)
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (m * rx * ry).sum(axis=1) / np.sqrt((m * rx**2).sum(axis=1) * (m * ry**2).sum(axis=1))
    rho = np.clip(rho, -1.0, 1.0)
    rho[constant] = np.nan
    return rho


def _cluster_index(x, clusters) -> tuple[np.ndarray, int]:
    """Each point's cluster number (0..k−1, in np.unique's order) and k; clear errors for bad labels."""
    labels = np.asarray(clusters)
    if labels.ndim != 1 or len(labels) != len(x):
        raise ValueError(
            f"clusters must give one label per point: {len(x)} points but clusters has shape {labels.shape}"
        )
    try:
        _, index = np.unique(labels, return_inverse=True)
    except TypeError as err:
        raise ValueError(f"cluster labels must be mutually comparable (one type): {err}") from None
    index = index.reshape(-1)
    k = int(index.max()) + 1
    if k < 2:
        raise ValueError("clusters holds a single cluster; a cluster bootstrap needs at least 2")
    return index, k


def cluster_bootstrap_spearmans(
    xs: Iterable[ArrayLike],
    y: ArrayLike,
    clusters: ArrayLike,
    n_resamples: int = 10000,
    rng: int | np.random.Generator | None = 0,
) -> np.ndarray:
    """Spearman's ρ of each predictor in ``xs`` with y on the *same* cluster-bootstrap resamples:
    ``(n_resamples, len(xs))``, NaN where a resample leaves x or y constant.

    Each resample draws the k distinct cluster labels (sorted, ``np.unique``) k times with
    replacement (``rng.integers(0, k, size=(n_resamples, k))``, all drawn at once) and takes every
    point of each drawn cluster, duplicates kept. Sharing the draws lets a difference of two ρ's be
    resampled as one statistic.
    """
    generator = _check_resampling(n_resamples, rng)
    y = np.asarray(y, dtype=np.float64)
    xs = [np.asarray(x, dtype=np.float64) for x in xs]
    for x in xs:
        spearman(x, y)  # validates: 1-D, same length, >= 3 points, finite, not constant
    index, k = _cluster_index(y, clusters)
    drawn = generator.integers(0, k, size=(n_resamples, k))  # (B, k) cluster draws
    rhos = np.empty((n_resamples, len(xs)))
    chunk = max(1, 2_000_000 // (len(y) + k))
    for start in range(0, n_resamples, chunk):
        block = drawn[start : start + chunk]  # (b, k)
        per_cluster = np.zeros((len(block), k), dtype=np.int64)
        np.add.at(per_cluster, (np.arange(len(block))[:, None], block), 1)  # times each cluster drawn
        for j, x in enumerate(xs):
            rhos[start : start + chunk, j] = _weighted_rank_correlation(x, y, per_cluster[:, index])  # (b, n) counts
    return rhos


class ConfidenceInterval(NamedTuple):
    """A percentile interval, as scipy.stats names it (``low``, ``high``); unpacks as a pair."""

    low: float
    high: float


@dataclass(frozen=True)
class BootstrapResult:
    """A statistic with its bootstrap percentile interval: scipy.stats.bootstrap's fields
    (``confidence_interval``, ``bootstrap_distribution`` where kept) and the statistic itself beside them.
    Prints as ``value [low, high]``."""

    statistic: float
    confidence_interval: ConfidenceInterval
    bootstrap_distribution: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        low, high = self.confidence_interval
        return f"{self.statistic:.4g} [{low:.4g}, {high:.4g}]"


@dataclass(frozen=True)
class PermutationTestResult:
    """A permutation test, with scipy.stats.permutation_test's fields: ``statistic`` (for ρ the signed ρ),
    ``pvalue`` and ``null_distribution`` (the test statistic over the orderings: |ρ| for a two-sided test
    of ρ)."""

    statistic: float
    pvalue: float
    null_distribution: np.ndarray | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class CorrelationResult:
    """A rank correlation over n points (``statistic``: Spearman's ρ, or a mean of ρ's within strata) with its
    bootstrap ``confidence_interval`` and, where computed, its permutation ``pvalue`` (scipy's names);
    ``exact``: the p counts every ordering; ``strata``: the strata that entered a within-strata statistic;
    ``largest_tie``: the most points sharing one outcome value. Prints as ``ρ = … [low, high] (n = …, p = …)``."""

    statistic: float
    confidence_interval: ConfidenceInterval
    n: int
    pvalue: float | None = None
    predictor: str = ""
    outcome: str = ""
    exact: bool = False
    strata: tuple[str, ...] = ()
    largest_tie: int = 1

    @property
    def excludes_zero(self) -> bool:
        low, high = self.confidence_interval
        return low > 0 or high < 0

    def __str__(self) -> str:
        low, high = self.confidence_interval
        p = "" if self.pvalue is None else f", p = {self.pvalue:.3g}"
        return f"ρ = {self.statistic:+.2f} [{low:+.2f}, {high:+.2f}] (n = {self.n}{p})"


def bootstrap_mean(
    per_window: ArrayLike, n_resamples: int = 10_000, confidence_level: float = 0.95, rng: int = 0
) -> BootstrapResult:
    """The mean of ``per_window`` (windows,), one value per window, with the percentile interval of the
    mean over ``n_resamples`` draws of the windows with replacement (kept as ``bootstrap_distribution``)."""
    values = np.asarray(per_window, dtype=np.float64)
    if values.ndim != 1 or len(values) < 2 or not np.isfinite(values).all():
        raise ValueError(f"a window bootstrap needs one finite value per window, at least 2, got shape {values.shape}")
    draws = np.random.default_rng(rng).integers(0, len(values), size=(n_resamples, len(values)))
    boot = values[draws].mean(-1)
    return BootstrapResult(float(values.mean()), percentile_interval(boot, confidence_level, "the mean"), boot)


def percentile_interval(
    replicates: ArrayLike, confidence_level: float = 0.95, what: str = "Spearman's ρ"
) -> ConfidenceInterval:
    """The 100·(1 − c)/2 and 100·(1 + c)/2 percentiles of the defined (non-NaN) replicates; a
    ValueError if more than half are undefined."""
    replicates = np.asarray(replicates, dtype=np.float64)
    kept = replicates[~np.isnan(replicates)]
    if len(kept) < len(replicates) / 2:
        raise ValueError(
            f"in {len(replicates) - len(kept)} of {len(replicates)} cluster-bootstrap resamples x or y "
            f"is constant, so {what} is undefined in more than half of them; too few clusters vary"
        )
    low, high = np.percentile(kept, [50 * (1 - confidence_level), 50 * (1 + confidence_level)])
    return ConfidenceInterval(float(low), float(high))


def spearman_cluster_bootstrap(
    x: ArrayLike,
    y: ArrayLike,
    clusters: ArrayLike,
    n_resamples: int = 10000,
    confidence_level: float = 0.95,
    rng: int | np.random.Generator | None = 0,
) -> BootstrapResult:
    """Spearman's ρ of x and y (:func:`spearman`) and a cluster-bootstrap percentile interval:
    ``BootstrapResult(statistic, confidence_interval, bootstrap_distribution)`` (the ρ_b, NaN where undefined).

    Resamples as :func:`cluster_bootstrap_spearmans` (ties at average ranks); resamples where ρ_b is
    undefined (x or y constant) are dropped, and a ValueError is raised if more than half are.
    [low, high] are the 100·(1 − c)/2 and 100·(1 + c)/2 percentiles of the kept ρ_b,
    c = ``confidence_level``. With every point its own cluster this is the ordinary (point) bootstrap.
    ``rng``: an integer seed, None or a numpy Generator.
    """
    _check_resampling(n_resamples, rng, confidence_level)
    rho = spearman(x, y)
    rhos = cluster_bootstrap_spearmans([x], y, clusters, n_resamples, rng)[:, 0]
    return BootstrapResult(rho, percentile_interval(rhos, confidence_level), rhos)


def spearman_permutation_test(
    x: ArrayLike,
    y: ArrayLike,
    n_resamples: int = 10000,
    rng: int | np.random.Generator | None = 0,
    strata: ArrayLike | None = None,
) -> PermutationTestResult:
    """Spearman's ρ of x and y and its two-sided permutation p: ``PermutationTestResult(statistic, pvalue,
    null_distribution)``, the test statistic |ρ| (p = the share of orderings of y with |ρ_b| ≥ |ρ_obs|).

    Without ``strata`` this is ``scipy.stats.permutation_test(..., permutation_type="pairings",
    alternative="greater")`` on |ρ| with y permuted: exact (p = #as extreme / n!) when n! ≤ ``n_resamples``,
    else ``n_resamples`` random orderings with p = (1 + #as extreme) / (n_resamples + 1), which counts the
    observed data as one of them. With ``strata`` (one label per point), y is permuted only within each
    stratum (e.g. within mask setting, so that the mask's own effect is never broken up), by
    :func:`stratified_permutation_test` under the same rules. Any number of points.
    ``rng``: an integer seed, None or a numpy Generator.
    """
    generator = _check_resampling(n_resamples, rng)
    rho = spearman(x, y)  # validates x, y
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    norm = np.sqrt((rx**2).sum() * (ry**2).sum())

    def abs_rho(permuted: np.ndarray, axis: int = -1) -> np.ndarray:  # (..., n) orderings of y -> (...)
        return np.abs(permuted @ rx / norm)

    if strata is not None:
        return replace(stratified_permutation_test(ry, abs_rho, strata, n_resamples, generator), statistic=rho)
    test = permutation_test(
        (ry,),
        abs_rho,
        permutation_type="pairings",
        vectorized=True,
        n_resamples=n_resamples,
        batch=max(1, 2_000_000 // len(ry)),
        alternative="greater",
        rng=generator,
    )
    return PermutationTestResult(rho, float(test.pvalue), test.null_distribution)


def stratified_permutation_test(
    data: ArrayLike,
    statistic: Callable[[np.ndarray], np.ndarray],
    strata: ArrayLike,
    n_resamples: int = 10000,
    rng: int | np.random.Generator | None = 0,
) -> PermutationTestResult:
    """A permutation test with ``data`` (n,) permuted only among points of one stratum (one label per
    point), what ``scipy.stats.permutation_test`` lacks, under its rules and names: ``statistic`` maps
    orderings (..., n) to (...), larger being more extreme (pass |ρ| for a two-sided test of ρ); every
    ordering when there are at most ``n_resamples`` (p = #{T_b ≥ T_obs} / orderings, the identity among
    them), else ``n_resamples`` random ones (p = (1 + #{T_b ≥ T_obs}) / (1 + n_resamples)), ``T_b ≥ T_obs``
    up to a relative 1e-12 so that ties are not lost to rounding. With strata of sizes 1, 3 and 3 there
    are 1·6·6 = 36 orderings, so an exact p ≥ 1/36. ``statistic`` of the result is T_obs."""
    generator = _check_resampling(n_resamples, rng)
    data = np.asarray(data, dtype=np.float64)
    groups = _strata(strata, len(data))
    observed = float(statistic(data))
    orderings = math.prod(math.factorial(len(g)) for g in groups)
    if orderings <= n_resamples:
        permuted = np.empty((orderings, len(data)))
        for row, choice in enumerate(itertools.product(*(itertools.permutations(g) for g in groups))):
            for members, order in zip(groups, choice):
                permuted[row, members] = data[list(order)]
        null = statistic(permuted)
    else:
        null = np.empty(n_resamples)
        chunk = max(1, 2_000_000 // len(data))
        for start in range(0, n_resamples, chunk):
            b = min(chunk, n_resamples - start)
            permuted = np.empty((b, len(data)))
            for members in groups:  # each stratum's values shuffled among its own points
                permuted[:, members] = generator.permuted(np.broadcast_to(data[members], (b, len(members))), axis=1)
            null[start : start + b] = statistic(permuted)
    extreme = int((null >= observed - abs(observed) * 1e-12).sum())
    pvalue = extreme / orderings if orderings <= n_resamples else (1 + extreme) / (n_resamples + 1)
    return PermutationTestResult(observed, pvalue, null)


def _strata(labels, n: int) -> list[np.ndarray]:
    """The point indices of each stratum, in np.unique's order of the labels."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != n:
        raise ValueError(f"strata must give one label per point: {n} points but strata has shape {labels.shape}")
    return [np.flatnonzero(labels == value) for value in np.unique(labels)]


def partial_spearman(x: ArrayLike, y: ArrayLike, z: ArrayLike) -> float:
    """Partial rank correlation of x and y given z.

    x, y, z are replaced by their average ranks; with r_xy, r_xz, r_yz the Pearson correlations of
    the ranks (Spearman's ρ, :func:`spearman`), the result is
    (r_xy − r_xz r_yz) / √((1 − r_xz²)(1 − r_yz²)). ValueError where it is undefined: invalid or
    constant inputs, or |r_xz| = 1 or |r_yz| = 1 (x or y a monotone function of z).
    """
    x, y, z = (np.asarray(v, dtype=np.float64) for v in (x, y, z))
    if not (x.shape == y.shape == z.shape):
        raise ValueError(f"x, y and z must have the same shape, got {x.shape}, {y.shape} and {z.shape}")
    r_xy, r_xz, r_yz = spearman(x, y), spearman(x, z), spearman(y, z)
    denominator = (1 - r_xz**2) * (1 - r_yz**2)
    if denominator <= 1e-12:
        raise ValueError(
            f"the partial rank correlation is undefined: x or y is a monotone function of z "
            f"(ρ(x, z) = {r_xz:.6g}, ρ(y, z) = {r_yz:.6g})"
        )
    return float(np.clip((r_xy - r_xz * r_yz) / math.sqrt(denominator), -1.0, 1.0))


def group_mean_baseline(outcome: ArrayLike, groups: ArrayLike) -> np.ndarray:
    """The family-mean baseline: b_i = mean{y_j : g_j = g_i}, the in-sample mean of the outcome over
    the points that share i's group label (i itself included), returned per point, shape (n,)."""
    y = np.asarray(outcome, dtype=np.float64)
    labels = np.asarray(groups)
    if y.ndim != 1 or len(y) == 0:
        raise ValueError(f"outcome must be a non-empty 1-D array, got shape {y.shape}")
    if labels.ndim != 1 or len(labels) != len(y):
        raise ValueError(f"groups must give one label per point: {len(y)} outcomes but groups has shape {labels.shape}")
    if not np.isfinite(y).all():
        raise ValueError(f"outcome holds non-finite values (NaN or inf): {y}")
    try:
        _, index = np.unique(labels, return_inverse=True)
    except TypeError as err:
        raise ValueError(f"group labels must be mutually comparable (one type): {err}") from None
    index = index.reshape(-1)
    sums = np.bincount(index, weights=y)
    sizes = np.bincount(index)
    return (sums / sizes)[index]
