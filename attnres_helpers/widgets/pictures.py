"""Static pictures of both explorers in their default state: the fallback shown where no kernel runs
(GitHub, nbviewer), written by ``attnres reproduce figures``."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

from PIL import Image as PILImage

from ..files import atomic_write
from .design import explorer_notes, explorer_state, readout_html
from .design_figures import SingleFigure
from .render import FIGURE_DPI, FONT_PT, new_figure, png_bytes
from .text import visible_text
from .trained import trained_catalogue, trained_readout_html, trained_state
from .trained_figure import TrainedFigure

WRAP_CHARS = 130  # characters a line of the pictures' header (10 pt, 900 px wide) holds


def _text_strip(text: str, width_px: int) -> PILImage.Image:
    """A white strip with ``text`` (a few lines) drawn by matplotlib at FONT_PT + 1."""
    text = "\n".join(textwrap.fill(line, WRAP_CHARS) for line in text.split("\n"))
    lines = text.count("\n") + 1
    fig = new_figure(width_px / FIGURE_DPI, (0.22 * lines + 0.12))
    fig.text(0.01, 0.5, text, va="center", ha="left", fontsize=FONT_PT + 1, family="DejaVu Sans")
    fig.canvas.draw()
    return PILImage.open(io.BytesIO(png_bytes(fig)))


def default_picture(which: str = "explorer", store_path: str | Path | None = None) -> bytes:
    """A PNG of one explorer in its default state: the readout's text above the plot the widget shows.

    ``which`` is ``"explorer"`` (notebook 02: RoPE, L = 1024) or ``"trained"`` (notebook 04:
    the trained explorer's defaults).
    """
    if which == "explorer":
        state = explorer_state("rope", 1024)
        figure, text = SingleFigure(), visible_text(readout_html(state))
        notes, _ = explorer_notes(state)
        text += "\n" + "\n".join(notes)
    elif which == "trained":
        catalogue = trained_catalogue(store_path)
        default = "rope" if "rope" in catalogue["encodings"] else catalogue["encodings"][0]
        setting = catalogue["settings"][default][0]
        state = trained_state(catalogue, default, catalogue["seeds"][setting][0], eval_multiple=2, setting=setting)
        figure, text = TrainedFigure(), visible_text(trained_readout_html(state))
    else:
        raise ValueError(f"which must be 'explorer' or 'trained', got {which!r}")
    plot = PILImage.open(io.BytesIO(figure.render(state)))
    header = _text_strip(
        "a picture of the widget in its default state (run the notebook for the live one)\n" + text, plot.width
    )
    picture = PILImage.new("RGB", (plot.width, header.height + plot.height), "white")
    picture.paste(header.convert("RGB"), (0, 0))
    picture.paste(plot.convert("RGB"), (0, header.height))
    buffer = io.BytesIO()
    picture.quantize(colors=128).save(buffer, format="png", optimize=True)
    return buffer.getvalue()


def save_default_image(path: str | Path, which: str = "explorer", store_path: str | Path | None = None) -> Path:
    """Write :func:`default_picture` to ``path`` atomically (the notebooks' static fallback)."""
    data = default_picture(which, store_path)
    path = Path(path)
    atomic_write(path, lambda tmp: tmp.write_bytes(data))
    return path
