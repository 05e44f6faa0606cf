"""attnres_helpers.analysis: the family plan's points, test and verdict on data with known answers."""

import math

import numpy as np
import pytest
import torch

from attnres_helpers import analysis
from attnres_helpers.analysis import Point
from attnres_helpers.experiments import default_config
from attnres_helpers.metric import layer_resolution
from attnres_helpers.store import Profile

L = 8


def profile(config, encoding, seed, eval_len, bca, s_hat, nll_first, nll_past):
    meta = {
        "encoding": encoding,
        "seed": seed,
        "train_len": L,
        "config": config,
        "model": default_config(encoding, train_len=L).to_dict(),
    }
    nll = torch.tensor([nll_first] * L + [nll_past] * (eval_len - L), dtype=torch.float64)
    return Profile(f"{config}-s{seed}".replace(" ", "-"), meta, eval_len, bca, s_hat, nll)


def test_family_points_are_seed_means_of_same_window_rises_and_upper_layer_r():
    g = torch.Generator().manual_seed(0)
    profiles = []
    for seed, (first, past) in enumerate([(1.0, 1.5), (1.2, 1.4)]):
        for k in (1, 2, 4):
            s_hat = torch.randn(2, 2, k * L, generator=g)
            profiles.append(profile("rope base 100", "rope", seed, k * L, False, s_hat, first, past))
    points = analysis.family_points(profiles)
    assert [p.name for p in points] == ["rope base 100"]
    point = points[0]
    assert point.values["rise 2L"] == pytest.approx(np.mean([math.exp(0.5), math.exp(0.2)]), rel=1e-12)
    assert point.values["rise 4L"] == pytest.approx(point.values["rise 2L"], rel=1e-12)  # the same NLL steps
    upper = [
        float(layer_resolution(p.s_hat.double(), "mean-scores", "zero")[1:].mean())
        for p in profiles
        if p.eval_len == 2 * L
    ]
    assert point.values["R(2L) upper"] == pytest.approx(np.mean(upper), rel=1e-6)
    assert point.per_seed["rise 2L"].keys() == {0, 1}
    assert 0 < point.values["design R(2L)"] < 1


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("encoding", ["rope"], r"run 'rope-base-100-s0': encoding must be one of rope, .*, got \['rope'\]"),
        ("encoding", 3, r"run 'rope-base-100-s0': encoding must be one of rope, .*, got 3"),
        ("encoding", "rotary", r"run 'rope-base-100-s0': encoding must be one of rope, .*, got 'rotary'"),
        ("config", ["a"], r"run 'rope-base-100-s0': config must be a setting's label \(a string\), got \['a'\]"),
        ("config", None, "run 'rope-base-100-s0' has no 'config' label: not a family store"),
        # issue 44 #19: a model given as a string (as measure-hf names a pretrained model) was a TypeError
        (
            "model",
            "smollm2",
            r"run 'rope-base-100-s0': model must be the run's model configuration \(a dict\), got 'smollm2'",
        ),
        ("model", None, r"run 'rope-base-100-s0': model must be the run's model configuration \(a dict\), got None"),
    ],
)
def test_family_points_refuse_a_bad_encoding_or_config_before_any_record(monkeypatch, field, value, message):
    good = profile("rope base 100", "rope", 0, 2 * L, False, torch.zeros(2, 2, 2 * L), 1.0, 1.0)
    meta = {k: v for k, v in {**good.meta, field: value}.items() if v is not None}
    bad = Profile(good.run, meta, good.eval_len, good.bca, good.s_hat, good.nll)
    monkeypatch.setattr(analysis, "records", lambda *a, **k: pytest.fail("records computed before the refusal"))
    with pytest.raises(ValueError, match=f"^{message}$"):
        analysis.family_points([good, bad] if field == "config" else [bad])


def test_extra_seed_points_average_five_seeds_only_where_all_five_exist():
    """Setting a has seeds 0-4, b has 0-2 and 4 (seed 3 missing), c has 0, 1, 3, 4 (seed 2 missing): a is
    the mean of five seeds, b of its first three, c of seeds 0 and 1, and only a is named as complete."""
    rises = (
        {("a", s): 1.0 + 0.1 * s for s in range(5)}
        | {("b", s): 2.0 + 0.1 * s for s in (0, 1, 2, 4)}
        | {("c", s): 3.0 + 0.1 * s for s in (0, 1, 3, 4)}
    )
    profiles = [
        profile(config, "rope", seed, 2 * L, False, torch.zeros(2, 2, 2 * L), 1.0, 1.0 + math.log(rise))
        for (config, seed), rise in rises.items()
    ]
    points, full = analysis.extra_seed_points(profiles, extra_seeds=(3, 4))  # seeds: V2_SEEDS
    assert full == ["a"]
    by = {p.setting: p for p in points}
    assert by["a"].per_seed["rise 2L"].keys() == {0, 1, 2, 3, 4} and by["b"].per_seed["rise 2L"].keys() == {0, 1, 2}
    assert by["a"].values["rise 2L"] == pytest.approx(1.2, rel=1e-12)
    assert by["b"].values["rise 2L"] == pytest.approx(2.1, rel=1e-12)
    assert by["c"].per_seed["rise 2L"].keys() == {0, 1} and by["c"].values["rise 2L"] == pytest.approx(3.05, rel=1e-12)
    primary = {p.setting: p for p in analysis.family_points(profiles, seeds=analysis.V2_SEEDS)}
    assert primary["a"].values["rise 2L"] == pytest.approx(1.1, rel=1e-12)  # the primary keeps seeds 0-2


def synthetic(predictor, outcome, bca, settings, family="rope"):
    return [
        Point(
            s,
            family if i % 3 else "alibi",
            b,
            {"R(2L) upper": x, "rise 2L": y, "design R(2L)": x**2, "R(2L) mean": -y},
            {"rise 2L": {0: y, 1: y}},
        )
        for i, (x, y, b, s) in enumerate(zip(predictor, outcome, bca, settings))
    ]


FAST = {"n_resamples": 500, "rng": 0}


def test_a_predictor_that_ranks_within_each_mask_is_support():
    n = 10
    x = np.r_[np.arange(n), np.arange(n) + 0.5]  # R higher with BCA and, within each mask, ordered
    y = -x  # higher R, smaller rise: a perfect negative rank relation everywhere
    points = synthetic(x, y, [False] * n + [True] * n, [f"s{i}" for i in range(n)] * 2)
    result = analysis.run_plan(points, **FAST)
    assert result.primary.statistic == pytest.approx(-1.0) and result.primary.confidence_interval.high < 0
    assert result.primary.pvalue == pytest.approx(1 / 501)  # no permutation is as extreme
    assert result.within[False].statistic == pytest.approx(-1.0) and result.within[True].statistic == pytest.approx(
        -1.0
    )
    assert result.settings == n and result.seeds["s0 +BCA"] == 2
    category, lines = analysis.verdict(result)
    assert category == analysis.SUPPORT and "R beats the indicator" in lines[-1]


def test_a_predictor_that_only_tracks_the_mask_is_mask_only():
    rng = np.random.default_rng(1)
    n = 12
    bca = np.r_[np.zeros(n), np.ones(n)].astype(bool)
    x = bca * 10 + rng.random(2 * n)  # R jumps with BCA, noise within
    y = -10.0 * bca + rng.random(2 * n)  # the rise drops with BCA, independent noise within
    points = synthetic(x, y, bca, [f"s{i}" for i in range(n)] * 2)
    result = analysis.run_plan(points, **FAST)
    assert result.primary.confidence_interval.high < 0
    assert not result.within[False].excludes_zero and not result.within[True].excludes_zero
    assert abs(result.baselines["BCA indicator"].statistic) >= abs(result.primary.statistic) - 1e-9
    category, lines = analysis.verdict(result)
    assert category == analysis.MASK_ONLY and "does not beat the indicator" in lines[-1]


def test_an_unrelated_predictor_is_no_support():
    rng = np.random.default_rng(2)
    n = 12
    points = synthetic(rng.random(2 * n), rng.random(2 * n), [False] * n + [True] * n, [f"s{i}" for i in range(n)] * 2)
    category, lines = analysis.verdict(analysis.run_plan(points, **FAST))
    assert category == analysis.NO_SUPPORT and "pooled test fails" in lines[2]


def test_missing_columns_and_empty_stores_are_refused():
    with pytest.raises(ValueError, match="no profiles"):
        analysis.family_points([])
    points = synthetic([1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [False] * 3, ["a", "b", "c"])
    with pytest.raises(ValueError, match="column 'rise 4L' is missing for a, b, c"):
        analysis.column(points, "rise 4L")


# ---------------------------------------------------------------------------------------------- plan v2


def synthetic_v2(x, rise, copy, bca, settings, families):
    return [
        Point(
            s,
            f,
            b,
            {
                "R(2L) upper": xi,
                "drop upper": xi / 2,
                "R(2L) mean": xi + 1,
                "design R(2L)": -xi,
                "rise 2L": r,
                "copy past L": c,
            },
            {"rise 2L": {0: r}},
        )
        for xi, r, c, b, s, f in zip(x, rise, copy, bca, settings, families)
    ]


def test_v2_support_within_the_mask_and_the_copy_outcome():
    n = 12
    x = np.r_[np.arange(n), np.arange(n) + 0.5]
    fams = (["rope"] * 4 + ["xpos"] * 4 + ["alibi"] * 4) * 2
    points = synthetic_v2(x, -x, x, [False] * n + [True] * n, [f"s{i}" for i in range(n)] * 2, fams)
    rise = analysis.evaluate_v2(points, "R(2L) upper", "rise 2L", **FAST)
    assert rise.primary.statistic == pytest.approx(-1.0) and rise.primary.pvalue == pytest.approx(1 / 501)
    assert set(rise.within_family) == {"rope", "xpos", "alibi"}
    assert all(c.statistic == pytest.approx(-1.0) for c in rise.within_family.values())
    assert analysis.verdict_v2(rise)[0] == analysis.PREDICTS
    copy = analysis.evaluate_v2(points, "R(2L) upper", "copy past L", **FAST)
    assert copy.bca_off_only and copy.primary.n == n and copy.primary.statistic == pytest.approx(1.0)
    assert analysis.verdict_v2(copy)[0] == analysis.PREDICTS
    assert copy.baselines["design R(2L)"].statistic == pytest.approx(-1.0)  # a secondary on the same resamples


def test_v2_mask_only_is_tracks_the_mask_and_the_restricted_p_is_not_fooled():
    """R jumps with BCA and the outcome drops with it, unrelated within each mask: the pooled ρ is strong
    and the unrestricted permutation p small, but the within-mask permutation p is not."""
    rng = np.random.default_rng(3)
    n = 12
    bca = np.r_[np.zeros(n), np.ones(n)].astype(bool)
    x, y = bca * 10 + rng.random(2 * n), -10.0 * bca + rng.random(2 * n)
    points = synthetic_v2(x, y, y, bca, [f"s{i}" for i in range(n)] * 2, ["rope"] * 2 * n)
    result = analysis.evaluate_v2(points, "R(2L) upper", "rise 2L", **FAST)
    assert result.unrestricted.pvalue < 0.01 and result.primary.pvalue > 0.05
    assert analysis.verdict_v2(result)[0] == analysis.INCONCLUSIVE  # the plan's p is the restricted one


def test_v2_wrong_sign_is_evidence_against_and_noise_is_inconclusive():
    n = 12
    x = np.arange(2 * n, dtype=float)
    fams = ["alibi"] * 2 * n
    against = synthetic_v2(x, x, -x, [False] * n + [True] * n, [f"s{i}" for i in range(2 * n)], fams)
    for outcome, says in (("rise 2L", "a larger rise 2L"), ("copy past L", "a smaller copy past L")):
        category, lines = analysis.verdict_v2(analysis.evaluate_v2(against, "R(2L) upper", outcome, **FAST))
        assert category == analysis.AGAINST and f"higher R goes with {says} here" in " ".join(lines)
    rng = np.random.default_rng(4)
    noise = synthetic_v2(
        rng.random(2 * n),
        rng.random(2 * n),
        rng.random(2 * n),
        [False] * n + [True] * n,
        [f"s{i}" for i in range(n)] * 2,
        fams,
    )
    noise_result = analysis.evaluate_v2(noise, "R(2L) upper", "rise 2L", **FAST)
    assert analysis.verdict_v2(noise_result)[0] == analysis.INCONCLUSIVE


def test_stratified_permutation_keeps_each_stratum():
    """Within strata a and b, y keeps its values: p is that of ρ over the within-stratum shuffles only."""
    from attnres_helpers.stats import spearman_permutation_test

    x = np.r_[np.zeros(10), np.ones(10)] + np.linspace(0, 0.1, 20)
    y = np.r_[np.zeros(10), np.ones(10)] + np.random.default_rng(0).random(20) * 0.01
    p_all = spearman_permutation_test(x, y, n_resamples=2000, rng=0).pvalue
    p_within = spearman_permutation_test(x, y, n_resamples=2000, rng=0, strata=[0] * 10 + [1] * 10).pvalue
    assert p_all < 0.01 and p_within > 0.05
    with pytest.raises(ValueError, match="one label per point"):
        spearman_permutation_test(x, y, strata=[0, 1])


def test_base_bound_and_regime_check():
    assert analysis.base_bound(256) == pytest.approx(0.0424 * 256**1.628)
    points = [Point(f"rope base {b}", "rope", False, {"rise 2L": r}, {}) for b, r in ((100, 2.0), (10000, 1.5))]
    rows = analysis.base_bound_table(points, 128)
    assert [r["predicted to keep 2L"] for r in rows] == [False, True]
    regime = [
        Point("rope base 10000", "rope", False, {}, {"ppl past L 2L": {0: 6.0, 1: 5.0, 2: 7.0}}),
        Point("alibi slopes x1", "alibi", False, {}, {"ppl past L 2L": {0: 5.5, 1: 5.5, 2: 5.5}}),
    ]
    check = analysis.regime_check(regime)
    assert (check["worse"], check["of"], check["holds"], check["state"]) == (2, 3, True, "holds")
    first = [
        Point(p.setting, p.family, False, {}, {"ppl past L 2L": {0: p.per_seed["ppl past L 2L"][0]}}) for p in regime
    ]
    assert analysis.regime_check(first)["state"] == "undecided"  # 1 of 1: the plan needs 2 of 3
    against = [Point(p.setting, p.family, False, {}, {"ppl past L 2L": {1: 5.0, 2: 5.0}}) for p in regime]
    assert analysis.regime_check(against)["state"] == "does not hold"
