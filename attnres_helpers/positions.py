"""What each trainable encoding does to positions in :mod:`attnres_helpers.model`, one object each.

:data:`ENCODING_POSITIONS` maps every name of ``encoding_registry.ENCODINGS`` to a :class:`Position`, the
shape of `transformers`' ``ROPE_INIT_FUNCTIONS``: one interface for every encoding, which the model calls
and never branches on the name. A Position says the parameters each attention layer learns for it, the
tensors one forward pass shares across layers, what it adds to the token embeddings, what it does to q
and k, and the bias it adds to the scores:

- ``sinusoidal``: Vaswani et al. 2017 §3.5, PE(pos, 2i) = sin(pos/10000^{2i/d}),
  PE(pos, 2i+1) = cos(·), added to the token embeddings (scaled by √d, §3.4).
- ``rope``: Su et al. (RoFormer) eq. 15, q and k rotated by angle pos·θ_i, θ_i = base^{-2i/d}.
- ``xpos``: Sun et al. 2022 eq. 9, RoPE plus q·ζ_i^{m/B}, k·ζ_i^{-n/B} with
  ζ_i = (2i/d + γ)/(1 + γ) (γ = 0.4 as in microsoft/torchscale; B = L/2 by default,
  the paper's ratio of B = 512 to L = 1024).
- ``alibi``: Press et al. 2022, score − m_h·(i − j), slopes m_h = 2^{-8h/H}, h = 1..H.
- ``nope``: no positional signal; the causal mask carries position implicitly.
- ``t5``: Raffel et al. 2020 §2.1, a learned scalar per head and distance bucket added to the
  score (32 causal buckets: 16 exact distances, the rest log-spaced up to max_distance = max(L, 32)
  (T5's own 128 at the default L), every farther distance in the last bucket); each layer has its
  own table, initialised to zero.
- ``kerple``: Chi et al. 2022, the log kernel −p_h·log(1 + a_h·(i − j)) added to the score, with
  p_h, a_h learned per head and layer, clamped to >= 0.01 as in the official code; initialised to 1.

To add an encoding of a new kind, write its Position here and name it in :data:`ENCODING_POSITIONS`
(besides its entry in ``encoding_registry``); one of an existing kind reuses a Position.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from .encoding_registry import T5_BUCKETS

if TYPE_CHECKING:
    from .model import ModelConfig

KERPLE_MIN = 0.01  # KERPLE's clamp of p and a (Chi et al. 2022, official code)


def alibi_slopes(n_head: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """ALiBi's head slopes (Press et al. 2022, §3): m_h = 2^{-8h/H}, h = 1..H, for H a power of two.
    For other H, as in the official code: the slopes of the nearest lower power of two P, then every
    other slope of 2P, up to H in all. Computed in float64, returned as ``dtype``; (H,)."""
    power = 2 ** int(math.floor(math.log2(n_head)))
    geometric = lambda h: 2.0 ** (-8.0 * torch.arange(1, h + 1, dtype=torch.float64) / h)  # noqa: E731
    return torch.cat([geometric(power), geometric(2 * power)[0::2][: n_head - power]]).to(dtype)


def sinusoidal_table(T: int, d: int) -> torch.Tensor:
    """(T, d): PE(pos, 2i) = sin(pos/10000^{2i/d}), PE(pos, 2i+1) = cos(pos/10000^{2i/d})."""
    pos = torch.arange(T, dtype=torch.float32)[:, None]
    freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    pe = torch.zeros(T, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe


def t5_buckets(distance: torch.Tensor, num_buckets: int = T5_BUCKETS, max_distance: int = 128) -> torch.Tensor:
    """T5's causal bucket of each distance n >= 0 (Raffel et al. 2020; the same function as
    ``encodings.t5_buckets``): n itself for n < num_buckets/2, then log-spaced up to max_distance,
    every farther distance in bucket num_buckets − 1."""
    exact = num_buckets // 2
    n = distance.clamp(min=0)
    log_spaced = (
        exact
        + (
            torch.log(n.clamp(min=exact).double() / exact) / math.log(max_distance / exact) * (num_buckets - exact)
        ).long()
    )
    return torch.where(n < exact, n, log_spaced.clamp(max=num_buckets - 1))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x_i, x_{i+d/2}) by the position angle and scale them (x: (B, H, T, d))."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, d/2) each
    c, s = cos * scale, sin * scale  # (T, d/2)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)


def distances(T: int, device) -> torch.Tensor:
    """(T, T): i − j for query i and key j, clamped at 0 (the causal distances)."""
    return (torch.arange(T, device=device)[:, None] - torch.arange(T, device=device)[None, :]).clamp(min=0)


class Position:
    """What an encoding does to positions. This base does nothing (NoPE: the causal mask carries position);
    each encoding's Position overrides what it uses. ``tables`` is what :meth:`tables` built for the pass."""

    def layer_parameters(self, cfg: ModelConfig) -> dict[str, nn.Parameter]:
        """The parameters each attention layer learns for it, by attribute name (none)."""
        return {}

    def tables(self, cfg: ModelConfig, T: int, device) -> dict[str, torch.Tensor]:
        """The tensors every layer of one forward pass at length T shares, built once (none)."""
        return {}

    def embed(self, x: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        """The token embeddings x (B, T, C) with the encoding's absolute positions added (unchanged)."""
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, tables: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k (B, H, T, hd) as the encoding turns them (unchanged)."""
        return q, k

    def score_bias(self, tables: dict, layer: nn.Module) -> torch.Tensor | None:
        """The bias (H, T, T) added to ``layer``'s scores (its learned parameters are ``layer``'s), or None."""
        return None


class Sinusoidal(Position):
    def embed(self, x, cfg):
        T = x.shape[1]
        return x * math.sqrt(cfg.d_model) + sinusoidal_table(T, cfg.d_model).to(x.device)  # (B, T, C)


class Rotary(Position):
    """RoPE: q and k rotated by pos·θ_i; the scales are ones."""

    def tables(self, cfg, T, device):
        d = cfg.head_dim
        theta = cfg.rope_base ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)  # (d/2,)
        pos = torch.arange(T, device=device, dtype=torch.float32)
        angle = pos[:, None] * theta[None, :]  # (T, d/2)
        q_scale, k_scale = self.scales(cfg, pos, angle)
        return {"cos": angle.cos(), "sin": angle.sin(), "q_scale": q_scale, "k_scale": k_scale}  # (T, d/2) each

    def scales(self, cfg, pos: torch.Tensor, angle: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The scales of q and k (T, d/2) at positions ``pos`` (T,): ones."""
        q_scale = k_scale = torch.ones_like(angle)
        return q_scale, k_scale

    def rotate(self, q, k, tables):
        cos, sin = tables["cos"], tables["sin"]
        return apply_rotary(q, cos, sin, tables["q_scale"]), apply_rotary(k, cos, sin, tables["k_scale"])


class XPos(Rotary):
    """RoPE's rotation, q scaled by ζ_i^{m/B} and k by ζ_i^{-n/B}."""

    def scales(self, cfg, pos, angle):
        d, T = cfg.head_dim, len(pos)
        zeta = (torch.arange(0, d, 2, device=pos.device, dtype=torch.float32) / d + cfg.xpos_gamma) / (
            1 + cfg.xpos_gamma
        )
        centred = (pos - T // 2)[:, None] / cfg.scale_base  # centred to stay in range (torchscale)
        q_scale = zeta[None, :] ** centred  # (T, d/2)
        return q_scale, 1.0 / q_scale


class ALiBi(Position):
    """A fixed bias −m_h·(i − j), the same in every layer."""

    def tables(self, cfg, T, device):
        slopes = alibi_slopes(cfg.n_head).to(device) * cfg.alibi_slope_scale  # (H,)
        return {"bias": -slopes[:, None, None] * distances(T, device).float()}  # (H, T, T)

    def score_bias(self, tables, layer):
        return tables["bias"]


class T5Bias(Position):
    """A learned scalar per (bucket, head) in each layer, initialised to zero."""

    def layer_parameters(self, cfg):
        return {"t5_bias": nn.Parameter(torch.zeros(T5_BUCKETS, cfg.n_head))}  # (buckets, H)

    def tables(self, cfg, T, device):
        return {"buckets": t5_buckets(distances(T, device), T5_BUCKETS, max(cfg.train_len, T5_BUCKETS))}  # (T, T)

    def score_bias(self, tables, layer):
        return layer.t5_bias[tables["buckets"]].permute(2, 0, 1)  # (T, T, H) -> (H, T, T)


class KerpleLog(Position):
    """−p_h·log(1 + a_h·(i − j)) with p_h, a_h learned in each layer, initialised to 1."""

    def layer_parameters(self, cfg):
        return {"kerple_p": nn.Parameter(torch.ones(cfg.n_head)), "kerple_a": nn.Parameter(torch.ones(cfg.n_head))}

    def tables(self, cfg, T, device):
        return {"distance": distances(T, device)}  # (T, T)

    def score_bias(self, tables, layer):
        p, a = (t.clamp(min=KERPLE_MIN)[:, None, None] for t in (layer.kerple_p, layer.kerple_a))  # (H, 1, 1)
        return -p * torch.log1p(a * tables["distance"].float())  # (H, T, T)


# Every name of encoding_registry.ENCODINGS, and its Position (tests/test_encoding_registry.py checks both agree).
ENCODING_POSITIONS: dict[str, Position] = {
    "rope": Rotary(),
    "xpos": XPos(),
    "alibi": ALiBi(),
    "sinusoidal": Sinusoidal(),
    "nope": Position(),
    "t5": T5Bias(),
    "kerple": KerpleLog(),
}
