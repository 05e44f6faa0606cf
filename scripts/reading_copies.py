"""The reader's copies of the notebooks (``make lab``): JupyterLab opens ``reading/``, git-ignored, so an
afternoon of Run All, autosaves and notes never changes a tracked file, and ``git status`` stays clean.

Each copy is made from ``notebooks/<name>`` and remembered in ``reading/.made-from.json`` (the sha256 of the
committed notebook it was copied from, and of the copy as made). On every start:
- a notebook without a copy gets one;
- a copy the reader has not changed is replaced when the committed notebook has changed (a ``git pull``);
- a copy the reader has changed is kept, and one line says so and how to get the new one
  (``python scripts/reading_copies.py --reset NAME``, which replaces it);
- a copy whose notebook no longer exists is left alone (it is the reader's), and so is a copy that is a link
  or not a file (one line says so);
- a killed start's temporaries are removed, another start's that is still running kept.
Inside the lab every link leads to the copies, never to a tracked notebook: each copy's links to the glossary
(``../GLOSSARY.md#...``) lead to ``reading/GLOSSARY.md``, and ``reading/README.md`` and ``reading/GLOSSARY.md``
are the repository's README and glossary with their links to ``notebooks/`` made links to the copies beside
them (every other relative link, to ``data/`` or ``DESIGN.md``, made one folder up). Those two are the lab's
guides, made again whenever the README or the glossary changes; a first line in each says so.
Writes are atomic: a killed start leaves the old copy or the new one, never half of one. A user error (a
mistyped ``--root``, ``reading`` not a folder) or a failed write (a read-only folder, a full disk) is one
line on stderr and status 1.

Usage: python scripts/reading_copies.py [--reset NAME ...] [--root DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

from attnres_helpers.files import atomic_write, remove_dead_temporaries, sha256_file, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
RECORD = ".made-from.json"


def refresh(root: Path, reset: tuple[str, ...] = ()) -> list[str]:
    """Bring ``root/reading`` up to date with ``root/notebooks`` (the rules above); returns one line per
    action, for the terminal. ``reset`` names copies to replace even if the reader changed them."""
    source_dir, reading = root / "notebooks", root / "reading"
    if not source_dir.is_dir():
        raise UserError(f"--root {root} holds no notebooks/ folder; give the repository's folder")
    notebooks = {p.name: p for p in sorted(source_dir.glob("*.ipynb"))}
    unknown = sorted(set(reset) - notebooks.keys())
    if unknown:
        raise SystemExit(f"error: no notebook named {', '.join(unknown)} in {source_dir}")
    if reading.is_symlink() or (reading.exists() and not reading.is_dir()):
        raise UserError(f"{reading} is not a folder; move it away, and the copies are made there")
    try:
        reading.mkdir(exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot make {reading}: {err.strerror or err}") from None
    remove_dead_temporaries(reading)  # a killed start's; a live one's (another start) are its own
    record_path = reading / RECORD
    try:
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    except (ValueError, OSError):
        record = {}  # an unreadable record: every copy counts as the reader's, none is replaced
    if not isinstance(record, dict):
        record = {}  # the same for one of another shape
    lines = []
    for name, source in notebooks.items():
        copy, source_hash = reading / name, sha256_file(source)
        made = record.get(name) if isinstance(record.get(name), dict) else {}
        if (copy.is_symlink() or (copy.exists() and not copy.is_file())) and name not in reset:
            lines.append(
                f"kept reading/{name}: it is a link or not a file, not a copy made here; to replace it: "
                f"python scripts/reading_copies.py --reset {name}"
            )
            continue
        if copy.exists() and name not in reset:
            if made.get("source") == source_hash:
                continue  # up to date, changed by the reader or not
            if made.get("copy") != sha256_file(copy):
                lines.append(
                    f"kept your copy of {name} (notebooks/{name} has changed since it was made); to replace it: "
                    f"python scripts/reading_copies.py --reset {name}"
                )
                continue
        data = source.read_bytes().replace(b"](../GLOSSARY.md", b"](GLOSSARY.md")  # the guide beside the copies
        atomic_write(copy, lambda tmp, data=data: tmp.write_bytes(data))
        record[name] = {"source": source_hash, "copy": hashlib.sha256(data).hexdigest()}
        lines.append(f"{'replaced' if name in reset else 'copied'} notebooks/{name} -> reading/{name}")
    write_text_atomic(record_path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    for name in GUIDES:
        if (root / name).is_file():
            guide = guide_text(name, (root / name).read_text(encoding="utf-8"))
            target = reading / name
            if target.is_symlink() or not target.is_file() or target.read_text(encoding="utf-8") != guide:
                if target.is_symlink():
                    target.unlink()
                write_text_atomic(target, guide)
                lines.append(f"made reading/{name} from {name}, its links leading to your copies")
    return lines


GUIDES = ("README.md", "GLOSSARY.md")  # made in reading/, their links to notebooks/ led to the copies
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def guide_text(name: str, text: str) -> str:
    """``name``'s text as ``reading/name``: a link to ``notebooks/X`` becomes ``X`` (the copy beside it), a link to
    the other guide stays as it is, any other relative link goes one folder up; a first line says what it is."""

    def relink(match: re.Match) -> str:
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:|#|/", target):  # http:, mailto:, an anchor, an absolute path
            return match.group(0)
        if target.startswith("notebooks/"):
            return f"]({target.removeprefix('notebooks/')})"
        if target.split("#")[0] in GUIDES:
            return match.group(0)
        return f"](../{target})"

    note = (
        f"<!-- Made by make lab (scripts/reading_copies.py) from ../{name}, with its links leading to your copies "
        "of the notebooks; edits here are replaced when it changes. -->\n"
    )
    return note + _LINK.sub(relink, text)


class UserError(Exception):
    """Something the reader can put right: one line on stderr, status 1."""


def main(argv: list[str] | None = None) -> int:
    """Run :func:`refresh`; a user error, or a write that fails (a read-only folder, a full disk: the
    writes are atomic, so nothing is half-written), is one line on stderr and status 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reset", nargs="+", default=(), metavar="NAME", help="replace these copies")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    try:
        lines = refresh(args.root, tuple(args.reset))
    except (UserError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
