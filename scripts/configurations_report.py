"""Plan v4's per-configuration table, as the closing note of issue 40 gives it, from the store and the run's log.

    python scripts/configurations_report.py [--store data/results/configurations_v4.safetensors]
        [--log runs/configurations-v4.log] [--n-resamples 2000]

One row per configuration measured at both lengths: its kind, R(L), R(2L) with and without the first-token
entries, the NLL rise, the attention entropy past L, near retrieval with the query inside and past L, far
retrieval (exact match, the plan's outcome; in brackets the share of digits right, exploratory, with the
absent key's share as the floor), the ceiling control past L, every number with its window-bootstrap
interval (:func:`attnres_helpers.plan_v4.summary`), then the wall time of each of its 2L jobs from the
log (the seconds between consecutive lines of one process: the first job after a start, which also loads
the model, is left out). The verdicts follow, as notebook 09 prints them.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

from attnres_helpers import plan_v4
from attnres_helpers.configured_store import load
from attnres_helpers.passkey import FAR_FRACTIONS
from attnres_helpers.paths import CONFIGURATIONS_RUNS, CONFIGURATIONS_V4_STORE

LINE = re.compile(r"(\S+) T=(\d+) window (\d+): (\d+) s elapsed")


def job_seconds(log: Path) -> dict[tuple[str, int], list[int]]:
    """{(configuration, T): [seconds of each job]} from a run's log; a restart (elapsed going down) starts afresh."""
    times = collections.defaultdict(list)
    previous = None
    for line in log.read_text().splitlines() if log.exists() else []:
        m = LINE.fullmatch(line.strip())
        if not m:
            continue
        name, T, elapsed = m.group(1), int(m.group(2)), int(m.group(4))
        if previous is not None and elapsed >= previous:
            times[(name, T)].append(elapsed - previous)
        previous = elapsed
    return times


def shown(x, digits: int = 3) -> str:
    low, high = x.confidence_interval
    interval = "" if abs(high - low) < 1e-12 else f" [{low:.{digits}g}, {high:.{digits}g}]"
    return f"{x.statistic:.{digits}g}{interval}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=str(CONFIGURATIONS_V4_STORE))
    ap.add_argument("--log", default=str(CONFIGURATIONS_RUNS.parent / "configurations-v4.log"))
    ap.add_argument("--n-resamples", type=int, default=2000)
    args = ap.parse_args(argv)
    store = load(args.store)
    L = store.train_len
    data = plan_v4.collect(store)
    summary = plan_v4.summary(data, n_resamples=args.n_resamples)
    times = job_seconds(Path(args.log))
    far_d = {f"d = {int(round(f * L))}" for f in FAR_FRACTIONS}
    floor = {r["distance"]: r for r in plan_v4.trials_by_distance(store, "as-trained", 2 * L)}["absent key"]["digits"]
    print(
        f"windows: {data.windows('R(2L)')} per configuration at 2L; absent key's share of digits right "
        f"(the floor, as trained): {floor:.2f}"
    )
    print(
        "| configuration | kind | R(L) | R(2L) / sink-free | NLL rise | entropy ≥ L | near inside / past L "
        "| far exact (digits) | ceiling past L | s per 2L job |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in data.names:
        s = summary[name]
        far = [r for r in plan_v4.trials_by_distance(store, name, 2 * L) if r["distance"] in far_d]
        digits = sum(r["digits"] * r["trials"] for r in far) / max(1, sum(r["trials"] for r in far))
        t = times.get((name, 2 * L), [])
        seconds = "–" if not t else f"{min(t)}–{max(t)}" if len(t) > 1 else str(t[0])
        print(
            f"| {name} | {store.entry(name, 2 * L).kind} | {shown(s['R(L)'])} | {shown(s['R(2L)'])} / "
            f"{shown(s['R(2L) sink-free'])} | {shown(s['NLL rise'])} | {shown(s['entropy ≥ L'])} | "
            f"{shown(s['near inside L'], 2)} / {shown(s['near past L'], 2)} | {shown(s['far'], 2)} ({digits:.2f}) | "
            f"{shown(s['ceiling past L'], 2)} | {seconds} |"
        )
    valid, got = plan_v4.validity(data)
    print(
        f"\nvalidity (as trained, windows of L): {', '.join(f'{k} {v:.2f}' for k, v in got.items())}: "
        f"{'the retrieval outcomes count' if valid else 'retrieval outcomes descriptive only'}; "
        f"broken: {', '.join(plan_v4.broken(data)) or 'none'}"
    )
    for row in plan_v4.verdicts(data, n_resamples=args.n_resamples) if len(data.names) >= 3 else []:
        w = row["within"]
        low, high = w.confidence_interval
        within = f"within kinds {w.statistic:+.2f} [{low:+.2f}, {high:+.2f}], p {w.pvalue:.3f}"
        line = f"{row['outcome']}: {row['verdict']} ({within})"
        if "verdict without broken" in row:
            line += f"; without the broken: {row['verdict without broken']}"
        across = ", ".join(f"{k} {t.statistic:+.2f}" for k, t in row["across"].items())
        print(f"{line}; across: {across}")
        for h in row.get("head to head", []):
            print(
                f"    R(2L) against {h.rival}: |ρ| difference {shown(h.difference, 2)}, partial ρ {shown(h.partial, 2)}"
            )


if __name__ == "__main__":
    main()
