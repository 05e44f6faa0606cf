"""The one train-and-measure path: every :class:`.specs.Dataset` runs through :func:`run_datasets`.

Each run trains in a worker process (one torch thread each: on 2 busy cores, two models at once are far
faster than one on two threads), reusing a finished run and resuming an interrupted one from its last
checkpoint; then the worker measures the verified fp16 checkpoint (:func:`measure_spec`: ŝ, key-0
scores and per-position NLL at k·L with and without BCA, and the copy probe where the spec asks). The
parent rewrites the dataset's store after every finished run, atomically, holding its lock.

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
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Collection, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import ExitStack, closing, contextmanager
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import files
from ..checkpoints import (
    load_checkpoint,
    model_config,
    read_json,
    seal_root,
    sha256sums,
    verify_checkpoints,
    verify_finished,
)
from ..data import load_splits
from ..files import SUMS_FILE, atomic_write, write_text_atomic
from ..measure import check_measure, measure_model
from ..probe import copy_curve, copy_probes, gaps_for
from ..store import Profile, as_stored, average_heads, load_curves, load_profiles, records, save_profiles
from ..train import check_training, train
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
    slug,
)

TRAINED_KEYS = ("train_loss", "val_loss", "wall_s", "tokens_per_s", "device")  # config.json results kept in a store


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
    ``measure`` (multiples, n_windows) and ``trained``: the final losses, wall time and tokens/s."""
    _, val_tokens = load_splits()
    model = load_checkpoint(spec.out_dir).to(device)
    meta = {**spec.stored_meta, "trained": {k: summary["results"][k] for k in TRAINED_KEYS}}
    profiles = measure_model(model, val_tokens.to(device), spec.name, meta, **{**MEASURE, **spec.measure})
    curves = {}
    if spec.probe:
        gaps = gaps_for(spec.cfg.train_len)
        probes = copy_probes(val_tokens, max_gap=max(gaps))
        for bca in (False, True) if model.supports_bca else (False,):
            curves[(spec.name, bca)] = copy_curve(model, probes, gaps, bca)
    return profiles, curves


@contextmanager
def _naming_the_run(spec: RunSpec):
    """A worker's error, as one RuntimeError naming the run."""
    try:
        yield
    except Exception as err:
        raise RuntimeError(f"run {spec.name} ({spec.out_dir}): {type(err).__name__}: {err}") from None


def train_and_measure(spec: RunSpec, device: str = "cpu", threads: int = 1) -> tuple[list[Profile], dict]:
    """A worker's job: train, then measure ``spec``; errors name the run."""
    torch.set_num_threads(threads)
    with _naming_the_run(spec):
        return measure_spec(spec, train_spec(spec, device), device)


def train_only(spec: RunSpec, device: str = "cpu", threads: int = 1) -> None:
    """A worker's job: train ``spec`` (no measuring); errors name the run."""
    torch.set_num_threads(threads)
    with _naming_the_run(spec):
        train_spec(spec, device)


# ------------------------------------------------------------------------------------------ the pool

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Exit when the parent process does (Linux's parent-death signal, and a watchdog thread for the rest),
    so a killed command leaves no worker behind."""
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


def _start_worker(parent: int, pids) -> None:
    """A pool worker's initializer: report this worker's pid (so :meth:`_Pool.terminate` can end it) and
    die with the parent."""
    pids.put(os.getpid())
    _die_with_parent(parent)


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


def _load(path: Path) -> tuple[list[Profile], dict, dict]:
    """A store's profiles, copy curves and header (all empty where there is no file)."""
    if not Path(path).is_file():
        return [], {}, {}
    profiles, about = load_profiles(path)
    return profiles, load_curves(path), about


def _replace(profiles: list[Profile], curves: dict, new: list[Profile], new_curves: dict) -> tuple[list, dict]:
    """``profiles`` and ``curves`` with the runs of ``new`` replaced by them."""
    runs = {p.run for p in new}
    kept_curves = {key: c for key, c in curves.items() if key[0] not in runs}
    return [p for p in profiles if p.run not in runs] + new, {**kept_curves, **new_curves}


def _check_inputs(datasets: list[Dataset], device: str) -> None:
    """Every input, before any work: one store per dataset, each a file path; the device; each run's
    training and measuring settings (an error names the run)."""
    stores = [Path(ds.store) for ds in datasets]
    if len(set(stores)) != len(stores):
        raise ValueError("two datasets write the same store")
    for ds in datasets:
        if Path(ds.store).exists() and not Path(ds.store).is_file():
            raise ValueError(f"store {ds.store} is a folder (or another non-file): give the path of a store file")
        for spec in ds.specs:
            with _naming_the_run(spec):
                check_training(spec.cfg, spec.seed, device, **spec.training)
                check_measure(**{**MEASURE, **spec.measure})


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
    of the stores (by name; see :func:`_plan`). A dataset with ``sums`` has its root sealed
    (:func:`seal_root`) once all its runs are trained. Prints a line per store: what was written, or
    that nothing needed measuring. Returns each store's profiles exactly as the store holds them
    (:func:`store.as_stored`)."""
    _check_inputs(datasets, device)
    with _locks([Path(ds.store) for ds in datasets]):
        plan = _plan(datasets, finished_only, drop)
        return _execute(datasets, plan, device, jobs, progress, deadline_s)


def _plan(datasets: list[Dataset], finished_only: bool, drop: Collection[str] = (), say: bool = True) -> tuple:
    """(held, curves, todo, written): what each store holds, every run in it but those in ``drop`` (a name
    no store holds is an error), the runs still to do, the datasets' runs in turn, and the stores written
    here. A store that loses a dropped run is written now, after a line naming each; a line names the
    runs a store keeps as they are although its dataset does not list them (``say``: print the lines)."""
    loaded = {ds.store: _load(ds.store) for ds in datasets}
    unknown = sorted(set(drop) - {p.run for profiles, _, _ in loaded.values() for p in profiles})
    if unknown:
        raise ValueError(f"--drop {unknown[0]}: no run of that name in {', '.join(map(str, loaded))}")
    held, curves, queues, written = {}, {}, [], set()
    for ds in datasets:
        profiles, stored_curves, about = loaded[ds.store]
        runs, listed = sorted({p.run for p in profiles}), {s.name for s in ds.specs}
        unlisted = [run for run in runs if run not in listed and run not in drop]
        if unlisted and say:
            print(
                f"{ds.store} keeps, as they are, the runs its dataset does not list: {', '.join(unlisted)} (--drop RUN)"
            )
        held[ds.store] = [p for p in profiles if p.run not in drop]
        curves[ds.store] = {key: c for key, c in stored_curves.items() if key[0] not in drop}
        dropped = [run for run in runs if run in drop]
        for run in dropped if say else ():
            print(f"{ds.store}: dropping run {run} (--drop)")
        if dropped:  # said first, then written
            save_profiles(ds.store, held[ds.store], ds.about, ds.dtype, curves[ds.store])
            written.add(ds.store)
        current = ds.current(held[ds.store], curves[ds.store], about)
        ready = [s for s in ds.specs if not finished_only or (s.out_dir / "config.json").is_file()]
        queues.append([(ds, s) for s in ready if s.name not in current])
    todo = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    return held, curves, todo, written


def _execute(
    datasets: list[Dataset], plan: tuple, device: str, jobs: int, progress: bool, deadline_s: float | None = None
) -> dict[Path, list[Profile]]:
    """The runs of ``plan`` (:func:`_plan`) in the pool, each store rewritten as each of its runs finishes
    (the caller holds the stores' locks); then the roots sealed and a line printed per store."""
    held, curves, todo, written = plan
    work = partial(train_and_measure, device=device)
    with closing(_in_pool(work, todo, jobs, "runs", progress, deadline_s)) as results:
        for ds, (profiles, run_curves) in results:  # each run's store written as soon as it finishes
            new = as_stored(average_heads(profiles) if ds.average_heads else profiles, ds.dtype)
            held[ds.store], curves[ds.store] = _replace(held[ds.store], curves[ds.store], new, run_curves)
            save_profiles(ds.store, held[ds.store], ds.about, ds.dtype, curves[ds.store])
            written.add(ds.store)
    _seal_roots(datasets)
    _report([ds.store for ds in datasets], held, written, {ds.store for ds, _ in todo})
    return held


def _report(stores: list[Path], held: dict, written: set, asked: set) -> None:
    """One line per store: what was written to it, or why nothing was."""
    for store in stores:
        if store in written:
            print(f"{len(held[store])} profiles written to {store}")
        elif store in asked:
            print(f"nothing written to {store}: none of its runs started before the deadline")
        else:
            print(f"nothing needed measuring: {store} already holds every run asked for; nothing written")


def _seal_roots(datasets: list[Dataset]) -> None:
    """:func:`seal_root` of each dataset's ``sums`` once all its runs are trained."""
    for ds in datasets:
        if ds.sums is not None and all((s.out_dir / "config.json").is_file() for s in ds.specs):
            seal_root(ds.sums)


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


def reuse_shipped(runs_root: Path = FAMILY_V2_RUNS, shipped: Path = CHECKPOINTS) -> dict[str, bool]:
    """For each setting of SHIPPED_AS whose seed 0 has been trained in ``runs_root``: True (and seeds 1, 2
    copied in from ``shipped``, after verifying its SHA256SUMS) where that seed 0's model.safetensors
    equals the shipped seed 0 byte for byte; False where it differs (those seeds are then trained). A copied
    run keeps its own seal: model first, then SHA256SUMS, then config.json, which marks it finished."""
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
            for name in ("model.safetensors", SUMS_FILE, "config.json"):
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
        from .distributed import run_family_v2_distributed

        return run_family_v2_distributed(dataset, first, device, progress, measure_only, runs_root)
    _check_inputs([dataset], device)
    with files.exclusive(store):  # the whole command: a second one on this store is refused at once
        plan = _plan([dataset], measure_only, drop)
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
