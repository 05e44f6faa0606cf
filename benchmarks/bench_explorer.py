"""Both explorers, timed in-process, side by side in one run, against their targets.

1. The design-time explorer at N = 2L distances: the curve and R pair against a naive loop
   implementation (the same numbers), then a change through the widget (traitlets, readout,
   redraw) in single and compare mode: scale moves and L steps, each to a value not seen before
   (so every step redraws what a slider drag redraws), against targets of 50 ms and 100 ms.
2. The trained-model explorer on the shipped store: a change of BCA, of the eval length, of the
   layer, of the head and of the encoding, each through the widget, against a target of 150 ms;
   beside it, the same figure redrawn in full (canvas.draw and PIL's PNG encoder), as the explorer
   drew before it blitted.
3. A burst of five changes inside a running event loop (as in a kernel): how many plots it draws.

    .venv/bin/python benchmarks/bench_explorer.py            # N = 4096, RoPE
    .venv/bin/python benchmarks/bench_explorer.py --N 8192 --encoding xpos

Not a timed test: wall times depend on the machine and on what else runs on it. Every line gives
the median and minimum wall time and the median CPU time of this process; on a loaded machine the
wall time waits for a core, so compare ratios and CPU times, and read the load average printed.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import os
import statistics
import time

import numpy as np
import torch
from PIL import Image

from attnres_helpers.encodings import curve_resolution, default_params, score_curve
from attnres_helpers.widgets import (
    DEFAULT_STORE,
    NO_BCA_REASON,
    REDRAW_DELAY_S,
    TrainedFigure,
    explorer,
    find_by_class,
    trained_catalogue,
    trained_explorer,
    trained_state,
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


class Timings:
    """Wall and CPU seconds of repeated calls, collected in interleaved rounds."""

    def __init__(self):
        self.wall, self.cpu = [], []

    def run(self, fn, repeats: int) -> None:
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            self.wall.append(time.perf_counter() - start)
            self.cpu.append(time.process_time() - start_cpu)

    @property
    def median_ms(self) -> float:
        return 1e3 * statistics.median(self.wall)

    def line(self) -> str:
        return (
            f"median {self.median_ms:7.2f} ms, min {1e3 * min(self.wall):7.2f} ms wall; "
            f"CPU median {1e3 * statistics.median(self.cpu):7.2f} ms"
        )


def walk(values):
    """An endless iterator over ``values``, forward then back without repeating an end (a slider
    dragged to and fro: every step is a change)."""
    values = list(values)
    while True:
        yield from values[:-1]
        yield from values[:0:-1]


def setter(ui, css_class: str, values):
    control, it = find_by_class(ui, css_class), walk(values)

    def step():
        control.value = next(it)

    return step


def full_redraw(figure: TrainedFigure, state: dict) -> bytes:
    """The trained figure set up for ``state``, then drawn in full and encoded by PIL, as the
    explorer drew on every change before it blitted (it also rebuilt every artist then)."""
    figure.render(state)
    figure.fig.canvas.draw()
    width, height = figure.fig.canvas.get_width_height()
    buffer = io.BytesIO()
    Image.frombuffer("RGBA", (width, height), figure.fig.canvas.buffer_rgba(), "raw", "RGBA", 0, 1).convert("RGB").save(
        buffer, format="png", compress_level=1
    )
    return buffer.getvalue()


def burst_draws(ui, css_class: str, values) -> int:
    """Plots drawn for a burst of changes made inside a running event loop, as in a kernel."""
    control, before = find_by_class(ui, css_class), ui.drawer.drawn

    async def burst():
        for value in values:
            control.value = value
        await asyncio.sleep(4 * REDRAW_DELAY_S)

    asyncio.run(burst())
    return ui.drawer.drawn - before


def verdict(t: Timings, target_s: float) -> str:
    return f"{'under' if t.median_ms < 1e3 * target_s else 'OVER'} {1e3 * target_s:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--N", type=int, default=4096, help="distances drawn and used for R(2L); L = N/2 (default 4096)"
    )
    parser.add_argument("--encoding", default="rope", help="design-time encoding for the widget timings (default rope)")
    parser.add_argument("--repeats", type=int, default=30, help="timed changes of each kind (default 30)")
    parser.add_argument("--naive-repeats", type=int, default=5)
    args = parser.parse_args()
    if args.N < 4 or args.N % 2 or args.N // 2 > 2048 or args.N // 2 < 16 + 16 * args.repeats // 2:
        parser.error(f"--N must be even, with L = N/2 in [{16 + 16 * args.repeats // 2}, 2048] for this many repeats")
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    L = args.N // 2
    rope = default_params("rope")
    naive, fast = naive_pair(L, rope), vectorised_pair(L, rope)
    if not np.allclose(naive, fast, rtol=1e-9, atol=1e-12):
        raise SystemExit(f"naive {naive} and vectorised {fast} disagree")

    # 1. design-time explorer: every step goes to a value not seen just before
    single, compare = explorer(args.encoding, L), explorer(args.encoding, L)
    find_by_class(compare, "attnres-mode").value = "compare"
    scale = find_by_class(single, "attnres-slider-scale")
    scales = [scale.value + k * scale.step for k in range(1, args.repeats + 1)]
    lengths = [L - 16 * k for k in range(1, args.repeats // 2 + 1)]
    design = {name: Timings() for name in ("naive", "vectorised", "scale", "L single", "L compare")}
    steps = {
        "scale": setter(single, "attnres-slider-scale", scales),
        "L single": setter(single, "attnres-slider-L", lengths),
        "L compare": setter(compare, "attnres-slider-L", lengths),
    }
    for step in steps.values():
        step()  # warm-up: imports, caches, the first Agg draw
    per_round = max(1, args.repeats // args.naive_repeats)
    for _ in range(args.naive_repeats):  # interleaved rounds: load from other processes hits every side alike
        design["naive"].run(lambda: naive_pair(L, rope), 1)
        design["vectorised"].run(lambda: vectorised_pair(L, rope), per_round)
        for name, step in steps.items():
            design[name].run(step, per_round)

    # 2. trained explorer
    ui = trained_explorer()
    catalogue = trained_catalogue(DEFAULT_STORE)
    trained_steps = {
        "BCA on/off": setter(ui, "attnres-t-bca", [True, False]),
        "eval length": setter(ui, "attnres-t-eval", catalogue["eval_multiples"]),
        "layer": setter(ui, "attnres-t-layer", ["mean", *range(catalogue["layers"])]),
        "head": setter(ui, "attnres-t-head", ["mean", *range(catalogue["heads"])]),
        "encoding": setter(ui, "attnres-t-encoding", [e for e in catalogue["encodings"] if e not in NO_BCA_REASON]),
    }
    trained = {name: Timings() for name in (*trained_steps, "full redraw")}
    redraw_figure = TrainedFigure()
    states = [
        trained_state(catalogue, "rope", 0, "mean", "mean", k, b)
        for k in catalogue["eval_multiples"]
        for b in (False, True)
    ]
    redraws = walk(states)
    full_redraw(redraw_figure, states[0])  # warm-up, and the first step of each walk (its value is already set)
    for step in trained_steps.values():
        step()
    for _ in range(args.naive_repeats):
        for name, step in trained_steps.items():
            trained[name].run(step, per_round)
        trained["full redraw"].run(lambda: full_redraw(redraw_figure, next(redraws)), per_round)
    everything = Timings()
    for name in trained_steps:
        everything.wall += trained[name].wall
        everything.cpu += trained[name].cpu

    # 3. bursts
    design_burst = burst_draws(single, "attnres-slider-L", [L - 16, L - 32, L - 48, L - 64, L - 80])
    trained_burst = burst_draws(ui, "attnres-t-eval", [1, 4, 2, 1, 4])

    load_after = os.getloadavg()[0]
    print(
        f"load average over the last minute: {load_before:.1f} before, {load_after:.1f} after, "
        f"on {os.cpu_count()} cores"
    )
    print(f"\n1. design-time explorer, N = {args.N} distances (L = {L}), encoding {args.encoding!r}")
    print(f"R(L), R(2L) at RoPE defaults: {fast[0]:.6f}, {fast[1]:.6f} (naive and vectorised agree)")
    print(f"  curve + R pair, naive loops        : {design['naive'].line()}")
    print(f"  curve + R pair, vectorised         : {design['vectorised'].line()}")
    print(f"  naive / vectorised: {design['naive'].median_ms / design['vectorised'].median_ms:.0f}x (medians)")
    print(f"  scale move, single mode            : {design['scale'].line()}   {verdict(design['scale'], 0.050)}")
    print(f"  L step, single mode                : {design['L single'].line()}   {verdict(design['L single'], 0.050)}")
    print(
        f"  L step, compare mode (6 encodings) : {design['L compare'].line()}   {verdict(design['L compare'], 0.100)}"
    )
    print(f"  compare / single L step: {design['L compare'].median_ms / design['L single'].median_ms:.2f}x (medians)")
    print(
        f"\n2. trained-model explorer, {catalogue['path'].rsplit('/', 1)[-1]} "
        f"(T up to {max(catalogue['eval_multiples'])}L "
        f"= {max(catalogue['eval_multiples']) * catalogue['train_len']})"
    )
    for name in trained_steps:
        print(f"  {name:<13} change             : {trained[name].line()}   {verdict(trained[name], 0.150)}")
    print(f"  every change above                 : {everything.line()}   {verdict(everything, 0.150)}")
    print(f"  full redraw of the figure (before) : {trained['full redraw'].line()}")
    cheap = statistics.median([trained["BCA on/off"].median_ms, trained["eval length"].median_ms])
    print(f"  full redraw / BCA or length change: {trained['full redraw'].median_ms / cheap:.1f}x (medians)")
    print(
        f"\n3. a burst of 5 changes inside a running event loop draws {design_burst} design-time plot(s) and "
        f"{trained_burst} trained plot(s) (the last change; the readout follows every one)"
    )


if __name__ == "__main__":
    main()
