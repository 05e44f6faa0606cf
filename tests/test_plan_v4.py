"""Plan v4's tests on synthetic data with known answers: per-window quantities from a synthetic v4 store,
the within-kind permutation against brute force, the across test against exact enumeration, the
head-to-head and the verdicts."""

import itertools
import json
import math

import numpy as np
import pytest
import torch
from helpers import ROOT

from attnres_helpers import configured_store as cs
from attnres_helpers import plan_v4
from attnres_helpers.files import save_safetensors
from attnres_helpers.passkey import KEY_DIGITS
from attnres_helpers.stats import ConfidenceInterval, CorrelationResult, spearman

L = 1024


def collected(x_by_kind: dict[str, list[float]], y_by_kind: dict[str, list[float]], windows: int = 4, noise=0.0):
    """A Collected whose R(2L) and outcome window means are the given values (each window the value, plus
    alternating ±noise so that resamples move)."""
    names, kinds, xs, ys = [], [], [], []
    for kind in x_by_kind:
        for i, (x, y) in enumerate(zip(x_by_kind[kind], y_by_kind[kind])):
            names.append(f"{kind}-{i}")
            kinds.append(kind)
            xs.append(x)
            ys.append(y)
    wiggle = noise * np.array([(-1) ** w for w in range(windows)])
    per = lambda v: np.array(v, float)[:, None] + wiggle  # noqa: E731
    values = {
        "R(2L)": per(xs),
        "R(L)": per(np.ones(len(xs))),
        "NLL rise": per(ys),
        "far": per(ys),
        "NLL ≥ L": per(-np.array(ys) * 2),
        "ceiling past L": per(np.ones(len(xs))),
    }
    return plan_v4.Collected(tuple(names), tuple(kinds), values)


def brute_within(x, y, kinds):
    """The within-kind statistic and its exact p by enumerating every within-kind ordering, via scipy."""
    from scipy.stats import spearmanr

    groups = [[i for i, k in enumerate(kinds) if k == kind] for kind in sorted(set(kinds)) if kinds.count(kind) >= 3]

    def stat(yy):
        total, weight = 0.0, 0
        for g in groups:
            if np.ptp(x[g]) == 0 or np.ptp(yy[g]) == 0:
                continue
            total += len(g) * spearmanr(x[g], yy[g]).statistic
            weight += len(g)
        return total / weight

    observed = stat(y)
    count = n = 0
    for choice in itertools.product(*[itertools.permutations(g) for g in groups]):
        yy = y.copy()
        for g, order in zip(groups, choice):
            yy[g] = y[list(order)]
        count += abs(stat(yy)) >= abs(observed) * (1 - 1e-12)
        n += 1
    return observed, count / n


def test_the_within_kind_test_counts_every_ordering_as_a_brute_force_does():
    x = {"a": [1, 2, 3], "b": [5, 1, 4, 2], "c": [0.1, 0.3, 0.2]}
    y = {"a": [2, 1, 3], "b": [9, 2, 7, 1], "c": [3, 1, 2]}
    data = collected(x, y, noise=0.01)
    test = plan_v4.within_kinds(data, "R(2L)", "NLL rise", n_resamples=200)
    observed, p = brute_within(data.means("R(2L)"), data.means("NLL rise"), list(data.kinds))
    assert test.exact and test.strata == ("a", "b", "c")
    assert test.statistic == pytest.approx(observed, abs=1e-12)
    assert test.pvalue == pytest.approx(p, abs=1e-12)


def test_a_predictor_that_only_separates_kinds_orders_across_them_but_not_within():
    """R equal to the kind's level plus a within-kind order unrelated to the outcome: across the
    configurations ρ is high, within kinds the statistic is 0 and its p large."""
    x = {"a": [1.0, 1.1, 1.2, 1.3], "b": [5.0, 5.1, 5.2, 5.3], "c": [9.0, 9.1, 9.2, 9.3]}
    y = {"a": [1.3, 1.0, 1.2, 1.1], "b": [5.1, 5.3, 5.0, 5.2], "c": [9.2, 9.1, 9.3, 9.0]}
    data = collected(x, y)
    across = plan_v4.across(data, "R(2L)", "NLL rise", n_resamples=100, permutations=9_999)
    within = plan_v4.within_kinds(data, "R(2L)", "NLL rise", n_resamples=100)
    assert across.statistic > 0.8 and across.pvalue < 0.01
    assert abs(within.statistic) < 0.35 and within.pvalue > 0.3


def test_without_a_kind_of_three_the_within_kind_test_is_undefined_and_the_verdict_inconclusive():
    """Three configurations of three kinds: no kind can be permuted within, so the statistic is NaN (not an
    error deep in numpy) and the plan's verdict inconclusive."""
    data = collected({"a": [1.0], "b": [2.0], "c": [3.0]}, {"a": [3.0], "b": [2.0], "c": [1.0]}, noise=0.01)
    within = plan_v4.within_kinds(data, "R(2L)", "NLL rise", n_resamples=50)
    assert math.isnan(within.statistic) and within.strata == ()
    assert plan_v4.verdict(within) == "inconclusive"


def test_the_across_test_is_exact_for_few_configurations():
    x = {"a": [3, 1, 2, 5, 4, 6]}
    y = {"a": [2, 1, 4, 3, 6, 5]}
    data = collected(x, y)
    test = plan_v4.across(data, "R(2L)", "NLL rise", n_resamples=50)
    xs, ys = data.means("R(2L)"), data.means("NLL rise")
    rho = spearman(xs, ys)
    brute = np.mean([abs(spearman(xs, list(q))) >= abs(rho) - 1e-12 for q in itertools.permutations(ys)])
    assert test.exact and test.statistic == pytest.approx(rho) and test.pvalue == pytest.approx(brute)


def test_sampled_within_kind_p_is_one_plus_count_over_one_plus_resamples():
    x = {"a": list(range(9)), "b": list(range(9))}
    data = collected(x, x)  # 9!·9! orderings: sampled
    test = plan_v4.within_kinds(data, "R(2L)", "NLL rise", n_resamples=50, permutations=999)
    assert not test.exact and test.statistic == pytest.approx(1.0)
    assert test.pvalue == pytest.approx(1 / 1000)  # nothing as extreme as a perfect order in 999 draws


def test_head_to_head_says_r_adds_nothing_to_its_own_copy():
    x = {"a": [1, 2, 3, 4], "b": [4, 2, 3, 1]}
    data = collected(x, x, noise=0.01)
    data.values["NLL ≥ L"] = data.values["R(2L)"].copy()
    h = plan_v4.head_to_head(data, "far", "NLL ≥ L", n_resamples=100)
    assert h.difference.statistic == pytest.approx(0.0) and math.isnan(h.partial.statistic)


def _test(outcome, pvalue):
    return CorrelationResult(0.6, ConfidenceInterval(0.2, 0.9), 16, pvalue, "R(2L)", outcome)


def test_verdicts_follow_the_plan():
    t = _test("far", 0.01)
    assert plan_v4.verdict(t) == "supports"
    assert plan_v4.verdict(t, valid=False) == "inconclusive"
    assert plan_v4.verdict(t, tied_in_every_kind=True) == "inconclusive"
    against = _test("NLL rise", 0.01)
    assert plan_v4.verdict(against, valid=False) == "evidence against"  # validity is the retrieval outcomes'
    assert plan_v4.verdict(_test("far", 0.2)) == "inconclusive"


# ---------------------------------------------------------------------------- a synthetic plan-v4 store


def v4_window(folder, name, kind, T, w, scale, near_pass, far_pass):
    LAYERS = 2
    n = torch.arange(T, dtype=torch.float32)
    s_hat = (-scale * n).expand(LAYERS, 1, T).clone()
    key0 = torch.full((LAYERS, 1, T), -50.0)
    entropy = torch.where(n < L, 1.0, 1.0 + scale).expand(LAYERS, T).clone()
    nll = torch.where(n < L, 2.0, 2.0 + scale)
    trials = [
        {"name": "a", "key": "1", "kind": "trial", "key_at": 900, "query_at": 900 + L // 16},  # near, inside
        {"name": "b", "key": "1", "kind": "ceiling", "key_at": 300, "query_at": 323},
        {"name": "c", "key": "1", "kind": "absent", "key_at": -1, "query_at": 400},
    ]
    correct = [KEY_DIGITS if near_pass else 1, KEY_DIGITS, 0]
    if T > L:
        trials += [
            {"name": "d", "key": "1", "kind": "trial", "key_at": 1500, "query_at": 1500 + L // 8},  # near, past
            {"name": "e", "key": "1", "kind": "trial", "key_at": 10, "query_at": 10 + int(1.1 * L + 0.5)},  # far
            {"name": "f", "key": "1", "kind": "ceiling", "key_at": 1700, "query_at": 1723},
        ]
        correct += [KEY_DIGITS if near_pass else 0, KEY_DIGITS if far_pass else 0, KEY_DIGITS]
    settings = {
        "plan": "v4",
        "configuration": name,
        "kind": kind,
        "rope": None,
        "remap": None,
        "mask": {"kind": "causal", "size": None, "sinks": 0},
        "T": T,
        "train_len": L,
        "window": w,
        "n_windows": 2,
        "model": "toy",
        "key_sentence": "k",
        "query_sentence": "q",
    }
    tensors = {
        "s_hat": s_hat,
        "key0": key0,
        "entropy": entropy,
        "nll": nll,
        "inserted": torch.zeros(T, dtype=torch.bool),
        "passkey_logprob": torch.zeros(len(trials)),
        "passkey_correct": torch.tensor(correct),
    }
    path = folder / name / str(T) / f"window-{w}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors(path, tensors, {"settings": json.dumps(settings), "trials": json.dumps(trials)})


@pytest.fixture
def toy_store(tmp_path):
    """Two windows of the model as trained and of one remapped configuration "x", at L and 2L."""
    known = {
        "as-trained": {"label": "as trained", "kind": "as-trained", "same_as_trained_up_to_L": True},
        "x": {"label": "x", "kind": "remapped", "same_as_trained_up_to_L": False},
    }
    for w in range(2):
        v4_window(tmp_path / "w", "as-trained", "as-trained", L, w, 0.01, True, False)
        v4_window(tmp_path / "w", "as-trained", "as-trained", 2 * L, w, 0.02, w == 0, False)
        v4_window(tmp_path / "w", "x", "remapped", L, w, 0.01, True, False)
        v4_window(tmp_path / "w", "x", "remapped", 2 * L, w, 0.005, True, True)
    return cs.build(tmp_path / "w", tmp_path / "s.safetensors", known)


def test_a_v4_store_gives_every_quantity_of_the_plan(toy_store):
    store = cs.load(toy_store)
    data = plan_v4.collect(store)
    assert data.names == ("as-trained", "x") and data.kinds == ("as-trained", "remapped")
    s = plan_v4.summary(data, n_resamples=50)
    assert s["x"]["far"].statistic == 1.0 and s["as-trained"]["far"].statistic == 0.0
    assert s["as-trained"]["near past L"].statistic == 0.5 and s["as-trained"]["near inside L"].statistic == 0.5
    assert s["x"]["NLL rise"].statistic == pytest.approx(0.005, rel=1e-4)  # float32 sums
    assert s["x"]["entropy ≥ L"].statistic == pytest.approx(1.005, rel=1e-6)
    assert s["x"]["reach"].statistic == 1.0 and s["x"]["ceiling past L"].statistic == 1.0
    assert plan_v4.validity(data) == (True, {"near at L": 1.0, "ceiling at L": 1.0, "absent at L": 0.0})
    assert plan_v4.broken(data) == []
    profile_r = store.entry("x", 2 * L).profile().layer_resolutions()
    torch.testing.assert_close(profile_r.float(), store.entry("x", 2 * L).mean_r, atol=1e-5, rtol=1e-4)
    # every trial pooled over windows by distance and by where the query sits, the absent control last
    rows = plan_v4.trials_by_distance(store, "as-trained", 2 * L)
    where = [(r["distance"], r["query"], r["trials"]) for r in rows]
    far = int(1.1 * L + 0.5)
    assert where == [
        (f"d = {L // 16}", "inside L", 2),
        (f"d = {L // 8}", "past L", 2),
        (f"d = {far}", "past L", 2),
        ("absent key", "anywhere", 2),
    ]
    near_past = rows[1]
    assert near_past["exact"] == 0.5 and near_past["digits"] == 0.5  # window 0 all five digits, window 1 none
    assert rows[2]["exact"] == rows[2]["digits"] == 0.0 and rows[3]["digits"] == 0.0 and rows[0]["logprob"] == 0.0


def script(name: str):
    """One of scripts/, imported as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_closing_report_gives_a_row_per_configuration_and_each_jobs_seconds_from_the_log(toy_store, capsys):
    """scripts/configurations_report.py: job times are the gaps between a process's log lines (the first
    job after a start, which loads the model, left out; a restart counts afresh)."""
    report = script("configurations_report")
    log = toy_store.parent / "run.log"
    log.write_text(
        f"as-trained T={2 * L} window 0: 100 s elapsed\n"
        f"x T={2 * L} window 0: 130 s elapsed\n"
        "a line of something else\n"
        f"as-trained T={2 * L} window 1: 50 s elapsed\n"  # a restart
        f"x T={2 * L} window 1: 90 s elapsed\n"
    )
    assert report.job_seconds(log) == {("x", 2 * L): [30, 40]}
    report.main(["--store", str(toy_store), "--log", str(log), "--n-resamples", "50"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| as-trained", "| x"]
    assert rows[1].endswith("| – |") and rows[2].endswith("| 30–40 |")


def test_the_separate_recomputation_from_the_window_files_agrees_with_the_store_and_catches_a_change(toy_store, capsys):
    """scripts/recompute_v4.py: every per-window quantity of the plan and every layer's R of the window-mean
    ŝ, from the window files by code that shares nothing with the store's path, equals the store's; window
    files changed after the build (an NLL value past L, a score) are reported, and the script exits 1."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    recompute = script("recompute_v4")
    work = toy_store.parent / "w"
    assert recompute.main(["--work", str(work), "--store", str(toy_store)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("84 checks over 2 configurations, 0 mismatches"), out  # 68 per window, 16 per layer

    def change(w: int, name: str, index: tuple) -> None:
        path = work / "x" / str(2 * L) / f"window-{w}.safetensors"
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata()
        tensors = load_file(path)
        tensors[name][index] += 1.0
        save_safetensors(path, tensors, metadata)

    change(1, "nll", (L + 5,))
    # layer 1's score at distance 0 moves its R, the window's and the stored ŝ's; not R without the sink,
    # which this toy saturates near 1 (key-0 scores of −50 leave the last distances' sink-free means on top)
    change(0, "s_hat", (1, 0, 0))
    assert recompute.main(["--work", str(work), "--store", str(toy_store)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "84 checks over 2 configurations, 4 mismatches", lines
    assert [line.split(":")[0] for line in lines[1:] if line] == [
        f"x T={2 * L} layer 1 R of the stored ŝ",
        "x window 0 R(2L)",
        "x window 1 NLL ≥ L",
        "x window 1 NLL rise",
    ]


def test_the_prediction_is_shown_item_by_item_beside_what_the_data_show(toy_store):
    """Every item of the plan's prediction in the plan's words, in order, beside the quantity it names: by kind
    (highest first) for retrieval, ranked for the NLL rise and R(2L), and the verdicts with the head-to-head."""
    data = plan_v4.collect(cs.load(toy_store))
    rows = plan_v4.prediction_rows(data, plan_v4.verdicts(data, n_resamples=50))
    bullets = plan_v4.plan_prediction()
    assert [r["prediction (plan v4)"] for r in rows] == bullets and len(bullets) == 6
    assert bullets[0] == (
        "Broken: pi-2 (its ceiling fails past L, as in plan v3), and likely window (no sink: the NLL explodes "
        "past L as in StreamingLLM's report)."
    )
    shown = {key: r["what the data show"] for key, r in zip(plan_v4.PREDICTED, rows)}
    assert shown["broken"] == "broken (ceiling past L below 0.9): none"
    assert shown["far"] == "as-trained: as-trained 0; remapped: x 1"
    assert shown["NLL rise"] == "highest first: as-trained 0.02, x 0.005"
    r = data.means("R(2L)")
    assert shown["R(2L)"] == "lowest first: " + (
        f"as-trained {r[0]:.3g}, x {r[1]:.3g}" if r[0] <= r[1] else f"x {r[1]:.3g}, as-trained {r[0]:.3g}"
    )
    assert shown["tests"].startswith("verdicts within kinds: NLL rise: inconclusive; near past L: inconclusive; far:")
    assert "far across: |ρ| R(2L) 1.00, NLL ≥ L 1.00, difference [" in shown["tests"]


def test_a_plan_whose_prediction_has_other_items_is_refused(tmp_path):
    plan = tmp_path / "plan.md"
    plan.write_text("## Prediction, written before the data\n- one\n- two\n\n## After\n- not counted\n")
    with pytest.raises(ValueError, match=r"plan\.md: 2 bullets under its prediction, expected 6$"):
        plan_v4.plan_prediction(plan)


def test_the_recomputation_refuses_a_folder_or_store_it_cannot_use_in_one_line(toy_store, tmp_path):
    recompute = script("recompute_v4")
    for argv, message in (
        (["--work", str(tmp_path / "none"), "--store", str(toy_store)], "holds 0 window files of as-trained at T = "),
        (["--work", str(toy_store.parent / "w"), "--store", str(tmp_path / "none.safetensors")], "none.safetensors"),
    ):
        with pytest.raises(SystemExit) as stop:
            recompute.main(argv)
        assert str(stop.value).startswith("recompute_v4: ") and message in str(stop.value), stop.value
        assert "\n" not in str(stop.value)


def test_each_verdict_is_repeated_without_the_broken_configurations():
    """One configuration of kind "a" fails its ceiling past L: the row keeps it in the primary test and
    repeats the test on the rest (the plan: broken configurations stay in, each verdict is given without them)."""
    x = {"as-trained": [0.0], "a": [1.0, 2.0, 3.0, 4.0, 5.0], "b": [1.0, 2.0, 3.0]}
    y = {"as-trained": [0.0], "a": [5.0, 4.0, 3.0, 2.0, 6.0], "b": [3.0, 2.0, 1.0]}  # a-4 breaks kind a's order
    data = collected(x, y, noise=0.01)
    data = plan_v4.Collected(("as-trained", *data.names[1:]), data.kinds, data.values)
    n = len(data.names)
    for key in ("near past L", "entropy ≥ L", "reach", "R(2L) sink-free"):
        data.values[key] = data.values["far"].copy()
    for key, level in (("near at L", 1.0), ("ceiling at L", 1.0), ("absent at L", 0.0)):
        data.values[key] = np.full((n, 4), level)
    data.values["ceiling past L"][data.names.index("a-4")] = 0.5
    rows = plan_v4.verdicts(data, n_resamples=50)
    assert [r["broken"] for r in rows] == [["a-4"]] * 3
    rest = plan_v4.within_kinds(data.without({"a-4"}), "R(2L)", "NLL rise", n_resamples=50)
    assert rows[0]["within without broken"].statistic == pytest.approx(rest.statistic)
    assert rows[0]["within without broken"].strata == ("a", "b")
    assert (rows[0]["verdict"], rows[0]["verdict without broken"]) == ("inconclusive", "supports")
    # with a-4: kind a ρ = 0, kind b −1, weighted by size −3/8; without it −1 in both, p = 2/(4!·3!)
    assert rows[0]["within"].statistic == pytest.approx(-3 / 8) and rest.statistic == pytest.approx(-1.0)
    assert rest.pvalue == pytest.approx(2 / 144)
    # each kind's own ρ: the terms the within-kind statistic weights by kind size
    assert plan_v4.each_kind(data, "R(2L)", "NLL rise") == pytest.approx({"a": 0.0, "b": -1.0})
    assert plan_v4.each_kind(data.without({"a-4"}), "R(2L)", "NLL rise") == pytest.approx({"a": -1.0, "b": -1.0})
