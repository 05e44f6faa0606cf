"""Attention resolution R(s) and its estimator (Sun et al. 2022, §3.1 Eq. 3 and §4.3 Eq. 11).

    R(s) = Σ_i e^{s[i]} (e^{s[i]} − e^{s[i+1]}) / (Σ_i e^{s[i]})²

With p = softmax(s) this is R = Σ_i p_i (p_i − p_{i+1}), so it is computed from a
max-shifted softmax and never overflows. The paper's sums run to N and use s[N+1],
which it never defines; we name two conventions:

- ``"zero"``: e^{s} past the last distance is 0, so the last term is p_{N-1}² in full
  (R = Σ p_i² − Σ p_i p_{i+1}). A flat profile gives 1/N².
- ``"drop"``: the last term is left out of the numerator (the denominator keeps every
  distance). A flat profile gives exactly 0.

Every function here takes numpy arrays or torch tensors and returns the same kind.
Scores of -inf (masked distances) are allowed and contribute nothing.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import ArrayLike

BOUNDARIES = ("zero", "drop")
HEAD_MODES = ("mean-scores", "mean-R")
Boundary = Literal["zero", "drop"]  # the options of BOUNDARIES, as a type
HeadMode = Literal["mean-scores", "mean-R"]  # the options of HEAD_MODES, as a type


def _as_tensor(x):
    """(tensor, was_numpy): numpy input is viewed as a float64 tensor, torch is kept."""
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise ValueError(f"scores must be real numbers, got dtype {x.dtype}")
        return x, False
    if isinstance(x, (np.ndarray, np.generic, list, tuple, float, int)):
        arr = np.asarray(x)
        if arr.dtype.kind not in "fiub":
            raise ValueError(f"scores must be numeric, got dtype {arr.dtype}")
        # np.require, unlike np.ascontiguousarray, keeps a 0-d array 0-d (the checks then name it)
        return torch.from_numpy(np.require(arr, dtype=np.float64, requirements="C")), True
    raise ValueError(f"expected a numpy array or a torch tensor, got {type(x).__name__}")


def _back(t: torch.Tensor, was_numpy: bool):
    return t.detach().cpu().numpy() if was_numpy else t


def _check_scores(s: torch.Tensor, what: str = "scores") -> None:
    if s.ndim == 0:
        raise ValueError(
            f"{what} must be an array with at least one axis (distances last, at least 2 distances), "
            "got a scalar (0-d array)"
        )
    if s.numel() == 0:
        raise ValueError(f"{what} are empty (shape {tuple(s.shape)})")
    if s.shape[-1] < 2:
        raise ValueError(f"{what} need at least 2 distances on the last axis, got {s.shape[-1]}")
    if torch.isnan(s).any():
        raise ValueError(f"{what} contain NaN")
    if torch.isposinf(s).any():
        raise ValueError(f"{what} contain +inf")
    if torch.isneginf(s).all(dim=-1).any():
        raise ValueError(f"{what} have a profile that is -inf at every distance (nothing to attend to)")


def resolution(s: ArrayLike | torch.Tensor, boundary: Boundary = "zero") -> np.ndarray | torch.Tensor:
    """Attention resolution R(s) of Eq. 3 over the last axis: ``(..., N) -> (...)``.

    ``R = Σ_i p_i (p_i − p_{i+1})`` with ``p = softmax(s)``; ``boundary`` is ``"zero"``
    (p_N = 0) or ``"drop"`` (the i = N−1 term is left out). R < 1 for every real s.
    """
    if boundary not in BOUNDARIES:
        raise ValueError(f"unknown boundary {boundary!r}; choose one of {BOUNDARIES}")
    s, was_numpy = _as_tensor(s)
    _check_scores(s)
    if not s.is_floating_point():
        s = s.double()
    elif s.dtype in (torch.float16, torch.bfloat16):
        s = s.float()
    p = torch.softmax(s, dim=-1)  # max-shifted inside: safe for |s| ~ 1e4 and -inf
    cross = (p[..., :-1] * p[..., 1:]).sum(-1)
    squares = (p * p).sum(-1) if boundary == "zero" else (p[..., :-1] ** 2).sum(-1)
    return _back(squares - cross, was_numpy)


CHUNK_ELEMENTS = 1 << 22  # matrices are summed in chunks of about this many entries (16 MiB in float32)


def _diagonal_sums(logits: torch.Tensor):
    """Sums and counts of the finite entries on each causal sub-diagonal.

    ``logits (..., T, T)`` laid out [query i, key j]; returns ``(sums, counts)``, each
    ``(..., T)``, where index n covers the pairs (i, i−n). Each matrix is copied, behind
    T−1 zeros, into a flat buffer and its upper triangle zeroed in place; viewed with
    strides (T+1, 1), row i of that buffer holds X[i, i−(T−1)+m] at column m, so summing
    the rows gives every sub-diagonal at once, reading memory in order. Matrices go through
    one reused buffer in chunks, so the extra memory is about one chunk (or one matrix).
    """
    T = logits.shape[-1]
    batch = logits.shape[:-2]
    matrices = logits.reshape(-1, T, T)  # (M, T, T), a view when logits is contiguous
    acc_dtype = torch.promote_types(logits.dtype, torch.float32)
    chunk = max(1, CHUNK_ELEMENTS // (T * T))
    buf = torch.zeros(min(chunk, matrices.shape[0]), T - 1 + T * T, dtype=acc_dtype, device=logits.device)
    sums = torch.empty(matrices.shape[0], T, dtype=acc_dtype, device=logits.device)
    counts = torch.arange(T, 0, -1, dtype=acc_dtype, device=logits.device).repeat(matrices.shape[0], 1)

    def by_diagonal(b: torch.Tensor) -> torch.Tensor:  # (c, T-1+T*T) buffer: T-1 zeros, then a lower triangle -> (c, T)
        view = b.as_strided((b.shape[0], T, T), (b.shape[1], T + 1, 1))  # (c, i, m)
        return view.sum(-2).flip(-1)  # m = T-1-n, flipped to n

    for start in range(0, matrices.shape[0], chunk):
        block = matrices[start : start + chunk]  # (c, T, T)
        b = buf[: block.shape[0]]
        body = b[:, T - 1 :].view(-1, T, T)  # (c, T, T)
        body.copy_(block)
        body.tril_()
        if bool(body.min() == float("-inf")):  # masked pairs inside the causal triangle
            unmasked = torch.isfinite(body)  # (c, T, T)
            body.masked_fill_(~unmasked, 0.0)
            sums[start : start + chunk] = by_diagonal(b)
            body.copy_(unmasked)
            body.tril_()
            counts[start : start + chunk] = by_diagonal(b)
        else:
            sums[start : start + chunk] = by_diagonal(b)
    return sums.reshape(*batch, T), counts.reshape(*batch, T)


def _check_logits(logits: torch.Tensor) -> None:
    if logits.ndim < 2:
        raise ValueError(f"logits need at least 2 dimensions (..., T, T), got shape {tuple(logits.shape)}")
    if logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"logits must be square in the last two dimensions, got shape {tuple(logits.shape)}")
    if logits.numel() == 0:
        raise ValueError(f"logits are empty (shape {tuple(logits.shape)})")
    if logits.shape[-1] < 2:
        raise ValueError(f"logits need at least 2 positions, got T = {logits.shape[-1]}")
    top = logits.max()  # one pass, no copy; NaN propagates through max
    if torch.isnan(top):
        raise ValueError("logits contain NaN")
    if torch.isposinf(top):
        raise ValueError("logits contain +inf")


def _mean_from(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    neg_inf = torch.full_like(sums, float("-inf"))
    return torch.where(counts > 0, sums / counts.clamp(min=1), neg_inf)


def _overflowed(sums: torch.Tensor, counts: torch.Tensor) -> bool:
    """Whether a sum over unmasked (finite) entries came out ±inf or NaN: only overflow does that."""
    return bool((~torch.isfinite(sums) & (counts > 0)).any())


def _overflow_error(what: str, dtype) -> ValueError:
    return ValueError(
        f"{what} are too large to average: a sum along a sub-diagonal overflows {dtype} "
        "(finite inputs, non-finite total); rescale them (R is invariant to adding a constant, not to scaling)"
    )


def _checked_diagonal_sums(logits: torch.Tensor):
    """:func:`_diagonal_sums`, redone in float64 if a narrower accumulator overflowed; raises if float64 does too."""
    sums, counts = _diagonal_sums(logits)
    if _overflowed(sums, counts):
        if sums.dtype != torch.float64:
            wide_sums, wide_counts = _diagonal_sums(logits.double())
            if not _overflowed(wide_sums, wide_counts):
                return wide_sums, wide_counts
        raise _overflow_error("logits", torch.float64)
    return sums, counts


def expected_scores(logits: ArrayLike | torch.Tensor) -> np.ndarray | torch.Tensor:
    """The §4.3 estimator ŝ[n] = 1/(N−n) Σ_{i=n}^{N−1} e_{i(i−n)}: ``(..., T, T) -> (..., T)``.

    The mean of the n-th causal sub-diagonal of pre-softmax scores laid out
    [query, key]. Masked (-inf) pairs drop out of the mean; a distance with no
    unmasked pair gets ŝ[n] = -inf, which R then ignores.

    Finite logits so large (|e| near 1e308) that a sub-diagonal's sum overflows float64
    raise ValueError ("too large to average ... overflow") rather than return ±inf.
    """
    t, was_numpy = _as_tensor(logits)
    _check_logits(t)
    sums, counts = _checked_diagonal_sums(t)
    # after a float64 retry, back to the usual accumulator dtype: a mean is no larger than its entries
    return _back(_mean_from(sums, counts).to(torch.promote_types(t.dtype, torch.float32)), was_numpy)


def diagonal_counts(T: int, block: int | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """How many (query, key) pairs a window of ``T`` tokens has at each distance n, ``(T,)`` float64.

    Full causal mask (``block`` None): T − n. Blockwise causal attention with blocks of ``block``
    (Sun et al. 2022, §3.3; query i sees key j when (i // block − 1)·block <= j <= i): T − n for
    n < block, then for block <= n < 2·block one pair for each query whose offset in its block is at
    least n − block, and 0 from 2·block on.
    """
    n = torch.arange(T, dtype=torch.float64, device=device)
    if block is None:
        return T - n
    _check_block(T, block)
    return _bca_counts(T, block).to(device).clone()


@functools.lru_cache(maxsize=16)
def _bca_counts(T: int, block: int) -> torch.Tensor:
    """For block <= n < 2·block, each query block m >= 1 (of length len_m, the last one maybe short)
    has max(0, len_m − (n − block)) queries whose offset reaches n − block back: (T,) float64."""
    n = torch.arange(T, dtype=torch.float64)
    lengths = torch.tensor([min(block, T - start) for start in range(block, T, block)], dtype=torch.float64)
    lag = (n - block).clamp(min=0)  # (T,)
    partial = (lengths[None, :] - lag[:, None]).clamp(min=0).sum(-1)  # (T,) for n >= block; (T, M − 1) at most
    return torch.where(n < block, T - n, torch.where(n < 2 * block, partial, torch.zeros_like(n)))


def _check_block(T: int, block) -> None:
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer (BCA's L/2), got {block!r}")


def _correlation(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Σ_i q_i · k_{i−n} for n = 0..T−1 along axis -2, in float64 by FFT: q (B, H, ..., T, d) and
    k (B, H_k, ..., T, d) -> (B, H, ..., T). H_k may divide H (grouped-query attention: query head h
    reads key head h // (H / H_k)), so a key head shared by several query heads is transformed once."""
    T = q.shape[-2]
    n_fft = 1 << (2 * T - 1).bit_length()  # a power of two >= 2T - 1: nothing wraps
    # time last and contiguous: pocketfft is 2-3x faster along the last axis than along a strided one
    Q = torch.fft.rfft(q.transpose(-1, -2).double(), n=n_fft, dim=-1)  # (B, H, ..., d, F)
    K = torch.fft.rfft(k.transpose(-1, -2).double(), n=n_fft, dim=-1)  # (B, H_k, ..., d, F)
    Q = Q.unflatten(1, (K.shape[1], -1))  # (B, H_k, g, ..., d, F)
    summed = (Q * K.unsqueeze(2).conj()).sum(-2).flatten(1, 2)  # (B, H, ..., F)
    return torch.fft.irfft(summed, n=n_fft, dim=-1)[..., :T]


def expected_scores_fft(
    q: torch.Tensor, k: torch.Tensor, scale: float | None = None, block: int | None = None
) -> torch.Tensor:
    """Eq. 11 from queries and keys instead of the score matrix: ``q (B, H, T, d)``, ``k (B, H_k, T, d)``
    (H_k = H, or a divisor of H under grouped-query attention) ``-> ŝ (H, T)``, averaged over the batch,
    with

        ŝ[n] = scale · 1/c[n] · Σ_{(i, i−n) unmasked} q_i · k_{i−n}     (scale = 1/√d by default),

    c[n] the pair counts of :func:`diagonal_counts`. Under the full causal mask the sum is a
    cross-correlation along time, computed by FFT (zero-padded to at least 2T−1, so nothing wraps)
    in O(T log T · d) time and O(T · d) memory per head, in float64. Under BCA (``block`` = L/2)
    distances n < block keep every pair, and for block <= n < 2·block the pairs join each query
    block to the block before it, so their sum is the correlation of those two blocks at lag
    n − block (one more FFT of length 2·block); ŝ is -inf from 2·block on, where nothing is seen.
    It never builds the (T, T) scores. Additive biases that depend only on the distance (ALiBi's
    −m·n) are added by the caller.
    """
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4 or not t.is_floating_point():
            raise ValueError(f"{name} must be a float tensor (B, H, T, d), got {getattr(t, 'shape', type(t))}")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} contains NaN or inf")
    if q.shape[::2] != k.shape[::2] or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            "q and k must have the same shape but for k's heads, which must divide q's, "
            f"got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    B, H, T, d = q.shape
    if T < 2 or B < 1 or d < 1:
        raise ValueError(f"need B >= 1, T >= 2 and d >= 1, got shape {tuple(q.shape)}")
    scale = 1.0 / d**0.5 if scale is None else float(scale)
    sums = _correlation(q, k).sum(0)  # (H, T): every pair at distance n
    counts = diagonal_counts(T, block, q.device)  # (T,)
    if block is not None and T > block:
        M = -(-T // block)  # blocks, the last one zero-padded (zeros add nothing to a sum)
        pad = M * block - T
        qb = F.pad(q, (0, 0, 0, pad)).reshape(B, H, M, block, d)  # (B, H, M, b, d)
        kb = F.pad(k, (0, 0, 0, pad)).reshape(B, k.shape[1], M, block, d)
        cross = _correlation(qb[:, :, 1:], kb[:, :, :-1]).sum((0, 2))  # (H, b): query block m, key block m−1
        far = torch.zeros_like(sums)
        far[:, block : 2 * block] = cross[:, : max(0, min(block, T - block))]
        sums = torch.where(torch.arange(T, device=q.device) < block, sums, far)
    mean = scale * sums / counts.clamp(min=1) / B
    return torch.where(counts > 0, mean, torch.full_like(mean, float("-inf")))


def sink_free_scores(
    s_hat: ArrayLike | torch.Tensor, key0: ArrayLike | torch.Tensor, counts: ArrayLike | torch.Tensor
) -> np.ndarray | torch.Tensor:
    """ŝ without the first-token sink: the n-th sub-diagonal's mean without its entry (n, 0).

    ``s_hat (..., T)`` (Eq. 11), ``key0 (..., T)``: the mean score of query i on key 0 (-inf where
    masked), ``counts (T,)``: pairs per distance (:func:`diagonal_counts`). Diagonal n holds the
    pair (n, 0) whenever key0[n] is finite, so

        ŝ₀[n] = (c[n]·ŝ[n] − key0[n]) / (c[n] − 1),

    and ŝ[n] where (n, 0) is masked. A distance whose only pair is (n, 0) (n = T − 1 under the
    causal mask) has nothing left: -inf, which R ignores. Means over several windows combine the
    same way, since every window has the same pairs.
    """
    s, was_numpy = _as_tensor(s_hat)
    k0, _ = _as_tensor(key0)
    c, _ = _as_tensor(counts)
    if s.shape != k0.shape or s.shape[-1] != c.shape[-1]:
        raise ValueError(f"s_hat {tuple(s.shape)}, key0 {tuple(k0.shape)} and counts {tuple(c.shape)} do not match")
    s, k0, c = s.double(), k0.double(), c.double().to(s.device)
    has_sink = torch.isfinite(k0) & (c > 0)
    rest = c - 1
    removed = (c * s - torch.where(has_sink, k0, torch.zeros_like(k0))) / rest.clamp(min=1)
    out = torch.where(has_sink, torch.where(rest > 0, removed, torch.full_like(s, float("-inf"))), s)
    return _back(out, was_numpy)


class ScoreAccumulator:
    """Average ŝ[n] over many batches of texts, as the paper's E[·] does.

    ``update(logits)`` takes ``(B, ..., T, T)`` whose first axis indexes texts; ``mean()``
    returns ``(..., T)``: the total of each sub-diagonal over every text seen, divided
    by its total count of unmasked pairs.
    """

    def __init__(self):
        self._sums = None
        self._counts = None
        self._was_numpy = False

    def update(self, logits: ArrayLike | torch.Tensor) -> None:
        t, self._was_numpy = _as_tensor(logits)
        _check_logits(t)
        if t.ndim < 3:
            raise ValueError(f"update expects (B, ..., T, T) with a batch axis first, got shape {tuple(t.shape)}")
        sums, counts = _checked_diagonal_sums(t.detach())
        sums, counts = sums.double().sum(0), counts.double().sum(0)
        if _overflowed(sums, counts):
            raise _overflow_error("logits", torch.float64)
        if self._sums is None:
            self._sums, self._counts = sums, counts
        elif sums.shape != self._sums.shape:
            raise ValueError(
                f"logits of shape {tuple(t.shape)} do not match earlier batches (ŝ shape {tuple(self._sums.shape)})"
            )
        else:
            self._sums += sums
            self._counts += counts

    @property
    def texts(self) -> float:
        """How many query rows have been seen at distance 0 (texts × T)."""
        return 0.0 if self._counts is None else float(self._counts[..., 0].flatten()[0])

    def mean(self) -> np.ndarray | torch.Tensor:
        if self._sums is None:
            raise ValueError("no logits seen yet: call update() first")
        if _overflowed(self._sums, self._counts):
            raise _overflow_error("logits summed over batches", torch.float64)
        return _back(_mean_from(self._sums, self._counts), self._was_numpy)


def mean_over_heads(t: torch.Tensor) -> torch.Tensor:
    """ŝ averaged over the head axis (-2), each distance over the heads where it is not masked.

    A -inf (masked) entry drops out of that distance's mean; a distance that is -inf in
    every head stays -inf. NaN and +inf are kept, so :func:`resolution` still rejects them.
    Each entry is divided by its count before the sum, so finite scores never overflow.
    """
    kept = ~torch.isneginf(t)  # (..., H, N)
    counts = kept.sum(-2, keepdim=True).to(t.dtype)  # (..., 1, N)
    parts = torch.where(kept, t / counts.clamp(min=1), torch.zeros((), dtype=t.dtype, device=t.device))
    mean = parts.sum(-2)  # (..., N)
    counts = counts.squeeze(-2)
    if bool((torch.isfinite(t) | ~kept).all()) and _overflowed(mean, counts):
        raise ValueError(f"per-head scores are too large to average over heads: the mean overflows {t.dtype}")
    return torch.where(counts > 0, mean, torch.full_like(mean, float("-inf")))


def layer_resolution(
    s_hat: ArrayLike | torch.Tensor, head_mode: HeadMode = "mean-scores", boundary: Boundary = "zero"
) -> np.ndarray | torch.Tensor:
    """R of one layer from per-head ŝ: ``(..., H, N) -> (...)``.

    ``"mean-scores"`` averages ŝ over heads, then takes R; ``"mean-R"`` takes R per head,
    then averages. The paper does not say which it used.

    Masked distances under ``"mean-scores"``: at each distance n, ŝ[n] is averaged over
    only the heads where ŝ[n] is finite (not -inf), so one head that cannot see distance
    n does not wipe it out for the others (a plain mean would give -inf there); a
    distance that is -inf in every head stays -inf, and R ignores it. With no masking
    this is the plain mean over heads.
    """
    if head_mode not in HEAD_MODES:
        raise ValueError(f"unknown head_mode {head_mode!r}; choose one of {HEAD_MODES}")
    t, was_numpy = _as_tensor(s_hat)
    if t.ndim < 2:
        raise ValueError(f"per-head scores need shape (..., H, N), got {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(
            f"per-head scores are empty (shape {tuple(t.shape)}); need shape (..., H, N) with H >= 1, N >= 2"
        )
    if not t.is_floating_point():
        t = t.double()  # integer tensors cannot be averaged over heads
    if head_mode == "mean-scores":
        out = resolution(mean_over_heads(t), boundary)
    else:
        out = resolution(t, boundary).mean(-1)
    return _back(out, was_numpy)


def average_resolution(
    s_hat_layers: ArrayLike | torch.Tensor, head_mode: HeadMode = "mean-scores", boundary: Boundary = "zero"
) -> np.ndarray | torch.Tensor:
    """Mean over layers of :func:`layer_resolution`: ``(layers, H, N) -> scalar``, as in Table 3."""
    t, was_numpy = _as_tensor(s_hat_layers)
    if t.ndim != 3:
        raise ValueError(f"expected (layers, H, N), got shape {tuple(t.shape)}")
    return _back(layer_resolution(t, head_mode, boundary).mean(), was_numpy)
