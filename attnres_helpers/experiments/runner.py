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
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import files
from ..checkpoints import load_checkpoint, regenerate_command
from ..data import load_splits
from ..files import atomic_write, write_text_atomic
from ..measure import measure_model
from ..probe import copy_curve, copy_probes, gaps_for
from ..store import Profile, average_heads, load_curves, load_profiles, records, save_profiles
from ..train import train
from .specs import (
    CHECKPOINTS, ENCODINGS, FAMILY_V2_RUNS, FAMILY_V2_STORE, MEASURE, REPRODUCE_COMMAND, SEEDS, SHIPPED_AS, STORE,
    Dataset, RunSpec, checkpoint_dir, default_dataset, family_v2_dataset, run_meta, slug,
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
    return base == "state.json" or (base.startswith("state-") and base.endswith(".safetensors")) or (
        base.startswith(".") and ".tmp-" in base)


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
    _, summary = train(spec.cfg, seed=spec.seed, out_dir=spec.out_dir,
                       checkpoint_every=100 if device == "cpu" else 0, device=device, progress=progress,
                       **spec.training)
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


def train_and_measure(spec: RunSpec, device: str = "cpu", threads: int = 1) -> tuple[list[Profile], dict]:
    """A worker's job: train, then measure ``spec``; errors name the run."""
    torch.set_num_threads(threads)
    try:
        return measure_spec(spec, train_spec(spec, device), device)
    except Exception as err:
        raise RuntimeError(f"run {spec.name} ({spec.out_dir}): {type(err).__name__}: {err}") from None


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
    return ProcessPoolExecutor(max(1, jobs), mp_context=multiprocessing.get_context("spawn"),
                               initializer=_die_with_parent, initargs=(os.getpid(),))


def _stop(pool: ProcessPoolExecutor, futures) -> None:
    """Cancel what has not started and end the workers now (the runs in flight are lost, their last
    checkpoints kept)."""
    for f in futures:
        f.cancel()
    for process in list(getattr(pool, "_processes", {}).values()):  # no public API ends running workers
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def _kept(ds: Dataset) -> tuple[list[Profile], dict]:
    """The profiles and curves already in ``ds.store`` whose runs are wanted with the same metadata."""
    if not Path(ds.store).is_file():
        return [], {}
    wanted = {s.name: s.meta for s in ds.specs}
    old, curves = load_profiles(ds.store)[0], load_curves(ds.store)
    kept = [p for p in old if p.run in wanted and {k: p.meta.get(k) for k in wanted[p.run]} == wanted[p.run]]
    runs = {p.run for p in kept}
    return kept, {key: c for key, c in curves.items() if key[0] in runs}


def run_datasets(datasets: list[Dataset], device: str = "cpu", jobs: int = 2, progress: bool = True,
                 deadline_s: float | None = None, finished_only: bool = False) -> dict[Path, list[Profile]]:
    """Train and measure every run of every dataset, ``jobs`` at once, taking the datasets' runs in turn
    (one of each, then the next of each), so that a deadline leaves a part of every dataset. Each store
    is rewritten after every finished run of it, atomically, under its lock. With ``deadline_s``, runs not
    started within that many seconds are skipped. ``finished_only``: measure only the runs whose training
    has finished (config.json present), train nothing. A dataset with ``sums`` gets its SHA256SUMS
    rewritten once all its runs are trained."""
    stores = [Path(ds.store) for ds in datasets]
    if len(set(stores)) != len(stores):
        raise ValueError("two datasets write the same store")
    kept: dict[Path, list[Profile]] = {}
    curves: dict[Path, dict] = {}
    queues = []
    with _locks(stores):
        for ds in datasets:
            kept[ds.store], curves[ds.store] = _kept(ds)
            done = {p.run for p in kept[ds.store]}
            queues.append([(ds, s) for s in ds.specs if s.name not in done
                           and (not finished_only or (s.out_dir / "config.json").is_file())])
        todo = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
        start = time.monotonic()
        pool = _pool(jobs)
        futures = {pool.submit(train_and_measure, spec, device): ds for ds, spec in todo}
        bar = tqdm(total=len(futures), desc="runs", disable=not progress)
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)  # each run's store write at once
                for future in finished:
                    if future.cancelled():
                        continue
                    ds = futures[future]
                    profiles, run_curves = future.result()  # a worker's error is raised here, at once
                    kept[ds.store] += average_heads(profiles) if ds.average_heads else profiles
                    curves[ds.store].update(run_curves)
                    save_profiles(ds.store, kept[ds.store], ds.about, ds.dtype, curves[ds.store])
                    bar.update(1)
                if deadline_s is not None and time.monotonic() - start > deadline_s:
                    for f in pending:
                        f.cancel()
        except BaseException:
            _stop(pool, futures)
            raise
        finally:
            bar.close()
        pool.shutdown(wait=True)
    for ds in datasets:
        if ds.sums is not None and all((s.out_dir / "config.json").is_file() for s in ds.specs):
            write_text_atomic(ds.sums / "SHA256SUMS", sha256sums(ds.sums))
    return kept


class _locks:
    """Every store's lock held together (:func:`files.exclusive`)."""

    def __init__(self, paths):
        self.paths, self.held = paths, []

    def __enter__(self):
        try:
            for path in self.paths:
                context = files.exclusive(path)
                context.__enter__()
                self.held.append(context)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        while self.held:
            self.held.pop().__exit__(None, None, None)


def train_specs(specs: list[RunSpec], device: str = "cpu", jobs: int = 2, progress: bool = True) -> None:
    """Train every spec (no measuring), ``jobs`` at once; finished runs are reused, interrupted ones
    resumed; a worker's error stops the rest at once."""
    pool = _pool(jobs)
    futures = [pool.submit(_train_only, spec, device) for spec in specs]
    bar = tqdm(total=len(futures), desc="train", disable=not progress)
    try:
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                future.result()  # a worker's error is raised here, as soon as it happens
                bar.update(1)
    except BaseException:
        _stop(pool, futures)
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)


def _train_only(spec: RunSpec, device: str) -> None:
    torch.set_num_threads(1)
    try:
        train_spec(spec, device)
    except Exception as err:
        raise RuntimeError(f"run {spec.name} ({spec.out_dir}): {type(err).__name__}: {err}") from None


# ------------------------------------------------------------------------------------------ datasets

def reproduce(root: Path = CHECKPOINTS, store: Path = STORE, encodings=ENCODINGS, seeds=SEEDS,
              device: str = "cpu", jobs: int = 2, progress: bool = True, **settings) -> list[Profile]:
    """The shipped experiment: train (or reuse finished runs in ``root``), measure, write the store and
    ``root/SHA256SUMS``; ``settings``: ``model``, ``training``, ``measure`` of :func:`.specs.default_dataset`."""
    dataset = default_dataset(root, store, encodings, seeds, **settings)
    return run_datasets([dataset], device, jobs, progress)[Path(store)]


def measure_checkpoints(root: Path = CHECKPOINTS, encodings=ENCODINGS, seeds=SEEDS, progress: bool = True,
                        **measure) -> list[Profile]:
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
        reused[label] = retrained.read_bytes() == (checkpoint_dir(encoding, 0, shipped) / "model.safetensors").read_bytes()
        if not reused[label]:
            continue
        for seed in (1, 2):
            target = Path(runs_root) / f"{slug(label)}-s{seed}"
            for name in ("model.safetensors", "config.json"):  # model first: config.json marks a finished run
                data = (checkpoint_dir(encoding, seed, shipped) / name).read_bytes()
                atomic_write(target / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
    return reused


def run_family_v2(store: Path = FAMILY_V2_STORE, device: str = "cpu", jobs: int = 2, extra_seeds: bool = False,
                  progress: bool = True, measure_only: bool = False) -> list[Profile]:
    """The v2 family (plan v2): seed 0 of every setting, then :func:`reuse_shipped`, then seeds 1 and 2
    (and, with ``extra_seeds``, seeds 3 and 4 of the RoPE-base and xPos-B settings), each measured with
    the copy probe into ``store`` as it finishes; resumable. ``measure_only``: measure the runs whose
    training has finished and train nothing (while another process trains the rest)."""
    if measure_only:
        dataset = family_v2_dataset(store, SEEDS, device, extra_seeds=extra_seeds)
        return run_datasets([dataset], device, jobs, progress, finished_only=True)[Path(store)]
    first = [s for s in family_v2_dataset(store, (0,), device).specs
             if s.extra["config"] in SHIPPED_AS and not (s.out_dir / "config.json").is_file()]
    train_specs(first, device, jobs, progress)  # the five seeds 0 that decide the reuse, before anything else
    reuse_shipped(FAMILY_V2_RUNS)
    return run_datasets([family_v2_dataset(store, SEEDS, device, extra_seeds=extra_seeds)], device, jobs,
                        progress)[Path(store)]


def load_results(path: Path = STORE, boundary: str = "zero") -> list[dict]:
    """Records (:func:`attnres_helpers.store.records`) of a shipped store; a clear error if it is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; regenerate it with `{REPRODUCE_COMMAND}`")
    return records(load_profiles(path)[0], boundary, curves=load_curves(path) or None)


def ship_hf_checkpoints(runs_root: Path | None = None, root: Path | None = None, runs=None) -> None:
    """Copy the shipped HF runs' config.json and fp16 model into ``root`` and write its SHA256SUMS."""
    from .specs import HF_CHECKPOINTS, HF_RUNS, HF_SHIPPED

    runs_root, root, runs = Path(runs_root or HF_RUNS), Path(root or HF_CHECKPOINTS), runs or HF_SHIPPED
    for run in runs:
        for name in ("config.json", "model.safetensors"):
            data = (runs_root / run / name).read_bytes()
            atomic_write(root / run / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
    write_text_atomic(root / "SHA256SUMS", sha256sums(root))
