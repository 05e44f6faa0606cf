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
import time

import torch

from attnres_helpers.data import load_splits
from attnres_helpers.experiments import ROOT, data_path
from attnres_helpers.files import write_text_atomic
from attnres_helpers.measure import measure_model
from attnres_helpers.model import ModelConfig
from attnres_helpers.store import records as profile_records
from attnres_helpers.train import train

# Spelled out in full, so that the sweep does not move when the shipped preset or ModelConfig's
# defaults change (xPos's B was 512 when the sweep ran; ModelConfig's default is now L/2).
BASE = {
    "model": {"train_len": 64, "n_layer": 4, "n_head": 4, "d_model": 128, "xpos_scale_base": 512.0},
    "train": {"steps": 400, "batch_tokens": 4096, "lr": 2e-3, "warmup": 40},
}

# name -> changes from BASE (model fields, training settings)
POINTS = {
    "base": {},
    "L32": {"model": {"train_len": 32}},
    "L128": {"model": {"train_len": 128}},
    "steps200": {"train": {"steps": 200, "warmup": 20}},
    "steps800": {"train": {"steps": 800, "warmup": 80}},
    "width64": {"model": {"d_model": 64, "n_head": 4}},
    "depth2": {"model": {"n_layer": 2}},
    "headdim64": {"model": {"n_head": 2}},
    "ropebase500": {"model": {"rope_base": 500.0}},
    "lr1e-3": {"train": {"lr": 1e-3}},
}
ENCODINGS = ("rope", "alibi", "sinusoidal", "xpos")  # xPos is only needed where BCA is checked
SWEEP_DIR = data_path("sweep")  # one records file a point: <point>.json
RECORD_DROPPED = ("run", "boundary")  # constant within the sweep (boundary "zero"); not in its files


def point_settings(name: str) -> tuple[dict, dict]:
    change = POINTS[name]
    model = {**BASE["model"], **change.get("model", {})}
    train_settings = {**BASE["train"], **change.get("train", {})}
    return model, train_settings


def summarise(head_modes=("mean-scores", "mean-R")) -> str:
    """A markdown summary of every point swept so far: the pairs, and which findings of Table 3 hold."""
    from attnres_helpers.tables import LEVEL_TOLERANCE, format_table, pair_table

    lines = [
        "# Sweep summary",
        "",
        summarise_round2(),
        "",
        "## Round 1 (2 layers chosen; layer means, different windows)",
        "",
        "Written by `python scripts/sweep.py --summary` from data/sweep/*.json. "
        'Seed 0 unless stated; R is the layer mean (boundary "zero"); train_s is the training wall '
        "time of one model on the machine and load it ran on (two sweeps shared 2 busy cores, one "
        "torch thread each).",
        "",
        "Round 1 shipped the point `depth2`: the cheapest one (about 80 s a model) that "
        "shows every finding below that any point shows. `steps800` was not run for lack of time; "
        "`steps200` against `base` is the steps axis. Points that change only RoPE's base train "
        "identical ALiBi and sinusoidal models, which the identical rows show.",
        "",
    ]
    for name in POINTS:
        path = SWEEP_DIR / f"{name}.json"
        if not path.is_file():
            continue
        records = json.loads(path.read_text())
        model_changes, train_settings = point_settings(name)
        lines += [f"## {name}", "", f"model {model_changes}, training {train_settings}", ""]
        times = {}
        for r in records:
            times.setdefault(r["encoding"], r["train_wall_s"])
        for head_mode in head_modes:
            rows = pair_table(records, head_mode)
            r = {row["encoding"]: row for row in rows}
            for row in rows:
                row["train_s"] = round(times[row["encoding"]])
            lines += [
                f"{head_mode}:",
                "",
                "```",
                format_table(
                    rows, ["encoding", "R(L)", "R(2L)", "R(2L)+BCA", "ppl(L)", "ppl(2L) past L", "train_s"], digits=4
                ),
                "```",
                "",
            ]
            mean = lambda e, col, r=r: r[e][col].mean if e in r and r[e].get(col) else None  # noqa: E731
            found = []
            trio = [e for e in ("rope", "sinusoidal", "alibi") if e in r]
            if len(trio) == 3:
                found.append(f"RoPE highest R(L): {mean('rope', 'R(L)') > max(mean(e, 'R(L)') for e in trio[1:])}")
                found.append(f"RoPE lowest R(2L): {mean('rope', 'R(2L)') < min(mean(e, 'R(2L)') for e in trio[1:])}")
            if "alibi" in r:
                level = abs(mean("alibi", "R(2L)") / mean("alibi", "R(L)") - 1) < LEVEL_TOLERANCE
                found.append(f"ALiBi level (±{LEVEL_TOLERANCE:.0%}): {level}")
            for e in ("rope", "xpos"):
                if e in r and mean(e, "R(2L)+BCA") is not None:
                    found.append(f"BCA raises {e} at 2L: {mean(e, 'R(2L)+BCA') > mean(e, 'R(2L)')}")
            lines += ["; ".join(found), ""]
    return "\n".join(lines)


def summarise_round2() -> str:
    """Round 2: per-layer R (the layers above the first) and same-window perplexity, around the new
    default (4 layers, L = 128, 1600 steps): the GPU-trained points of data/sweep/round2.safetensors
    (scripts/gpu_runs.py) and the shipped CPU-trained default itself (data/results/default.safetensors)."""
    from attnres_helpers.checks import CHECK_DESCRIPTIONS, reversal_checks
    from attnres_helpers.experiments import STORE, TRAINING
    from attnres_helpers.store import load_profiles, records
    from attnres_helpers.tables import format_table, pair_table

    points = {}
    round2, about = load_profiles(data_path("sweep", "round2.safetensors"))
    for r in records(round2, head_modes=("mean-scores",)):
        points.setdefault((r["point"], "GPU"), []).append(r)
    if STORE.is_file():
        points[("default (shipped, 1600 steps)", "CPU")] = records(load_profiles(STORE)[0], head_modes=("mean-scores",))
    lines = [
        "## Round 2: the reversal per layer, in the same windows",
        "",
        "Written by `python scripts/sweep.py --summary`. The question: the cheapest configuration where, in the "
        "layers above the first (mean-scores, boundary zero), RoPE has the highest R(L) of RoPE, ALiBi and "
        "sinusoidal and falls below ALiBi at 2L, and where RoPE's perplexity in the same 2L windows is below "
        "ALiBi's before L and above it past L, on the seed means and in at least 2 of 3 seeds. "
        f"Base: 4 layers, width 128, 4 heads, L = 128, training {TRAINING}. The GPU points ran in one "
        "session on a lent GPU (`scripts/gpu_runs.py`, TF32); its time limit stopped them after 13 of 63 "
        "models, so `steps800` has 1-2 seeds and the points steps3200, L64, depth2, depth6 and lr1e-3 were "
        "not reached. The default itself was trained on 2 CPU cores (`python -m attnres_helpers reproduce`).",
        "",
    ]
    wanted = ["rope_highest_at_L", "rope_below_alibi_at_2L", "rope_better_first_L", "rope_worse_past_L"]
    for (point, device), recs in points.items():
        checks = reversal_checks(recs, layer="upper", partial=True)
        rows = pair_table(recs, "mean-scores", "upper")
        lines += [
            f"### {point} ({device})",
            "",
            "```",
            format_table(rows, ["encoding", "seeds", "R(L)", "R(2L)", "ppl(2L) first L", "ppl(2L) past L"], digits=4),
            "```",
            "",
        ]
        lines += [
            f"- {CHECK_DESCRIPTIONS[n]}: {checks[n].holds} on the means, {checks[n].seeds_holding} of "
            f"{checks[n].seeds} seeds"
            for n in wanted
            if n in checks
        ] + [""]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", nargs="+", default=list(POINTS), choices=list(POINTS))
    ap.add_argument("--encodings", nargs="+", default=list(ENCODINGS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--windows", type=int, default=32, help="held-out windows per length")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is much faster on a busy machine)")
    ap.add_argument("--summary", action="store_true", help="only write data/sweep/SUMMARY.md from the records")
    args = ap.parse_args(argv)
    if args.summary:
        write_text_atomic(SWEEP_DIR / "SUMMARY.md", summarise())
        print((SWEEP_DIR / "SUMMARY.md").read_text())
        return

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
                cfg = ModelConfig(encoding=encoding, **model_changes)
                out = ROOT / "runs" / "sweep" / point / f"{encoding}-s{seed}"
                t0 = time.perf_counter()
                model, summary = train(
                    cfg, seed=seed, out_dir=out, checkpoint_every=0, progress=False, **train_settings
                )
                train_s = summary["results"]["wall_s"]
                profiles = measure_model(
                    model,
                    val_tokens,
                    f"{point}-{encoding}-s{seed}",
                    {"encoding": encoding, "seed": seed, "train_len": cfg.train_len},
                    multiples=(1, 2),
                    n_windows=args.windows,
                )
                # the records of the sweep's files: per layer and the layer mean ("upper" is derivable
                # from the per-layer records), now with perplexity_first_L
                recs = [
                    {k: v for k, v in r.items() if k not in RECORD_DROPPED}
                    for r in profile_records(profiles)
                    if r["layer"] != "upper"
                ]
                for r in recs:
                    r.update(
                        point=point,
                        train_wall_s=train_s,
                        val_loss=summary["results"]["val_loss"],
                        **{f"train_{k}": v for k, v in train_settings.items()},
                        model=cfg.to_dict(),
                    )
                done += recs
                write_text_atomic(path, json.dumps(done, indent=1))
                mean = {
                    (r["eval_len"], r["bca"]): r["resolution"]
                    for r in recs
                    if r["layer"] == "mean" and r["head_mode"] == "mean-scores"
                }
                L = cfg.train_len
                print(
                    f"{point:12s} {encoding:10s} s{seed}  train {train_s:5.0f}s  "
                    f"total {time.perf_counter() - t0:5.0f}s  "
                    f"R(L) {mean[(L, False)]:.4f}  R(2L) {mean[(2 * L, False)]:.4f}  "
                    f"R(2L,BCA) {mean.get((2 * L, True), float('nan')):.4f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
