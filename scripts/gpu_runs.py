"""The GPU-trained datasets: one prepared, timed script for a lent GPU (nothing else depends on one).

Three datasets, queued in this order on one GPU, ``--jobs`` models at a time:

1. ``large`` (issue: the reversal where it lives, item 6): the "large" preset (8 layers, width 256,
   4 heads of 64, L = 256), every encoding, seeds 0-2, 1500 steps of 16384 tokens, lr 1e-3,
   measured at L, 2L and 4L -> ``data/results/large.safetensors``. Checkpoints are not shipped
   (6.3M parameters each); the profiles are.
2. ``family`` (notebook 05, v1): :data:`attnres_helpers.experiments.FAMILY` at the default
   configuration, seeds 0-2 -> ``family.safetensors`` (plan: data/results/family_plan.md). The
   datasets themselves are defined in :mod:`attnres_helpers.experiments.specs`.
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

from attnres_helpers.experiments import SEEDS, family_dataset, large_dataset, run_datasets, sweep_dataset
from attnres_helpers.model import preset
from attnres_helpers.paths import STORES


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
    parts = {
        "large": lambda: large_dataset(args.out, args.runs, args.device),
        "family": lambda: family_dataset(args.out / STORES["family"].name, SEEDS, args.device, args.runs / "family"),
        "sweep": lambda: sweep_dataset(args.out, args.runs, args.device),
    }
    datasets = [parts[p]() for p in args.parts]
    if args.quick:  # every run shrunk to a tiny model and 3 steps, to check the script on a CPU
        datasets = [
            replace(
                ds,
                specs=[
                    replace(
                        spec,
                        cfg=preset("tiny", encoding=spec.cfg.encoding),
                        training={**spec.training, "steps": 3, "batch_tokens": 64, "warmup": 1},
                    )
                    for spec in ds.specs
                ],
            )
            for ds in datasets
        ]
    t0 = time.time()
    kept = run_datasets(datasets, args.device, args.jobs, progress=False, deadline_s=args.deadline_s)
    summary = {str(store.name): len({p.run for p in profiles}) for store, profiles in kept.items()}
    print(
        json.dumps(
            {
                "wall_s": round(time.time() - t0, 1),
                "runs_stored": summary,
                "runs_wanted": {str(d.store.name): len(d.specs) for d in datasets},
            }
        )
    )


if __name__ == "__main__":
    main()
