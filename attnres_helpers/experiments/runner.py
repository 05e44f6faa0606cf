"""The one train-and-measure path: every :class:`.specs.Dataset` runs through :func:`run_datasets`.

Each run trains in a worker process (one torch thread each: on 2 busy cores, two models at once are far
faster than one on two threads), reusing a finished run and resuming an interrupted one from its last
checkpoint; then the worker measures the verified fp16 checkpoint (:func:`measure_spec`: ŝ, key-0
scores and per-position NLL at k·L with and without BCA, and the copy probe where the spec asks). The
parent rewrites the dataset's store after every finished run, atomically, holding its lock. One run's
work and the plan over the stores are :mod:`.work`'s, which :mod:`.distributed` runs too; here are the
pool of worker processes and the datasets.

- **Stopping is safe.** Workers die with the parent (the kernel's parent-death signal, and a watchdog).
  A worker's error, or a store write that fails, stops the whole run at once: the runs in flight are
  cancelled and what finished is kept. A rerun continues where it stopped.
- **Runs already in a store** with the same metadata and measuring settings are kept, not re-run; runs
  a dataset does not list are kept as they are (one line says so), and a run leaves a store only when
  asked by name (``drop``, the CLI's ``--drop RUN``; a line names each). The store's lock
  (:func:`files.exclusive`) is held for the whole command, training included (the workers take none),
  so a second command on the same store is refused at once; every input is checked before any work.
- **Seals.** A root (``Dataset.sums``) is sealed only over runs that match their own SHA256SUMS
  (:func:`checkpoints.seal_root`); a finished run whose seal is missing or wrong is refused, never re-sealed.
- **Across processes, under torchrun** (:mod:`.distributed`'s :func:`run_datasets_distributed`; the CLI's
  ``torchrun --nproc-per-node N -m attnres_helpers reproduce family-v2 --distributed``), off the default path: the
  N ranks join one gloo group, rank r trains and measures its share ``todo[r::N]`` of the runs (one torch
  thread on a CPU, ``cuda:<local rank>`` on GPUs) and rewrites its own part-store beside the store after
  each run; rank 0 holds the store's lock throughout and alone writes the store, merging the parts into
  it once every rank has finished (and, at the next start, any parts a stopped run left). The merged
  store holds the same tensors as a single-process run (tested on two CPU ranks). Plain
  ``attnres reproduce family-v2`` is unchanged.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Collection, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import closing
from functools import partial
from pathlib import Path

from tqdm.auto import tqdm

from .. import files
from ..checkpoints import model_config, read_json, sha256sums, verify_checkpoints, verify_finished
from ..files import atomic_write, write_text_atomic
from ..store import Profile, as_stored, average_heads, load_curves, load_profiles, records, save_profiles
from .distributed import run_family_v2_distributed
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
)
from .work import (
    check_inputs,
    die_with_parent,
    locks,
    measure_spec,
    plan_runs,
    replace_runs,
    report,
    reuse_shipped,
    seal_roots,
    train_and_measure,
    train_only,
)
from .work import train_spec as train_spec  # the package's name for it (experiments.train_spec)

# ------------------------------------------------------------------------------------------ one run


# ------------------------------------------------------------------------------------------ the pool


def _start_worker(parent: int, pids) -> None:
    """A pool worker's initializer: report this worker's pid (so :meth:`_Pool.terminate` can end it) and
    die with the parent."""
    pids.put(os.getpid())
    die_with_parent(parent)


class _Pool(ProcessPoolExecutor):
    """Spawned worker processes whose pids come back through a queue, so that :meth:`terminate` can end the
    runs in flight (ProcessPoolExecutor has no public call that stops a running worker before Python 3.14's
    ``terminate_workers``)."""

    def __init__(self, jobs: int):
        context = multiprocessing.get_context("spawn")
        self._pids = context.SimpleQueue()
        super().__init__(
            max(1, jobs), mp_context=context, initializer=_start_worker, initargs=(os.getpid(), self._pids)
        )

    def terminate(self) -> None:
        """SIGTERM every worker started so far (a worker is a child until the pool reaps it: its pid is not reused)."""
        while not self._pids.empty():
            try:
                os.kill(self._pids.get(), signal.SIGTERM)
            except ProcessLookupError:
                pass


def _stop(pool: _Pool, futures) -> None:
    """Cancel what has not started and end the workers now (the runs in flight are lost, their last
    checkpoints kept)."""
    for f in futures:
        f.cancel()
    pool.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def _in_pool(work, tasks: list[tuple], jobs: int, desc: str, progress: bool, deadline_s: float | None = None):
    """``work(argument)`` for every (tag, argument) of ``tasks``, ``jobs`` at once in worker processes,
    yielding (tag, result) as each finishes. A worker's error is raised at once and, like any error of the
    caller's while it handles a result (use it under ``contextlib.closing``), ends the pool: what has not
    started is cancelled and the runs in flight are stopped. With ``deadline_s``, tasks not started within
    that many seconds are skipped."""
    pool = _Pool(jobs)
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


def run_datasets(
    datasets: list[Dataset],
    device: str = "cpu",
    jobs: int = 2,
    progress: bool = True,
    deadline_s: float | None = None,
    finished_only: bool = False,
    drop: Collection[str] = (),
) -> dict[Path, list[Profile]]:
    """Train and measure every run of every dataset, ``jobs`` at once, taking the datasets' runs in turn
    (one of each, then the next of each), so that a deadline leaves a part of every dataset. Every store's
    lock is held throughout; each store is rewritten after every finished run of it, atomically. With
    ``deadline_s``, runs not started within that many seconds are skipped. ``finished_only``: measure only
    the runs whose training has finished (config.json present), train nothing. ``drop``: runs taken out
    of the stores (by name; see :func:`plan_runs`). A dataset with ``sums`` has its root sealed
    (:func:`seal_root`) once all its runs are trained. Prints a line per store: what was written, or
    that nothing needed measuring. Returns each store's profiles exactly as the store holds them
    (:func:`store.as_stored`)."""
    check_inputs(datasets, device)
    with locks([Path(ds.store) for ds in datasets]):
        plan = plan_runs(datasets, finished_only, drop)
        return _execute(datasets, plan, device, jobs, progress, deadline_s)


def _execute(
    datasets: list[Dataset], plan: tuple, device: str, jobs: int, progress: bool, deadline_s: float | None = None
) -> dict[Path, list[Profile]]:
    """The runs of ``plan`` (:func:`plan_runs`) in the pool, each store rewritten as each of its runs finishes
    (the caller holds the stores' locks); then the roots sealed and a line printed per store."""
    held, curves, todo, written = plan
    work = partial(train_and_measure, device=device)
    with closing(_in_pool(work, todo, jobs, "runs", progress, deadline_s)) as results:
        for ds, (profiles, run_curves) in results:  # each run's store written as soon as it finishes
            new = as_stored(average_heads(profiles) if ds.average_heads else profiles, ds.dtype)
            held[ds.store], curves[ds.store] = replace_runs(held[ds.store], curves[ds.store], new, run_curves)
            save_profiles(ds.store, held[ds.store], ds.about, ds.dtype, curves[ds.store])
            written.add(ds.store)
    seal_roots(datasets)
    report([ds.store for ds in datasets], held, written, {ds.store for ds, _ in todo})
    return held


def train_specs(specs: list[RunSpec], device: str = "cpu", jobs: int = 2, progress: bool = True) -> None:
    """Train every spec (no measuring), ``jobs`` at once; finished runs are reused, interrupted ones
    resumed; a worker's error stops the rest at once."""
    with closing(
        _in_pool(partial(train_only, device=device), [(s, s) for s in specs], jobs, "train", progress)
    ) as done:
        for _ in done:
            pass


# ------------------------------------------------------------------------------------------ datasets


def reproduce(
    root: Path = CHECKPOINTS,
    store: Path = STORE,
    encodings: Iterable[str] = ENCODINGS,
    seeds: Collection[int] = SEEDS,
    device: str = "cpu",
    jobs: int = 2,
    progress: bool = True,
    drop: Collection[str] = (),
    **settings,
) -> list[Profile]:
    """The shipped experiment: train (or reuse finished runs in ``root``), measure, write the store and
    seal ``root`` (:func:`seal_root`); ``drop``: runs taken out of the store (:func:`run_datasets`);
    ``settings``: ``model``, ``training``, ``measure`` of :func:`.specs.default_dataset`."""
    dataset = default_dataset(root, store, encodings, seeds, **settings)
    return run_datasets([dataset], device, jobs, progress, drop=drop)[Path(store)]


def measure_checkpoints(
    root: Path = CHECKPOINTS,
    encodings: Iterable[str] = ENCODINGS,
    seeds: Collection[int] = SEEDS,
    progress: bool = True,
    **measure,
) -> list[Profile]:
    """Profiles of every shipped checkpoint under ``root``, after verifying SHA256SUMS (nothing trains): each
    checkpoint measured as :func:`measure_spec` measures a run, from the RunSpec its config.json records."""
    verify_checkpoints(root)
    profiles = []
    for e, s in tqdm([(e, s) for e in encodings for s in seeds], desc="measure", disable=not progress):
        spec, summary = checkpoint_spec(checkpoint_dir(e, s, root), {**MEASURE, **measure})
        profiles += measure_spec(spec, summary)[0]
    return profiles


def checkpoint_spec(run_dir: Path, measure: dict) -> tuple[RunSpec, dict]:
    """The RunSpec a finished checkpoint was trained from, read from its config.json (model, seed and
    training settings as recorded), with ``measure`` as its measuring settings; and that config.json."""
    path = Path(run_dir) / "config.json"
    summary = read_json(path)
    train_summary = summary["train"]
    training = {k: train_summary[k] for k in ("steps", "batch_tokens", "lr", "warmup", "weight_decay")}
    cfg = model_config(summary, path)
    return RunSpec(Path(run_dir).name, cfg, train_summary["seed"], Path(run_dir), training, measure=measure), summary


def run_family_v2(
    store: Path = FAMILY_V2_STORE,
    device: str = "cpu",
    jobs: int = 2,
    extra_seeds: bool = False,
    progress: bool = True,
    measure_only: bool = False,
    distributed: bool = False,
    drop: Collection[str] = (),
    runs_root: Path = FAMILY_V2_RUNS,
) -> list[Profile] | None:
    """The v2 family (plan v2): seed 0 of every setting, then :func:`reuse_shipped`, then seeds 1 and 2
    (and, with ``extra_seeds``, seeds 3 and 4 of the RoPE-base and xPos-B settings), each measured with
    the copy probe into ``store`` as it finishes; resumable; the store's lock held throughout, training
    included. ``measure_only``: measure the runs whose training has finished and train nothing (while
    another process trains the rest). ``drop``: runs taken out of the store (:func:`run_datasets`).
    ``distributed``: under torchrun, each rank takes its share (:func:`run_datasets_distributed`); ``jobs``
    is then unused, and the profiles are returned on rank 0 only (None elsewhere)."""
    store = Path(store)
    dataset = family_v2_dataset(store, SEEDS, device, runs_root, extra_seeds)
    first = (
        []
        if measure_only
        else [
            s
            for s in family_v2_dataset(store, (0,), device, runs_root).specs
            if s.extra["config"] in SHIPPED_AS and not (s.out_dir / "config.json").is_file()
        ]
    )  # the five seeds 0 that decide the reuse, trained before anything else
    if distributed:
        if drop:
            raise ValueError("--drop is for a plain run: drop the runs first without --distributed")
        return run_family_v2_distributed(dataset, first, device, progress, measure_only, runs_root)
    check_inputs([dataset], device)
    with files.exclusive(store):  # the whole command: a second one on this store is refused at once
        plan = plan_runs([dataset], measure_only, drop)
        if not measure_only:
            train_specs(first, device, jobs, progress)
            reuse_shipped(runs_root)
        return _execute([dataset], plan, device, jobs, progress)[store]


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
        verify_finished(runs_root / run)  # copied only as its own seal vouches for it
        for name in ("config.json", "model.safetensors"):
            data = (runs_root / run / name).read_bytes()
            atomic_write(root / run / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
    write_text_atomic(root / "SHA256SUMS", sha256sums(root))
