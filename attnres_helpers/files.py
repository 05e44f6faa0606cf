"""Atomic writes: every file the project writes goes through a temporary name and ``os.replace``."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call write(tmp_path), fsync, then os.replace onto `path`; on any failure no partial file remains.

    The temporary ``.<name>.tmp-<pid>`` is created here first, so a folder that cannot be written fails at
    once; every OSError names ``path`` (the target), never the temporary file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600))
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # what a plain open() would give, not a temporary file's 0600
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise _naming(err, path) from err
    finally:
        tmp.unlink(missing_ok=True)


def _naming(err: OSError, path: Path) -> OSError:
    """``err`` as the same kind of OSError, with a message that names ``path``."""
    named = type(err)(f"cannot write {path}: {err.strerror or err}")
    named.errno = err.errno
    return named


def write_safetensors(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    """``safetensors.torch.save_file(tensors, path, metadata)``, the same bytes, serialised in memory and
    written straight to ``path``: safetensors' own save_file goes through a temporary of its own
    (``.tmpXXXXXX`` beside ``path``), which a kill would leave behind under a name nothing cleans."""
    from safetensors.torch import save

    Path(path).write_bytes(save(tensors, metadata=metadata))


def save_safetensors(path: Path, tensors: dict, metadata: dict | None = None) -> None:
    """:func:`write_safetensors`, atomically (:func:`atomic_write`)."""
    atomic_write(path, lambda tmp: write_safetensors(tensors, tmp, metadata))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    """``path.write_text(text)``, atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text))


MAX_HASHED_BYTES = 2 << 30  # no file this project verifies is near 2 GiB; anything larger is refused unread
SUMS_FILE = "SHA256SUMS"
MAX_SUMS_BYTES = 1 << 24  # a SHA256SUMS lists a few files: 16 MiB is far past any real one


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


def sums_fingerprint(root: Path) -> str | None:
    """A short hash of ``root/SHA256SUMS`` (which weights a measurement came from, once :func:`verify_sha256sums`
    has checked the folder against it); None where the folder has none."""
    sums = Path(root) / SUMS_FILE
    return hashlib.sha256(sums.read_bytes()).hexdigest()[:16] if sums.is_file() else None


def verify_sha256sums(root: Path, fix: str) -> None:
    """Check every file under ``root`` against ``root/SHA256SUMS``: a file that is missing, unlisted
    (at any depth, whatever its name) or changed, a link, or a malformed SHA256SUMS raises an error
    naming it; ``fix`` is the command that regenerates the folder, quoted in the messages."""
    root = Path(root)
    sums_path = root / SUMS_FILE
    if not sums_path.is_file():
        raise FileNotFoundError(f"{sums_path} is missing; regenerate the folder with `{fix}`")
    if sums_path.is_symlink() or sums_path.stat().st_size > MAX_SUMS_BYTES:
        raise ValueError(
            f"{sums_path} is a link or over {MAX_SUMS_BYTES} bytes: refused; regenerate the folder with `{fix}`"
        )
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
    present = {
        p.relative_to(root).as_posix() for p in root.rglob("*") if p != sums_path and (p.is_file() or p.is_symlink())
    }
    for name in sorted(expected.keys() - present):
        raise ValueError(f"{root / name} is listed in {SUMS_FILE} but missing; regenerate with `{fix}`")
    for name in sorted(present - expected.keys()):
        raise ValueError(f"{root / name} is not listed in {SUMS_FILE}: refused (remove it, or regenerate with `{fix}`)")
    for name in sorted(expected):
        if sha256_file(root / name) != expected[name]:
            raise ValueError(f"{root / name} does not match {SUMS_FILE} (corrupt or tampered); regenerate with `{fix}`")


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock`` (holding this process's PID) while writing ``path``: a second writer gets an
    error naming the process that holds it; a lock left by a dead process is recognised and taken over.
    On entry, temporary files that dead processes left beside ``path`` (atomic_write's, and the lock's own)
    are removed."""
    path = Path(path)
    lock = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _take(lock, path)
    except OSError as err:
        raise _naming(err, path) from None
    for debris in [*path.parent.glob(f".{path.name}.tmp-*"), *path.parent.glob(f".{lock.name}.tmp-*")]:
        pid = debris.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            debris.unlink(missing_ok=True)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _take(lock: Path, path: Path) -> None:
    """Create ``lock`` holding this process's PID, whole (written to a temporary, then hard-linked into place,
    which fails if the lock exists), so a lock is never seen empty; a live holder is an error naming it, a
    dead one's lock is taken over."""
    tmp = lock.with_name(f".{lock.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # never write through a link a killed process left (it may be a lock)
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    try:
        for _ in range(2):
            try:
                _link_or_create(tmp, lock)
            except FileExistsError:
                holder = _lock_holder(lock)
                if holder is not None and _alive(holder):
                    raise RuntimeError(
                        f"{path} is being written by process {holder} (lock {lock}); wait for it, or stop that process"
                    ) from None
                lock.unlink(missing_ok=True)  # stale: its process is gone
                continue
            return
        raise RuntimeError(f"could not take the lock {lock}")
    finally:
        tmp.unlink(missing_ok=True)


def _link_or_create(tmp: Path, lock: Path) -> None:
    """Hard-link ``tmp`` to ``lock`` (FileExistsError if it exists); where the file system has no hard
    links, create ``lock`` exclusively and copy the PID in."""
    try:
        os.link(tmp, lock)
    except FileExistsError:
        raise
    except OSError:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            os.write(fd, tmp.read_bytes())
        finally:
            os.close(fd)


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
