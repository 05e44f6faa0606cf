"""Benchmark the estimator and the measurement (prints figures; not a timed test).

1. ``expected_scores`` on (1, H, T, T) logits at T = 4096 against a naive loop that takes
   the mean of each sub-diagonal in turn (``torch.diagonal``), measured side by side in one
   run: median time of each, their ratio, and the peak memory each adds above the input
   (Linux VmHWM, reset before each call, in a fresh process per method).
2. ``measure`` on the shipped checkpoints: wall time of ``measure_checkpoints``.

    python benchmarks/bench_measure.py [--T 4096] [--heads 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from pathlib import Path

import torch

from attnres_helpers.metric import expected_scores


def naive_expected_scores(logits: torch.Tensor) -> torch.Tensor:
    """ŝ[n] one sub-diagonal at a time: the loop that expected_scores replaces."""
    T = logits.shape[-1]
    return torch.stack([torch.diagonal(logits, offset=-n, dim1=-2, dim2=-1).mean(-1) for n in range(T)], dim=-1)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_child(method: str, T: int, heads: int, queue) -> None:
    torch.set_num_threads(1)
    logits = torch.randn(1, heads, T, T).tril()  # the input, allocated before the baseline
    fn = expected_scores if method == "vectorised" else naive_expected_scores
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _rss_kib("VmRSS:")
    fn(logits)
    queue.put(_rss_kib("VmHWM:") - base)


def peak_memory_mib(method: str, T: int, heads: int) -> float | None:
    """Peak RSS the method adds above its input, in MiB (None where /proc cannot be reset)."""
    try:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_peak_child, args=(method, T, heads, queue))
        proc.start()
        proc.join()
        return queue.get(timeout=5) / 1024
    except Exception:  # noqa: BLE001 - a benchmark reports what it cannot measure
        return None


def median_time(fn, arg, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-checkpoints", action="store_true", help="only the estimator benchmark")
    args = ap.parse_args(argv)

    logits = torch.randn(1, args.heads, args.T, args.T).tril()
    input_mib = logits.numel() * logits.element_size() / 2**20
    torch.testing.assert_close(expected_scores(logits), naive_expected_scores(logits), atol=1e-5, rtol=1e-4)
    fast = median_time(expected_scores, logits, args.repeats)
    slow = median_time(naive_expected_scores, logits, args.repeats)
    print(
        f"expected_scores on (1, {args.heads}, {args.T}, {args.T}) float32 ({input_mib:.0f} MiB), "
        f"{torch.get_num_threads()} threads, median of {args.repeats}:"
    )
    print(f"  vectorised  {fast * 1e3:8.1f} ms")
    print(f"  naive loop  {slow * 1e3:8.1f} ms")
    print(f"  speed-up (naive / vectorised): {slow / fast:.2f}x")
    for method in ("vectorised", "naive"):
        peak = peak_memory_mib(method, args.T, args.heads)
        shown = "n/a" if peak is None else f"{peak:.0f} MiB ({peak / input_mib:.2f}x the input)"
        print(f"  peak memory above the input, {method:10s}: {shown}")

    if not args.skip_checkpoints:
        from attnres_helpers.experiments import CHECKPOINTS, measure_checkpoints, verify_checkpoints

        try:
            verify_checkpoints(CHECKPOINTS)
        except (FileNotFoundError, ValueError) as err:  # none shipped, or a reproduce run is rewriting them
            print(f"measure_checkpoints not timed: {err}")
            return
        t0 = time.perf_counter()
        profiles = measure_checkpoints(progress=False)
        print(
            f"measure_checkpoints on the shipped checkpoints: {time.perf_counter() - t0:.1f} s "
            f"for {len(profiles)} profiles ({len({p.run for p in profiles})} checkpoints)"
        )


if __name__ == "__main__":
    main()
