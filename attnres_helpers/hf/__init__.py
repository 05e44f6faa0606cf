"""Attention resolution of Hugging Face causal LMs (notebooks 06 to 10); its main parts:

- :mod:`.attention`: each layer's q, k, scaling and mask as `transformers` computes them, the scores and
  ŝ (by FFT or explicitly) from them;
- :mod:`.architectures`: `transformers`' Llama, BLOOM, GPT-2 and GPT-NeoX built at this project's sizes,
  trained and measured like our own models;
- :mod:`.pretrained`: a pretrained model measured at length on our held-out text, window by window,
  into a store; :mod:`.models` is the registry of real pretrained models and :mod:`.fetch` fetches,
  converts, verifies and loads them (SmolLM2-135M, Gemma 3 270M);
- :mod:`.configurations`, :mod:`.configured_attention` and :mod:`.configured`: one model under training-free
  configurations (notebooks 08 and 09); :mod:`.design_time`: design-time R of such a model (notebook 10);
  :mod:`.sinks`: whether a model's sink follows its first token (notebook 07).
"""

from .architectures import HF_ARCHITECTURES, HFCausalLM, HFConfig, build
from .attention import (
    FORMS,
    METHODS,
    CaptureError,
    LayerQK,
    capture,
    captured_s_hat,
    captured_scores,
    capturing,
    check_capturable,
    context_length,
    layer_key0,
    layer_s_hat,
    layer_scores,
)
from .pretrained import encoding_of, load_pretrained, measure_pretrained, measure_store, window_statistics

__all__ = [
    "HF_ARCHITECTURES",
    "HFCausalLM",
    "HFConfig",
    "build",
    "FORMS",
    "METHODS",
    "CaptureError",
    "LayerQK",
    "capture",
    "captured_s_hat",
    "captured_scores",
    "capturing",
    "check_capturable",
    "context_length",
    "layer_key0",
    "layer_s_hat",
    "layer_scores",
    "encoding_of",
    "load_pretrained",
    "measure_pretrained",
    "measure_store",
    "window_statistics",
]
