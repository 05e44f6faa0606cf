"""Attention masks chosen at inference: causal, BCA, a causal window, each optionally keeping the first tokens.

A :class:`Mask` says which (query i, key j) pairs may attend, j <= i always:

- ``causal``: every earlier key;
- ``bca``: blockwise causal attention with blocks of ``size`` (Sun et al. 2022, §3.3): key j is seen when
  (i // size − 1)·size <= j;
- ``window``: a causal window of ``size`` keys, i − j < size;

and with ``sinks = s > 0`` the keys 0 … s − 1 stay visible to every query as well (StreamingLLM's
attention sinks, Xiao et al. 2023, with a window: its mask, at the text's positions, without the move of
cached keys to cache positions that its code also makes; "BCA that keeps the first tokens" with BCA).

ŝ under such a mask (Eq. 11) is the mean over the allowed pairs at each distance, so it needs the pair
counts (:meth:`Mask.pair_counts`) and, for the sink pairs, the scores of every query on the first keys:
:meth:`Mask.sink_pairs` lists the pairs the sinks add to the base mask.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch

from .metric import diagonal_counts

KINDS = ("causal", "bca", "window")


@dataclass(frozen=True)
class Mask:
    kind: str = "causal"
    size: int | None = None  # BCA's block, or the window's width; None for causal
    sinks: int = 0  # first keys every query keeps

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"mask kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "causal") != (self.size is None):
            raise ValueError(f"a {self.kind} mask {'takes no' if self.kind == 'causal' else 'needs a'} size")
        if self.size is not None and (isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1):
            raise ValueError(f"mask size must be a positive integer, got {self.size!r}")
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"sinks must be an integer >= 0, got {self.sinks!r}")

    def as_dict(self) -> dict:
        return asdict(self)

    def _base(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        allowed = j <= i
        if self.kind == "bca":
            allowed = allowed & (j >= (i // self.size - 1) * self.size)
        elif self.kind == "window":
            allowed = allowed & (i - j < self.size)
        return allowed

    def first_key(self, i: int) -> int:
        """The first key query ``i`` may attend to, sinks aside (non-decreasing in i for every kind)."""
        if self.kind == "bca":
            return max(0, (i // self.size - 1) * self.size)
        if self.kind == "window":
            return max(0, i - self.size + 1)
        return 0

    def allowed_pairs(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Whether each query i may attend to key j (broadcast), the sinks included."""
        return self._base(i, j) | ((j < self.sinks) & (j <= i))

    def allowed(self, T: int) -> torch.Tensor:
        """(T, T) bool, True where query i may attend to key j."""
        return self.allowed_pairs(torch.arange(T)[:, None], torch.arange(T)[None, :])

    def is_causal_at(self, T: int) -> bool:
        """Whether, in a window of T tokens, this mask allows exactly the causal pairs."""
        if self.kind == "causal":
            return True
        reach = 2 * self.size if self.kind == "bca" else self.size
        return T <= reach

    def sink_pairs(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries, keys) of the pairs the sinks add to the base mask, int64 each (keys < sinks)."""
        qs, ks = [], []
        for j in range(min(self.sinks, T)):
            i = torch.arange(j, T)
            extra = ~self._base(i, torch.full_like(i, j))
            qs.append(i[extra])
            ks.append(torch.full_like(i[extra], j))
        if not qs:
            return torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)
        return torch.cat(qs), torch.cat(ks)

    def pair_counts(self, T: int) -> torch.Tensor:
        """Allowed pairs at each distance n, (T,) float64 (closed forms; the sinks' extra pairs added)."""
        return _pair_counts(self, T).clone()

    def _pair_counts(self, T: int) -> torch.Tensor:
        n = torch.arange(T, dtype=torch.float64)
        if self.kind == "causal":
            counts = T - n
        elif self.kind == "bca":
            counts = diagonal_counts(T, self.size)
        else:
            counts = torch.where(n < self.size, T - n, torch.zeros_like(n))
        queries, keys = self.sink_pairs(T)
        return counts.index_add(0, queries - keys, torch.ones(len(queries), dtype=torch.float64))


@functools.lru_cache(maxsize=32)
def _pair_counts(mask: Mask, T: int) -> torch.Tensor:
    return mask._pair_counts(T)


CAUSAL = Mask()


def expected_scores_masked(q: torch.Tensor, k: torch.Tensor, scale: float, mask: Mask) -> torch.Tensor:
    """Eq. 11 under ``mask``: ``q (B, H, T, d)``, ``k (B, H_k, T, d)`` (H_k dividing H) ``-> ŝ (H, T)``
    float64, the mean over the batch and over the allowed pairs at each distance (-inf where none is
    allowed). The base mask's sums come by FFT (:func:`metric.expected_scores_fft`); the sinks' extra
    pairs (at most ``sinks`` per distance) are picked from every query's scores on the first ``sinks``
    keys, (H, T, sinks)."""
    from .metric import expected_scores_fft

    B, H, T, _ = q.shape
    base = Mask(mask.kind, mask.size)
    mean = expected_scores_fft(q, k, scale, block=mask.size if mask.kind == "bca" else None)  # (H, T)
    counts = base.pair_counts(T).to(q.device)
    if mask.kind == "window":
        mean = torch.where(torch.arange(T, device=q.device) < mask.size, mean, torch.full_like(mean, float("-inf")))
    sums = torch.where(counts > 0, mean * counts, torch.zeros_like(mean))
    queries, keys = (t.to(q.device) for t in mask.sink_pairs(T))
    if len(queries):
        grouped = q.double().unflatten(1, (k.shape[1], -1))  # (B, H_k, g, T, d): k's heads may divide q's
        by_sink = scale * (grouped @ k[:, :, None, : mask.sinks].double().mT).flatten(1, 2).mean(0)  # (H, T, sinks)
        sums = sums.index_add(1, queries - keys, by_sink[:, queries, keys])
    total = mask.pair_counts(T).to(q.device)
    out = sums / total.clamp(min=1)
    return torch.where(total > 0, out, torch.full_like(out, float("-inf")))
