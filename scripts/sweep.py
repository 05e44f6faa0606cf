"""Sweep for the smallest CPU configuration that shows the RoPE reversal (issue: trained models).

Each point changes one thing from a base configuration (training length, steps, width,
depth, head dimension, RoPE base, learning rate). At each point RoPE, ALiBi, sinusoidal
and xPos are trained (seed 0) and measured at L and 2L, with and without BCA, with the
same estimator as everything else (``attnres_helpers.measure``). Nothing about the
measurement changes between points.

    python scripts/sweep.py                 # every point, resumable: finished models are reused
    python scripts/sweep.py --points base L32 --seeds 0 1

Each point's models are a Dataset of the one runner (``experiments.run_datasets``: trained into
runs/sweep/<point>/, measured from their checkpoints into runs/sweep/<point>.safetensors, neither
shipped); the records, with the training wall time of each model, go to data/sweep/<point>.json,
written atomically once the point is done (so two processes can sweep different points at once).
The shipped records were made before the runner, from the in-memory fp32 models, so a rerun
(measured from the fp16 checkpoints) agrees with them to fp16 rounding, not to the last bit.
"""

from __future__ import annotations

import argparse
import json

from attnres_helpers.experiments import ROOT, Dataset, RunSpec, data_path, run_datasets
from attnres_helpers.files import write_text_atomic
from attnres_helpers.model import ModelConfig
from attnres_helpers.paths import STORES
from attnres_helpers.store import records as profile_records

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
RECORD_DROPPED = ("run", "boundary", "training", "trained")  # constant, or spelled out below; not in its files
RUNS = ROOT / "runs" / "sweep"  # the models and the per-point stores (git-ignored)


def point_settings(name: str) -> tuple[dict, dict]:
    change = POINTS[name]
    model = {**BASE["model"], **change.get("model", {})}
    train_settings = {**BASE["train"], **change.get("train", {})}
    return model, train_settings


def point_dataset(point: str, encodings, seeds, windows: int, skip=()) -> Dataset:
    """The point's models, less those in ``skip`` ((point, encoding, seed) already in its records file), as
    a Dataset of the one runner (experiments.run_datasets): trained into runs/sweep/<point>/, measured at L
    and 2L from their verified checkpoints into the git-ignored store runs/sweep/<point>.safetensors."""
    model_changes, train_settings = point_settings(point)
    specs = [
        RunSpec(
            f"{point}-{e}-s{s}",
            ModelConfig(encoding=e, **model_changes),
            s,
            RUNS / point / f"{e}-s{s}",
            train_settings,
            {"point": point},
            {"multiples": (1, 2), "n_windows": windows},
        )
        for s in seeds
        for e in encodings
        if (point, e, s) not in skip
    ]
    return Dataset(RUNS / f"{point}.safetensors", specs, {"command": "python scripts/sweep.py", "point": point})


def point_records(point: str, profiles) -> list[dict]:
    """The records of the sweep's files from the point's profiles: per layer and the layer mean ("upper"
    is derivable from the per-layer records), with each model's training wall time, validation loss,
    training settings and config."""
    _, train_settings = point_settings(point)
    recs = []
    for r in profile_records(profiles):
        if r["layer"] == "upper":
            continue
        trained = r["trained"]
        rec = {k: v for k, v in r.items() if k not in RECORD_DROPPED}
        rec.update(
            train_wall_s=trained["wall_s"],
            val_loss=trained["val_loss"],
            **{f"train_{k}": v for k, v in train_settings.items()},
        )
        recs.append(rec)
    return recs


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
    round2, about = load_profiles(STORES["round2"])
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
        "not reached. The default itself was trained on 2 CPU cores (`attnres reproduce`).",
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
    ap.add_argument("--jobs", type=int, default=2, help="models trained at once, one torch thread each (default 2)")
    ap.add_argument("--summary", action="store_true", help="only write data/sweep/SUMMARY.md from the records")
    args = ap.parse_args(argv)
    if args.summary:
        write_text_atomic(SWEEP_DIR / "SUMMARY.md", summarise())
        print((SWEEP_DIR / "SUMMARY.md").read_text())
        return

    for point in args.points:
        path = SWEEP_DIR / f"{point}.json"
        done = json.loads(path.read_text()) if path.is_file() else []
        have = {(r["point"], r["encoding"], r["seed"]) for r in done}
        ds = point_dataset(point, args.encodings, args.seeds, args.windows, skip=have)
        if not ds.specs:
            continue
        profiles = run_datasets([ds], jobs=args.jobs)[ds.store]
        done += point_records(point, profiles)
        write_text_atomic(path, json.dumps(done, indent=1))
        for r in point_records(point, profiles):
            if r["layer"] == "mean" and r["head_mode"] == "mean-scores" and r["eval_len"] == 2 * r["train_len"]:
                print(f"{point:12s} {r['encoding']:10s} s{r['seed']}  bca {r['bca']!s:5s}  "
                      f"R(2L) {r['resolution']:.4f}  train {r['train_wall_s']:5.0f}s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
