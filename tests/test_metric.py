"""Tests for attnres_helpers.metric: R(s) (Sun et al. 2022, Eq. 3) and ŝ[n] (Eq. 11).

Closed forms used below, for the geometric profile s[n] = -m·n with x = e^{-m}, N distances
(p_n = x^n (1-x) / (1-x^N)):

    zero:  R = (1-x)² (1 + x^{2N-1}) / ((1-x^N)² (1+x))
    drop:  R = (1-x)² (1 - x^{2N-2}) / ((1-x^N)² (1+x))     (= zero − p_{N-1}²)
"""

import importlib
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import attnres_helpers
import attnres_helpers.metric
from attnres_helpers.metric import (
    BOUNDARIES,
    HEAD_MODES,
    ScoreAccumulator,
    average_resolution,
    expected_scores,
    expected_scores_fft,
    layer_resolution,
    resolution,
)

NEG_INF = float("-inf")


def geometric_closed_form(m: float, N: int, boundary: str) -> float:
    """R of s[n] = -m·n, n = 0..N-1, from the closed forms in the module docstring (m = 0: their limit)."""
    if m == 0:
        return 1 / N**2 if boundary == "zero" else 0.0
    x = math.exp(-m)
    tail = x ** (2 * N - 1) if boundary == "zero" else -(x ** (2 * N - 2))
    return (1 - x) ** 2 * (1 + tail) / ((1 - x**N) ** 2 * (1 + x))


def resolution_loop(s, boundary: str) -> float:
    """Eq. 3 as printed, one term at a time in plain Python floats, after a max shift."""
    top = max(s)
    e = [math.exp(v - top) for v in s]  # exp(-inf) = 0.0
    e_next = e[1:] + [0.0]  # e^{s[N]} = 0 ...
    terms = [a * (a - b) for a, b in zip(e, e_next)]
    if boundary == "drop":
        terms = terms[:-1]  # ... or the last term left out
    return sum(terms) / sum(e) ** 2


def naive_expected_scores(logits: np.ndarray) -> np.ndarray:
    """ŝ[n] = mean of the finite e_{i, i-n}, one (query, key) pair at a time: (..., T, T) -> (..., T)."""
    T = logits.shape[-1]
    flat = logits.reshape(-1, T, T)
    out = np.full((flat.shape[0], T), NEG_INF)
    for b, matrix in enumerate(flat):
        for n in range(T):
            values = [matrix[i, i - n] for i in range(n, T) if np.isfinite(matrix[i, i - n])]
            if values:
                out[b, n] = sum(values) / len(values)
    return out.reshape(*logits.shape[:-2], T)


def toeplitz_logits(g: np.ndarray, upper: float = NEG_INF) -> np.ndarray:
    """(T, T) matrix with e_{ij} = g[i-j] on and below the diagonal, ``upper`` above it."""
    T = len(g)
    i, j = np.indices((T, T))
    return np.where(j <= i, g[np.clip(i - j, 0, T - 1)], upper)


def bca_allowed(T: int, block: int) -> np.ndarray:
    """(T, T) bool: query i sees key j ≤ i in its own block or the previous one (BCA, §3.3)."""
    i, j = np.indices((T, T))
    return (j <= i) & (j // block >= i // block - 1)


# --- R(s): closed forms and exact values -------------------------------------------------


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("m", [0.05, 0.5, 1.0, 3.0, -0.3])
@pytest.mark.parametrize("N", [2, 5, 64])
def test_geometric_profile_matches_closed_form(m, N, boundary):
    s = -m * np.arange(N)
    assert resolution(s, boundary) == pytest.approx(geometric_closed_form(m, N, boundary), rel=1e-10, abs=1e-14)


def test_drop_closed_form_is_zero_form_minus_last_square():
    m, N = 0.7, 9
    x = math.exp(-m)
    last_p = x ** (N - 1) * (1 - x) / (1 - x**N)
    expected = geometric_closed_form(m, N, "zero") - last_p**2
    assert geometric_closed_form(m, N, "drop") == pytest.approx(expected, rel=1e-12)


def test_long_geometric_profile_tends_to_its_limit():
    # N -> ∞: both forms tend to (1-x)²/(1+x) = (1-x)·tanh(m/2)
    x = math.exp(-0.8)
    for boundary in BOUNDARIES:
        assert resolution(-0.8 * np.arange(2000), boundary) == pytest.approx((1 - x) ** 2 / (1 + x), rel=1e-12)


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_near_delta_profile_tends_to_one(boundary):
    values = [resolution(np.array([0.0] + [-gap] * 31), boundary) for gap in (5.0, 10.0, 20.0, 40.0)]
    assert np.all(np.diff(values) > 0)
    assert 1 - values[-1] < 1e-15
    assert 1 - values[1] < 1e-2


@pytest.mark.parametrize("N", [2, 7, 100])
def test_flat_profile_exact_values(N):
    flat = np.full(N, 3.25)
    assert resolution(flat, "zero") == pytest.approx(1 / N**2, rel=1e-12)
    assert resolution(flat, "drop") == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_invariant_to_adding_a_constant(boundary):
    s = np.random.default_rng(0).normal(size=(4, 30)) * 3
    base = resolution(s, boundary)
    for shift in (-1e3, -7.5, 0.3, 1e4):
        np.testing.assert_allclose(resolution(s + shift, boundary), base, rtol=1e-9)


def test_not_invariant_to_scaling():
    # s = -n and s = -2n have the same shape but R rises with the temperature: 1/e -> 1/e²
    s = -np.arange(10.0)
    r1, r2 = resolution(s), resolution(2 * s)
    assert r1 == pytest.approx(geometric_closed_form(1.0, 10, "zero"), rel=1e-12)
    assert r2 == pytest.approx(geometric_closed_form(2.0, 10, "zero"), rel=1e-12)
    assert r2 - r1 > 0.3


def test_increasing_profile_sign_depends_on_boundary():
    s = 0.5 * np.arange(6)  # scores that grow with distance
    assert resolution(s, "drop") < 0
    # "zero" treats the step past the end as the largest drop of all: R stays positive
    assert resolution(s, "zero") > 0
    assert resolution(s, "zero") == pytest.approx(geometric_closed_form(-0.5, 6, "zero"), rel=1e-12)


def test_zero_boundary_cannot_tell_a_profile_from_its_reverse():
    # Σp² and Σ p_i p_{i+1} are both unchanged when p is read backwards; "drop" is not symmetric
    s = np.random.default_rng(10).normal(size=(5, 20)) * 2
    np.testing.assert_allclose(resolution(s[:, ::-1].copy(), "zero"), resolution(s, "zero"), rtol=1e-12)
    decay = -np.arange(8.0) / 2
    assert resolution(decay, "drop") > 0 > resolution(decay[::-1].copy(), "drop")


# --- R(s): properties on random inputs ---------------------------------------------------

score_profiles = arrays(
    np.float64,
    st.integers(2, 40),
    elements=st.one_of(st.floats(-1e4, 1e4, allow_nan=False), st.floats(-30, 30, allow_nan=False), st.just(NEG_INF)),
).filter(lambda s: np.isfinite(s).any())


def softmax_np(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max())
    return e / e.sum()


@settings(max_examples=300, deadline=None)
@given(score_profiles)
def test_bound_chain_holds_on_random_inputs(s):
    """R = Σp² − Σp_i p_{i+1} ≤ Σp² ≤ max p ≤ 1, and R_zero = ½[Σ(p_i − p_{i+1})² + p_0² + p_{N-1}²] > 0."""
    p = softmax_np(s)
    squares = float((p**2).sum())
    r_zero, r_drop = float(resolution(s, "zero")), float(resolution(s, "drop"))
    assert np.isfinite(r_zero) and np.isfinite(r_drop)
    assert r_zero <= squares + 1e-12
    assert squares <= p.max() + 1e-12
    assert r_zero <= 1.0 and r_drop <= r_zero + 1e-15
    assert r_zero == pytest.approx(0.5 * (np.sum(np.diff(p) ** 2) + p[0] ** 2 + p[-1] ** 2), abs=1e-12)
    assert r_zero > 0 and r_drop > -1
    if np.sort(s)[-2] > s.max() - 30:  # a runner-up within 30 nats: 1 − max p is representable
        assert r_zero < 1 - 1e-14


@settings(max_examples=150, deadline=None)
@given(score_profiles, st.sampled_from(BOUNDARIES))
def test_matches_independent_loop(s, boundary):
    assert float(resolution(s, boundary)) == pytest.approx(resolution_loop(list(s), boundary), rel=1e-9, abs=1e-12)


def test_matches_independent_loop_on_seeded_inputs():
    rng = np.random.default_rng(1)
    for boundary in BOUNDARIES:
        for _ in range(50):
            s = rng.normal(size=rng.integers(2, 50)) * rng.choice([0.1, 1.0, 10.0])
            assert float(resolution(s, boundary)) == pytest.approx(resolution_loop(list(s), boundary), rel=1e-10)


def test_numpy_and_torch_agree_and_keep_their_kind():
    s = np.random.default_rng(2).normal(size=(3, 17))
    for boundary in BOUNDARIES:
        from_numpy = resolution(s, boundary)
        from_torch = resolution(torch.from_numpy(s), boundary)
        assert isinstance(from_numpy, np.ndarray) and from_numpy.shape == (3,)
        assert isinstance(from_torch, torch.Tensor) and from_torch.dtype == torch.float64
        np.testing.assert_allclose(from_torch.numpy(), from_numpy, rtol=1e-13)
        from_float32 = resolution(torch.from_numpy(s).float(), boundary)
        assert from_float32.dtype == torch.float32
        np.testing.assert_allclose(from_float32.numpy(), from_numpy, rtol=1e-5)


def test_batched_equals_looped():
    s = np.random.default_rng(3).normal(size=(2, 3, 11)) * 2
    s[0, 1, 7:] = NEG_INF
    for boundary in BOUNDARIES:
        batched = resolution(s, boundary)
        assert batched.shape == (2, 3)
        looped = [[resolution(s[a, b], boundary) for b in range(3)] for a in range(2)]
        np.testing.assert_array_equal(batched, np.array(looped))


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_huge_scores_neither_overflow_nor_underflow(boundary):
    s = -np.arange(12.0)
    expected = geometric_closed_form(1.0, 12, boundary)
    for offset in (1e4, -1e4):  # e^{±1e4} is inf / 0 in float64
        r = resolution(s + offset, boundary)
        assert np.isfinite(r) and r == pytest.approx(expected, rel=1e-9)
    steep = -1e4 * np.arange(5.0) / 4  # neighbours 2500 nats apart: a delta
    assert resolution(steep, boundary) == pytest.approx(1.0, abs=1e-15)
    torch_r = resolution(torch.tensor(s + 1e4, dtype=torch.float32), boundary)
    assert torch.isfinite(torch_r) and float(torch_r) == pytest.approx(expected, abs=1e-3)


def test_trailing_masked_distances_are_ignored():
    s = np.array([0.0, -0.4, -1.1, -1.5])
    padded = np.concatenate([s, [NEG_INF] * 3])
    assert resolution(padded, "zero") == pytest.approx(resolution(s, "zero"), rel=1e-14)
    # under "drop" the first -inf plays the role of e^{s[N]} = 0, so the padded profile's R is the
    # truncated profile's R under "zero"
    assert resolution(padded, "drop") == pytest.approx(resolution(s, "zero"), rel=1e-14)


# --- ŝ[n]: the estimator of Eq. 11 --------------------------------------------------------


@pytest.mark.parametrize("upper", [NEG_INF, 0.0, 123.0])
def test_expected_scores_of_toeplitz_is_its_sequence(upper):
    g = np.array([4.0, 2.5, -1.0, 0.25, 3.0, -8.0, 0.5])  # dyadic: sums and means are exact
    assert np.array_equal(expected_scores(toeplitz_logits(g, upper)), g)
    g_random = np.random.default_rng(4).normal(size=33)
    np.testing.assert_allclose(expected_scores(toeplitz_logits(g_random, upper)), g_random, rtol=1e-12)


def test_expected_scores_matches_naive_loop():
    logits = np.random.default_rng(5).normal(size=(2, 3, 9, 9))  # (B, H, T, T)
    np.testing.assert_allclose(expected_scores(logits), naive_expected_scores(logits), rtol=1e-12)
    as_torch = expected_scores(torch.from_numpy(logits).float())
    assert isinstance(as_torch, torch.Tensor) and as_torch.shape == (2, 3, 9)
    np.testing.assert_allclose(as_torch.numpy(), naive_expected_scores(logits), rtol=1e-5, atol=1e-6)


def test_masked_pairs_drop_out_with_a_block_mask():
    T, block = 12, 3  # training length l = 6: blocks of l/2, distances up to l−1 = 5 survive
    allowed = bca_allowed(T, block)
    logits = np.where(allowed, np.random.default_rng(6).normal(size=(T, T)), NEG_INF)
    s_hat = expected_scores(logits)
    np.testing.assert_allclose(s_hat, naive_expected_scores(logits), rtol=1e-12)
    assert np.all(np.isfinite(s_hat[: 2 * block])) and np.all(np.isneginf(s_hat[2 * block :]))

    # counts through the public API: pool a masked text of ones with an unmasked text of zeros,
    # then ŝ[n] = c_masked / (c_masked + (T − n))
    acc = ScoreAccumulator()
    acc.update(np.where(allowed, 1.0, NEG_INF)[None])
    acc.update(np.zeros((1, T, T)))
    pooled = acc.mean()
    full = T - np.arange(T)
    counts = np.rint(pooled * full / (1 - pooled)).astype(int)
    expected_counts = [sum(allowed[i, i - n] for i in range(n, T)) for n in range(T)]
    assert counts.tolist() == expected_counts
    assert expected_counts[:6] == [12, 11, 10, 9, 6, 3] and expected_counts[6:] == [0] * 6


def test_chunked_sums_equal_the_naive_loop(monkeypatch):
    """Matrices go through one reused buffer in chunks: mixed masked and unmasked matrices in
    chunks of 2 give what the naive loop gives, matrix by matrix."""
    monkeypatch.setattr(attnres_helpers.metric, "CHUNK_ELEMENTS", 2 * 10 * 10)
    rng = np.random.default_rng(9)
    logits = rng.normal(size=(5, 10, 10))
    logits[1] = np.where(bca_allowed(10, 2), logits[1], NEG_INF)  # masked in the second chunk ...
    logits[4] = np.where(bca_allowed(10, 3), logits[4], NEG_INF)  # ... and in the last, short one
    np.testing.assert_allclose(expected_scores(logits), naive_expected_scores(logits), rtol=1e-12)


def test_fully_masked_distance_is_neg_inf_and_resolution_ignores_it():
    g = np.array([1.0, 0.0, -0.5, -2.0, -3.0, -4.0])
    logits = toeplitz_logits(g)
    logits[np.arange(2, 6), np.arange(0, 4)] = NEG_INF  # the whole distance-2 diagonal
    s_hat = expected_scores(logits)
    assert np.isneginf(s_hat[2])
    kept = np.delete(np.arange(6), 2)
    assert np.array_equal(s_hat[kept], g[kept])
    p = softmax_np(g[kept])
    p_gap = np.insert(p, 2, 0.0)  # p at distance 2 is exactly 0: the terms around it see a cliff
    by_hand = np.sum(p_gap * (p_gap - np.append(p_gap[1:], 0.0)))
    assert resolution(s_hat) == pytest.approx(by_hand, rel=1e-12)


def test_accumulator_equals_expected_scores_of_concatenated_batch():
    rng = np.random.default_rng(7)
    batches = [rng.normal(size=(b, 2, 8, 8)) for b in (3, 1, 4)]  # (B, H, T, T)
    acc = ScoreAccumulator()
    for batch in batches:
        acc.update(batch)
    everything = np.concatenate(batches)  # (8, 2, 8, 8)
    np.testing.assert_allclose(acc.mean(), expected_scores(everything).mean(0), rtol=1e-12)
    assert acc.texts == 8 * 8

    acc_torch = ScoreAccumulator()
    for batch in batches:
        acc_torch.update(torch.from_numpy(batch))
    assert isinstance(acc_torch.mean(), torch.Tensor)
    np.testing.assert_allclose(acc_torch.mean().numpy(), acc.mean(), rtol=1e-12)


def test_accumulator_with_masks_pools_pairs_not_texts():
    # texts with different masks: the pooled mean is the mean over every unmasked pair, which is
    # expected_scores of the texts laid out block-diagonally with -inf between them
    rng = np.random.default_rng(8)
    T = 6
    texts = [np.where(bca_allowed(T, 2), rng.normal(size=(T, T)), NEG_INF), rng.normal(size=(T, T))]
    acc = ScoreAccumulator()
    for text in texts:
        acc.update(text[None])
    block_diagonal = np.full((2 * T, 2 * T), NEG_INF)
    block_diagonal[:T, :T], block_diagonal[T:, T:] = texts
    np.testing.assert_allclose(acc.mean(), expected_scores(block_diagonal)[:T], rtol=1e-12)


def test_accumulator_rejects_bad_use():
    with pytest.raises(ValueError, match="update"):
        ScoreAccumulator().mean()
    acc = ScoreAccumulator()
    acc.update(np.zeros((2, 3, 5, 5)))
    with pytest.raises(ValueError, match="do not match"):
        acc.update(np.zeros((2, 3, 6, 6)))
    with pytest.raises(ValueError, match="do not match"):
        acc.update(np.zeros((2, 4, 5, 5)))
    with pytest.raises(ValueError, match="batch axis"):
        ScoreAccumulator().update(np.zeros((5, 5)))


# --- layers and heads ---------------------------------------------------------------------


def test_layer_resolution_head_modes_by_hand():
    # two geometric heads; their mean profile is geometric with the mean slope
    N, slopes = 16, (0.0, 2.0)
    s_hat = np.stack([-m * np.arange(N) for m in slopes])  # (H, N)
    for boundary in BOUNDARIES:
        mean_scores = layer_resolution(s_hat, "mean-scores", boundary)
        mean_r = layer_resolution(s_hat, "mean-R", boundary)
        assert mean_scores == pytest.approx(geometric_closed_form(1.0, N, boundary), rel=1e-12)
        assert mean_r == pytest.approx(np.mean([geometric_closed_form(m, N, boundary) for m in slopes]), rel=1e-10)
        assert abs(mean_scores - mean_r) > 0.03


def test_layer_and_average_resolution_shapes_and_values():
    rng = np.random.default_rng(9)
    s_hat_layers = rng.normal(size=(3, 4, 10))  # (layers, H, N)
    for head_mode in HEAD_MODES:
        per_layer = layer_resolution(s_hat_layers, head_mode)
        assert per_layer.shape == (3,)
        by_hand = [
            resolution(layer.mean(0)) if head_mode == "mean-scores" else np.mean([resolution(h) for h in layer])
            for layer in s_hat_layers
        ]
        np.testing.assert_allclose(per_layer, by_hand, rtol=1e-12)
        assert average_resolution(s_hat_layers, head_mode) == pytest.approx(np.mean(by_hand), rel=1e-12)
        torch_avg = average_resolution(torch.from_numpy(s_hat_layers), head_mode)
        assert isinstance(torch_avg, torch.Tensor) and float(torch_avg) == pytest.approx(np.mean(by_hand), rel=1e-12)


def test_integer_scores_are_accepted_everywhere():
    s_hat = [[0, -1, -2], [0, 0, -1]]  # (H, N) of integers
    for head_mode in HEAD_MODES:
        expected = layer_resolution(np.array(s_hat, dtype=float), head_mode)
        assert float(layer_resolution(torch.tensor(s_hat), head_mode)) == pytest.approx(float(expected), rel=1e-12)
        assert float(average_resolution(torch.tensor([s_hat]), head_mode)) == pytest.approx(float(expected), rel=1e-12)
    assert np.array_equal(expected_scores(torch.arange(9).reshape(3, 3)).numpy(), [4.0, 5.0, 6.0])


def test_unknown_head_mode_and_bad_shapes_raise():
    with pytest.raises(ValueError, match="head_mode"):
        layer_resolution(np.zeros((2, 5)), head_mode="median")
    with pytest.raises(ValueError, match=r"\(\.\.\., H, N\)"):
        layer_resolution(np.zeros(5))
    with pytest.raises(ValueError, match=r"\(layers, H, N\)"):
        average_resolution(np.zeros((2, 5)))


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.array([]), "empty"),
        (np.zeros((3, 0)), "empty"),
        (np.array([0.5]), "at least 2 distances"),
        (np.array([0.0, np.nan, 1.0]), "NaN"),
        (np.array([0.0, np.inf]), r"\+inf"),
        (np.array([[0.0, -1.0], [NEG_INF, NEG_INF]]), "-inf at every distance"),
        (np.array(["a", "b"]), "numeric"),
        ({"s": [1.0, 2.0]}, "numpy array or a torch tensor"),
        (np.float64(1.0), "at least 2 distances"),
        (torch.tensor(1.0), "at least one axis"),
        (torch.tensor([1j, 0.5]), "real numbers"),
    ],
)
def test_resolution_rejects_bad_scores(bad, message):
    with pytest.raises(ValueError, match=message):
        resolution(bad)


def test_resolution_rejects_unknown_boundary():
    with pytest.raises(ValueError, match="boundary"):
        resolution(np.zeros(4), boundary="wrap")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.zeros((3, 4)), "square"),
        (np.zeros(3), "at least 2 dimensions"),
        (np.zeros((2, 0, 0)), "empty"),
        (np.zeros((1, 1)), "at least 2 positions"),
        (np.array([[0.0, 1.0], [np.nan, 0.0]]), "NaN"),
        (np.array([[0.0, 1.0], [np.inf, 0.0]]), r"\+inf"),
        (np.array([["a", "b"], ["c", "d"]]), "numeric"),
    ],
)
def test_expected_scores_rejects_bad_logits(bad, message):
    with pytest.raises(ValueError, match=message):
        expected_scores(bad)


# One meaning per name: a module of the package and a name exported by the package never collide.
PACKAGE_DIR = Path(attnres_helpers.__file__).resolve().parent
MODULES = sorted(p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem not in ("__init__", "__main__"))


def test_the_module_list_is_the_package():
    assert "metric" in MODULES and "store" in MODULES and "resolution" not in MODULES
    assert len(MODULES) >= 13


@pytest.mark.parametrize("name", MODULES)
def test_one_meaning_per_name(name):
    module = importlib.import_module("attnres_helpers." + name)
    assert isinstance(module, types.ModuleType) and module.__name__ == "attnres_helpers." + name
    assert getattr(attnres_helpers, name, None) in (None, module)
    assert name not in attnres_helpers.__all__


def test_resolution_is_the_function_only():
    assert attnres_helpers.resolution is attnres_helpers.metric.resolution
    assert callable(attnres_helpers.resolution) and not isinstance(attnres_helpers.resolution, types.ModuleType)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("attnres_helpers.resolution")
    assert attnres_helpers.resolution is attnres_helpers.metric.resolution  # the failed import changed nothing
    for exported in attnres_helpers.__all__:
        assert not isinstance(getattr(attnres_helpers, exported), types.ModuleType), exported
    assert attnres_helpers.DESIGN_CURVES is importlib.import_module("attnres_helpers.encodings").DESIGN_CURVES
    assert not hasattr(importlib.import_module("attnres_helpers.encodings"), "ENCODINGS")
    assert not hasattr(importlib.import_module("attnres_helpers.model"), "ENCODINGS")


# ---------------------------------------------------------------------- ŝ by FFT from q and k (expected_scores_fft)


def explicit(q, k, scale):
    T = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, T, T)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return expected_scores(scores.double()).mean(0)  # (H, T)


@pytest.mark.parametrize("T", [2, 7, 64, 129])
def test_fft_matches_the_explicit_path(T):
    g = torch.Generator().manual_seed(T)
    q, k = torch.randn(3, 2, T, 8, generator=g), torch.randn(3, 2, T, 8, generator=g)
    fft = expected_scores_fft(q, k)
    torch.testing.assert_close(fft, explicit(q.double(), k.double(), 1 / math.sqrt(8)), rtol=1e-9, atol=1e-9)


def test_fft_in_float32_agrees_to_1e_4_relative_at_T_1024():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 1024, 32, generator=g) + 0.5, torch.randn(1, 2, 1024, 32, generator=g) + 0.5
    ref = explicit(q, k, 1 / math.sqrt(32))  # float32 scores, float64 sums
    fft = expected_scores_fft(q, k)
    assert ((fft - ref).abs() / ref.abs().clamp(min=1.0)).max() < 1e-4


def test_known_answer_for_constant_vectors():
    """q = k = ones: every pair scores d·scale, so ŝ[n] = √d at every distance."""
    q = torch.ones(2, 1, 10, 16)
    torch.testing.assert_close(expected_scores_fft(q, q), torch.full((1, 10), 4.0, dtype=torch.float64))


def test_a_shift_is_found_at_its_distance():
    """k_j = x_{j+3}, q_i = x_i: q_i·k_{i−n} = x_i·x_{i−n+3}, which is |x_i|², the largest, at n = 3."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 1, 40, 64, generator=g)
    q, k = x[:, :, :-3], x[:, :, 3:]
    assert int(expected_scores_fft(q, k, scale=1.0)[0].argmax()) == 3


@pytest.mark.parametrize(
    "q, k, match",
    [
        (torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), r"\(B, H, T, d\)"),
        (torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 5, 2), "same shape"),
        (torch.zeros(1, 3, 4, 2), torch.zeros(1, 2, 4, 2), "must divide"),
        (torch.full((1, 1, 4, 2), float("nan")), torch.zeros(1, 1, 4, 2), "NaN or inf"),
        (torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), "T >= 2"),
        (torch.zeros(1, 1, 4, 2, dtype=torch.long), torch.zeros(1, 1, 4, 2, dtype=torch.long), "float tensor"),
    ],
)
def test_bad_input_is_refused(q, k, match):
    with pytest.raises(ValueError, match=match):
        expected_scores_fft(q, k)


@pytest.mark.parametrize("T, block", [(16, 4), (17, 4), (40, 8), (10, 8), (9, 4), (64, 32)])
def test_fft_under_bca_counts_and_sink_free_equal_the_explicit_path(T, block):
    """BCA's ŝ by FFT, the pair counts, and ŝ without the (n, 0) entries, against explicit masked scores."""
    from attnres_helpers.metric import diagonal_counts, expected_scores, sink_free_scores
    from attnres_helpers.model import blockwise_causal_mask

    gen = torch.Generator().manual_seed(T)
    q, k = (torch.randn(2, 3, T, 5, dtype=torch.float64, generator=gen) for _ in range(2))
    scores = q @ k.transpose(-1, -2) / 5**0.5
    for b in (None, block):
        allowed = torch.ones(T, T, dtype=torch.bool).tril() if b is None else blockwise_causal_mask(T, b)
        masked = scores.masked_fill(~allowed, float("-inf"))
        want = expected_scores(masked).mean(0)
        got = expected_scores_fft(q, k, block=b)
        assert torch.equal(torch.isneginf(got), torch.isneginf(want))
        torch.testing.assert_close(got[torch.isfinite(want)], want[torch.isfinite(want)])
        counts = torch.stack([torch.diagonal(allowed, -n).sum() for n in range(T)]).double()
        assert torch.equal(diagonal_counts(T, b), counts)
        without = masked.clone()
        without[..., :, 0] = float("-inf")
        want_free = expected_scores(without).mean(0)
        free = sink_free_scores(want, masked[..., :, 0].mean(0), counts)
        assert torch.equal(torch.isneginf(free), torch.isneginf(want_free))
        torch.testing.assert_close(free[torch.isfinite(want_free)], want_free[torch.isfinite(want_free)])


# ------------------------------------------------------------ bad input at the door (adversarial review, round 2)


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
        [[0.0, -1.0, NEG_INF, -3.0, -4.0], [0.0, -2.0, -4.0, -6.0, -8.0], [0.0, -0.5, -1.0, -1.5, -2.0]]
    )  # (H, N): head 0 cannot see distance 2
    finite_mean = np.array([0.0, -3.5 / 3, (-4.0 - 1.0) / 2, -10.5 / 3, -14.0 / 3])
    for boundary in ("zero", "drop"):
        r = layer_resolution(heads, "mean-scores", boundary)
        assert r == pytest.approx(resolution(finite_mean, boundary), rel=1e-12)
        assert r != pytest.approx(
            resolution(heads.mean(0), boundary), rel=1e-3
        )  # a plain mean drops distance 2 for all
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
    np.testing.assert_allclose(
        layer_resolution(heads, "mean-scores"), [resolution(h.mean(0)) for h in heads], rtol=1e-12
    )
    with pytest.raises(ValueError, match="NaN"):
        layer_resolution(np.array([[0.0, np.nan, 1.0], [0.0, NEG_INF, 1.0]]), "mean-scores")
    with pytest.raises(ValueError, match=r"\+inf"):
        layer_resolution(np.array([[0.0, np.inf, 1.0], [0.0, NEG_INF, 1.0]]), "mean-scores")
    with pytest.raises(ValueError, match="-inf at every distance"):
        layer_resolution(np.full((2, 3), NEG_INF), "mean-scores")


# --- 5. a non-string encoding name --------------------------------------------------------
