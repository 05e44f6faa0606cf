"""The shipped experiment: which models are trained, how they are measured, where the files go.

``reproduce()`` trains every encoding at the default configuration for every seed into
``data/checkpoints/<encoding>-s<seed>/`` (fp16 safetensors + config.json), writes their sha256 to
``data/checkpoints/SHA256SUMS``, measures each one at L, 2L and 4L with and without BCA, and stores
the profiles (ŝ and per-position NLL, :mod:`attnres_helpers.store`) in ``data/results/default.safetensors``.
``measure_checkpoints()`` verifies the shipped files against SHA256SUMS and measures them again; with
the same settings it gives the same profiles. Records (R, perplexities) are queries over a store.

    python -m attnres_helpers reproduce        # trains 15 models on 2 CPU cores (README: wall time)
    python -m attnres_helpers measure --json   # the shipped checkpoints, verified and measured again
    python -m attnres_helpers results --json   # records from the stored profiles, no model loaded
"""

from __future__ import annotations

import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .data import load_splits
from . import files
from .files import atomic_write, write_text_atomic
from .measure import measure_model
from .metric import Boundary
from .model import ModelConfig, preset
from .store import Profile, load_profiles, records, save_profiles
from .train import load_checkpoint, train

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
CHECKPOINTS = DATA / "checkpoints"
STORE = DATA / "results" / "default.safetensors"

# The default configuration, chosen by the sweep (data/sweep/SUMMARY.md): the "default" model preset
# (4 layers, L = 128, width 128, 4 heads, xPos B = L/2) trained as below.
MODEL: dict = {}  # overrides of the preset (none for the shipped run)
TRAINING = {"steps": 1600, "batch_tokens": 4096, "lr": 2e-3, "warmup": 100}
SEEDS = (0, 1, 2)
ENCODINGS = ("sinusoidal", "rope", "xpos", "alibi", "nope")  # the shipped experiment (T5 and KERPLE: the v2 family)
MEASURE = {"multiples": (1, 2, 4), "n_windows": 32}
REPRODUCE_COMMAND = "python -m attnres_helpers reproduce"


def data_path(*parts: str) -> Path:
    """A path inside the shipped data/ folder (the one place paths to shipped files are resolved)."""
    return DATA.joinpath(*parts)


def checkpoint_dir(encoding: str, seed: int, root: Path = CHECKPOINTS) -> Path:
    return Path(root) / f"{encoding}-s{seed}"


def sha256sums(root: Path = CHECKPOINTS) -> str:
    """``sha256  relative/path`` lines for every file under ``root`` but SHA256SUMS, sorted."""
    return files.sha256sums(root)


def verify_checkpoints(root: Path = CHECKPOINTS, fix: str = REPRODUCE_COMMAND) -> None:
    """Check every file under ``root`` against ``root/SHA256SUMS`` (:func:`files.verify_sha256sums`): a
    file that is missing, unlisted or changed raises a ValueError naming it (a tampered config.json or
    weight byte is caught before any model is built); ``fix`` is the command that regenerates ``root``."""
    files.verify_sha256sums(root, fix)


def model_config(encoding: str, **overrides) -> ModelConfig:
    """The default configuration for ``encoding``, with some model fields changed."""
    return preset("default", encoding=encoding, **{**MODEL, **overrides})


def run_meta(cfg: ModelConfig, seed: int, training: dict, **extra) -> dict:
    """A run's metadata, stored beside its profiles: encoding, seed, train_len, the model config,
    the training settings, and any extra keys (a family label, its changed parameters, the device)."""
    return {"encoding": cfg.encoding, "seed": seed, "train_len": cfg.train_len, "model": cfg.to_dict(),
            "training": dict(training), **extra}


def measure_run(run: str, run_dir: Path, meta: dict, device: str = "cpu", **measure) -> list[Profile]:
    """Profiles of the checkpoint in ``run_dir`` (its fp16 weights, as shipped), measured with MEASURE."""
    _, val_tokens = load_splits()
    model = load_checkpoint(run_dir).to(device)
    return measure_model(model, val_tokens.to(device), run, meta, **{**MEASURE, **measure})


def measure_checkpoints(root: Path = CHECKPOINTS, encodings=ENCODINGS, seeds=SEEDS, progress: bool = True,
                        **measure) -> list[Profile]:
    """Profiles of every shipped checkpoint under ``root``, after verifying SHA256SUMS."""
    verify_checkpoints(root)
    profiles = []
    for e, s in tqdm([(e, s) for e in encodings for s in seeds], desc="measure", disable=not progress):
        run_dir = checkpoint_dir(e, s, root)
        config = json.loads((run_dir / "config.json").read_text())  # checked by verify_checkpoints
        meta = run_meta(ModelConfig.from_dict(config["model"]), s, config["train"])
        profiles += measure_run(run_dir.name, run_dir, meta, **measure)
    return profiles


def _train_run(cfg: ModelConfig, seed: int, out_dir: Path, device: str, threads: int, progress: bool,
               training: dict) -> dict:
    """Train (or reuse the finished run in ``out_dir``) on ``threads`` torch threads, checkpointing
    every 100 steps on a CPU; returns the run's results (config.json's "results")."""
    torch.set_num_threads(threads)
    _, summary = train(cfg, seed=seed, out_dir=out_dir, checkpoint_every=100 if device == "cpu" else 0,
                       device=device, progress=progress, **training)
    return summary["results"]


def train_one(cfg: ModelConfig, seed: int, out_dir: Path, device: str = "cpu", threads: int = 1,
              progress: bool = False, training: dict | None = None) -> float:
    """Train (or reuse the finished run in ``out_dir``) with ``training`` (None: TRAINING as it is now);
    returns the training wall time (s)."""
    return _train_run(cfg, seed, out_dir, device, threads, progress, TRAINING if training is None else training)["wall_s"]


def train_all(runs: list[tuple[ModelConfig, int, Path]], device: str = "cpu", jobs: int = 2,
              progress: bool = True) -> None:
    """Train every ``(cfg, seed, out_dir)`` with TRAINING, ``jobs`` at once with one torch thread each
    (on 2 busy cores that is far faster than one model on 2 threads). Finished runs are reused and an
    interrupted run resumes from its last checkpoint, so this can be stopped and started again."""
    if jobs <= 1:
        for cfg, seed, out_dir in tqdm(runs, desc="train", disable=not progress):
            train_one(cfg, seed, out_dir, device, threads=torch.get_num_threads(), progress=progress)
        return
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(train_one, cfg, seed, out_dir, device) for cfg, seed, out_dir in runs]
        for future in tqdm(as_completed(futures), total=len(futures), desc="train", disable=not progress):
            future.result()


def reproduce(root: Path = CHECKPOINTS, store: Path = STORE, encodings=ENCODINGS, seeds=SEEDS,
              device: str = "cpu", jobs: int = 2, progress: bool = True) -> list[Profile]:
    """Train (or reuse finished runs in ``root``), write SHA256SUMS, measure, write the store."""
    train_all([(model_config(e), s, checkpoint_dir(e, s, root)) for e in encodings for s in seeds],
              device, jobs, progress)
    write_text_atomic(Path(root) / "SHA256SUMS", sha256sums(root))
    profiles = measure_checkpoints(root, encodings, seeds, progress=progress)
    save_profiles(store, profiles, {"command": REPRODUCE_COMMAND, "measure": MEASURE, "training": TRAINING})
    return profiles


@dataclass(frozen=True)
class RunSpec:
    """One model of a dataset: its name in the store, config, seed, where it trains, and extra metadata."""

    name: str
    cfg: ModelConfig
    seed: int
    out_dir: Path
    training: dict = field(default_factory=lambda: dict(TRAINING))
    extra: dict = field(default_factory=dict)
    measure: dict = field(default_factory=lambda: dict(MEASURE))

    @property
    def meta(self) -> dict:
        return run_meta(self.cfg, self.seed, self.training, **self.extra)


def train_and_measure(spec: RunSpec, device: str = "cpu", threads: int = 1) -> list[Profile]:
    """Train ``spec`` (reusing or resuming what its out_dir holds), then measure its fp16 checkpoint.
    The profiles' metadata gains ``trained``: the final losses, wall time and tokens/s."""
    results = _train_run(spec.cfg, spec.seed, spec.out_dir, device, threads, False, spec.training)
    trained = {k: results[k] for k in ("train_loss", "val_loss", "wall_s", "tokens_per_s", "device")}
    return measure_run(spec.name, spec.out_dir, {**spec.meta, "trained": trained}, device, **spec.measure)


@dataclass(frozen=True)
class Dataset:
    """Runs whose profiles go into one store, with how they were made (``about``) and the stored dtype."""

    store: Path
    specs: list[RunSpec]
    about: dict
    dtype: torch.dtype = torch.float32


def run_datasets(datasets: list[Dataset], device: str = "cpu", jobs: int = 2, progress: bool = True,
                 deadline_s: float | None = None) -> dict[Path, list[Profile]]:
    """Train and measure every run of every dataset, ``jobs`` at once, taking the datasets' runs in
    turn (one of each, then the next of each), so that a deadline leaves a part of every dataset.
    Each store is rewritten after every finished run of it, atomically: a stopped run loses only the
    models in flight.

    Runs already in a store with the same metadata are kept, not re-run. With ``deadline_s``, runs not
    started within that many seconds are skipped, and what finished is kept.
    """
    kept: dict[Path, list[Profile]] = {}
    queues: list[list[tuple[Dataset, RunSpec]]] = []
    for ds in datasets:
        wanted = {s.name: s.meta for s in ds.specs}
        old = load_profiles(ds.store)[0] if Path(ds.store).is_file() else []
        kept[ds.store] = [p for p in old if p.run in wanted and
                          {k: p.meta.get(k) for k in wanted[p.run]} == wanted[p.run]]
        done = {p.run for p in kept[ds.store]}
        queues.append([(ds, s) for s in ds.specs if s.name not in done])
    todo = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    start = time.monotonic()
    with ProcessPoolExecutor(max(1, jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(train_and_measure, spec, device): ds for ds, spec in todo}
        for future in tqdm(as_completed(futures), total=len(futures), desc="runs", disable=not progress):
            if future.cancelled():
                continue
            ds = futures[future]
            kept[ds.store] += future.result()
            save_profiles(ds.store, kept[ds.store], ds.about, ds.dtype)
            if deadline_s is not None and time.monotonic() - start > deadline_s:
                for f in futures:
                    f.cancel()
    return kept


# The family for "does resolution predict extrapolation?" (notebook 05; analysis plan in
# data/results/family_plan.md, committed before these were trained): a label, an encoding and model
# fields changed from the default configuration. Every member trains into runs/family/ (none reuses a
# shipped checkpoint, so the whole family comes from one device). BCA on and off is a second axis, at
# evaluation. L = 128, so xPos B runs from L/8 to 8L. The family trains a quarter of the default's
# steps (FAMILY_TRAINING): 63 models at 1600 steps would take about 6 hours on 2 CPU cores.
FAMILY = {
    **{f"rope base {b:g}": ("rope", {"rope_base": float(b)}) for b in (100, 300, 1000, 3000, 10000, 100000)},
    **{f"xpos B {b}": ("xpos", {"xpos_scale_base": float(b)}) for b in (16, 32, 64, 128, 256, 1024)},
    "xpos B 64, gamma 0.1": ("xpos", {"xpos_scale_base": 64.0, "xpos_gamma": 0.1}),
    "xpos B 64, gamma 1.6": ("xpos", {"xpos_scale_base": 64.0, "xpos_gamma": 1.6}),
    **{f"alibi slopes x{m:g}": ("alibi", {"alibi_slope_scale": float(m)}) for m in (0.25, 0.5, 1, 2, 4)},
    "sinusoidal": ("sinusoidal", {}),
    "nope": ("nope", {}),
}
FAMILY_TRAINING = {**TRAINING, "steps": 400, "warmup": 40}
FAMILY_RUNS = ROOT / "runs" / "family"
FAMILY_STORE = DATA / "results" / "family.safetensors"
FAMILY_COMMAND = "python -m attnres_helpers family"


def slug(label: str) -> str:
    """A label as a file and run name: letters and digits, other characters as '-'."""
    return "".join(c if c.isalnum() else "-" for c in label).strip("-")


def family_specs(seeds=SEEDS, runs_root: Path = FAMILY_RUNS, device: str = "cpu", family: dict = FAMILY,
                 training: dict = FAMILY_TRAINING) -> list[RunSpec]:
    """Every member of ``family`` for every seed, as RunSpecs (label and changed fields in the metadata),
    seed by seed: a run stopped early leaves whole seeds of every member, not whole members."""
    return [RunSpec(f"{slug(label)}-s{seed}", model_config(encoding, **params), seed,
                    Path(runs_root) / f"{slug(label)}-s{seed}", dict(training),
                    extra={"config": label, "params": params, "device": device})
            for seed in seeds for label, (encoding, params) in family.items()]


def run_family(store: Path = FAMILY_STORE, seeds=SEEDS, device: str = "cpu", jobs: int = 2,
               progress: bool = True) -> list[Profile]:
    """Train and measure every family member for every seed into ``store``; resumable."""
    return run_datasets([family_dataset(store, seeds, device)], device, jobs, progress)[Path(store)]


def family_dataset(store: Path = FAMILY_STORE, seeds=SEEDS, device: str = "cpu", runs_root: Path = FAMILY_RUNS) -> Dataset:
    """The family as a Dataset (stored in float16: 63 models × 6 profiles)."""
    about = {"command": FAMILY_COMMAND + (f" --device {device}" if device != "cpu" else ""), "measure": MEASURE,
             "training": FAMILY_TRAINING, "device": device, "plan": "data/results/family_plan.md"}
    return Dataset(Path(store), family_specs(seeds, runs_root, device), about, torch.float16)


# The v2 family (plan: data/results/family_plan_v2.md, committed before any of it was trained): v1's 21
# settings plus two learned relative biases, at the default's training (TRAINING, 1600 steps), where
# notebook 03's reversal holds. Five settings are exactly notebook 03's configuration (SHIPPED_AS): seed 0
# of each is trained again, and where it equals the shipped checkpoint byte for byte, seeds 1 and 2 are
# taken from data/checkpoints/ (verified) instead of being trained again.
FAMILY_V2 = {**FAMILY, "t5 bias": ("t5", {}), "kerple log": ("kerple", {})}
FAMILY_V2_RUNS = ROOT / "runs" / "family_v2"
FAMILY_V2_STORE = DATA / "results" / "family_v2.safetensors"
FAMILY_V2_COMMAND = "python -m attnres_helpers family-v2"
SHIPPED_AS = {"rope base 10000": "rope", "xpos B 64": "xpos", "alibi slopes x1": "alibi",
              "sinusoidal": "sinusoidal", "nope": "nope"}
EXTRA_SEEDS = (3, 4)  # of the RoPE-base and xPos-B settings, if time allows (a labelled secondary analysis)


def extra_seed_settings(family: dict = FAMILY_V2) -> list[str]:
    """The RoPE-base and xPos scale-base settings (γ at its default): those that get seeds 3 and 4."""
    return [label for label in family if label.startswith(("rope base", "xpos B")) and "gamma" not in label]


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


def train_family_v2(runs_root: Path = FAMILY_V2_RUNS, jobs: int = 2, extra_seeds: bool = True,
                    progress: bool = True) -> dict[str, bool]:
    """Train the v2 family into ``runs_root`` (resumable): seed 0 of every setting (the five shipped ones
    first), then :func:`reuse_shipped`, then seeds 1 and 2, then (``extra_seeds``) seeds 3 and 4 of the
    RoPE-base and xPos-B settings. Returns what reuse_shipped found."""
    def runs(seeds, labels=None):
        specs = family_specs(seeds, runs_root, family=FAMILY_V2, training=TRAINING)
        specs = [s for s in specs if labels is None or s.extra["config"] in labels]
        specs.sort(key=lambda s: (s.seed, s.extra["config"] not in SHIPPED_AS))  # stable: FAMILY_V2 order
        return [(s.cfg, s.seed, s.out_dir) for s in specs]

    train_all(runs((0,)), jobs=jobs, progress=progress)
    reused = reuse_shipped(runs_root)
    train_all(runs((1, 2)), jobs=jobs, progress=progress)
    if extra_seeds:
        train_all(runs(EXTRA_SEEDS, extra_seed_settings()), jobs=jobs, progress=progress)
    return reused


# Hugging Face's own architectures (notebook 06): Llama (RoPE), BLOOM (ALiBi) and GPT-2 (learned absolute
# positions, so measured at L only), built from config at the default sizes and trained like the family
# (FAMILY_TRAINING), so that they sit beside the family's "rope base 10000" and "alibi slopes x1": the
# same corpus, sizes, steps and seeds. GPT-NeoX is built and tested but not trained here (each HF model
# takes about 3.5 CPU-minutes, and the family came first on 2 cores). Seed 0 of Llama and BLOOM is shipped
# in HF_CHECKPOINTS (with its own SHA256SUMS); every run's ŝ and NLL are in HF_STORE.
HF_STORE = DATA / "results" / "hf.safetensors"
HF_RUNS = ROOT / "runs" / "hf"
HF_CHECKPOINTS = DATA / "hf_checkpoints"
HF_SHIPPED = ("hf-llama-s0", "hf-bloom-s0")
HF_TRAINED = ("llama", "bloom", "gpt2")
HF_COMMAND = "python -m attnres_helpers hf-train"


def hf_dataset(store: Path = HF_STORE, seeds=SEEDS, device: str = "cpu", runs_root: Path = HF_RUNS) -> Dataset:
    """The Hugging Face architectures × seeds as a Dataset, seed by seed."""
    from .hf import HFConfig

    d = preset("default")
    specs = [RunSpec(f"hf-{arch}-s{seed}", HFConfig(arch, d.train_len, d.n_layer, d.n_head, d.d_model), seed,
                     Path(runs_root) / f"hf-{arch}-s{seed}", dict(FAMILY_TRAINING),
                     extra={"architecture": arch, "device": device},
                     measure={**MEASURE, "multiples": (1,) if arch == "gpt2" else MEASURE["multiples"]})
             for seed in seeds for arch in HF_TRAINED]
    about = {"command": HF_COMMAND, "measure": MEASURE, "training": FAMILY_TRAINING, "device": device}
    return Dataset(Path(store), specs, about)


def ship_hf_checkpoints(runs_root: Path = HF_RUNS, root: Path = HF_CHECKPOINTS, runs=HF_SHIPPED) -> None:
    """Copy the shipped HF runs' config.json and fp16 model into ``root`` and write its SHA256SUMS."""
    for run in runs:
        for name in ("config.json", "model.safetensors"):
            data = (Path(runs_root) / run / name).read_bytes()
            (Path(root) / run).mkdir(parents=True, exist_ok=True)
            atomic_write(Path(root) / run / name, lambda tmp: Path(tmp).write_bytes(data))
    write_text_atomic(Path(root) / "SHA256SUMS", sha256sums(root))


def load_results(path: Path = STORE, boundary: Boundary = "zero") -> list[dict]:
    """Records (:func:`attnres_helpers.store.records`) of a shipped store; a clear error if it is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; regenerate it with `{REPRODUCE_COMMAND}`")
    return records(load_profiles(path)[0], boundary)
