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
    format_ratio,
    format_sig,
    min_max_decimate,
    readout_html,
)

NUMBER = r"(-?\d+(?:\.\d+)?(?:e[-+]\d+)?|undefined)"
PAIR = re.compile(rf"R\(L\) = {NUMBER} .*R\(2L\) = {NUMBER} .*R\(2L\)/R\(L\) = {NUMBER}")
JPEG = b"\xff\xd8"


def pair_in(text: str) -> tuple[float, float, float]:
    """The three numbers of a readout as shown (rounded to 3 significant figures); undefined -> nan."""
    match = PAIR.search(text)
    assert match, text
    return tuple(math.nan if g == "undefined" else float(g) for g in match.groups())


def shown(x: float) -> float:
    """x as the readout shows it."""
    return float(format_sig(x))


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


def test_readout_shows_the_pair_and_ratio_to_three_significant_figures():
    state = explorer_state("rope", 1024)
    r_L, r_2L, ratio = pair_in(readout_html(state))
    assert (r_L, r_2L) == (shown(state["R_L"]), shown(state["R_2L"]))
    assert ratio == shown(state["R_2L"] / state["R_L"])
    assert "R(L) = 0.00887 " in readout_html(state)


@pytest.mark.parametrize(
    "x, text",
    [(0.0088687, "0.00887"), (9.5367431640625e-07, "9.54e-07"), (1.2345e-05, "1.23e-05"), (1.0, "1.00"),
     (0.9996, "1.00"), (0.75255, "0.753"), (12.345, "12.3"), (0.001, "0.00100"), (0.00099949, "9.99e-04"),
     (12345.0, "1.23e+04"), (0.0, "0"), (-0.5, "-0.500"), (math.nan, "undefined")],
)
def test_format_sig(x, text):
    assert format_sig(x) == text


def test_nope_at_its_defaults_shows_its_tiny_values_not_zeros():
    state = explorer_state("nope", 1024)  # flat curve: R = 1/L^2 at L, 1/(2L)^2 at 2L
    assert state["R_L"] == pytest.approx(1 / 1024**2) and state["R_2L"] == pytest.approx(1 / 2048**2)
    text = readout_html(state)
    assert "R(L) = 9.54e-07 " in text and "R(2L) = 2.38e-07 " in text and "R(2L)/R(L) = 0.250" in text
    assert "0.0000" not in text


def test_readout_says_when_the_ratio_is_undefined():
    state = explorer_state("nope", 64, boundary="drop")  # flat: R = 0 exactly
    assert math.isnan(state["ratio"])
    assert "R(L) = 0 " in readout_html(state) and "R(2L)/R(L) = undefined" in readout_html(state)
    assert format_ratio(1e-13, math.nan) == "undefined (R(L) < 1e-12)"


def test_compare_states_use_each_encodings_defaults():
    states = compare_states(["rope", "alibi"], 128)
    assert [s["name"] for s in states] == ["rope", "alibi"]
    text = compare_readout_html(states)
    for s in states:
        assert f"R(L) = {format_sig(s['R_L'])} " in text and f"R(2L) = {format_sig(s['R_2L'])} " in text
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
    assert pair_in(readout.value)[:2] == (shown(rope["R_L"]), shown(rope["R_2L"]))  # default encoding is rope
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


def test_single_figure_title_names_the_encoding():
    figure = SingleFigure()
    figure.render(explorer_state("rope", 256))
    assert figure.ax_s.get_title() == "design-time score s[n] of rope"
    figure.render(explorer_state("alibi", 256))
    assert figure.ax_s.get_title() == "design-time score s[n] of alibi (ALiBi: heads thin, mean bold)"


def test_reset_restores_the_defaults():
    ui = explorer("rope", 512)
    readout = part(ui, "attnres-readout")
    head_mode, boundary = part(ui, "attnres-head-mode"), next(
        w for w in ui.children[0].children[4].children if getattr(w, "description", None) == "boundary")
    part(ui, "attnres-slider-scale").value = 16.0
    part(ui, "attnres-slider-rho").value = 0.5
    part(ui, "attnres-slider-L").value = 1024
    boundary.value = "drop"
    head_mode.value = "mean-R"
    assert readout.value != readout_html(explorer_state("rope", 512))
    button = part(ui, "attnres-reset")
    assert isinstance(button, widgets.Button) and button.description == "reset to defaults"
    button.click()  # what a press in the browser does: the on_click handler
    for key, param in DESIGN_CURVES["rope"].params.items():
        assert part(ui, f"attnres-slider-{key}").value == pytest.approx(param.default)
    assert part(ui, "attnres-slider-L").value == 512
    assert (boundary.value, head_mode.value) == ("zero", "mean-scores")
    assert readout.value == readout_html(explorer_state("rope", 512))
    assert part(ui, "attnres-error").layout.display == "none"


def test_reset_after_switching_encoding_and_back():
    ui = explorer()
    dropdown = next(w for w in ui.children[0].children[1].children if isinstance(w, widgets.Dropdown))
    part(ui, "attnres-slider-scale").value = 2.0
    dropdown.value = "alibi"
    part(ui, "attnres-slider-heads").value = 4
    ui.reset_to_defaults()
    assert part(ui, "attnres-slider-heads").value == 8
    dropdown.value = "rope"  # choosing an encoding again starts from its defaults
    assert part(ui, "attnres-slider-scale").value == pytest.approx(8.0)
    assert part(ui, "attnres-readout").value == readout_html(explorer_state("rope", 1024))


def test_head_convention_is_disabled_with_a_reason_for_single_head_curves():
    ui = explorer()
    head_mode, note = part(ui, "attnres-head-mode"), part(ui, "attnres-head-note")
    assert head_mode.description == "head convention"
    assert head_mode.disabled and "only ALiBi" in note.value  # rope: one curve
    dropdown = next(w for w in ui.children[0].children[1].children if isinstance(w, widgets.Dropdown))
    dropdown.value = "alibi"
    assert not head_mode.disabled and note.value == ""
    assert part(ui, "attnres-slider-heads").description == "number of heads"
    part(ui, "attnres-slider-heads").value = 1  # one head: the convention cannot act
    assert head_mode.disabled
    dropdown.value = "nope"
    assert head_mode.disabled
    mode = next(w for w in ui.children[0].children if isinstance(w, widgets.ToggleButtons))
    mode.value = "compare"  # the default selection includes alibi
    assert not head_mode.disabled
