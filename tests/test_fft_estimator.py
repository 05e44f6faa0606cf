"""expected_scores_fft: Eq. 11 from q and k by FFT, against the explicit score-matrix path."""

import math

import pytest
import torch

from attnres_helpers.metric import expected_scores, expected_scores_fft


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


@pytest.mark.parametrize("q, k, match", [
    (torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), r"\(B, H, T, d\)"),
    (torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 5, 2), "same shape"),
    (torch.full((1, 1, 4, 2), float("nan")), torch.zeros(1, 1, 4, 2), "NaN or inf"),
    (torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), "T >= 2"),
    (torch.zeros(1, 1, 4, 2, dtype=torch.long), torch.zeros(1, 1, 4, 2, dtype=torch.long), "float tensor"),
])
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
