"""Rank statistics of stats.py: average ranks and Spearman's ρ, and the design-time R of a trained model."""

import math

import numpy as np
import pytest

from attnres_helpers.encodings import resolution_pair
from attnres_helpers.model import preset
from attnres_helpers.stats import average_ranks, design_params, design_resolution, spearman

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


# --------------------------------------------------------------------------- design-time R


def test_design_resolution_follows_the_model():
    models = {e: preset("default", encoding=e, xpos_scale_base=32.0).to_dict() for e in ("rope", "alibi", "sinusoidal")}
    expected = resolution_pair("rope", L, "mean-R", head_dim=32, base=10000.0, scale=math.sqrt(32))
    assert design_resolution("rope", models["rope"], L, head_mode="mean-R") == pytest.approx(expected)
    assert design_resolution("alibi", models["alibi"], L, head_mode="mean-R")[0] == pytest.approx(
        resolution_pair("alibi", L, "mean-R", heads=4, scale=1.0)[0])
    assert design_resolution("sinusoidal", models["sinusoidal"], L, head_mode="mean-R") == pytest.approx(
        resolution_pair("sinusoidal", L, "mean-R"))  # registry defaults


def test_design_params():
    model = preset("default", encoding="xpos", rope_base=1000.0, xpos_scale_base=32.0, xpos_gamma=0.1).to_dict()
    assert design_params("xpos", model) == {"head_dim": 32, "base": 1000.0, "scale": math.sqrt(32), "gamma": 0.1,
                                            "scale_base": 32}
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
