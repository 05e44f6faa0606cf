"""Inference-time masks: pair counts and ŝ against the explicit (T, T) computation."""

import pytest
import torch

from attnres_helpers.masks import Mask, expected_scores_masked
from attnres_helpers.metric import expected_scores

MASKS = [Mask(), Mask("bca", 8), Mask("bca", 8, 4), Mask("window", 16), Mask("window", 16, 4), Mask("causal", None, 3)]


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_pair_counts_are_the_masks_diagonal_sums(mask):
    T = 50
    allowed = mask.allowed(T)
    explicit = torch.tensor([allowed.diagonal(-n).sum().item() for n in range(T)], dtype=torch.float64)
    assert torch.equal(mask.pair_counts(T), explicit)


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_s_hat_under_a_mask_equals_the_masked_scores_diagonal_means(mask):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 50, 8, generator=g), torch.randn(2, 3, 50, 8, generator=g)
    scores = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~mask.allowed(50), float("-inf"))
    explicit = expected_scores(scores.double()).mean(0)
    fast = expected_scores_masked(q, k, 0.3, mask)
    assert torch.equal(torch.isfinite(fast), torch.isfinite(explicit))
    finite = torch.isfinite(explicit)
    assert torch.allclose(fast[finite], explicit[finite], atol=1e-5)  # the explicit scores are float32


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_grouped_query_keys_give_the_s_hat_of_their_repeated_heads(mask):
    """Six query heads reading three key heads (two each): k's heads once, or repeated as the attention
    repeats them, the same ŝ (float64 inputs, so only the summation order differs)."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 6, 40, 8, generator=g, dtype=torch.float64), torch.randn(2, 3, 40, 8, generator=g)
    shared = expected_scores_masked(q, k.double(), 0.3, mask)
    repeated = expected_scores_masked(q, k.double().repeat_interleave(2, dim=1), 0.3, mask)
    assert torch.equal(torch.isfinite(shared), torch.isfinite(repeated))
    torch.testing.assert_close(shared, repeated, atol=1e-12, rtol=0)


def test_which_masks_are_causal_inside_their_reach():
    assert Mask("bca", 8, 4).is_causal_at(16) and not Mask("bca", 8).is_causal_at(17)
    assert Mask("window", 16, 4).is_causal_at(16) and not Mask("window", 16).is_causal_at(17)
    assert torch.equal(Mask("bca", 8).allowed(16), Mask().allowed(16))
    assert torch.equal(Mask("window", 16, 4).allowed(16), Mask().allowed(16))


def test_bad_masks_are_refused():
    for bad in (
        dict(kind="band"),
        dict(kind="bca"),
        dict(kind="causal", size=4),
        dict(kind="window", size=0),
        dict(sinks=-1),
    ):
        with pytest.raises(ValueError):
            Mask(**bad)
