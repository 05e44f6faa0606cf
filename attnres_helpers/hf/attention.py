"""Attention scores of Hugging Face causal LMs, captured as `transformers` computes them.

The scores are the model's own: scaled q·k (after its rotary embedding, if any), plus its additive
bias (BLOOM's ALiBi), with masked pairs at -inf. Capture uses `transformers`' extension points, never
an edited or copied modelling file:

- **Any model whose attention runs through `transformers`' ``AttentionInterface``** (those whose class
  sets ``_supports_attention_backend``: Llama, Mistral, Qwen2, GPT-2, GPT-NeoX, OPT, ...): a function
  registered under ``"attnres_capture"`` is switched on for one forward pass
  (``model.set_attn_implementation``). It hands each layer's queries, keys (grouped-query key heads
  repeated), scaling and mask to a consumer, then lets `transformers`' own SDPA compute the attention;
  the mask comes from `transformers`' SDPA mask function, so a plain causal layer gets no (T, T) mask
  at all and SDPA runs its memory-light causal kernel. Rotary variants (linear, dynamic, YaRN,
  Llama-3 scaling) are captured as applied, since q and k arrive rotated; sliding-window layers
  arrive with their band mask.
- **BLOOM** (ALiBi), whose attention does not go through that interface: forward hooks on each
  ``BloomAttention`` record its inputs, and q and k are recomputed with the module's own projection.
- Architectures whose score is not ``scaling · q·k + mask`` (attention logit soft-capping, learned
  attention sinks) are refused with :class:`CaptureError`: Eq. 11's ŝ is not defined from q and k.

**The per-row constant.** BLOOM adds ALiBi as ``slope · j`` (j the key index). Softmax ignores a
constant added to a query's row, but the §4.3 estimator ŝ[n] does not: ŝ is defined only up to such
shifts. ``form="relative"`` (the default of :func:`captured_s_hat`) subtracts ``slope · i`` from
row i, so that ALiBi appears as −m_h·n; ``form="raw"`` keeps the model's numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..metric import expected_scores as diagonal_means
from ..metric import expected_scores_fft

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CAPTURE = "attnres_capture"
FORMS = ("relative", "raw")
METHODS = ("fft", "explicit")
HOOKED_TYPES = ("bloom",)  # captured through forward hooks instead of the attention interface
UNCAPTURABLE_KWARGS = ("softcap", "s_aux", "sinks")  # change the score beyond scaling · q·k + mask


class CaptureError(ValueError):
    """This model's attention cannot be captured (and why)."""


@dataclass
class LayerQK:
    """One layer's capture: the raw scores are ``scaling · q kᵀ + slope_h · j`` at the pairs ``allowed``.

    q: (B, H, T, d) and k: (B, H_k, T, d) as the model multiplies them (rotated), H_k dividing H: under
    grouped-query attention query head h reads key head h // (H / H_k), and k keeps the model's H_k heads
    (the FFT transforms each once; where a product needs one key head per query head it repeats them
    :attr:`groups` times). allowed: (B or 1, 1 or H, T, T) bool, True where a query may attend to a key, or None
    for exactly the full causal mask (the FFT path then needs nothing of size T²). slopes: (H,)
    BLOOM's ALiBi slopes, read off the model's own bias tensor (None for the other models).
    """

    q: torch.Tensor
    k: torch.Tensor
    scaling: float
    allowed: torch.Tensor | None = None
    slopes: torch.Tensor | None = None

    @property
    def groups(self) -> int:
        """Query heads per key head (1 without grouped-query attention)."""
        return self.q.shape[1] // self.k.shape[1]

    def mask_structure(self) -> tuple[str, int | None] | None:
        """("causal", None), ("window", w) for a causal band of w keys, or ("bca", block) for blockwise
        causal attention; None for any other mask (padding, a batch of different masks)."""
        if self.allowed is None:
            return "causal", None
        return mask_structure(self.allowed)


def mask_structure(allowed: torch.Tensor) -> tuple[str, int | None] | None:
    """The structure of a (..., T, T) bool mask whose leading entries are all the same matrix:
    ("causal", None), ("window", w) or ("bca", block); None otherwise. Each row must allow one
    contiguous run of keys ending at the query itself."""
    m = allowed.reshape(-1, *allowed.shape[-2:])
    if m.shape[-1] != m.shape[-2] or not bool((m == m[:1]).all()):
        return None
    m = m[0]
    T = m.shape[-1]
    i = torch.arange(T, device=m.device)
    first = m.int().argmax(-1)  # first allowed key of each row
    if not (bool(m[i, i].all()) and bool((m.sum(-1) == i - first + 1).all()) and not bool(m.triu(1).any())):
        return None  # not one contiguous run ending at the diagonal
    if bool((first == 0).all()):
        return "causal", None
    width = int((i - first + 1).max())
    if bool((first == (i - width + 1).clamp(min=0)).all()):
        return "window", width
    block = int(first[first > 0].min())  # under BCA, queries of the third block are the first to lose keys
    if bool((first == ((i // block - 1) * block).clamp(min=0)).all()):
        return "bca", block
    return None


_consumer: ContextVar[Callable[[LayerQK], None] | None] = ContextVar("attnres_capture_consumer", default=None)


def _capture_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: hand (q, k, scaling, mask) to the consumer, then SDPA."""
    consumer = _consumer.get()
    if consumer is None:
        raise RuntimeError(f"the {CAPTURE!r} attention runs only inside attnres_helpers.hf.capture")
    changed = [name for name in UNCAPTURABLE_KWARGS if kwargs.get(name) is not None]
    if changed:
        raise CaptureError(
            f"{type(module).__name__} passes {', '.join(changed)} to its attention: its pre-softmax "
            "score is not scaling · q·k + mask, so ŝ (Eq. 11) is not defined from q and k; "
            "this architecture cannot be captured"
        )
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    consumer(LayerQK(query.detach().float(), key.detach().float(), scaling, _allowed(attention_mask, key.shape[-2])))
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


AttentionInterface.register(CAPTURE, _capture_attention)
AttentionMaskInterface.register(CAPTURE, sdpa_mask)  # None for a plain causal layer, else a bool mask


def _allowed(mask: torch.Tensor | None, T_k: int) -> torch.Tensor | None:
    """A bool (…, T, T) mask (True: attend) from a bool or additive float mask; None if it is exactly
    the full causal mask (or absent)."""
    if mask is None:
        return None
    mask = mask[..., :T_k]
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(torch.float32).min / 2
    T_q = allowed.shape[-2]
    causal = torch.ones(T_q, T_k, dtype=torch.bool, device=allowed.device).tril()
    if (
        T_q == T_k
        and bool((allowed == causal).all())
        and (mask.dtype == torch.bool or bool((mask[..., causal] == 0).all()))
    ):
        return None
    return allowed


def _bloom_hooks(model, consume: Callable[[LayerQK], None]) -> list:
    """Forward hooks handing each BloomAttention's (q, k, scaling, mask, ALiBi slopes) to ``consume``."""

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        alibi, mask = kwargs["alibi"], kwargs["attention_mask"]
        B, T, _ = hidden.shape
        q, k, _ = module._reshape(module.query_key_value(hidden))  # (B, H, T, d) each
        alibi = module.beta * alibi.view(B, module.num_heads, -1).float()  # (B, H, T): slope · j
        slopes = alibi[0, :, 1] - alibi[0, :, 0]  # the model's own m_h
        if not torch.allclose(alibi, slopes[None, :, None] * torch.arange(alibi.shape[-1], device=alibi.device)):
            raise ValueError("BLOOM's ALiBi tensor is not slope · key index (padding?): capture needs unpadded input")
        consume(
            LayerQK(
                q.detach().float(),
                k.detach().float(),
                float(module.inv_norm_factor),
                _allowed(mask, T),
                slopes.detach(),
            )
        )

    attention = type(model.transformer.h[0].self_attention)
    return [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules() if isinstance(m, attention)]


def check_capturable(model: PreTrainedModel) -> str:
    """The model's ``model_type`` if its attention can be captured; a :class:`CaptureError` saying why not."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in HOOKED_TYPES or getattr(model, "_supports_attention_backend", False):
        return model_type
    raise CaptureError(
        f"model_type {model_type!r} computes its attention inside its own module, not through "
        "transformers' AttentionInterface, so its scores cannot be captured here (capturable: every "
        f"model whose class sets _supports_attention_backend, and {', '.join(HOOKED_TYPES)})"
    )


def context_length(model: PreTrainedModel) -> int | None:
    """The context a model was built for (``n_positions`` or ``max_position_embeddings``)."""
    cfg = model.config
    return getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)


def check_input_ids(model: PreTrainedModel, input_ids: torch.Tensor) -> None:
    """A clear error for input_ids that are not a (B, T >= 2) integer tensor the model can take."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        raise ValueError(
            f"input_ids must be a (B, T) tensor of token ids, got {getattr(input_ids, 'shape', type(input_ids))}"
        )
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must be an integer tensor (torch.long), got {input_ids.dtype}")
    B, T = input_ids.shape
    if B < 1 or T < 2:
        raise ValueError(f"need B >= 1 and T >= 2 tokens, got shape {tuple(input_ids.shape)}")
    vocab = model.config.vocab_size
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"token ids must be in [0, {vocab}), got [{int(input_ids.min())}, {int(input_ids.max())}]")
    positions = getattr(model.config, "n_positions", None) if model.config.model_type in ("gpt2", "opt") else None
    positions = positions or (model.config.max_position_embeddings if model.config.model_type == "opt" else None)
    if positions is not None and T > positions:
        raise ValueError(
            f"{model.config.model_type} has learned absolute positions for {positions} tokens; T = {T} is "
            "past them: there is no position embedding to extrapolate with"
        )


@contextmanager
def capturing(model: PreTrainedModel, consume: Callable[[LayerQK], None]) -> Iterator[None]:
    """Within the block, every attention layer of ``model`` hands its :class:`LayerQK` to ``consume``
    (in eval mode; the model's own attention implementation and mode are restored afterwards)."""
    model_type = check_capturable(model)
    was_training = model.training
    model.eval()
    if model_type in HOOKED_TYPES:
        handles = _bloom_hooks(model, consume)
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            model.train(was_training)
        return
    before = model.config._attn_implementation
    token = _consumer.set(consume)
    model.set_attn_implementation(CAPTURE)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
        _consumer.reset(token)
        model.train(was_training)


def _layers(model) -> int:
    return model.config.num_hidden_layers if hasattr(model.config, "num_hidden_layers") else model.config.n_layer


@torch.no_grad()
def capture(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, list[LayerQK]]:
    """Run ``input_ids (B, T)`` through ``model`` once: (logits (B, T, V), one :class:`LayerQK` per layer).
    ``attention_mask``: None (causal), or a 4-D bool mask (True: attend) used as it is."""
    check_input_ids(model, input_ids)
    layers: list[LayerQK] = []
    with capturing(model, layers.append):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    if len(layers) != _layers(model):
        raise CaptureError(
            f"{len(layers)} of {_layers(model)} attention layers were captured: this model does not "
            "route every layer's attention through transformers' AttentionInterface"
        )
    return logits, layers


def check_choice(name: str, value: str, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def layer_scores(layer: LayerQK, form: str = "raw") -> torch.Tensor:
    """(B, H, T, T) pre-softmax scores of one captured layer in the raw or the relative form, masked
    pairs at -inf."""
    check_choice("form", form, FORMS)
    scores = layer.scaling * layer.q @ layer.k.repeat_interleave(layer.groups, dim=1).transpose(-1, -2)  # (B, H, T, T)
    T = scores.shape[-1]
    if layer.slopes is not None:
        pos = torch.arange(T, dtype=scores.dtype, device=scores.device)
        offset = pos[None, :] if form == "raw" else pos[None, :] - pos[:, None]  # slope·j, or −slope·(i−j)
        scores = scores + layer.slopes.to(scores)[:, None, None] * offset
    allowed = (
        torch.ones(T, T, dtype=torch.bool, device=scores.device).tril() if layer.allowed is None else layer.allowed
    )
    return scores.masked_fill(~allowed, float("-inf"))


def captured_scores(model: PreTrainedModel, input_ids: torch.Tensor, form: str = "raw") -> list[torch.Tensor]:
    """Every layer's pre-softmax scores ``(B, H, T, T)``, masked pairs at -inf.

    ``form="raw"``: exactly what the model adds before its softmax (a softmax over keys gives the
    model's own attention probabilities). ``form="relative"``: BLOOM's per-row constant removed
    (ALiBi as −m_h·(i−j)); the same softmax, the other models unchanged.
    """
    check_choice("form", form, FORMS)
    _, layers = capture(model, input_ids)
    return [layer_scores(layer, form) for layer in layers]


def layer_s_hat(layer: LayerQK, method: str = "fft", form: str = "relative") -> torch.Tensor:
    """ŝ (H, T) of one captured layer, averaged over the batch (Sun et al. 2022, §4.3 Eq. 11).

    ``method="fft"``: from q and k by FFT (:func:`metric.expected_scores_fft`), O(T log T · d) per
    head, under the full causal mask, blockwise causal attention, or a causal sliding window of w
    keys (ŝ[n] for n < w, where every pair is unmasked; -inf from w on, where no query attends: ŝ is
    undefined there and R gives it no weight); other masks, and the raw form of ALiBi, raise a
    ValueError that says to use ``method="explicit"``: the sub-diagonal means of the (T, T) scores.
    """
    check_choice("method", method, METHODS)
    check_choice("form", form, FORMS)
    if method == "explicit":
        return diagonal_means(layer_scores(layer, form)).double().mean(0)
    if form == "raw" and layer.slopes is not None:
        raise ValueError(
            "the raw form of ALiBi (slope · key index) is not a function of distance: "
            "use method='explicit' for form='raw'"
        )
    structure = layer.mask_structure()
    if structure is None:
        raise ValueError(
            "the model's mask is neither causal, a causal sliding window nor BCA (padding?): "
            "the FFT estimator needs one of those; use method='explicit'"
        )
    kind, size = structure
    s_hat = expected_scores_fft(layer.q, layer.k, layer.scaling, block=size if kind == "bca" else None)  # (H, T)
    if kind == "window":
        s_hat[:, size:] = float("-inf")  # no query attends that far: undefined, and no weight in R
    if layer.slopes is not None:
        n = torch.arange(s_hat.shape[-1], dtype=s_hat.dtype)
        s_hat = s_hat - layer.slopes.double()[:, None] * n  # ALiBi's relative bias −m_h·n
    return s_hat


def layer_key0(layer: LayerQK) -> torch.Tensor:
    """(H, T): the mean over the batch of each query's relative-form score on key 0, -inf where masked."""
    key0 = layer.k[..., :1, :].repeat_interleave(layer.groups, dim=1).double()  # (B, H, 1, d)
    scores = layer.scaling * (layer.q.double() @ key0.transpose(-1, -2))[..., 0]  # (B, H, T)
    if layer.slopes is not None:
        scores = scores - layer.slopes.double()[:, None] * torch.arange(scores.shape[-1], dtype=torch.float64)
    if layer.allowed is not None:
        scores = scores.masked_fill(~layer.allowed[..., 0], float("-inf"))
    return scores.mean(0)


def captured_s_hat(
    model: PreTrainedModel, input_ids: torch.Tensor, method: str = "fft", form: str = "relative"
) -> torch.Tensor:
    """ŝ ``(layers, H, T)`` of a Hugging Face causal LM on ``input_ids (B, T)``, averaged over the batch.

    The relative form by default (see the module's note on BLOOM's per-row constant).
    """
    check_choice("method", method, METHODS)
    check_choice("form", form, FORMS)
    _, layers = capture(model, input_ids)
    return torch.stack([layer_s_hat(layer, method, form) for layer in layers])
