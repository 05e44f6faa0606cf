"""Notebook 10's design-time explorer in a real browser, driven by keyboard as a student would: the parameter
slider one step at a time, a family chosen by its toggle button, the layer slider; each step waits for the
exact readout that the package's pure functions give for that state (computed here), and its time from the
key press to the readout and to the new figure is printed (median and max; not asserted: the issue's target
is under 150 ms a change). A small notebook written into the server's folder holds the widget alone; Run All
of notebook 10 itself is tests/browser/test_all_notebooks.py's."""

import json
import os
import statistics
import time

import pytest

from attnres_helpers.widgets.render import shared_figure

from .conftest import ARTIFACTS_DIR
from .test_explorer_browser import Deadline, artifacts_on_failure, open_notebook, run_all_cells, wait_until_kernel_done
from .test_explorers_interaction import press_toggle, shown, timed, wait_for_text

pytestmark = pytest.mark.browser
playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -r requirements-test.txt)"
)

TEST_TIME_LIMIT_S = 150
CELL = "from attnres_helpers.widgets.design_time import design_time_explorer\ndesign_time_explorer()"
STEPS = 4  # ArrowRight presses on the parameter slider, each timed


def test_the_design_time_explorer_follows_every_control(page, lab, lab_root):
    from attnres_helpers.widgets.design_time import (
        FAMILIES,
        DesignTimeFigure,
        design_time_catalogue,
        design_time_readout_html,
        design_time_state,
    )

    catalogue = design_time_catalogue()
    picture = shared_figure(DesignTimeFigure).render  # the PNG the explorer draws for a state
    expected = lambda family, value, layer=0: shown(  # noqa: E731
        design_time_readout_html(design_time_state(catalogue, family, value, layer))
    )
    notebook = lab_root / "design_time.ipynb"
    cell = {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": CELL}
    kernel = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    notebook.write_text(
        json.dumps({"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5})
    )
    deadline = Deadline(TEST_TIME_LIMIT_S)
    page.set_default_timeout(30_000)
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    latencies = []
    started = time.perf_counter()
    with artifacts_on_failure(page, lab, "design-time-explorer"):
        open_notebook(page, lab.url(notebook.name), 1, deadline)
        run_all_cells(page, deadline)
        root = page.locator(".attnres-dt-explorer").first
        readout = root.locator(".attnres-dt-readout").first
        readout.wait_for(state="visible", timeout=deadline.ms(120))
        wait_until_kernel_done(page, deadline)
        element = readout.element_handle(timeout=deadline.ms(10))
        plot = root.locator("img.attnres-dt-plot").first.element_handle(timeout=deadline.ms(10))
        yarn = FAMILIES["YaRN"]
        wait_for_text(page, element, expected("YaRN", yarn.default), deadline)

        handle = root.locator(".attnres-dt-param .noUi-handle").first
        value = yarn.default
        for _ in range(STEPS):
            handle.focus(timeout=deadline.ms(10))
            value += yarn.step
            want = expected("YaRN", value)
            figure = (plot, picture(design_time_state(catalogue, "YaRN", value, 0)))
            latencies.append(timed(page, element, want, lambda: page.keyboard.press("ArrowRight"), deadline, figure))
        assert "yarn-4" in readout.inner_text()  # YaRN ×4 is measured: its row is in the readout

        press_toggle(page, root, "attnres-dt-family", "Self-Extend", deadline)
        se = FAMILIES["Self-Extend"]
        wait_for_text(page, element, expected("Self-Extend", se.default), deadline)
        layer = root.locator(".attnres-dt-layer .noUi-handle").first
        layer.focus(timeout=deadline.ms(10))
        latencies.append(
            timed(
                page,
                element,
                expected("Self-Extend", se.default, 1),
                lambda: page.keyboard.press("ArrowRight"),
                deadline,
                (plot, picture(design_time_state(catalogue, "Self-Extend", se.default, 1))),
            )
        )
        wait_until_kernel_done(page, deadline)
        root.screenshot(path=str(ARTIFACTS_DIR / "design-time-explorer.png"), timeout=deadline.ms(20))

    for i, what in enumerate(("readout", "figure")):
        ms = [1e3 * t[i] for t in latencies]
        print(
            f"\ndesign-time explorer, key press to {what} ({len(ms)} steps): median {statistics.median(ms):.0f} ms, "
            f"max {max(ms):.0f} ms"
        )
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
        f"test body {time.perf_counter() - started:.1f} s"
    )
