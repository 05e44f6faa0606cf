"""What the notebooks share that is about the notebook, not the measurement: one setup call, and exercise
answers that Run All computes but does not show.

:func:`setup` is every notebook's first line of code: PNG figures (never SVG: the browser test and nbval
read PNG), matplotlib at JupyterLab's width (100 dpi, 10 pt), and no Hugging Face hub at run time;
:data:`QUICK` says whether quick mode (``ATTNRES_QUICK=1``, the test suite's) is on.

An answer cell runs under ``with folded_answer():``. Everything it prints or displays is gathered and shown
as one closed HTML disclosure ("Answer: click to open"): Run All computes the answer (so nbval checks its
numbers against the committed ones) without showing it, opening it is a deliberate click, and the fold is
part of the output itself, so an autosave cannot open it (a cell's ``outputs_hidden`` flag does not survive
Run All). Rich outputs (tables) come first, then the printed text. Where HTML is not shown, the plain text
is the answer itself.
"""

from __future__ import annotations

import os
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

    try:
        with capture_output(stdout=True, stderr=True, display=True) as captured:
            yield
    except BaseException:
        captured.show()  # what the block printed before its error, unfolded
        raise
    rich = tuple(
        o.data.get("text/html") or f"<pre>{escape(o.data.get('text/plain', ''))}</pre>" for o in captured.outputs
    )
    display(fold(captured.stdout + captured.stderr, rich, summary), raw=True)
