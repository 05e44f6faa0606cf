"""The rendered book (``make book``): a static HTML site of the committed, executed notebooks, read in any
browser without installing anything (``build/book/html/index.html``).

Nothing is executed: the notebooks are rendered with the outputs they were committed with (Sphinx with
myst-nb, ``nb_execution_mode = "off"``; ``book/conf.py``), and nothing is downloaded, at build time or when a
page is read (the theme's files and MathJax come from their PyPI packages). The sources are staged first in
``build/book/src`` with the repository's layout, so every relative link of the README, the glossary and the
notebooks resolves as it does on disk:

- ``index.md``: the README, the front page, with the table of contents in reading order appended;
- ``GLOSSARY.md`` (its headings' HTML anchors made the headings' ids), ``DESIGN.md`` and the pre-registered
  plans (``data/results/*plan*.md``, found by name, in the order written) as pages;
- ``notebooks/NN_*.ipynb``: each notebook as committed, with three changes that only a static page needs:
  a live widget's output becomes a line saying that the live version needs ``make lab`` (a progress bar's
  is dropped), with the widget's saved picture (the notebook's next cell) shown unfolded under it; the
  saved widget state is left out (the page would load the widget libraries from a CDN to show controls
  that have no kernel behind them); and a cell whose source JupyterLab hides (the exercises' solutions)
  is folded in the book too (myst-nb's ``hide-input`` tag);
- ``data/figures/``: the figures the README and the notebooks' Markdown show.

Usage: python scripts/build_book.py [--out DIR]   (default build/book; the site is DIR/html)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "book"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LIVE_NOTE = (
    '<p class="attnres-live-note"><b>A live widget stands here in JupyterLab.</b> This page cannot run it: '
    "<code>make lab</code> opens this notebook in JupyterLab, where running the cell above shows it. "
    "Its saved picture follows.</p>"
)
LIVE_NOTE_NO_PICTURE = LIVE_NOTE.replace(" Its saved picture follows.", "")
PAGES = ("GLOSSARY.md", "DESIGN.md")


def plans() -> list[str]:
    """The pre-registered plans (``data/results/*plan*.md``), in the order they were written: plan v1 has no
    number in its name (``family_plan.md``), every later one its ``_vN``."""
    names = [p.name for p in (ROOT / "data" / "results").glob("*plan*.md")]
    return sorted(names, key=lambda name: (int(m.group(1)) if (m := re.search(r"_v(\d+)", name)) else 1, name))


FOLD_LINE = re.compile(r"^\s*</?details>\s*$|^\s*<summary>.*</summary>\s*$")


def notebooks() -> list[Path]:
    """The notebooks, in reading order (their numbers)."""
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def is_progress_bar(output: dict) -> bool:
    """tqdm's bar in a notebook: a widget whose plain text is the bar (``|...| n/N``)."""
    return bool(re.search(r"\|\s*\d+/\d+", "".join(output.get("data", {}).get("text/plain", ""))))


def unfold(source: str) -> str:
    """A Markdown cell's text without the ``<details>``/``<summary>`` lines that fold it in JupyterLab."""
    return "".join(line for line in source.splitlines(keepends=True) if not FOLD_LINE.match(line))


def stage_notebook(path: Path) -> dict:
    """The notebook as the book shows it (the module docstring says what changes)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    notebook["metadata"].pop("widgets", None)
    cells = notebook["cells"]
    for index, cell in enumerate(cells):
        metadata = cell.setdefault("metadata", {})
        if metadata.get("jupyter", {}).get("source_hidden"):
            tags = metadata.setdefault("tags", [])
            if "hide-input" not in tags and "remove-input" not in tags:
                tags.append("hide-input")
        if cell["cell_type"] != "code":
            continue
        outputs = []
        for output in cell.get("outputs", []):
            if WIDGET_VIEW not in output.get("data", {}):
                outputs.append(output)
                continue
            if is_progress_bar(output):
                continue
            following = cells[index + 1] if index + 1 < len(cells) else None
            has_picture = (
                following is not None and following["cell_type"] == "markdown" and "![" in "".join(following["source"])
            )
            note = LIVE_NOTE if has_picture else LIVE_NOTE_NO_PICTURE
            outputs.append({"output_type": "display_data", "metadata": {}, "data": {"text/html": note}})
            if has_picture:
                following["source"] = unfold("".join(following["source"]))
        cell["outputs"] = outputs
    return notebook


def title(path: Path) -> str:
    """A notebook's title: its first Markdown heading."""
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise ValueError(f"{path.name} has no '# ' title in a Markdown cell")


def front_page(readme: str, notebook_names: list[str]) -> str:
    """The README, with the hidden tables of contents that give the book its navigation, in reading order."""
    toc = "\n".join(f"notebooks/{name}" for name in notebook_names)
    plan_pages = "\n".join(f"data/results/{Path(name).stem}" for name in plans())
    return (
        readme.replace("](README.md", "](index.md")
        + "\n\n```{toctree}\n:hidden:\n:caption: Notebooks, in reading order\n\n"
        + toc
        + "\n```\n\n```{toctree}\n:hidden:\n:caption: Reference\n\nGLOSSARY\nDESIGN\n```\n\n"
        + "```{toctree}\n:hidden:\n:caption: Pre-registered plans\n\n"
        + plan_pages
        + "\n```\n"
    )


def stage(src: Path) -> None:
    """Lay out every page's source under ``src`` (removed first), with the repository's relative paths."""
    if src.exists():
        shutil.rmtree(src)
    (src / "notebooks").mkdir(parents=True)
    names = [p.name for p in notebooks()]
    (src / "index.md").write_text(front_page((ROOT / "README.md").read_text(encoding="utf-8"), names), "utf-8")
    for name in PAGES:
        text = (ROOT / name).read_text(encoding="utf-8").replace("](README.md", "](index.md")
        # The glossary's HTML anchors become the headings' own ids (book/book_slugs.py): an empty <a> in a
        # heading breaks the theme's script that reads every heading link's href.
        text = re.sub(r'^(#+ )<a id="[^"]+"></a>', r"\1", text, flags=re.M)
        (src / name).write_text(text, encoding="utf-8")
    (src / "data" / "results").mkdir(parents=True)
    for name in plans():
        shutil.copyfile(ROOT / "data" / "results" / name, src / "data" / "results" / name)
    shutil.copytree(ROOT / "data" / "figures", src / "data" / "figures")
    for path in notebooks():
        staged = json.dumps(stage_notebook(path), ensure_ascii=False, indent=1)
        (src / "notebooks" / path.name).write_text(staged + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book", help="default: build/book")
    args = parser.parse_args(argv)
    try:
        from sphinx.cmd.build import build_main
    except ImportError:
        print(
            "error: Sphinx is not installed: pip install -r requirements-book.txt (make book does it)", file=sys.stderr
        )
        return 1
    start = time.perf_counter()
    src, html = args.out / "src", args.out / "html"
    stage(src)
    # -W: a warning (a broken link, a missing image, a page outside the navigation) fails the build;
    # -E: every page is read again (a stale environment would hide a page's new warning); -q: warnings only.
    status = build_main(["-b", "html", "-W", "--keep-going", "-E", "-q", "-c", str(CONF_DIR), str(src), str(html)])
    if status == 0:
        pages = sum(1 for page in html.rglob("*.html") if "_static" not in page.relative_to(html).parts)
        print(f"book: {pages} pages in {html}/ ({time.perf_counter() - start:.0f} s); open {html}/index.html")
    return status


if __name__ == "__main__":
    sys.exit(main())
