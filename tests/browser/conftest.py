"""Fixtures for the browser tests: a JupyterLab server and Debian's chromium via Playwright.

Each test skips, with the reason, where the machine cannot run it: no `chromium` on PATH
(`apt-get install chromium`), no Playwright (`pip install -r requirements-test.txt`), or a
chromium that does not start. Playwright's own browser download is never used.
"""

import os
import shutil
from pathlib import Path

import pytest

from .jupyter_server import JupyterLab

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless=new",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1100}


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory):
    """The folder the server serves: tests copy their notebooks here, never into the repo."""
    return tmp_path_factory.mktemp("lab-root")


@pytest.fixture(scope="module")
def lab(lab_root, tmp_path_factory):
    """A JupyterLab on 127.0.0.1 whose kernels import attnres_helpers from this checkout.

    Notebooks run in quick mode (ATTNRES_QUICK=1) unless the caller set ATTNRES_QUICK.
    """
    server = JupyterLab(
        lab_root,
        tmp_path_factory.mktemp("lab-state"),
        extra_pythonpath=[REPO_ROOT],
        extra_env={"ATTNRES_QUICK": os.environ.get("ATTNRES_QUICK", "1")},
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium, launched headless through Playwright."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no `chromium` on PATH (apt-get install chromium)")
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -r requirements-test.txt)")
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(
                executable_path=chromium, args=CHROMIUM_ARGS, headless=True, timeout=60_000
            )
        except PlaywrightError as error:
            pytest.skip(f"chromium at {chromium} does not start here: {error}")
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    try:
        yield context.new_page()
    finally:
        context.close()
