"""`transformers`' own architectures built from a config at this project's sizes (nothing is downloaded),
behind the project's model interface, so that :func:`attnres_helpers.train.train` trains them on our corpus
and :func:`attnres_helpers.measure.measure_model` measures them like our own models (notebook 06).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

from .attention import capture, check_input_ids, layer_scores

ENCODING_OF = {"llama": "rope", "bloom": "alibi", "gpt2": "learned", "gpt_neox": "rope"}  # in this project's names


HF_ARCHITECTURES = ("llama", "bloom", "gpt2", "gpt_neox")  # what HFConfig builds


@dataclass(frozen=True)
class HFConfig:
    """A `transformers` architecture at the project's sizes (byte vocabulary, no dropout, tied embeddings).

    ``architecture``: llama (RoPE, base 10000), bloom (ALiBi), gpt2 (learned absolute positions for
    ``train_len`` tokens), gpt_neox (rotary on a quarter of each head, as Pythia). Each keeps its own
    normalisation and MLP (Llama's SwiGLU with 4·d_model hidden units).
    """

    architecture: str = "llama"
    train_len: int = 128
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    vocab_size: int = 256

    def __post_init__(self):
        if self.architecture not in HF_ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.architecture!r}; known: {', '.join(HF_ARCHITECTURES)}")
        for name in ("train_len", "n_layer", "n_head", "d_model", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1 << 16:
                raise ValueError(f"{name} must be an integer in [1, 65536], got {value!r}")
        if self.train_len < 2 or self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ValueError(
                f"need train_len >= 2 and an even head dim d_model/n_head, got train_len "
                f"{self.train_len}, d_model {self.d_model}, n_head {self.n_head}"
            )

    @property
    def encoding(self) -> str:
        return ENCODING_OF[self.architecture]

    def to_dict(self) -> dict:
        return asdict(self)

    def build(self) -> HFCausalLM:
        """The model of this config (random weights), behind this project's model interface."""
        return HFCausalLM(self)

    @classmethod
    def from_dict(cls, d: dict) -> HFConfig:
        names = {f.name for f in fields(cls)}
        if set(d) != names:
            raise ValueError(
                f"HF model config keys do not match: unknown {sorted(set(d) - names)}, missing {sorted(names - set(d))}"
            )
        return cls(**d)

    def transformers_config(self) -> transformers.PretrainedConfig:
        """The `transformers` config object for this architecture."""
        d, common = self.d_model, {"vocab_size": self.vocab_size, "tie_word_embeddings": True}
        if self.architecture == "llama":
            return transformers.LlamaConfig(
                hidden_size=d,
                intermediate_size=4 * d,
                num_hidden_layers=self.n_layer,
                num_attention_heads=self.n_head,
                num_key_value_heads=self.n_head,
                max_position_embeddings=self.train_len,
                **common,
            )
        if self.architecture == "bloom":
            return transformers.BloomConfig(
                hidden_size=d,
                n_layer=self.n_layer,
                n_head=self.n_head,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                **common,
            )
        if self.architecture == "gpt2":
            return transformers.GPT2Config(
                n_embd=d,
                n_layer=self.n_layer,
                n_head=self.n_head,
                n_positions=self.train_len,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=None,
                eos_token_id=None,
                **common,
            )
        return transformers.GPTNeoXConfig(
            hidden_size=d,
            intermediate_size=4 * d,
            num_hidden_layers=self.n_layer,
            num_attention_heads=self.n_head,
            max_position_embeddings=self.train_len,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            **common,
        )


def build(cfg: HFConfig) -> transformers.PreTrainedModel:
    """The `transformers` model of ``cfg`` (``from_config``: random weights, nothing downloaded)."""
    implementation = "eager" if cfg.architecture == "bloom" else "sdpa"
    return transformers.AutoModelForCausalLM.from_config(cfg.transformers_config(), attn_implementation=implementation)


class HFCausalLM(nn.Module):
    """A `transformers` causal LM behind this project's model interface (what train and measure call):
    ``forward(idx, targets) -> (logits, loss)`` and ``forward_with_scores(idx) -> (logits, scores)``."""

    supports_bca = False  # BCA is an option of this project's own models only

    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.cfg = cfg
        self.hf = build(cfg)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, bca: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits (B, T, V), mean cross-entropy or None)."""
        if bca:
            raise ValueError("BCA is not available for Hugging Face models here")
        check_input_ids(self.hf, idx)
        logits = self.hf(input_ids=idx, use_cache=False).logits  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss

    def forward_with_scores(self, idx: torch.Tensor, bca: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(logits (B, T, V), [scores (B, H, T, T) in the relative form, one per layer])."""
        if bca:
            raise ValueError("BCA is not available for Hugging Face models here")
        logits, layers = capture(self.hf, idx)
        return logits, [layer_scores(layer, "relative") for layer in layers]
