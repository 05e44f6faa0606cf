"""A small decoder-only Transformer with a pluggable position encoding (nanoGPT-style).

Pre-LN blocks, tied byte embeddings, GELU MLP. The position encoding is any name of
``encoding_registry.ENCODINGS``; what it does to positions (the parameters each layer learns for it, what
it adds to the token embeddings, what it does to q and k, the bias it adds to the scores) is its
:class:`positions.Position`, which the model calls without asking which encoding it is
(:mod:`attnres_helpers.positions` says what each encoding does, with its paper).

``forward`` trains with ``F.scaled_dot_product_attention``; ``forward_with_scores`` runs
the same weights through an explicit softmax and returns every layer's pre-softmax
scores (B, H, T, T) laid out [query, key], biases included, masked pairs at -inf.
Blockwise causal attention (BCA, Sun et al. §3.3) is an inference-time option: queries
in blocks of train_len/2 attend to their own block and the previous one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import encoding_registry
from .positions import ENCODING_POSITIONS, Position

# the position maths, also read from here (notebook 03, benchmarks/bench_training.py)
from .positions import alibi_slopes as alibi_slopes
from .positions import apply_rotary as apply_rotary
from .positions import sinusoidal_table as sinusoidal_table

MODEL_ENCODINGS = tuple(encoding_registry.ENCODINGS)  # the trainable encodings, one entry each in encoding_registry
# Resource bounds, checked before anything is built: far above every configuration here (the large one has
# 6.4M parameters), far below what would exhaust a machine's memory without a clear message.
MAX_SIZES = {"train_len": 1 << 18, "n_layer": 1024, "n_head": 1024, "d_model": 1 << 16, "vocab_size": 1 << 20}
MAX_PARAMETERS = 10**9


@dataclass(frozen=True)
class ModelConfig:
    encoding: str = encoding_registry.DEFAULT_ENCODING
    train_len: int = 128  # L: the training context length
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    vocab_size: int = 256  # bytes
    rope_base: float = 10000.0
    xpos_gamma: float = 0.4
    # xPos scale base B; None means L/2, the paper's ratio (B = 512 at L = 1024). torchscale's
    # absolute default, 512, is available as a number. to_dict() records the resolved value.
    xpos_scale_base: float | None = None
    alibi_slope_scale: float = 1.0  # multiplies every ALiBi slope

    def __post_init__(self):
        if self.encoding not in MODEL_ENCODINGS:
            raise ValueError(f"unknown encoding {self.encoding!r}; known: {', '.join(MODEL_ENCODINGS)}")
        for name in ("train_len", "n_layer", "n_head", "d_model", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            if value > MAX_SIZES[name]:
                raise ValueError(f"{name} must be at most {MAX_SIZES[name]}, got {value}")
        for name in ("rope_base", "xpos_gamma", "xpos_scale_base", "alibi_slope_scale"):
            value = getattr(self, name)
            if value is None and name == "xpos_scale_base":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.train_len < 2 or self.train_len % 2:
            raise ValueError(
                f"train_len must be an even number >= 2 (BCA uses blocks of train_len/2), got {self.train_len}"
            )
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim = d_model/n_head must be even for rotary encodings, got {self.head_dim}")
        if not 1 < self.rope_base <= 1e9:
            raise ValueError(f"rope_base must be in (1, 1e9], got {self.rope_base}")
        if not 0 < self.xpos_gamma <= 100 or not 0 < self.scale_base <= 1e9:
            raise ValueError(
                f"xpos_gamma must be in (0, 100] and xpos_scale_base in (0, 1e9], "
                f"got {self.xpos_gamma} and {self.xpos_scale_base}"
            )
        if not 0 <= self.alibi_slope_scale <= 1e3:
            raise ValueError(f"alibi_slope_scale must be in [0, 1000], got {self.alibi_slope_scale}")
        if self.n_parameters > MAX_PARAMETERS:
            raise ValueError(
                f"the model would have {self.n_parameters:,} parameters ({self.n_layer} layers of width "
                f"{self.d_model}), over the bound of {MAX_PARAMETERS:,}"
            )

    @property
    def n_parameters(self) -> int:
        """The parameter count of :class:`Transformer` for this config, from the sizes alone."""
        d, H = self.d_model, self.n_head
        learned = encoding_registry.ENCODINGS[self.encoding].learned_per_head * H
        block = 12 * d * d + 9 * d + learned  # qkv, proj, MLP (4d) with biases, two LayerNorms, a learned bias
        return self.vocab_size * d + self.n_layer * block + 2 * d  # tied embedding, blocks, final LayerNorm

    @property
    def position(self) -> Position:
        """What this config's encoding does to positions (:data:`positions.ENCODING_POSITIONS`)."""
        return ENCODING_POSITIONS[self.encoding]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def scale_base(self) -> float:
        """xPos's B: ``xpos_scale_base``, or L/2 when it is None."""
        return self.train_len / 2 if self.xpos_scale_base is None else float(self.xpos_scale_base)

    def to_dict(self) -> dict:
        return {**asdict(self), "xpos_scale_base": self.scale_base}

    def build(self) -> Transformer:
        """The model of this config (random weights)."""
        return Transformer(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        names = {f.name for f in fields(cls)}
        unknown, missing = set(d) - names, names - set(d)
        if unknown or missing:
            raise ValueError(f"model config keys do not match: unknown {sorted(unknown)}, missing {sorted(missing)}")
        return cls(**d)


PRESETS = {
    "tiny": ModelConfig(train_len=16, n_layer=2, n_head=2, d_model=32),  # tests
    # The shipped configuration (data/sweep/SUMMARY.md): 4 layers, L = 128, width 128, 4 heads.
    "default": ModelConfig(),
    # The first round's configuration (2 layers, L = 64), kept for the sweep's history.
    "small": ModelConfig(train_len=64, n_layer=2),
    # The larger, GPU-trained second configuration (scripts/gpu_runs.py): 8 layers, width 256, L = 256.
    "large": ModelConfig(train_len=256, n_layer=8, n_head=4, d_model=256),
}


def preset(name: str, **overrides) -> ModelConfig:
    """A named preset with some fields replaced, e.g. ``preset("default", train_len=256)``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def blockwise_causal_mask(T: int, block: int) -> torch.Tensor:
    """(T, T) bool, True where query i may attend to key j under BCA (Sun et al. §3.3).

    Queries are cut into blocks of ``block``; each attends causally to keys in its own
    block and the previous one, so the distance i − j never exceeds 2·block − 1.
    """
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    return (j <= i) & (j >= (i // block - 1) * block)


class PositionInfo:
    """Everything one forward pass needs about positions, built once and shared by all layers: the mask,
    the encoding's :class:`positions.Position` and the tables it built for length T."""

    def __init__(self, cfg: ModelConfig, T: int, device, bca: bool):
        self.cfg, self.T, self.bca = cfg, T, bca
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        self.allowed = blockwise_causal_mask(T, cfg.train_len // 2).to(device) if bca else causal  # (T, T)
        self.position = cfg.position
        self.tables = self.position.tables(cfg, T, device)  # e.g. RoPE's cos and sin, ALiBi's bias

    def sdpa_mask(self, bias: torch.Tensor | None) -> torch.Tensor | None:
        """What F.scaled_dot_product_attention needs: None (plain causal) or a float/bool mask;
        ``bias`` (H, T, T) is a layer's score bias, or None."""
        if bias is None and not self.bca:
            return None
        if bias is None:
            return self.allowed
        return bias.masked_fill(~self.allowed, float("-inf"))  # (H, T, T)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        for name, parameter in cfg.position.layer_parameters(cfg).items():  # T5's table, KERPLE's p and a
            self.register_parameter(name, parameter)

    def forward(
        self, x: torch.Tensor, pos: PositionInfo, capture: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        q, k = pos.position.rotate(q, k, pos.tables)  # RoPE's and xPos's rotation; others leave them
        bias = pos.position.score_bias(pos.tables, self)  # (H, T, T) or None
        if capture:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, H, T, T)
            if bias is not None:
                scores = scores + bias
            scores = scores.masked_fill(~pos.allowed, float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v  # (B, H, T, hd)
        else:
            scores = None
            mask = pos.sdpa_mask(bias)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y), scores


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(
        self, x: torch.Tensor, pos: PositionInfo, capture: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, scores = self.attn(self.ln_1(x), pos, capture)
        x = x + a
        return x + self.mlp(self.ln_2(x)), scores


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    @property
    def supports_bca(self) -> bool:
        """BCA needs a relative encoding: absolute positions are added once, at the input."""
        return encoding_registry.ENCODINGS[self.cfg.encoding].relative

    def _run(self, idx: torch.Tensor, bca: bool, capture: bool):
        if idx.ndim != 2:
            raise ValueError(f"idx must be (B, T) token ids, got shape {tuple(idx.shape)}")
        B, T = idx.shape
        if bca and not self.supports_bca:
            raise ValueError(f"BCA needs a relative encoding: {self.cfg.encoding} positions are absolute")
        pos = PositionInfo(self.cfg, T, idx.device, bca)
        x = self.cfg.position.embed(self.wte(idx), self.cfg)  # (B, T, C), absolute positions added
        all_scores = []
        for block in self.blocks:
            x, scores = block(x, pos, capture)
            all_scores.append(scores)
        logits = self.ln_f(x) @ self.wte.weight.T  # (B, T, vocab), tied embeddings
        return logits, all_scores

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, bca: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits (B, T, V), mean cross-entropy or None)."""
        logits, _ = self._run(idx, bca, capture=False)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def forward_with_scores(self, idx: torch.Tensor, bca: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(logits (B, T, V), [pre-softmax scores (B, H, T, T) for each layer])."""
        return self._run(idx, bca, capture=True)
