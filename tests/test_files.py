"""Files (attnres_helpers.files): SHA256SUMS verification and the one-writer lock of a store.

A second writer is a real process where it must be (``python -c`` holding the lock until its stdin
closes, or until it is killed); every wait is on a pipe, none on a clock."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from helpers import dead_pid, read_only
from safetensors import SafetensorError
from safetensors.torch import save_file

from attnres_helpers import files

HOLD = (
    "import sys; from attnres_helpers import files\n"
    "with files.exclusive(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()"
)
WAIT_S = 120  # the bound on every wait for a holder (a loaded 2-core machine is slow)


def _holder(store: Path) -> subprocess.Popen:
    """A process holding ``store``'s lock (it has printed "held") until its stdin closes or it is killed."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline() == "held\n"
    return holder


def _end(holder: subprocess.Popen, kill: bool = False) -> None:
    if kill:
        holder.kill()
    holder.stdin.close()
    holder.wait(timeout=WAIT_S)
    holder.stdout.close()


def _refusal(store: Path, pid: int | None) -> str:
    lock = store.with_name(store.name + ".lock")
    said = f"pid {pid}, " if pid is not None else ""
    return f"{store} is being written by another process ({said}lock {lock}); wait for it, or stop that process"


# ---------------------------------------------------------------------------------------------- SHA256SUMS


def test_a_sha256sums_listing_a_file_twice_is_refused(tmp_path):
    """The later of two lines would win: the listing is refused, whatever the two digests say."""
    (tmp_path / "a.txt").write_text("a")
    digest = hashlib.sha256(b"a").hexdigest()
    sums = tmp_path / files.SUMS_FILE
    for other in ("0" * 64, digest):
        sums.write_text(f"{other}  a.txt\n{digest}  a.txt\n")
        with pytest.raises(ValueError) as err:
            files.verify_sha256sums(tmp_path, "make it")
        assert str(err.value) == f"{sums} lists a.txt twice; regenerate the folder with `make it`"
    sums.write_text(f"{digest}  a.txt\n")
    files.verify_sha256sums(tmp_path, "make it")


# ---------------------------------------------------------------------------------------------------- lock


def test_a_second_writer_is_refused_naming_the_lock_and_a_killed_writers_lock_is_free(tmp_path):
    store = tmp_path / "s.safetensors"
    holder = _holder(store)
    try:
        with pytest.raises(RuntimeError) as err:
            with files.exclusive(store):
                pytest.fail("entered a held lock")
        assert str(err.value) == _refusal(store, holder.pid)
    finally:
        _end(holder, kill=True)  # killed while holding it: the kernel drops the lock
    with files.exclusive(store):
        assert store.with_name("s.safetensors.lock").read_text() == str(os.getpid())  # for the message only
    holder = _holder(store)  # a lock file left after release is not held
    _end(holder)


@pytest.mark.parametrize(
    "text",
    ["0", "9" * 40, str(os.getpid()), "", "held by nobody"],
    ids=["zero", "huge", "our-pid", "empty", "words"],  # the same ids in every process (no PID in a test id)
)
def test_a_lock_file_is_never_read_for_liveness(tmp_path, text):
    """A free lock is taken whatever its file holds: no PID in it is trusted (0 is a process group, a huge
    one overflows os.kill, ours would look alive); a refusal shows a PID only where it is one."""
    store = tmp_path / "s.safetensors"
    lock = store.with_name("s.safetensors.lock")
    lock.write_text(text)
    with files.exclusive(store):
        lock.write_text(text)  # what a refusal shows
        with pytest.raises(RuntimeError) as err:
            with files.exclusive(store):
                pass
        assert str(err.value) == _refusal(store, os.getpid() if text == str(os.getpid()) else None)


def test_two_holders_in_one_process_conflict(tmp_path):
    """Nested, or from another thread: each takes the lock on a file of its own opening, so they conflict
    as two processes do; once released, the lock is taken again."""
    store = tmp_path / "s.safetensors"
    errors = []

    def second() -> None:
        try:
            with files.exclusive(store):
                errors.append(None)
        except RuntimeError as err:
            errors.append(str(err))

    with files.exclusive(store):
        with pytest.raises(RuntimeError, match="is being written by another process"):
            with files.exclusive(store):
                pass
        thread = threading.Thread(target=second)
        thread.start()
        thread.join(WAIT_S)
    assert errors == [_refusal(store, os.getpid())]
    with pytest.raises(KeyError):
        with files.exclusive(store):
            raise KeyError("an error inside releases it too")
    second()
    assert errors[1:] == [None]


def test_a_lock_that_cannot_be_taken_is_one_error_naming_the_lock(tmp_path):
    store = tmp_path / "s.safetensors"
    lock = store.with_name("s.safetensors.lock")
    lock.mkdir()
    with pytest.raises(OSError) as err:
        with files.exclusive(store):
            pytest.fail("entered a folder's lock")
    assert str(err.value) == f"cannot write {store}: its lock {lock} cannot be taken (Is a directory)"
    lock.rmdir()
    target = tmp_path / "elsewhere.txt"
    target.write_text("kept")
    lock.symlink_to(target)
    with pytest.raises(OSError) as err:
        with files.exclusive(store):
            pytest.fail("entered a link's lock")
    assert str(err.value) == f"cannot write {store}: its lock {lock} cannot be taken (it is a link)"
    assert target.read_text() == "kept"  # never written through


def test_a_dead_processes_temporaries_are_removed_on_entry_and_a_live_ones_kept(tmp_path):
    """atomic_write's ``.<name>.tmp-<pid>``: not every write of a store holds its lock, so only a temporary
    whose process is not alive is debris; names that no live process can have (PID 0, a PID past any
    process's) are debris too, without an error."""
    store = tmp_path / "s.safetensors"
    dead = dead_pid()
    names = {
        f".s.safetensors.tmp-{dead}": False,
        ".s.safetensors.tmp-0": False,
        f".s.safetensors.tmp-{'9' * 40}": False,
        f".s.safetensors.tmp-{os.getpid()}": True,
        ".s.safetensors.tmp-\u00b2": True,  # not atomic_write's: not a PID in ASCII digits
        f".other.tmp-{dead}": True,  # beside another file
    }
    for name in names:
        (tmp_path / name).write_text("half a file")
    with files.exclusive(store):
        assert {name: (tmp_path / name).exists() for name in names} == names


def test_safetensors_files_are_written_with_no_temporary_of_their_own(tmp_path):
    """safetensors' save_file writes ``.tmpXXXXXX`` beside its target and renames it (a kill leaves it, under a
    name nothing cleans); write_safetensors writes the same bytes into the file itself: it works in a folder
    where no file can be created, where save_file cannot."""
    tensors = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.float16)}
    folder = tmp_path / "folder"
    folder.mkdir()
    target = folder / "model.safetensors"
    target.write_bytes(b"")
    with read_only(folder):  # no file can be created in it; the existing one can still be written
        files.write_safetensors(tensors, target, {"k": "v"})
        with pytest.raises(SafetensorError):
            save_file(tensors, folder / "model.safetensors")
    save_file(tensors, tmp_path / "reference.safetensors", metadata={"k": "v"})
    assert target.read_bytes() == (tmp_path / "reference.safetensors").read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]


def test_a_file_over_the_hashing_bound_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"x" * 11)
    monkeypatch.setattr("builtins.open", lambda *a, **k: pytest.fail("the file was opened"))
    with pytest.raises(ValueError) as err:
        files.sha256_file(path, max_bytes=10)
    assert str(err.value) == f"{path} is 11 bytes, over the 10-byte bound: refused"


def test_a_folders_fingerprint_hashes_every_file_a_load_reads_and_agrees_with_its_sums(tmp_path):
    """Issue 44 #1: the key of a measurement's work file. Any file's change changes it, links are followed
    (a hub snapshot is links), hidden files and SHA256SUMS are not read, and a folder sealed by
    :func:`files.sha256sums` gives its :func:`files.sums_fingerprint`."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "blob").write_bytes(b"weights")
    (tmp_path / "m" / "model.safetensors").symlink_to(tmp_path / "blob")
    first = files.folder_fingerprint(tmp_path / "m")
    (tmp_path / "m" / ".hidden").write_text("x")
    (tmp_path / "m" / "SHA256SUMS").write_text("anything")
    assert files.folder_fingerprint(tmp_path / "m") == first
    (tmp_path / "blob").write_bytes(b"weightz")
    assert files.folder_fingerprint(tmp_path / "m") != first
    sealed = tmp_path / "sealed"
    sealed.mkdir()
    for name, text in (("config.json", "{}"), ("model.safetensors", "w"), ("tokenizer.json", "t")):
        (sealed / name).write_text(text)
    (sealed / "SHA256SUMS").write_text(files.sha256sums(sealed))
    assert files.folder_fingerprint(sealed) == files.sums_fingerprint(sealed)


def test_a_store_that_is_a_link_is_refused_before_its_lock_is_taken(tmp_path):
    """Issue 44 (minor): every store is written under exclusive() and replaced by atomic_write, which
    replaced a `--store` that was a symlink by a regular file (its target left as it was). Refused, with
    the file to give instead; the link, its target and the lock are untouched."""
    target, store = tmp_path / "real.safetensors", tmp_path / "link.safetensors"
    target.write_bytes(b"the store")
    store.symlink_to(target)
    with pytest.raises(ValueError) as err:
        with files.exclusive(store):
            pytest.fail("entered the lock of a link")
    assert str(err.value) == (
        f"{store} is a link to {target}: a store is replaced, not written through a link; give {target} itself"
    )
    assert store.is_symlink() and target.read_bytes() == b"the store"
    assert not store.with_name(store.name + ".lock").exists()
