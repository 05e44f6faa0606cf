"""Input handling found by an adversarial review: each test reproduces one failure and pins the fix."""

import numpy as np
import pytest
import torch

from attnres_helpers.encodings import (
    SCALE_LIMIT,
    alibi_score_curve,
    curve_pair,
    kerple_log_score_curve,
    resolution_pair,
    rope_score_curve,
    score_curve,
    t5_score_curve,
)
from attnres_helpers.metric import (
    ScoreAccumulator,
    expected_scores,
    layer_resolution,
    resolution,
)
from attnres_helpers.widgets import compare_states, explorer_state, min_max_decimate

NEG_INF = float("-inf")


# --- 1. expected_scores must not overflow silently ----------------------------------------


def test_expected_scores_of_huge_finite_logits_raises_instead_of_returning_inf():
    with pytest.raises(ValueError, match="too large to average.*overflow"):
        expected_scores(np.full((4, 4), 1e308))
    with pytest.raises(ValueError, match="too large to average"):
        expected_scores(np.full((4, 4), -1e308))  # would otherwise read as a masked (-inf) distance
    with pytest.raises(ValueError, match="too large to average"):
        expected_scores(torch.full((2, 4, 4), 1e308, dtype=torch.float64))


def test_expected_scores_of_large_float32_logits_are_summed_in_float64():
    # 3e38 is finite in float32 but four of them overflow a float32 sum; the mean is 3e38
    logits = torch.full((4, 4), 3e38, dtype=torch.float32)
    s_hat = expected_scores(logits)
    assert s_hat.dtype == torch.float32
    assert torch.all(torch.isfinite(s_hat)) and torch.allclose(s_hat, logits[0], rtol=1e-6)


def test_score_accumulator_refuses_overflowing_logits():
    acc = ScoreAccumulator()
    with pytest.raises(ValueError, match="too large to average"):
        acc.update(np.full((3, 4, 4), 1e308))
    acc = ScoreAccumulator()
    acc.update(np.full((1, 4, 4), 2.5e307))  # one text: its sums (at most 4 entries) fit
    acc.update(np.full((1, 4, 4), 2.5e307))  # two: the running totals overflow
    with pytest.raises(ValueError, match="too large to average"):
        acc.mean()


# --- 2. empty per-head scores -------------------------------------------------------------


@pytest.mark.parametrize("head_mode", ["mean-scores", "mean-R"])
def test_layer_resolution_of_empty_heads_says_empty(head_mode):
    with pytest.raises(ValueError, match=r"empty \(shape \(0, 5\)\)") as info:
        layer_resolution(np.zeros((0, 5)), head_mode)
    assert "NaN" not in str(info.value)


# --- 3. 0-d input -------------------------------------------------------------------------


@pytest.mark.parametrize("scalar", [np.float64(1.0), np.array(1.0), np.float32(1.0), np.int64(3), 1.0])
def test_zero_d_scores_say_they_need_a_distances_axis(scalar):
    with pytest.raises(ValueError, match=r"at least one axis \(distances last.*got a scalar \(0-d array\)") as info:
        resolution(scalar)
    assert "got 1" not in str(info.value)


def test_zero_d_logits_report_their_real_shape():
    with pytest.raises(ValueError, match=r"at least 2 dimensions \(\.\.\., T, T\), got shape \(\)"):
        expected_scores(np.array(1.0))


# --- 4. mean-scores with a head masked at some distance -----------------------------------


def test_mean_scores_averages_each_distance_over_the_heads_that_see_it():
    heads = np.array(
        [
            [0.0, -1.0, NEG_INF, -3.0, -4.0],
            [0.0, -2.0, -4.0, -6.0, -8.0],
            [0.0, -0.5, -1.0, -1.5, -2.0],
        ]
    )  # (H, N): head 0 cannot see distance 2
    finite_mean = np.array([0.0, -3.5 / 3, (-4.0 - 1.0) / 2, -10.5 / 3, -14.0 / 3])
    for boundary in ("zero", "drop"):
        r = layer_resolution(heads, "mean-scores", boundary)
        assert r == pytest.approx(resolution(finite_mean, boundary), rel=1e-12)
        assert r != pytest.approx(resolution(heads.mean(0), boundary), rel=1e-3)  # a plain mean drops distance 2 for all
    torch_r = layer_resolution(torch.from_numpy(heads), "mean-scores")
    assert float(torch_r) == pytest.approx(resolution(finite_mean), rel=1e-12)


def test_mean_scores_keeps_a_distance_masked_in_every_head_masked():
    heads = np.array([[0.0, -1.0, NEG_INF, -3.0], [0.0, -2.0, NEG_INF, -1.0]])
    expected = resolution(np.array([0.0, -1.5, NEG_INF, -2.0]))
    assert layer_resolution(heads, "mean-scores") == pytest.approx(expected, rel=1e-12)
    # and the excluded distance really contributes nothing: same as leaving its weight at 0
    p = np.exp([0.0, -1.5, -2.0]) / np.exp([0.0, -1.5, -2.0]).sum()
    by_hand = p[0] * (p[0] - p[1]) + p[1] * (p[1] - 0.0) + p[2] * p[2]
    assert expected == pytest.approx(by_hand, rel=1e-12)


def test_mean_scores_without_masking_is_the_plain_mean_and_nan_is_still_refused():
    rng = np.random.default_rng(0)
    heads = rng.normal(size=(2, 4, 12))
    np.testing.assert_allclose(layer_resolution(heads, "mean-scores"), [resolution(h.mean(0)) for h in heads], rtol=1e-12)
    with pytest.raises(ValueError, match="NaN"):
        layer_resolution(np.array([[0.0, np.nan, 1.0], [0.0, NEG_INF, 1.0]]), "mean-scores")
    with pytest.raises(ValueError, match=r"\+inf"):
        layer_resolution(np.array([[0.0, np.inf, 1.0], [0.0, NEG_INF, 1.0]]), "mean-scores")
    with pytest.raises(ValueError, match="-inf at every distance"):
        layer_resolution(np.full((2, 3), NEG_INF), "mean-scores")


# --- 5. a non-string encoding name --------------------------------------------------------


@pytest.mark.parametrize("name", [["rope"], ("rope",), None, 3])
def test_score_curve_name_must_be_a_string(name):
    with pytest.raises(ValueError, match="must be a string.*known encodings: sinusoidal, rope, xpos, alibi"):
        score_curve(name, 8)


# --- 6. upper bounds on scale-like parameters ---------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: score_curve("alibi", 16, slope=1e308), r"slope must lie in \[0, 1e\+06\], got 1e\+308"),
        (lambda: alibi_score_curve(16, slope=1e7), r"slope must lie in \[0, 1e\+06\]"),
        (lambda: alibi_score_curve(16, scale=1e308), r"scale must lie in \[-1e\+06, 1e\+06\]"),
        (lambda: rope_score_curve(16, scale=-1e308), r"scale must lie in \[-1e\+06, 1e\+06\]"),
        (lambda: kerple_log_score_curve(16, p=1e308, scale=1e308), r"p must lie in \[0, 1e\+06\]"),
        (lambda: kerple_log_score_curve(16, a=1e300), r"a must lie in \[0, 1e\+06\]"),
        (lambda: t5_score_curve(16, bias_decay=1e300), r"bias_decay must lie in \[0, 1e\+06\]"),
    ],
)
def test_scale_like_parameters_have_a_finite_upper_bound(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_largest_allowed_slope_still_gives_a_finite_resolution():
    assert resolution(score_curve("alibi", 4096, slope=SCALE_LIMIT, scale=1.0)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="slope must be >= 0"):  # the lower bound's message is unchanged
        score_curve("alibi", 16, slope=-0.1)


# --- 7. curve_pair needs 2L distances -----------------------------------------------------


def test_curve_pair_refuses_a_curve_that_is_not_2L_long():
    curve = score_curve("rope", 16)
    assert curve_pair(curve, 8) == resolution_pair("rope", 8)
    for L in (16, 20, 5):
        with pytest.raises(ValueError, match=rf"2L = {2 * L} distances .* for L = {L}, got 16"):
            curve_pair(curve, L)
    with pytest.raises(ValueError, match=r"2L = 32 distances"):
        curve_pair(score_curve("alibi", 16), 16)  # (H, N) too
    with pytest.raises(ValueError, match="L must be an integer >= 2"):
        curve_pair(curve, 1)


# --- 8. messages name the L the user gave -------------------------------------------------


@pytest.mark.parametrize("L", [-3, 0, 1, 2.5, True])
def test_explorer_messages_report_the_given_L(L):
    with pytest.raises(ValueError, match=rf"L must be an integer >= 2 .*got {L!r}$") as info:
        explorer_state("rope", L)
    assert "N must" not in str(info.value)
    with pytest.raises(ValueError, match=rf"L must be an integer >= 2 .*got {L!r}$"):
        compare_states(["rope"], L)
    with pytest.raises(ValueError, match=rf"L must be an integer >= 2 .*got {L!r}$"):
        resolution_pair("rope", L)


# --- 9. compare_states with a single string -----------------------------------------------


def test_compare_states_refuses_a_single_string():
    with pytest.raises(ValueError, match="names must be a list of encoding names, got a string 'rope'"):
        compare_states("rope", 16)
    assert [s["name"] for s in compare_states(("rope",), 16)] == ["rope"]


# --- 10. min_max_decimate buckets ---------------------------------------------------------


@pytest.mark.parametrize("buckets", [0, -1, 2.5, True])
def test_min_max_decimate_refuses_bad_buckets(buckets):
    x = np.arange(100.0)
    with pytest.raises(ValueError, match="buckets must be >= 1"):
        min_max_decimate(x, x, buckets=buckets)
