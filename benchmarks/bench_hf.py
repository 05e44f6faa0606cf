"""ŝ of one Hugging Face Llama-shaped layer (4 heads of 32) by FFT against the explicit score-matrix
path, through ``hf.layer_s_hat``, side by side in one run: time (best of 3), peak extra
memory, their ratios, and the max relative difference where both run; then the targets as PASS/FAIL.

    python benchmarks/bench_hf.py [--lengths 1024 4096 16384] [--explicit-max 4096] [--big 65536] [--threads N]

First, a correctness check at a short T: q and k captured (``hf.capture``) from a tiny `transformers`
Llama built from config (``hf.HFConfig("llama")``, ``hf.build``: random weights, nothing downloaded),
ŝ of every layer by both methods. Then, for the long lengths, random q and k of the captured shape
(1, 4, T, 32) with the captured scaling 1/√32. The explicit path builds (H, T, T) scores, so it runs
only up to --explicit-max.

Each (method, T) case runs in a fresh subprocess (``bench_hf.py --one fft 4096``) that builds its
inputs, reads ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, calls the method once and reads it again:
the difference is the peak memory the call added (MiB). Then it times two more calls; best of the
three. Linux carries a process's ru_maxrss over from the process that started it (across fork and
exec), so this parent imports neither torch nor the package (every torch step, the correctness check
and the comparison included, runs in a child) and stays far below a child's RSS after its imports.
A child whose ru_maxrss before the call is still above its current RSS marks its figure ">=": a
lower bound (the call's peak may hide under the old mark).

--threads sets torch's CPU threads in every child (0, the default: torch's own choice). On a machine
busy with other work, more threads than free cores make each small op wait for a descheduled thread,
which costs the FFT path (many small ops) far more than the explicit one (a few large ones).

Targets: FFT >= 10x faster than explicit at T = 4096; T = --big (65536) by FFT in <= 5 s and < 1 GiB.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HEADS, HEAD_DIM = 4, 32  # hf.HFConfig("llama"): d_model 128, 4 heads
SPEEDUP_T, SPEEDUP_TARGET = 4096, 10.0
BIG_TIME_S, BIG_MEM_MIB = 5.0, 1024.0
METHODS = ("fft", "explicit")  # hf.METHODS


# --------------------------------------------------------------------------- in a child process


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def rss_mib() -> float:
    """The current resident set (VmRSS), MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def rel_diff(a, b) -> float:
    """max |a − b| / max(|b|, 1), as bench_fft.py."""
    return float(((a - b).abs() / b.abs().clamp(min=1)).max())


def random_layer(T: int):
    """Random q, k (1, 4, T, 32), seeded by T (both methods see the same), at Llama's scaling 1/√32."""
    import torch

    from attnres_helpers import hf

    g = torch.Generator().manual_seed(T)
    q, k = torch.randn(1, HEADS, T, HEAD_DIM, generator=g), torch.randn(1, HEADS, T, HEAD_DIM, generator=g)
    return hf.LayerQK(q, k, HEAD_DIM**-0.5)


def one(method: str, T: int, repeats: int, save: str | None, compare: str | None) -> dict:
    """One case in this (fresh) process: {"time_s", "mem_mib", "lower_bound"[, "diff"]}; ŝ to ``save``
    if given; the max relative difference from the ŝ stored in ``compare`` (after the timing) if given."""
    import torch

    from attnres_helpers import hf

    if method not in METHODS:
        raise SystemExit(f"--one: method must be one of {', '.join(METHODS)}, got {method!r}")
    layer = random_layer(T)
    before, resident = maxrss_mib(), rss_mib()
    t = time.perf_counter()
    s_hat = hf.layer_s_hat(layer, method)
    best = time.perf_counter() - t
    result = {"time_s": 0.0, "mem_mib": maxrss_mib() - before, "lower_bound": before > resident + 1}
    for _ in range(repeats - 1):
        del s_hat
        t = time.perf_counter()
        s_hat = hf.layer_s_hat(layer, method)
        best = min(best, time.perf_counter() - t)
    result["time_s"] = best
    if save:
        torch.save(s_hat.double().clone(), save)
    if compare:
        result["diff"] = rel_diff(s_hat.double(), torch.load(compare))
    return result


def correctness(T: int) -> dict:
    """ŝ of every layer of a tiny Llama (captured q, k) by FFT and explicitly: the max relative difference."""
    import torch

    from attnres_helpers import hf

    torch.manual_seed(0)
    cfg = hf.HFConfig("llama")
    model = hf.build(cfg)
    _, layers = hf.capture(model, torch.randint(0, cfg.vocab_size, (2, T)))
    q = layers[0].q
    if tuple(q.shape[1:]) != (HEADS, T, HEAD_DIM) or layers[0].allowed is not None:
        raise SystemExit(
            f"unexpected capture: q {tuple(q.shape)}, mask {'causal' if layers[0].allowed is None else 'set'}"
        )
    diff = max(rel_diff(hf.layer_s_hat(layer, "fft"), hf.layer_s_hat(layer, "explicit")) for layer in layers)
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "n_layer": cfg.n_layer,
        "scaling": layers[0].scaling,
        "B": q.shape[0],
        "diff": diff,
    }


# --------------------------------------------------------------------------- the parent (no torch)


def child(args: list[str], threads: int) -> dict:
    """This script in a fresh subprocess; its JSON line, or {"error": ...} if it failed (out of memory...)."""
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *args, "--threads", str(threads)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def case(method: str, T: int, repeats: int, threads: int, save: str | None = None, compare: str | None = None):
    args = ["--one", method, str(T), "--repeats", str(repeats)]
    args += ["--save", save] if save else []
    args += ["--compare", compare] if compare else []
    return child(args, threads)


def ok(r: dict | None) -> bool:
    return r is not None and "error" not in r


def fmt_ms(r: dict | None) -> str:
    if r is None:
        return "(skipped)"
    return f"{r['time_s'] * 1e3:.1f}" if ok(r) else "(failed)"


def fmt_mib(r: dict | None) -> str:
    return (">=" if r["lower_bound"] else "") + f"{r['mem_mib']:.1f}" if ok(r) else ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--explicit-max", type=int, default=4096, help="longest T the explicit path runs at")
    ap.add_argument("--big", type=int, default=65536, help="the long-context target's T (FFT only); 0: skip")
    ap.add_argument("--check-len", type=int, default=256, help="T of the captured-Llama correctness check")
    ap.add_argument("--repeats", type=int, default=3, help="calls per case; the best time is reported")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads in every case; 0: torch's default")
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "T"), help=argparse.SUPPRESS)
    ap.add_argument("--check", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--compare", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one or args.check:  # a child
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        result = (
            correctness(args.check)
            if args.check
            else one(args.one[0], int(args.one[1]), args.repeats, args.save, args.compare)
        )
        print(json.dumps(result))
        return

    start = time.perf_counter()
    check = child(["--check", str(args.check_len)], args.threads)
    if not ok(check):
        raise SystemExit(f"the correctness check failed: {check['error']}")
    print(
        f"one layer, {HEADS} heads of {HEAD_DIM}, B = 1, torch {check['torch']}, {check['threads']} threads, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"capture check: tiny transformers Llama ({check['n_layer']} layers, {HEADS} heads of {HEAD_DIM}), "
        f"B = {check['B']}, T = {args.check_len}, scaling {check['scaling']:.4f}: "
        f"max rel diff fft vs explicit over all layers {check['diff']:.1e}"
    )
    print(
        f"time: best of {args.repeats}; memory: peak extra RSS of the first call "
        "(ru_maxrss delta, fresh process per case)"
    )
    print(
        f"{'T':>6}  {'fft ms':>8}  {'explicit ms':>11}  {'time ratio':>10}  {'fft MiB':>8}  "
        f"{'explicit MiB':>12}  {'mem ratio':>9}  {'max rel diff':>12}"
    )
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for T in args.lengths:
            saved = os.path.join(tmp, f"fft-{T}.pt")
            f = case("fft", T, args.repeats, args.threads, save=saved)
            e = None
            if T <= args.explicit_max:
                e = case("explicit", T, args.repeats, args.threads, compare=saved if ok(f) else None)
            results[T] = f, e
            time_ratio = mem_ratio = diff = ""
            if ok(f) and ok(e):
                time_ratio = f"{e['time_s'] / f['time_s']:.1f}x"
                mem_ratio = f"{e['mem_mib'] / f['mem_mib']:.1f}x" if f["mem_mib"] > 0 and not f["lower_bound"] else "-"
                diff = f"{e['diff']:.1e}"
            print(
                f"{T:>6}  {fmt_ms(f):>8}  {fmt_ms(e):>11}  {time_ratio:>10}  {fmt_mib(f):>8}  "
                f"{fmt_mib(e):>12}  {mem_ratio:>9}  {diff:>12}".rstrip()
            )
            for name, r in (("fft", f), ("explicit", e)):
                if r is not None and not ok(r):
                    print(f"        {name} failed: {r['error']}")
    big = case("fft", args.big, args.repeats, args.threads) if args.big else None
    if big is not None:
        print(f"{args.big:>6}  {fmt_ms(big):>8}  {'(skipped)':>11}  {'':>10}  {fmt_mib(big):>8}")
        if not ok(big):
            print(f"        fft failed: {big['error']}")

    print("targets:")
    f, e = results.get(SPEEDUP_T, (None, None))
    if not (ok(f) and ok(e)):
        print(
            f"FAIL  FFT >= {SPEEDUP_TARGET:.0f}x faster than explicit at T = {SPEEDUP_T}: not measured "
            f"(needs {SPEEDUP_T} in --lengths and --explicit-max >= {SPEEDUP_T})"
        )
    else:
        ratio = e["time_s"] / f["time_s"]
        print(
            f"{'PASS' if ratio >= SPEEDUP_TARGET else 'FAIL'}  FFT >= {SPEEDUP_TARGET:.0f}x faster than explicit "
            f"at T = {SPEEDUP_T}: {ratio:.1f}x"
        )
    what = f"T = {args.big} for a {HEADS}-head layer by FFT"
    if big is None:
        print("FAIL  T = 65536 by FFT: not measured (--big 0)")
    elif not ok(big):
        print(f"FAIL  {what}: failed ({big['error']})")
    else:
        print(
            f"{'PASS' if big['time_s'] <= BIG_TIME_S else 'FAIL'}  {what} in <= {BIG_TIME_S:.0f} s: "
            f"{big['time_s']:.2f} s"
        )
        fits = big["mem_mib"] < BIG_MEM_MIB and not big["lower_bound"]
        print(f"{'PASS' if fits else 'FAIL'}  {what} in < 1 GiB extra memory: {fmt_mib(big)} MiB")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
