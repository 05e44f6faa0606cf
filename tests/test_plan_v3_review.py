"""Plan v3 read again after its data (attnres_helpers.plan_v3_review): closed forms on small inputs, and the
shipped store's numbers that notebooks 07 and 08 print, each against a plain recomputation."""

import pytest

from attnres_helpers import configured_analysis as ca
from attnres_helpers import plan_v3_review as review
from attnres_helpers.configured_store import load
from attnres_helpers.paths import STORES
from attnres_helpers.stats import (
    BootstrapResult,
    ConfidenceInterval,
    CorrelationResult,
    bootstrap_mean,
    spearman,
    spearman_permutation_test,
)


@pytest.fixture(scope="module")
def store():
    return load(STORES["configurations"])


def test_the_kinds_are_read_from_the_stores_record_of_each_configuration(store):
    assert review.kinds(store) == {
        "as-trained": "as trained",
        "pi-2": "rescaled",
        "yarn-2": "rescaled",
        "ntk-2": "rescaled",
        "bca": "masked",
        "bca-sink": "masked",
        "streaming": "masked",
    }


def test_kind_test_on_the_shipped_store(store):
    t = review.kind_test(store)
    rise = review.window_means(store, "NLL rise")
    code = [review.KIND_ORDER.index(k) for k in review.kinds(store).values()]
    assert t.kind.statistic == pytest.approx(spearman(code, rise)) and round(t.kind.statistic, 2) == -0.93
    assert t.kind.pvalue == pytest.approx(1 / 70)  # exact over the 7! orderings (ties in the kind code)
    assert t.within.statistic == pytest.approx(ca.cross_test(store, "R(2L)", "NLL rise", n_resamples=10).statistic)
    assert t.orderings == 36 and t.within.pvalue == pytest.approx(4 / 36)  # strata of 1, 3 and 3 configurations
    assert len(t.within.null_distribution) == 36


def test_paired_difference_is_the_window_bootstrap_of_the_per_window_difference(store):
    d = review.paired_difference(store, "bca-sink", "bca")
    a, b = ca.per_window(store, "bca-sink")["NLL rise"], ca.per_window(store, "bca")["NLL rise"]
    assert d == bootstrap_mean(a - b)
    assert d.statistic == pytest.approx(a.mean() - b.mean())
    assert str(d) == "0.4305 [0.3961, 0.4651]"  # what notebooks 07 and 08 print (rng 0, 10,000 resamples)


def test_sink_free_rows_agree_with_the_plans_summary_where_they_overlap(store):
    summary = ca.summary(store, n_resamples=200)
    rows = {r["configuration"]: r for r in review.sink_free_rows(store, n_resamples=200)}
    assert set(rows) == set(store.configurations())
    for name, row in rows.items():
        for key in ("R(L)", "R(2L)", "R(L) sink-free", "R(2L) sink-free", "drop"):
            assert row[key].statistic == pytest.approx(summary[name][key].statistic)
        free = row["drop sink-free"]
        assert free.statistic == pytest.approx(row["R(2L) sink-free"].statistic / row["R(L) sink-free"].statistic)
        assert free.confidence_interval.low <= free.statistic <= free.confidence_interval.high


def test_without_configurations_is_plan_v3s_rho_on_the_rest(store):
    test = review.without_configurations(store, "reach", "passkey past L", ["as-trained", "pi-2"])
    names = ["yarn-2", "ntk-2", "bca", "bca-sink", "streaming"]
    x = [ca.per_window(store, c)["reach"].mean() for c in names]
    y = [ca.per_window(store, c)["passkey past L"].mean() for c in names]
    assert len(test.null_distribution) == 120  # 5 configurations, every ordering counted
    assert test == spearman_permutation_test(x, y)


def _summaries(**changes):
    """Summaries in which every part of plan v3's prediction holds; ``changes`` overrides some values."""
    est = lambda v: BootstrapResult(v, ConfidenceInterval(v, v))  # noqa: E731
    values = {
        "as-trained": (2.0, 0.05, 0.0),
        "pi-2": (0.1, 0.3, 0.0),
        "yarn-2": (0.1, 0.4, 0.1),
        "ntk-2": (0.1, 0.35, 0.1),
        "bca": (0.5, 0.01, 0.0),
        "bca-sink": (0.2, 0.3, 0.0),
        "streaming": (0.2, 0.3, 0.0),
    }
    values.update(changes)
    return {
        n: {"NLL rise": est(r), "R(2L)": est(r2), "passkey past L": est(pk), "ceiling at 2L": est(1.0)}
        for n, (r, r2, pk) in values.items()
    }


def _test(predictor, outcome, rho, p, low, high, largest_tie):
    interval = ConfidenceInterval(low, high)
    return CorrelationResult(rho, interval, 7, p, predictor, outcome, True, largest_tie=largest_tie)


def _tests(nll=(-0.5, 0.3, -0.9, 0.1), pk_rho=0.3, reach_rho=0.6):
    return [
        _test("R(2L)", "NLL rise", *nll, 1),
        _test("R(2L)", "passkey past L", pk_rho, 0.5, -0.2, 0.6, 5),
        _test("reach", "passkey past L", reach_rho, 0.4, 0.1, 0.6, 5),
    ]


def test_prediction_rows_say_held_where_every_part_holds_and_no_where_it_fails():
    rows = review.prediction_rows(_summaries(), _tests(), True, {})
    assert len(rows) == 9 and all(r["held"] == "yes" for r in rows), rows
    failed = review.prediction_rows(
        _summaries(streaming=(0.9, 0.001, 0.0), **{"bca-sink": (0.8, 0.001, 0.0)}),
        _tests(nll=(-0.9, 0.01, -0.99, -0.5), reach_rho=0.2),
        True,
        {"streaming": "StreamingLLM"},
    )
    held = {r["part"]: r["held"] for r in failed}
    assert held["NLL rise: order"] == "partly"  # as trained still first, BCA no longer second
    assert held["NLL rise: small"] == "partly" and "StreamingLLM +0.900" in failed[1]["measured"]
    assert held["R(2L) and the first token"] == "no"
    assert held["verdict, NLL rise"] == "no" and failed[7]["measured"] == "supports"
    assert held["reach against R, passkey past L"] == "no"
    assert held["passkey past L: near 0"] == "yes"
