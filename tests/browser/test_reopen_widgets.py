"""A notebook re-opened after Run All and a save shows its widgets, not "Error displaying widget: model not
found": `make lab`'s settings (lab-settings/overrides.json) save the widget state with the notebook.

The notebook holds one slider. It is run, saved (Ctrl+S), its kernel shut down, and the page reloaded: the
widget must render from the state saved in the file, with no error text, and the file must hold that state.
"""

import json

import pytest

from .conftest import REPO_ROOT
from .jupyter_server import JupyterLab
from .test_explorer_browser import Deadline, artifacts_on_failure, open_notebook, run_all_cells, wait_until_kernel_done

pytestmark = pytest.mark.browser
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -r requirements-test.txt)")

CELL = "import ipywidgets as widgets\n\nwidgets.IntSlider(value=3, min=0, max=9, description='three')"


def test_a_reopened_notebook_shows_its_widget_from_the_saved_state(page, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    notebook = root / "slider.ipynb"
    cell = {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": CELL}
    kernelspec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    notebook.write_text(
        json.dumps({"cells": [cell], "metadata": {"kernelspec": kernelspec}, "nbformat": 4, "nbformat_minor": 5})
    )
    options = [f"--LabApp.app_settings_dir={REPO_ROOT / 'lab-settings'}"]  # as make lab starts it
    server = JupyterLab(root, tmp_path / "state", extra_args=options)
    deadline = Deadline(240)
    with server, artifacts_on_failure(page, server, "reopen-widgets"):
        open_notebook(page, server.url(notebook.name), 1, deadline)
        run_all_cells(page, deadline)
        wait_until_kernel_done(page, deadline)
        page.locator(".jp-OutputArea .widget-slider").first.wait_for(state="visible", timeout=deadline.ms(60))
        page.locator(".jp-Notebook").first.click(timeout=deadline.ms(10))
        page.keyboard.press("Control+s")
        page.wait_for_function(
            "() => !document.querySelector('.jp-mod-dirty')", timeout=deadline.ms(30)
        )  # the tab's dirty mark is gone: saved
        server.shutdown_kernels()
        saved = json.loads(notebook.read_text())
        assert saved["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state")
        page.goto(server.url(notebook.name), timeout=deadline.ms(60))
        page.wait_for_function(
            "() => document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell').length === 1",
            timeout=deadline.ms(60),
        )
        page.locator(".jp-OutputArea .widget-slider").first.wait_for(state="visible", timeout=deadline.ms(60))
        shown = page.inner_text(".jp-OutputArea", timeout=deadline.ms(10))
        assert "Error displaying widget" not in shown and "three" in shown, shown
