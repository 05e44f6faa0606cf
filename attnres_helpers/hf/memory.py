"""Whether one measured window fits this machine, estimated from the model's config before any weight is
read, so that a length past what the machine can hold is refused in one line first (issue 40's bad input)
instead of failing, or swapping, an hour in. Used by ``attnres measure MODEL`` at lengths and under
``--configuration``.

The estimate (:func:`window_bytes`) is the peak of one window pass of T tokens (:func:`.pretrained.window_pass`,
which both measurements share), in float32 on the CPU: the interpreter with torch and transformers, the
weights, one chunk of logits for the NLL (:data:`NLL_CHUNK` positions at a time, with its
log-sum-exp), and per token the layer's activations (hidden states and the MLP's gate, up and product) with
ŝ's FFT of q and k (complex128, padded to a power of two at least 2T); plus ``pair_bytes`` per (query, key)
pair where a measurement holds a (T, T) matrix (the explicit method's scores, a BCA mask). Measured on
SmolLM2-135M under ``--configuration`` (``benchmarks/bench_configurations.py``'s peak RSS, one window as
trained): 1.59 GiB at T = 2048, 1.72 at 4096, 1.8-2.2 at 16384; the estimate gives 1.6, 1.8 and 2.8: close
where the fixed part dominates, above the measurement at long T. The (T, T) term is not calibrated. It is a
reason to refuse only a length far past the machine, not a measurement.
"""

from __future__ import annotations

import os

from ..torchrun import cuda_index

NLL_CHUNK = 1024  # positions whose logits exist at once (.pretrained.nll_in_chunks): (1024, V) float32
RUNTIME_BYTES = 400 * 2**20  # python, torch and transformers imported, the tokenizer and the corpus (~0.36 GiB)
FLOAT = 4  # float32 weights and activations
FFT_BYTES_PER_PAIR = 64  # 16-byte complex128, padded to >= 2T, the transform and its product: per head and dim


def window_bytes(config, T: int, pair_bytes: int = 0) -> int:
    """The estimated peak bytes of one window measurement of ``T`` tokens (module docstring)."""
    D = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or 4 * D
    H = config.num_attention_heads
    H_k = getattr(config, "num_key_value_heads", None) or H
    d = getattr(config, "head_dim", None) or D // H
    V, layers = config.vocab_size, config.num_hidden_layers
    per_layer = D * H * d + 2 * D * H_k * d + H * d * D + 3 * D * inner + 2 * D
    params = V * D * (1 if getattr(config, "tie_word_embeddings", True) else 2) + layers * per_layer + D  # + final norm
    logits = 3 * NLL_CHUNK * V * FLOAT  # a chunk's logits, their exponentials and the reduction's temporaries
    per_token = FLOAT * (6 * D + 4 * inner) + FFT_BYTES_PER_PAIR * (H + H_k) * d
    return RUNTIME_BYTES + FLOAT * params + logits + T * per_token + pair_bytes * T * T


def available_bytes(device: str = "cpu") -> int | None:
    """The memory a measurement on ``device`` may take: the CPU's available memory (Linux's MemAvailable,
    else its physical memory), or a GPU's total memory; None where it cannot be read."""
    index = cuda_index(device)
    if index is not None:
        import torch

        return torch.cuda.get_device_properties(index).total_memory
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(config, T: int, device: str = "cpu", available: int | None = None, pair_bytes: int = 0) -> None:
    """A one-line error if one window of ``T`` tokens is estimated to need more memory than ``device`` has
    (``available``: bytes, default :func:`available_bytes`; nothing is refused where that is unknown)."""
    available = available_bytes(device) if available is None else available
    need = window_bytes(config, T, pair_bytes)
    if available is not None and need > available:
        raise ValueError(
            f"T = {T} tokens needs about {need / 2**30:.1f} GiB a window by a rough estimate "
            f"(attnres_helpers/hf/memory.py), more than the {available / 2**30:.1f} GiB {device} has available: "
            "measure a model with a shorter context"
        )
