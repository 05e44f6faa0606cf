"""Where the repository's files are: the shipped data/, the git-ignored runs/ and model cache.

The package can be installed without the repository (a wheel carries no data/), so the root is, in
order: ``$ATTNRES_ROOT``; the folder above the package when it holds ``data/corpus``; the first folder
at or above the working directory that holds ``data/corpus``. The model cache (weights never go into
git) is ``$ATTNRES_CACHE``, else ``<root>/.cache``.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER = Path("data") / "corpus"


def _find_root() -> Path:
    if os.environ.get("ATTNRES_ROOT"):
        return Path(os.environ["ATTNRES_ROOT"]).expanduser().resolve()
    above_package = Path(__file__).resolve().parent.parent
    for candidate in (above_package, *[Path.cwd(), *Path.cwd().parents]):
        if (candidate / MARKER).is_dir():
            return candidate
    return above_package  # files are then reported missing, each with the command that makes it


ROOT = _find_root()
DATA = ROOT / "data"
RUNS = ROOT / "runs"
CACHE = Path(os.environ["ATTNRES_CACHE"]).expanduser() if os.environ.get("ATTNRES_CACHE") else ROOT / ".cache"


def data_path(*parts: str) -> Path:
    """A path inside the shipped data/ folder."""
    return DATA.joinpath(*parts)
