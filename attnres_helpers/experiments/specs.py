"""What is trained and measured: every set of models in this project as a :class:`Dataset` of
:class:`RunSpec`\\ s, run by :mod:`.runner`. Nothing here trains or measures.

- the shipped default (notebooks 03, 04): five encodings × three seeds, ``data/checkpoints/``;
- the family of notebook 05: v1 (21 settings at 400 steps, exploratory) and v2 (plan v2, 23 settings
  at the default's 1600 steps, with the copy probe);
- `transformers`' architectures trained on our corpus (notebook 06);
- the larger GPU configuration and round 2 of the sweep (``scripts/gpu_runs.py``).

A Dataset also says which runs a store already holds as it asks for them (:meth:`Dataset.current`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..model import ModelConfig, preset
from ..paths import (
    CHECKPOINTS,
    FAMILY_COMMAND,
    FAMILY_RUNS,
    FAMILY_V2_COMMAND,
    FAMILY_V2_RUNS,
    HF_COMMAND,
    HF_RUNS,
    REPRODUCE_COMMAND,
    STORES,
)
from ..train import training_settings

if TYPE_CHECKING:
    from ..hf import HFConfig
    from ..store import Profile

STORE = STORES["default"]

# The default configuration, chosen by the sweep (data/sweep/SUMMARY.md): the "default" model preset
# (4 layers, L = 128, width 128, 4 heads, xPos B = L/2) trained as below.
MODEL: dict = {}  # overrides of the preset (none for the shipped run)
TRAINING = {"steps": 1600, "batch_tokens": 4096, "lr": 2e-3, "warmup": 100}
SEEDS = (0, 1, 2)
ENCODINGS = ("sinusoidal", "rope", "xpos", "alibi", "nope")  # the shipped experiment (T5 and KERPLE: the v2 family)
MEASURE = {"multiples": (1, 2, 4), "n_windows": 32}


def default_config(encoding: str, **overrides) -> ModelConfig:
    """The default configuration for ``encoding``, with some model fields changed."""
    return preset("default", encoding=encoding, **{**MODEL, **overrides})


def run_meta(cfg: ModelConfig | HFConfig, seed: int, training: dict, **extra) -> dict:
    """A run's metadata, stored beside its profiles: encoding, seed, train_len, the model config, the
    training settings as config.json records them, and any extra keys (a family label, the device...)."""
    return {
        "encoding": cfg.encoding,
        "seed": seed,
        "train_len": cfg.train_len,
        "model": cfg.to_dict(),
        "training": training_settings(**training, seed=seed),
        **extra,
    }


def measure_settings(measure: dict) -> dict:
    """Measuring settings as a run's stored metadata records them (``measure``): the multiples of L and the
    number of windows, MEASURE's where ``measure`` leaves them out."""
    settings = {**MEASURE, **measure}
    return {"multiples": list(settings["multiples"]), "n_windows": settings["n_windows"]}


def checkpoint_dir(encoding: str, seed: int, root: Path = CHECKPOINTS) -> Path:
    return Path(root) / f"{encoding}-s{seed}"


def slug(label: str) -> str:
    """A label as a file and run name: letters and digits, other characters as '-'."""
    return "".join(c if c.isalnum() else "-" for c in label).strip("-")


@dataclass(frozen=True)
class RunSpec:
    """One model of a dataset: its name in the store, config, seed, where it trains, its training and
    measuring settings, extra metadata, and whether the copy probe is measured on it."""

    name: str
    cfg: ModelConfig
    seed: int
    out_dir: Path
    training: dict = field(default_factory=lambda: dict(TRAINING))
    extra: dict = field(default_factory=dict)
    measure: dict = field(default_factory=lambda: dict(MEASURE))
    probe: bool = False

    @property
    def meta(self) -> dict:
        return run_meta(self.cfg, self.seed, self.training, **self.extra)

    @property
    def stored_meta(self) -> dict:
        """The metadata a store holds for this run: :attr:`meta` and its measuring settings (``measure``)."""
        return {**self.meta, "measure": measure_settings(self.measure)}


@dataclass(frozen=True)
class Dataset:
    """Runs whose profiles go into one store, with how they were made (``about``) and the stored dtype;
    ``sums``: a shipped folder of checkpoints whose SHA256SUMS is rewritten once every run is trained;
    ``average_heads``: store the head means only (:func:`store.average_heads`: mean-scores R, for size)."""

    store: Path
    specs: list[RunSpec]
    about: dict
    dtype: torch.dtype = torch.float32
    sums: Path | None = None
    average_heads: bool = False

    def current(self, profiles: list[Profile], curves: dict, about: dict) -> set[str]:
        """The runs of this dataset that ``profiles`` (and copy ``curves``) of a store whose header is ``about``
        hold as it asks for them: the same metadata, measured with the same settings at each length asked for,
        with copy curves where the spec asks for the probe. A run stored before runs recorded their measuring
        settings counts as measured with the header's ``n_windows``."""
        by_run: dict[str, list[Profile]] = {}
        for p in profiles:
            by_run.setdefault(p.run, []).append(p)
        header = about.get("measure") if isinstance(about.get("measure"), dict) else {}
        probed = {run for run, _ in curves}
        current = set()
        for spec in self.specs:
            held, want = by_run.get(spec.name), spec.stored_meta
            if not held:
                continue
            meta = {"measure": {**want["measure"], "n_windows": header.get("n_windows")}, **held[0].meta}
            if (
                {p.eval_len for p in held} == {k * spec.cfg.train_len for k in want["measure"]["multiples"]}
                and {k: meta.get(k) for k in want} == want
                and (spec.name in probed or not spec.probe)
            ):
                current.add(spec.name)
        return current


def default_dataset(
    root: Path = CHECKPOINTS,
    store: Path = STORE,
    encodings: Iterable[str] = ENCODINGS,
    seeds: Collection[int] = SEEDS,
    model: dict | None = None,
    training: dict | None = None,
    measure: dict | None = None,
) -> Dataset:
    """The shipped experiment: every encoding × seed at the default configuration (``model`` overrides
    of the preset, ``training``, ``measure``: None for the shipped settings), into ``root``, with the
    copy probe (plan v2's retrieval outcome, also reported for notebook 03's models); every head's ŝ and
    key0 kept, as int16 codes (:func:`store.quantize`)."""
    training, measure = dict(training or TRAINING), dict(measure or MEASURE)
    specs = [
        RunSpec(
            f"{e}-s{s}",
            default_config(e, **(model or {})),
            s,
            checkpoint_dir(e, s, root),
            training,
            measure=measure,
            probe=True,
        )
        for e in encodings
        for s in seeds
    ]
    about = {"command": REPRODUCE_COMMAND, "measure": measure, "training": training}
    return Dataset(Path(store), specs, about, torch.int16, sums=Path(root))


# The family v1 of notebook 05 (analysis plan data/results/family_plan.md; exploratory since plan v2): a label,
# an encoding and model fields changed from the default configuration, trained at a quarter of the steps.
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
FAMILY_STORE = STORES["family"]


def family_specs(
    seeds: Iterable[int] = SEEDS,
    runs_root: Path = FAMILY_RUNS,
    device: str = "cpu",
    family: dict = FAMILY,
    training: dict = FAMILY_TRAINING,
    probe: bool = False,
) -> list[RunSpec]:
    """Every member of ``family`` for every seed, as RunSpecs (label and changed fields in the metadata),
    seed by seed: a run stopped early leaves whole seeds of every member, not whole members."""
    return [
        RunSpec(
            f"{slug(label)}-s{seed}",
            default_config(encoding, **params),
            seed,
            Path(runs_root) / f"{slug(label)}-s{seed}",
            dict(training),
            extra={"config": label, "params": params, "device": device},
            probe=probe,
        )
        for seed in seeds
        for label, (encoding, params) in family.items()
    ]


def family_dataset(
    store: Path = FAMILY_STORE, seeds: Iterable[int] = SEEDS, device: str = "cpu", runs_root: Path = FAMILY_RUNS
) -> Dataset:
    """The family v1 as a Dataset (63 models × 6 profiles, stored as int16 head means, as the v2 family)."""
    about = {
        "command": FAMILY_COMMAND + (f" --device {device}" if device != "cpu" else ""),
        "measure": MEASURE,
        "training": FAMILY_TRAINING,
        "device": device,
        "plan": "data/results/family_plan.md",
    }
    return Dataset(Path(store), family_specs(seeds, runs_root, device), about, torch.int16, average_heads=True)


# The v2 family (plan: data/results/family_plan_v2.md, committed before any of it was trained): v1's 21
# settings plus two learned relative biases, at the default's training (TRAINING, 1600 steps), where
# notebook 03's reversal holds, with the copy probe. Five settings are exactly notebook 03's configuration
# (SHIPPED_AS): their retrained seed 0 is compared with the shipped checkpoint byte for byte
# (runner.reuse_shipped), and only where equal are seeds 1 and 2 taken from data/checkpoints/.
FAMILY_V2 = {**FAMILY, "t5 bias": ("t5", {}), "kerple log": ("kerple", {})}
FAMILY_V2_STORE = STORES["family_v2"]
SHIPPED_AS = {
    "rope base 10000": "rope",
    "xpos B 64": "xpos",
    "alibi slopes x1": "alibi",
    "sinusoidal": "sinusoidal",
    "nope": "nope",
}
EXTRA_SEEDS = (3, 4)  # of the RoPE-base and xPos-B settings, if time allows (a labelled secondary analysis)


def extra_seed_settings(family: dict = FAMILY_V2) -> list[str]:
    """The RoPE-base and xPos scale-base settings (γ at its default): those that get seeds 3 and 4."""
    return [label for label in family if label.startswith(("rope base", "xpos B")) and "gamma" not in label]


def family_v2_specs(
    seeds: Iterable[int] = SEEDS, runs_root: Path = FAMILY_V2_RUNS, device: str = "cpu"
) -> list[RunSpec]:
    """The v2 family seed by seed; within a seed, the five SHIPPED_AS settings first."""
    specs = family_specs(seeds, runs_root, device, FAMILY_V2, TRAINING, probe=True)
    return sorted(specs, key=lambda s: (s.seed, s.extra["config"] not in SHIPPED_AS))  # stable: FAMILY_V2 order


def family_v2_dataset(
    store: Path = FAMILY_V2_STORE,
    seeds: Iterable[int] = SEEDS,
    device: str = "cpu",
    runs_root: Path = FAMILY_V2_RUNS,
    extra_seeds: bool = False,
) -> Dataset:
    """The v2 family as a Dataset: the head means of ŝ and key0 (the plan's R is mean-scores) as int16
    codes, and the copy probe at every gap of the plan, with and without BCA; 69 runs in about 3.5 MB.
    ``extra_seeds``: also seeds 3 and 4 of :func:`extra_seed_settings` (the plan's secondary analysis)."""
    specs = family_v2_specs(seeds, runs_root, device)
    if extra_seeds:
        specs += [
            s for s in family_v2_specs(EXTRA_SEEDS, runs_root, device) if s.extra["config"] in extra_seed_settings()
        ]
    about = {
        "command": FAMILY_V2_COMMAND + (f" --device {device}" if device != "cpu" else ""),
        "measure": MEASURE,
        "training": TRAINING,
        "device": device,
        "plan": "data/results/family_plan_v2.md",
        "stored": "head means of ŝ and key-0 scores, int16 codes per row (store.quantize)",
    }
    return Dataset(Path(store), specs, about, torch.int16, average_heads=True)


# Hugging Face's own architectures (notebook 06): Llama (RoPE), BLOOM (ALiBi) and GPT-2 (learned absolute
# positions, so measured at L only), built from config at the default sizes and trained like the family v1
# (FAMILY_TRAINING), so that they sit beside its "rope base 10000" and "alibi slopes x1". Seed 0 of Llama
# and BLOOM is shipped in HF_CHECKPOINTS (with its own SHA256SUMS); every run's ŝ and NLL are in HF_STORE.
HF_STORE = STORES["hf"]
HF_SHIPPED = ("hf-llama-s0", "hf-bloom-s0")
HF_TRAINED = ("llama", "bloom", "gpt2")


def hf_dataset(
    store: Path = HF_STORE, seeds: Iterable[int] = SEEDS, device: str = "cpu", runs_root: Path = HF_RUNS
) -> Dataset:
    """The Hugging Face architectures × seeds as a Dataset, seed by seed."""
    from ..hf import HFConfig

    d = preset("default")
    specs = [
        RunSpec(
            f"hf-{arch}-s{seed}",
            HFConfig(arch, d.train_len, d.n_layer, d.n_head, d.d_model),
            seed,
            Path(runs_root) / f"hf-{arch}-s{seed}",
            dict(FAMILY_TRAINING),
            extra={"architecture": arch, "device": device},
            measure={**MEASURE, "multiples": (1,) if arch == "gpt2" else MEASURE["multiples"]},
        )
        for seed in seeds
        for arch in HF_TRAINED
    ]
    about = {"command": HF_COMMAND, "measure": MEASURE, "training": FAMILY_TRAINING, "device": device}
    return Dataset(Path(store), specs, about)


# The larger configuration and round 2 of the sweep, trained on a lent GPU by scripts/gpu_runs.py.
LARGE_TRAINING = {"steps": 1500, "batch_tokens": 16384, "lr": 1e-3, "warmup": 100}
SWEEP_ENCODINGS = ("rope", "alibi", "sinusoidal")
SWEEP_POINTS = {  # changes from the default configuration: (model fields, training settings)
    "steps400": ({}, {"steps": 400, "warmup": 40}),
    "steps800": ({}, {"steps": 800, "warmup": 50}),
    "steps3200": ({}, {"steps": 3200}),
    "L64": ({"train_len": 64}, {}),
    "depth2": ({"n_layer": 2}, {}),
    "depth6": ({"n_layer": 6}, {}),
    "lr1e-3": ({}, {"lr": 1e-3}),
}


def large_dataset(out: Path, runs: Path, device: str) -> Dataset:
    """Notebook 03's larger second configuration (GPU-trained), stored as int16 head means (mean-scores R)."""
    specs = [
        RunSpec(
            f"{e}-s{s}",
            preset("large", encoding=e),
            s,
            Path(runs) / "large" / f"{e}-s{s}",
            LARGE_TRAINING,
            {"device": device, "preset": "large"},
        )
        for s in SEEDS
        for e in ENCODINGS
    ]
    about = {
        "command": "python scripts/gpu_runs.py",
        "dataset": "large",
        "measure": MEASURE,
        "training": LARGE_TRAINING,
        "device": device,
        "tf32": device.startswith("cuda"),
    }
    return Dataset(Path(out) / STORES["large"].name, specs, about, torch.int16, average_heads=True)


def sweep_dataset(out: Path, runs: Path, device: str) -> Dataset:
    specs = []
    for point, (model_changes, train_changes) in SWEEP_POINTS.items():
        training = {**TRAINING, **train_changes}
        for s in SEEDS:
            for e in SWEEP_ENCODINGS:
                specs.append(
                    RunSpec(
                        f"{point}-{e}-s{s}",
                        default_config(e, **model_changes),
                        s,
                        Path(runs) / "sweep" / f"{point}-{e}-s{s}",
                        training,
                        {"point": point, "device": device},
                        {**MEASURE, "multiples": (1, 2)},
                    )
                )
    about = {
        "command": "python scripts/gpu_runs.py",
        "dataset": "sweep round 2",
        "measure": {**MEASURE, "multiples": (1, 2)},
        "device": device,
        "points": SWEEP_POINTS,
    }
    return Dataset(Path(out) / STORES["round2"].name, specs, about, torch.float16)
