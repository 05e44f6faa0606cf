"""The encoding explorer in a real browser: JupyterLab + Debian's chromium via Playwright.

The test opens a copy of notebooks/02_encoding_explorer.ipynb (outputs and saved widget
state stripped, autosave off, so the committed notebook is never written), runs all cells
from the Run menu, reads the R readout, moves the training-length slider one step right
with the keyboard and waits for the readout to show R at the new L, computed here by the
project's own code. The screenshot goes to test-artifacts/explorer.png; on failure a
screenshot, the cell outputs and the server log go to test-artifacts/ as well.

Run it alone with `make browser-test` or `python -m tests.browser.test_explorer_browser`.
"""

import html
import json
import re
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from attnres_helpers.encodings import DESIGN_CURVES
from attnres_helpers.widgets import explorer_state, format_ratio, format_sig

from .conftest import ARTIFACTS_DIR, REPO_ROOT

pytestmark = pytest.mark.browser
playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -r requirements-test.txt)"
)

EXPLORER_NOTEBOOK = REPO_ROOT / "notebooks" / "02_encoding_explorer.ipynb"
TEST_TIME_LIMIT_S = 240  # page load to screenshot; it takes ~10-30 s
NUMBER = r"(?:-?\d+(?:\.\d+)?(?:e[-+]\d+)?)"  # what format_sig writes: 3 significant figures
READOUT_PATTERN = re.compile(rf"R\(L\) = {NUMBER} · R\(2L\) = {NUMBER} · R\(2L\)/R\(L\) = ({NUMBER}|undefined\b)")


class Deadline:
    """One time budget shared by every wait in a test, so the test as a whole is bounded."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def remaining_s(self):
        return self.end - time.monotonic()

    def ms(self, cap_s):
        """A Playwright timeout: cap_s seconds, or what is left of the budget if less."""
        remaining = self.remaining_s()
        if remaining <= 0:
            raise TimeoutError(f"test exceeded its {self.seconds} s budget")
        return 1000 * min(cap_s, remaining)


def visible_text(markup):
    """The text a browser shows for an HTML snippet, whitespace collapsed (&nbsp; included)."""
    text = re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", "\n", markup))
    return " ".join(html.unescape(text).split())


def copy_without_outputs(source, destination):
    """Copy a notebook with outputs, execution counts and saved widget state removed.

    A saved widget state would render a stale readout before the kernel runs.
    """
    notebook = json.loads(Path(source).read_text())
    notebook.get("metadata", {}).pop("widgets", None)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    Path(destination).write_text(json.dumps(notebook))


@contextmanager
def artifacts_on_failure(page, lab, name):
    """On any exception: save a screenshot, every cell's outputs and the server log."""
    try:
        yield
    except BaseException:
        ARTIFACTS_DIR.mkdir(exist_ok=True)
        try:
            page.screenshot(path=str(ARTIFACTS_DIR / f"{name}-failure.png"), timeout=10_000)
            cells_html = page.eval_on_selector_all(
                ".jp-Notebook .jp-Cell",
                "cells => cells.map((c, i) => `<h3>cell ${i}: `"
                " + (c.querySelector('.jp-InputPrompt')?.textContent ?? '') + '</h3>'"
                " + (c.querySelector('.jp-OutputArea')?.outerHTML ?? '')).join('\\n')",
            )
            (ARTIFACTS_DIR / f"{name}-failure-outputs.html").write_text(f"<html><body>{cells_html}</body></html>")
        except Exception as error:  # the page itself may be gone; keep the first error
            (ARTIFACTS_DIR / f"{name}-failure-note.txt").write_text(f"could not save page artifacts: {error!r}\n")
        (ARTIFACTS_DIR / f"{name}-failure-jupyterlab.log").write_text(lab.log_tail(50_000))
        raise


def open_notebook(page, url, n_cells, deadline):
    """Load the notebook: all n_cells in the DOM and its kernel started and idle.

    The execution indicator reads "idle" before any kernel exists, so readiness is taken
    from the status bar, which names the kernel and its state ("Python 3 (ipykernel) | Idle").
    """
    page.goto(url, timeout=deadline.ms(60))
    page.wait_for_function(
        "n => document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell').length === n",
        arg=n_cells,
        timeout=deadline.ms(60),
    )
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]"
        ".some(e => /^(?!No Kernel).+ \\| Idle$/.test(e.textContent.trim()))",
        timeout=deadline.ms(90),
    )


def run_all_cells(page, deadline):
    """Run > Run All Cells, retried once if no cell shows [*] or an execution count [n]."""
    any_cell_started = (
        "() => [...document.querySelectorAll('.jp-InputPrompt')].some(p => /\\[(\\d+|\\*)\\]/.test(p.textContent))"
    )
    for attempt in (1, 2):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click(timeout=deadline.ms(30))
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click(timeout=deadline.ms(30))
        try:
            page.wait_for_function(any_cell_started, timeout=deadline.ms(20))
            return
        except playwright_api.TimeoutError:
            if attempt == 2:
                raise
            page.keyboard.press("Escape")  # close a menu left open


def wait_until_kernel_done(page, deadline):
    """Wait until no cell is queued or running ([*]) and the kernel is idle."""
    page.wait_for_function(
        "() => ![...document.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('[*]'))",
        timeout=deadline.ms(180),
    )
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=deadline.ms(60))


def wait_for_readout(readout, expected, deadline, poll_s=0.1):
    """Poll the readout until its visible text (whitespace collapsed) is one of expected.

    Waiting for an exact text, not for any change, skips intermediate values.
    """
    text = ""
    while deadline.remaining_s() > 0:
        text = " ".join(readout.inner_text(timeout=deadline.ms(10)).split())
        if text in expected:
            return text
        time.sleep(poll_s)
    raise AssertionError(f"readout never showed any of {sorted(expected)!r}; last text {text!r}")


def explorer_readout(encoding, L):
    """The readout's visible text for encoding at training length L, every other control at
    its default: the state from the explorer's pure function, each number written by the
    explorer's own formatting functions (3 significant figures, scientific below 1e-3)."""
    state = explorer_state(encoding, L)
    r_L, r_2L = state["R_L"], state["R_2L"]
    return (
        f"{encoding} R(L) = {format_sig(r_L)} · R(2L) = {format_sig(r_2L)}"
        f" · R(2L)/R(L) = {format_ratio(r_L, state['ratio'])}"
    )


def test_explorer_slider_updates_readout(page, lab, lab_root):
    """Notebook 02: one step right on the L slider shows R at the new L in the readout."""
    if not EXPLORER_NOTEBOOK.exists():
        pytest.fail(f"{EXPLORER_NOTEBOOK.relative_to(REPO_ROOT)} is missing")
    notebook_copy = lab_root / EXPLORER_NOTEBOOK.name
    copy_without_outputs(EXPLORER_NOTEBOOK, notebook_copy)
    n_cells = len(json.loads(notebook_copy.read_text())["cells"])
    deadline = Deadline(TEST_TIME_LIMIT_S)
    page.set_default_timeout(30_000)

    with artifacts_on_failure(page, lab, "explorer"):
        open_notebook(page, lab.url(notebook_copy.name), n_cells, deadline)
        run_all_cells(page, deadline)

        # The first explorer: its slider and readout share one output area.
        explorer = page.locator(".jp-OutputArea-output", has=page.locator(".attnres-slider-L")).first
        readout = explorer.locator(".attnres-readout").first
        handle = explorer.locator(".attnres-slider-L .noUi-handle").first
        readout.wait_for(state="visible", timeout=deadline.ms(120))
        wait_until_kernel_done(page, deadline)

        # Which encoding the notebook opened the explorer on: the one whose readout it shows.
        L_before = round(float(handle.get_attribute("aria-valuenow", timeout=deadline.ms(10))))
        readout_of = {explorer_readout(name, L_before): name for name in DESIGN_CURVES}
        text_before = wait_for_readout(readout, readout_of, deadline)
        encoding = readout_of[text_before]

        handle.focus(timeout=deadline.ms(10))
        page.keyboard.press("ArrowRight")
        page.wait_for_function(
            "([h, before]) => Math.round(Number(h.getAttribute('aria-valuenow'))) !== before",
            arg=[handle.element_handle(timeout=deadline.ms(10)), L_before],
            timeout=deadline.ms(10),
        )
        L_after = round(float(handle.get_attribute("aria-valuenow", timeout=deadline.ms(10))))
        text_after = wait_for_readout(readout, {explorer_readout(encoding, L_after)}, deadline)
        wait_until_kernel_done(page, deadline)  # let the plot redraw before the screenshot

        explorer.evaluate("e => e.scrollIntoView({block: 'start'})")
        ARTIFACTS_DIR.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS_DIR / "explorer.png"), timeout=deadline.ms(30))

    assert L_after > L_before, f"ArrowRight moved L from {L_before} to {L_after}"
    assert READOUT_PATTERN.search(text_after), f"no R(L), R(2L), ratio to 3 significant figures in {text_after!r}"
    assert text_after != text_before, f"readout did not change: {text_before!r}"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-m", "browser", "-v"]))
