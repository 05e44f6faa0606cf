"""The explorer without a kernel: its pure update functions, and its widgets driven by .value."""

import math
import re

import numpy as np
import pytest
import ipywidgets as widgets

from attnres_helpers.encodings import DESIGN_CURVES, resolution_pair
from attnres_helpers.widgets import (
    SingleFigure,
    compare_readout_html,
    compare_states,
    explorer,
    explorer_state,
    find_by_class,
    min_max_decimate,
    readout_html,
)

PAIR = re.compile(r"R\(L\) = (-?\d\.\d{4}) .*R\(2L\) = (-?\d\.\d{4}) .*R\(2L\)/R\(L\) = (-?\d+\.\d{4})")
JPEG = b"\xff\xd8"


def pair_in(text: str) -> tuple[float, float, float]:
    match = PAIR.search(text)
    assert match, text
    return tuple(float(g) for g in match.groups())


@pytest.fixture(scope="module")
def ui():
    return explorer()


def part(root, css_class):
    found = find_by_class(root, css_class)
    assert found is not None, f"no widget with class {css_class}"
    return found


# --------------------------------------------------------------------------- pure functions


@pytest.mark.parametrize("name", list(DESIGN_CURVES))
def test_state_matches_resolution_pair_and_weights_are_distributions(name):
    state = explorer_state(name, 200, head_mode="mean-R")
    assert (state["R_L"], state["R_2L"]) == pytest.approx(resolution_pair(name, 200, head_mode="mean-R"))
    assert state["profile"].shape == (400,)
    assert state["weights_L"].shape == (200,) and state["weights_2L"].shape == (400,)
    for w in (state["weights_L"], state["weights_2L"]):
        assert w.sum() == pytest.approx(1.0) and np.all(w >= 0)


def test_readout_shows_the_pair_and_ratio_to_four_decimals():
    state = explorer_state("rope", 1024)
    r_L, r_2L, ratio = pair_in(readout_html(state))
    assert (r_L, r_2L) == (round(state["R_L"], 4), round(state["R_2L"], 4))
    assert ratio == round(state["R_2L"] / state["R_L"], 4)


def test_readout_says_when_the_ratio_is_undefined():
    state = explorer_state("nope", 64, boundary="drop")  # flat: R = 0 exactly
    assert math.isnan(state["ratio"])
    assert "R(L) = 0.0000" in readout_html(state) and "n/a" in readout_html(state)


def test_compare_states_use_each_encodings_defaults():
    states = compare_states(["rope", "alibi"], 128)
    assert [s["name"] for s in states] == ["rope", "alibi"]
    text = compare_readout_html(states)
    for s in states:
        assert f"R(L) = {s['R_L']:.4f}" in text and f"R(2L) = {s['R_2L']:.4f}" in text
    with pytest.raises(ValueError, match="at least one encoding"):
        compare_states([], 128)


def test_min_max_decimate_keeps_every_runs_extremes():
    rng = np.random.default_rng(1)
    x, y = np.arange(4100) / 100, rng.standard_normal((3, 4100))
    xs, ys = min_max_decimate(x, y, buckets=400)
    assert xs.shape == ys.shape and xs.shape[-1] < 1000
    assert np.all(np.diff(xs, axis=-1) > 0)  # in order
    runs = y[:, :4000].reshape(3, 400, 10)
    for row in range(3):
        kept = set(ys[row])
        assert set(runs[row].max(-1)) <= kept and set(runs[row].min(-1)) <= kept
    short = np.arange(50.0)
    assert min_max_decimate(short, short)[1] is short  # nothing to gain: unchanged


def test_single_figure_draws_each_state():
    figure = SingleFigure()
    first, second = figure.render(explorer_state("rope", 256)), figure.render(explorer_state("alibi", 256))
    assert first.startswith(JPEG) and second.startswith(JPEG) and first != second


# --------------------------------------------------------------------------- the widget


def test_layout_and_contract_classes(ui):
    assert isinstance(ui, widgets.VBox)
    readout, length = part(ui, "attnres-readout"), part(ui, "attnres-slider-L")
    assert isinstance(readout, widgets.HTML)
    assert isinstance(length, widgets.IntSlider) and not length.continuous_update
    rope = explorer_state("rope", length.value)
    assert pair_in(readout.value)[:2] == (round(rope["R_L"], 4), round(rope["R_2L"], 4))  # default encoding is rope
    for key, param in DESIGN_CURVES["rope"].params.items():
        slider = part(ui, f"attnres-slider-{key}")
        assert slider.value == pytest.approx(param.default) and not slider.continuous_update
    assert bytes(part(ui, "attnres-plot").value).startswith(JPEG)


def test_one_step_of_the_length_slider_changes_the_readout():
    ui = explorer()
    readout, length = part(ui, "attnres-readout"), part(ui, "attnres-slider-L")
    before = readout.value
    length.value = length.value + length.step  # what ArrowRight does in the browser
    assert readout.value != before
    assert pair_in(readout.value)[:2] != pair_in(before)[:2]  # the R values themselves moved, not only the ratio
    assert readout.value == readout_html(explorer_state("rope", length.value))


def test_the_scale_slider_changes_the_readout():
    ui = explorer()
    readout, scale = part(ui, "attnres-readout"), part(ui, "attnres-slider-scale")
    before = pair_in(readout.value)
    scale.value = 16.0
    assert pair_in(readout.value)[0] > before[0]  # hotter scores, sharper profile
    assert readout.value == readout_html(explorer_state("rope", 1024, {"scale": 16.0}))


def test_switching_encoding_rebuilds_sliders_from_the_registry():
    ui = explorer()
    dropdown = next(w for w in ui.children[0].children[1].children if isinstance(w, widgets.Dropdown))
    dropdown.value = "t5"
    for key, param in DESIGN_CURVES["t5"].params.items():
        assert part(ui, f"attnres-slider-{key}").value == param.default
    assert find_by_class(ui, "attnres-slider-base") is None
    assert part(ui, "attnres-readout").value == readout_html(explorer_state("t5", 1024))


def test_callback_errors_are_shown_in_the_widget():
    ui = explorer("t5", 256)
    error, readout = part(ui, "attnres-error"), part(ui, "attnres-readout")
    assert error.layout.display == "none"
    part(ui, "attnres-slider-num_buckets").value = 128
    before = readout.value
    part(ui, "attnres-slider-max_distance").value = 8  # <= num_buckets // 2: invalid
    assert error.layout.display != "none"
    assert "ValueError" in error.value and "max_distance must exceed" in error.value
    assert readout.value == before
    part(ui, "attnres-slider-max_distance").value = 128
    assert error.layout.display == "none" and error.value == ""


def test_compare_mode_overlays_several_encodings():
    ui = explorer()
    mode = next(w for w in ui.children[0].children if isinstance(w, widgets.ToggleButtons))
    mode.value = "compare"
    readout = part(ui, "attnres-readout").value
    for name in ("rope", "alibi", "t5"):
        assert f"<b>{name}</b>" in readout
    assert bytes(part(ui, "attnres-plot").value).startswith(JPEG)
    chooser = next(w for w in ui.children[0].children if isinstance(w, widgets.SelectMultiple))
    chooser.value = ()
    assert "at least one encoding" in part(ui, "attnres-error").value


def test_explorer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown encoding 'rotary'; known encodings: sinusoidal, rope"):
        explorer("rotary")
    with pytest.raises(ValueError, match=r"L must be an integer in \[16, 2048\]"):
        explorer("rope", 4096)
