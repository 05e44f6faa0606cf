"""The permutation tests of stats.py against closed forms and brute force: exact where the orderings are
at most n_resamples (scipy.stats.permutation_test's rule), sampled beyond, reproducibly; within strata
exact and sampled under the same rules; any number of points. The result types carry scipy's names."""

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from attnres_helpers.stats import (
    PermutationTestResult,
    spearman,
    spearman_permutation_test,
    stratified_permutation_test,
)


def _brute_p(x, y, strata=None):
    """The share of the orderings of y (within strata, if given) with |ρ_b| ≥ |ρ_obs|, one at a time."""
    y = np.asarray(y, float)
    labels = np.zeros(len(y), int) if strata is None else np.asarray(strata)
    groups = [np.flatnonzero(labels == s) for s in np.unique(labels)]
    observed, hits, count = abs(spearman(x, y)), 0, 0
    for choice in itertools.product(*(itertools.permutations(g) for g in groups)):
        permuted = y.copy()
        for members, order in zip(groups, choice):
            permuted[members] = y[list(order)]
        hits += abs(spearman(x, permuted)) >= observed - 1e-12
        count += 1
    return hits / count, count


def test_a_perfectly_ordered_ranking_of_five_has_the_closed_form_exact_p():
    """n = 5 in order: ρ = 1 in 1 of the 5! = 120 orderings (one-sided p = 1/120) and ρ = −1 in one more, so the
    two-sided p is 2/120 = 1/60, every ordering counted (the null distribution holds all 120)."""
    result = spearman_permutation_test([1, 2, 3, 4, 5], [10, 20, 30, 40, 50], n_resamples=10_000)
    assert isinstance(result, PermutationTestResult)
    assert result.statistic == pytest.approx(1.0)
    assert result.pvalue == pytest.approx(2 / 120)
    assert len(result.null_distribution) == 120
    assert np.sum(result.null_distribution >= 1 - 1e-12) == 2  # the one-sided count is 1 of 120 each way
    assert spearman_permutation_test([1, 2, 3, 4, 5], [50, 40, 30, 20, 10]).pvalue == pytest.approx(2 / 120)


@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_the_exact_p_is_scipys_and_brute_forces(n):
    """Every ordering counted for n ≤ 8 (8! = 40,320 ≤ n_resamples): without ties (a symmetric null) scipy's own
    two-sided p over Spearman's ρ, twice the smaller one-sided one; up to n = 6 the brute-force share too."""
    rng = np.random.default_rng(n)
    x = rng.normal(size=n)
    y = 0.7 * x + rng.normal(size=n)
    ours = spearman_permutation_test(x, y, n_resamples=50_000)
    ry = scipy.stats.rankdata(y) - (n + 1) / 2

    def rho(a, axis=-1):  # x has no ties: Pearson's r of the ranks, vectorized over orderings
        ra = scipy.stats.rankdata(a, axis=-1) - (n + 1) / 2
        return ra @ ry / np.sqrt((ra**2).sum(-1) * (ry**2).sum())

    theirs = scipy.stats.permutation_test((x,), rho, permutation_type="pairings", n_resamples=np.inf, vectorized=True)
    assert ours.pvalue == pytest.approx(theirs.pvalue, rel=1e-12)
    assert len(ours.null_distribution) == math.factorial(n)
    if n <= 6:
        assert ours.pvalue == pytest.approx(_brute_p(x, y)[0], rel=1e-12)


def test_ties_are_counted_as_in_brute_force():
    x = [1, 1, 2, 3, 3, 4]
    y = [2, 1, 1, 3, 5, 5]
    assert spearman_permutation_test(x, y).pvalue == pytest.approx(_brute_p(x, y)[0], rel=1e-12)


def test_beyond_n_resamples_it_samples_reproducibly_with_no_cap_on_the_points():
    """12 points (12! > 2,000): 2,000 random orderings, p on the grid (1 + k) / 2,001, the same for the same rng
    (an integer seed or a Generator in that state), and any number of points (the old exact test stopped at 9)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=12)
    y = 0.5 * x + rng.normal(size=12)
    a = spearman_permutation_test(x, y, n_resamples=2000, rng=5)
    b = spearman_permutation_test(x, y, n_resamples=2000, rng=np.random.default_rng(5))
    assert a == b and np.array_equal(a.null_distribution, b.null_distribution) and len(a.null_distribution) == 2000
    k = a.pvalue * 2001 - 1
    assert abs(k - round(k)) < 1e-9 and a.pvalue == (1 + np.sum(a.null_distribution >= abs(a.statistic) - 1e-12)) / 2001
    assert spearman_permutation_test(x, y, n_resamples=2000, rng=6).pvalue != a.pvalue
    big = rng.normal(size=300)
    assert spearman_permutation_test(big, big**3, n_resamples=500).pvalue == 1 / 501


def test_within_strata_only_orderings_inside_each_stratum_are_counted():
    """Strata of sizes 1, 3 and 3: 1·6·6 = 36 orderings, so p ≥ 1/36; one stratum is the plain test; every point
    its own stratum leaves one ordering, the observed, so p = 1."""
    x = [1, 2, 3, 4, 5, 6, 7]
    y = [3, 1, 2, 6, 4, 5, 7]
    strata = ["a", "b", "b", "b", "c", "c", "c"]
    result = spearman_permutation_test(x, y, strata=strata)
    p, orderings = _brute_p(x, y, strata)
    assert orderings == 36 and len(result.null_distribution) == 36
    assert result.pvalue == pytest.approx(p, rel=1e-12) and result.pvalue >= 1 / 36
    assert result.statistic == pytest.approx(spearman(x, y))
    assert spearman_permutation_test(x, y, strata=[0] * 7).pvalue == pytest.approx(
        spearman_permutation_test(x, y).pvalue
    )
    assert spearman_permutation_test(x, y, strata=range(7)).pvalue == 1.0
    with pytest.raises(ValueError, match="one label per point"):
        spearman_permutation_test(x, y, strata=[0, 1])


def test_within_strata_beyond_n_resamples_it_samples_reproducibly_and_never_mixes_strata():
    """Two strata of 10 (10!² orderings): sampled; each resample keeps every stratum's values among its own
    points, so a statistic that sums stratum 0's values never moves, and p = 1 for it."""
    y = np.arange(20.0)
    strata = [0] * 10 + [1] * 10
    first = stratified_permutation_test(y, lambda a: a[..., :10] @ np.arange(10.0), strata, n_resamples=300, rng=2)
    again = stratified_permutation_test(y, lambda a: a[..., :10] @ np.arange(10.0), strata, n_resamples=300, rng=2)
    assert first == again and len(first.null_distribution) == 300
    fixed = stratified_permutation_test(y, lambda a: a[..., :10].sum(-1), strata, n_resamples=300, rng=2)
    assert fixed.pvalue == 1.0 and np.all(fixed.null_distribution == 45.0)
