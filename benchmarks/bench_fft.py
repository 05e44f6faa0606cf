"""ŝ of one layer by FFT (metric.expected_scores_fft) against the explicit score-matrix path
(metric.expected_scores), side by side in one run: time and peak extra memory, and their ratios.

    python benchmarks/bench_fft.py [--lengths 1024 4096 16384] [--heads 4] [--head-dim 32] [--explicit-max 4096]

The explicit path builds (H, T, T) scores, so it runs only up to --explicit-max; the FFT path
needs O(T · d) memory per head. The memory columns are the sizes of the largest tensors each path
allocates, computed from their shapes (CPU torch keeps no allocator statistics).
"""

import argparse
import math
import time

import torch

from attnres_helpers.metric import expected_scores, expected_scores_fft


def explicit(q, k):
    T = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return expected_scores(scores).mean(0)


def timed(fn, *args, repeats=3):
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--explicit-max", type=int, default=4096)
    args = ap.parse_args(argv)
    H, d = args.heads, args.head_dim
    print(f"one window, {H} heads of {d}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"{'T':>6}  {'fft ms':>8}  {'explicit ms':>11}  {'time ratio':>10}  {'fft MB':>7}  "
        f"{'explicit MB':>11}  {'max rel diff':>12}"
    )
    for T in args.lengths:
        g = torch.Generator().manual_seed(T)
        q, k = torch.randn(1, H, T, d, generator=g), torch.randn(1, H, T, d, generator=g)
        n_fft = 1 << (2 * T - 1).bit_length()
        fft_mb = 2 * H * (n_fft // 2 + 1) * d * 16 / 2**20  # two complex128 spectra (H, F, d)
        t_fft, s_fft = timed(expected_scores_fft, q, k)
        if T <= args.explicit_max:
            t_exp, s_exp = timed(explicit, q, k)
            exp_mb = 2 * H * T * T * 4 / 2**20  # the float32 scores and their masked copy
            diff = float(((s_fft - s_exp).abs() / s_exp.abs().clamp(min=1)).max())
            print(
                f"{T:>6}  {t_fft * 1e3:>8.1f}  {t_exp * 1e3:>11.1f}  {t_exp / t_fft:>9.1f}x  {fft_mb:>7.1f}  "
                f"{exp_mb:>11.1f}  {diff:>12.1e}"
            )
        else:
            print(
                f"{T:>6}  {t_fft * 1e3:>8.1f}  {'(skipped)':>11}  {'':>10}  {fft_mb:>7.1f}  "
                f"{2 * H * T * T * 4 / 2**20:>11.1f}  {'':>12}"
            )


if __name__ == "__main__":
    main()
