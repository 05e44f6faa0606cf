"""Execute notebooks in place, and rewrite a notebook only where its outputs changed in substance.

    python scripts/execute_notebooks.py [NOTEBOOK ...]     (default: notebooks/*.ipynb; `make execute`)

Each notebook runs top to bottom in a fresh kernel from its own folder, without recording cell timings,
its stream outputs merged as `jupyter nbconvert --execute` merges them. It is then compared with the file
on disk after leaving out what differs on every run by nature: the outputs of cells nbval does not compare
(tagged or commented ``nbval-ignore-output`` or ``nbval-skip``: timings, progress bars), how stream outputs
were split between flushes, the model ids of widget views and the widget state in the notebook's metadata.
Where nothing else differs the file is left untouched, so running the notebooks on a checkout leaves
``git status`` clean; where something does, the executed notebook replaces the file atomically. A failing
cell stops with its notebook named, and the file unchanged.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbconvert.preprocessors import CoalesceStreamsPreprocessor

ROOT = Path(__file__).resolve().parent.parent
VOLATILE_TAGS = ("nbval-ignore-output", "nbval-skip")  # and their comment forms, as nbval reads them
VOLATILE_COMMENTS = ("# NBVAL_IGNORE_OUTPUT", "# NBVAL_SKIP")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def volatile(cell: nbformat.NotebookNode) -> bool:
    """True for a cell whose outputs nbval does not compare (a tag or a comment on its first line)."""
    first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
    tags = cell.metadata.get("tags", ())
    return any(t in tags for t in VOLATILE_TAGS) or any(first.startswith(c) for c in VOLATILE_COMMENTS)


def substance(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook without what changes on every run: execution timings, the outputs of cells nbval does
    not compare, how stream outputs were split between flushes, widget view model ids and widget state."""
    nb, _ = CoalesceStreamsPreprocessor().preprocess(copy.deepcopy(nb), {})
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        if volatile(cell):
            cell.outputs = []
        for output in cell.outputs:
            view = output.get("data", {}).get(WIDGET_VIEW)
            if isinstance(view, dict):
                view.pop("model_id", None)
    return nb


def execute(path: Path, timeout: int, force: bool = False) -> bool:
    """Run ``path``; write it back only if its substance changed (or, with ``force``, whatever changed: after
    editing a cell whose outputs nbval ignores). True where the file was rewritten."""
    old = nbformat.read(path, as_version=4)
    new = copy.deepcopy(old)
    client = NotebookClient(
        new, timeout=timeout, kernel_name="python3", record_timing=False, resources={"metadata": {"path": path.parent}}
    )
    try:
        client.execute()
    except CellExecutionError as err:
        raise SystemExit(f"{path}: a cell failed ({err.ename}: {err.evalue}); the file is unchanged") from None
    new, _ = CoalesceStreamsPreprocessor().preprocess(new, {})  # one stream output per flush run, as nbconvert
    if substance(new) == substance(old) and not (force and new != old):
        return False
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            nbformat.write(new, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds a cell may run (default 1800)")
    parser.add_argument(
        "--force", action="store_true", help="rewrite a notebook whose only changes are in outputs nbval ignores"
    )
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    for path in paths:
        print(
            f"{path.name}: {'updated' if execute(path.resolve(), args.timeout, args.force) else 'unchanged'}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
