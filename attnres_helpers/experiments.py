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
import multiprocessing
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .data import load_splits
from .measure import measure_model
from .model import ENCODINGS, preset
from .train import load_checkpoint, train

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ROOT / "data" / "checkpoints"
RESULTS = ROOT / "data" / "results" / "measurements.json"

# The default configuration, chosen by the sweep in scripts/sweep.py (data/sweep/).
MODEL = {"train_len": 64}
TRAINING = {"steps": 400, "batch_tokens": 4096, "lr": 2e-3, "warmup": 40}
SEEDS = (0, 1, 2)
MEASURE = {"multiples": (1, 2, 4), "n_windows": 32}
REPRODUCE_COMMAND = "python -m attnres_helpers reproduce"


def checkpoint_dir(encoding: str, seed: int, root: Path = CHECKPOINTS) -> Path:
    return Path(root) / f"{encoding}-s{seed}"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def sha256sums(root: Path = CHECKPOINTS) -> str:
    """``sha256  relative/path`` lines for every shipped checkpoint file, sorted."""
    lines = []
    for path in sorted(Path(root).glob("*/*")):
        if path.suffix in (".safetensors", ".json"):
            lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(root)}")
    return "\n".join(lines) + "\n"


def measure_checkpoints(root: Path = CHECKPOINTS, encodings=ENCODINGS, seeds=SEEDS, progress: bool = True,
                        **measure) -> list[dict]:
    """Records of every checkpoint under ``root`` (see attnres_helpers.measure.measure_model)."""
    settings = {**MEASURE, **measure}
    _, val_tokens = load_splits()
    jobs = [(e, s) for e in encodings for s in seeds]
    records = []
    for encoding, seed in tqdm(jobs, desc="measure", disable=not progress):
        model = load_checkpoint(checkpoint_dir(encoding, seed, root))
        records += measure_model(model, val_tokens, seed=seed, **settings)
    return records


def train_one(encoding: str, seed: int, root: Path = CHECKPOINTS, device: str = "cpu", threads: int = 1,
              progress: bool = False) -> float:
    """Train (or reuse) one default-configuration model; returns its training wall time in seconds."""
    torch.set_num_threads(threads)
    cfg = preset("default", encoding=encoding, **MODEL)
    _, summary = train(cfg, seed=seed, out_dir=checkpoint_dir(encoding, seed, root), checkpoint_every=100,
                       device=device, progress=progress, **TRAINING)
    return summary["results"]["wall_s"]


def reproduce(root: Path = CHECKPOINTS, results: Path = RESULTS, encodings=ENCODINGS, seeds=SEEDS,
              device: str = "cpu", jobs: int = 2, progress: bool = True) -> list[dict]:
    """Train (or reuse finished runs in ``root``), measure, and write the shipped results.

    ``jobs`` models train at once, one torch thread each (on 2 busy cores that is far
    faster than one model on 2 threads); an interrupted run resumes from its checkpoints.
    """
    todo = [(e, s) for e in encodings for s in seeds]
    if jobs <= 1 or device != "cpu":
        for encoding, seed in tqdm(todo, desc="train", disable=not progress):
            train_one(encoding, seed, root, device, threads=torch.get_num_threads(), progress=progress)
    else:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(train_one, e, s, root, device) for e, s in todo]
            for future in tqdm(as_completed(futures), total=len(futures), desc="train", disable=not progress):
                future.result()
    records = measure_checkpoints(root, encodings, seeds, progress=progress)
    _write_atomic(Path(results), json.dumps({"command": REPRODUCE_COMMAND, "measure": MEASURE,
                                             "records": records}, indent=1))
    _write_atomic(Path(root) / "SHA256SUMS", sha256sums(root))
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
