"""The GPU-trained datasets: one prepared, timed script for a lent GPU (nothing else depends on one).

Three datasets, queued in this order on one GPU, ``--jobs`` models at a time:

1. ``large`` (issue: the reversal where it lives, item 6): the "large" preset (8 layers, width 256,
   4 heads of 64, L = 256), every encoding, seeds 0-2, 1500 steps of 16384 tokens, lr 1e-3,
   measured at L, 2L and 4L -> ``data/results/large.safetensors``. Checkpoints are not shipped
   (6.3M parameters each); the profiles are.
2. ``family`` (notebook 05): :data:`attnres_helpers.experiments.FAMILY` at the default
   configuration, seeds 0-2 -> ``data/results/family.safetensors`` (plan: data/results/family_plan.md).
3. ``sweep`` (second round of data/sweep): points around the default configuration, RoPE, ALiBi
   and sinusoidal, seeds 0-2, measured at L and 2L -> ``data/sweep/round2.safetensors``.

    python scripts/gpu_runs.py --out DIR [--runs DIR] [--device cuda] [--jobs 14] [--deadline-s 420] [--quick]

``--quick`` shrinks everything (tiny preset, 3 steps) to check the script on a CPU. On the GPU,
fp32 matrix products use TF32 (``torch.set_float32_matmul_precision("high")``); the stores record
the device. The same datasets train on a CPU with ``--device cpu``, slowly (README: times).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from attnres_helpers.experiments import (
    MEASURE,
    SEEDS,
    TRAINING,
    Dataset,
    RunSpec,
    family_dataset,
    model_config,
    run_datasets,
)
from attnres_helpers.model import MODEL_ENCODINGS, preset

LARGE_TRAINING = {"steps": 1500, "batch_tokens": 16384, "lr": 1e-3, "warmup": 100}
SWEEP_ENCODINGS = ("rope", "alibi", "sinusoidal")
# Round 2 of the sweep: changes from the default configuration (model fields, training settings).
SWEEP_POINTS = {
    "steps400": ({}, {"steps": 400, "warmup": 40}),
    "steps800": ({}, {"steps": 800, "warmup": 50}),
    "steps3200": ({}, {"steps": 3200}),
    "L64": ({"train_len": 64}, {}),
    "depth2": ({"n_layer": 2}, {}),
    "depth6": ({"n_layer": 6}, {}),
    "lr1e-3": ({}, {"lr": 1e-3}),
}


def large_dataset(out: Path, runs: Path, device: str) -> Dataset:
    specs = [RunSpec(f"{e}-s{s}", preset("large", encoding=e), s, runs / "large" / f"{e}-s{s}",
                     LARGE_TRAINING, {"device": device, "preset": "large"})
             for s in SEEDS for e in MODEL_ENCODINGS]
    about = {"command": "python scripts/gpu_runs.py", "dataset": "large", "measure": MEASURE, "training": LARGE_TRAINING,
             "device": device, "tf32": device.startswith("cuda")}
    return Dataset(out / "large.safetensors", specs, about, torch.float16)


def sweep_dataset(out: Path, runs: Path, device: str) -> Dataset:
    specs = []
    for point, (model_changes, train_changes) in SWEEP_POINTS.items():
        training = {**TRAINING, **train_changes}
        for s in SEEDS:
            for e in SWEEP_ENCODINGS:
                cfg = model_config(e, **model_changes)
                specs.append(RunSpec(f"{point}-{e}-s{s}", cfg, s, runs / "sweep" / f"{point}-{e}-s{s}",
                                     training, {"point": point, "device": device}, {**MEASURE, "multiples": (1, 2)}))
    about = {"command": "python scripts/gpu_runs.py", "dataset": "sweep round 2", "measure": {**MEASURE, "multiples": (1, 2)},
             "device": device, "points": SWEEP_POINTS}
    return Dataset(out / "round2.safetensors", specs, about, torch.float16)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the three stores")
    ap.add_argument("--runs", type=Path, default=Path("runs/gpu"), help="folder for the checkpoints (not shipped)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--jobs", type=int, default=14, help="models trained at once")
    ap.add_argument("--deadline-s", type=float, default=420.0, help="start no model after this many seconds")
    ap.add_argument("--parts", nargs="+", default=["large", "family", "sweep"], choices=["large", "family", "sweep"])
    ap.add_argument("--quick", action="store_true", help="tiny models, 3 steps: check the script on a CPU")
    args = ap.parse_args(argv)
    torch.set_float32_matmul_precision("high")  # TF32 on the GPU; no effect on a CPU
    args.out.mkdir(parents=True, exist_ok=True)
    parts = {"large": lambda: large_dataset(args.out, args.runs, args.device),
             "family": lambda: family_dataset(args.out / "family.safetensors", SEEDS, args.device, args.runs / "family"),
             "sweep": lambda: sweep_dataset(args.out, args.runs, args.device)}
    datasets = [parts[p]() for p in args.parts]
    if args.quick:  # every run shrunk to a tiny model and 3 steps, to check the script on a CPU
        datasets = [replace(ds, specs=[replace(spec, cfg=preset("tiny", encoding=spec.cfg.encoding),
                                               training={**spec.training, "steps": 3, "batch_tokens": 64, "warmup": 1})
                                       for spec in ds.specs]) for ds in datasets]
    t0 = time.time()
    kept = run_datasets(datasets, args.device, args.jobs, progress=False, deadline_s=args.deadline_s)
    summary = {str(store.name): len({p.run for p in profiles}) for store, profiles in kept.items()}
    print(json.dumps({"wall_s": round(time.time() - t0, 1), "runs_stored": summary,
                      "runs_wanted": {str(d.store.name): len(d.specs) for d in datasets}}))


if __name__ == "__main__":
    main()
