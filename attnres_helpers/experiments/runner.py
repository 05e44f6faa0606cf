"""The one train-and-measure path: every :class:`.specs.Dataset` runs through :func:`run_datasets`.

Each run trains in a worker process (one torch thread each: on 2 busy cores, two models at once are far
faster than one on two threads), reusing a finished run and resuming an interrupted one from its last
checkpoint; then the worker measures the verified fp16 checkpoint (:func:`measure_spec`: ŝ, key-0
scores and per-position NLL at k·L with and without BCA, and the copy probe where the spec asks). The
parent rewrites the dataset's store after every finished run, atomically, holding its lock.

- **Stopping is safe.** Workers die with the parent (the kernel's parent-death signal, and a watchdog).
  A worker's error, or a store write that fails, stops the whole run at once: the runs in flight are
  cancelled and what finished is kept. A rerun continues where it stopped.
- **Runs already in a store** with the same metadata are kept, not re-run; a store written by another
  process at the same time is refused (:func:`files.exclusive`).
- **Across processes, under torchrun** (:func:`run_datasets_distributed`; the CLI's
  ``torchrun --nproc-per-node N -m attnres_helpers family-v2 --distributed``), off the default path: the
  N ranks join one gloo group, rank r trains and measures its share ``todo[r::N]`` of the runs (one torch
  thread on a CPU, ``cuda:<local rank>`` on GPUs) and rewrites its own part-store beside the store after
  each run; rank 0 holds the store's lock throughout and alone writes the store, merging the parts into
  it once every rank has finished (and, at the next start, any parts a stopped run left). The merged
  store holds the same tensors as a single-process run (tested on two CPU ranks). Plain
  ``python -m attnres_helpers family-v2`` is unchanged.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Collection, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import ExitStack, closing, contextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import files
from ..checkpoints import load_checkpoint, regenerate_command
from ..data import load_splits
from ..files import atomic_write, write_text_atomic
from ..measure import measure_model
from ..probe import copy_curve, copy_probes, gaps_for
from ..store import Profile, as_stored, average_heads, load_curves, load_profiles, records, save_profiles
from ..train import train
from .specs import (
    CHECKPOINTS,
    ENCODINGS,
    FAMILY_V2_RUNS,
    FAMILY_V2_STORE,
    MEASURE,
    REPRODUCE_COMMAND,
    SEEDS,
    SHIPPED_AS,
    STORE,
    Dataset,
    RunSpec,
    checkpoint_dir,
    default_dataset,
    family_v2_dataset,
    run_meta,
    slug,
)

TRAINED_KEYS = ("train_loss", "val_loss", "wall_s", "tokens_per_s", "device")  # config.json results kept in a store


def sha256sums(root: Path = CHECKPOINTS) -> str:
    """``sha256  relative/path`` lines for every file under ``root`` but SHA256SUMS, sorted; never a run's
    resume state (``state.json``, ``state-*.safetensors``) or a killed write's temporary (``.*.tmp-*``): a
    folder holding them is not a finished set of checkpoints, and the verifier then refuses them as unlisted."""
    text = files.sha256sums(root)
    return "".join(line for line in text.splitlines(keepends=True) if not _transient(line.split("  ", 1)[1].strip()))


def _transient(name: str) -> bool:
    base = Path(name).name
    return (
        base == "state.json"
        or (base.startswith("state-") and base.endswith(".safetensors"))
        or (base.startswith(".") and ".tmp-" in base)
    )


def verify_checkpoints(root: Path = CHECKPOINTS, fix: str | None = None) -> None:
    """Check every file under ``root`` against ``root/SHA256SUMS`` (:func:`files.verify_sha256sums`): a
    file that is missing, unlisted or changed raises a ValueError naming it (a tampered config.json or
    weight byte is caught before any model is built); ``fix`` is the command that regenerates ``root``
    (default: by the folder, :func:`checkpoints.regenerate_command`: ``hf-train`` for data/hf_checkpoints/)."""
    files.verify_sha256sums(root, fix or regenerate_command(Path(root)))


# ------------------------------------------------------------------------------------------ one run


def train_spec(spec: RunSpec, device: str = "cpu", progress: bool = False) -> dict:
    """Train ``spec`` (or reuse the finished run in its out_dir), checkpointing every 100 steps on a CPU;
    returns config.json's content."""
    _, summary = train(
        spec.cfg,
        seed=spec.seed,
        out_dir=spec.out_dir,
        checkpoint_every=100 if device == "cpu" else 0,
        device=device,
        progress=progress,
        **spec.training,
    )
    return summary


def measure_spec(spec: RunSpec, summary: dict, device: str = "cpu") -> tuple[list[Profile], dict]:
    """Profiles of the checkpoint in ``spec.out_dir`` (verified, its fp16 weights as shipped) with the
    spec's measuring settings, and its copy curves by (run, bca) where ``spec.probe``. The metadata gains
    ``trained``: the final losses, wall time and tokens/s from config.json."""
    _, val_tokens = load_splits()
    model = load_checkpoint(spec.out_dir).to(device)
    meta = {**spec.meta, "trained": {k: summary["results"][k] for k in TRAINED_KEYS}}
    profiles = measure_model(model, val_tokens.to(device), spec.name, meta, **{**MEASURE, **spec.measure})
    curves = {}
    if spec.probe:
        gaps = gaps_for(spec.cfg.train_len)
        probes = copy_probes(val_tokens, max_gap=max(gaps))
        for bca in (False, True) if model.supports_bca else (False,):
            curves[(spec.name, bca)] = copy_curve(model, probes, gaps, bca)
    return profiles, curves


@contextmanager
def _naming(spec: RunSpec):
    """A worker's error, as one RuntimeError naming the run."""
    try:
        yield
    except Exception as err:
        raise RuntimeError(f"run {spec.name} ({spec.out_dir}): {type(err).__name__}: {err}") from None


def train_and_measure(spec: RunSpec, device: str = "cpu", threads: int = 1) -> tuple[list[Profile], dict]:
    """A worker's job: train, then measure ``spec``; errors name the run."""
    torch.set_num_threads(threads)
    with _naming(spec):
        return measure_spec(spec, train_spec(spec, device), device)


def train_only(spec: RunSpec, device: str = "cpu", threads: int = 1) -> None:
    """A worker's job: train ``spec`` (no measuring); errors name the run."""
    torch.set_num_threads(threads)
    with _naming(spec):
        train_spec(spec, device)


# ------------------------------------------------------------------------------------------ the pool

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Worker initializer: exit when the parent process does (Linux's parent-death signal, and a
    watchdog thread for the rest), so a killed command leaves no worker behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _pool(jobs: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        max(1, jobs),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_die_with_parent,
        initargs=(os.getpid(),),
    )


def _stop(pool: ProcessPoolExecutor, futures) -> None:
    """Cancel what has not started and end the workers now (the runs in flight are lost, their last
    checkpoints kept)."""
    for f in futures:
        f.cancel()
    for process in list(getattr(pool, "_processes", {}).values()):  # no public API ends running workers
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def _in_pool(work, tasks: list[tuple], jobs: int, desc: str, progress: bool, deadline_s: float | None = None):
    """``work(argument)`` for every (tag, argument) of ``tasks``, ``jobs`` at once in worker processes,
    yielding (tag, result) as each finishes. A worker's error is raised at once and, like any error of the
    caller's while it handles a result (use it under ``contextlib.closing``), ends the pool: what has not
    started is cancelled and the runs in flight are stopped. With ``deadline_s``, tasks not started within
    that many seconds are skipped."""
    pool = _pool(jobs)
    futures = {pool.submit(work, argument): tag for tag, argument in tasks}
    start = time.monotonic()
    bar = tqdm(total=len(futures), desc=desc, disable=not progress)
    try:
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)  # each result handled at once
            for future in finished:
                if not future.cancelled():
                    yield futures[future], future.result()  # a worker's error is raised here
                    bar.update(1)
            if deadline_s is not None and time.monotonic() - start > deadline_s:
                for f in pending:
                    f.cancel()
    except BaseException:  # GeneratorExit too: the caller stopped on an error of its own
        _stop(pool, futures)
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)


def _kept(ds: Dataset, path: Path | None = None) -> tuple[list[Profile], dict]:
    """The profiles and curves already in ``ds.store`` (or in ``path``, a part of it) whose runs are wanted
    with the same metadata, and with their copy curves where the spec asks for the probe."""
    path = Path(path or ds.store)
    if not path.is_file():
        return [], {}
    wanted = {s.name: s.meta for s in ds.specs}
    old, curves = load_profiles(path)[0], load_curves(path)
    probed = {run for run, _ in curves}
    needs_probe = {s.name for s in ds.specs if s.probe}
    kept = [
        p
        for p in old
        if p.run in wanted
        and {k: p.meta.get(k) for k in wanted[p.run]} == wanted[p.run]
        and (p.run in probed or p.run not in needs_probe)
    ]
    runs = {p.run for p in kept}
    return kept, {key: c for key, c in curves.items() if key[0] in runs}


def run_datasets(
    datasets: list[Dataset],
    device: str = "cpu",
    jobs: int = 2,
    progress: bool = True,
    deadline_s: float | None = None,
    finished_only: bool = False,
) -> dict[Path, list[Profile]]:
    """Train and measure every run of every dataset, ``jobs`` at once, taking the datasets' runs in turn
    (one of each, then the next of each), so that a deadline leaves a part of every dataset. Each store
    is rewritten after every finished run of it, atomically, under its lock. With ``deadline_s``, runs not
    started within that many seconds are skipped. ``finished_only``: measure only the runs whose training
    has finished (config.json present), train nothing. A dataset with ``sums`` gets its SHA256SUMS
    rewritten once all its runs are trained. Returns each store's profiles exactly as the store holds
    them (:func:`store.as_stored`)."""
    stores = [Path(ds.store) for ds in datasets]
    if len(set(stores)) != len(stores):
        raise ValueError("two datasets write the same store")
    with _locks(stores):
        kept, curves, todo = _plan(datasets, finished_only)
        work = partial(train_and_measure, device=device)
        with closing(_in_pool(work, todo, jobs, "runs", progress, deadline_s)) as results:
            for ds, (profiles, run_curves) in results:  # each run's store written as soon as it finishes
                kept[ds.store] += as_stored(average_heads(profiles) if ds.average_heads else profiles, ds.dtype)
                curves[ds.store].update(run_curves)
                save_profiles(ds.store, kept[ds.store], ds.about, ds.dtype, curves[ds.store])
    for ds in datasets:
        if ds.sums is not None and all((s.out_dir / "config.json").is_file() for s in ds.specs):
            write_text_atomic(ds.sums / "SHA256SUMS", sha256sums(ds.sums))
    return kept


def _plan(datasets: list[Dataset], finished_only: bool) -> tuple[dict, dict, list]:
    """What each store keeps (profiles, curves), and the runs still to do, the datasets' runs in turn."""
    kept: dict[Path, list[Profile]] = {}
    curves: dict[Path, dict] = {}
    queues = []
    for ds in datasets:
        kept[ds.store], curves[ds.store] = _kept(ds)
        done = {p.run for p in kept[ds.store]}
        queues.append(
            [
                (ds, s)
                for s in ds.specs
                if s.name not in done and (not finished_only or (s.out_dir / "config.json").is_file())
            ]
        )
    return kept, curves, [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


@contextmanager
def _locks(paths):
    """Every store's lock held together (:func:`files.exclusive`), released in reverse order."""
    with ExitStack() as held:
        for path in paths:
            held.enter_context(files.exclusive(path))
        yield


def train_specs(specs: list[RunSpec], device: str = "cpu", jobs: int = 2, progress: bool = True) -> None:
    """Train every spec (no measuring), ``jobs`` at once; finished runs are reused, interrupted ones
    resumed; a worker's error stops the rest at once."""
    with closing(
        _in_pool(partial(train_only, device=device), [(s, s) for s in specs], jobs, "train", progress)
    ) as done:
        for _ in done:
            pass


# ------------------------------------------------------------------------------------------ torchrun


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


def part_path(store: Path, rank: int, world: int) -> Path:
    """Where rank ``rank`` of ``world`` keeps its part of ``store`` until rank 0 merges it."""
    store = Path(store)
    return store.with_name(f"{store.stem}.part{rank}of{world}{store.suffix}")


def _parts(store: Path) -> list[Path]:
    store = Path(store)
    return sorted(store.parent.glob(f"{store.stem}.part*of*{store.suffix}"))


def _merge_parts(datasets: list[Dataset]) -> dict[Path, list[Profile]]:
    """Rank 0, holding every store's lock: each store rewritten with what it keeps and every part of it
    (the wanted runs, by metadata), then the parts deleted."""
    kept = {}
    for ds in datasets:
        profiles, curves = _kept(ds)
        parts = _parts(ds.store)
        for part in parts:
            done = {p.run for p in profiles}
            more, more_curves = _kept(ds, part)
            profiles += as_stored([p for p in more if p.run not in done], ds.dtype)
            curves.update({key: c for key, c in more_curves.items() if key[0] not in done})
        if parts:
            save_profiles(ds.store, profiles, ds.about, ds.dtype, curves)
            for part in parts:
                part.unlink()
        kept[ds.store] = profiles
    return kept


def run_datasets_distributed(
    datasets: list[Dataset], device: str = "cpu", progress: bool = True, finished_only: bool = False
) -> dict[Path, list[Profile]] | None:
    """:func:`run_datasets` across the processes of ``torchrun --nproc-per-node N`` (gloo, CPU or GPU).

    Every rank plans the same runs from the stores; rank r trains and measures ``todo[r::N]`` in its own
    process (one torch thread on a CPU, ``cuda:<local rank>`` on GPUs), rewriting its part-store
    (:func:`part_path`, float32, under its own lock) after each run; once every rank is done (a gloo
    barrier), rank 0 alone writes each store, merging the parts into it, and deletes them. Parts left by a
    stopped run are merged by rank 0 at the next start, so a rerun continues where it stopped. A rank
    that fails is stopped by torchrun with the others. Returns the stores' profiles on rank 0, None on
    the others."""
    import torch.distributed as dist

    env = distributed_rank()
    if env is None:
        raise RuntimeError(
            "run_datasets_distributed runs under torchrun (RANK and WORLD_SIZE unset); start it "
            "with `torchrun --nproc-per-node N -m attnres_helpers ... --distributed`"
        )
    rank, world, local = env
    _die_with_parent(os.getppid())  # each rank dies with torchrun's agent, as pool workers die with their parent
    stores = [Path(ds.store) for ds in datasets]
    if len(set(stores)) != len(stores):
        raise ValueError("two datasets write the same store")
    device = _rank_device(device, local)
    if not str(device).startswith("cuda"):
        torch.set_num_threads(1)
    with _process_group(), ExitStack() as held:
        if rank == 0:  # rank 0 holds every store's lock from the first merge to the last: the one writer
            held.enter_context(_locks(stores))
            _merge_parts(datasets)  # what a stopped run left
        dist.barrier()
        _, _, todo = _plan(datasets, finished_only)  # the same plan on every rank: rank 0 has merged, nobody writes
        mine = todo[rank::world]
        parts = {ds.store: part_path(ds.store, rank, world) for ds in datasets}
        done: dict[Path, list[Profile]] = {store: [] for store in stores}
        curves: dict[Path, dict] = {store: {} for store in stores}
        with _locks(sorted({parts[ds.store] for ds, _ in mine})):
            for ds, spec in tqdm(mine, desc=f"runs (rank {rank})", disable=not progress or rank != 0):
                profiles, run_curves = train_and_measure(spec, device, threads=torch.get_num_threads())
                done[ds.store] += average_heads(profiles) if ds.average_heads else profiles
                curves[ds.store].update(run_curves)
                save_profiles(parts[ds.store], done[ds.store], ds.about, torch.float32, curves[ds.store])
        dist.barrier()
        kept = None
        if rank == 0:
            kept = _merge_parts(datasets)
            for ds in datasets:
                if ds.sums is not None and all((s.out_dir / "config.json").is_file() for s in ds.specs):
                    write_text_atomic(ds.sums / "SHA256SUMS", sha256sums(ds.sums))
        dist.barrier()
        return kept


def _rank_device(device: str, local: int) -> str:
    """``cuda`` becomes this rank's GPU (``cuda:<local rank>``); anything else is kept."""
    return f"cuda:{local}" if str(device) == "cuda" else device


BARRIER_TIMEOUT = timedelta(days=7)  # a rank that finishes its share early waits at the barrier for the slowest


@contextmanager
def _process_group():
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


# ------------------------------------------------------------------------------------------ datasets


def reproduce(
    root: Path = CHECKPOINTS,
    store: Path = STORE,
    encodings: Iterable[str] = ENCODINGS,
    seeds: Collection[int] = SEEDS,
    device: str = "cpu",
    jobs: int = 2,
    progress: bool = True,
    **settings,
) -> list[Profile]:
    """The shipped experiment: train (or reuse finished runs in ``root``), measure, write the store and
    ``root/SHA256SUMS``; ``settings``: ``model``, ``training``, ``measure`` of :func:`.specs.default_dataset`."""
    dataset = default_dataset(root, store, encodings, seeds, **settings)
    return run_datasets([dataset], device, jobs, progress)[Path(store)]


def measure_checkpoints(
    root: Path = CHECKPOINTS,
    encodings: Iterable[str] = ENCODINGS,
    seeds: Collection[int] = SEEDS,
    progress: bool = True,
    **measure,
) -> list[Profile]:
    """Profiles of every shipped checkpoint under ``root``, after verifying SHA256SUMS (nothing trains)."""
    verify_checkpoints(root)
    _, val_tokens = load_splits()
    profiles = []
    for e, s in tqdm([(e, s) for e in encodings for s in seeds], desc="measure", disable=not progress):
        run_dir = checkpoint_dir(e, s, root)
        summary = json.loads((run_dir / "config.json").read_text())  # verified above
        model = load_checkpoint(run_dir)
        training = {k: summary["train"][k] for k in ("steps", "batch_tokens", "lr", "warmup", "weight_decay")}
        meta = {**run_meta(model.cfg, s, training), "trained": {k: summary["results"][k] for k in TRAINED_KEYS}}
        profiles += measure_model(model, val_tokens, run_dir.name, meta, **{**MEASURE, **measure})
    return profiles


def reuse_shipped(runs_root: Path = FAMILY_V2_RUNS, shipped: Path = CHECKPOINTS) -> dict[str, bool]:
    """For each setting of SHIPPED_AS whose seed 0 has been trained in ``runs_root``: True (and seeds 1, 2
    copied in from ``shipped``, after verifying its SHA256SUMS) where that seed 0's model.safetensors
    equals the shipped seed 0 byte for byte; False where it differs (those seeds are then trained)."""
    verify_checkpoints(shipped)
    reused = {}
    for label, encoding in SHIPPED_AS.items():
        retrained = Path(runs_root) / f"{slug(label)}-s0" / "model.safetensors"
        if not retrained.is_file():
            continue
        reused[label] = (
            retrained.read_bytes() == (checkpoint_dir(encoding, 0, shipped) / "model.safetensors").read_bytes()
        )
        if not reused[label]:
            continue
        for seed in (1, 2):
            target = Path(runs_root) / f"{slug(label)}-s{seed}"
            for name in ("model.safetensors", "config.json"):  # model first: config.json marks a finished run
                data = (checkpoint_dir(encoding, seed, shipped) / name).read_bytes()
                atomic_write(target / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
    return reused


def run_family_v2(
    store: Path = FAMILY_V2_STORE,
    device: str = "cpu",
    jobs: int = 2,
    extra_seeds: bool = False,
    progress: bool = True,
    measure_only: bool = False,
    distributed: bool = False,
) -> list[Profile] | None:
    """The v2 family (plan v2): seed 0 of every setting, then :func:`reuse_shipped`, then seeds 1 and 2
    (and, with ``extra_seeds``, seeds 3 and 4 of the RoPE-base and xPos-B settings), each measured with
    the copy probe into ``store`` as it finishes; resumable. ``measure_only``: measure the runs whose
    training has finished and train nothing (while another process trains the rest). ``distributed``:
    under torchrun, each rank takes its share (:func:`run_datasets_distributed`); ``jobs`` is then unused,
    and the profiles are returned on rank 0 only (None elsewhere)."""
    if distributed:
        return _run_family_v2_distributed(Path(store), device, extra_seeds, progress, measure_only)
    if measure_only:
        dataset = family_v2_dataset(store, SEEDS, device, extra_seeds=extra_seeds)
        return run_datasets([dataset], device, jobs, progress, finished_only=True)[Path(store)]
    first = [
        s
        for s in family_v2_dataset(store, (0,), device).specs
        if s.extra["config"] in SHIPPED_AS and not (s.out_dir / "config.json").is_file()
    ]
    train_specs(first, device, jobs, progress)  # the five seeds 0 that decide the reuse, before anything else
    reuse_shipped(FAMILY_V2_RUNS)
    return run_datasets([family_v2_dataset(store, SEEDS, device, extra_seeds=extra_seeds)], device, jobs, progress)[
        Path(store)
    ]


def _run_family_v2_distributed(
    store: Path, device: str, extra_seeds: bool, progress: bool, measure_only: bool
) -> list[Profile] | None:
    import torch.distributed as dist

    env = distributed_rank()
    if env is None:
        raise RuntimeError(
            "--distributed runs under torchrun (RANK and WORLD_SIZE unset); start it with "
            "`torchrun --nproc-per-node N -m attnres_helpers family-v2 --distributed`"
        )
    rank, world, _ = env
    dataset = family_v2_dataset(store, SEEDS, device, extra_seeds=extra_seeds)
    with _process_group():
        if not measure_only:
            first = [
                s
                for s in family_v2_dataset(store, (0,), device).specs
                if s.extra["config"] in SHIPPED_AS and not (s.out_dir / "config.json").is_file()
            ]
            for spec in first[rank::world]:  # the five seeds 0 that decide the reuse, before anything else
                train_only(spec, _rank_device(device, env[2]), threads=1)
            dist.barrier()
            if rank == 0:
                reuse_shipped(FAMILY_V2_RUNS)
            dist.barrier()
        kept = run_datasets_distributed([dataset], device, progress, finished_only=measure_only)
    return None if kept is None else kept[store]


def load_results(path: Path = STORE, boundary: str = "zero") -> list[dict]:
    """Records (:func:`attnres_helpers.store.records`) of a shipped store; a clear error if it is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; regenerate it with `{REPRODUCE_COMMAND}`")
    return records(load_profiles(path)[0], boundary, curves=load_curves(path) or None)


def ship_hf_checkpoints(
    runs_root: Path | None = None, root: Path | None = None, runs: Iterable[str] | None = None
) -> None:
    """Copy the shipped HF runs' config.json and fp16 model into ``root`` and write its SHA256SUMS."""
    from ..paths import HF_CHECKPOINTS
    from .specs import HF_RUNS, HF_SHIPPED

    runs_root, root, runs = Path(runs_root or HF_RUNS), Path(root or HF_CHECKPOINTS), runs or HF_SHIPPED
    for run in runs:
        for name in ("config.json", "model.safetensors"):
            data = (runs_root / run / name).read_bytes()
            atomic_write(root / run / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
    write_text_atomic(root / "SHA256SUMS", sha256sums(root))
