"""The design-time explorer without a kernel (attnres_helpers.widgets.design, design_explorer, design_figures,
render, pictures): its pure update functions, its widgets driven by .value, and the blitted figures of both
explorers. The trained-model explorer: tests/test_widgets_trained.py."""

import asyncio
import math
import re
import threading
import time

import ipywidgets as widgets
import numpy as np
import pytest
from helpers import part, past_the_redraw_timer, shown

from attnres_helpers import experiments
from attnres_helpers.encodings import DESIGN_CURVES, resolution_pair
from attnres_helpers.metric import resolution
from attnres_helpers.widgets import (
    CLOSE_SCORE_NATS,
    COMPARE_DEFAULT,
    FIGURE_DPI,
    CompareFigure,
    SingleFigure,
    TrainedFigure,
    close_on_plot,
    coinciding,
    compare_readout_html,
    compare_states,
    default_picture,
    distance_ticks,
    explorer,
    explorer_notes,
    explorer_state,
    find_by_class,
    format_ratio,
    format_sig,
    help_html,
    min_max_decimate,
    readout_html,
    rgb_png,
    save_default_image,
    slider_bounds,
    trained_explorer,
    trained_state,
)
from attnres_helpers.widgets.render import PNG_SIGNATURE, WIDGET_LOCK, LatestWins, serialized, state_update

NUMBER = r"(-?\d+(?:\.\d+)?(?:e[-+]\d+)?|undefined)"
PAIR = re.compile(rf"R\(L\) = {NUMBER} .*R\(2L\) = {NUMBER} .*R\(2L\)/R\(L\) = {NUMBER}")
PNG = PNG_SIGNATURE


def pair_in(text: str) -> tuple[float, float, float]:
    """The three numbers of a readout as shown (rounded to 3 significant figures); undefined -> nan."""
    match = PAIR.search(text)
    assert match, text
    return tuple(math.nan if g == "undefined" else float(g) for g in match.groups())


@pytest.fixture(scope="module")
def ui():
    return explorer()


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
    [
        (0.0088687, "0.00887"),
        (9.5367431640625e-07, "9.54e-07"),
        (1.2345e-05, "1.23e-05"),
        (1.0, "1.00"),
        (0.9996, "1.00"),
        (0.75255, "0.753"),
        (12.345, "12.3"),
        (0.001, "0.00100"),
        (0.00099949, "9.99e-04"),
        (12345.0, "1.23e+04"),
        (0.0, "0"),
        (-0.5, "-0.500"),
        (math.nan, "undefined"),
    ],
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
    assert first.startswith(PNG) and second.startswith(PNG) and first != second


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
    assert bytes(part(ui, "attnres-plot").value).startswith(PNG)


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
    dropdown = part(ui, "attnres-encoding")
    dropdown.value = "t5"
    for key, param in DESIGN_CURVES["t5"].params.items():
        assert part(ui, f"attnres-slider-{key}").value == param.default
    assert find_by_class(ui, "attnres-slider-base") is None
    assert part(ui, "attnres-readout").value == readout_html(explorer_state("t5", 1024))


def test_callback_errors_are_shown_in_the_widget():
    """An L outside the slider's range, typed in the box, is refused in the widget; the plot and readout keep
    the last valid L. (Until T5's max_distance slider started above num_buckets // 2, this test set an
    invalid max_distance; no slider can reach that error now: test_t5_max_distance_slider_stays_valid.)"""
    ui = explorer("t5", 256)
    error, readout = part(ui, "attnres-error"), part(ui, "attnres-readout")
    assert error.layout.display == "none"
    before = readout.value
    part(ui, "attnres-L-box").value = 4096  # above the slider's 2048
    assert error.layout.display != "none"
    assert (
        "ValueError" in error.value
        and "L must be an integer in [16, 2048]" in error.value
        and "got 4096" in error.value
    )
    assert readout.value == before and part(ui, "attnres-slider-L").value == 256
    part(ui, "attnres-L-box").value = 512
    assert error.layout.display == "none" and error.value == ""
    assert readout.value == readout_html(explorer_state("t5", 512))


def test_compare_mode_overlays_several_encodings():
    ui = explorer()
    mode = part(ui, "attnres-mode")
    mode.value = "compare"
    readout = part(ui, "attnres-readout").value
    for name in ("rope", "alibi", "t5"):
        assert f"<b>{name}</b>" in readout
    assert bytes(part(ui, "attnres-plot").value).startswith(PNG)
    chooser = part(ui, "attnres-compare-choice")
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
    head_mode, boundary = part(ui, "attnres-head-mode"), part(ui, "attnres-boundary")
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
    dropdown = part(ui, "attnres-encoding")
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
    dropdown = part(ui, "attnres-encoding")
    dropdown.value = "alibi"
    assert not head_mode.disabled and note.value == ""
    assert part(ui, "attnres-slider-heads").description == "number of heads"
    part(ui, "attnres-slider-heads").value = 1  # one head: the convention cannot act
    assert head_mode.disabled
    dropdown.value = "nope"
    assert head_mode.disabled
    mode = part(ui, "attnres-mode")
    mode.value = "compare"  # the default selection includes alibi
    assert not head_mode.disabled


# --------------------------------------------------------------------------- what cannot act, or vanish


@pytest.mark.parametrize("name", list(DESIGN_CURVES))
def test_no_slider_end_flattens_a_curve(name):
    """At either end of every slider (the others at their defaults) the curve keeps a position signal:
    only NoPE, flat by construction, is flat."""
    for key in DESIGN_CURVES[name].params:
        for value in slider_bounds(name, key):
            value = int(value) if DESIGN_CURVES[name].params[key].kind == "int" else value
            try:
                state = explorer_state(name, 64, {key: value})
            except (
                ValueError
            ) as err:  # an invalid combination (T5's max_distance <= num_buckets // 2): shown as an error
                assert "max_distance must exceed" in str(err)
                continue
            assert state["flat"] == (name == "nope"), (name, key, value)
    assert slider_bounds("rope", "scale")[0] == DESIGN_CURVES["rope"].params["scale"].step > 0


def test_a_flat_curve_raises_a_visible_warning():
    state = explorer_state("rope", 64, {"rho": 0.0})  # reachable mid-slider: rho = 0 removes the signal
    assert state["flat"] and state["R_L"] == pytest.approx(1 / 64**2)  # flat: R = 1/N^2 under "zero"
    notes, warnings = explorer_notes(state)
    assert len(warnings) == 1 and "flat" in warnings[0] and "rho = 0" in warnings[0]
    ui = explorer("rope", 64)
    warning = part(ui, "attnres-warning")
    assert warning.layout.display == "none"
    part(ui, "attnres-slider-rho").value = 0.0
    assert warning.layout.display is None and "the curve is flat" in warning.value
    part(ui, "attnres-slider-rho").value = 0.5
    assert warning.layout.display == "none"


def test_controls_that_cannot_act_are_disabled_with_a_reason_and_twins_are_named():
    ui = explorer()
    note = part(ui, "attnres-note")
    assert "same design-time curve" in note.value  # rope: the sinusoidal twin is named at the widget
    part(ui, "attnres-encoding").value = "nope"
    scale = part(ui, "attnres-slider-scale")
    assert scale.disabled and "NoPE's scale is disabled" in note.value
    assert part(ui, "attnres-warning").layout.display is None  # NoPE is flat by construction, and says so
    part(ui, "attnres-encoding").value = "sinusoidal"
    assert not part(ui, "attnres-slider-scale").disabled and "same design-time curve" in note.value
    part(ui, "attnres-encoding").value = "alibi"
    assert "same design-time curve" not in note.value and "disabled" not in note.value
    assert 'boundary: "zero" and "drop" differ' in note.value  # every view says what the boundary menu changes
    assert part(ui, "attnres-warning").layout.display == "none"


def test_x_ticks_are_distances():
    assert distance_ticks(1024) == ([0, 0.5, 1, 1.5, 2], ["0", "512", "1024 (L)", "1536", "2048 (2L)"])
    positions, labels = distance_ticks(1001, marked=False)
    assert labels == ["0", "500", "1001", "1501", "2002"] and positions[1] == pytest.approx(500 / 1001)
    figure = SingleFigure()
    figure.render(explorer_state("rope", 640))
    assert [t.get_text() for t in figure.distances[0].texts] == ["0", "320", "640 (L)", "960", "1280 (2L)"]


def test_the_length_box_and_slider_are_linked():
    ui = explorer("rope", 512)
    slider, box, readout = part(ui, "attnres-slider-L"), part(ui, "attnres-L-box"), part(ui, "attnres-readout")
    assert isinstance(box, widgets.IntText) and not isinstance(box, widgets.BoundedIntText)  # no silent clamping
    box.value = 1000  # not a multiple of the slider's step: the box takes any integer
    assert slider.value == 1000 and readout.value == readout_html(explorer_state("rope", 1000))
    slider.value = 256
    assert box.value == 256 and readout.value == readout_html(explorer_state("rope", 256))


@pytest.mark.parametrize("typed", [8, 15, 2049, 100_000])
def test_the_length_box_refuses_values_outside_the_range_with_a_message(typed):
    """The notebook says the box takes any integer from 16 to 2048 and refuses others with a message that
    names the value; the box goes back to the L in use, and nothing else moves."""
    ui = explorer("rope", 512)
    slider, box, readout, error = (
        part(ui, c) for c in ("attnres-slider-L", "attnres-L-box", "attnres-readout", "attnres-error")
    )
    before = readout.value
    box.value = typed
    assert box.value == 512 and slider.value == 512 and readout.value == before
    assert (
        error.layout.display is None
        and "L must be an integer in [16, 2048]" in error.value
        and f"got {typed}" in error.value
    )
    slider.value = 528  # any valid change clears the message and puts the box back in step
    assert box.value == 528 and error.layout.display == "none"


def test_the_plot_is_a_png_shown_at_its_pixel_size():
    import io

    from PIL import Image

    ui = explorer()
    plot = part(ui, "attnres-plot")
    image = Image.open(io.BytesIO(bytes(plot.value)))
    assert plot.format == "png" and image.size == (9 * FIGURE_DPI, round(3.3 * FIGURE_DPI))
    assert plot.layout.width == f"{image.size[0]}px"
    part(ui, "attnres-mode").value = "compare"
    image = Image.open(io.BytesIO(bytes(plot.value)))
    assert plot.layout.width == f"{image.size[0]}px"


def test_compare_mode_names_coinciding_curves_and_draws_them_apart():
    states = compare_states(["sinusoidal", "rope", "alibi"], 256)
    assert coinciding(states) == [("sinusoidal", "rope")]  # identical by design (notebook 02, section 4)
    assert "rope coincides with sinusoidal (identical by design)" in compare_readout_html(states)
    assert coinciding(compare_states(["rope", "xpos", "alibi"], 256)) == []
    figure = CompareFigure()
    figure.render(states)
    sin, rope = figure.lines_s["sinusoidal"], figure.lines_s["rope"]
    assert (sin.get_linestyle(), sin.get_linewidth()) != (rope.get_linestyle(), rope.get_linewidth())
    styles = {(line.get_linestyle(), line.get_marker(), line.get_color()) for line in figure.lines_s.values()}
    assert len(styles) == len(DESIGN_CURVES)  # every encoding has its own look
    assert [t.get_text() for t in figure.ax_s.get_yticklabels()] == ["0", "−1", "−10", "−100", "−1000"]
    assert [t.get_text() for t in figure.legend.get_texts()] == ["sinusoidal", "rope", "alibi"]
    with pytest.raises(ValueError, match="compared once"):
        figure.render(states + states[:1])


def test_compare_scores_fit_the_fixed_symlog_range_at_every_length():
    for L in (16, 2048):  # the slider's ends
        for state in compare_states(list(DESIGN_CURVES), L):
            drop = state["profile"] - state["profile"][0]
            assert CompareFigure.SCORE_RANGE[0] < drop.min() and drop.max() <= CompareFigure.SCORE_RANGE[1]


def test_help_text_computes_its_numbers_and_links_notebook_01():
    text = help_html(1024)
    assert f"p ≈ {math.sqrt(0.9):.2f}" in text and f"p ≈ {math.sqrt(0.1):.2f}" in text
    assert f"ln 1024 ≈ {math.log(1024):.1f}" in text and "2 × scale = 16 nats" in text
    assert "href='01_deriving_resolution.ipynb'" in text
    # the closed form behind "p ≈ √R": a peak of share p, the rest flat, gives R = p² − p·q + q²
    N, p = 1024, math.sqrt(0.1)
    q = (1 - p) / (N - 1)
    weights = np.r_[p, np.full(N - 1, q)]
    assert float(resolution(np.log(weights))) == pytest.approx(p * p - p * q + q * q, rel=1e-12)
    assert part(explorer(), "attnres-help").value == text


def test_why_so_small_is_specific_to_the_encoding_shown():
    """Each encoding's panel gives its own reason, with its numbers computed from its own curve; the
    bound it quotes holds. (RoPE's "2 × scale" text used to be shown for every encoding.)"""
    texts = {name: help_html(1024, name) for name in DESIGN_CURVES}
    assert len(set(texts.values())) == len(texts)  # no two encodings share a text
    for name, text in texts.items():
        state = explorer_state(name, 1024)
        assert f"Why so small for {name} at its defaults?" in text
        if name in ("sinusoidal", "rope", "xpos"):
            assert f"max p = {format_sig(state['weights_L'].max())}" in text and "2 × scale = 16 nats" in text
            assert state["R_L"] <= state["weights_L"].max()
        else:
            p0 = state["weights_L"][0]
            assert "2 × scale" not in text and f"p_0 = {format_sig(p0)}" in text
            assert state["R_L"] <= p0 * p0 * (1 + 1e-12)  # R <= p_0² for scores that never rise with distance
    assert "m̄ = 0.125 nats a distance" in texts["alibi"]  # the mean of ALiBi's 8 slopes, 2^-1 .. 2^-8
    assert (
        "every distance gets p = 1/1024" in texts["nope"] and "<i>scale</i> slider" not in texts["nope"]
    )  # NoPE has none
    ui = explorer()
    help_box = part(ui, "attnres-help")
    for name in ("alibi", "t5", "rope"):
        part(ui, "attnres-encoding").value = name
        assert help_box.value == help_html(1024, name)
    part(ui, "attnres-mode").value = "compare"
    assert "Choose one encoding in single mode" in help_box.value


def test_every_control_label_is_shown_in_full():
    """Labels are as wide as their text ("head convention", "number of heads" were cut to "head convent…")."""

    def labelled(widget):
        if (
            getattr(widget, "description", "")
            and hasattr(widget, "style")
            and hasattr(widget.style, "description_width")
        ):
            yield widget
        for child in getattr(widget, "children", ()):
            yield from labelled(child)

    ui, trained = explorer("alibi"), trained_explorer(experiments.STORE)
    part(ui, "attnres-mode").value = "compare"
    found = {w.description: w.style.description_width for root in (ui, trained) for w in labelled(root)}
    assert {"head convention", "number of heads", "eval length", "L (train)", "setting"} <= set(found)
    assert set(found.values()) == {"initial"}, found


def test_t5_max_distance_slider_stays_valid():
    """Every value T5's max_distance slider can take is accepted: its low end follows num_buckets."""
    step = DESIGN_CURVES["t5"].params["max_distance"].step
    for buckets in range(2, 129, 2):
        low, _ = slider_bounds("t5", "max_distance", {"num_buckets": buckets})
        explorer_state("t5", 64, {"num_buckets": buckets, "max_distance": int(low)})  # the slider's lowest value
        if low - step >= DESIGN_CURVES["t5"].params["max_distance"].low:
            with pytest.raises(ValueError, match="max_distance must exceed"):
                explorer_state("t5", 64, {"num_buckets": buckets, "max_distance": int(low - step)})
    ui = explorer("t5", 256)
    max_distance, readout = part(ui, "attnres-slider-max_distance"), part(ui, "attnres-readout")
    assert max_distance.min == 20  # num_buckets 32: above 16
    max_distance.value = 20
    part(ui, "attnres-slider-num_buckets").value = 128
    assert max_distance.min == 68 and max_distance.value == 68  # raised with it: 64 would be refused
    assert readout.value == readout_html(explorer_state("t5", 256, {"num_buckets": 128, "max_distance": 68}))
    assert part(ui, "attnres-error").layout.display == "none"
    assert "max_distance starts above num_buckets // 2 = 64" in part(ui, "attnres-note").value


def test_numpy_integers_are_integers():
    ui = explorer("rope", np.int64(64))
    assert part(ui, "attnres-slider-L").value == 64
    state = explorer_state("rope", np.int64(64))
    assert state["L"] == 64 and type(state["L"]) is int
    assert state["R_L"] == explorer_state("rope", 64)["R_L"]
    with pytest.raises(ValueError, match=r"L must be an integer in \[16, 2048\]"):
        explorer("rope", np.float64(64.0))


def test_compare_mode_says_why_curves_lie_on_top_of_each_other():
    """At the defaults, five of the six curves stay within ~10 nats of s[0] on a score axis that reaches
    −1000: the readout names them and gives the numbers."""
    states = compare_states(list(COMPARE_DEFAULT), 1024)
    close = close_on_plot(states)
    assert close["names"] == ["sinusoidal", "rope", "xpos", "kerple-log", "t5"]  # all but ALiBi
    spans = {s["name"]: np.abs(s["profile"] - s["profile"][0]).max() for s in states}
    assert close["span"] == max(spans[n] for n in close["names"]) and spans["alibi"] > CLOSE_SCORE_NATS
    text = compare_readout_html(states)
    assert "sinusoidal, rope, xpos, kerple-log and t5 lie close together on these axes" in text
    assert (
        f"within {format_sig(close['span'])} nats" in text
        and f"factor {format_sig(close['factor'])} of uniform" in text
    )
    assert close_on_plot(compare_states(["rope", "alibi"], 1024)) is None
    ui = explorer()
    part(ui, "attnres-mode").value = "compare"
    assert "lie close together" in part(ui, "attnres-readout").value


def test_rapid_changes_are_drawn_once_for_the_last_of_them():
    """In a running event loop (a kernel), a burst of changes updates the readout each time but draws
    the plot once, for the last change; without one (scripts, these tests) every change draws."""
    ui = explorer("rope", 512)
    length, readout, plot = part(ui, "attnres-slider-L"), part(ui, "attnres-readout"), part(ui, "attnres-plot")
    drawn = ui.drawer.drawn
    length.value = 528
    assert ui.drawer.drawn == drawn + 1  # no loop: at once

    async def burst():
        for L in (544, 560, 576, 592):
            length.value = L
            assert readout.value == readout_html(explorer_state("rope", L))  # the readout follows every change
        assert ui.drawer.drawn == drawn + 1  # nothing drawn yet: the plot waits for the burst to end
        await past_the_redraw_timer()

    asyncio.run(burst())
    assert ui.drawer.drawn == drawn + 2
    assert bytes(plot.value) == SingleFigure().render(explorer_state("rope", 592))  # the last one

    async def flushed():
        length.value = 608
        ui.drawer.flush()  # what a timing cell in a kernel does: the pending plot, drawn now
        assert ui.drawer.drawn == drawn + 3 and bytes(plot.value) == SingleFigure().render(explorer_state("rope", 608))
        await past_the_redraw_timer()

    asyncio.run(flushed())
    assert ui.drawer.drawn == drawn + 3  # nothing left to draw


def in_thread(target) -> threading.Thread:
    """``target`` started in a new thread (a daemon, so a failed test cannot hang the run)."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_draw_holds_back_callbacks_from_other_threads():
    """ipykernel 7 runs widget callbacks in a subshell thread as well as the main thread: while one thread
    draws, a callback of another (serialized, as every explorer's is) waits; without the lock a compare
    figure's first draw was drawn from by the other thread halfway (AttributeError: no 'caches')."""
    drawing, release, ran = threading.Event(), threading.Event(), []

    def slow_draw(request):
        drawing.set()
        assert release.wait(30)

    drawer = LatestWins(slow_draw)
    first = in_thread(lambda: drawer.now("first"))
    assert drawing.wait(30)
    second = in_thread(serialized(lambda: ran.append("callback")))
    second.join(0.3)
    assert second.is_alive() and ran == []  # held back while the draw runs
    release.set()
    first.join(30)
    second.join(30)
    assert ran == ["callback"]


def test_requests_from_two_threads_leave_the_last_one_drawn():
    """Two threads, each with its own loop, request within the delay: the later request is drawn, once.
    The first thread's loop is blocked until the second has asked, so its timer cannot fire before."""
    drawn, asked = [], {name: threading.Event() for name in ("first", "second")}
    drawer = LatestWins(drawn.append)

    async def ask(name: str, after: str | None) -> None:
        if after is not None:
            assert asked[after].wait(30)
        drawer.request(name)
        asked[name].set()
        if after is None:
            assert asked["second"].wait(30)  # blocks this loop
        await past_the_redraw_timer()

    threads = [
        in_thread(lambda: asyncio.run(ask("first", None))),
        in_thread(lambda: asyncio.run(ask("second", "first"))),
    ]
    for thread in threads:
        thread.join(30)
    assert drawn == ["second"] and drawer.drawn == 1


def test_a_draw_of_an_earlier_request_never_follows_a_later_one():
    """Both threads wait for the lock, holding requests 1 and 2: whichever gets it first, request 2 is the
    last picture drawn (request 1 is skipped if it comes second)."""
    drawn = []
    drawer = LatestWins(drawn.append)
    with WIDGET_LOCK:
        threads = [in_thread(lambda: drawer.now("first"))]
        while drawer.number < 1:
            time.sleep(0.001)
        threads.append(in_thread(lambda: drawer.now("second")))
        while drawer.number < 2:
            time.sleep(0.001)
    for thread in threads:
        thread.join(30)
    assert drawn[-1] == "second" and drawn.count("second") == 1


@pytest.mark.parametrize("kind", ["single", "compare", "trained", "design time"])
def test_a_draw_that_failed_halfway_is_redone(kind, catalogue):
    """A figure's background is rebuilt on a change of frame (title, selection, L, layers); if that draw fails
    (interrupted, or drawn over from another thread), the figure must not remember the frame as drawn: the next
    render rebuilds it and draws what a fresh figure draws."""
    from attnres_helpers.widgets.design_time import DesignTimeFigure, design_time_catalogue, design_time_state

    make, state = {
        "single": (SingleFigure, lambda: explorer_state("rope", 512)),
        "compare": (CompareFigure, lambda: compare_states(list(COMPARE_DEFAULT), 512)),
        "trained": (TrainedFigure, lambda: trained_state(catalogue, "rope", 0, 1, "mean", 2, True)),
        "design time": (DesignTimeFigure, lambda: design_time_state(design_time_catalogue(), "YaRN", 2.0, 0)),
    }[kind]
    figure, view = make(), state()
    redraw = figure.redraw_background

    def fails_once():
        figure.redraw_background = redraw
        raise RuntimeError("interrupted")

    figure.redraw_background = fails_once
    with pytest.raises(RuntimeError, match="interrupted"):
        figure.render(view)
    assert figure.render(view) == make().render(view)


def test_blitted_figures_draw_what_a_fresh_figure_draws(catalogue):
    """Layers cached for earlier states are reused only where they fit: after any sequence of states,
    each PNG is the one a new figure draws for that state alone, byte for byte (a new figure's PNG is
    drawn once per distinct state)."""
    cases = [
        (
            SingleFigure,
            lambda L, s: explorer_state("rope", L, {"scale": s}),
            [(512, 8.0), (1024, 8.0), (1024, 12.0), (512, 8.0), (700, 3.0)],
        ),
        (CompareFigure, lambda L: compare_states(list(COMPARE_DEFAULT), L), [(512,), (1024,), (512,)]),
        (
            TrainedFigure,
            lambda layer, k, bca: trained_state(catalogue, "rope", 0, layer, "mean", k, bca),
            [("mean", 2, False), (1, 4, True), ("mean", 1, False), (1, 4, True)],
        ),
    ]
    for make, state_of, arguments in cases:
        figure, fresh = make(), {}
        for args in arguments:
            state = state_of(*args)
            if args not in fresh:
                fresh[args] = make().render(state)
            assert figure.render(state) == fresh[args], (make.__name__, args)


def test_each_layer_holds_its_artists_whole(catalogue):
    """A blitted layer keeps only its own rectangle: every artist drawn into it must lie inside, or it is
    cut (the distance labels once lost their top rows). Checked at the extremes of the slider ranges."""
    extreme = {"p": 2.0, "a": 8.0, "scale": 4.0}  # KERPLE-power's steepest curve: scores near −1.3e8, an offset text
    cases = [
        (
            SingleFigure(),
            [
                explorer_state("rope", 16),
                explorer_state("alibi", 2048),
                explorer_state("kerple-power", 2048, extreme),
                explorer_state("t5", 1000),
            ],
        ),
        (CompareFigure(), [compare_states(list(DESIGN_CURVES), L) for L in (16, 2048)]),
        (
            TrainedFigure(),
            [trained_state(catalogue, "rope", 0, layer, head, 4, False) for layer, head in (("mean", "mean"), (1, 2))],
        ),
    ]
    for figure, states in cases:
        for state in states:
            figure.render(state)
            renderer = figure.fig.canvas.get_renderer()
            for artists, box in figure.groups:
                for artist in artists:
                    if artist.get_visible():
                        extent = (
                            artist.get_tightbbox(renderer)
                            if hasattr(artist, "get_ticklabels")
                            else artist.get_window_extent(renderer)
                        )
                        assert box.x0 - 0.5 <= extent.x0 and extent.x1 <= box.x1 + 0.5, (
                            type(figure).__name__,
                            artist,
                            extent,
                            box,
                        )
                        assert box.y0 - 0.5 <= extent.y0 and extent.y1 <= box.y1 + 0.5, (
                            type(figure).__name__,
                            artist,
                            extent,
                            box,
                        )


def test_png_encoder_is_lossless():
    import io

    from PIL import Image

    rgb = np.random.default_rng(0).integers(0, 256, size=(7, 11, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(rgb_png(rgb))).convert("RGB")), rgb)
    with pytest.raises(ValueError, match=r"expected an \(height, width, 3\) uint8 image"):
        rgb_png(rgb.astype(np.float32))


def test_new_figures_share_one_math_text_parser_and_draw_what_a_plain_agg_figure_draws():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from attnres_helpers.widgets.render import new_figure, png_bytes

    def drawn(fig):
        fig.subplots().set(yscale="log", ylim=(1e-8, 1.0), title=r"$\hat{s}[n]$ at $T = 2L$")  # math text
        fig.canvas.draw()
        return fig

    first, second = drawn(new_figure(3.0, 2.0)), drawn(new_figure(3.0, 2.0))
    plain = Figure(figsize=(3.0, 2.0), dpi=FIGURE_DPI)
    FigureCanvasAgg(plain)
    assert first.canvas.get_renderer().mathtext_parser is second.canvas.get_renderer().mathtext_parser
    assert png_bytes(second) == png_bytes(drawn(plain))


# --------------------------------------------------------------------------- static pictures


@pytest.mark.parametrize("which", ["explorer", "trained"])
def test_default_pictures_are_small_pngs(tmp_path, which):
    path = save_default_image(tmp_path / f"{which}.png", which)
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) < 150_000
    with pytest.raises(ValueError, match="which must be 'explorer' or 'trained'"):
        default_picture("gallery")


# ------------------------------------------------------------ bad input at the door (adversarial review, round 2)


@pytest.mark.parametrize("L", [-3, 0, 1, 2.5, True])
def test_explorer_messages_report_the_given_L(L):
    with pytest.raises(ValueError, match=rf"L must be an integer >= 2 .*got {L!r}$") as info:
        explorer_state("rope", L)
    assert "N must" not in str(info.value)
    with pytest.raises(ValueError, match=rf"L must be an integer >= 2 .*got {L!r}$"):
        compare_states(["rope"], L)
    with pytest.raises(ValueError, match=rf"L must be an integer >= 2 .*got {L!r}$"):
        resolution_pair("rope", L)


# --- 9. compare_states with a single string -----------------------------------------------


def test_compare_states_refuses_a_single_string():
    with pytest.raises(ValueError, match="names must be a list of encoding names, got a string 'rope'"):
        compare_states("rope", 16)
    assert [s["name"] for s in compare_states(("rope",), 16)] == ["rope"]


# --- 10. min_max_decimate buckets ---------------------------------------------------------


@pytest.mark.parametrize("buckets", [0, -1, 2.5, True])
def test_min_max_decimate_refuses_bad_buckets(buckets):
    x = np.arange(100.0)
    with pytest.raises(ValueError, match="buckets must be >= 1"):
        min_max_decimate(x, x, buckets=buckets)


@pytest.mark.parametrize("name", ["rope", "kerple-log", "t5", "nope", "alibi", "xpos"])
@pytest.mark.parametrize("head_mode", ["mean-scores", "mean-R"])
def test_the_boundary_note_gives_the_gap_between_the_two_boundaries(name, head_mode):
    """R_zero − R_drop at 2L is the last distance's weight squared (Eq. 3): the note's number is that gap, and
    it says so when the readout's 3 significant figures cannot show it."""
    from attnres_helpers.widgets.design import boundary_gap, boundary_note

    zero = explorer_state(name, 256, head_mode=head_mode)
    drop = explorer_state(name, 256, boundary="drop", head_mode=head_mode)
    assert boundary_gap(zero) == pytest.approx(zero["R_2L"] - drop["R_2L"], rel=1e-6, abs=1e-15)
    hidden = format_sig(zero["R_2L"]) == format_sig(drop["R_2L"])
    assert ("below the readout's 3 significant figures" in boundary_note(zero)) == hidden


def test_an_explorer_update_shows_a_state_it_cannot_make_and_draws_the_next_it_can():
    """state_update: a state that raises is shown in the error line, with the readout and picture left as
    they were; the next good state clears the error, writes its readout and is drawn; nothing happens while
    controls are held."""
    value, errors, drawn, holding = {"x": 1}, [], [], []
    readout = widgets.HTML()

    def state_of() -> int:
        if value["x"] < 0:
            raise ValueError("x must be >= 0")
        return value["x"]

    update = state_update(state_of, readout, lambda s: f"x = {s}", errors.append, LatestWins(drawn.append), holding)
    update(at_once=True)
    assert (readout.value, errors, drawn) == ("x = 1", [None], [1])
    value["x"] = -1
    update()
    assert readout.value == "x = 1" and drawn == [1] and str(errors[-1]) == "x must be >= 0"
    holding.append(True)
    value["x"] = 2
    update()
    assert drawn == [1] and len(errors) == 2
    holding.pop()
    update()
    assert (readout.value, errors[-1], drawn) == ("x = 2", None, [1, 2])
