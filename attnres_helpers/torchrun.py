"""Where this process runs: the device asked for (checked before any work), and where torchrun started it:
its rank and world, and torch.distributed's gloo group.

Used by every command that shares its jobs between torchrun's ranks (``reproduce family-v2 --distributed``,
``measure MODEL --configuration``, ``reproduce configurations``); without torchrun's environment a process
is rank 0 of 1 and opens no group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta


def cuda_index(device: str) -> int | None:
    """The GPU a device string names: None for ``cpu``, 0 for ``cuda``, N for ``cuda:N``; a one-line error
    for anything else."""
    device = str(device)
    if device == "cpu":
        return None
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    return int(index or 0)


def check_device(device: str) -> None:
    """A one-line error for a device torch cannot use here: not ``cpu``, ``cuda`` or ``cuda:N``; ``cuda``
    without a GPU; ``cuda:N`` past the GPUs torch sees."""
    index = cuda_index(device)
    if index is None:
        return
    import torch  # here, not above: the CLI checks its default "cpu" without importing torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        seen = (
            f"{count} CUDA device{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})" if count else "no CUDA device"
        )
        raise ValueError(f"device {device}: torch sees {seen} here")


def distributed_rank() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when this process was started by torchrun (RANK and WORLD_SIZE in
    its environment), else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (as torchrun sets them)") from None
    if not 0 <= rank < world:
        raise ValueError(f"RANK must be in [0, WORLD_SIZE), got RANK={rank}, WORLD_SIZE={world}")
    return rank, world, local


BARRIER_TIMEOUT = timedelta(days=7)  # a rank that finishes its share early waits at the barrier for the slowest


@contextmanager
def process_group() -> Iterator[None]:
    """torch.distributed's gloo group from torchrun's environment, for the block (if none is open yet)."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
    try:
        yield
    finally:
        dist.destroy_process_group()
