"""Three ipywidgets explorers: design-time score curves (notebook 02), trained models' ŝ (notebook 04) and a
real model's design-time R under a configuration (notebook 10, :mod:`.design_time`).

One idea per module: :mod:`.design` (the design-time update logic, pure functions that run
without a kernel), :mod:`.design_figures` and :mod:`.design_explorer` (its figures and widget),
:mod:`.trained` (the trained-model explorer, fed from a measurement store) and
:mod:`.trained_figure`, :mod:`.render` (Agg figures, fast PNGs, blitting, decimation, "latest
wins" redraws), :mod:`.text` (number and message formatting) and :mod:`.pictures` (the static
pictures shown where no kernel runs). The widgets draw persistent matplotlib figures (Agg, no
pyplot) into ``Image`` widgets as PNGs rendered at the pixel size they are shown at. CSS classes
(``attnres-readout``, ``attnres-slider-<name>``, ``attnres-error``, ``attnres-plot``, ...) let
tests and a browser find the parts. Every name below is importable from here.
"""

from .design import (
    CLOSE_SCORE_NATS,
    COMPARE_DEFAULT,
    DEFAULT_BOUNDARY,
    DEFAULT_HEAD_MODE,
    FLAT_WARNING,
    HEAD_NOTE,
    INERT_PARAMS,
    L_RANGE,
    NONZERO_PARAMS,
    SLIDER_LABELS,
    T5_NOTE,
    TWIN_NOTE,
    check_explorer_length,
    check_length,
    close_on_plot,
    coinciding,
    compare_readout_html,
    compare_states,
    explorer_notes,
    explorer_state,
    help_html,
    readout_html,
    slider_bounds,
    why_small_html,
)
from .design_explorer import explorer, param_slider
from .design_figures import CURVE_STYLES, CompareFigure, DistanceLabels, SingleFigure, distance_ticks, symlog_label
from .pictures import default_picture, save_default_image
from .render import (
    FIGURE_DPI,
    FONT_PT,
    REDRAW_DELAY_S,
    BlitFigure,
    LatestWins,
    figure_layout,
    find_by_class,
    min_max_decimate,
    new_figure,
    png_bytes,
    rgb_png,
)
from .text import RATIO_FLOOR, SIG_DIGITS, error_html, format_ratio, format_sig, lines_html, pair_text, visible_text
from .trained import (
    DEFAULT_STORE,
    EVAL_MULTIPLES,
    NO_BCA_REASON,
    plot_limits,
    setting_of,
    trained_catalogue,
    trained_explorer,
    trained_readout_html,
    trained_state,
)
from .trained_figure import TrainedFigure, length_ticks

__all__ = [
    "CLOSE_SCORE_NATS",
    "COMPARE_DEFAULT",
    "DEFAULT_BOUNDARY",
    "DEFAULT_HEAD_MODE",
    "FLAT_WARNING",
    "HEAD_NOTE",
    "INERT_PARAMS",
    "L_RANGE",
    "NONZERO_PARAMS",
    "SLIDER_LABELS",
    "T5_NOTE",
    "TWIN_NOTE",
    "check_explorer_length",
    "check_length",
    "close_on_plot",
    "coinciding",
    "compare_readout_html",
    "compare_states",
    "explorer_notes",
    "explorer_state",
    "help_html",
    "readout_html",
    "slider_bounds",
    "why_small_html",
    "explorer",
    "param_slider",
    "CURVE_STYLES",
    "CompareFigure",
    "DistanceLabels",
    "SingleFigure",
    "distance_ticks",
    "symlog_label",
    "default_picture",
    "save_default_image",
    "FIGURE_DPI",
    "FONT_PT",
    "REDRAW_DELAY_S",
    "BlitFigure",
    "LatestWins",
    "figure_layout",
    "find_by_class",
    "min_max_decimate",
    "new_figure",
    "png_bytes",
    "rgb_png",
    "RATIO_FLOOR",
    "SIG_DIGITS",
    "error_html",
    "format_ratio",
    "format_sig",
    "lines_html",
    "pair_text",
    "visible_text",
    "DEFAULT_STORE",
    "EVAL_MULTIPLES",
    "NO_BCA_REASON",
    "plot_limits",
    "setting_of",
    "trained_catalogue",
    "trained_explorer",
    "trained_readout_html",
    "trained_state",
    "TrainedFigure",
    "length_ticks",
]
