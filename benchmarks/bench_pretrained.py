"""The measurement of a real pretrained model at length against a plain forward pass of the same model,
side by side in one run: time and peak memory at each T, and their ratios.

    python benchmarks/bench_pretrained.py [--lengths 2048 8192 16384] [--threads N]

The model is SmolLM2-135M (``make pretrained`` first). Two cases per T, each in a fresh subprocess
that loads the model, takes one held-out window of T + 1 tokens, and reads its peak RSS
(``ru_maxrss``) before and after one call:

- **forward**: ``model(input_ids).logits``, the plain forward pass as `transformers` runs it (SDPA,
  full logits), which is what any use of the model at that length costs;
- **measure**: :func:`attnres_helpers.hf.pretrained.window_statistics` on the same window: capture
  of every layer's q and k, ŝ by FFT, the scores on key 0, and the per-position NLL from logits
  computed in chunks.

Peak memory is the process's peak RSS (the loaded model included, as it is for any use of the model);
the extra over the loaded model is printed beside it. At each T the cases run in ABBA rounds (forward,
measure, then measure, forward; ``--rounds``), each round and the summed times printed, so a machine
that drifts over the minutes of a run weighs on both alike (single timings here disagreed by up to 3x).
Targets (issue 20): measure <= 1.5x the forward's time and <= 1.5x its peak memory at
T = 8192, and T = 16384 measured within 8 GiB.

Not a timed test: the numbers depend on the machine and on what else runs on it.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

TARGET_T, TIME_RATIO, MEM_RATIO = 8192, 1.5, 1.5
LONG_T, LONG_GIB = 16384, 8.0
CASES = ("forward", "measure")


def maxrss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def one(case: str, T: int) -> dict:
    """In a child: load the model, one window of T + 1 tokens, one call of ``case``."""
    import torch

    from attnres_helpers.hf import fetch
    from attnres_helpers.hf.models import SMOLLM2
    from attnres_helpers.hf.pretrained import held_out_ids, window_statistics

    model = fetch.load(SMOLLM2)
    window = held_out_ids(model)[: T + 1]
    loaded = maxrss_gib()
    start = time.perf_counter()
    with torch.no_grad():
        if case == "forward":
            model(input_ids=window[None, :-1]).logits.sum()
        else:
            window_statistics(model, window)
    return {
        "time_s": time.perf_counter() - start,
        "peak_gib": maxrss_gib(),
        "loaded_gib": loaded,
        "threads": torch.get_num_threads(),
        "implementation": model.config._attn_implementation,
    }


def child(case: str, T: int, threads: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--one", case, str(T), "--threads", str(threads)],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 16384])
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads in every case; 0: torch's default")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per T (even: ABBA)")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "T"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.one:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(one(args.one[0], int(args.one[1]))))
        return
    start = time.perf_counter()
    load_before = os.getloadavg()[0]
    print(
        f"SmolLM2-135M, one window per case, fresh process per case; load average {load_before:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    print(
        f"{'T':>6}  {'forward s':>9}  {'measure s':>9}  {'time ratio':>10}  {'forward GiB':>11}  "
        f"{'measure GiB':>11}  {'mem ratio':>9}  {'(extra over the model: forward / measure)':>42}"
    )
    results = {}
    for T in args.lengths:
        runs = []
        for r in range(args.rounds):
            order = CASES if r % 2 == 0 else CASES[::-1]
            got = {case: child(case, T, args.threads) for case in order}
            runs.append((got["forward"], got["measure"]))
            f, m = runs[-1]
            if "error" not in f and "error" not in m:
                print(f"{T:>6}  round {r + 1}: forward {f['time_s']:.1f} s, measure {m['time_s']:.1f} s")
        failed = [run for pair in runs for run in pair if "error" in run]
        if failed:
            print(f"{T:>6}  failed: {failed[0]['error']}")
            results[T] = failed[0], failed[0]
            continue
        f, m = (
            {**cases[0], "time_s": sum(c["time_s"] for c in cases), "peak_gib": max(c["peak_gib"] for c in cases)}
            for cases in zip(*runs)
        )  # each case summed over the rounds, its peak the largest
        results[T] = f, m
        extra = f"{f['peak_gib'] - f['loaded_gib']:.2f} / {m['peak_gib'] - m['loaded_gib']:.2f}"
        print(
            f"{T:>6}  {f['time_s']:>9.1f}  {m['time_s']:>9.1f}  {m['time_s'] / f['time_s']:>9.2f}x  "
            f"{f['peak_gib']:>11.2f}  {m['peak_gib']:>11.2f}  {m['peak_gib'] / f['peak_gib']:>8.2f}x  {extra:>42}"
        )
    print(
        f"threads {next((r['threads'] for r, _ in results.values() if 'threads' in r), '?')}, "
        f"load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after"
    )
    print("targets:")
    f, m = results.get(TARGET_T, ({"error": "not measured"}, {"error": "not measured"}))
    if "error" in f or "error" in m:
        print(f"FAIL  T = {TARGET_T}: not measured (put {TARGET_T} in --lengths)")
    else:
        for what, ratio, target in (
            ("time", m["time_s"] / f["time_s"], TIME_RATIO),
            ("peak memory", m["peak_gib"] / f["peak_gib"], MEM_RATIO),
        ):
            print(
                f"{'PASS' if ratio <= target else 'FAIL'}  measure <= {target}x the forward's {what} at "
                f"T = {TARGET_T}: {ratio:.2f}x"
            )
    _, m = results.get(LONG_T, (None, {"error": "not measured"}))
    if "error" in m:
        print(f"FAIL  T = {LONG_T} measured within {LONG_GIB:.0f} GiB: {m['error']}")
    else:
        print(
            f"{'PASS' if m['peak_gib'] <= LONG_GIB else 'FAIL'}  T = {LONG_T} measured within {LONG_GIB:.0f} GiB: "
            f"{m['peak_gib']:.2f} GiB in {m['time_s']:.0f} s"
        )
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
