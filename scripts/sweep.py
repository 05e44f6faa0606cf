"""Sweep for the smallest CPU configuration that shows the RoPE reversal (issue: trained models).

Each point changes one thing from a base configuration (training length, steps, width,
depth, head dimension, RoPE base, learning rate). At each point RoPE, ALiBi, sinusoidal
and xPos are trained (seed 0) and measured at L and 2L, with and without BCA, with the
same estimator as everything else (``attnres_helpers.measure``). Nothing about the
measurement changes between points.

    python scripts/sweep.py                 # every point, resumable: finished models are reused
    python scripts/sweep.py --points base L32 --seeds 0 1

Models go to runs/sweep/ (not shipped); the records, with the training wall time of each
model, go to data/sweep/<point>.json, written atomically after every model (so two
processes can sweep different points at once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnres_helpers.data import load_splits  # noqa: E402
from attnres_helpers.measure import measure_model  # noqa: E402
from attnres_helpers.model import preset  # noqa: E402
from attnres_helpers.train import train  # noqa: E402

BASE = {"model": {"train_len": 64}, "train": {"steps": 400, "batch_tokens": 4096, "lr": 2e-3, "warmup": 40}}

# name -> changes from BASE (model fields, training settings)
POINTS = {
    "base": {},
    "L32": {"model": {"train_len": 32}},
    "L128": {"model": {"train_len": 128}},
    "steps800": {"train": {"steps": 800, "warmup": 80}},
    "width64": {"model": {"d_model": 64, "n_head": 4}},
    "depth2": {"model": {"n_layer": 2}},
    "headdim64": {"model": {"n_head": 2}},
    "ropebase500": {"model": {"rope_base": 500.0}},
    "lr1e-3": {"train": {"lr": 1e-3}},
}
ENCODINGS = ("rope", "alibi", "sinusoidal", "xpos")
SWEEP_DIR = ROOT / "data" / "sweep"  # one records file a point: <point>.json


def point_settings(name: str) -> tuple[dict, dict]:
    change = POINTS[name]
    model = {**BASE["model"], **change.get("model", {})}
    train_settings = {**BASE["train"], **change.get("train", {})}
    return model, train_settings


def write_atomic(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", nargs="+", default=list(POINTS), choices=list(POINTS))
    ap.add_argument("--encodings", nargs="+", default=list(ENCODINGS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--windows", type=int, default=32, help="held-out windows per length")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is much faster on a busy machine)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    _, val_tokens = load_splits()
    for point in args.points:
        path = SWEEP_DIR / f"{point}.json"
        done = json.loads(path.read_text()) if path.is_file() else []
        have = {(r["point"], r["encoding"], r["seed"]) for r in done}
        model_changes, train_settings = point_settings(point)
        for seed in args.seeds:
            for encoding in args.encodings:
                if (point, encoding, seed) in have:
                    continue
                cfg = preset("default", encoding=encoding, **model_changes)
                out = ROOT / "runs" / "sweep" / point / f"{encoding}-s{seed}"
                t0 = time.perf_counter()
                model, summary = train(cfg, seed=seed, out_dir=out, checkpoint_every=0, progress=False,
                                       **train_settings)
                train_s = summary["results"]["wall_s"]
                recs = measure_model(model, val_tokens, seed=seed, multiples=(1, 2), n_windows=args.windows)
                for r in recs:
                    r.update(point=point, train_wall_s=train_s, val_loss=summary["results"]["val_loss"],
                             **{f"train_{k}": v for k, v in train_settings.items()}, model=cfg.to_dict())
                done += recs
                write_atomic(path, done)
                mean = {(r["eval_len"], r["bca"]): r["resolution"] for r in recs
                        if r["layer"] == "mean" and r["head_mode"] == "mean-scores"}
                L = cfg.train_len
                print(f"{point:12s} {encoding:10s} s{seed}  train {train_s:5.0f}s  total {time.perf_counter() - t0:5.0f}s  "
                      f"R(L) {mean[(L, False)]:.4f}  R(2L) {mean[(2 * L, False)]:.4f}  "
                      f"R(2L,BCA) {mean.get((2 * L, True), float('nan')):.4f}", flush=True)


if __name__ == "__main__":
    main()
