"""Both explorers in a real browser, driven as a student would: every encoding, reset, compare mode,
and one control of the trained-model explorer, with the readout checked after each step.

A small notebook written into the server's temporary folder holds the two widgets (design-time
explorer of notebook 02, trained-model explorer of notebook 04), so the test runs no notebook
prose and stays short. Each expected readout is computed here by the package's own pure functions.
The time from a key press (or click) to the readout showing the expected text is measured in the
page (polled every animation frame) and printed, median and max, for single and compare mode
(run with `pytest -s` to see them). Screenshots go to test-artifacts/.
"""

import hashlib
import html
import json
import os
import re
import statistics
import time

import pytest

from attnres_helpers.encodings import DESIGN_CURVES
from attnres_helpers.widgets import (
    COMPARE_DEFAULT,
    L_RANGE,
    CompareFigure,
    SingleFigure,
    TrainedFigure,
    compare_readout_html,
    compare_states,
    explorer_state,
    readout_html,
    trained_catalogue,
    trained_readout_html,
    trained_state,
)
from attnres_helpers.widgets.render import shared_figure

from .conftest import ARTIFACTS_DIR
from .test_explorer_browser import Deadline, artifacts_on_failure, open_notebook, run_all_cells, wait_until_kernel_done

pytestmark = pytest.mark.browser
playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -r requirements-test.txt)"
)

TEST_TIME_LIMIT_S = 150  # page load to the last screenshot; ~40-70 s on a loaded 2-core machine
L_START = 1024
STEPS_PER_MODE = 5  # ArrowRight presses timed in each mode
CELLS = [
    f"from attnres_helpers.widgets import explorer\nexplorer('rope', {L_START})",
    "from attnres_helpers.widgets import trained_explorer\ntrained_explorer()",
]


def norm(text):
    """Whitespace collapsed, as the page's check does it (JS \\s, like Python's split, includes &nbsp;)."""
    return " ".join(text.split())


def shown(markup):
    """The text a browser shows for a readout's HTML, whitespace collapsed: line breaks and table
    cells become spaces, tags go, entities are unescaped."""
    text = re.sub(r"<br\s*/?>|</t[dhr]>|<table[^>]*>", " ", markup)
    return norm(html.unescape(re.sub(r"<[^>]+>", "", text)))


def write_notebook(path):
    cells = [
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": src} for src in CELLS
    ]
    notebook = {
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook))


def wait_for_text(page, element, expected, deadline, cap_s=30):
    """Wait, polling every animation frame, until element shows expected (whitespace collapsed)."""
    try:
        page.wait_for_function(
            "([el, want]) => el.innerText.replace(/\\s+/g, ' ').trim() === want",
            arg=[element, expected],
            polling="raf",
            timeout=deadline.ms(cap_s),
        )
    except playwright_api.TimeoutError:
        raise AssertionError(f"readout never showed {expected!r}; last text {norm(element.inner_text())!r}") from None


SHOWS_PICTURE = """([img, want]) => {
    // true once the <img> shows the PNG whose SHA-256 is `want`. Synchronous, as a polled predicate must be
    // (a returned Promise would count as true at once): each new blob URL is hashed once, in the background.
    const src = img.getAttribute('src');
    const digests = (window.attnresDigests ??= new Map());
    if (src && !digests.has(src)) {
        digests.set(src, null);
        fetch(src).then(r => r.arrayBuffer()).then(data => crypto.subtle.digest('SHA-256', data)).then(hash => {
            digests.set(src, Array.from(new Uint8Array(hash), b => b.toString(16).padStart(2, '0')).join(''));
        }).catch(() => digests.delete(src));  // a failed read is tried again on the next frame
    }
    return Boolean(src) && digests.get(src) === want;
}"""


def timed(page, element, expected, action, deadline, figure=None):
    """Seconds from action() to the readout showing expected and, with ``figure`` = (the figure's <img>, the PNG
    the view expected draws), to that image showing that picture: (readout_s, figure_s or None).

    The picture itself, not a change of picture, says the figure is current: keys pressed within the redraw
    delay are drawn once, and a draw that makes the bytes already shown sends nothing (layer 0 then layer 1
    while layer 1 is shown never changes the image; tests/test_widgets_trained.py). The expected PNG is
    rendered here, by the figure class the kernel uses (a shared figure draws what a fresh one draws)."""
    start = time.perf_counter()
    action()
    wait_for_text(page, element, expected, deadline)
    readout_s = time.perf_counter() - start
    if figure is None:
        return readout_s, None
    plot, png = figure
    try:
        page.wait_for_function(
            SHOWS_PICTURE, arg=[plot, hashlib.sha256(png).hexdigest()], polling="raf", timeout=deadline.ms(30)
        )
    except playwright_api.TimeoutError:
        raise AssertionError(f"the figure never showed the picture of the view expected ({expected!r})") from None
    return readout_s, time.perf_counter() - start


def press_toggle(page, root, control, label, deadline):
    """Choose ``label`` of a toggle-button control by keyboard, as a student without a mouse would: focus its
    button, press Space (a drop-down lost its arrow keys to JupyterLab, which moved the active cell)."""
    button = root.locator(f".{control} button").filter(has_text=re.compile(rf"^\s*{re.escape(label)}\s*$")).first
    button.focus(timeout=deadline.ms(10))
    page.keyboard.press("Space")


def design_text(name, L, **params):
    return shown(readout_html(explorer_state(name, L, params)))


def test_explorers_as_students_use_them(page, lab, lab_root):
    notebook = lab_root / "explorers.ipynb"
    write_notebook(notebook)
    deadline = Deadline(TEST_TIME_LIMIT_S)
    page.set_default_timeout(30_000)
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    latencies = {"single": [], "compare": []}  # (readout, figure) seconds per L step (per layer: "trained")
    started = time.perf_counter()

    with artifacts_on_failure(page, lab, "explorers"):
        open_notebook(page, lab.url(notebook.name), len(CELLS), deadline)
        run_all_cells(page, deadline)
        root = page.locator(".attnres-explorer").first
        readout = root.locator(".attnres-readout").first
        trained_readout = page.locator(".attnres-trained-readout").first
        readout.wait_for(state="visible", timeout=deadline.ms(120))
        trained_readout.wait_for(state="visible", timeout=deadline.ms(120))
        wait_until_kernel_done(page, deadline)
        element = readout.element_handle(timeout=deadline.ms(10))
        plot = root.locator("img.attnres-plot").first.element_handle(timeout=deadline.ms(10))
        wait_for_text(page, element, design_text("rope", L_START), deadline)

        # single mode: one step of the L slider at a time, each timed to the exact new readout
        handle = root.locator(".attnres-slider-L .noUi-handle").first
        L = L_START
        for _ in range(STEPS_PER_MODE):
            handle.focus(timeout=deadline.ms(10))
            L += L_RANGE[2]
            latencies["single"].append(
                timed(
                    page,
                    element,
                    design_text("rope", L),
                    lambda: page.keyboard.press("ArrowRight"),
                    deadline,
                    (plot, shared_figure(SingleFigure).render(explorer_state("rope", L))),
                )
            )

        # every encoding, at the current L, chosen by keyboard (its toggle button focused, then Space): the
        # readout, and the notes that say what cannot act
        note = root.locator(".attnres-note").first
        texts = {}
        for name in DESIGN_CURVES:
            press_toggle(page, root, "attnres-encoding", name, deadline)
            texts[name] = design_text(name, L)
            wait_for_text(page, element, texts[name], deadline)
            if name == "nope":
                assert "NoPE's scale is disabled" in note.inner_text()
                assert "flat" in root.locator(".attnres-warning").first.inner_text()
                root.screenshot(path=str(ARTIFACTS_DIR / "explorer-nope.png"), timeout=deadline.ms(20))
            if name in ("sinusoidal", "rope"):
                assert "same design-time curve" in note.inner_text()
        nope_at_L_start = design_text("nope", L_START)

        # the boundary by keyboard too, then back
        press_toggle(page, root, "attnres-encoding", "rope", deadline)
        wait_for_text(page, element, design_text("rope", L), deadline)
        press_toggle(page, root, "attnres-boundary", "drop", deadline)
        wait_for_text(page, element, shown(readout_html(explorer_state("rope", L, None, "drop"))), deadline)
        press_toggle(page, root, "attnres-boundary", "zero", deadline)
        wait_for_text(page, element, design_text("rope", L), deadline)

        # reset: move L and the scale away, then the button brings RoPE back to its defaults
        scale_handle = root.locator(".attnres-slider-scale .noUi-handle").first
        scale_handle.focus(timeout=deadline.ms(10))
        page.keyboard.press("ArrowRight")
        wait_for_text(page, element, design_text("rope", L, scale=8.25), deadline)
        root.locator(".attnres-reset").first.click(timeout=deadline.ms(10))
        after_reset = design_text("rope", L_START)
        wait_for_text(page, element, after_reset, deadline)
        root.screenshot(path=str(ARTIFACTS_DIR / "explorer-reset.png"), timeout=deadline.ms(20))

        # compare mode: the six default encodings, then L steps timed like single mode
        root.locator(".attnres-mode button", has_text=re.compile(r"^compare$")).click(timeout=deadline.ms(10))
        L = L_START
        compare_text = lambda L: shown(compare_readout_html(compare_states(list(COMPARE_DEFAULT), L)))  # noqa: E731
        wait_for_text(page, element, compare_text(L), deadline)
        assert "rope coincides with sinusoidal" in norm(readout.inner_text())
        for _ in range(STEPS_PER_MODE):
            handle.focus(timeout=deadline.ms(10))
            L += L_RANGE[2]
            latencies["compare"].append(
                timed(
                    page,
                    element,
                    compare_text(L),
                    lambda: page.keyboard.press("ArrowRight"),
                    deadline,
                    (plot, shared_figure(CompareFigure).render(compare_states(list(COMPARE_DEFAULT), L))),
                )
            )
        wait_until_kernel_done(page, deadline)
        root.screenshot(path=str(ARTIFACTS_DIR / "explorer-compare.png"), timeout=deadline.ms(20))

        # the trained-model explorer: its default readout, then one control (the layer, by keyboard), then BCA
        catalogue = trained_catalogue()
        trained = trained_readout.element_handle(timeout=deadline.ms(10))
        wait_for_text(
            page,
            trained,
            shown(trained_readout_html(trained_state(catalogue, "rope", 0, "mean", "mean", 2, False))),
            deadline,
        )
        press_toggle(page, page.locator(".attnres-trained-explorer").first, "attnres-t-layer", "1", deadline)
        layer_1 = trained_state(catalogue, "rope", 0, 1, "mean", 2, False)
        wait_for_text(page, trained, shown(trained_readout_html(layer_1)), deadline)
        page.locator(".attnres-t-bca input[type=checkbox]").first.check(timeout=deadline.ms(10))
        wait_for_text(
            page,
            trained,
            shown(trained_readout_html(trained_state(catalogue, "rope", 0, 1, "mean", 2, True))),
            deadline,
        )
        # its figure's latency, reported like the design explorer's: each layer in turn, by keyboard, with BCA on
        trained_root = page.locator(".attnres-trained-explorer").first
        trained_plot = trained_root.locator("img.attnres-trained-plot").first.element_handle(timeout=deadline.ms(10))
        latencies["trained"] = []
        for layer in [*range(catalogue["layers"]), "mean", 1]:
            state = trained_state(catalogue, "rope", 0, layer, "mean", 2, True)
            press = lambda layer=layer: press_toggle(page, trained_root, "attnres-t-layer", str(layer), deadline)  # noqa: E731
            figure, expected = (
                (trained_plot, shared_figure(TrainedFigure).render(state)),
                shown(trained_readout_html(state)),
            )
            latencies["trained"].append(timed(page, trained, expected, press, deadline, figure))
        wait_until_kernel_done(page, deadline)
        page.locator(".attnres-trained-explorer").first.screenshot(
            path=str(ARTIFACTS_DIR / "trained-explorer.png"), timeout=deadline.ms(20)
        )

    print(f"\nNoPE at its defaults (L = {L_START}): {nope_at_L_start}")
    print(f"RoPE after a reset: {after_reset}")
    print(f"trained explorer, rope seed 0 layer 1 at 2L: {shown(trained_readout_html(layer_1))}")
    for (
        mode,
        times,
    ) in latencies.items():  # reported, not asserted: the target is a figure median <= 150 ms at load <= 3
        for i, what in enumerate(("readout", "figure")):
            ms = [1e3 * t[i] for t in times]
            print(
                f"browser latency, {mode} {'explorer, layer' if mode == 'trained' else 'mode, L'} step to {what} "
                f"({len(ms)} steps): "
                f"median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms"
            )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"test body: {time.perf_counter() - started:.1f} s")
    same_numbers = texts["sinusoidal"].split(" ", 1)[1] == texts["rope"].split(" ", 1)[1]
    assert same_numbers, "sinusoidal and RoPE share one design-time curve, so one pair"
