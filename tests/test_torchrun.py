"""attnres_helpers.torchrun: the device asked for, checked before any work."""

import pytest
import torch

from attnres_helpers.torchrun import check_device, cuda_index


def gpus(monkeypatch, count: int) -> None:
    """Make torch see ``count`` GPUs (0: none), whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    "count, device, message",
    [
        (0, "cuda", "device cuda: torch sees no CUDA device here"),
        (0, "cuda:0", "device cuda:0: torch sees no CUDA device here"),
        (1, "cuda:1", r"device cuda:1: torch sees 1 CUDA device \(cuda:0 to cuda:0\) here"),
        (2, "cuda:7", r"device cuda:7: torch sees 2 CUDA devices \(cuda:0 to cuda:1\) here"),
        (2, "mps", "device must be cpu, cuda or cuda:N, got 'mps'"),
        (2, "cuda:x", "device must be cpu, cuda or cuda:N, got 'cuda:x'"),
        (2, "cuda:", "device must be cpu, cuda or cuda:N, got 'cuda:'"),
    ],
)
def test_a_device_torch_cannot_use_is_refused_in_one_line(monkeypatch, count, device, message):
    gpus(monkeypatch, count)
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_device(device)


@pytest.mark.parametrize("count, device", [(0, "cpu"), (1, "cuda"), (1, "cuda:0"), (2, "cuda:1")])
def test_a_device_torch_sees_passes(monkeypatch, count, device):
    gpus(monkeypatch, count)
    check_device(device)


@pytest.mark.parametrize("device, index", [("cpu", None), ("cuda", 0), ("cuda:0", 0), ("cuda:3", 3)])
def test_the_gpu_a_device_names(device, index):
    assert cuda_index(device) == index
