"""The design-time explorer widget (notebook 02): controls wired to :mod:`.design`, drawn by :mod:`.design_figures`."""

from __future__ import annotations

import html
import math

import ipywidgets as widgets

from ..encodings import DESIGN_CURVES, Param, default_params
from ..metric import BOUNDARIES, HEAD_MODES
from .design import (
    COMPARE_DEFAULT,
    DEFAULT_BOUNDARY,
    DEFAULT_HEAD_MODE,
    HEAD_NOTE,
    INERT_PARAMS,
    L_RANGE,
    SLIDER_LABELS,
    check_explorer_length,
    compare_readout_html,
    compare_states,
    explorer_notes,
    explorer_state,
    help_html,
    readout_html,
    slider_bounds,
)
from .design_figures import CompareFigure, SingleFigure
from .render import LatestWins, figure_layout, serialized, shared_figure
from .text import error_html, lines_html

LABEL_STYLE = {"description_width": "initial"}  # a control's label is as wide as its text: never cut off
TOGGLE_STYLE = {**LABEL_STYLE, "button_width": "auto"}  # each button as wide as its label


def param_slider(name: str, param: Param, encoding: str | None = None, params: dict | None = None) -> widgets.Widget:
    """A slider for one registry parameter, with CSS class ``attnres-slider-<name>``.

    With ``encoding`` given, its range comes from :func:`slider_bounds` (no zero that flattens
    the curve; ``params``, the other sliders' values, for ranges that depend on them), and a
    parameter that cannot act (:data:`INERT_PARAMS`) is disabled.
    """
    low, high = (param.low, param.high) if encoding is None else slider_bounds(encoding, name, params)
    reason = INERT_PARAMS.get((encoding, name))
    common = dict(
        description=SLIDER_LABELS.get(name, name),
        continuous_update=False,
        style=LABEL_STYLE,
        layout=widgets.Layout(width="340px"),
        disabled=reason is not None,
        tooltip=reason or "",
    )
    if param.kind == "int":
        slider = widgets.IntSlider(value=param.default, min=low, max=high, step=param.step, **common)
    elif param.kind == "log":
        slider = widgets.FloatLogSlider(
            value=param.default,
            base=10,
            min=math.log10(low),
            max=math.log10(high),
            step=param.step,
            readout_format=".3g",
            **common,
        )
    else:
        slider = widgets.FloatSlider(
            value=param.default, min=low, max=high, step=param.step, readout_format=".2f", **common
        )
    return slider.add_class(f"attnres-slider-{name}")


def explorer(name: str = "rope", L: int = 1024) -> widgets.VBox:
    """The interactive explorer: encoding, its sliders, L, a plot and the live (R(L), R(2L)) readout.

    "single" mode shows one encoding; "compare" overlays several at their defaults and
    draws their (R(L), R(2L)) pairs as grouped bars, naming the curves that coincide or lie
    close together. Errors appear in the widget. "reset to defaults" (CSS class
    ``attnres-reset``) restores the encoding's parameters, L (the one the explorer was opened
    with), the boundary and the head convention. Controls that cannot act are disabled with a
    one-line reason (the head convention for single-head curves, NoPE's scale); a flat curve
    raises a visible warning; a legend beside the controls says how to read R and why it is
    small for the encoding shown. L has a wide slider and a number box: the box takes any
    integer in :data:`L_RANGE` and refuses others with a message. The readout follows every
    change; the plot draws the last of a burst of changes (:class:`LatestWins`).
    """
    default_params(name)  # raises ValueError for an unknown encoding, listing the known ones
    L = check_explorer_length(L)
    low, high, step = L_RANGE
    mode = widgets.ToggleButtons(
        options=["single", "compare"], value="single", description="mode", style=LABEL_STYLE
    ).add_class("attnres-mode")
    # Toggle buttons, not drop-downs: every choice is one click, and the keyboard reaches each (Tab, then Space);
    # a drop-down inside JupyterLab lost its arrow keys to the notebook, which moved the active cell instead.
    encoding = widgets.ToggleButtons(
        options=list(DESIGN_CURVES), value=name, description="encoding", style=TOGGLE_STYLE
    ).add_class("attnres-encoding")
    chosen = widgets.SelectMultiple(
        options=list(DESIGN_CURVES),
        value=COMPARE_DEFAULT,
        rows=len(DESIGN_CURVES),
        description="compare",
        style=LABEL_STYLE,
    ).add_class("attnres-compare-choice")
    length = widgets.IntSlider(
        value=L,
        min=low,
        max=high,
        step=step,
        description="L (train)",
        style=LABEL_STYLE,
        continuous_update=False,
        readout=False,
        layout=widgets.Layout(width="430px"),
    )
    length.add_class("attnres-slider-L")
    length_box = widgets.IntText(
        value=L, layout=widgets.Layout(width="90px"), tooltip=f"any integer in [{low}, {high}]"
    ).add_class("attnres-L-box")
    boundary = widgets.ToggleButtons(
        options=BOUNDARIES, value=DEFAULT_BOUNDARY, description="boundary", style=TOGGLE_STYLE
    ).add_class("attnres-boundary")
    head_mode = widgets.ToggleButtons(
        options=HEAD_MODES,
        value=DEFAULT_HEAD_MODE,
        description="head convention",
        style=TOGGLE_STYLE,
        layout=widgets.Layout(flex="0 0 auto"),
    ).add_class("attnres-head-mode")
    head_note = widgets.HTML().add_class("attnres-head-note")
    reset = widgets.Button(
        description="reset to defaults", tooltip="the encoding's parameters, L, boundary and head convention"
    )
    reset.add_class("attnres-reset")
    summary = widgets.HTML()
    params_box = widgets.VBox()
    notes = widgets.HTML().add_class("attnres-note")
    warning = widgets.HTML(layout=widgets.Layout(display="none")).add_class("attnres-warning")
    help_box = widgets.HTML(help_html(L, name), layout=widgets.Layout(width="330px", margin="0 0 0 12px")).add_class(
        "attnres-help"
    )
    readout = widgets.HTML().add_class("attnres-readout")
    error = widgets.HTML(layout=widgets.Layout(display="none")).add_class("attnres-error")
    single_figure = shared_figure(SingleFigure)
    plot = widgets.Image(format="png", layout=figure_layout(single_figure.fig)).add_class("attnres-plot")
    sliders: dict[str, widgets.Widget] = {}
    holding = []  # non-empty while several controls are set at once: one update at the end

    def show_error(exc: Exception | None) -> None:
        error.value, error.layout.display = ("", "none") if exc is None else (error_html(exc), None)

    def draw(request: tuple[SingleFigure, dict] | tuple[CompareFigure, list[dict]]) -> None:
        figure, states = request
        try:
            plot.value = figure.render(states)
            plot.layout.width = figure_layout(figure.fig).width
        except Exception as exc:  # shown in the widget: a callback's traceback would be lost
            show_error(exc)

    drawer = LatestWins(draw)

    def show_head_convention(states: list[dict]) -> None:
        multi = any(s["multi_head"] for s in states)
        head_mode.disabled = not multi
        head_note.value = "" if multi else f"<i>{html.escape(HEAD_NOTE)}</i>"

    def show_notes(note_lines: list[str], warning_lines: list[str]) -> None:
        notes.value = lines_html(note_lines, "font-style:italic")
        warning.value = lines_html(warning_lines, "color:#a40000; font-weight:bold")
        warning.layout.display = None if warning_lines else "none"

    def sync_bounds() -> None:
        """Integer sliders whose low end depends on another slider (T5's max_distance) follow it."""
        params = {k: s.value for k, s in sliders.items()}
        holding.append(True)
        try:
            for key, slider in sliders.items():
                bound = slider_bounds(encoding.value, key, params)[0]
                if isinstance(slider, widgets.IntSlider) and slider.min != bound:
                    slider.min = bound  # raises the value with it where it was below
        finally:
            holding.pop()

    @serialized
    def update(_: dict | None = None, at_once: bool = False) -> None:
        if holding:
            return
        length_box.value = length.value  # a refused value typed in the box gives way to the L shown
        try:
            if mode.value == "single":
                sync_bounds()
                state = explorer_state(
                    encoding.value,
                    length.value,
                    {k: s.value for k, s in sliders.items()},
                    boundary.value,
                    head_mode.value,
                )
                show_head_convention([state])
                show_notes(*explorer_notes(state))
                readout.value, help_box.value = readout_html(state), help_html(L, encoding.value)
                request = (single_figure, state)
            else:
                states = compare_states(chosen.value, length.value, boundary.value, head_mode.value)
                show_head_convention(states)
                flat = [s["name"] for s in states if s["flat"]]
                show_notes(
                    [],
                    [f"flat curve{'s' if len(flat) > 1 else ''} (no position signal): {', '.join(flat)}"]
                    if flat
                    else [],
                )
                readout.value, help_box.value = compare_readout_html(states), help_html(L, None)
                request = (shared_figure(CompareFigure), states)  # made by the first switch to "compare"
        except Exception as exc:
            show_error(exc)
            return
        show_error(None)
        drawer.now(request) if at_once else drawer.request(request)

    @serialized
    def box_to_slider(change: dict) -> None:
        try:
            length.value = check_explorer_length(change["new"])
        except ValueError as exc:
            show_error(exc)
            length_box.value = length.value  # the box shows the L in use, not the refused one

    @serialized
    def slider_to_box(change: dict) -> None:
        length_box.value = change["new"]

    @serialized
    def rebuild_sliders(_: dict | None = None, at_once: bool = False) -> None:
        for slider in sliders.values():
            slider.close()
        sliders.clear()
        sliders.update(
            {
                key: param_slider(key, param, encoding.value)
                for key, param in DESIGN_CURVES[encoding.value].params.items()
            }
        )
        for slider in sliders.values():
            slider.observe(update, names="value")
        params_box.children = tuple(sliders.values())
        summary.value = f"<i>{html.escape(DESIGN_CURVES[encoding.value].summary)}</i>"
        update(at_once=at_once)

    @serialized
    def reset_to_defaults(_: widgets.Button | None = None) -> None:
        holding.append(True)
        try:
            for key, param in DESIGN_CURVES[encoding.value].params.items():
                sliders[key].value = param.default
            length.value, boundary.value, head_mode.value = L, DEFAULT_BOUNDARY, DEFAULT_HEAD_MODE
        finally:
            holding.pop()
        update()

    @serialized
    def switch_mode(_: dict | None = None) -> None:
        single = mode.value == "single"
        for box in (encoding, summary, params_box):
            box.layout.display = None if single else "none"
        chosen.layout.display = "none" if single else None
        update()

    encoding.observe(rebuild_sliders, names="value")
    reset.on_click(reset_to_defaults)
    mode.observe(switch_mode, names="value")
    length.observe(slider_to_box, names="value")
    length_box.observe(box_to_slider, names="value")
    for control in (length, boundary, head_mode, chosen):
        control.observe(update, names="value")
    chosen.layout.display = "none"
    rebuild_sliders(at_once=True)
    controls = widgets.VBox(
        [
            mode,
            encoding,
            summary,
            chosen,
            widgets.HBox([length, length_box]),
            widgets.HBox([boundary, head_mode]),
            head_note,
            params_box,
            notes,
            reset,
        ]
    )
    root = widgets.VBox([widgets.HBox([controls, help_box]), readout, warning, error, plot]).add_class(
        "attnres-explorer"
    )
    root.reset_to_defaults = reset_to_defaults  # the button's handler, for code and tests
    root.drawer = drawer  # how many plots were drawn (``drawn``), for tests and the benchmark
    return root
