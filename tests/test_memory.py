"""attnres_helpers.hf.memory: one configured window's memory, estimated from a config before any weight."""

import os
from types import SimpleNamespace

import pytest

from attnres_helpers.hf.memory import (
    FFT_BYTES_PER_PAIR,
    NLL_CHUNK,
    RUNTIME_BYTES,
    available_bytes,
    check_fits,
    window_bytes,
)

# SmolLM2-135M's shape (its config.json): 30 layers of 576, 9 query heads and 3 key heads of 64, MLP 1536
SMOLLM2_SHAPE = SimpleNamespace(
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
    num_hidden_layers=30,
    tie_word_embeddings=True,
)


def test_the_estimate_is_its_closed_form():
    """Weights: 134,515,008 parameters (SmolLM2-135M's count); per token: activations and ŝ's FFT."""
    params = 49152 * 576 + 30 * (576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536 + 2 * 576) + 576
    assert params == 134_515_008
    per_token = 4 * (6 * 576 + 4 * 1536) + FFT_BYTES_PER_PAIR * 12 * 64
    fixed = RUNTIME_BYTES + 4 * params + 3 * NLL_CHUNK * 49152 * 4
    for T in (1, 2048, 16384):
        assert window_bytes(SMOLLM2_SHAPE, T) == fixed + T * per_token


def test_the_estimate_is_near_smollm2s_measured_peak():
    """Peak RSS of one window as trained (benchmarks/bench_configurations.py): 1.59 GiB at T = 2048 and
    1.72 at 4096 (one thread), 1.81-2.10 at 16384 (two threads): the estimate within 10% at the short
    lengths, above the measurement (never below it) at the long one."""
    gib = lambda T: window_bytes(SMOLLM2_SHAPE, T) / 2**30  # noqa: E731
    assert gib(2048) == pytest.approx(1.59, rel=0.1) and gib(4096) == pytest.approx(1.72, rel=0.1)
    assert 2.10 < gib(16384) < 2 * 1.81


def test_a_length_past_the_machine_is_refused_in_one_line():
    need = window_bytes(SMOLLM2_SHAPE, 2**20)
    check_fits(SMOLLM2_SHAPE, 2**20, available=need)  # exactly enough: passes
    with pytest.raises(
        ValueError, match=r"^T = 1048576 tokens needs about \d+\.\d GiB a window .* more than the 4\.0 GiB"
    ):
        check_fits(SMOLLM2_SHAPE, 2**20, available=4 * 2**30)


def test_nothing_is_refused_where_the_memory_is_unknown(monkeypatch):
    import attnres_helpers.hf.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": None)
    check_fits(SMOLLM2_SHAPE, 2**40)


def test_a_square_matrix_adds_its_pairs():
    """The explicit method's (H, T, T) scores, or a BCA mask: pair_bytes for each of the T² pairs."""
    assert window_bytes(SMOLLM2_SHAPE, 4096, pair_bytes=72) - window_bytes(SMOLLM2_SHAPE, 4096) == 72 * 4096**2


@pytest.mark.parametrize("device, index", [("cuda", 0), ("cuda:2", 2)])
def test_a_gpus_memory_is_read_from_the_gpu_the_device_names(monkeypatch, device, index):
    import torch

    asked = []
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: asked.append(i) or SimpleNamespace(total_memory=80 * 2**30)
    )
    assert available_bytes(device) == 80 * 2**30 and asked == [index]


def test_the_cpus_memory_is_this_machines():
    assert 0 < available_bytes("cpu") <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
