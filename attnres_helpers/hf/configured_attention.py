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

from ..masks import CAUSAL, Mask, expected_scores_masked

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .configurations import Remap

CONFIGURED = "attnres_configured"
BLOCK = 512  # queries per block: (H, 512, T) float32 scores at a time


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as `transformers`' Llama applies it (halves rotated): ``x (B, H, T, d)``, ``cos, sin (T, d)``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass
class ConfiguredLayer:
    """One layer under a configuration: q, k (B, H, T, d) rotated at the true positions; q_far, k_far at
    the far positions (None without a remap) used for pairs at distance ≥ ``window``; the mask; the
    scaling; and ``entropy`` (B, H, T), each query's attention entropy in nats."""

    q: torch.Tensor
    k: torch.Tensor
    scaling: float
    mask: Mask
    entropy: torch.Tensor
    q_far: torch.Tensor | None = None
    k_far: torch.Tensor | None = None
    window: int | None = None

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


def _scores(q: torch.Tensor, k: torch.Tensor, a: int, b: int, lo: int, sinks: int) -> torch.Tensor:
    """q[a:b] · k over the keys a block of queries can see: the first ``sinks`` keys, then keys lo … b − 1
    (B, H, b − a, sinks + b − lo)."""
    run = q[..., a:b, :] @ k[..., lo:b, :].transpose(-1, -2)
    if not sinks:
        return run
    return torch.cat([q[..., a:b, :] @ k[..., :sinks, :].transpose(-1, -2), run], dim=-1)


@dataclass(frozen=True)
class _Block:
    """Queries a … b − 1 score the first ``sinks`` keys and keys lo … b − 1; ``masked``: (first, last,
    excluded) column ranges holding pairs the mask excludes; ``near``: (first column, is-near) of the
    columns within a remap's window of some query (None without a remap)."""

    a: int
    b: int
    lo: int
    sinks: int
    masked: tuple[tuple[int, int, torch.Tensor], ...]
    near: tuple[int, int, torch.Tensor, torch.Tensor] | None


@functools.lru_cache(maxsize=16)
def _blocks(mask: Mask, T: int, block: int, window: int | None) -> tuple[_Block, ...]:
    """The query blocks of a window of T tokens under ``mask`` (and a remap's ``window``), worked out once
    per (mask, T) and used by every layer. The mask can exclude pairs only among the sinks, the run's keys
    before ``first_key`` of the block's last query, and the causal triangle, so only those are tested."""
    out = []
    for a in range(0, T, block):
        b = min(a + block, T)
        lo = mask.first_key(a)
        sinks = min(mask.sinks, lo)
        keys = torch.cat([torch.arange(sinks), torch.arange(lo, b)])
        i = torch.arange(a, b)[:, None]
        masked = []
        left = sinks + mask.first_key(b - 1) - lo
        for first, last in sorted({(0, left), (len(keys) - (b - a), len(keys))}):
            allowed = mask.allowed_pairs(i, keys[first:last])
            if not bool(allowed.all()):
                masked.append((first, last, ~allowed))
        near = None
        if window is not None:
            first_near = max(lo, a - window + 1)  # keys before it are far for every query of the block
            col = sinks + first_near - lo
            near = (first_near, col, i - keys[col:] < window, i - keys[:sinks] < window)
        out.append(_Block(a, b, lo, sinks, tuple(masked), near))
    return tuple(out)


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
    ≥ W taken from them. The entropy is log Z − Σ_j p_ij (e_ij − m_i), with m_i the row's largest score
    and Z = Σ_j exp(e_ij − m_i): one exponential per pair, no log of a probability.

    Each block scores only the keys its queries can see (:func:`_blocks`). Under a remap the far scores
    are computed for every key and the true-position ones only for the keys within W of some query."""
    B, H, T, _ = q.shape
    out = q.new_empty(B, H, T, v.shape[-1])
    entropy = q.new_empty(B, H, T)
    q = q * scaling
    q_far = None if far is None else far[0] * scaling
    for blk in _blocks(mask, T, block, None if far is None else far[2]):
        a, b, lo, sinks = blk.a, blk.b, blk.lo, blk.sinks
        if far is None:
            s = _scores(q, k, a, b, lo, sinks)  # (B, H, b − a, K)
        else:
            s = _scores(q_far, far[1], a, b, lo, sinks)
            first_near, col, near_run, near_sinks = blk.near
            s[..., col:] = torch.where(near_run, _scores(q, k, a, b, first_near, 0), s[..., col:])
            if sinks and bool(near_sinks.any()):
                s[..., :sinks] = torch.where(near_sinks, q[..., a:b, :] @ k[..., :sinks, :].mT, s[..., :sinks])
        for first, last, excluded in blk.masked:
            s[..., first:last].masked_fill_(excluded, MASKED)
        s.sub_(s.amax(-1, keepdim=True))  # e − m
        p = s.exp()
        z = p.sum(-1)  # (B, H, b − a)
        entropy[..., a:b] = z.log() - (p[..., None, :] @ s[..., :, None])[..., 0, 0] / z
        o = p[..., sinks:] @ v[..., lo:b, :]
        if sinks:
            o += p[..., :sinks] @ v[..., :sinks, :]
        out[..., a:b, :] = o / z[..., None]
    return out, entropy


def fused_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`blockwise_attention` under the plain causal mask by torch's fused CPU kernel, which never
    holds a score matrix and also returns each row's log Z: the output from one call, and Σ_j p_ij e_ij
    = scaling · q_i · Σ_j p_ij k_j from a second call whose values are the keys, so the entropy is
    log Z − scaling · q_i · (Σ_j p_ij k_j). (B, H, T, d) each -> (out, entropy (B, H, T))."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, log_z = flash(q, k, v, 0.0, True, scale=scaling)
    mean_key, _ = flash(q, k, k, 0.0, True, scale=scaling)
    return out, log_z - scaling * (q * mean_key).sum(-1)


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
    if far is None and state.mask == CAUSAL and query.device.type == "cpu":
        out, entropy = fused_causal_attention(q_near, k_near, v.float(), scaling)
    else:
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
    scored one by one (:func:`masks.expected_scores_masked`)."""
    near = expected_scores_masked(layer.q, layer.k, layer.scaling, layer.mask)
    if layer.q_far is None:
        return near
    far = expected_scores_masked(layer.q_far, layer.k_far, layer.scaling, layer.mask)
    return torch.where(torch.arange(near.shape[-1]) < layer.window, near, far)


def configured_key0(layer: ConfiguredLayer) -> torch.Tensor:
    """(H, T) float64: each query's merged score on key 0 (the batch averaged), -inf where masked."""
    score = lambda q, k: layer.scaling * (q.double() @ k[..., :1, :].double().transpose(-1, -2))[..., 0]  # noqa: E731
    s = score(layer.q, layer.k)  # (B, H, T)
    T = s.shape[-1]
    i = torch.arange(T)
    if layer.q_far is not None:
        s = torch.where(i < layer.window, s, score(layer.q_far, layer.k_far))
    s = s.masked_fill(~layer.mask.allowed_pairs(i, torch.zeros_like(i)), float("-inf"))
    return s.mean(0)
