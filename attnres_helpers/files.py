"""Atomic writes: every file the project writes goes through a temporary name and ``os.replace``."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """Call write(tmp_path), fsync, then os.replace onto `path`; on any failure no partial file remains."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # what a plain open() would give, not a temporary file's 0600
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    """``path.write_text(text)``, atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text))
