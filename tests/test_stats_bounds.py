"""Resample counts are bounded (attnres_helpers.stats and analysis.run_plan): a count past the bound is one
clear error before any work. Kept apart from tests/test_stats.py."""

import pytest

from attnres_helpers import stats


def test_resamples_are_bounded():
    from attnres_helpers import analysis

    message = "n_resamples must be at most 1,000,000 (the plan uses 10,000), got 1,000,000,000"
    x, y, clusters = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0], ["a", "a", "b", "c"]
    for call in (
        lambda: stats.spearman_permutation_test(x, y, n_resamples=10**9),
        lambda: stats.spearman_cluster_bootstrap(x, y, clusters, n_resamples=10**9),
        lambda: stats.cluster_bootstrap_spearmans([x], y, clusters, n_resamples=10**9),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message
    points = [
        analysis.Point(
            f"s{i}",
            "rope",
            False,
            {"R(2L) upper": v, "rise 2L": w, "design R(2L)": v, "R(2L) mean": v},
            {"rise 2L": {0: w}},
        )
        for i, (v, w) in enumerate(zip(x, y))
    ]
    with pytest.raises(ValueError) as err:
        analysis.run_plan(points, n_resamples=10**9)
    assert str(err.value) == message
