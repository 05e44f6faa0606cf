"""Atomic writes: every file the project writes goes through a temporary name and ``os.replace``."""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
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


MAX_HASHED_BYTES = 2 << 30  # no file this project verifies is near 2 GiB; anything larger is refused unread
SUMS_FILE = "SHA256SUMS"


def sha256_file(path: Path, max_bytes: int = MAX_HASHED_BYTES) -> str:
    """The sha256 of a regular file, read in 1 MiB pieces (never whole), refusing links, devices and
    files over ``max_bytes`` with an error that names them."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"{path} is not a regular file (a link, a device or a folder): refused")
    if path.stat().st_size > max_bytes:
        raise ValueError(f"{path} is {path.stat().st_size} bytes, over the {max_bytes}-byte bound: refused")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            digest.update(piece)
            if f.tell() > max_bytes:  # the file grew while it was read
                raise ValueError(f"{path} grew past the {max_bytes}-byte bound while it was hashed: refused")
    return digest.hexdigest()


def sha256sums(root: Path) -> str:
    """``sha256  relative/path`` lines for every file under ``root`` (any depth) but its own SHA256SUMS, sorted."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p != root / SUMS_FILE and (p.is_file() or p.is_symlink()))
    return "".join(f"{sha256_file(p)}  {p.relative_to(root).as_posix()}\n" for p in files)


def verify_sha256sums(root: Path, fix: str) -> None:
    """Check every file under ``root`` against ``root/SHA256SUMS``: a file that is missing, unlisted
    (at any depth, whatever its name) or changed, a link, or a malformed SHA256SUMS raises an error
    naming it; ``fix`` is the command that regenerates the folder, quoted in the messages."""
    root = Path(root)
    sums_path = root / SUMS_FILE
    if not sums_path.is_file():
        raise FileNotFoundError(f"{sums_path} is missing; regenerate the folder with `{fix}`")
    try:
        text = sums_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{sums_path} is not a text file; regenerate the folder with `{fix}`") from None
    expected = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name or name.startswith("/") or ".." in Path(name).parts:
            raise ValueError(f"{sums_path} has a malformed line: {line[:80]!r}")
        expected[name] = digest
    present = {p.relative_to(root).as_posix() for p in root.rglob("*")
               if p != sums_path and (p.is_file() or p.is_symlink())}
    for name in sorted(expected.keys() - present):
        raise ValueError(f"{root / name} is listed in {SUMS_FILE} but missing; regenerate with `{fix}`")
    for name in sorted(present - expected.keys()):
        raise ValueError(f"{root / name} is not listed in {SUMS_FILE}: refused (remove it, or regenerate with `{fix}`)")
    for name in sorted(expected):
        if sha256_file(root / name) != expected[name]:
            raise ValueError(f"{root / name} does not match {SUMS_FILE} (corrupt or tampered); regenerate with `{fix}`")


@contextmanager
def exclusive(path: Path):
    """Hold ``<path>.lock`` (holding this process's PID) while writing ``path``: a second writer gets an
    error naming the process that holds it; a lock left by a dead process is recognised and taken over.
    On entry, temporary files that dead processes left beside ``path`` (atomic_write's) are removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _lock_holder(lock)
            if holder is not None and _alive(holder):
                raise RuntimeError(f"{path} is being written by process {holder} (lock {lock}); wait for it, "
                                   "or stop that process") from None
            lock.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        break
    else:
        raise RuntimeError(f"could not take the lock {lock}")
    for debris in path.parent.glob(f".{path.name}.tmp-*"):
        pid = debris.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            debris.unlink(missing_ok=True)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _lock_holder(lock: Path) -> int | None:
    try:
        text = lock.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
