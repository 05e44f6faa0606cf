"""A long-range copy probe: can a model still use a span it saw g tokens back? (plan v2, notebook 05)

A span of S held-out bytes, then g bytes of unrelated held-out text, then the same span again: the
window is [span][gap][span], T = 2S + g tokens. The control window is the same but for its first
span, replaced by another held-out span of the same length. The **copy gain** at gap g is

    gain(g) = mean NLL of the second span's bytes in the control window
              − mean NLL of the same bytes in the copy window          (nats a byte),

over the probes: the same positions, the same gap, the same scored bytes, so it isolates what the
first copy is worth to the model. It needs no extra training. A model that ignores its context has
gain 0; a model that copies perfectly from S + g tokens back has a gain of its whole NLL on unseen text.

The plan (``data/results/family_plan_v2.md``) fixes S = 32, 64 probes, the gaps as multiples of L
(0, 1/4, 1/2, 3/4, 5/4, 3/2, 7/4, 5/2, 7/2: at L = 128 that is 0 … 448, T from L/2 to 4L), the
outcome at g = 3/2·L (T = 2L; the copies 224 positions apart at L = 128, between L and 2L) and its
in-distribution partner at g = L/2 (T = L). Spans, control spans and gaps come from disjoint blocks
of the held-out split, drawn by ``numpy.random.default_rng(0)``; every gap uses the same probes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

SPAN = 32
N_PROBES = 64
GAP_MULTIPLES = (0.0, 0.25, 0.5, 0.75, 1.25, 1.5, 1.75, 2.5, 3.5)  # of L
OUTCOME_MULTIPLE = 1.5  # the plan's outcome: g = 1.5 L, in a window of 2L
WITHIN_MULTIPLE = 0.5  # its partner inside the training length: g = L/2, a window of L


def gaps_for(train_len: int) -> tuple[int, ...]:
    """The plan's gaps for training length L: each multiple of L, rounded to a whole token."""
    return tuple(int(round(m * train_len)) for m in GAP_MULTIPLES)


@dataclass(frozen=True)
class CopyProbes:
    """``n`` probes: ``spans`` and ``controls`` (n, S) and ``gap_text`` (n, max_gap) int64 token ids;
    ``orders`` (n, S): a random permutation of each span's positions (the scrambled control)."""

    spans: torch.Tensor
    controls: torch.Tensor
    gap_text: torch.Tensor
    orders: torch.Tensor

    def scrambled(self, gap: int) -> torch.Tensor:
        """The scrambled-control windows (n, 2S + gap): [the span's bytes in a random order][gap][span],
        the same bytes as the copy window's first span, without their order."""
        copy, _ = self.windows(gap)
        S = self.spans.shape[1]
        return torch.cat([self.spans.gather(1, self.orders), copy[:, S:]], dim=1)

    def windows(self, gap: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(copy, control) windows (n, 2S + gap): [span][gap][span] and [control][gap][span]."""
        if isinstance(gap, bool) or not isinstance(gap, (int, np.integer)) or not 0 <= gap <= self.gap_text.shape[1]:
            raise ValueError(f"gap must be an integer in [0, {self.gap_text.shape[1]}], got {gap!r}")
        middle = self.gap_text[:, :gap]
        return (
            torch.cat([self.spans, middle, self.spans], dim=1),
            torch.cat([self.controls, middle, self.spans], dim=1),
        )


def _check_integers(**values: tuple) -> None:
    """Each ``name=(value, low)``: ``value`` must be an integer >= low, else one error naming it."""
    for name, (value, low) in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def copy_probes(
    tokens: torch.Tensor, span: int = SPAN, max_gap: int = 448, n_probes: int = N_PROBES, rng: int = 0
) -> CopyProbes:
    """Probes from disjoint blocks of ``tokens`` (the held-out split): the held-out text is cut into
    blocks of max(span, max_gap) tokens, and 3·n_probes distinct blocks are drawn by
    ``numpy.random.default_rng(rng)``: the first n give the spans, the next n the control spans (each
    its block's first ``span`` tokens), the last n the gap text (each a whole block)."""
    _check_integers(span=(span, 1), max_gap=(max_gap, 0), n_probes=(n_probes, 1))
    block = max(span, max_gap)
    n_blocks = len(tokens) // block
    if n_blocks < 3 * n_probes:
        raise ValueError(
            f"{len(tokens)} tokens hold {n_blocks} blocks of {block}, fewer than the {3 * n_probes} "
            f"that {n_probes} probes need"
        )
    picks = np.random.default_rng(rng).choice(n_blocks, size=3 * n_probes, replace=False)
    blocks = tokens[: n_blocks * block].view(n_blocks, block).long()[torch.from_numpy(picks)]  # (3n, block)
    orders = torch.from_numpy(np.random.default_rng([rng, 1]).permuted(np.tile(np.arange(span), (n_probes, 1)), axis=1))
    return CopyProbes(
        blocks[:n_probes, :span], blocks[n_probes : 2 * n_probes, :span], blocks[2 * n_probes :, :max_gap], orders
    )


@torch.no_grad()
def span_nll(
    model: torch.nn.Module, windows: torch.Tensor, span: int, bca: bool = False, batch_size: int = 64
) -> torch.Tensor:
    """Mean NLL (nats a token) of the last ``span`` tokens of each window ``(n, T)``: ``(n,)`` float64.
    The model reads window[:, :-1] and predicts window[:, 1:] (``model(idx, bca=bca) -> (logits, _)``)."""
    model.eval()
    out = []
    for batch in windows.split(batch_size):
        x, y = batch[:, :-1], batch[:, 1:]
        logits, _ = model(x, bca=bca) if bca else model(x)  # (b, T-1, V)
        nll = F.cross_entropy(logits[:, -span:].float().transpose(1, 2), y[:, -span:], reduction="none")  # (b, S)
        out.append(nll.double().mean(-1).cpu())
    return torch.cat(out)


def first_copy_in_reach_under_bca(gap: int, train_len: int, n_layer: int, span: int = SPAN) -> bool:
    """Whether, under BCA (blocks of b = L/2, a query seeing its own block and the previous one), the
    first copy can change the model's predictions of the second at all. Each layer moves information
    back at most one block, so the earliest query scored, at position S + g − 1, reaches back to
    (⌊(S + g − 1)/b⌋ − n_layer)·b; the first copy holds positions 0 … S − 1. Where False, the copy
    gain under BCA is zero up to float rounding. (Under the causal mask every position is in reach.)
    L must be at least 2 (a block of at least one token), and the model at least one layer deep."""
    _check_integers(gap=(gap, 0), train_len=(train_len, 2), n_layer=(n_layer, 1), span=(span, 1))
    block = train_len // 2
    return ((span + gap - 1) // block - n_layer) * block <= span - 1


@dataclass(frozen=True)
class CopyCurve:
    """The probe's result for one model and mask: per gap and probe, the second span's mean NLL in the
    copy window and in the control window, ``(gaps, probes)`` float64."""

    gaps: tuple[int, ...]
    nll_copy: torch.Tensor
    nll_control: torch.Tensor

    def gains(self) -> torch.Tensor:
        """Per gap and probe, NLL in the control window − NLL in the copy window: ``(gaps, probes)``."""
        return self.nll_control - self.nll_copy

    def gain(self, gap: int) -> float:
        """The copy gain at ``gap``: the mean over probes (nats a token)."""
        if gap not in self.gaps:
            raise ValueError(f"gap {gap} was not measured; measured: {list(self.gaps)}")
        return float(self.gains()[self.gaps.index(gap)].mean())


def copy_curve(
    model: torch.nn.Module, probes: CopyProbes, gaps: Sequence[int], bca: bool = False, scrambled: bool = False
) -> CopyCurve:
    """The copy probe at every gap (the same probes at each); ``scrambled``: against the scrambled control
    instead of the unrelated span."""
    span = probes.spans.shape[1]
    copy, control = [], []
    for gap in gaps:
        with_copy, without = probes.windows(gap)
        copy.append(span_nll(model, with_copy, span, bca))
        control.append(span_nll(model, probes.scrambled(gap) if scrambled else without, span, bca))
    return CopyCurve(tuple(int(g) for g in gaps), torch.stack(copy), torch.stack(control))
