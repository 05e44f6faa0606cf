"""Attention resolution of Hugging Face causal LMs, captured as `transformers` computes them.

The scores are the model's own: scaled q·k (after its rotary embedding, if any), plus its additive
bias (BLOOM's ALiBi), with the causal mask as -inf. Capture uses `transformers`' extension points,
never an edited or copied modelling file:

- GPT-2 (learned absolute), GPT-NeoX/Pythia (partial rotary), Llama (rotary, grouped-query keys;
  Mistral and Qwen2 share its attention): an attention function registered in `transformers`'
  ``AttentionInterface`` under ``"attnres_capture"`` is switched on for one forward pass
  (``model.set_attn_implementation``). It records each layer's queries, keys, scaling and additive
  mask, then lets `transformers`' own SDPA function compute the attention.
- BLOOM (ALiBi), whose attention does not go through that interface: forward hooks on each
  ``BloomAttention`` record its inputs, and q and k are recomputed with the module's own projection
  and head split (``query_key_value``, ``_reshape``).

**The per-row constant.** BLOOM adds ALiBi as ``slope · j`` (j the key index). Softmax ignores a
constant added to a query's row, but the §4.3 estimator ŝ[n] (a mean along sub-diagonals) does not:
ŝ is defined only up to such shifts. ``form="relative"`` (the default of :func:`expected_scores`)
subtracts ``slope · i`` from row i, so that ALiBi appears as −m_h·n, as in Press et al. 2022 and in
this project's own model; ``form="raw"`` keeps the model's numbers.

:class:`HFConfig` and :class:`HFCausalLM` build these architectures from a config (no download) at
the project's sizes, so that :func:`attnres_helpers.train.train` trains them on our corpus and
:func:`attnres_helpers.measure.measure_model` measures them like our own models.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from .metric import expected_scores as diagonal_means
from .metric import expected_scores_fft

CAPTURE = "attnres_capture"
INTERFACE_TYPES = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2")  # attention through AttentionInterface
SUPPORTED = (*INTERFACE_TYPES, "bloom")
# The position encoding of each, in this project's names ("learned": GPT-2's absolute table; GPT-NeoX
# rotates a part of each head only).
ENCODING_OF = {"gpt2": "learned", "gpt_neox": "rope", "llama": "rope", "mistral": "rope", "qwen2": "rope",
               "bloom": "alibi"}
FORMS = ("relative", "raw")
METHODS = ("fft", "explicit")


@dataclass
class LayerQK:
    """One layer's capture: the raw scores are ``scaling · q kᵀ + slope_h · j + mask``.

    q, k: (B, H, T, d) as the model multiplies them (rotated; key heads repeated for grouped-query
    attention). mask: (B, 1 or H, T, T) additive with -inf at masked pairs, or None for the full
    causal mask (stored as None: the FFT path then needs nothing of size T²). slopes: (H,) BLOOM's
    ALiBi slopes, read off the model's own bias tensor (None for the other models).
    """

    q: torch.Tensor
    k: torch.Tensor
    scaling: float
    mask: torch.Tensor | None = None
    slopes: torch.Tensor | None = None


_records: list[LayerQK] | None = None  # filled by the registered attention function during capture


def _as_minus_inf(mask: torch.Tensor | None) -> torch.Tensor | None:
    """A float additive mask with `transformers`' finfo.min entries turned into -inf; None if it is
    exactly the full causal mask (or absent)."""
    if mask is None:
        return None
    mask = mask.float()
    mask = mask.masked_fill(mask <= torch.finfo(torch.float32).min / 2, float("-inf"))
    T_q, T_k = mask.shape[-2:]
    causal = torch.ones(T_q, T_k, dtype=torch.bool, device=mask.device).tril()
    if T_q == T_k and bool((torch.isfinite(mask) == causal).all()) and bool((mask[..., causal] == 0).all()):
        return None
    return mask


def _causal_mask(T: int, device=None) -> torch.Tensor:
    """(T, T) additive: 0 where key j <= query i, -inf above the diagonal."""
    return torch.full((T, T), float("-inf"), device=device).triu(1)


def _capture_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: record (q, k, scaling, mask), then `transformers`' SDPA."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    groups = query.shape[1] // key.shape[1]
    mask = None if attention_mask is None else _as_minus_inf(attention_mask[..., : key.shape[-2]])
    _records.append(LayerQK(query.detach().float(), key.repeat_interleave(groups, dim=1).detach().float(),
                            scaling, mask))
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


AttentionInterface.register(CAPTURE, _capture_attention)
AttentionMaskInterface.register(CAPTURE, eager_mask)  # the eager layout: additive (B, 1, T, T)


def _bloom_hooks(model, records: list[LayerQK]) -> list:
    """Forward hooks recording each BloomAttention's (q, k, scaling, ALiBi + mask)."""

    def hook(module, args, kwargs, output):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        alibi, mask = kwargs["alibi"], kwargs["attention_mask"]
        B, T, _ = hidden.shape
        q, k, _ = module._reshape(module.query_key_value(hidden))  # (B, H, T, d) each
        alibi = module.beta * alibi.view(B, module.num_heads, -1).float()  # (B, H, T): slope · j
        slopes = alibi[0, :, 1] - alibi[0, :, 0]  # the model's own m_h
        if not torch.allclose(alibi, slopes[None, :, None] * torch.arange(alibi.shape[-1], device=alibi.device)):
            raise ValueError("BLOOM's ALiBi tensor is not slope · key index (padding?): capture needs unpadded input")
        records.append(LayerQK(q.detach().float(), k.detach().float(), float(module.inv_norm_factor),
                               _as_minus_inf(mask), slopes.detach()))

    attention = type(model.transformer.h[0].self_attention)
    return [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules() if isinstance(m, attention)]


def check_supported(model) -> str:
    """The model's ``model_type`` if this module can capture it; a ValueError naming it otherwise."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED)}")
    return model_type


def context_length(model) -> int | None:
    """The context a model was built for (``n_positions`` or ``max_position_embeddings``)."""
    cfg = model.config
    return getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)


def check_input_ids(model, input_ids) -> None:
    """A clear error for input_ids that are not a (B, T >= 2) integer tensor the model can take."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        raise ValueError(f"input_ids must be a (B, T) tensor of token ids, got {getattr(input_ids, 'shape', type(input_ids))}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must be an integer tensor (torch.long), got {input_ids.dtype}")
    B, T = input_ids.shape
    if B < 1 or T < 2:
        raise ValueError(f"need B >= 1 and T >= 2 tokens, got shape {tuple(input_ids.shape)}")
    vocab = model.config.vocab_size
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"token ids must be in [0, {vocab}), got [{int(input_ids.min())}, {int(input_ids.max())}]")
    if model.config.model_type == "gpt2" and T > model.config.n_positions:
        raise ValueError(f"GPT-2 has learned absolute positions for n_positions = {model.config.n_positions} tokens; "
                         f"T = {T} is past them: there is no position embedding to extrapolate with")


@contextmanager
def _eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@torch.no_grad()
def capture(model, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[LayerQK]]:
    """Run ``input_ids (B, T)`` through ``model`` once: (logits (B, T, V), one :class:`LayerQK` per layer)."""
    global _records
    model_type = check_supported(model)
    check_input_ids(model, input_ids)
    records: list[LayerQK] = []
    with _eval_mode(model):
        if model_type == "bloom":
            handles = _bloom_hooks(model, records)
            try:
                logits = model(input_ids=input_ids, use_cache=False).logits
            finally:
                for h in handles:
                    h.remove()
        else:
            before = model.config._attn_implementation
            _records = records
            model.set_attn_implementation(CAPTURE)
            try:
                logits = model(input_ids=input_ids, use_cache=False).logits
            finally:
                model.set_attn_implementation(before)
                _records = None
    return logits, records


def _scores(layer: LayerQK, form: str) -> torch.Tensor:
    """(B, H, T, T) scores of one captured layer, in the raw or the relative form."""
    scores = layer.scaling * layer.q @ layer.k.transpose(-1, -2)  # (B, H, T, T)
    T = scores.shape[-1]
    if layer.slopes is not None:
        pos = torch.arange(T, dtype=scores.dtype, device=scores.device)
        offset = pos[None, :] if form == "raw" else pos[None, :] - pos[:, None]  # slope·j, or −slope·(i−j)
        scores = scores + layer.slopes.to(scores)[:, None, None] * offset
    return scores + (_causal_mask(T, scores.device) if layer.mask is None else layer.mask)


def _check_choice(name: str, value: str, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def attention_scores(model, input_ids: torch.Tensor, form: str = "raw") -> list[torch.Tensor]:
    """Every layer's pre-softmax scores ``(B, H, T, T)``, masked pairs at -inf.

    ``form="raw"``: exactly what the model adds before its softmax (a softmax over keys gives the
    model's own attention probabilities). ``form="relative"``: BLOOM's per-row constant removed
    (ALiBi as −m_h·(i−j)); the same softmax, the other models unchanged.
    """
    _check_choice("form", form, FORMS)
    _, layers = capture(model, input_ids)
    return [_scores(layer, form) for layer in layers]


def layer_expected_scores(layer: LayerQK, method: str = "fft", form: str = "relative") -> torch.Tensor:
    """ŝ (H, T) of one captured layer, averaged over the batch (Sun et al. 2022, §4.3 Eq. 11).

    ``method="fft"``: ŝ[n] = scaling · mean_i q_i·k_{i−n} + bias[n] by FFT (:func:`metric.expected_scores_fft`),
    O(T log T · d) per head; only under the full causal mask and a bias that depends on the distance
    alone (relative form), else a ValueError says to use ``method="explicit"``. ``"explicit"``: the
    sub-diagonal means of the (T, T) scores.
    """
    _check_choice("method", method, METHODS)
    _check_choice("form", form, FORMS)
    if method == "explicit":
        return diagonal_means(_scores(layer, form)).double().mean(0)
    if form == "raw" and layer.slopes is not None:
        raise ValueError("the raw form of ALiBi (slope · key index) is not a function of distance: "
                         "use method='explicit' for form='raw'")
    if layer.mask is not None:
        raise ValueError("the model's mask is not the full causal one (padding, a sliding window or BCA): "
                         "the FFT estimator assumes it; use method='explicit'")
    s_hat = expected_scores_fft(layer.q, layer.k, layer.scaling)  # (H, T)
    if layer.slopes is not None:
        n = torch.arange(s_hat.shape[-1], dtype=s_hat.dtype)
        s_hat = s_hat - layer.slopes.double()[:, None] * n  # ALiBi's relative bias −m_h·n
    return s_hat


def expected_scores(model, input_ids: torch.Tensor, method: str = "fft", form: str = "relative") -> torch.Tensor:
    """ŝ ``(layers, H, T)`` of a Hugging Face causal LM on ``input_ids (B, T)``, averaged over the batch.

    The relative form by default (see the module's note on BLOOM's per-row constant).
    """
    _check_choice("method", method, METHODS)
    _check_choice("form", form, FORMS)
    _, layers = capture(model, input_ids)
    return torch.stack([layer_expected_scores(layer, method, form) for layer in layers])


# ------------------------------------------------------------------ the architectures, built from config

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
            raise ValueError(f"need train_len >= 2 and an even head dim d_model/n_head, got train_len "
                             f"{self.train_len}, d_model {self.d_model}, n_head {self.n_head}")

    @property
    def encoding(self) -> str:
        return ENCODING_OF[self.architecture]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HFConfig":
        names = {f.name for f in fields(cls)}
        if set(d) != names:
            raise ValueError(f"HF model config keys do not match: unknown {sorted(set(d) - names)}, "
                             f"missing {sorted(names - set(d))}")
        return cls(**d)

    def transformers_config(self):
        """The `transformers` config object for this architecture."""
        d, common = self.d_model, {"vocab_size": self.vocab_size, "tie_word_embeddings": True}
        if self.architecture == "llama":
            return transformers.LlamaConfig(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=self.n_layer,
                                            num_attention_heads=self.n_head, num_key_value_heads=self.n_head,
                                            max_position_embeddings=self.train_len, **common)
        if self.architecture == "bloom":
            return transformers.BloomConfig(hidden_size=d, n_layer=self.n_layer, n_head=self.n_head,
                                            hidden_dropout=0.0, attention_dropout=0.0, **common)
        if self.architecture == "gpt2":
            return transformers.GPT2Config(n_embd=d, n_layer=self.n_layer, n_head=self.n_head, n_positions=self.train_len,
                                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                           bos_token_id=None, eos_token_id=None, **common)
        return transformers.GPTNeoXConfig(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=self.n_layer,
                                          num_attention_heads=self.n_head, max_position_embeddings=self.train_len,
                                          hidden_dropout=0.0, attention_dropout=0.0, **common)


def build(cfg: HFConfig):
    """The `transformers` model of ``cfg`` (``from_config``: random weights, nothing downloaded)."""
    implementation = "eager" if cfg.architecture == "bloom" else "sdpa"
    return transformers.AutoModelForCausalLM.from_config(cfg.transformers_config(), attn_implementation=implementation)


class HFCausalLM(nn.Module):
    """A `transformers` causal LM behind this project's model interface (what train and measure call):
    ``forward(idx, targets) -> (logits, loss)`` and ``forward_with_scores(idx) -> (logits, scores)``."""

    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.cfg = cfg
        self.hf = build(cfg)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, bca: bool = False):
        """(logits (B, T, V), mean cross-entropy or None)."""
        if bca:
            raise ValueError("BCA is not available for Hugging Face models here")
        check_input_ids(self.hf, idx)
        logits = self.hf(input_ids=idx, use_cache=False).logits  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss

    def forward_with_scores(self, idx: torch.Tensor, bca: bool = False):
        """(logits (B, T, V), [scores (B, H, T, T) in the relative form, one per layer])."""
        if bca:
            raise ValueError("BCA is not available for Hugging Face models here")
        logits, layers = capture(self.hf, idx)
        return logits, [_scores(layer, "relative") for layer in layers]


# ------------------------------------------------------------------ a pretrained model, by name

def measure_pretrained(name: str, lengths=(1, 2), n_windows: int = 4, method: str = "fft") -> list[dict]:
    """Load ``name`` from the Hugging Face hub (or a local folder), measure ŝ and the per-position NLL
    on this project's held-out text at ``k ×`` its trained context for k in ``lengths``, and return
    records like :func:`attnres_helpers.store.records`. Needs the internet for a hub name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .data import eval_windows, load_splits
    from .store import Profile, records

    _check_choice("method", method, METHODS)
    if not (isinstance(n_windows, int) and n_windows >= 1):
        raise ValueError(f"n_windows must be a positive integer, got {n_windows!r}")
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="eager")
    check_supported(model)
    held_out = load_splits()[1]  # bytes
    if model.config.vocab_size == 256:  # a byte-level model (as this project's): the bytes are the tokens
        ids = held_out.long()
    else:
        text = bytes(held_out.tolist()).decode("utf-8", errors="replace")
        ids = torch.tensor(AutoTokenizer.from_pretrained(name)(text)["input_ids"], dtype=torch.long)
    L = context_length(model)
    if L is None:
        raise ValueError(f"{name}: the config names no context length (n_positions or max_position_embeddings)")
    profiles = []
    for k in lengths:
        T = int(k * L)
        if T < 2:
            raise ValueError(f"length multiple {k} of the context {L} gives fewer than 2 tokens")
        if ids.numel() < n_windows * (T + 1):
            raise ValueError(f"the held-out text has {ids.numel()} tokens, too few for {n_windows} windows of {T + 1}")
        windows = eval_windows(ids, T, n_windows)  # (n_windows, T+1), as for our own models
        s_hat, nll = 0.0, torch.zeros(T, dtype=torch.float64)
        for w in windows:
            logits, layers = capture(model, w[None, :-1])
            s_hat = s_hat + torch.stack([layer_expected_scores(layer, method) for layer in layers]) / n_windows
            nll += F.cross_entropy(logits[0].float(), w[1:], reduction="none").double() / n_windows
        meta = {"encoding": ENCODING_OF[model.config.model_type], "train_len": L, "seed": 0, "model": name,
                "architecture": model.config.model_type}
        profiles.append(Profile(name.strip("/").replace("/", "--"), meta, T, False, s_hat.float(), nll))
    return records(profiles)


__all__ = ["SUPPORTED", "LayerQK", "capture", "attention_scores", "expected_scores", "layer_expected_scores",
           "HFConfig", "HFCausalLM", "build", "measure_pretrained", "check_supported", "context_length"]
