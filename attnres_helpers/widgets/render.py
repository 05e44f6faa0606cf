"""What the explorers share to draw: Agg figures without pyplot, a fast PNG of the canvas, blitting, one
shared figure of each kind, min–max decimation of long curves, "latest wins" redraws, and finding a widget
by its CSS class."""

from __future__ import annotations

import asyncio
import functools
import numbers
import struct
import threading
import zlib

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.mathtext import MathTextParser
from matplotlib.transforms import Bbox

FIGURE_DPI = 100  # figures are rendered at FIGURE_DPI and shown at their pixel size: no rescaling
FONT_PT = 9  # the smallest font in the explorers' figures
REDRAW_DELAY_S = 0.05  # changes closer together than this (key repeat: ~33 ms) are drawn once, for the last of them
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LAYERS_KEPT = 8  # cached renderings of each layer of a blitted figure (at most 1.2 MB each at 900 × 330)


class _Canvas(FigureCanvasAgg):
    """An Agg canvas whose renderer parses math text with one parser shared by every such canvas.

    matplotlib caches parsed math text (log-axis tick labels such as 10^{-4}) per parser, and each
    renderer makes its own, so each new figure parsed its labels again (7.5–9 ms each here). A parse
    depends only on the text, its font and the dpi, which are the cache's key.
    """

    math_parser = MathTextParser("path")  # what RendererAgg makes for itself

    def get_renderer(self):
        renderer = super().get_renderer()
        renderer.mathtext_parser = self.math_parser
        return renderer


def new_figure(width_in: float, height_in: float) -> Figure:
    """An Agg figure (no pyplot, no global state) of the given size in inches at :data:`FIGURE_DPI`."""
    fig = Figure(figsize=(width_in, height_in), dpi=FIGURE_DPI)
    _Canvas(fig)
    return fig


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def rgb_png(rgb: np.ndarray) -> bytes:
    """A lossless PNG of an ``(height, width, 3)`` uint8 image: rows unfiltered, zlib level 1.

    Plots are mostly flat colour, which zlib packs well without PNG's per-row filters; skipping
    them makes the encoding about 2.5× faster than PIL's at the same level (a few ms at 900 × 330).
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected an (height, width, 3) uint8 image, got {rgb.dtype} {rgb.shape}")
    height, width, _ = rgb.shape
    rows = np.empty((height, 1 + 3 * width), np.uint8)
    rows[:, 0] = 0  # filter type 0 (none) on every row
    rows[:, 1:] = rgb.reshape(height, 3 * width)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (
        PNG_SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
        + _chunk(b"IEND", b"")
    )


def png_bytes(fig: Figure) -> bytes:
    """The canvas as it stands (no redraw) as a PNG at its pixel size."""
    return rgb_png(np.asarray(fig.canvas.buffer_rgba())[..., :3])


def figure_layout(fig: Figure) -> widgets.Layout:
    """An ``Image`` layout that shows the figure at its pixel size (narrower only if the page is)."""
    width, _ = fig.canvas.get_width_height()
    return widgets.Layout(width=f"{width}px", max_width="100%", height="auto")


class BlitFigure:
    """A figure drawn in layers, so that an update draws as little as it can.

    The static parts are drawn once into a background (:meth:`redraw_background`). ``groups`` are
    (artists, region) pairs: artists that change less often than the curves (tick labels, axes),
    each group confined to its own rectangle of the figure (display pixels; the rectangles do not
    overlap). Each group is drawn alone over the background and its rectangle cached per key (the
    last :data:`LAYERS_KEPT` keys), so :meth:`blit` redraws a group only for a key it has not seen
    recently. ``animated`` artists (the curves) are drawn over the layers on every update. The
    caller sets every artist up for the state before calling :meth:`blit`.
    """

    fig: Figure
    animated: tuple = ()
    groups: tuple = ()
    frame = None  # the key of the static background drawn last (None: none drawn yet)

    def set_frame(self, key, set_up) -> None:
        """Draw the static background for ``key``, unless it is the one drawn: ``set_up()`` sets the static
        artists for it, then a full draw. The key is recorded last, so a draw that failed halfway
        (interrupted, or drawn over from another thread) is redone by the next render."""
        if key == self.frame:
            return
        set_up()
        self.redraw_background()
        self.frame = key

    def redraw_background(self) -> None:
        for artist in (*self.animated, *(a for artists, _ in self.groups for a in artists)):
            artist.set_animated(True)
        self.fig.canvas.draw()
        self.background = self.fig.canvas.copy_from_bbox(self.fig.bbox)
        self.caches = [{} for _ in self.groups]  # per group: key -> its rectangle, drawn for that key

    def _draw_visible(self, artists) -> None:
        for artist in artists:
            if artist.get_visible():
                self.fig.draw_artist(artist)

    def blit(self, *keys) -> bytes:
        """The background, each group's rectangle for its key (drawn if not cached), the animated
        artists over them; returns the PNG."""
        canvas = self.fig.canvas
        regions = []
        for (artists, bbox), cache, key in zip(self.groups, self.caches, keys, strict=True):
            if key in cache:
                region = cache.pop(key)
            else:
                canvas.restore_region(self.background)
                self._draw_visible(artists)
                region = canvas.copy_from_bbox(bbox)
            cache[key] = region  # most recently used last
            while len(cache) > LAYERS_KEPT:
                cache.pop(next(iter(cache)))
            regions.append(region)
        canvas.restore_region(self.background)
        for region in regions:
            canvas.restore_region(region)
        self._draw_visible(self.animated)
        return png_bytes(self.fig)


@functools.cache
def shared_figure(kind: type[BlitFigure]) -> BlitFigure:
    """The one figure of ``kind`` that every explorer in this kernel draws with. A figure's first draw
    costs several times a later full draw (matplotlib caches text metrics per renderer), so a re-run
    explorer cell opens faster on a figure that has drawn before. Sharing is safe because a render sets
    every artist from its state alone: after any sequence of states a figure draws what a fresh one draws
    for the last of them (tests/test_widgets.py checks it byte for byte)."""
    return kind()


def region(x0: float, y0: float, x1: float, y1: float) -> Bbox:
    """A rectangle of the figure in display pixels (origin bottom left), for :attr:`BlitFigure.groups`."""
    return Bbox.from_extents(x0, y0, x1, y1)


def min_max_decimate(x: np.ndarray, y: np.ndarray, buckets: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Fewer points that draw the same picture: ``x (N,)``, ``y (..., N) -> (..., M), (..., M)``.

    Cuts the distances into ``buckets`` runs of k points and keeps each run's minimum
    and maximum, in order (the tail that does not fill a run is kept whole). A line
    through them spans the same values in every run, so at ~1 run per pixel column it
    looks the same as the full line, at a fraction of the drawing time.
    """
    if isinstance(buckets, bool) or not isinstance(buckets, numbers.Integral) or buckets < 1:
        raise ValueError(f"buckets must be >= 1 (an integer count of runs), got {buckets!r}")
    N = y.shape[-1]
    k = N // buckets
    if k < 3:
        return np.broadcast_to(x, y.shape), y
    kept = buckets * k
    runs = y[..., :kept].reshape(*y.shape[:-1], buckets, k)  # (..., buckets, k)
    low, high = runs.argmin(-1), runs.argmax(-1)  # (..., buckets)
    pairs = np.stack([np.minimum(low, high), np.maximum(low, high)], axis=-1) + k * np.arange(buckets)[:, None]
    tail = np.broadcast_to(np.arange(kept, N), (*y.shape[:-1], N - kept))
    index = np.concatenate([pairs.reshape(*y.shape[:-1], 2 * buckets), tail], axis=-1)  # (..., M)
    return x[index], np.take_along_axis(y, index, axis=-1)


WIDGET_LOCK = threading.RLock()  # explorer callbacks and draws in a kernel run one at a time (see serialized)


def serialized(callback):
    """``callback`` run under :data:`WIDGET_LOCK`, re-entrant (a callback that sets a control runs that control's
    callbacks inside it). ipykernel 7 handles widget messages in a subshell thread as well as the main thread
    (JupyterLab 4.6), and neither matplotlib figures nor an explorer's controls are safe to change from two
    threads at once: a compare figure's first draw, still building its background in one thread, was drawn
    from by the other (tests/test_widgets.py)."""

    @functools.wraps(callback)
    def run(*args, **kwargs):
        with WIDGET_LOCK:
            return callback(*args, **kwargs)

    return run


class LatestWins:
    """Calls ``draw(request)`` for the last of a burst of requests only.

    Inside a running asyncio loop (a Jupyter kernel handling widget messages), each request
    replaces the pending one and (re)starts a wait of ``delay_s``: key presses that arrive
    faster than that are drawn once, for the last of them, instead of queueing a redraw
    each. Without a running loop (a script, a test) each request is drawn at once.
    ``drawn`` counts the draws.

    Requests may come from several threads, each with its own loop (:func:`serialized`): every
    request takes the next number, a wait that ends draws only if no later request came, and a
    draw is skipped if a later one was drawn already, so the last request is the picture left.
    Draws hold :data:`WIDGET_LOCK`.
    """

    def __init__(self, draw, delay_s: float = REDRAW_DELAY_S):
        self.draw, self.delay_s = draw, delay_s
        self.pending, self.number, self.drawn_number, self.drawn = None, 0, 0, 0
        self.lock = threading.Lock()

    def _take(self, request: object | None) -> int:
        """A new number for ``request`` (None: no pending request), which replaces the pending one."""
        with self.lock:
            self.number += 1
            self.pending = request
            return self.number

    def request(self, request: object) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._draw(request, self._take(None))
            return
        loop.call_later(self.delay_s, self._fire, self._take(request))

    def now(self, request: object) -> None:
        """Draw ``request`` at once, dropping any pending one."""
        self._draw(request, self._take(None))

    def flush(self) -> None:
        """Draw the pending request now, if there is one (for code that times a change, in a kernel)."""
        with self.lock:
            pending = self.pending
        if pending is not None:
            self.now(pending)

    def _fire(self, number: int) -> None:
        with self.lock:
            if number != self.number:  # a later request replaced this one
                return
            request, self.pending = self.pending, None
        self._draw(request, number)

    def _draw(self, request, number: int) -> None:
        with WIDGET_LOCK:
            if number < self.drawn_number:  # a later request, from another thread, was drawn first
                return
            self.drawn_number = number
            self.drawn += 1
            self.draw(request)


def figure_pane(kind: type[BlitFigure], plot_class: str):
    """What an explorer draws with: ``(error, figure, plot, show_error, drawer)``: an error line shown only
    while something failed, the shared figure of ``kind``, the image it renders into (CSS class
    ``plot_class``), ``show_error(exc | None)``, and a :class:`LatestWins` that renders a state into the image;
    a failed render is shown in the error line, since a widget callback's traceback would be lost."""
    from .text import error_html

    error = widgets.HTML(layout=widgets.Layout(display="none")).add_class("attnres-error")
    figure = shared_figure(kind)
    plot = widgets.Image(format="png", layout=figure_layout(figure.fig)).add_class(plot_class)

    def show_error(exc: Exception | None) -> None:
        error.value, error.layout.display = ("", "none") if exc is None else (error_html(exc), None)

    def draw(state) -> None:
        try:
            plot.value = figure.render(state)
        except Exception as exc:  # shown in the widget: a callback's traceback would be lost
            show_error(exc)

    return error, figure, plot, show_error, LatestWins(draw)


def state_update(state_of, readout: widgets.HTML, readout_html, show_error, drawer: LatestWins, holding: list):
    """An explorer's ``update(change=None, at_once=False)`` callback: the state from the controls
    (``state_of()``), its readout (``readout_html(state)``), then its drawing: at once, or as a request of
    which the latest wins. A state that cannot be made is shown in the error line (``show_error``);
    nothing happens while ``holding`` is non-empty (several controls being set, one update after)."""

    @serialized
    def update(_: dict | None = None, at_once: bool = False) -> None:
        if holding:
            return
        try:
            state = state_of()
        except Exception as exc:  # shown in the widget: a callback's traceback would be lost
            show_error(exc)
            return
        readout.value = readout_html(state)
        show_error(None)
        drawer.now(state) if at_once else drawer.request(state)

    return update


def find_by_class(widget: widgets.Widget, css_class: str) -> widgets.Widget | None:
    """The first widget in the tree under ``widget`` that carries ``css_class`` (None if none does)."""
    if css_class in getattr(widget, "_dom_classes", ()):
        return widget
    return next(
        (hit for child in getattr(widget, "children", ()) if (hit := find_by_class(child, css_class)) is not None), None
    )
