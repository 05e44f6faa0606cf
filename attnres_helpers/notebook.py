"""What the notebooks share that is about the notebook, not the measurement: one setup call, and exercise
answers that Run All computes but does not show.

:func:`setup` is every notebook's first line of code: PNG figures (never SVG: the browser test and nbval
read PNG), matplotlib at JupyterLab's width (100 dpi, 10 pt), and no Hugging Face hub at run time;
:data:`QUICK` says whether quick mode (``ATTNRES_QUICK=1``, the test suite's) is on.

An answer cell runs under ``with folded_answer():``. Everything it prints or displays is gathered and shown
as one closed HTML disclosure ("Answer: click to open"): Run All computes the answer (so nbval checks its
numbers against the committed ones) without showing it, opening it is a deliberate click, and the fold is
part of the output itself, so an autosave cannot open it (a cell's ``outputs_hidden`` flag does not survive
Run All). Rich outputs come first, each in its richest form (:func:`as_html`: tables, figures and images,
Markdown, math), then the printed text; a figure the block left open is shown inside too. Where HTML is not
shown, the plain text is the answer itself.
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from html import escape

SUMMARY = "Answer: click to open"
NOTEBOOK_RC = {"figure.dpi": 100, "font.size": 10}  # shown at their pixel size at JupyterLab's width


QUICK = os.environ.get("ATTNRES_QUICK", "0") == "1"  # quick mode, the test suite's: notebooks coarsen a few curves


def setup() -> None:
    """Set up a notebook's kernel: PNG figures, :data:`NOTEBOOK_RC`, and ``HF_HUB_OFFLINE=1`` unless set."""
    import matplotlib.pyplot as plt

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing a notebook runs needs the hub
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:  # pragma: no cover (IPython comes with ipywidgets)
        shell = None
    if shell is not None:
        shell.run_line_magic("config", "InlineBackend.figure_formats = ['png']")
    plt.rcParams.update(NOTEBOOK_RC)


def fold(text: str, rich_html: tuple[str, ...] = (), summary: str = SUMMARY) -> dict[str, str]:
    """The MIME bundle of a folded answer: ``<details>`` (closed) around the rich outputs' HTML and the
    printed ``text``, with ``text`` as the plain-text form."""
    body = "".join(rich_html) + (f"<pre>{escape(text)}</pre>" if text else "")
    return {
        "text/html": f"<details><summary><b>{escape(summary)}</b></summary>{body}</details>",
        "text/plain": text or summary,
    }


@contextmanager
def folded_answer(summary: str = SUMMARY) -> Iterator[None]:
    """Run the block with its printed and displayed output captured, then show it folded (:func:`fold`).
    An error inside the block is raised as it is, with whatever was printed before it shown unfolded."""
    from IPython.display import display
    from IPython.utils.capture import capture_output

    pyplot = sys.modules.get("matplotlib.pyplot")
    before = set(pyplot.get_fignums()) if pyplot is not None else set()
    try:
        with capture_output(stdout=True, stderr=True, display=True) as captured:
            yield
            _show_new_figures(before)
    except BaseException:
        captured.show()  # what the block printed before its error, unfolded
        raise
    rich = tuple(as_html(o.data, o.metadata) for o in captured.outputs)
    display(fold(captured.stdout + captured.stderr, rich, summary), raw=True)


def _show_new_figures(before: set[int]) -> None:
    """Display, then close, the pyplot figures the block opened and left open: the inline backend would show
    them after the cell, outside the fold."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    from IPython.display import display

    for number in pyplot.get_fignums():
        if number not in before:
            figure = pyplot.figure(number)
            display(figure)
            pyplot.close(figure)


IMAGES = ("image/png", "image/jpeg", "image/gif")  # kept as base64 in a bundle (bytes in older IPython)


def as_html(data: dict, metadata: dict | None = None) -> str:
    """One displayed output's MIME bundle as HTML inside the fold, its richest form that HTML can carry:
    HTML itself; an image (a figure) as an ``<img>`` of its own bytes, at the size its metadata gives; SVG;
    Markdown rendered (mistune, which JupyterLab brings; else the source); LaTeX as its source, which the
    front end typesets in HTML as it does in Markdown; else the plain text. Never a repr of what has a
    richer form."""
    metadata = metadata or {}
    if "text/html" in data:
        return data["text/html"]
    for mime in IMAGES:
        if mime in data:
            encoded = data[mime]
            if isinstance(encoded, bytes):
                encoded = base64.b64encode(encoded).decode("ascii")
            size = metadata.get(mime) or {}
            attributes = "".join(f' {k}="{int(size[k])}"' for k in ("width", "height") if k in size)
            return f'<img src="data:{mime};base64,{encoded}"{attributes}/>'
    if "image/svg+xml" in data:
        return data["image/svg+xml"]
    if "text/markdown" in data:
        return _markdown_html(data["text/markdown"])
    if "text/latex" in data:
        return f"<div>{escape(data['text/latex'])}</div>"
    return f"<pre>{escape(data.get('text/plain', ''))}</pre>"


def _markdown_html(text: str) -> str:
    try:
        import mistune
    except ImportError:  # pragma: no cover (JupyterLab's nbconvert brings it)
        return f"<pre>{escape(text)}</pre>"
    return mistune.create_markdown(plugins=["math"])(text)
