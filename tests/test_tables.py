"""Tables from records: seed statistics, the paper's values, the reversal checks, formatting."""

import math

import matplotlib
import numpy as np
import pytest
import torch

from attnres_helpers import store
from attnres_helpers.checks import CHECK_DESCRIPTIONS, checks_table, format_checks, reversal_checks
from attnres_helpers.metric import layer_resolution, resolution
from attnres_helpers.store import Profile
from attnres_helpers.store import records as store_records
from attnres_helpers.tables import (
    BCA_COLUMNS,
    NBSP,
    PAIR_COLUMNS,
    PAIR_SINK_COLUMNS,
    PAPER_TABLE3,
    TRUNCATION_COLUMNS,
    Stat,
    Table,
    bca_table,
    format_table,
    last_distance_weights,
    layer_table,
    pair_table,
    record_mismatches,
    resolution_stat,
    scores_profile,
    select_layer,
    sink_free_records,
    sink_table,
    temperature_for,
    truncated_profile,
    truncation_rows,
    truncation_table,
)

L = 8
# The paper's Table 3 as if measured on three seeds: seed s adds (s − 1)·0.01 (spread 0.01).
PAPER_LIKE = {
    ("rope", 1, False): 0.91,
    ("rope", 2, False): 0.08,
    ("rope", 2, True): 0.91,
    ("sinusoidal", 1, False): 0.87,
    ("sinusoidal", 2, False): 0.28,
    ("alibi", 1, False): 0.81,
    ("alibi", 2, False): 0.88,
    ("alibi", 2, True): 0.81,
    ("xpos", 1, False): 0.98,
    ("xpos", 2, False): 0.54,
    ("xpos", 2, True): 0.98,
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
                    records.append(
                        {
                            "encoding": encoding,
                            "seed": seed,
                            "train_len": L,
                            "eval_len": k * L,
                            "bca": bca,
                            "head_mode": head_mode,
                            "layer": layer,
                            "resolution": value,
                            "perplexity": ppl,
                            "perplexity_first_L": ppl - 1 + first_shift if k > 1 else ppl,
                            "perplexity_past_L": ppl + 1 + past_shift if k > 1 else None,
                        }
                    )
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
        "sinusoidal": (0.87, 0.28),
        "alibi": (0.81, 0.88),
        "rope": (0.91, 0.08),
        "xpos": (0.98, 0.54),
    }
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


def test_pair_table_copy_columns_are_seed_means_of_the_records_gains():
    records = make_records(PAPER_LIKE)
    for r in records:  # gains known per (encoding, seed, bca); the same at every length, as in a store
        if r["encoding"] == "rope":
            r["copy_gain_within_L"] = 0.1 * r["seed"] + 0.5 * r["bca"]
            r["copy_gain_past_L"] = -0.01 * r["seed"]
    rows = by_encoding(pair_table(records))
    assert rows["rope"]["copy within L"].values == pytest.approx((0.0, 0.1, 0.2))
    assert rows["rope"]["copy within L+BCA"].mean == pytest.approx(0.6)
    assert rows["rope"]["copy past L"].mean == pytest.approx(-0.01)
    assert rows["alibi"]["copy past L"] is None and pair_table(make_records(PAPER_LIKE))[0]["copy past L"] is None


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


@pytest.mark.parametrize(
    "change, shifts, failing",
    [
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
    ],
)
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
        assert xpos["BCA ×(2L)"].mean == pytest.approx(
            np.mean([(0.98 + shift + (s - 1) * 0.01) / (0.54 + shift + (s - 1) * 0.01) for s in range(3)])
        )
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
    rows = [
        {"encoding": "rope", "seeds": 3, "R(L)": Stat.of({0: 0.1, 1: 0.3}), "R(2L)": -0.00004},
        {"encoding": "sinusoidal", "seeds": 1, "R(L)": Stat.of({0: 0.25}), "R(2L)": None},
    ]
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
    records = make_records(
        PAPER_LIKE
        | {
            ("rope", 4, False): 0.01,
            ("sinusoidal", 4, False): 0.02,
            ("alibi", 4, False): 0.8,
            ("xpos", 4, False): 0.3,
            ("rope", 4, True): 0.9,
            ("alibi", 4, True): 0.8,
            ("xpos", 4, True): 0.97,
        }
    )
    text = format_table(pair_table(records), PAIR_COLUMNS)
    assert text.splitlines()[2].split() == [
        "rope",
        "3",
        "0.910",
        "0.910",
        "±",
        "0.010",
        "0.080",
        "0.080",
        "±",
        "0.010",
        "n/a",
        "0.910",
        "±",
        "0.010",
        "0.010",
        "±",
        "0.010",
    ]
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


def test_record_mismatches_compares_R_without_the_sink():
    shipped = store_records(stored_profiles(multiples=(1,)))
    changed = [dict(r) for r in shipped]
    assert record_mismatches(changed, shipped) == []
    changed[3]["resolution_sink_free"] *= 1 + 1e-4
    changed[5]["resolution_sink_free"] = None
    problems = record_mismatches(changed, shipped)
    assert len(problems) == 2 and all(p.startswith("resolution_sink_free differs") for p in problems)


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
    assert heights == sorted(
        round(by_encoding(rows)[e][c].mean, 6)
        for e in ("rope", "sinusoidal", "alibi", "xpos")
        for c in ("R(L)", "R(2L)+BCA")
        if by_encoding(rows)[e][c] is not None
    )
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


# --- tables for a notebook: HTML and Markdown that reflow, plain text unchanged ------------------------


def _notebook_rows():
    return [
        {"encoding": "rope", "seeds": 3, "R(L)": Stat.of({0: 0.1, 1: 0.3}), "R(2L)": -0.00004},
        {"encoding": "<b>x|y</b>", "seeds": 1, "R(L)": Stat.of({0: 0.25}), "R(2L)": None},
    ]


def test_table_plain_text_is_format_table():
    rows, columns = _notebook_rows(), ["encoding", "seeds", "R(L)", "R(2L)"]
    table = Table(rows, columns)
    assert str(table) == repr(table) == format_table(rows, columns)
    captioned = Table(rows, columns, digits={"R(L)": 1}, caption="ours")
    assert str(captioned) == "ours\n" + format_table(rows, columns, digits={"R(L)": 1})
    with pytest.raises(ValueError, match=r"\['R\(8L\)'\] are in no row"):
        Table(rows, ["encoding", "R(8L)"])
    with pytest.raises(ValueError, match="empty"):
        Table([], ["encoding"])


def test_table_html_keeps_each_value_on_one_line_and_escapes():
    html = Table(_notebook_rows(), ["encoding", "seeds", "R(L)", "R(2L)"], caption="a & b")._repr_html_()
    assert html.startswith("<table><caption") and html.endswith("</tbody></table>")
    assert html.count("<th ") == 4 and html.count("<td ") == 8 and html.count("<tr>") == 3
    assert "a &amp; b</caption>" in html
    # "mean ± spread" may break only before its "±": a narrow page puts the spread under the mean,
    # never a bare "±" at the end of a line.
    assert f">0.200 ±{NBSP}0.141</td>" in html and "± " not in html
    assert ">n/a</td>" in html and ">0.000</td>" in html  # no "-0.000"
    assert "&lt;b&gt;x|y&lt;/b&gt;" in html and "<b>" not in html


def test_table_markdown_is_a_pipe_table():
    lines = Table(_notebook_rows(), ["encoding", "seeds", "R(L)"], caption="ours")._repr_markdown_().split("\n")
    assert lines[:2] == ["**ours**", ""]
    assert lines[2] == "| encoding | seeds | R(L) |"
    assert lines[3] == "| :--- | ---: | ---: |"
    assert lines[4] == f"| rope | 3 | 0.200 ±{NBSP}0.141 |"
    assert lines[5] == "| <b>x\\|y</b> | 1 | 0.250 |"  # a "|" in a cell is escaped
    assert len(lines) == 6


def test_checks_table():
    checks = reversal_checks(make_records(PAPER_LIKE))
    table = checks_table(checks, caption="paper-like")
    assert table.columns == ["finding", "on the seed means", "seeds"]
    assert [row[0] for row in table.cells] == [CHECK_DESCRIPTIONS[name] for name in checks]
    assert table.cells[0][1:] == ["True", "3 of 3"]


# --- R from stored ŝ is the store's query ---------------------------------------------------------------

TL = 16  # training length of the stored-profile fixtures


def stored_profiles(encodings=(("steep", 0.5), ("rebound", 0.2)), seeds=(0, 1), multiples=(1, 2, 4), layers=2, H=2):
    """Store Profiles with key-0 scores: each layer a geometric decay −m·n whose slope m depends on
    encoding, seed and layer; "rebound" climbs back to 0 past L. key0[n] = ŝ[n] + 1 (a mild
    first-token excess)."""
    out = []
    for encoding, m in encodings:
        for seed in seeds:
            meta = {"encoding": encoding, "seed": seed, "train_len": TL}
            for k in multiples:
                T = k * TL
                n = torch.arange(T, dtype=torch.float64)
                slopes = m * (1 + 0.25 * seed) * (1 + torch.arange(layers, dtype=torch.float64))  # (layers,)
                s = -slopes[:, None] * n  # (layers, T)
                if encoding == "rebound":
                    s = torch.where(n < TL, s, torch.zeros_like(s))
                s_hat = s[:, None, :].expand(layers, H, T).clone()
                out.append(
                    Profile(
                        f"{encoding}-s{seed}",
                        meta,
                        T,
                        False,
                        s_hat,
                        torch.full((T,), 1.5, dtype=torch.float64),
                        s_hat + 1.0,
                    )
                )
    return out


def test_truncated_profile():
    p = stored_profiles(multiples=(2,))[0]
    cut = truncated_profile(p, TL)
    assert cut.eval_len == TL and cut.run == p.run and cut.bca == p.bca and cut.key0 is None
    assert torch.equal(cut.s_hat, p.s_hat[..., :TL]) and torch.equal(cut.nll, p.nll[:TL])
    assert cut.layer_resolutions(sink=False) is None  # no R without the sink for a cut profile
    assert torch.allclose(cut.layer_resolutions(), layer_resolution(p.s_hat[..., :TL].double()), rtol=1e-12, atol=0)
    averaged = Profile(p.run, {**p.meta, "heads_averaged": [2 * TL]}, p.eval_len, False, p.s_hat[:, :1], p.nll)
    assert truncated_profile(averaged, TL).heads_averaged
    assert not truncated_profile(
        Profile(p.run, {**p.meta, "heads_averaged": [TL]}, p.eval_len, False, p.s_hat, p.nll), TL
    ).heads_averaged
    for bad in (1, 2 * TL + 1, 3.0, True):
        with pytest.raises(ValueError, match="n_distances"):
            truncated_profile(p, bad)


def test_select_layer_matches_the_records():
    p = stored_profiles(multiples=(1,), layers=3)[0]
    per_layer = p.layer_resolutions()
    by_layer = {r["layer"]: r["resolution"] for r in store_records([p], head_modes=("mean-scores",))}
    for layer in ("mean", "upper", 0, 2):
        assert select_layer(per_layer, layer) == pytest.approx(by_layer[layer], rel=1e-12)
    with pytest.raises(ValueError, match="layer"):
        select_layer(per_layer, 3)
    with pytest.raises(ValueError, match="one-layer"):
        select_layer(per_layer[:1], "upper")


def _count_store_queries(monkeypatch):
    """Replace Profile.layer_resolutions by one that returns 1 + (its eval length)/1000 in every layer
    and counts its calls: a table that computes R by itself does not show these values."""
    calls = []

    def fake(self, head_mode="mean-scores", boundary="zero", temperature=1.0, sink=True):
        calls.append((self.eval_len, head_mode, boundary, temperature, sink))
        return torch.full((self.s_hat.shape[0],), 1 + self.eval_len / 1000, dtype=torch.float64)

    monkeypatch.setattr(store.Profile, "layer_resolutions", fake)
    return calls


def test_truncation_table_queries_the_store(monkeypatch):
    near = -np.arange(L, dtype=float)
    calls = _count_store_queries(monkeypatch)
    row = truncation_table({"x": {L: np.tile(near, (2, 3, 1)), 2 * L: np.tile(np.r_[near, near], (2, 3, 1))}}, L)[0]
    assert row == {
        "encoding": "x",
        "R(L)": 1 + L / 1000,
        "R(2L), distances < L": 1 + L / 1000,
        "R(2L)": 1 + 2 * L / 1000,
    }
    assert sorted(c[0] for c in calls) == [L, L, 2 * L]


def test_truncation_rows_over_seeds():
    profiles = stored_profiles()
    rows = {row["encoding"]: row for row in truncation_rows(profiles, "upper")}
    assert list(rows) == ["rebound", "steep"] and set(rows["steep"]) == set(TRUNCATION_COLUMNS)
    for encoding in ("steep", "rebound"):
        for seed, value in zip((0, 1), rows[encoding]["R(2L)"].values):
            s = next(p for p in profiles if p.run == f"{encoding}-s{seed}" and p.eval_len == 2 * TL).s_hat.double()
            assert value == pytest.approx(float(layer_resolution(s)[1:].mean()), rel=1e-12)
            assert rows[encoding]["R(2L), distances < L"].values[seed] == pytest.approx(
                float(layer_resolution(s[..., :TL])[1:].mean()), rel=1e-12
            )
    # A steep decay has almost no weight past L (x^L = e^{−1·16} ≈ 1e-7 in its gentlest upper layer):
    # R barely moves. The rebound loses R only past L.
    assert rows["steep"]["R(2L)"].mean == pytest.approx(rows["steep"]["R(L)"].mean, rel=1e-5)
    assert rows["rebound"]["R(2L), distances < L"].mean == pytest.approx(rows["rebound"]["R(L)"].mean, rel=1e-12)
    assert rows["rebound"]["R(2L)"].mean < 0.5 * rows["rebound"]["R(L)"].mean
    with pytest.raises(ValueError, match="need"):
        truncation_rows([p for p in profiles if p.eval_len != 2 * TL])


def test_truncation_rows_query_the_store(monkeypatch):
    profiles = stored_profiles()
    calls = _count_store_queries(monkeypatch)
    row = truncation_rows(profiles)[1]
    assert row["encoding"] == "steep" and row["R(L)"].mean == 1 + TL / 1000 and row["R(2L)"].mean == 1 + 2 * TL / 1000
    assert row["R(2L), distances < L"].mean == 1 + TL / 1000
    assert len(calls) == 2 * 2 * 3  # encodings × seeds × the three columns


def test_sink_free_columns_are_the_records_values():
    records = store_records(stored_profiles())
    rows = {row["encoding"]: row for row in pair_table(records, layer="upper", sink_free=True)}
    assert set(PAIR_SINK_COLUMNS) <= set(rows["steep"]) | {"paper R(L)", "paper R(2L)", "paper R(2L)+BCA"}
    expected = {
        r["seed"]: r["resolution_sink_free"]
        for r in records
        if r["encoding"] == "steep"
        and r["eval_len"] == 2 * TL
        and r["layer"] == "upper"
        and r["head_mode"] == "mean-scores"
    }
    assert rows["steep"]["R(2L) no sink"] == Stat.of(expected)
    assert rows["steep"]["R(2L) no sink"].mean != pytest.approx(rows["steep"]["R(2L)"].mean, rel=1e-3)
    assert "R(L) no sink" not in pair_table(records)[0]  # off by default: the old columns only
    layer_rows = layer_table(records, "rebound", sink_free=True)
    assert layer_rows[1]["R(4L) no sink"] == Stat.of(
        {
            r["seed"]: r["resolution_sink_free"]
            for r in records
            if r["encoding"] == "rebound"
            and r["layer"] == 1
            and r["eval_len"] == 4 * TL
            and r["head_mode"] == "mean-scores"
        }
    )
    free = sink_free_records(records)
    assert [r["resolution"] for r in free] == [r["resolution_sink_free"] for r in records]
    assert records[0]["resolution"] != free[0]["resolution"]  # copies: the records are unchanged
    with pytest.raises(ValueError, match="resolution_sink_free"):
        sink_free_records(make_records(PAPER_LIKE))


def test_last_distance_weights_show_a_first_token_sink():
    T = 2 * TL
    flat = scores_profile(np.zeros((2, 3, T)), TL)
    assert torch.allclose(last_distance_weights(flat), torch.full((2,), 1 / T, dtype=torch.float64), rtol=1e-12)
    sink = np.tile(-np.arange(T, dtype=float) / 4, (2, 3, 1))
    sink[1, :, -1] = 20.0  # layer 1: the last query's score on key 0 far above the rest
    weights = last_distance_weights(scores_profile(sink, TL))
    p = np.exp(sink[1, 0] - np.logaddexp.reduce(sink[1, 0]))
    assert weights[1] == pytest.approx(p[-1], rel=1e-12) and weights[1] > 0.99 and weights[0] < 1e-3
    # Heads averaged as mean-scores R averages them: one head masked at a distance drops out there.
    masked = np.zeros((1, 2, T))
    masked[0, 1, -1] = -np.inf
    assert last_distance_weights(scores_profile(masked, TL))[0] == pytest.approx(1 / T, rel=1e-12)
    rows = sink_table(stored_profiles(), multiples=(1, 2))
    assert [row["encoding"] for row in rows] == ["rebound", "steep"]
    assert rows[0]["1/T at 2L"] == 1 / (2 * TL) and rows[0]["p(T−1) at L"].seeds == (0, 1)


def test_resolution_stat_and_temperature_for_a_geometric_profile():
    profiles = stored_profiles(encodings=(("steep", 0.1),), seeds=(0,), layers=1)
    r = resolution_stat(profiles, "steep", 2, temperature=3.0)
    assert r.values[0] == pytest.approx(float(resolution(-0.3 * np.arange(2 * TL))), rel=1e-12)
    # R(τ·ŝ) of s = −0.1 n is the geometric closed form at slope 0.1 τ: R = 0.8 needs x = e^{−m} with
    # (1 − x)²/(1 + x) = 0.8 up to x^N terms, so τ = m/0.1 (x^N ≈ 1e-18 at N = 16).
    x = ((2 + 0.8) - math.sqrt((2 + 0.8) ** 2 - 4 * (1 - 0.8))) / 2
    tau = temperature_for(profiles, "steep", 0.8)
    assert tau == pytest.approx(-math.log(x) / 0.1, rel=1e-6)
    assert resolution_stat(profiles, "steep", 1, temperature=tau).mean == pytest.approx(0.8, abs=1e-8)
    with pytest.raises(ValueError, match="bracket"):
        temperature_for(profiles, "steep", 0.8, bounds=(1.0, 2.0))
    with pytest.raises(ValueError, match="no profiles"):
        resolution_stat(profiles, "rope")


def test_scrambled_control_rows_average_each_gap_over_seeds():
    from attnres_helpers.copy_tables import scrambled_control_rows
    from attnres_helpers.probe import CopyCurve

    gaps = (0, 64, 192)

    def curve(gain):  # a gain of ``gain`` at every gap and probe
        return CopyCurve(gaps, torch.ones(3, 4, dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64) + gain)

    control = {("rope-s0", False): curve(0.1), ("rope-s1", False): curve(0.3), ("rope-s0", True): curve(9.0)}
    curves = {("rope-s0", False): curve(1.0), ("rope-s1", False): curve(2.0)}
    (row,) = scrambled_control_rows(curves, control, 128)
    assert (
        row["seeds"] == 2
        and row["g = L/2"].mean == pytest.approx(0.2)
        and row["g = 3L/2"].values == pytest.approx((0.1, 0.3))
    )
    assert row["unrelated, g = L/2"].mean == pytest.approx(1.5)  # the BCA curve is left out
