"""The copy probe (plan v2's retrieval outcome), on models with known answers."""

import re

import pytest
import torch
import torch.nn as nn

from attnres_helpers.data import load_splits
from attnres_helpers.model import blockwise_causal_mask
from attnres_helpers.probe import SPAN, CopyProbes, copy_curve, copy_probes, first_copy_in_reach_under_bca, gaps_for

LOGIT = 10.0


class Copier(nn.Module):
    """Predicts, with logit 10 on one byte, the byte ``distance`` positions back of the target."""

    def __init__(self, distance: int):
        super().__init__()
        self.distance = distance

    def forward(self, idx, targets=None, bca=False):
        B, T = idx.shape
        logits = torch.zeros(B, T, 256)
        source = torch.arange(T) - self.distance + 1  # the input position holding target[t]'s earlier copy
        seen = source >= 0
        logits[:, seen] = LOGIT * nn.functional.one_hot(idx[:, source[seen]], 256).float()
        return logits, None


class Blind(nn.Module):
    """The same prediction at every position, whatever the context."""

    def forward(self, idx, targets=None, bca=False):
        return torch.linspace(-1, 1, 256).expand(*idx.shape, 256), None


@pytest.fixture(scope="module")
def probes():
    return copy_probes(load_splits()[1], max_gap=448)


def test_the_plans_gaps_and_probes(probes):
    assert gaps_for(128) == (0, 32, 64, 96, 160, 192, 224, 320, 448)
    assert probes.spans.shape == probes.controls.shape == (64, SPAN) and probes.gap_text.shape == (64, 448)
    again = copy_probes(load_splits()[1], max_gap=448)
    assert all(
        torch.equal(a, b)
        for a, b in zip((probes.spans, probes.controls, probes.gap_text), (again.spans, again.controls, again.gap_text))
    )  # rng = 0
    copy, control = probes.windows(192)
    assert copy.shape == control.shape == (64, 2 * SPAN + 192) and copy.shape[1] == 256  # T = 2L at L = 128
    assert torch.equal(copy[:, :SPAN], copy[:, -SPAN:]) and torch.equal(control[:, -SPAN:], copy[:, -SPAN:])
    assert torch.equal(copy[:, SPAN:-SPAN], control[:, SPAN:-SPAN]) and not torch.equal(
        control[:, :SPAN], copy[:, :SPAN]
    )


def test_probes_come_from_disjoint_blocks():
    tokens = torch.arange(448 * 200) % 251  # every block of 448 tokens has its own content
    p = copy_probes(tokens, max_gap=448, n_probes=60)
    starts = [int(t[0]) for t in (*p.spans, *p.controls, *p.gap_text)]
    assert len(set(starts)) == 180  # 3 x 60 different blocks
    with pytest.raises(ValueError, match="fewer than the 192"):
        copy_probes(tokens[: 448 * 100], max_gap=448)


@pytest.mark.parametrize("gap", [0, 64, 192])
def test_a_perfect_copier_gains_its_logit_where_the_control_differs(probes, gap):
    """Copying from exactly S + g back: NLL log(e^10 + 255) − 10 on the copy, log(e^10 + 255) where the
    control's byte differs, so the gain is 10 x the fraction of differing bytes, to float precision."""
    curve = copy_curve(Copier(SPAN + gap), probes, [gap])
    differs = (probes.controls != probes.spans).double().mean(1)  # (probes,)
    torch.testing.assert_close(curve.gains()[0], LOGIT * differs, atol=1e-5, rtol=0)
    assert curve.gain(gap) > 9.0
    assert abs(copy_curve(Copier(SPAN + gap + 1), probes, [gap]).gain(gap)) < 0.5  # one position off: no copy


def test_a_context_blind_model_gains_nothing(probes):
    curve = copy_curve(Blind(), probes, gaps_for(128))
    assert torch.equal(curve.gains(), torch.zeros(9, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="gap 5 was not measured"):
        curve.gain(5)


def test_bad_gaps_are_refused(probes):
    with pytest.raises(ValueError, match=r"gap must be an integer in \[0, 448\]"):
        probes.windows(449)
    with pytest.raises(ValueError, match="gap must be an integer"):
        probes.windows(1.5)
    assert isinstance(probes, CopyProbes)


@pytest.mark.parametrize("train_len, n_layer, span", [(16, 1, 4), (16, 3, 4), (32, 2, 8), (128, 4, 32)])
def test_the_reach_under_bca_is_the_mask_stacked_layer_by_layer(train_len, n_layer, span):
    """Brute force: position i depends on j after n layers iff (A^n)[i, j] for the BCA mask A (its
    diagonal included); the scored queries are S + g − 1 … 2S + g − 2, the first copy 0 … S − 1."""
    for gap in range(0, 4 * train_len, 3):
        T = 2 * span + gap
        step = blockwise_causal_mask(T, train_len // 2).double()
        reach = torch.linalg.matrix_power(step, n_layer) > 0  # (T, T)
        expected = bool(reach[span + gap - 1 : T - 1, :span].any())
        assert first_copy_in_reach_under_bca(gap, train_len, n_layer, span) == expected, gap


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gap=0, train_len=1, n_layer=2), "train_len must be an integer >= 2, got 1"),
        (dict(gap=-5, train_len=128, n_layer=4), "gap must be an integer >= 0, got -5"),
        (dict(gap=10, train_len=128, n_layer=4, span=0), "span must be an integer >= 1, got 0"),
        (dict(gap=10, train_len=128, n_layer=0), "n_layer must be an integer >= 1, got 0"),
        (dict(gap=1.5, train_len=128, n_layer=4), "gap must be an integer >= 0, got 1.5"),
        (dict(gap=True, train_len=128, n_layer=4), "gap must be an integer >= 0, got True"),
    ],
)
def test_the_reach_under_bca_refuses_what_has_no_reach(kwargs, message):
    """L = 1 has no block of L/2 (it divided by zero); a negative gap or an empty span has no copy to
    reach (they read as in reach); a model without layers has no BCA to stack."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        first_copy_in_reach_under_bca(**kwargs)


class Unigram(nn.Module):
    """Predicts each byte by how often it occurred earlier in the window: blind to order."""

    def forward(self, idx, targets=None, bca=False):
        counts = nn.functional.one_hot(idx, 256).double().cumsum(1)  # (B, T, 256): bytes up to and incl. t
        return torch.log(counts + 1.0).float(), None


def test_the_scrambled_control_has_the_spans_bytes_without_their_order(probes):
    scrambled = probes.scrambled(64)
    copy, _ = probes.windows(64)
    assert torch.equal(scrambled[:, SPAN:], copy[:, SPAN:])
    assert torch.equal(scrambled[:, :SPAN].sort(-1).values, probes.spans.sort(-1).values)  # the same bytes
    assert (scrambled[:, :SPAN] != probes.spans).any(-1).float().mean() > 0.9  # in another order


def test_ordered_copying_beats_the_scrambled_control_and_a_bag_of_bytes_does_not(probes):
    gaps = (0, 64)
    copier = copy_curve(Copier(SPAN + 64), probes, (64,), scrambled=True)
    assert copier.gain(64) > 5.0  # the copy is exact, the scrambled span useless at that distance
    bag = copy_curve(Unigram(), probes, gaps, scrambled=True)
    assert torch.allclose(bag.gains(), torch.zeros_like(bag.gains()), atol=1e-5)  # the same bytes, in any order
