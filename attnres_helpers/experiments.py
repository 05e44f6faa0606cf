"""The shipped experiment: which models are trained, how they are measured, where the files go.

``reproduce()`` trains every encoding at the default configuration for every seed into
``data/checkpoints/<encoding>-s<seed>/`` (fp16 safetensors + config.json), measures each
one at L, 2L and 4L with and without BCA, and writes the tidy records to
``data/results/measurements.json`` and the checkpoints' sha256 to
``data/checkpoints/SHA256SUMS``. ``measure_checkpoints()`` re-measures the shipped files;
with the same settings it gives the same records (the notebooks check this).

    python -m attnres_helpers reproduce        # ~15 minutes on 2 CPU cores
    python -m attnres_helpers measure --json   # the shipped checkpoints, measured again
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .data import load_splits
from .files import write_text_atomic
from .measure import measure_model
from .model import ENCODINGS, ModelConfig, preset
from .train import load_checkpoint, train

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ROOT / "data" / "checkpoints"
RESULTS = ROOT / "data" / "results" / "measurements.json"

# The default configuration, chosen by the sweep in scripts/sweep.py (data/sweep/SUMMARY.md): the
# "default" model preset (L = 64, 2 layers, width 128, 4 heads) trained as below.
MODEL: dict = {}  # overrides of the preset (none for the shipped run)
TRAINING = {"steps": 400, "batch_tokens": 4096, "lr": 2e-3, "warmup": 40}
SEEDS = (0, 1, 2)
MEASURE = {"multiples": (1, 2, 4), "n_windows": 32}
REPRODUCE_COMMAND = "python -m attnres_helpers reproduce"


def checkpoint_dir(encoding: str, seed: int, root: Path = CHECKPOINTS) -> Path:
    return Path(root) / f"{encoding}-s{seed}"


def sha256sums(root: Path = CHECKPOINTS) -> str:
    """``sha256  relative/path`` lines for every shipped checkpoint file, sorted."""
    lines = []
    for path in sorted(Path(root).glob("*/*")):
        if path.suffix in (".safetensors", ".json"):
            lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(root)}")
    return "\n".join(lines) + "\n"


def model_config(encoding: str, **overrides) -> ModelConfig:
    """The default configuration for ``encoding``, with some model fields changed."""
    return preset("default", encoding=encoding, **{**MODEL, **overrides})


def measure_runs(runs: list[tuple[Path, int, dict]], progress: bool = True, **measure) -> list[dict]:
    """Records of every ``(checkpoint dir, seed, extra keys)`` (attnres_helpers.measure.measure_model),
    each with its extra keys added, measured with MEASURE (or ``measure``'s overrides)."""
    settings = {**MEASURE, **measure}
    _, val_tokens = load_splits()
    records = []
    for run_dir, seed, extra in tqdm(runs, desc="measure", disable=not progress):
        model = load_checkpoint(run_dir)
        records += [{**extra, **r} for r in measure_model(model, val_tokens, seed=seed, **settings)]
    return records


def measure_checkpoints(root: Path = CHECKPOINTS, encodings=ENCODINGS, seeds=SEEDS, progress: bool = True,
                        **measure) -> list[dict]:
    """Records of every checkpoint under ``root``."""
    return measure_runs([(checkpoint_dir(e, s, root), s, {}) for e in encodings for s in seeds], progress, **measure)


def train_one(cfg: ModelConfig, seed: int, out_dir: Path, device: str = "cpu", threads: int = 1,
              progress: bool = False) -> float:
    """Train (or reuse the finished run in ``out_dir``) with TRAINING; returns the training wall time (s)."""
    torch.set_num_threads(threads)
    _, summary = train(cfg, seed=seed, out_dir=out_dir, checkpoint_every=100, device=device, progress=progress,
                       **TRAINING)
    return summary["results"]["wall_s"]


def train_all(runs: list[tuple[ModelConfig, int, Path]], device: str = "cpu", jobs: int = 2,
              progress: bool = True) -> None:
    """Train every ``(cfg, seed, out_dir)``, ``jobs`` at once with one torch thread each (on 2 busy
    cores that is far faster than one model on 2 threads). Finished runs are reused and an
    interrupted run resumes from its last checkpoint, so this can be stopped and started again."""
    if jobs <= 1 or device != "cpu":
        for cfg, seed, out_dir in tqdm(runs, desc="train", disable=not progress):
            train_one(cfg, seed, out_dir, device, threads=torch.get_num_threads(), progress=progress)
        return
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(train_one, cfg, seed, out_dir, device) for cfg, seed, out_dir in runs]
        for future in tqdm(as_completed(futures), total=len(futures), desc="train", disable=not progress):
            future.result()


def reproduce(root: Path = CHECKPOINTS, results: Path = RESULTS, encodings=ENCODINGS, seeds=SEEDS,
              device: str = "cpu", jobs: int = 2, progress: bool = True) -> list[dict]:
    """Train (or reuse finished runs in ``root``), measure, and write the shipped results."""
    train_all([(model_config(e), s, checkpoint_dir(e, s, root)) for e in encodings for s in seeds],
              device, jobs, progress)
    records = measure_checkpoints(root, encodings, seeds, progress=progress)
    write_text_atomic(Path(results), json.dumps({"command": REPRODUCE_COMMAND, "measure": MEASURE,
                                                 "records": records}, indent=1))
    write_text_atomic(Path(root) / "SHA256SUMS", sha256sums(root))
    return records


# The family for "does resolution predict extrapolation?" (notebook 05): a label, an encoding and
# model fields changed from the default configuration. Entries equal to a shipped model reuse its
# checkpoint; the others train into runs/family/. BCA on and off is a second axis, at evaluation.
FAMILY = {
    "rope base 100": ("rope", {"rope_base": 100.0}),
    "rope base 1000": ("rope", {"rope_base": 1000.0}),
    "rope base 10000": ("rope", {}),
    "xpos B 512": ("xpos", {}),
    "xpos B 32": ("xpos", {"xpos_scale_base": 32.0}),  # B = L/2, the paper's ratio of B to L
    "xpos B 32, gamma 0.1": ("xpos", {"xpos_scale_base": 32.0, "xpos_gamma": 0.1}),
    "alibi slopes x0.5": ("alibi", {"alibi_slope_scale": 0.5}),
    "alibi slopes x1": ("alibi", {}),
    "alibi slopes x2": ("alibi", {"alibi_slope_scale": 2.0}),
    "sinusoidal": ("sinusoidal", {}),
    "nope": ("nope", {}),
}
FAMILY_RUNS = ROOT / "runs" / "family"
FAMILY_RESULTS = ROOT / "data" / "results" / "family.json"
FAMILY_COMMAND = "python -m attnres_helpers family"


def family_run_dir(label: str, seed: int) -> Path:
    """Where a family member's checkpoint lives: the shipped one when it is a default model."""
    encoding, overrides = FAMILY[label]
    if not overrides:
        return checkpoint_dir(encoding, seed)
    slug = "".join(c if c.isalnum() else "-" for c in label).strip("-")
    return FAMILY_RUNS / f"{slug}-s{seed}"


def run_family(results: Path = FAMILY_RESULTS, seeds=SEEDS, device: str = "cpu", jobs: int = 2,
               progress: bool = True) -> list[dict]:
    """Train (or reuse) every family member for every seed, measure it, write the records.

    Each record is a measure_model record plus ``config`` (the label) and ``params`` (the
    changed model fields). Stopped midway, it resumes where it stopped.
    """
    runs = [(model_config(FAMILY[label][0], **FAMILY[label][1]), seed, family_run_dir(label, seed))
            for label in FAMILY for seed in seeds]
    train_all(runs, device, jobs, progress)
    records = measure_runs([(family_run_dir(label, seed), seed, {"config": label, "params": FAMILY[label][1]})
                            for label in FAMILY for seed in seeds], progress)
    write_text_atomic(Path(results), json.dumps({"command": FAMILY_COMMAND, "measure": MEASURE,
                                                 "training": TRAINING, "records": records}, indent=1))
    return records


def load_results(path: Path = RESULTS) -> list[dict]:
    """The shipped records (a clear error if the file is missing or malformed)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; regenerate it with `{REPRODUCE_COMMAND}`")
    try:
        return json.loads(path.read_text())["records"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a results file ({err}); regenerate it with `{REPRODUCE_COMMAND}`") from err
