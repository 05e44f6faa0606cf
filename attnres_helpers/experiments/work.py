"""What the runner (:mod:`.runner`) and its torchrun form (:mod:`.distributed`) share: one run's work
(train a :class:`.specs.RunSpec`, measure its verified fp16 checkpoint, errors naming the run), a worker
that dies with its parent, and the plan over the stores (what each holds, what is still to do, the locks,
the seals, the line printed per store). Both import it; neither imports the other's private names.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Collection
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from .. import files
from ..checkpoints import load_checkpoint, seal_root, verify_checkpoints
from ..data import load_splits
from ..files import SUMS_FILE, atomic_write
from ..measure import check_measure, measure_model
from ..probe import copy_curve, copy_probes, gaps_for
from ..store import Profile, load_curves, load_profiles, save_profiles
from ..train import check_training, train
from .specs import CHECKPOINTS, FAMILY_V2_RUNS, MEASURE, SHIPPED_AS, Dataset, RunSpec, checkpoint_dir, slug

TRAINED_KEYS = ("train_loss", "val_loss", "wall_s", "tokens_per_s", "device")  # config.json results kept in a store


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


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
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


def load_store(path: Path) -> tuple[list[Profile], dict, dict]:
    """A store's profiles, copy curves and header (all empty where there is no file)."""
    if not Path(path).is_file():
        return [], {}, {}
    profiles, about = load_profiles(path)
    return profiles, load_curves(path), about


def replace_runs(profiles: list[Profile], curves: dict, new: list[Profile], new_curves: dict) -> tuple[list, dict]:
    """``profiles`` and ``curves`` with the runs of ``new`` replaced by them."""
    runs = {p.run for p in new}
    kept_curves = {key: c for key, c in curves.items() if key[0] not in runs}
    return [p for p in profiles if p.run not in runs] + new, {**kept_curves, **new_curves}


def check_inputs(datasets: list[Dataset], device: str) -> None:
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


def plan_runs(datasets: list[Dataset], finished_only: bool, drop: Collection[str] = (), say: bool = True) -> tuple:
    """(held, curves, todo, written): what each store holds, every run in it but those in ``drop`` (a name
    no store holds is an error), the runs still to do, the datasets' runs in turn, and the stores written
    here. A store that loses a dropped run is written now, after a line naming each; a line names the
    runs a store keeps as they are although its dataset does not list them (``say``: print the lines)."""
    loaded = {ds.store: load_store(ds.store) for ds in datasets}
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


def report(stores: list[Path], held: dict, written: set, asked: set) -> None:
    """One line per store: what was written to it, or why nothing was."""
    for store in stores:
        if store in written:
            print(f"{len(held[store])} profiles written to {store}")
        elif store in asked:
            print(f"nothing written to {store}: none of its runs started before the deadline")
        else:
            print(f"nothing needed measuring: {store} already holds every run asked for; nothing written")


def seal_roots(datasets: list[Dataset]) -> None:
    """:func:`seal_root` of each dataset's ``sums`` once all its runs are trained."""
    for ds in datasets:
        if ds.sums is not None and all((s.out_dir / "config.json").is_file() for s in ds.specs):
            seal_root(ds.sums)


@contextmanager
def locks(paths):
    """Every store's lock held together (:func:`files.exclusive`), released in reverse order."""
    with ExitStack() as held:
        for path in paths:
            held.enter_context(files.exclusive(path))
        yield


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
