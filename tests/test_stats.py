"""Rank statistics of stats.py: average ranks and Spearman's ρ, and the design-time R of a trained model."""

import math

import numpy as np
import pytest

from attnres_helpers.encoding_registry import design_params
from attnres_helpers.encodings import resolution_pair
from attnres_helpers.model import preset
from attnres_helpers.stats import (
    average_ranks,
    design_resolution,
    group_mean_baseline,
    partial_spearman,
    spearman,
    spearman_cluster_bootstrap,
    spearman_permutation_test,
    spearman_rows,
)

L = 8


# --------------------------------------------------------------------------- Spearman


def test_average_ranks_share_tied_ranks():
    assert average_ranks([10, 20, 20, 5]).tolist() == [2, 3.5, 3.5, 1]
    assert average_ranks([[3, 3, 3], [1, 2, 0]]).tolist() == [[2, 2, 2], [2, 3, 1]]


def test_spearman_monotone_relations_are_plus_and_minus_one():
    x = np.array([0.1, 0.5, 2.0, 3.0, 9.0, 11.0])
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)  # any increasing map, however curved
    assert spearman(x, -(x**3)) == pytest.approx(-1.0)
    assert spearman(x, x[::-1]) == pytest.approx(-1.0)


def test_spearman_hand_worked_examples():
    # No ties: d = rank differences (0, −1, 1, −1, 1), Σd² = 4, ρ = 1 − 6·4 / (5·(25 − 1)) = 0.8.
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 5, 4]) == pytest.approx(0.8)
    # One tie: y = (2, 1, 4, 4, 5) has ranks (2, 1, 3.5, 3.5, 5); centred x ranks (−2, −1, 0, 1, 2),
    # centred y ranks (−1, −2, .5, .5, 2): Σ products 8.5, Σx² 10, Σy² 9.5, ρ = 8.5 / √95 ≈ 0.8721.
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 4, 5]) == pytest.approx(8.5 / math.sqrt(95))
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 4, 5]) == pytest.approx(0.87208, abs=1e-5)


def test_spearman_is_symmetric_and_rank_invariant():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=12), rng.normal(size=12)
    assert spearman(x, y) == pytest.approx(spearman(y, x))
    assert spearman(x, y) == pytest.approx(spearman(np.exp(x), 3 * y - 1))


@pytest.mark.parametrize(
    "x, y, message",
    [
        ([1, 2], [2, 1], "at least 3"),
        ([1, 2, 3], [1, 2], "same length"),
        ([1, 2, float("nan")], [1, 2, 3], "non-finite"),
        ([1, 2, 3], [1, float("inf"), 3], "non-finite"),
        ([2, 2, 2], [1, 2, 3], "constant"),
        ([1, 2, 3], [5, 5, 5], "constant"),
        ([[1, 2, 3]], [[1, 2, 3]], "1-D"),
    ],
)
def test_spearman_bad_input(x, y, message):
    with pytest.raises(ValueError, match=message):
        spearman(x, y)


def test_spearman_rows_is_spearman_of_every_row_ties_included():
    """Rows drawn from a few values, so that most rows hold ties (as bootstrap means of passkey accuracies do)."""
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 3, size=(400, 6)).astype(float), rng.integers(0, 4, size=(400, 6)).astype(float)
    rows = ~(x == x[:, :1]).all(1) & ~(y == y[:, :1]).all(1)
    x, y = x[rows], y[rows]
    expected = np.array([spearman(a, b) for a, b in zip(x, y)])
    np.testing.assert_allclose(spearman_rows(x, y), expected, rtol=0, atol=1e-12)
    assert spearman_rows(np.empty((0, 4)), np.empty((0, 4))).shape == (0,)


@pytest.mark.parametrize(
    "x, y, message",
    [
        ([[1, 2], [1, 2]], [[2, 1], [2, 1]], "at least 3"),
        ([1, 2, 3], [1, 2, 3], "2-D of one shape"),
        ([[1, 2, 3]], [[1, 2, 3], [1, 2, 3]], "2-D of one shape"),
        ([[1, 2, float("nan")]], [[1, 2, 3]], "non-finite values .* in 1 rows"),
        ([[1, 2, 3], [4, 4, 4]], [[1, 2, 3], [1, 2, 3]], "x is constant in 1 rows"),
    ],
)
def test_spearman_rows_bad_input(x, y, message):
    with pytest.raises(ValueError, match=message):
        spearman_rows(x, y)


# --------------------------------------------------------------------------- design-time R


def test_design_resolution_follows_the_model():
    models = {e: preset("default", encoding=e, xpos_scale_base=32.0).to_dict() for e in ("rope", "alibi", "sinusoidal")}
    expected = resolution_pair("rope", L, "mean-R", head_dim=32, base=10000.0, scale=math.sqrt(32))
    assert design_resolution("rope", models["rope"], L, head_mode="mean-R") == pytest.approx(expected)
    assert design_resolution("alibi", models["alibi"], L, head_mode="mean-R")[0] == pytest.approx(
        resolution_pair("alibi", L, "mean-R", heads=4, scale=1.0)[0]
    )
    assert design_resolution("sinusoidal", models["sinusoidal"], L, head_mode="mean-R") == pytest.approx(
        resolution_pair("sinusoidal", L, "mean-R")
    )  # registry defaults


def test_design_params():
    model = preset("default", encoding="xpos", rope_base=1000.0, xpos_scale_base=32.0, xpos_gamma=0.1).to_dict()
    assert design_params("xpos", model) == {
        "head_dim": 32,
        "base": 1000.0,
        "scale": math.sqrt(32),
        "gamma": 0.1,
        "scale_base": 32,
    }
    assert design_params("alibi", preset("default", alibi_slope_scale=2.0).to_dict()) == {"heads": 4, "scale": 2.0}
    assert design_params("nope", model) == {}
    with pytest.raises(ValueError, match="whole number"):
        design_params("xpos", {**model, "xpos_scale_base": 32.5})
    # a learned bias at its initialisation (plan v2): T5's zero table is NoPE's flat curve, KERPLE's p = a = 1
    assert design_params("t5", model) == {} and design_params("kerple", model) == {"p": 1.0, "a": 1.0}
    assert design_resolution("t5", model, L) == design_resolution("nope", model, L)
    with pytest.raises(ValueError, match="no design-time curve"):
        design_params("fire", model)
    # BCA: the 2L profile is the L profile with nothing past it.
    assert design_resolution("rope", model, L, bca=True) == (design_resolution("rope", model, L)[0],) * 2


# ---------------------------------------- cluster bootstrap, permutation test, partial ρ, group-mean baseline


def _brute_cluster_bootstrap(x, y, clusters, n_resamples, seed, confidence_level=0.95):
    """Reference: expand each resample explicitly (same draws as the documented procedure)."""
    labels, index = np.unique(clusters, return_inverse=True)
    drawn = np.random.default_rng(seed).integers(0, len(labels), size=(n_resamples, len(labels)))
    rhos = []
    for row in drawn:
        chosen = np.concatenate([np.flatnonzero(index == c) for c in row])
        try:
            rhos.append(spearman(x[chosen], y[chosen]))
        except ValueError:  # constant resample: dropped
            pass
    return np.percentile(rhos, [50 * (1 - confidence_level), 50 * (1 + confidence_level)])


# --------------------------------------------------------------------------- cluster bootstrap


def _unpack(result):
    """(statistic, (low, high)) of a BootstrapResult."""
    return result.statistic, tuple(result.confidence_interval)


def test_monotone_data_give_rho_one_and_a_degenerate_interval():
    x = np.array([0.3, 1.0, 2.5, 4.0, 7.0, 8.5, 11.0, 20.0])
    clusters = [0, 0, 1, 1, 2, 2, 3, 3]
    for y, c, rho in ((x**3, clusters, 1.0), (-np.exp(x), clusters, -1.0), (x, np.arange(8), 1.0)):
        result = spearman_cluster_bootstrap(x, y, c, n_resamples=500)
        assert (result.statistic, *result.confidence_interval) == pytest.approx((rho, rho, rho))
        assert result.bootstrap_distribution.shape == (500,)


def test_matches_explicit_expansion_of_each_resample():
    rng = np.random.default_rng(2)
    x = np.round(rng.normal(size=15), 1)  # rounding makes ties
    y = np.round(x + rng.normal(size=15), 1)
    clusters = rng.integers(0, 5, size=15)
    rho, (low, high) = _unpack(spearman_cluster_bootstrap(x, y, clusters, n_resamples=300, rng=7))
    assert rho == spearman(x, y)
    assert [low, high] == pytest.approx(_brute_cluster_bootstrap(x, y, clusters, 300, 7), abs=1e-12)


def test_same_generator_state_and_int_seed_agree():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=12), rng.normal(size=12)
    clusters = np.repeat(["a", "b", "c", "d"], 3)
    by_seed = spearman_cluster_bootstrap(x, y, clusters, n_resamples=300, rng=11)
    by_generator = spearman_cluster_bootstrap(x, y, clusters, n_resamples=300, rng=np.random.default_rng(11))
    assert by_seed == by_generator


def test_singleton_clusters_are_the_point_bootstrap_and_duplicated_pairs_are_not():
    rng = np.random.default_rng(5)
    x = rng.normal(size=20)
    y = x + rng.normal(scale=1.0, size=20)
    rho, (low, high) = _unpack(spearman_cluster_bootstrap(x, y, np.arange(20), n_resamples=2000, rng=3))
    assert low <= rho <= high
    # every point duplicated, the two copies one cluster: the draws are the same as for the
    # singleton bootstrap of the original data and the duplicated sample's ρ equals the original's
    x2, y2, pairs = np.repeat(x, 2), np.repeat(y, 2), np.repeat(np.arange(20), 2)
    rho2, (low2, high2) = _unpack(spearman_cluster_bootstrap(x2, y2, pairs, n_resamples=2000, rng=3))
    assert (rho2, low2, high2) == pytest.approx((rho, low, high), abs=1e-12)
    # treating the 40 duplicated points as independent pretends to twice the data: narrower
    naive_low, naive_high = spearman_cluster_bootstrap(
        x2, y2, np.arange(40), n_resamples=2000, rng=3
    ).confidence_interval
    assert naive_high - naive_low < 0.85 * (high2 - low2)


def test_two_clusters_of_copies_give_a_wide_interval_where_the_point_bootstrap_is_narrow():
    # cluster A: 5 points rising, cluster B (to its right and above): 5 points falling, each copied 40 times
    xa, xb = np.arange(5.0), np.arange(5.0) + 5
    ya, yb = xa.copy(), 14 - xb
    x = np.concatenate([np.tile(xa, 40), np.tile(xb, 40)])
    y = np.concatenate([np.tile(ya, 40), np.tile(yb, 40)])
    clusters = np.repeat(["A", "B"], 200)
    rho, (low, high) = _unpack(spearman_cluster_bootstrap(x, y, clusters, n_resamples=2000))
    assert 0.5 < rho < 0.9  # pooled: the between-cluster rise wins
    assert low == pytest.approx(-1.0) and high == pytest.approx(1.0)  # AA: +1, BB: −1, AB: pooled
    naive_low, naive_high = spearman_cluster_bootstrap(x, y, np.arange(400), n_resamples=2000).confidence_interval
    assert naive_low <= rho <= naive_high
    assert naive_high - naive_low < 0.3
    assert naive_low > 0.3  # the point bootstrap would (wrongly) exclude 0


def test_too_many_undefined_resamples_raise():
    # cluster A: x varies, y constant; B: x constant, y varies; C: both constant (at the same values).
    # ρ_b is defined only when A and B are both drawn: 1 − 2(2/3)³ + (1/3)³ = 12/27 of resamples
    x = np.array([1.0, 2, 3, 0, 0, 0, 0, 0])
    y = np.array([0.0, 0, 0, 1, 2, 3, 0, 0])
    clusters = ["A", "A", "A", "B", "B", "B", "C", "C"]
    with pytest.raises(ValueError, match="more than half"):
        spearman_cluster_bootstrap(x, y, clusters, n_resamples=2000)
    # six singleton clusters constant in x and one varying pair: ~(6/7)^7 ≈ 34% dropped, kept ones define it
    x, y, clusters = np.array([1.0, 1, 1, 1, 1, 1, 2, 3]), np.arange(8.0), [0, 1, 2, 3, 4, 5, 6, 6]
    low, high = spearman_cluster_bootstrap(x, y, clusters, n_resamples=500).confidence_interval
    assert [low, high] == pytest.approx(_brute_cluster_bootstrap(x, y, clusters, 500, 0), abs=1e-12)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"x": [1, 2, 3], "y": [1, 2], "clusters": [0, 1, 2]}, "same length"),
        ({"x": [1, 2], "y": [1, 2], "clusters": [0, 1]}, "at least 3"),
        ({"x": [1, 2, np.nan], "y": [1, 2, 3], "clusters": [0, 1, 2]}, "non-finite"),
        ({"x": [1, 2, 3], "y": [1, 2, np.inf], "clusters": [0, 1, 2]}, "non-finite"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "clusters": [0, 1]}, "one label per point"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "clusters": [0, 0, 0]}, "single cluster"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "clusters": [0, 1, 2], "n_resamples": 0}, "n_resamples"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "clusters": [0, 1, 2], "n_resamples": 2.5}, "n_resamples"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "clusters": [0, 1, 2], "confidence_level": 1.0}, "confidence_level"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "clusters": [0, 1, 2], "confidence_level": 0}, "confidence_level"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "clusters": [0, 1, 2], "rng": 1.5}, "rng"),
        ({"x": [1, 1, 1], "y": [1, 2, 3], "clusters": [0, 1, 2]}, "constant"),
    ],
)
def test_cluster_bootstrap_rejects_bad_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        spearman_cluster_bootstrap(**kwargs)


# --------------------------------------------------------------------------- permutation test


def _pair(result):
    """(statistic, pvalue) of a PermutationTestResult."""
    return result.statistic, result.pvalue


def _is_valid_p(p, n_resamples):
    k = p * (n_resamples + 1) - 1
    return 0 < p <= 1 and abs(k - round(k)) < 1e-6 and round(k) >= 0


@pytest.mark.parametrize("sign", [1, -1])
def test_monotone_data_give_a_tiny_permutation_p(sign):
    x = np.array([0.5, 1.0, 2.0, 3.5, 4.0, 6.0, 9.0, 10.0])  # n = 8: P(|ρ_perm| = 1) = 2/8! ≈ 5e-5
    rho, p = _pair(spearman_permutation_test(x, sign * x**2, n_resamples=10000, rng=0))
    assert rho == pytest.approx(sign * 1.0)
    assert _is_valid_p(p, 10000)
    assert p <= 0.01
    assert p >= 1 / 10001


def test_independent_data_give_a_large_p():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=30), rng.normal(size=30)
    rho, p = _pair(spearman_permutation_test(x, y, n_resamples=5000, rng=0))
    assert rho == spearman(x, y)
    assert _is_valid_p(p, 5000)
    assert p > 0.05


def test_permutation_p_is_two_sided():
    # a moderate negative correlation: one-sided (ρ_perm ≥ ρ_obs) would give p near 1
    rng = np.random.default_rng(8)
    x = rng.normal(size=25)
    y = -x + rng.normal(scale=0.8, size=25)
    rho, p = _pair(spearman_permutation_test(x, y, n_resamples=4000, rng=1))
    p_flipped = spearman_permutation_test(x, -y, n_resamples=4000, rng=1).pvalue
    assert rho < -0.5
    assert p < 0.01
    assert p == p_flipped  # |ρ| is symmetric in the sign of y


def test_permutation_p_with_ties_counts_exact_ties():
    # x binary, y binary: only a few distinct ρ values, so ties with ρ_obs are frequent
    x = np.array([0, 0, 0, 1, 1, 1.0])
    y = np.array([0, 0, 1, 0, 1, 1.0])
    rho, p = _pair(spearman_permutation_test(x, y, n_resamples=4000, rng=2))
    # exact (6! = 720 orderings ≤ 4000, every one counted): ρ takes ±1 w.p. 1/20 each, ±1/3 w.p. 9/20 each,
    # so P(|ρ| ≥ 1/3) = 1
    assert rho == pytest.approx(1 / 3)
    assert p == 1.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"x": [1, 2, 3], "y": [1, 2]}, "same length"),
        ({"x": [1, 2], "y": [2, 1]}, "at least 3"),
        ({"x": [1, 2, np.nan], "y": [1, 2, 3]}, "non-finite"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "n_resamples": 0}, "n_resamples"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "n_resamples": True}, "n_resamples"),
        ({"x": [1, 2, 3], "y": [1, 2, 3], "rng": "seed"}, "rng"),
    ],
)
def test_permutation_test_rejects_bad_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        spearman_permutation_test(**kwargs)


# --------------------------------------------------------------------------- partial ρ


def test_partial_spearman_is_undefined_when_x_is_z():
    rng = np.random.default_rng(0)
    z = rng.normal(size=20)
    with pytest.raises(ValueError, match="undefined"):
        partial_spearman(z, rng.normal(size=20), z)
    with pytest.raises(ValueError, match="undefined"):
        partial_spearman(rng.normal(size=20), np.exp(z), z)  # a monotone function of z counts too


def test_partial_spearman_removes_a_shared_monotone_trend():
    rng = np.random.default_rng(3)
    z = np.arange(200.0)
    x = z + rng.normal(scale=15, size=200)  # both follow z, with independent residuals
    y = z + rng.normal(scale=15, size=200)
    assert spearman(x, y) > 0.8
    assert abs(partial_spearman(x, y, z)) < 0.3


def test_partial_spearman_matches_the_formula():
    rng = np.random.default_rng(6)
    x, y, z = rng.normal(size=(3, 30))
    rxy, rxz, ryz = spearman(x, y), spearman(x, z), spearman(y, z)
    expected = (rxy - rxz * ryz) / math.sqrt((1 - rxz**2) * (1 - ryz**2))
    assert partial_spearman(x, y, z) == pytest.approx(expected, abs=1e-12)
    # invariant to monotone transforms of any argument
    assert partial_spearman(np.exp(x), y**3, 2 * z + 1) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    "args, message",
    [
        (([1, 2, 3], [1, 2, 3], [1, 2]), "same shape"),
        (([1, 2], [2, 1], [1, 2]), "at least 3"),
        (([1, 2, 3], [3, 1, np.nan], [1, 3, 2]), "non-finite"),
        (([1, 2, 3], [3, 1, 2], [5, 5, 5]), "constant"),
    ],
)
def test_partial_spearman_rejects_bad_inputs(args, message):
    with pytest.raises(ValueError, match=message):
        partial_spearman(*args)


# --------------------------------------------------------------------------- group-mean baseline


def test_group_mean_baseline_gives_each_point_its_group_mean():
    outcome = [1.0, 2.0, 3.0, 10.0, 4.0, 7.0]
    groups = ["rope", "rope", "alibi", "alibi", "nope", "rope"]
    expected = [10 / 3, 10 / 3, 6.5, 6.5, 4.0, 10 / 3]
    assert group_mean_baseline(outcome, groups) == pytest.approx(expected)
    assert group_mean_baseline([2.0, 4.0, 9.0], [3, 1, 3]) == pytest.approx([5.5, 4.0, 5.5])
    assert group_mean_baseline([1.0, 2.0], ["a", "b"]).shape == (2,)


@pytest.mark.parametrize(
    "args, message",
    [
        (([1.0, 2.0], ["a"]), "one label per point"),
        (([], []), "non-empty"),
        (([1.0, np.nan], ["a", "a"]), "non-finite"),
    ],
)
def test_group_mean_baseline_rejects_bad_inputs(args, message):
    with pytest.raises(ValueError, match=message):
        group_mean_baseline(*args)


def test_bootstrap_mean_is_the_mean_with_an_interval_that_holds_it_and_collapses_on_constants():
    from attnres_helpers.stats import bootstrap_mean

    e = bootstrap_mean([1.0, 2.0, 3.0, 6.0], n_resamples=2000, rng=1)
    low, high = e.confidence_interval
    assert e.statistic == 3.0 and 1.0 <= low < 3.0 < high <= 6.0
    assert e.bootstrap_distribution.shape == (2000,) and str(e) == f"3 [{low:.4g}, {high:.4g}]"
    assert bootstrap_mean([0.5] * 5, n_resamples=100) == bootstrap_mean([0.5] * 5, n_resamples=100)
    constant = bootstrap_mean([0.5] * 5, n_resamples=100)
    assert constant.confidence_interval.low == constant.statistic == constant.confidence_interval.high == 0.5
    for bad in ([1.0], [[1.0, 2.0]], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="one finite value per window"):
            bootstrap_mean(bad)


def test_the_unstratified_permutation_test_agrees_with_scipys():
    """Without strata, spearman_permutation_test is scipy's permutation_test with permutation_type="pairings"
    (on |ρ|, so that p counts |ρ_b| ≥ |ρ_obs|): against scipy's own two-sided p with Spearman's ρ itself, the same
    statistic, and p-values within Monte Carlo error (10,000 resamples each: the
    standard error of the difference of two p near 0.15 is about 0.005; 0.025 is five of them). A one-sided
    count would halve p and fail."""
    import scipy.stats

    from attnres_helpers.stats import PermutationTestResult, spearman, spearman_permutation_test

    rng = np.random.default_rng(3)
    x = rng.normal(size=24)
    y = 0.15 * x + rng.normal(size=24)
    ours = spearman_permutation_test(x, y, n_resamples=10000, rng=0)

    def rho(a, b, axis=-1):  # Spearman's ρ of each resample along ``axis``, vectorized (as scipy asks, for speed)
        ra, rb = (scipy.stats.rankdata(v, axis=axis) for v in (a, b))
        ra, rb = ra - ra.mean(axis, keepdims=True), rb - rb.mean(axis, keepdims=True)
        return (ra * rb).sum(axis) / np.sqrt((ra**2).sum(axis) * (rb**2).sum(axis))

    assert rho(x, y) == pytest.approx(spearman(x, y), abs=1e-12)
    theirs = scipy.stats.permutation_test(
        (x, y), rho, vectorized=True, permutation_type="pairings", n_resamples=10000, rng=1
    )
    assert isinstance(ours, PermutationTestResult) and ours.statistic == pytest.approx(theirs.statistic, abs=1e-12)
    assert 0.05 < ours.pvalue < 0.5 and abs(ours.pvalue - theirs.pvalue) < 0.025
