"""Each kind of training-free configuration against the model as trained, side by side in one run: the
time and peak memory of one plan-v4 window measurement at T = 2L, per ABBA round and summed.

    python benchmarks/bench_configurations.py [--train-len 8192] [--rounds 2] [--threads N]
        [--kinds yarn-2,self-extend-8-8,bca,streaming]

The model is SmolLM2-135M (``make pretrained`` first); ``--train-len`` sets L (the configurations' sizes
are fractions of it), and T = 2L. Every case runs in a fresh subprocess that loads the model, lays out
window 0 of T + 1 tokens with plan v4's passkey trials, and times one
:func:`attnres_helpers.hf.configured.measure_window` (the attention by query blocks or the fused causal
kernel, ŝ and key-0 scores by FFT, entropy, NLL, passkey), reading its peak RSS (``ru_maxrss``). For
each kind the order is as-trained, kind, kind, as-trained per two rounds (ABBA), so a machine that drifts
over the minutes of a run weighs on both alike; each round's ratio and the summed ratio are printed.
Goal (issue 40): every kind within 1.2x the model as trained in time.

Not a timed test: the numbers depend on the machine and on what else runs on it.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

GOAL = 1.2


def maxrss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def one(name: str, train_len: int) -> dict:
    """In a child: load the model, window 0 of 2L + 1 tokens, one measurement under ``name``."""
    import torch

    from attnres_helpers.hf import configured, fetch
    from attnres_helpers.hf.configurations import CONFIGURATIONS
    from attnres_helpers.hf.models import SMOLLM2
    from attnres_helpers.hf.pretrained import load_tokenizer

    model, tokenizer = fetch.load(SMOLLM2), load_tokenizer(fetch.model_dir(SMOLLM2))
    T = 2 * train_len
    ids = configured.corpus_ids(tokenizer)
    tokenize = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    layout = configured.window_layout(ids, T, train_len, 0, 8, tokenize)
    loaded = maxrss_gib()
    start = time.perf_counter()
    configured.measure_window(model, layout, CONFIGURATIONS[name], train_len)
    return {
        "time_s": time.perf_counter() - start,
        "peak_gib": maxrss_gib(),
        "loaded_gib": loaded,
        "threads": torch.get_num_threads(),
    }


def child(name: str, train_len: int, threads: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    args = [sys.executable, os.path.abspath(__file__), "--one", name, "--train-len", str(train_len)]
    proc = subprocess.run([*args, "--threads", str(threads)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: {(proc.stderr.strip().splitlines() or [f'exit {proc.returncode}'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-len", type=int, default=8192, help="L (SmolLM2's is 8192); T = 2L")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per kind (even: ABBA)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0: torch's default")
    ap.add_argument("--kinds", default="yarn-2,self-extend-8-8,bca,streaming", help="one configuration per kind")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.one:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(one(args.one, args.train_len)))
        return
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    print(f"SmolLM2-135M, L = {args.train_len}, T = {2 * args.train_len}, one window per case, fresh process")
    print(f"load average {load_before:.1f} on {os.cpu_count()} CPUs")
    print(f"{'kind':>18}  {'round':>5}  {'as-trained s':>12}  {'kind s':>8}  {'ratio':>6}  {'GiB (a / k)':>12}")
    verdicts = []
    for name in args.kinds.split(","):
        sums = {"a": 0.0, "k": 0.0}
        peaks = {"a": 0.0, "k": 0.0}
        for r in range(args.rounds):
            order = ("as-trained", name) if r % 2 == 0 else (name, "as-trained")
            got = {n: child(n, args.train_len, args.threads) for n in order}
            a, k = got["as-trained"], got[name]
            sums["a"] += a["time_s"]
            sums["k"] += k["time_s"]
            peaks = {"a": max(peaks["a"], a["peak_gib"]), "k": max(peaks["k"], k["peak_gib"])}
            print(
                f"{name:>18}  {r + 1:>5}  {a['time_s']:>12.1f}  {k['time_s']:>8.1f}  "
                f"{k['time_s'] / a['time_s']:>5.2f}x  {a['peak_gib']:>5.2f} / {k['peak_gib']:.2f}"
            )
        ratio = sums["k"] / sums["a"]
        print(
            f"{name:>18}    sum  {sums['a']:>12.1f}  {sums['k']:>8.1f}  {ratio:>5.2f}x  "
            f"{peaks['a']:>5.2f} / {peaks['k']:.2f}"
        )
        verdicts.append(f"{'PASS' if ratio <= GOAL else 'FAIL'}  {name} within {GOAL}x as trained: {ratio:.2f}x")
    print("\n".join(verdicts))
    total = time.perf_counter() - start
    print(f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; total {total:.0f} s")


if __name__ == "__main__":
    main()
