"""checks.py: notebook 03's findings as one table (checks_grid), notebook 04's sink paragraph (sink_note), and
plots.pair_figure (the pairs as one figure)."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from attnres_helpers.checks import CHECK_DESCRIPTIONS, Check, checks_grid  # noqa: E402


def _check(holds, n):
    return Check(holds, n, 3)


def test_checks_grid_has_a_row_per_finding_and_a_column_per_set():
    names = list(CHECK_DESCRIPTIONS)[:2]
    found = {
        ("mean", "mean-scores"): {names[0]: _check(True, 3), names[1]: _check(False, 0)},
        ("upper", "mean-R"): {names[0]: _check(True, 2), names[1]: _check(True, 3)},
    }
    table = checks_grid(found)
    assert table.columns == ["finding", "mean, mean-scores", "upper, mean-R"]
    assert table.cells == [
        [CHECK_DESCRIPTIONS[names[0]], "holds, 3 of 3", "holds, 2 of 3"],
        [CHECK_DESCRIPTIONS[names[1]], "not, 0 of 3", "holds, 3 of 3"],
    ]
    with pytest.raises(ValueError, match="same findings"):
        checks_grid({("mean", "mean-R"): {names[0]: _check(True, 3)}, ("upper", "mean-R"): {names[1]: _check(True, 3)}})


def test_pair_figure_has_four_panels_and_marks_the_papers_values_in_the_layer_mean_ones():
    from attnres_helpers import experiments
    from attnres_helpers.plots import pair_figure
    from attnres_helpers.store import load_profiles, records

    recs = records(load_profiles(experiments.STORE)[0])
    fig = pair_figure(recs)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == [
        "layers 'mean', mean-scores",
        "layers 'mean', mean-R",
        "layers 'upper', mean-scores",
        "layers 'upper', mean-R",
    ]
    paper_marks = [sum(c.get_offsets().shape[0] for c in ax.collections if c.get_zorder() == 4) for ax in axes]
    assert paper_marks[0] == paper_marks[1] > 0 and paper_marks[2] == paper_marks[3] == 0


def test_sink_note_names_the_encodings_on_each_side_and_the_largest_change():
    from attnres_helpers.checks import sink_note

    def rec(encoding, run, T, bca, r, free, layer="mean"):
        return {"encoding": encoding, "run": run, "eval_len": T, "bca": bca, "layer": layer,
                "resolution": r, "resolution_sink_free": free}  # fmt: skip

    records = [
        rec("rope", "rope-s0", 128, False, 0.10, 0.101),  # 1% change
        rec("alibi", "alibi-s0", 256, False, 0.02, 0.0202),  # 1%
        rec("nope", "nope-s0", 512, True, 0.01, 0.05),  # 400%: the largest
        rec("nope", "nope-s1", 256, False, 0.01, 0.02),  # 100%
        rec("rope", "rope-s0", 128, False, 0.10, 9.9, layer=1),  # not a layer mean: ignored
    ]
    shift, text = sink_note(records, ["rope", "alibi", "nope"], train_len=128)
    assert shift == pytest.approx({"rope": 0.01, "alibi": 0.01, "nope": 4.0}, rel=1e-9)
    assert text.startswith("For rope and alibi the first-token entries move the layer-mean $R$ by less than 5%")
    assert (
        "nope is different: without the sink the layer-mean $R$ moves by up to 400% (nope-s0, $T = 4L$, with BCA)"
        in text
    )
