"""The runner under torchrun, off the default path: ``torchrun --nproc-per-node N -m attnres_helpers reproduce
family-v2 --distributed``. The N ranks join one gloo group; rank r trains and measures its share ``todo[r::N]`` of the
runs (one torch thread on a CPU, ``cuda:<local rank>`` on GPUs) and rewrites its own part-store beside the
store after each run; rank 0 holds the store's lock throughout and alone writes the store, merging the parts
into it once every rank has finished (and, at the next start, any parts a stopped run left). The merged store
holds the same tensors as a single-process run (tested on two CPU ranks). Everything else is
:mod:`.work`'s, which the runner uses too: the same plan, the same training and measuring, the same seals.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import files
from ..store import Profile, as_stored, average_heads, save_profiles
from ..torchrun import distributed_rank, process_group
from . import work  # through work's names, so that a test's patch of them holds here too
from .specs import Dataset, RunSpec


def part_path(store: Path, rank: int, world: int) -> Path:
    """Where rank ``rank`` of ``world`` keeps its part of ``store`` until rank 0 merges it."""
    store = Path(store)
    return store.with_name(f"{store.stem}.part{rank}of{world}{store.suffix}")


def _parts(store: Path) -> list[Path]:
    store = Path(store)
    return sorted(store.parent.glob(f"{store.stem}.part*of*{store.suffix}"))


def _merge_parts(datasets: list[Dataset], written: set | None = None) -> dict[Path, list[Profile]]:
    """Rank 0, holding every store's lock: each store rewritten with every part of it (a part's runs that
    its dataset asks for as they are replace the store's), then the parts deleted; ``written`` gains the
    stores rewritten."""
    kept = {}
    for ds in datasets:
        profiles, curves, _ = work.load_store(ds.store)
        parts = _parts(ds.store)
        for part in parts:
            more, more_curves, about = work.load_store(part)
            current = ds.current(more, more_curves, about)
            more_curves = {key: c for key, c in more_curves.items() if key[0] in current}
            new = as_stored([p for p in more if p.run in current], ds.dtype)
            profiles, curves = work.replace_runs(profiles, curves, new, more_curves)
        if parts:
            save_profiles(ds.store, profiles, ds.about, ds.dtype, curves)
            for part in parts:
                part.unlink()
            if written is not None:
                written.add(ds.store)
        kept[ds.store] = profiles
    return kept


def run_datasets_distributed(
    datasets: list[Dataset], device: str = "cpu", progress: bool = True, finished_only: bool = False
) -> dict[Path, list[Profile]] | None:
    """:func:`.runner.run_datasets` across the processes of ``torchrun --nproc-per-node N`` (gloo, CPU or GPU).

    Every rank plans the same runs from the stores; rank r trains and measures ``todo[r::N]`` in its own
    process (one torch thread on a CPU, ``cuda:<local rank>`` on GPUs), rewriting its part-store
    (:func:`part_path`, float32, under its own lock) after each run; once every rank is done (a gloo
    barrier), rank 0 alone writes each store, merging the parts into it, and deletes them. Parts left by a
    stopped run are merged by rank 0 at the next start, so a rerun continues where it stopped. A rank
    that fails is stopped by torchrun with the others. Returns the stores' profiles on rank 0, None on
    the others."""
    env = distributed_rank()
    if env is None:
        raise RuntimeError(
            "run_datasets_distributed runs under torchrun (RANK and WORLD_SIZE unset); start it "
            "with `torchrun --nproc-per-node N -m attnres_helpers ... --distributed`"
        )
    rank, world, local = env
    work.die_with_parent(os.getppid())  # each rank dies with torchrun's agent, as pool workers die with their parent
    work.check_inputs(datasets, _rank_device(device, local))
    with process_group(), ExitStack() as held:
        if rank == 0:  # rank 0 holds every store's lock from the first merge to the last: the one writer
            held.enter_context(work.locks([Path(ds.store) for ds in datasets]))
        return _distributed(datasets, device, progress, finished_only, env)


def _distributed(datasets: list[Dataset], device: str, progress: bool, finished_only: bool, env: tuple) -> dict | None:
    """:func:`run_datasets_distributed`'s work, in its process group, rank 0 holding every store's lock."""
    import torch.distributed as dist

    rank, world, local = env
    stores = [Path(ds.store) for ds in datasets]
    device = _rank_device(device, local)
    if not str(device).startswith("cuda"):
        torch.set_num_threads(1)
    written: set = set()
    if rank == 0:
        _merge_parts(datasets, written)  # what a stopped run left
    dist.barrier()
    # the same plan on every rank: rank 0 has merged, nobody writes; rank 0 alone says what it keeps
    _, _, todo, _ = work.plan_runs(datasets, finished_only, say=rank == 0)
    mine = todo[rank::world]
    parts = {ds.store: part_path(ds.store, rank, world) for ds in datasets}
    done: dict[Path, list[Profile]] = {store: [] for store in stores}
    curves: dict[Path, dict] = {store: {} for store in stores}
    with work.locks(sorted({parts[ds.store] for ds, _ in mine})):
        for ds, spec in tqdm(mine, desc=f"runs (rank {rank})", disable=not progress or rank != 0):
            profiles, run_curves = work.train_and_measure(spec, device, threads=torch.get_num_threads())
            done[ds.store] += average_heads(profiles) if ds.average_heads else profiles
            curves[ds.store].update(run_curves)
            save_profiles(parts[ds.store], done[ds.store], ds.about, torch.float32, curves[ds.store])
    dist.barrier()
    kept = None
    if rank == 0:
        kept = _merge_parts(datasets, written)
        work.seal_roots(datasets)
        work.report(stores, kept, written, set())
    dist.barrier()
    return kept


def _rank_device(device: str, local: int) -> str:
    """``cuda`` becomes this rank's GPU (``cuda:<local rank>``); anything else is kept."""
    return f"cuda:{local}" if str(device) == "cuda" else device


def run_family_v2_distributed(
    dataset: Dataset, first: list[RunSpec], device: str, progress: bool, measure_only: bool, runs_root: Path
) -> list[Profile] | None:
    """:func:`.runner.run_family_v2` under torchrun: each rank trains its share of the first seeds, rank 0
    reuses the shipped ones, then every rank measures and trains its share of the rest (:func:`_distributed`)."""
    import torch.distributed as dist

    env = distributed_rank()
    if env is None:
        raise RuntimeError(
            "--distributed runs under torchrun (RANK and WORLD_SIZE unset); start it with "
            "`torchrun --nproc-per-node N -m attnres_helpers reproduce family-v2 --distributed`"
        )
    rank, world, local = env
    work.check_inputs([dataset], _rank_device(device, local))
    with process_group(), ExitStack() as held:
        if rank == 0:  # the store's lock from the first training step to the last write
            held.enter_context(files.exclusive(dataset.store))
        for spec in first[rank::world]:
            work.train_only(spec, _rank_device(device, local), threads=1)
        dist.barrier()
        if rank == 0 and not measure_only:
            work.reuse_shipped(runs_root)
        dist.barrier()
        kept = _distributed([dataset], device, progress, measure_only, env)
    return None if kept is None else kept[dataset.store]
