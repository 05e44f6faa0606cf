"""The reader's copies of the notebooks (``make lab``): JupyterLab opens ``reading/``, git-ignored, so an
afternoon of Run All, autosaves and notes never changes a tracked file, and ``git status`` stays clean.

Each copy is made from ``notebooks/<name>`` and remembered in ``reading/.made-from.json`` (the sha256 of the
committed notebook it was copied from, and of the copy as made). On every start:
- a notebook without a copy gets one;
- a copy the reader has not changed is replaced when the committed notebook has changed (a ``git pull``);
- a copy the reader has changed is kept, and one line says so and how to get the new one
  (``python scripts/reading_copies.py --reset NAME``, which replaces it);
- a copy whose notebook no longer exists is left alone (it is the reader's).
Writes are atomic: a killed start leaves the old copy or the new one, never half of one.

Usage: python scripts/reading_copies.py [--reset NAME ...] [--root DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from attnres_helpers.files import atomic_write, sha256_file, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
RECORD = ".made-from.json"


def refresh(root: Path, reset: tuple[str, ...] = ()) -> list[str]:
    """Bring ``root/reading`` up to date with ``root/notebooks`` (the rules above); returns one line per
    action, for the terminal. ``reset`` names copies to replace even if the reader changed them."""
    source_dir, reading = root / "notebooks", root / "reading"
    notebooks = {p.name: p for p in sorted(source_dir.glob("*.ipynb"))}
    unknown = sorted(set(reset) - notebooks.keys())
    if unknown:
        raise SystemExit(f"error: no notebook named {', '.join(unknown)} in {source_dir}")
    reading.mkdir(exist_ok=True)
    for debris in reading.glob(".*.tmp-*"):
        debris.unlink()
    record_path = reading / RECORD
    try:
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
    except ValueError:
        record = {}  # an unreadable record: every copy counts as the reader's, none is replaced
    lines = []
    for name, source in notebooks.items():
        copy, source_hash = reading / name, sha256_file(source)
        made = record.get(name, {})
        if copy.exists() and name not in reset:
            if made.get("source") == source_hash:
                continue  # up to date, changed by the reader or not
            if made.get("copy") != sha256_file(copy):
                lines.append(
                    f"kept your copy of {name} (notebooks/{name} has changed since it was made); to replace it: "
                    f"python scripts/reading_copies.py --reset {name}"
                )
                continue
        data = source.read_bytes()
        atomic_write(copy, lambda tmp, data=data: tmp.write_bytes(data))
        record[name] = {"source": source_hash, "copy": hashlib.sha256(data).hexdigest()}
        lines.append(f"{'replaced' if name in reset else 'copied'} notebooks/{name} -> reading/{name}")
    write_text_atomic(record_path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reset", nargs="+", default=(), metavar="NAME", help="replace these copies")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    for line in refresh(args.root, tuple(args.reset)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
