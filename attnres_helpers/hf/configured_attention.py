"""The attention of a configured model: query blocks over the keys each block can see, scores merged by distance.

Registered with `transformers`' ``AttentionInterface`` as ``"attnres_configured"`` and switched on by
:func:`attending` (which :func:`.configurations.applied` calls). The model's rotary module is replaced by
one that rotates by nothing, so q and k arrive as projected; here they are rotated by the configuration's
RoPE (its frequencies and attention factor) at the true positions, and, where the configuration remaps
positions (:class:`.configurations.Remap`), a second time at each token's far position. For query i and
key j the score the softmax sees is

    e_ij = scaling · q_i·k_j   at true positions, if i − j < W (or there is no remap),
    e_ij = scaling · q'_i·k'_j at far positions, otherwise,

at the pairs the :class:`~attnres_helpers.masks.Mask` allows (Self-Extend's and ReRoPE's merge by the
neighbour mask, written once). Queries go in blocks of :data:`BLOCK`; a block scores only the keys its
queries can see (from ``mask.first_key`` of its first query, plus the sinks), so BCA and windows cost
less than the full causal matrix, and no (T, T) matrix is ever held.

Each layer also gives the attention entropy of every query, −Σ_j p_ij log p_ij (nats; Zhong et al.
2025), and, inside :func:`capturing`, a :class:`ConfiguredLayer` to a consumer, from which
:func:`configured_s_hat` and :func:`configured_key0` give Eq. 11's ŝ and the key-0 scores of exactly
the merged scores the softmax saw.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..masks import Mask, expected_scores_masked

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .configurations import Remap

CONFIGURED = "attnres_configured"
BLOCK = 512  # queries per block: a masked part holds at most (H, 512, 512) scores at a time


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as `transformers`' Llama applies it (halves rotated): ``x (B, H, T, d)``, ``cos, sin (T, d)``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass
class ConfiguredLayer:
    """One layer under a configuration: q, k (B, H, T, d) rotated at the true positions; q_far, k_far at
    the far positions (None without a remap) used for pairs at distance ≥ ``window``; the mask; the
    scaling; ``entropy`` (B, H, T), each query's attention entropy in nats; and ``groups``, the query
    heads that share a key head (k's heads are repeated that many times, each head's copies together)."""

    q: torch.Tensor
    k: torch.Tensor
    scaling: float
    mask: Mask
    entropy: torch.Tensor
    q_far: torch.Tensor | None = None
    k_far: torch.Tensor | None = None
    window: int | None = None
    groups: int = 1

    def scores(self) -> torch.Tensor:
        """(B, H, T, T) merged pre-softmax scores, masked pairs at -inf (for checks at small T)."""
        T = self.q.shape[-2]
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        s = self.scaling * self.q @ self.k.transpose(-1, -2)
        if self.q_far is not None:
            s = torch.where(i - j < self.window, s, self.scaling * self.q_far @ self.k_far.transpose(-1, -2))
        return s.masked_fill(~self.mask.allowed_pairs(i, j), float("-inf"))


@dataclass
class _Attending:
    rotary: torch.nn.Module
    remap: Remap | None
    mask: Mask
    consumer: Callable[[ConfiguredLayer], None] | None = None
    rotations: dict | None = None  # T -> (near cos, sin, far q cos, sin, far k cos, sin), once per forward


_attending: ContextVar[_Attending | None] = ContextVar("attnres_configured", default=None)


def _rotations(state: _Attending, x: torch.Tensor, T: int) -> tuple:
    if state.rotations is None or T not in state.rotations:
        at = lambda pos: tuple(t[0].float() for t in state.rotary(x.float(), pos[None]))  # noqa: E731
        near = at(torch.arange(T, device=x.device))
        far = ()
        if state.remap is not None:
            pq, pk = state.remap.far_positions(T)
            far = (*at(pq.to(x.device)), *at(pk.to(x.device)))
        state.rotations = {T: (*near, *far)}
    return state.rotations[T]


MASKED = -1e30  # a masked pair's score: exp gives exactly 0 and 0 · MASKED is 0, so no -inf or NaN is ever made
LEAF = 128  # a part the mask cuts through is halved by queries down to this many, then masked


@dataclass(frozen=True)
class _Part:
    """Queries a … b − 1 against keys start … stop − 1, scored at the far positions (``far``) or the true
    ones. ``allowed``: None where every one of these queries sees every one of these keys, "causal" where
    the keys are the queries' own positions under the causal triangle, else the (b − a, stop − start)
    bool pairs."""

    far: bool
    a: int
    b: int
    start: int
    stop: int
    allowed: torch.Tensor | str | None


def _split(allowed: torch.Tensor, far: bool, a: int, start: int, parts: list[_Part]) -> None:
    """The parts of the pairs ``allowed`` (queries a …, keys start …): runs of keys every query sees (no
    mask), runs none sees (left out), and the runs between, halved by queries down to :data:`LEAF`."""
    rows = allowed.shape[0]
    if not allowed.shape[1]:
        return
    seen = allowed.all(0).int() + allowed.any(0).int()  # per key: 2 all, 1 some, 0 none of the queries
    edges = [0, *(torch.nonzero(seen[1:] != seen[:-1]).flatten() + 1).tolist(), len(seen)]
    for first, last in zip(edges[:-1], edges[1:]):
        some = allowed[:, first:last]
        if int(seen[first]) == 2:
            parts.append(_Part(far, a, a + rows, start + first, start + last, None))
        elif int(seen[first]) == 1 and rows <= LEAF:
            parts.append(_Part(far, a, a + rows, start + first, start + last, some.clone()))
        elif int(seen[first]) == 1:
            half = rows // 2
            _split(some[:half], far, a, start + first, parts)
            _split(some[half:], far, a + half, start + first, parts)


@functools.lru_cache(maxsize=4)
def _parts(mask: Mask, T: int, block: int, window: int | None) -> tuple[_Part, ...]:
    """The parts of a window of T tokens under ``mask`` and a remap's ``window``, worked out once per
    (mask, T) and used by every layer: for each block of queries and for the true and the far positions
    each, the block's own square where it is the causal triangle (blocks no longer than the remap's window
    keep it so), then :func:`_split` of the keys before. A mask that allows exactly the causal pairs: the
    far pairs of a remap are one causal part, and without a remap so is the whole window."""
    if window is not None and window >= T:
        window = None  # every pair is near
    if window is None and mask.is_causal_at(T):
        return (_Part(False, 0, T, 0, T, "causal"),)
    parts: list[_Part] = []
    far_by_blocks = window is not None
    if window is not None:
        block = min(block, window)
        if mask.is_causal_at(T):  # the far pairs j ≤ i − W: queries W … against keys 0 … under the triangle
            parts.append(_Part(True, window, T, 0, T - window, "causal"))
            far_by_blocks = False
    for a in range(0, T, block):
        b = min(a + block, T)
        i, j = torch.arange(a, b)[:, None], torch.arange(b)[None, :]
        allowed = mask.allowed_pairs(i, j)  # (b − a, b)
        near = allowed if window is None else allowed & (i - j < window)
        for far, pairs in ((False, near), *(((True, allowed & (i - j >= window)),) if far_by_blocks else ())):
            end = b
            if torch.equal(pairs[:, a:], torch.ones(b - a, b - a, dtype=torch.bool).tril()):
                parts.append(_Part(far, a, b, a, b, "causal"))
                end = a
            _split(pairs[:, :end], far, a, 0, parts)
    return tuple(parts)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, allowed) -> tuple[torch.Tensor, ...]:
    """softmax over one part's keys: (out, log Z, Σ_j p_ij k_j) for q (B, H, n, d), k and v (B, H, m, d).
    On the CPU by torch's fused flash kernel (which holds no score matrix and gives log Z), twice: values
    v, then values k; elsewhere, or where v's width differs, from the explicit scores."""
    causal = isinstance(allowed, str)
    if q.device.type == "cpu" and v.shape[-1] == q.shape[-1]:
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        additive = None
        if allowed is not None and not causal:
            additive = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill_(~allowed, MASKED)
        out, log_z = flash(q, k, v, 0.0, causal, attn_mask=additive, scale=scaling)
        mean_key, _ = flash(q, k, k, 0.0, causal, attn_mask=additive, scale=scaling)
        return out, log_z, mean_key
    s = scaling * q @ k.mT  # (B, H, n, m)
    if allowed is not None:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril() if causal else allowed.to(s.device)
        s = s.masked_fill(~keep, MASKED)
    log_z = s.logsumexp(-1)
    p = (s - log_z[..., None]).exp()
    return p @ v, log_z, p @ k


def blockwise_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scaling: float,
    mask: Mask,
    far: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    block: int = BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(e) · v and each query's entropy: q, k (B, H, T, d), v (B, H, T, d_v) ->
    (out (B, H, T, d_v), entropy (B, H, T)). ``far``: (q_far, k_far, W), scores of pairs at distance
    ≥ W taken from them.

    The parts (:func:`_parts`) are attended one at a time and merged into their queries' rows as flash
    attention merges its tiles: with log Z the rows' log-normaliser so far and log Z_p the part's,
    log Z' = logaddexp(log Z, log Z_p), out' = e^{log Z − log Z'} out + e^{log Z_p − log Z'} out_p. The
    entropy −Σ_j p_ij log p_ij = log Z − Σ_j p_ij e_ij, with Σ_j p_ij e_ij merged the same way from each
    part's scaling · q_i · Σ_{j∈p} p^p_ij k_j, so no probability's log is ever taken."""
    B, H, T, _ = q.shape
    out = q.new_zeros(B, H, T, v.shape[-1])
    log_z = q.new_full((B, H, T), MASKED)
    mean_score = q.new_zeros(B, H, T)  # Σ_j p_ij e_ij
    for part in _parts(mask, T, block, None if far is None else far[2]):
        qp, kp = (far[0], far[1]) if part.far else (q, k)
        a, b, keys = part.a, part.b, slice(part.start, part.stop)
        o, log_z_p, mean_key = _attend(qp[..., a:b, :], kp[..., keys, :], v[..., keys, :], scaling, part.allowed)
        merged = torch.logaddexp(log_z[..., a:b], log_z_p)
        before, now = (log_z[..., a:b] - merged).exp(), (log_z_p - merged).exp()  # (B, H, b − a)
        out[..., a:b, :] = before[..., None] * out[..., a:b, :] + now[..., None] * o
        part_score = scaling * (qp[..., a:b, :] * mean_key).sum(-1)
        mean_score[..., a:b] = before * mean_score[..., a:b] + now * part_score
        log_z[..., a:b] = merged
    return out, log_z - mean_score


def _configured_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: rotate, merge, mask, softmax by query blocks."""
    state = _attending.get()
    if state is None:
        raise RuntimeError(f"the {CONFIGURED!r} attention runs only inside configurations.applied")
    B, H, T, d = query.shape
    if B != 1:
        raise ValueError("a configured model measures one unpadded window at a time (batch of 1)")
    scaling = d**-0.5 if scaling is None else float(scaling)
    groups = H // key.shape[1]
    k, v = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    rotations = _rotations(state, query, T)
    q_near, k_near = rotate(query.float(), *rotations[:2]), rotate(k.float(), *rotations[:2])
    far = None
    if state.remap is not None:
        far = (rotate(query.float(), *rotations[2:4]), rotate(k.float(), *rotations[4:6]), state.remap.window)
    out, entropy = blockwise_attention(q_near, k_near, v.float(), scaling, state.mask, far)
    if state.consumer is not None:
        state.consumer(
            ConfiguredLayer(
                q_near.detach(),
                k_near.detach(),
                scaling,
                state.mask,
                entropy.detach(),
                *(() if far is None else (far[0].detach(), far[1].detach(), far[2])),
                groups=groups,
            )
        )
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


AttentionInterface.register(CONFIGURED, _configured_attention)
AttentionMaskInterface.register(CONFIGURED, sdpa_mask)  # the mask is the configuration's, applied here


@contextmanager
def attending(model: PreTrainedModel, rotary: torch.nn.Module, remap: Remap | None, mask: Mask) -> Iterator[None]:
    """Within the block, ``model`` attends through :func:`_configured_attention` (its implementation is
    restored afterwards)."""
    before = model.config._attn_implementation
    token = _attending.set(_Attending(rotary, remap, mask))
    model.set_attn_implementation(CONFIGURED)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
        _attending.reset(token)


def current_rotary() -> torch.nn.Module:
    """The rotary module of the configuration in effect (inside :func:`.configurations.applied`): its
    frequencies and attention factor, as the configured attention rotates by them."""
    state = _attending.get()
    if state is None:
        raise RuntimeError("no configuration is applied: current_rotary needs configurations.applied around it")
    return state.rotary


@contextmanager
def capturing(consume: Callable[[ConfiguredLayer], None]) -> Iterator[None]:
    """Inside :func:`.configurations.applied`: each layer hands its :class:`ConfiguredLayer` to
    ``consume``; the rotations are computed once per forward pass."""
    state = _attending.get()
    if state is None:
        raise RuntimeError("capturing a configured model needs configurations.applied around it")
    state.consumer, state.rotations = consume, None
    try:
        yield
    finally:
        state.consumer, state.rotations = None, None


def configured_s_hat(layer: ConfiguredLayer) -> torch.Tensor:
    """ŝ (H, T) float64 of the merged scores under the layer's mask (Eq. 11, the batch averaged): the
    true-position ŝ at distances < W, the far-position ŝ from W on, each by FFT with the sink pairs
    added (:func:`masks.expected_scores_masked`); each key head is transformed once, not once per query
    head that shares it."""
    near = expected_scores_masked(layer.q, layer.k[:, :: layer.groups], layer.scaling, layer.mask)
    if layer.q_far is None:
        return near
    far = expected_scores_masked(layer.q_far, layer.k_far[:, :: layer.groups], layer.scaling, layer.mask)
    return torch.where(torch.arange(near.shape[-1], device=near.device) < layer.window, near, far)


def configured_key0(layer: ConfiguredLayer) -> torch.Tensor:
    """(H, T) float64: each query's merged score on key 0 (the batch averaged), -inf where masked."""
    score = lambda q, k: layer.scaling * (q.double() @ k[..., :1, :].double().transpose(-1, -2))[..., 0]  # noqa: E731
    s = score(layer.q, layer.k)  # (B, H, T)
    T = s.shape[-1]
    i = torch.arange(T, device=s.device)
    if layer.q_far is not None:
        s = torch.where(i < layer.window, s, score(layer.q_far, layer.k_far))
    s = s.masked_fill(~layer.mask.allowed_pairs(i, torch.zeros_like(i)), float("-inf"))
    return s.mean(0)
