"""Every relative link and image in every notebook resolves from the folder the notebook lives in.

Links are read from markdown cells, from rendered outputs (text/markdown, text/html) and from the
HTML that saved widget state shows (the explorers' help text links notebook 01): markdown links and
images ``[text](target)``, ``![alt](target)``, and HTML ``href=`` and ``src=``. Absolute URLs,
in-page anchors and data URIs are left alone. A failure names the notebook, where the link is,
and the link.
"""

import json
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
OUTPUT_TYPES = ("text/markdown", "text/html")


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else source


def links_in(text: str) -> list[str]:
    """The link targets of a markdown or HTML text, in order."""
    return [m.group(1) for m in MARKDOWN_LINK.finditer(text)] + [a or b for a, b in HTML_LINK.findall(text)]


def notebook_links(notebook: dict) -> list[tuple[str, str]]:
    """(where, target) for every link of a notebook: its cells (by index) and its saved widget state."""
    found = []
    for i, cell in enumerate(notebook.get("cells", [])):
        texts = [_text(cell.get("source", ""))] if cell.get("cell_type") == "markdown" else []
        texts += [
            _text(output["data"][kind])
            for output in cell.get("outputs", [])
            for kind in OUTPUT_TYPES
            if kind in output.get("data", {})
        ]
        found += [(f"cell {i} ({cell.get('cell_type')})", target) for text in texts for target in links_in(text)]
    state = notebook.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    for model_id, model in state.get("state", {}).items():
        value = model.get("state", {}).get("value")
        if isinstance(value, str):
            found += [(f"widget {model_id}", target) for target in links_in(value)]
    return found


def broken_links(path: Path) -> list[str]:
    """One line per relative link of the notebook at ``path`` that names no existing file or folder."""
    broken = []
    for where, target in notebook_links(json.loads(path.read_text(encoding="utf-8"))):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or not parts.path:  # http:, mailto:, data:, //host, or "#anchor" alone
            continue
        if not (path.parent / unquote(parts.path)).exists():
            broken.append(f"{path.name}, {where}: {target!r} (looked for {path.parent.name}/{unquote(parts.path)})")
    return broken


def test_the_notebooks_and_their_links_are_found():
    assert len(NOTEBOOKS) >= 6, NOTEBOOKS
    targets = {
        target for path in NOTEBOOKS for _, target in notebook_links(json.loads(path.read_text(encoding="utf-8")))
    }
    assert {"../data/figures/explorer_default.png", "../data/figures/trained_explorer_default.png"} <= targets
    assert "01_deriving_resolution.ipynb" in targets  # the explorer's help text, in notebook 02's saved widget state


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_relative_links_and_images_resolve(path):
    assert broken_links(path) == []


def test_a_broken_link_is_reported_with_the_notebook_and_the_link(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "there.png").write_bytes(b"")
    cells = [
        {
            "cell_type": "markdown",
            "source": [
                "![ok](figures/there.png) [web](https://example.org) [anchor](#top)\n",
                "![gone](figures/missing.png)",
            ],
        },
        {
            "cell_type": "code",
            "source": "",
            "outputs": [{"output_type": "display_data", "data": {"text/html": "<a href='other.ipynb#s2'>x</a>"}}],
        },
    ]
    widgets = {
        "application/vnd.jupyter.widget-state+json": {
            "state": {"m1": {"state": {"value": '<img src="figures/there.png"> <a href="02_x.ipynb">02</a>'}}}
        }
    }
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {"widgets": widgets}}))
    assert broken_links(path) == [
        f"nb.ipynb, cell 0 (markdown): 'figures/missing.png' (looked for {tmp_path.name}/figures/missing.png)",
        f"nb.ipynb, cell 1 (code): 'other.ipynb#s2' (looked for {tmp_path.name}/other.ipynb)",
        f"nb.ipynb, widget m1: '02_x.ipynb' (looked for {tmp_path.name}/02_x.ipynb)",
    ]
