"""Plan v4's per-window numbers recomputed from the window files by separate code, and compared with the store.

    python scripts/recompute_v4.py --work runs/configurations-v4/smollm2-135m-instruct
        [--store data/results/configurations_v4.safetensors]

A trust check (issue 40): the path from window files to the notebook's numbers goes through the store's
builder, its int16 codes, its block sums and :func:`attnres_helpers.plan_v4.per_window`. This script
takes the other path. It reads every window file with numpy and safetensors alone and writes the plan's
definitions out again (``data/results/configurations_plan_v4.md``): R (Eq. 3, boundary zero, -inf
distances carry no weight) of each layer's ŝ of the window, and without the first-token entries
(each distance's pair (n, 0) taken out of its mean, where the mask allows it: the pair counts come from
the mask written in the file's settings, counted here pair by pair); exact match (all five digits)
pooled by trial kind, distance (near: d < L, far: d >= L) and where the query sits; the mean NLL of the
text positions (the written sentences left out) before and past L; the attention entropy past L. A
configuration the run measured at 2L only takes the model as trained's windows of L. ``attnres_helpers``
is imported only to read what it checks: the store, through ``plan_v4.per_window``.

It also recomputes R of every layer of the window-mean ŝ, with and without the first-token entries, and
compares it with R of the store's int16 codes (``attnres results``' per-layer R). Every (configuration,
quantity, window) and every (configuration, T, layer) the store holds is one check; it prints the count
and each mismatch, and exits 1 if there is one. Tolerances: exact for pass rates; relative 1e-4 for a
window's R (float32 in the files, float64 here) and 1e-3 for R of the stored codes (the int16 step);
absolute 1e-4 nats for NLL and entropy (float32 sums over blocks).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from safetensors import safe_open

KEY_DIGITS = 5  # the passkey's digits: exact match is all of them right
TOLERANCE = {"R": ("rel", 1e-4), "R of stored ŝ": ("rel", 1e-3), "pass": ("abs", 0.0), "nats": ("abs", 1e-4)}


def resolution(s: np.ndarray) -> float:
    """Eq. 3 with p_N = 0: Σ_i p_i (p_i − p_{i+1}), p the softmax of s over its finite entries."""
    finite = np.isfinite(s)
    p = np.zeros_like(s, dtype=np.float64)
    p[finite] = np.exp(s[finite] - s[finite].max())
    p /= p.sum()
    return float(np.sum(p * (p - np.append(p[1:], 0.0))))


def allowed(mask: dict, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Whether query i may attend to key j, from the mask as the settings write it."""
    ok = j <= i
    if mask["kind"] == "bca":
        ok &= j >= (i // mask["size"] - 1) * mask["size"]
    elif mask["kind"] == "window":
        ok &= i - j < mask["size"]
    return ok | ((j < mask["sinks"]) & (j <= i))


def pair_counts(mask: dict, T: int) -> np.ndarray:
    """Allowed pairs at each distance n, counted pair by pair (no closed form)."""
    counts = np.zeros(T)
    for n in range(T):
        i = np.arange(n, T)
        counts[n] = allowed(mask, i, i - n).sum()
    return counts


def sink_free(s_hat: np.ndarray, key0: np.ndarray, counts: np.ndarray, mask: dict) -> np.ndarray:
    """ŝ without the pair (n, 0) at each distance n where the mask allows it: (layers, T)."""
    n = np.arange(s_hat.shape[-1])
    has = allowed(mask, n, np.zeros_like(n))
    left = counts - has
    with np.errstate(invalid="ignore"):
        out = (counts * s_hat - np.where(has, key0, 0.0)) / np.where(left > 0, left, 1)
    return np.where(left > 0, out, -np.inf)


def read(path: Path) -> tuple[dict[str, np.ndarray], dict, list[dict]]:
    """A window file's tensors, its settings and its trials as they were placed (one open)."""
    with safe_open(path, framework="numpy") as f:
        tensors, meta = {name: f.get_tensor(name) for name in f.keys()}, f.metadata()
    return tensors, json.loads(meta["settings"]), json.loads(meta["trials"])


def head_means(t: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A window's ŝ and key-0 scores, (layers, T) float64 each (the files keep their head means)."""
    return t["s_hat"][:, 0].astype(np.float64), t["key0"][:, 0].astype(np.float64)


def layer_r(s_hat: np.ndarray, key0: np.ndarray, mask: dict, counts_of) -> tuple[np.ndarray, np.ndarray]:
    """R of each layer's ŝ (layers, T), with and without the first-token entries."""
    free = sink_free(s_hat, key0, counts_of(mask, s_hat.shape[-1]), mask)
    return np.array([resolution(s) for s in s_hat]), np.array([resolution(s) for s in free])


def window_values(window: tuple, counts_of) -> dict[str, float]:
    """One window's quantities (:func:`read`'s tensors, settings and trials), as the plan defines them."""
    t, settings, trials = window
    T, L, mask = settings["T"], settings["train_len"], settings["mask"]
    tag = "L" if T == L else "2L"
    with_sink, without = layer_r(*head_means(t), mask, counts_of)
    out = {f"R({tag})": float(with_sink.mean()), f"R({tag}) sink-free": float(without.mean())}
    exact = t["passkey_correct"] == KEY_DIGITS
    kind = np.array([trial["kind"] for trial in trials])
    at = np.array([trial["query_at"] for trial in trials])
    d = at - np.array([trial["key_at"] for trial in trials])  # the distance from the key to the query

    def rate(pick: np.ndarray) -> float:
        return float(exact[pick].mean()) if pick.any() else math.nan

    near, far = (kind == "trial") & (d < L), (kind == "trial") & (d >= L)
    if T == L:
        out |= {"near at L": rate(near), "ceiling at L": rate(kind == "ceiling"), "absent at L": rate(kind == "absent")}
        return out
    text = ~t["inserted"]
    nll, before = t["nll"].astype(np.float64), np.arange(T) < L
    out |= {
        "near past L": rate(near & (at >= L)),
        "near inside L": rate(near & (at < L)),
        "far": rate(far),
        "ceiling past L": rate((kind == "ceiling") & (at >= L)),
        "ceiling inside L": rate((kind == "ceiling") & (at < L)),
        "absent": rate(kind == "absent"),
        "NLL < L": float(nll[text & before].mean()),
        "NLL ≥ L": float(nll[text & ~before].mean()),
        "entropy ≥ L": float(t["entropy"][:, L:].astype(np.float64).mean()),
    }
    out["NLL rise"] = out["NLL ≥ L"] - out["NLL < L"]
    return out


def unit(quantity: str) -> str:
    if quantity in TOLERANCE:
        return quantity
    if quantity.startswith("R("):
        return "R"
    return "nats" if "NLL" in quantity or "entropy" in quantity else "pass"


def agree(a: float, b: float, quantity: str) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    how, tol = TOLERANCE[unit(quantity)]
    return abs(a - b) <= (tol * max(abs(a), abs(b)) if how == "rel" else tol)


class Counts(dict):
    """Pair counts by (mask, T), each counted once."""

    def __call__(self, mask: dict, T: int) -> np.ndarray:
        key = (json.dumps(mask, sort_keys=True), T)
        if key not in self:
            self[key] = pair_counts(mask, T)
        return self[key]


def window_files(work: Path) -> dict[tuple[str, int], list[Path]]:
    """{(configuration, T): its window files in window order} under ``work`` (<configuration>/<T>/window-N)."""
    folders = sorted(p for p in work.glob("*/*") if p.is_dir() and p.name.isdigit())
    return {
        (f.parent.name, int(f.name)): sorted(f.glob("window-*.safetensors"), key=lambda p: int(p.stem.split("-")[1]))
        for f in folders
    }


def main(argv=None) -> int:
    from attnres_helpers import plan_v4
    from attnres_helpers.configured_store import load
    from attnres_helpers.paths import CONFIGURATIONS_V4_STORE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="the run's folder of window files (<configuration>/<T>/window-N)")
    ap.add_argument("--store", default=str(CONFIGURATIONS_V4_STORE))
    args = ap.parse_args(argv)
    try:
        store = load(args.store)
    except (OSError, ValueError) as exc:
        sys.exit(f"recompute_v4: {exc}")
    files, counts_of = window_files(Path(args.work)), Counts()
    for (name, T), entry in sorted(store.entries.items()):  # every input checked before the work
        if len(files.get((name, T), [])) < entry.windows:
            sys.exit(
                f"recompute_v4: {args.work} holds {len(files.get((name, T), []))} window files of {name} at "
                f"T = {T}, the store {entry.windows}: give the run's folder the store was built from"
            )
    mine, mean_r = {}, {}  # each file read once: its values, and its ŝ into the mean of the windows stored
    for key, paths in files.items():
        kept = store.entries[key].windows if key in store.entries else 0
        mine[key], sums = [], 0.0
        for w, path in enumerate(paths):
            window = read(path)
            mine[key].append(window_values(window, counts_of))
            if w < kept:
                sums = sums + np.stack(head_means(window[0]))  # (2, layers, T)
        if kept:
            mean_r[key] = layer_r(*(sums / kept), window[1]["mask"], counts_of)
    L = store.train_len
    checks, mismatches = 0, []
    for (name, T), entry in sorted(store.entries.items()):  # R of the stored window-mean ŝ, layer by layer
        with_sink, without = mean_r[(name, T)]
        for tag, r, sink in (("", with_sink, True), (" sink-free", without, False)):
            for layer, (a, b) in enumerate(zip(r, entry.layer_resolutions(sink=sink).tolist())):
                checks += 1
                if not agree(a, b, "R of stored ŝ"):
                    mismatches.append(
                        f"{name} T={T} layer {layer} R of the stored ŝ{tag}: files {float(a)!r}, store {b!r}"
                    )
    for name in store.configurations():
        theirs = plan_v4.per_window(store, name)
        for quantity, values in theirs.items():
            if quantity == "reach":  # the plan's indicator by kind, not a measurement
                continue
            T = L if quantity.endswith("at L") or quantity.startswith("R(L)") else 2 * L
            windows = mine.get((name, T)) or mine[("as-trained", T)]
            for w, value in enumerate(values):
                checks += 1
                if not agree(windows[w][quantity], float(value), quantity):
                    mismatches.append(
                        f"{name} window {w} {quantity}: files {windows[w][quantity]!r}, store {float(value)!r}"
                    )
    print(f"{checks} checks over {len(store.configurations())} configurations, {len(mismatches)} mismatches")
    print("\n".join(mismatches))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
