"""Atomic writes: every file the project writes goes through a temporary name and ``os.replace``."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import stat
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
        raise _named_error(err, path) from err
    finally:
        tmp.unlink(missing_ok=True)


def _named_error(err: OSError, path: Path) -> OSError:
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


def differing_settings(stored: dict, wanted: dict) -> list[str]:
    """The one "written under other settings" check: the keys, sorted, whose values differ between the
    settings a file was written under (``stored``, read back from its JSON header) and those of this run
    (``wanted``), both taken as JSON gives them back (a tuple is a list, a key a string); a key present in
    one only differs too. Keyed by the settings themselves: a setting added later is compared unasked."""
    stored, wanted = json.loads(json.dumps(stored)), json.loads(json.dumps(wanted))
    return sorted(k for k in {*stored, *wanted} if k not in stored or k not in wanted or stored[k] != wanted[k])


def regular_file(path: Path, what: str) -> Path:
    """``path``, checked to be a regular file (a link to one is followed) before anything opens it: a named
    pipe would block the open forever, and a folder or a device is no store. Missing: FileNotFoundError
    "``<what> <path>`` is missing"; anything else: ValueError "``<what> <path>`` is a named pipe, not a
    regular file; give a regular file" (a folder, a socket, a device)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} is missing") from None
    if not stat.S_ISREG(mode):
        kind = (
            "a folder"
            if stat.S_ISDIR(mode)
            else "a named pipe"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device"
        )
        raise ValueError(f"{what} {path} is {kind}, not a regular file; give a regular file")
    return Path(path)


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


def folder_fingerprint(root: Path) -> str:
    """A short hash of what a load of the model folder ``root`` reads: every regular file directly in it
    (links followed, as a hub snapshot's files are links; hidden files, subfolders and SHA256SUMS aside),
    each hashed in full, streamed, once. The lines hashed are :func:`sha256sums`' lines, so a verified
    converted folder gives its :func:`sums_fingerprint`, and two folders of one name but other files
    (weights, config or tokenizer) never give one value."""
    root = Path(root)
    lines = []
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or path.name == SUMS_FILE or not path.is_file():
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for piece in iter(lambda: f.read(1 << 20), b""):
                digest.update(piece)
        lines.append(f"{digest.hexdigest()}  {path.name}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()[:16]


def verify_sha256sums(root: Path, fix: str) -> None:
    """Check every file under ``root`` against ``root/SHA256SUMS``: a file that is missing, unlisted
    (at any depth, whatever its name) or changed, a link, or a malformed SHA256SUMS (a line unreadable,
    or a file listed twice) raises an error naming it; ``fix`` is the command that regenerates the
    folder, quoted in the messages."""
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
        if name in expected:  # the later line would win
            raise ValueError(f"{sums_path} lists {name[:80]} twice; regenerate the folder with `{fix}`")
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
    """Hold the kernel's lock on ``<path>.lock`` (``flock``) while writing ``path``: a second writer is an
    error naming the lock. The kernel drops the lock when its holder dies, so nothing stale is taken over,
    and what the file holds (the holder's PID, for the message) is never read for liveness. ``flock`` locks
    an open file, not a process: each call opens the file afresh, so two holders in one process (nested, or
    two threads) conflict as two processes do; only a child forked while it is held shares it (the runner's
    workers are spawned). The file stays after release (unlinking it would race its next taker).

    On entry, atomic_write's temporaries beside ``path`` (``.<name>.tmp-<pid>``) whose process is not alive
    are removed (:func:`remove_dead_temporaries`), and a live one's are kept: not every write of a path
    holds its lock (``save_profiles`` is also called on its own), so a temporary beside a held lock may
    still be another process's. Among writers that hold the lock, this is race-free: none of them is
    writing while the lock is taken.

    A ``path`` that is a symlink is refused before the lock is taken: the file written under the lock is
    replaced (atomic_write), which would replace the link rather than write its target."""
    path = Path(path)
    if path.is_symlink():  # atomic_write would replace the link by a file, its target left as it was
        target = path.resolve()
        raise ValueError(
            f"{path} is a link to {target}: a store is replaced, not written through a link; give {target} itself"
        )
    lock = path.with_name(path.name + ".lock")
    fd = _take(lock, path)
    try:
        remove_dead_temporaries(path.parent, f".{glob.escape(path.name)}.tmp-*")
        yield
    finally:
        os.close(fd)


def remove_dead_temporaries(folder: Path, pattern: str = ".*.tmp-*") -> None:
    """Remove the temporaries in ``folder`` matching ``pattern`` (``.<name>.tmp-<pid>``: atomic_write's
    files, a conversion's folders) whose process is not alive; a live process's are kept, a name whose PID
    is past any process counts as dead, and one that cannot be removed (a read-only folder) is left."""
    for tmp in Path(folder).glob(pattern):
        pid = tmp.name.rsplit("-", 1)[-1]
        if not re.fullmatch("[0-9]+", pid) or _alive(int(pid)):
            continue
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                tmp.unlink()


PID = "[1-9][0-9]{0,9}"  # a PID as this process writes it into a lock


def _take(lock: Path, path: Path) -> int:
    """An open descriptor of ``lock``, locked, with this process's PID written in; a held lock is a
    RuntimeError, and any OSError (a folder, a link, a folder that cannot be written) one naming ``lock``."""
    fd = None
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            said = os.pread(fd, 16, 0).decode("ascii", "replace")
            pid = f"pid {said}, " if re.fullmatch(PID, said) else ""
            raise RuntimeError(
                f"{path} is being written by another process ({pid}lock {lock}); wait for it, or stop that process"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        return fd
    except BaseException as err:
        if fd is not None:
            os.close(fd)
        if not isinstance(err, OSError):
            raise
        reason = "it is a link" if err.errno == errno.ELOOP else err.strerror or str(err)
        named = type(err)(f"cannot write {path}: its lock {lock} cannot be taken ({reason})")
        named.errno = err.errno
        raise named from None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is alive: never 0 (to os.kill, this process's group) nor past any pid_t."""
    if not 0 < pid < 1 << 31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
