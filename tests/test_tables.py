"""Tables from records: seed statistics, the paper's values, the reversal checks, formatting."""

import math

import matplotlib
import numpy as np
import pytest

from attnres_helpers.metric import resolution
from attnres_helpers.tables import (
    BCA_COLUMNS,
    CHECK_DESCRIPTIONS,
    PAIR_COLUMNS,
    PAPER_TABLE3,
    Stat,
    bca_table,
    format_checks,
    format_table,
    layer_table,
    pair_table,
    record_mismatches,
    reversal_checks,
    truncation_table,
)

L = 8
# The paper's Table 3 as if measured on three seeds: seed s adds (s − 1)·0.01 (spread 0.01).
PAPER_LIKE = {
    ("rope", 1, False): 0.91, ("rope", 2, False): 0.08, ("rope", 2, True): 0.91,
    ("sinusoidal", 1, False): 0.87, ("sinusoidal", 2, False): 0.28,
    ("alibi", 1, False): 0.81, ("alibi", 2, False): 0.88, ("alibi", 2, True): 0.81,
    ("xpos", 1, False): 0.98, ("xpos", 2, False): 0.54, ("xpos", 2, True): 0.98,
}


# Perplexity of the 2L windows, as measured in our runs: RoPE is better than the others before L
# and worse past L. (first L, past L) shifts added to 10·multiple + seed (+1 with BCA).
PPL_SHIFTS = {"rope": (-0.5, 2.0)}


def make_records(values, seeds=(0, 1, 2), step=0.01, layers=2, ppl_shifts=PPL_SHIFTS):
    """Records whose layer-mean R is values[(encoding, multiple, bca)] + (seed − 1)·step in both head
    modes ("mean-R" adds 0.5); layer ℓ gets mean + (ℓ − (layers−1)/2)·0.1, so the layers average to
    the mean, and "upper" is the mean of layers ≥ 1. Perplexity is 10·multiple + seed (+1 with BCA);
    for multiples > 1, before L it is 1 less and past L 1 more, plus ppl_shifts[encoding]."""
    records = []
    for (encoding, k, bca), r in values.items():
        first_shift, past_shift = ppl_shifts.get(encoding, (0.0, 0.0))
        for seed in seeds:
            for head_mode, offset in (("mean-scores", 0.0), ("mean-R", 0.5)):
                mean = r + (seed - 1) * step + offset
                per_layer = [mean + (i - (layers - 1) / 2) * 0.1 for i in range(layers)]
                layer_values = list(enumerate(per_layer)) + [("mean", mean)]
                if layers > 1:
                    layer_values.append(("upper", sum(per_layer[1:]) / (layers - 1)))
                ppl = 10.0 * k + seed + bca
                for layer, value in layer_values:
                    records.append({"encoding": encoding, "seed": seed, "train_len": L, "eval_len": k * L,
                                    "bca": bca, "head_mode": head_mode, "layer": layer, "resolution": value,
                                    "perplexity": ppl,
                                    "perplexity_first_L": ppl - 1 + first_shift if k > 1 else ppl,
                                    "perplexity_past_L": ppl + 1 + past_shift if k > 1 else None})
    return records


def by_encoding(rows):
    return {row["encoding"]: row for row in rows}


def test_stat_mean_and_sample_spread():
    stat = Stat.of({2: 3.0, 0: 1.0, 1: 2.0})
    assert stat.mean == 2.0 and stat.spread == pytest.approx(1.0)  # sample std, ddof = 1
    assert stat.values == (1.0, 2.0, 3.0) and stat.seeds == (0, 1, 2)
    assert Stat.of({5: 0.25}) == Stat(0.25, None, (0.25,), (5,))
    with pytest.raises(ValueError, match="at least one"):
        Stat.of({})


def test_paper_values_are_table3():
    assert {e: (v["R(L)"], v["R(2L)"]) for e, v in PAPER_TABLE3.items()} == {
        "sinusoidal": (0.87, 0.28), "alibi": (0.81, 0.88), "rope": (0.91, 0.08), "xpos": (0.98, 0.54)}
    assert PAPER_TABLE3["xpos"]["R(2L)+BCA"] == 1.08


@pytest.mark.parametrize("head_mode, offset", [("mean-scores", 0.0), ("mean-R", 0.5)])
def test_pair_table_seed_means_and_spread(head_mode, offset):
    rows = pair_table(make_records({**PAPER_LIKE, ("nope", 1, False): 0.1, ("nope", 2, False): 0.05}), head_mode)
    assert [row["encoding"] for row in rows] == ["rope", "sinusoidal", "alibi", "xpos", "nope"]
    rope = by_encoding(rows)["rope"]
    assert rope["seeds"] == 3
    assert rope["R(L)"].mean == pytest.approx(0.91 + offset)
    assert rope["R(L)"].spread == pytest.approx(0.01)
    assert rope["R(L)"].values == pytest.approx((0.90 + offset, 0.91 + offset, 0.92 + offset))
    assert rope["R(2L)+BCA"].mean == pytest.approx(0.91 + offset)
    assert rope["paper R(L)"] == 0.91 and rope["paper R(2L)"] == 0.08
    assert rope["ppl(2L)"].mean == pytest.approx(21.0) and rope["ppl(2L) past L"].mean == pytest.approx(24.0)
    assert rope["ppl(2L) first L"].mean == pytest.approx(19.5) and rope["ppl(2L) first L"].spread == pytest.approx(1.0)
    assert by_encoding(rows)["alibi"]["ppl(2L) first L"].mean == pytest.approx(20.0)
    assert rope["ppl(2L)+BCA"].mean == pytest.approx(22.0)
    assert rope["ppl(2L) first L+BCA"].mean == pytest.approx(20.5)
    assert "ppl(L) past L" not in rope and "ppl(L) first L" not in rope
    sinusoidal, nope = by_encoding(rows)["sinusoidal"], by_encoding(rows)["nope"]
    assert sinusoidal["R(2L)+BCA"] is None  # not measured
    assert "paper R(L)" not in nope


def test_bca_table_ratio_per_seed():
    rows = by_encoding(bca_table(make_records(PAPER_LIKE, step=0.0)))
    assert rows["xpos"]["BCA ×(2L)"].mean == pytest.approx(0.98 / 0.54)
    assert rows["xpos"]["BCA ×(2L)"].spread == pytest.approx(0.0)
    assert rows["sinusoidal"]["BCA ×(2L)"] is None
    assert rows["rope"]["BCA ×(L)"] is None  # no BCA record at L in PAPER_LIKE
    negative = by_encoding(bca_table(make_records({("rope", 2, False): -0.1, ("rope", 2, True): 0.2})))
    assert negative["rope"]["BCA ×(2L)"] is None  # a ratio over R ≤ 0 means nothing


def test_layer_table():
    rows = layer_table(make_records(PAPER_LIKE), "rope")
    assert [row["layer"] for row in rows] == [0, 1]
    assert rows[0]["R(L)"].mean == pytest.approx(0.91 - 0.05) and rows[1]["R(2L)"].mean == pytest.approx(0.08 + 0.05)
    assert rows[0]["R(2L)+BCA"].mean == pytest.approx(0.91 - 0.05)
    with pytest.raises(ValueError, match="no per-layer records"):
        layer_table(make_records(PAPER_LIKE), "t5")


def test_reversal_checks_on_the_papers_table():
    for head_mode in ("mean-scores", "mean-R"):
        checks = reversal_checks(make_records(PAPER_LIKE), head_mode)
        assert all(c.holds and c.seeds_holding == 3 and c.seeds == 3 for c in checks.values()), checks


@pytest.mark.parametrize("change, shifts, failing", [
    ({("sinusoidal", 1, False): 0.95}, PPL_SHIFTS, {"rope_highest_at_L"}),
    ({("sinusoidal", 2, False): 0.05}, PPL_SHIFTS, {"rope_lowest_at_2L"}),
    # RoPE lowest at 2L implies RoPE below ALiBi at 2L: above ALiBi breaks both
    ({("rope", 2, False): 0.90}, PPL_SHIFTS, {"rope_below_alibi_at_2L", "rope_lowest_at_2L"}),
    ({("alibi", 2, False): 0.81 * 1.16}, PPL_SHIFTS, {"alibi_level"}),
    ({("alibi", 2, False): 0.81 * 0.84}, PPL_SHIFTS, {"alibi_level"}),
    ({("rope", 2, True): 0.07}, PPL_SHIFTS, {"bca_raises_rope"}),
    ({("xpos", 2, True): 0.54}, PPL_SHIFTS, {"bca_raises_xpos"}),
    ({}, {"rope": (0.5, 2.0)}, {"rope_better_first_L"}),
    ({}, {"rope": (-0.5, -0.5)}, {"rope_worse_past_L"}),
    ({}, {"rope": (0.0, 0.0)}, {"rope_better_first_L", "rope_worse_past_L"}),  # equal is not better
])
def test_each_reversal_check_can_fail(change, shifts, failing):
    checks = reversal_checks(make_records({**PAPER_LIKE, **change}, step=0.0, ppl_shifts=shifts))
    assert set(checks) == set(CHECK_DESCRIPTIONS)
    assert {name for name, c in checks.items() if not c.holds} == failing
    assert all(checks[name].seeds_holding == 0 and checks[name].seeds == 3 for name in failing)


def test_reversal_checks_use_the_chosen_layer():
    records = make_records(PAPER_LIKE, step=0.0)
    for r in records:  # RoPE's upper layers rise above ALiBi at 2L; its layer mean does not
        if (r["encoding"], r["eval_len"], r["bca"], r["layer"]) == ("rope", 2 * L, False, "upper"):
            r["resolution"] = 0.95
    on_mean = reversal_checks(records)
    on_upper = reversal_checks(records, layer="upper")
    assert all(c.holds for c in on_mean.values())
    assert {n for n, c in on_upper.items() if not c.holds} == {"rope_below_alibi_at_2L", "rope_lowest_at_2L"}
    # layer 1 holds the per-layer value mean + 0.05, layer 0 mean − 0.05: the checks on each still hold
    assert all(c.holds for c in reversal_checks(records, layer=1).values())
    with pytest.raises(ValueError, match=r"layer 7"):
        reversal_checks(records, layer=7)


def test_pair_and_bca_tables_of_one_layer():
    records = make_records(PAPER_LIKE)
    for layer, shift in ((0, -0.05), (1, 0.05), ("upper", 0.05), ("mean", 0.0)):
        rope = by_encoding(pair_table(records, layer=layer))["rope"]
        assert rope["R(L)"].mean == pytest.approx(0.91 + shift)
        assert rope["R(2L)+BCA"].mean == pytest.approx(0.91 + shift)
        xpos = by_encoding(bca_table(records, layer=layer))["xpos"]
        assert xpos["BCA ×(2L)"].mean == pytest.approx(np.mean([(0.98 + shift + (s - 1) * 0.01) /
                                                               (0.54 + shift + (s - 1) * 0.01) for s in range(3)]))
    assert by_encoding(pair_table(make_records(PAPER_LIKE, layers=1), layer="upper"))["rope"]["R(L)"] is None


def test_alibi_level_tolerance():
    level = reversal_checks(make_records({**PAPER_LIKE, ("alibi", 2, False): 0.81 * 1.14}, step=0.0))
    assert level["alibi_level"].holds


def test_reversal_seed_counts_can_disagree_with_the_means():
    # Seed 2 alone puts sinusoidal above RoPE at L; the means (0.91 vs 0.9033) keep RoPE first.
    records = make_records(PAPER_LIKE, step=0.0)
    for r in records:
        if (r["encoding"], r["eval_len"], r["seed"]) == ("sinusoidal", L, 2):
            r["resolution"] += 0.1
    check = reversal_checks(records)["rope_highest_at_L"]
    assert check.holds and (check.seeds_holding, check.seeds) == (2, 3)
    # A seed that lacks a value some check needs is not counted.
    fewer = [r for r in make_records(PAPER_LIKE) if not (r["encoding"] == "xpos" and r["seed"] == 0)]
    assert reversal_checks(fewer)["bca_raises_rope"].seeds == 2


def test_reversal_checks_need_every_value():
    records = make_records({k: v for k, v in PAPER_LIKE.items() if k != ("xpos", 2, True)})
    with pytest.raises(ValueError, match=r"R\(2L\)\+BCA of 'xpos'"):
        reversal_checks(records)


def test_format_checks_lines():
    text = format_checks(reversal_checks(make_records(PAPER_LIKE)))
    lines = text.splitlines()
    assert len(lines) == len(CHECK_DESCRIPTIONS) == 8
    assert lines[0].startswith("RoPE has the highest R(L)") and lines[0].endswith("True   (true in 3 of 3 seeds)")


def test_bad_records_raise():
    records = make_records(PAPER_LIKE)
    with pytest.raises(ValueError, match="head_mode"):
        pair_table(records, "median")
    with pytest.raises(ValueError, match="non-empty"):
        pair_table([])
    with pytest.raises(ValueError, match="mix training lengths"):
        pair_table(records + [{**records[0], "train_len": 2 * L, "eval_len": 2 * L}])
    with pytest.raises(ValueError, match="two records"):
        pair_table(records + [records[0]])
    with pytest.raises(ValueError, match="lacks"):
        pair_table([{k: v for k, v in records[0].items() if k != "perplexity"}])


def test_format_table_exact_text():
    rows = [{"encoding": "rope", "seeds": 3, "R(L)": Stat.of({0: 0.1, 1: 0.3}), "R(2L)": -0.00004},
            {"encoding": "sinusoidal", "seeds": 1, "R(L)": Stat.of({0: 0.25}), "R(2L)": None}]
    assert format_table(rows, ["encoding", "seeds", "R(L)", "R(2L)"]) == (
        "encoding    seeds           R(L)  R(2L)\n"
        "----------  -----  -------------  -----\n"
        "rope            3  0.200 ± 0.141  0.000\n"
        "sinusoidal      1          0.250    n/a"
    )
    assert format_table(rows, ["encoding", "R(L)"], digits={"R(L)": 1}).splitlines()[2] == "rope        0.2 ± 0.1"
    with pytest.raises(ValueError, match=r"\['R\(8L\)'\] are in no row"):
        format_table(rows, ["encoding", "R(8L)"])
    with pytest.raises(ValueError, match="empty"):
        format_table([], ["encoding"])


def test_format_table_of_the_notebook_columns():
    records = make_records(PAPER_LIKE | {("rope", 4, False): 0.01, ("sinusoidal", 4, False): 0.02,
                                         ("alibi", 4, False): 0.8, ("xpos", 4, False): 0.3,
                                         ("rope", 4, True): 0.9, ("alibi", 4, True): 0.8, ("xpos", 4, True): 0.97})
    text = format_table(pair_table(records), PAIR_COLUMNS)
    assert text.splitlines()[2].split() == ["rope", "3", "0.910", "0.910", "±", "0.010", "0.080", "0.080", "±",
                                           "0.010", "n/a", "0.910", "±", "0.010", "0.010", "±", "0.010"]
    bca = format_table(bca_table(records), BCA_COLUMNS).splitlines()
    assert bca[3].split()[-1] == "n/a"  # sinusoidal: no BCA


def test_record_mismatches():
    shipped = make_records(PAPER_LIKE)
    same = [dict(r) for r in reversed(shipped)]
    assert record_mismatches(same, shipped) == []
    same[0]["resolution"] += 5e-7
    assert record_mismatches(same, shipped) == []
    same[0]["resolution"] += 1e-4
    same[1]["perplexity_past_L"] = None if same[1]["perplexity_past_L"] is not None else 3.0
    problems = record_mismatches(same, shipped)
    assert len(problems) == 2
    assert sum(p.startswith("resolution differs") for p in problems) == 1
    assert sum(p.startswith("perplexity_past_L differs") for p in problems) == 1
    missing = record_mismatches(shipped[1:], shipped)
    assert len(missing) == 1 and missing[0].startswith("only in shipped")


def test_record_mismatches_compares_perplexity_before_L():
    shipped = make_records(PAPER_LIKE)
    changed = [dict(r) for r in shipped]
    changed[0]["perplexity_first_L"] += 1.0
    assert len(record_mismatches(changed, shipped)) == 1


def test_truncation_table_closed_forms():
    # Flat profiles: R = 1/N² under the "zero" boundary; the first L distances of 2L give 1/L² again.
    flat = {"flat": {L: np.zeros((2, 3, L)), 2 * L: np.zeros((2, 3, 2 * L))}}
    row = truncation_table(flat, L)[0]
    assert row["R(L)"] == pytest.approx(1 / L**2)
    assert row["R(2L), distances < L"] == pytest.approx(1 / L**2)
    assert row["R(2L)"] == pytest.approx(1 / (2 * L) ** 2)
    # A decay that rebounds past L: the whole drop is in the far distances.
    near = -np.arange(L, dtype=float)
    far = np.concatenate([near, np.zeros(L)])
    rows = truncation_table({"rebound": {L: np.tile(near, (2, 3, 1)), 2 * L: np.tile(far, (2, 3, 1))}}, L)
    assert rows[0]["R(2L), distances < L"] == pytest.approx(rows[0]["R(L)"])
    assert rows[0]["R(2L)"] == pytest.approx(float(resolution(far)))
    assert rows[0]["R(2L)"] < rows[0]["R(L)"]
    with pytest.raises(ValueError, match="eval lengths"):
        truncation_table({"x": {L: np.zeros((1, 1, L))}}, L)


def test_stat_bars_draw_one_bar_per_value():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnres_helpers.plots import plot_stat_bars

    fig, ax = plt.subplots()
    rows = pair_table(make_records(PAPER_LIKE))
    plot_stat_bars(rows, ["R(L)", "R(2L)+BCA"], ax=ax)
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == sorted(round(by_encoding(rows)[e][c].mean, 6) for e in ("rope", "sinusoidal", "alibi", "xpos")
                             for c in ("R(L)", "R(2L)+BCA") if by_encoding(rows)[e][c] is not None)
    assert [t.get_text() for t in ax.texts] == ["n/a"]  # sinusoidal with BCA
    plt.close(fig)
    assert math.isfinite(sum(heights))


def test_measured_profiles_and_position_perplexity_plots():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnres_helpers.plots import plot_measured_profiles, plot_position_perplexity

    fig, (left, right) = plt.subplots(1, 2)
    s_hat = np.zeros((3, 2, 2 * L))  # (layers, H, 2L)
    s_hat[..., L:] = -np.inf  # masked far distances (BCA) must leave a gap, not a line at -inf
    plot_measured_profiles({"T = 2L, BCA": s_hat}, L, ax=left)
    layer_lines = [line for line in left.lines if line.get_label().startswith("layer")]
    assert len(layer_lines) == 3
    assert np.isnan(layer_lines[0].get_ydata()[L:]).all() and (layer_lines[0].get_ydata()[:L] == 0).all()
    with pytest.raises(ValueError, match="profiles"):
        plot_measured_profiles({str(i): s_hat for i in range(5)}, L, ax=left)

    nll = np.log(np.arange(1.0, 4 * L + 1))  # perplexity 1, 2, 3, ...
    plot_position_perplexity({"model": nll}, L, ax=right, smooth=3)
    x, y = right.lines[0].get_data()
    assert len(y) == 4 * L - 2 and x[0] == 1.0  # centred on the middle of each 3 positions
    assert y[0] == pytest.approx(6 ** (1 / 3))  # exp of the mean log = geometric mean of 1, 2, 3
    with pytest.raises(ValueError, match="smooth"):
        plot_position_perplexity({"model": nll}, L, ax=right, smooth=0)
    plt.close(fig)
