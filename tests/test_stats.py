"""Statistics of notebook 05: Spearman's ρ, the bootstrap over seeds, leave-one-family-out, the baseline."""

import math

import numpy as np
import pytest

from attnres_helpers.encodings import resolution_pair
from attnres_helpers.model import preset
from attnres_helpers.stats import (
    DESIGN_PREDICTORS,
    Configuration,
    Estimate,
    average_ranks,
    baseline_comparison,
    bootstrap_spearman,
    configuration_table,
    configurations,
    correlation_table,
    design_params,
    design_resolution,
    family_baseline_weights,
    format_estimate,
    leave_one_family_out,
    spearman,
)

L = 8


# --------------------------------------------------------------------------- Spearman


def test_average_ranks_share_tied_ranks():
    assert average_ranks([10, 20, 20, 5]).tolist() == [2, 3.5, 3.5, 1]
    assert average_ranks([[3, 3, 3], [1, 2, 0]]).tolist() == [[2, 2, 2], [2, 3, 1]]


def test_spearman_monotone_relations_are_plus_and_minus_one():
    x = np.array([0.1, 0.5, 2.0, 3.0, 9.0, 11.0])
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)  # any increasing map, however curved
    assert spearman(x, -x**3) == pytest.approx(-1.0)
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


@pytest.mark.parametrize("x, y, message", [
    ([1, 2], [2, 1], "at least 3"),
    ([1, 2, 3], [1, 2], "same length"),
    ([1, 2, float("nan")], [1, 2, 3], "non-finite"),
    ([1, 2, 3], [1, float("inf"), 3], "non-finite"),
    ([2, 2, 2], [1, 2, 3], "constant"),
    ([1, 2, 3], [5, 5, 5], "constant"),
    ([[1, 2, 3]], [[1, 2, 3]], "1-D"),
])
def test_spearman_bad_input(x, y, message):
    with pytest.raises(ValueError, match=message):
        spearman(x, y)


# --------------------------------------------------------------------------- bootstrap


def make_configs(x_by_seed, y_by_seed, families=None, bca=None):
    """Configurations c = 0..n−1 with predictor "x" and outcome "y" per seed (rows of the arrays)."""
    n = len(x_by_seed)
    families = families or ["rope"] * n
    bca = bca or [False] * n
    return [Configuration(f"c{i}", f"c{i}", bca[i], families[i],
                          {"x": dict(enumerate(map(float, x_by_seed[i]))), "y": dict(enumerate(map(float, y_by_seed[i])))})
            for i in range(n)]


def test_bootstrap_is_exact_when_seeds_agree():
    x = np.arange(5.0)[:, None].repeat(3, axis=1)  # (configs, seeds): every seed the same
    y = np.array([1, 3, 2, 5, 4.0])[:, None].repeat(3, axis=1)
    est = bootstrap_spearman(make_configs(x, y), "x", "y", n_boot=200)
    assert est == Estimate(pytest.approx(0.8), pytest.approx(0.8), pytest.approx(0.8), 5, 200)


def test_bootstrap_interval_contains_the_truth_and_widens_with_seed_noise():
    truth_x = np.arange(12.0)
    truth_y = truth_x + np.array([3, -2, 4, -1, 0, 2, -4, 1, 3, -3, 0, 2.0])  # ρ of the true means
    rho_true = spearman(truth_x, truth_y)
    assert 0.5 < rho_true < 0.95
    rng = np.random.default_rng(42)
    widths = []
    for sigma in (0.5, 3.0):
        noise = rng.normal(size=(12, 3))
        noise -= noise.mean(axis=1, keepdims=True)  # seed means equal the truth exactly
        configs = make_configs(truth_x[:, None] + 0 * noise, truth_y[:, None] + sigma * noise)
        est = bootstrap_spearman(configs, "x", "y")
        assert est.value == pytest.approx(rho_true)
        assert est.low <= rho_true <= est.high
        assert est.n == 12 and est.replicates == 2000
        widths.append(est.high - est.low)
    assert 0 < widths[0] < widths[1]


def test_bootstrap_keeps_each_seeds_predictor_and_outcome_together():
    # Seeds disagree wildly, but within every seed the outcome is the predictor: a bootstrap that
    # resampled predictor and outcome separately would break the pairs; this one gives ρ = 1 always.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 3)) * 5 + np.arange(8)[:, None]
    est = bootstrap_spearman(make_configs(x, x.copy()), "x", "y", n_boot=300)
    assert (est.value, est.low, est.high) == pytest.approx((1.0, 1.0, 1.0))


def test_bootstrap_draws_the_same_seeds_for_a_configuration_and_its_bca_twin():
    # "a" and its twin "a +BCA" share checkpoints: per seed x = (0, 10), y = (10, 0) in both. With one
    # draw for both, their means tie in every replicate, between b (−100) and c (100): ρ = 1 always.
    # Independent draws would split the twins, with x and y in opposite orders (ρ = 0.8), in 62.5% of them.
    twin = {"x": {0: 0.0, 1: 10.0}, "y": {0: 10.0, 1: 0.0}}
    configs = [Configuration("a", "a", False, "rope", twin), Configuration("a +BCA", "a", True, "rope", twin),
               Configuration("b", "b", False, "alibi", {"x": {0: -100.0, 1: -100.0}, "y": {0: -100.0, 1: -100.0}}),
               Configuration("c", "c", False, "nope", {"x": {0: 100.0, 1: 100.0}, "y": {0: 100.0, 1: 100.0}})]
    est = bootstrap_spearman(configs, "x", "y", n_boot=400)
    assert (est.value, est.low, est.high) == pytest.approx((1.0, 1.0, 1.0))
    configs[1] = configs[1]._replace(values={"x": {0: 0.0, 2: 10.0}, "y": {0: 10.0, 2: 0.0}})
    with pytest.raises(ValueError, match="must share seeds"):
        bootstrap_spearman(configs, "x", "y")


def test_bootstrap_is_deterministic_for_a_seed():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(10, 3)), rng.normal(size=(10, 3))
    configs = make_configs(x + np.arange(10)[:, None], y + np.arange(10)[:, None] * 0.3)
    first = bootstrap_spearman(configs, "x", "y", n_boot=500, seed=7)
    assert bootstrap_spearman(configs, "x", "y", n_boot=500, seed=7) == first
    other = bootstrap_spearman(configs, "x", "y", n_boot=500, seed=8)
    assert other.value == first.value and (other.low, other.high) != (first.low, first.high)


def test_bootstrap_uses_only_configurations_with_both_columns():
    x = np.arange(6.0)[:, None].repeat(2, axis=1)
    configs = make_configs(x, -x)
    del configs[2].values["x"]
    est = bootstrap_spearman(configs, "x", "y", n_boot=50)
    assert est.n == 5 and est.value == pytest.approx(-1.0)


@pytest.mark.parametrize("kwargs, message", [
    ({"n_boot": 0}, "n_boot"),
    ({"n_boot": 2.5}, "n_boot"),
    ({"seed": 0.5}, "seed"),
    ({"level": 1.0}, "level"),
    ({"predictor": "z"}, "no configuration has"),
])
def test_bootstrap_bad_input(kwargs, message):
    x = np.arange(4.0)[:, None].repeat(2, axis=1)
    args = {"predictor": "x", "outcome": "y", **kwargs}
    with pytest.raises(ValueError, match=message):
        bootstrap_spearman(make_configs(x, x), **args)


def test_bootstrap_needs_three_configurations_and_paired_seeds():
    x = np.arange(2.0)[:, None].repeat(2, axis=1)
    with pytest.raises(ValueError, match="only 2 configurations"):
        bootstrap_spearman(make_configs(x, x), "x", "y")
    configs = make_configs(np.ones((3, 2)) * [[1], [2], [3]], np.ones((3, 2)) * [[1], [2], [3]])
    configs[1].values["y"] = {0: 2.0, 5: 2.0}
    with pytest.raises(ValueError, match="different seeds"):
        bootstrap_spearman(configs, "x", "y")


def test_correlation_table_rows():
    x = np.arange(5.0)[:, None].repeat(2, axis=1)
    configs = make_configs(x, x**2)
    rows = correlation_table(configs, ["x"], ["y", "x"], n_boot=20)
    assert [(r["predictor"], r["outcome"], r["n"]) for r in rows] == [("x", "y", 5), ("x", "x", 5)]
    assert rows[0]["rho"] == pytest.approx(1.0) and rows[0]["excludes 0"] == "yes"


# --------------------------------------------------------------------------- leave one family out


def test_leave_one_family_out_known_answers():
    # Within each family y rises with x; ALiBi sits at the largest x with the smallest y.
    x = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9.0])
    y = np.array([1, 2, 3, 4, 5, 6, -3, -2, -1.0])
    families = ["rope"] * 3 + ["xpos"] * 3 + ["alibi"] * 3
    configs = make_configs(x[:, None].repeat(3, axis=1), y[:, None].repeat(3, axis=1), families)
    out = leave_one_family_out(configs, "x", "y", n_boot=50)
    assert list(out) == ["none", "rope", "xpos", "alibi"]
    assert out["none"].value == pytest.approx(spearman(x, y)) and out["none"].n == 9
    assert out["alibi"].value == pytest.approx(1.0) and out["alibi"].n == 6  # carried against by ALiBi
    # Without rope: x ranks 1..6, y ranks (4, 5, 6, 1, 2, 3): Σd² = 54, ρ = 1 − 6·54 / (6·35).
    assert out["rope"].value == pytest.approx(1 - 6 * 54 / 210)
    assert out["xpos"].value == pytest.approx(1 - 6 * 54 / 210)


# --------------------------------------------------------------------------- family baseline


def test_family_baseline_weights():
    w = family_baseline_weights(["a", "a", "b", "a", "c"])
    assert w[0].tolist() == [0, 0.5, 0, 0.5, 0]  # the other two "a"
    assert w[2].tolist() == [0.25, 0.25, 0, 0.25, 0.25]  # "b" is alone: the mean of everyone else
    assert np.allclose(w.sum(axis=1), 1) and np.all(np.diag(w) == 0)
    with pytest.raises(ValueError, match="at least 2"):
        family_baseline_weights(["a"])


def test_baseline_comparison_known_answers():
    # Two families, outcome almost fixed by the family: the leave-one-out means rank the families
    # right but each family's members backwards, b = (1.15, 1.1, 1.05, 5.15, 5.1, 5.05):
    # ranks (3, 2, 1, 6, 5, 4) against (1..6), Σd² = 16, ρ = 1 − 6·16 / (6·35) = 0.5429.
    y = np.array([1, 1.1, 1.2, 5, 5.1, 5.2])
    families = ["rope"] * 3 + ["alibi"] * 3
    configs = make_configs(y[:, None].repeat(2, axis=1), y[:, None].repeat(2, axis=1), families)
    result = baseline_comparison(configs, "x", "y", n_boot=100)
    assert result.baseline.value == pytest.approx(1 - 6 * 16 / 210)
    assert result.predictor.value == pytest.approx(1.0)
    assert result.difference.value == pytest.approx(1 - (1 - 6 * 16 / 210))
    assert result.difference.low == pytest.approx(result.difference.value)  # seeds agree: no spread
    assert result.baseline.n == 6


def test_baseline_singleton_family_and_bca_groups():
    # A family of one gets the mean outcome of all the others.
    y = np.array([1.0, 2.0, 3.0, 10.0])
    configs = make_configs(np.arange(4.0)[:, None].repeat(2, 1), y[:, None].repeat(2, 1),
                           ["rope", "rope", "rope", "nope"])
    # b = (2.5, 2, 1.5, 2): ranks (4, 2.5, 1, 2.5) against (1, 2, 3, 4).
    assert baseline_comparison(configs, "x", "y", n_boot=10).baseline.value == pytest.approx(
        spearman([2.5, 2, 1.5, 2], y))
    # Grouped by (family, BCA) the BCA member is alone and gets the mean of the rest.
    configs = make_configs(np.arange(4.0)[:, None].repeat(2, 1), y[:, None].repeat(2, 1),
                           ["rope"] * 4, bca=[False, False, False, True])
    assert baseline_comparison(configs, "x", "y", by_bca=True, n_boot=10).baseline.value == pytest.approx(
        spearman([2.5, 2, 1.5, 2], y))


def test_format_estimate():
    assert format_estimate(Estimate(-0.6234, -0.8, -0.349, 20, 2000)) == "-0.62 [-0.80, -0.35]"
    assert format_estimate(Estimate(-0.001, -0.004, 0.3, 20, 2000)) == "0.00 [0.00, 0.30]"


# --------------------------------------------------------------------------- from records


FAMILY = {"rope a": "rope", "alibi a": "alibi", "sinusoidal": "sinusoidal"}


def make_records(seeds=(0, 1, 2)):
    """Family records: R(kL) = r0 · drop^(k−1) (level with BCA) + 0.01·seed, in "mean-scores";
    "mean-R" doubles R. ppl(kL) = p0 · k (with BCA: p0) + seed; past L: 1 more. Layers 0, 1 and the mean."""
    spec = {"rope a": (0.4, 0.5, 5.0), "alibi a": (0.2, 1.0, 6.0), "sinusoidal": (0.1, 0.25, 9.0)}
    records = []
    for label, (r0, drop, p0) in spec.items():
        encoding = FAMILY[label]
        for seed in seeds:
            for k in (1, 2, 4):
                for bca in (False, True):
                    if bca and encoding == "sinusoidal":
                        continue
                    r = r0 * (1 if bca else drop ** (k - 1)) + 0.01 * seed
                    ppl = p0 * (1 if bca else k) + seed
                    for head_mode, factor in (("mean-scores", 1), ("mean-R", 2)):
                        for layer in (0, 1, "mean"):
                            records.append({"config": label, "params": {}, "encoding": encoding, "seed": seed,
                                            "train_len": L, "eval_len": k * L, "bca": bca, "head_mode": head_mode,
                                            "layer": layer, "resolution": r * factor if layer == "mean" else -1.0,
                                            "perplexity": ppl, "perplexity_past_L": ppl + 1 if k > 1 else None})
    return records


def test_configurations_from_records():
    configs = configurations(make_records())
    assert [c.name for c in configs] == ["rope a", "rope a +BCA", "alibi a", "alibi a +BCA", "sinusoidal"]
    rope = configs[0]
    assert (rope.config, rope.bca, rope.family) == ("rope a", False, "rope")
    assert rope.values["R(L)"] == pytest.approx({0: 0.4, 1: 0.41, 2: 0.42})  # the layer mean, not layer 0
    assert rope.values["R(2L)/R(L)"] == pytest.approx({s: (0.2 + 0.01 * s) / (0.4 + 0.01 * s) for s in range(3)})
    assert rope.values["ppl(4L)"] == {0: 20.0, 1: 21.0, 2: 22.0}
    assert rope.values["ppl(2L)/ppl(L)"] == pytest.approx({s: (10 + s) / (5 + s) for s in range(3)})
    assert rope.values["ppl(2L) past L"] == {0: 11.0, 1: 12.0, 2: 13.0}
    bca = configs[1]
    assert bca.values["ppl(2L)"] == {0: 5.0, 1: 6.0, 2: 7.0} and bca.values["R(2L)"] == bca.values["R(L)"]
    assert not any(k.startswith("design") for k in rope.values)
    doubled = configurations(make_records(), "mean-R")[0]
    assert doubled.values["R(L)"] == pytest.approx({0: 0.8, 1: 0.82, 2: 0.84})
    assert doubled.values["ppl(L)"] == rope.values["ppl(L)"]


def test_configuration_table_seed_means():
    rows = configuration_table(configurations(make_records()), ["R(L)", "ppl(2L)", "design R(L)"])
    assert rows[0]["seeds"] == 3 and rows[0]["R(L)"].mean == pytest.approx(0.41)
    assert rows[0]["R(L)"].spread == pytest.approx(0.01) and rows[0]["ppl(2L)"].mean == pytest.approx(11.0)
    assert rows[0]["design R(L)"] is None


def test_ratio_is_missing_where_R_L_is_not_positive():
    records = make_records()
    for r in records:
        if r["config"] == "alibi a" and r["eval_len"] == L and r["seed"] == 1:
            r["resolution"] = 0.0
    configs = configurations(records)
    assert "R(2L)/R(L)" not in configs[2].values and "R(2L)" in configs[2].values


def test_design_columns_follow_the_model():
    models = {label: preset("default", encoding=e, xpos_scale_base=32.0).to_dict() for label, e in FAMILY.items()}
    configs = configurations(make_records(), "mean-R", models)
    rope, rope_bca, alibi = configs[0], configs[1], configs[2]
    expected = resolution_pair("rope", L, "mean-R", head_dim=32, base=10000.0, scale=math.sqrt(32))
    assert (rope.values["design R(L)"][0], rope.values["design R(2L)"][2]) == pytest.approx(expected)
    assert rope_bca.values["design R(2L)"] == rope_bca.values["design R(L)"] == rope.values["design R(L)"]
    assert alibi.values["design R(L)"][1] == pytest.approx(resolution_pair("alibi", L, "mean-R", heads=4, scale=1.0)[0])
    assert set(DESIGN_PREDICTORS) <= set(configs[4].values)  # sinusoidal: registry defaults


def test_design_params():
    model = preset("default", encoding="xpos", rope_base=1000.0, xpos_scale_base=32.0, xpos_gamma=0.1).to_dict()
    assert design_params("xpos", model) == {"head_dim": 32, "base": 1000.0, "scale": math.sqrt(32), "gamma": 0.1,
                                            "scale_base": 32}
    assert design_params("alibi", preset("default", alibi_slope_scale=2.0).to_dict()) == {"heads": 4, "scale": 2.0}
    assert design_params("nope", model) == {}
    with pytest.raises(ValueError, match="whole number"):
        design_params("xpos", {**model, "xpos_scale_base": 32.5})
    with pytest.raises(ValueError, match="no design-time curve"):
        design_params("t5", model)
    # BCA: the 2L profile is the L profile with nothing past it.
    assert design_resolution("rope", model, L, bca=True) == (design_resolution("rope", model, L)[0],) * 2


def test_configurations_bad_input():
    records = make_records()
    with pytest.raises(ValueError, match="head_mode"):
        configurations(records, "max")
    with pytest.raises(ValueError, match="non-empty"):
        configurations([])
    with pytest.raises(ValueError, match="lacks"):
        configurations([{k: v for k, v in records[0].items() if k != "config"}])
    layer_mean = next(r for r in records if r["head_mode"] == "mean-scores" and r["layer"] == "mean")
    with pytest.raises(ValueError, match="two records"):
        configurations(records + [layer_mean])
    with pytest.raises(ValueError, match="training lengths"):
        configurations(records + [{**records[0], "train_len": 16}])
    with pytest.raises(ValueError, match="two encodings"):
        configurations(records + [{**records[0], "encoding": "xpos"}])
    with pytest.raises(ValueError, match="models lacks"):
        configurations(records, models={})
