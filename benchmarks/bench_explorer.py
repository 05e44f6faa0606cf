"""Time one explorer update at N = 2L distances, against a naive loop implementation, side by side;
then single mode against compare mode, side by side, with their ratio.

An update computes the design-time curve over 0..2L-1, R at L and at 2L, and redraws
the figure. The naive version computes the same curve and the same two R values with
Python loops (no numpy), the way one would write Eq. 3 first; both run in this process,
interleaved, on the same inputs, and must agree. Compare mode (six encodings at their
defaults, overlaid) is timed the same way, through the widget: a step of the L slider in
single mode and in compare mode, interleaved, against targets of 50 ms and 100 ms.

    .venv/bin/python benchmarks/bench_explorer.py            # N = 4096, RoPE defaults
    .venv/bin/python benchmarks/bench_explorer.py --N 8192 --encoding xpos

Not a timed test: the numbers depend on the machine and on what else runs on it
(the median of --repeats runs is reported, and the minimum as the quiet-machine figure).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numpy as np
import torch

from attnres_helpers.encodings import curve_resolution, default_params, score_curve
from attnres_helpers.widgets import (
    COMPARE_DEFAULT, CompareFigure, SingleFigure, compare_readout_html, compare_states, explorer, explorer_state,
    find_by_class, readout_html,
)


def naive_rope_curve(N: int, head_dim: int, base: float, rho: float, scale: float) -> list[float]:
    """s[n] = scale · rho · (2/d) Σ_i cos(n θ_i), one distance and one frequency at a time."""
    thetas = [base ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    return [scale * rho * sum(math.cos(n * theta) for theta in thetas) / len(thetas) for n in range(N)]


def naive_resolution(s: list[float]) -> float:
    """Eq. 3 with e^{s[N]} = 0 ("zero" boundary), max-shifted, one term at a time."""
    top = max(s)
    e = [math.exp(v - top) for v in s]
    total = sum(e)
    p = [v / total for v in e] + [0.0]
    return sum(p[i] * (p[i] - p[i + 1]) for i in range(len(s)))


def naive_pair(L: int, params: dict) -> tuple[float, float]:
    curve = naive_rope_curve(2 * L, **params)
    return naive_resolution(curve[:L]), naive_resolution(curve)


def vectorised_pair(L: int, params: dict) -> tuple[float, float]:
    curve = score_curve("rope", 2 * L, **params)  # (2L,)
    return float(curve_resolution(curve[:L])), float(curve_resolution(curve))


def seconds(fn, repeats: int, cpu: list | None = None) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls after one warm-up; their CPU seconds go to ``cpu``."""
    fn()  # warm-up: imports, caches, the first Agg draw
    times = []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - start_cpu)
    return times


def summary(times: list[float]) -> str:
    return f"median {1e3 * statistics.median(times):7.2f} ms, min {1e3 * min(times):7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--N", type=int, default=4096, help="distances drawn and used for R(2L); L = N/2 (default 4096)")
    parser.add_argument("--encoding", default="rope", help="encoding for the full-update timing (default rope)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--naive-repeats", type=int, default=5)
    args = parser.parse_args()
    if args.N < 4 or args.N % 2:
        parser.error("--N must be an even integer >= 4")
    torch.set_num_threads(1)
    L = args.N // 2
    rope = default_params("rope")

    naive, fast = naive_pair(L, rope), vectorised_pair(L, rope)
    if not np.allclose(naive, fast, rtol=1e-9, atol=1e-12):
        raise SystemExit(f"naive {naive} and vectorised {fast} disagree")

    figure = SingleFigure()
    widget = explorer(args.encoding, L)
    scale = find_by_class(widget, "attnres-slider-scale")
    scale_values = iter(np.tile([scale.value, scale.value + scale.step], 10 * args.repeats))

    def update():
        state = explorer_state(args.encoding, L)
        readout_html(state)
        figure.render(state)

    def slider_update():
        scale.value = float(next(scale_values))

    compare_figure = CompareFigure()

    def compare_update():
        states = compare_states(COMPARE_DEFAULT, L)
        compare_readout_html(states)
        compare_figure.render(states)

    # the L slider, one step back and forth, in a single-mode and a compare-mode widget
    single_ui, compare_ui = explorer(args.encoding, L), explorer(args.encoding, L)
    find_by_class(compare_ui, "attnres-mode").value = "compare"
    steps = {}
    for name, ui in (("single", single_ui), ("compare", compare_ui)):
        length = find_by_class(ui, "attnres-slider-L")
        steps[name] = (length, iter(np.tile([L - length.step, L], 10 * args.repeats)))  # L may be the maximum

    def length_step(name):
        length, values = steps[name]
        length.value = int(next(values))

    # interleaved rounds, so that load from other processes hits every side alike
    t_naive, t_fast, t_update, t_slider, cpu_slider = [], [], [], [], []
    t_compare, t_L_single, t_L_compare, cpu_L_single, cpu_L_compare = [], [], [], [], []
    per_round = max(1, args.repeats // args.naive_repeats)
    for _ in range(args.naive_repeats):
        t_naive += seconds(lambda: naive_pair(L, rope), 1)
        t_fast += seconds(lambda: vectorised_pair(L, rope), per_round)
        t_update += seconds(update, per_round)
        t_slider += seconds(slider_update, per_round, cpu_slider)
        t_compare += seconds(compare_update, per_round)
        t_L_single += seconds(lambda: length_step("single"), per_round, cpu_L_single)
        t_L_compare += seconds(lambda: length_step("compare"), per_round, cpu_L_compare)

    print(f"N = {args.N} distances (L = {L}), encoding {args.encoding!r} for the update, RoPE defaults for the pair")
    print(f"R(L), R(2L) at RoPE defaults: {fast[0]:.6f}, {fast[1]:.6f} (naive and vectorised agree)")
    print(f"curve + R pair, naive loops : {summary(t_naive)}")
    print(f"curve + R pair, vectorised  : {summary(t_fast)}")
    print(
        f"speed-up, naive / vectorised: {statistics.median(t_naive) / statistics.median(t_fast):.1f}x (medians), "
        f"{min(t_naive) / min(t_fast):.1f}x (minima)"
    )
    print(f"one explorer update (curve, R pair, readout, redraw): {summary(t_update)}")
    print(f"one slider move in the widget (the same, through traitlets): {summary(t_slider)}")
    print(f"  its CPU time in this process: {summary(cpu_slider)} (wall minus CPU = waiting for a core)")
    print(f"load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    verdict = "under" if statistics.median(t_slider) < 0.050 else "OVER"
    print(f"target < 50 ms per update at N = 4096: {verdict} (median of the slider moves)")
    print()
    print(f"single against compare mode ({len(COMPARE_DEFAULT)} encodings: {', '.join(COMPARE_DEFAULT)}), L = {L}:")
    print(f"  one update, single mode  (curve, R pair, readout, redraw): {summary(t_update)}")
    print(f"  one update, compare mode (the same for each encoding)   : {summary(t_compare)}")
    print(f"  L slider step in the widget, single mode : {summary(t_L_single)}   (CPU: {summary(cpu_L_single)})")
    print(f"  L slider step in the widget, compare mode: {summary(t_L_compare)}   (CPU: {summary(cpu_L_compare)})")
    ratio = statistics.median(t_L_compare) / statistics.median(t_L_single)
    print(f"  compare / single: {statistics.median(t_compare) / statistics.median(t_update):.2f}x (updates), "
          f"{ratio:.2f}x (slider steps, medians), "
          f"{statistics.median(cpu_L_compare) / statistics.median(cpu_L_single):.2f}x (their CPU times)")
    for name, times, target in (("single", t_L_single, 0.050), ("compare", t_L_compare, 0.100)):
        verdict = "under" if statistics.median(times) < target else "OVER"
        print(f"  target < {1e3 * target:.0f} ms per {name}-mode step: {verdict} (median)")


if __name__ == "__main__":
    main()
