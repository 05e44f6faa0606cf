"""Every notebook, run as a reader runs it: JupyterLab, Run > Run All Cells, in Debian's chromium.

For each notebooks/*.ipynb (new notebooks are picked up by the glob), a copy without outputs is
opened in a JupyterLab whose root is a scratch copy of the repository's layout (notebooks/ beside
data/, whose folders are linked in, except data/figures/, copied, since notebooks rewrite their
figures there; ATTNRES_ROOT points the package at it, so nothing in the checkout is written). Run
All ignores ``skip-execution`` tags, as JupyterLab does for every reader, so every cell must run
offline. The test fails on any cell that did not run, any error output, any output on stderr, any
output (the cell outputs and every widget's visible text) that holds a traceback, a machine
path (/root/, /tmp/, /home/, /work/) or the word "Warning", and any exercise answer the page shows
(answers stay folded until the reader opens one). Notebooks run in quick mode
(ATTNRES_QUICK=1); each gets ATTNRES_NOTEBOOK_TIMEOUT_S seconds (default 1800), and its time is
printed (``pytest -s``) and written to test-artifacts/notebook-times.txt.

A second test starts the server the way ``make lab`` does (the recipe's own options, read from
``make -n``) and checks that it opens on the reader's copies (reading/).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from .conftest import ARTIFACTS_DIR, REPO_ROOT
from .jupyter_server import JupyterLab
from .test_explorer_browser import Deadline, artifacts_on_failure, copy_without_outputs, open_notebook, run_all_cells

pytestmark = pytest.mark.browser
playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -r requirements-test.txt)"
)

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
NOTEBOOK_TIMEOUT_S = float(os.environ.get("ATTNRES_NOTEBOOK_TIMEOUT_S", "1800"))
MACHINE_PATH = re.compile(r"/(?:root|tmp|home|work)/")
FORBIDDEN_WORDS = ("Traceback", "Warning")
SHOWN_ANSWER = re.compile(r"(?m)^Answer[:,]")  # what a folded answer prints; its closed fold shows only its summary
TIMES_FILE = ARTIFACTS_DIR / "notebook-times.txt"

# The notebook's code cells from JupyterLab's own model (window.jupyterapp, exposed by the server
# option below): execution count and outputs as nbformat JSON.
CODE_CELLS_JS = """name => {
  const panel = Array.from(window.jupyterapp.shell.widgets('main'))
    .find(w => w.context && w.context.path.endsWith(name));
  if (!panel) return null;
  const cells = panel.content.model.cells, out = [];
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type === 'code') out.push({index: i, count: cell.executionCount, outputs: cell.outputs.toJSON()});
  }
  return out;
}"""
# What the page shows under each cell, widgets included: innerText skips hidden elements.
SHOWN_JS = """cells => cells.map((c, i) => [i, c.querySelector('.jp-OutputArea')?.innerText ?? ''])"""


@pytest.fixture(scope="module")
def scratch_root(tmp_path_factory):
    """notebooks/ (copies without outputs) beside data/ (linked, figures copied), in a temporary folder."""
    root = tmp_path_factory.mktemp("repo")
    (root / "notebooks").mkdir()
    for notebook in NOTEBOOKS:
        copy_without_outputs(notebook, root / "notebooks" / notebook.name)
    (root / "data").mkdir()
    for entry in (REPO_ROOT / "data").iterdir():
        if entry.name == "figures":
            shutil.copytree(entry, root / "data" / "figures")
        else:
            (root / "data" / entry.name).symlink_to(entry)
    return root


@pytest.fixture(scope="module")
def lab_all(scratch_root, tmp_path_factory):
    server = JupyterLab(
        scratch_root,
        tmp_path_factory.mktemp("lab-state"),
        extra_pythonpath=[REPO_ROOT],
        extra_env={"ATTNRES_QUICK": os.environ.get("ATTNRES_QUICK", "1"), "ATTNRES_ROOT": str(scratch_root)},
        extra_args=["--LabApp.expose_app_in_browser=True"],
    )
    with server:
        yield server


def output_texts(output: dict) -> list[str]:
    """Every text an nbformat output holds: stream text, rich data as text, an error's traceback."""
    texts = [output.get("text", "")] if output.get("output_type") == "stream" else []
    for kind, value in output.get("data", {}).items():
        if kind.startswith("text/") or kind.endswith("+json"):
            texts.append(value if isinstance(value, str) else json.dumps(value))
    texts += output.get("traceback", [])
    return [t if isinstance(t, str) else "".join(t) for t in texts]


def problems(code_cells: list[dict], shown: list[list]) -> list[str]:
    """One line per thing that makes a run fail, naming the cell."""
    found = []
    for cell in code_cells:
        where = f"cell {cell['index']}"
        if cell["count"] is None:
            found.append(f"{where} did not run")
        for output in cell["outputs"]:
            if output.get("output_type") == "error":
                found.append(f"{where}: error output {output.get('ename')}: {output.get('evalue')}")
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                found.append(f"{where}: stderr {''.join(output.get('text', ''))[:300]!r}")
            for text in output_texts(output):
                found += [
                    f"{where}: output holds a machine path: ...{text[max(0, m.start() - 60) : m.end() + 60]!r}..."
                    for m in list(MACHINE_PATH.finditer(text))[:1]
                ]
                found += [f"{where}: output holds {word!r}" for word in FORBIDDEN_WORDS if word in text]
    for index, text in shown:
        found += [
            f"cell {index}: the page shows a machine path: {m.group(0)}..."
            for m in list(MACHINE_PATH.finditer(text))[:1]
        ]
        found += [f"cell {index}: the page shows {word!r}" for word in FORBIDDEN_WORDS if word in text]
        if SHOWN_ANSWER.search(text):  # an exercise's answer must stay folded until the reader opens it
            found.append(f"cell {index}: the page shows an exercise's answer after Run All")
    return list(dict.fromkeys(found))


def wait_until_run_all_done(page, deadline):
    """Until no cell is queued or running ([*]) and the kernel is idle, within the notebook's budget."""
    page.wait_for_function(
        "() => ![...document.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('[*]'))",
        timeout=deadline.ms(deadline.seconds),
        polling=1000,
    )
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=deadline.ms(120))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_run_all_leaves_no_error_warning_or_machine_path(notebook, lab_all, scratch_root, page):
    name = notebook.name
    n_cells = len(json.loads(notebook.read_text(encoding="utf-8"))["cells"])
    deadline = Deadline(NOTEBOOK_TIMEOUT_S)
    page.set_default_timeout(30_000)
    started = time.perf_counter()
    try:
        with artifacts_on_failure(page, lab_all, f"run-all-{notebook.stem}"):
            open_notebook(page, lab_all.url(f"notebooks/{name}"), n_cells, deadline)
            run_all_cells(page, deadline)
            wait_until_run_all_done(page, deadline)
            elapsed = time.perf_counter() - started
            code_cells = page.evaluate(CODE_CELLS_JS, name)
            shown = page.eval_on_selector_all(".jp-NotebookPanel .jp-Notebook .jp-Cell", SHOWN_JS)
            assert code_cells is not None, f"{name}: JupyterLab has no open notebook of that name"
            found = problems(code_cells, shown)
            ARTIFACTS_DIR.mkdir(exist_ok=True)
            with TIMES_FILE.open("a") as times:
                times.write(f"{name}: Run All {elapsed:.0f} s (ATTNRES_QUICK=1), {len(found)} problem(s)\n")
            print(f"\n{name}: Run All took {elapsed:.0f} s")
            assert not found, f"{name}, after Run All:\n" + "\n".join(found)
    finally:
        lab_all.shutdown_kernels()  # the next notebook gets the CPU


def test_problems_names_each_kind_of_failure():
    code_cells = [
        {"index": 1, "count": 1, "outputs": [{"output_type": "stream", "name": "stdout", "text": "R = 0.5\n"}]},
        {
            "index": 2,
            "count": 2,
            "outputs": [{"output_type": "stream", "name": "stderr", "text": "x.py:1: UserWarning: w\n"}],
        },
        {
            "index": 3,
            "count": 3,
            "outputs": [
                {
                    "output_type": "error",
                    "ename": "ValueError",
                    "evalue": "bad",
                    "traceback": ["Traceback (most recent call last)"],
                }
            ],
        },
        {
            "index": 4,
            "count": 4,
            "outputs": [{"output_type": "display_data", "data": {"text/plain": "see /home/me/x"}}],
        },
        {"index": 5, "count": None, "outputs": []},
    ]
    shown = [[6, "a widget says /root/.cache"], [1, "R = 0.5"], [7, "Answer to exercise 1: click to open"]]
    found = problems(code_cells, shown + [[8, "Answer to exercise 2: click to open\nAnswer: 42"]])
    assert found == [
        "cell 2: stderr 'x.py:1: UserWarning: w\\n'",
        "cell 2: output holds 'Warning'",
        "cell 3: error output ValueError: bad",
        "cell 3: output holds 'Traceback'",
        "cell 4: output holds a machine path: ...'see /home/me/x'...",
        "cell 5 did not run",
        "cell 6: the page shows a machine path: /root/...",
        "cell 8: the page shows an exercise's answer after Run All",
    ]


def make_lab_options() -> list[str]:
    """The server options of the Makefile's `lab` recipe (`make -n`, the venv taken as built)."""
    recipe = subprocess.run(
        ["make", "-s", "-n", "-o", ".venv/.installed", "lab"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    words = shlex.split(recipe.replace("\\\n", " "))
    start = words.index("lab") + 1
    return [w for w in words[start:] if w.startswith("--") and w != "--allow-root"]


def test_make_lab_opens_the_reading_copies(page, tmp_path):
    """`make lab`'s own options, on a server in the repository root: the page opens on reading/ (the
    reader's git-ignored copies, made as `make lab` makes them), listing every notebook and the README and
    glossary whose links lead to the copies, with the repository's data/ one level up."""
    if shutil.which("make") is None:
        pytest.skip("no `make` on PATH")
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "reading_copies.py")], check=True, cwd=REPO_ROOT)
    options = make_lab_options()
    assert "--ServerApp.root_dir=." in options, options
    server = JupyterLab(REPO_ROOT, tmp_path, extra_pythonpath=[REPO_ROOT], extra_args=options)
    deadline = Deadline(120)
    with server, artifacts_on_failure(page, server, "make-lab"):
        page.goto(f"{server.base_url}/?token={server.token}", timeout=deadline.ms(60))
        page.wait_for_selector(".jp-DirListing-item", timeout=deadline.ms(60))
        page.wait_for_function(
            "n => document.querySelectorAll('.jp-DirListing-item .jp-DirListing-itemText').length >= n",
            arg=len(NOTEBOOKS),
            timeout=deadline.ms(30),
        )
        listed = page.eval_on_selector_all(
            ".jp-DirListing-item .jp-DirListing-itemText", "els => els.map(e => e.textContent.trim())"
        )
        crumbs = page.inner_text(".jp-BreadCrumbs", timeout=deadline.ms(10))
        assert "/lab/tree/reading" in page.url, page.url
        assert [n.name for n in NOTEBOOKS if n.name not in listed] == [], listed
        assert {"README.md", "GLOSSARY.md"} <= set(listed), listed  # the guides whose links lead to the copies
        assert "reading" in crumbs, crumbs
