"""The design-time path for all 16 configurations beside one measured window, side by side in one run.

    python benchmarks/bench_design_time.py [--train-len 512] [--rounds 2] [--threads N] [--measured as-trained]
    python benchmarks/bench_design_time.py --widget [--threads 1]

``--widget`` times notebook 10's path instead, from the shipped design-time store and no model: all 16
configurations at L = 8192 and 2L, then the explorer's every change (each family's parameter stepped along its
slider, and the layer): the state (the design-time pair at L and 2L over 30 layers) and the figure, each
printed with its median and max and the load. Not a timed test.

The model is SmolLM2-135M (``make pretrained`` first); ``--train-len`` sets L (the configurations' sizes are
fractions of it) and T = 2L (default L = 512, T = 1024: a short run). Both paths run in this process on one
loaded model, over plan v4's window 0:

- **design time** (issue 41, :mod:`attnres_helpers.hf.design_time`): one pass of the model as trained at L
  and its content correlations, then the design-time ŝ and R pair at 2L of every one of the 16
  configurations (each configuration's form read from the rotary module it gives the model);
- **measured** (plan v4, :func:`attnres_helpers.hf.configured.measure_window`): one window of 2L under
  ``--measured`` (attention by query blocks or the fused kernel, ŝ and key-0 scores by FFT, entropy, NLL,
  passkey). Plan v4's store takes 16 configurations × 8 windows of these at 2L, and 8 windows at L for
  each configuration that differs there.

Per round the order is design, measured, measured, design (ABBA over two rounds), so that a machine that
speeds up or slows down weighs on both; each run prints its wall time and the load average before it, and
the end prints the sums and their ratio. Not a timed test: the numbers depend on the machine and on what
else runs on it (on a shared 2-core machine a load above 2 means waiting for a core).
"""

from __future__ import annotations

import argparse
import os
import time


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-len", type=int, default=512, help="L; T = 2L (default 512)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; two make the ABBA order (default 2)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0: torch's default")
    parser.add_argument("--measured", default="as-trained", help="the configuration of the measured window")
    parser.add_argument("--widget", action="store_true", help="time notebook 10's store path and explorer instead")
    args = parser.parse_args()
    if args.widget:
        widget(args.threads)
        return

    import torch

    from attnres_helpers import design_time as dt
    from attnres_helpers import passkey
    from attnres_helpers.data import eval_windows
    from attnres_helpers.hf import configured, fetch
    from attnres_helpers.hf import design_time as hf_dt
    from attnres_helpers.hf.configurations import CONFIGURATIONS
    from attnres_helpers.hf.folders import load_tokenizer
    from attnres_helpers.hf.models import SMOLLM2

    if args.threads:
        torch.set_num_threads(args.threads)
    L, T = args.train_len, 2 * args.train_len
    model, tokenizer = fetch.load(SMOLLM2), load_tokenizer(fetch.model_dir(SMOLLM2))
    ids = configured.corpus_ids(tokenizer)
    tokenize = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    try:
        layout = configured.window_layout(ids, T, L, 0, configured.N_WINDOWS, tokenize)
        trials = "plan v4's passkey trials"
    except ValueError:  # plan v4's distances (L/16 … 1.9L) do not fit a short window: its controls only
        text_2l = eval_windows(ids, T, configured.N_WINDOWS)[0]
        layout, trials = passkey.layout(text_2l, tokenize, (), seed=T), "2 ceiling and 2 absent passkey trials"
    text = hf_dt.text_windows(tokenizer, L)[0]
    print(f"SmolLM2-135M, L = {L}, T = {T}, {torch.get_num_threads()} threads; measured: {args.measured}, {trials}")

    def design() -> dict:
        start = time.perf_counter()
        corr = hf_dt.correlations(model, [text], L)
        passed = time.perf_counter()
        for c in CONFIGURATIONS.values():
            s_hat, free = dt.design_s_hat(corr, hf_dt.form(model, c, L, T), T)
            dt.r_pair(s_hat, free)
        done = time.perf_counter()
        return {"time_s": done - start, "pass_s": passed - start, "configurations_s": done - passed}

    def measured() -> dict:
        start = time.perf_counter()
        configured.measure_window(model, layout, CONFIGURATIONS[args.measured], L)
        return {"time_s": time.perf_counter() - start}

    totals = {"design": 0.0, "measured": 0.0}
    for r in range(args.rounds):
        order = ("design", "measured") if r % 2 == 0 else ("measured", "design")
        for kind in order:
            before = load()
            out = design() if kind == "design" else measured()
            totals[kind] += out["time_s"]
            extra = (
                f" (pass and correlations at L {out['pass_s']:.2f} s, "
                f"16 configurations {out['configurations_s']:.2f} s)"
                if kind == "design"
                else f" (one window of {T} under {args.measured})"
            )
            print(f"round {r}: {kind:8s} {out['time_s']:7.2f} s{extra}; {before}")
    ratio = totals["measured"] / totals["design"]
    print(
        f"sums over {args.rounds} rounds: design time (all 16 configurations) {totals['design']:.2f} s, "
        f"one measured window {totals['measured']:.2f} s: one measured window takes {ratio:.2f}x the whole "
        f"design-time path; plan v4's {len(CONFIGURATIONS)} x {configured.N_WINDOWS} windows at 2L take about "
        f"{ratio * len(CONFIGURATIONS) * configured.N_WINDOWS:.0f}x it; {load()}"
    )


def widget(threads: int) -> None:
    import statistics

    import torch

    from attnres_helpers import design_store
    from attnres_helpers import design_time as dt
    from attnres_helpers.hf.configurations import CONFIGURATIONS
    from attnres_helpers.paths import STORES
    from attnres_helpers.widgets import design_time as w

    if threads:
        torch.set_num_threads(threads)
    start = time.perf_counter()
    store = design_store.load_store(STORES["design_time"])
    corr = store.correlations()
    L = store.train_len
    loaded = time.perf_counter()
    for c in CONFIGURATIONS.values():
        dt.design_lengths(corr, {T: dt.model_form(store.model, c, L, T) for T in (L, 2 * L)})
    done = time.perf_counter()
    print(
        f"from the store ({torch.get_num_threads()} threads): load and interpolate {loaded - start:.2f} s, all "
        f"{len(CONFIGURATIONS)} configurations at L = {L} and 2L {done - loaded:.2f} s; {load()}"
    )
    catalogue = w.design_time_catalogue()
    figure = w.DesignTimeFigure()
    figure.render(w.design_time_state(catalogue, "YaRN", 2.0, 0))  # the first draw and caches, not timed
    states, draws = [], []
    for family in w.FAMILIES.values():
        values = family.values()
        for i, value in enumerate(values[:: max(1, len(values) // 6)]):
            t0 = time.perf_counter()
            state = w.design_time_state(catalogue, family.name, value, 17 if i % 2 else 0)
            t1 = time.perf_counter()
            figure.render(state)
            t2 = time.perf_counter()
            states.append(1e3 * (t1 - t0))
            draws.append(1e3 * (t2 - t1))
    total = [a + b for a, b in zip(states, draws)]
    for what, ms in (("state (readout)", states), ("figure", draws), ("change, both", total)):
        print(f"explorer {what}: median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms over {len(ms)} changes")
    print(f"changes under 150 ms: {sum(t < 150 for t in total)} of {len(total)}; {load()}")


if __name__ == "__main__":
    main()
