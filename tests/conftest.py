"""Shared fixtures and helpers of the test suite.

- One torch thread for the whole run (the tiny models gain nothing from more, and results then do not
  depend on the machine's thread count).
- ``tiny_models``: trained tiny models shared by every test that needs one (trained once per run).
- ``family``: the tiny family of two runs (helpers.family_dataset) trained and measured once per run, the
  reference that kill, rerun and fault-injection tests compare with bit for bit; ``hf_run``: a sealed run
  of a tiny Llama trained by our trainer.
- ``in_process``: the runner's pool as threads of this process (helpers.in_process_runner).
- ``cli``: the command line in-process through ``main(argv)``, with what a user would see (exit
  status, stdout, stderr); ``tests/test_cli.py`` keeps the real processes: a command run, a user error, and
  help and usage errors answered without importing torch.

Plain helpers (the repository root, the tiny settings, small checks) are in ``tests/helpers.py``.

Two settings of the test process alone, for speed (neither changes what a test sees):

- ``rfc3987_syntax`` is not imported. jsonschema (which nbformat imports) uses it, where installed, only to
  check the "iri" formats, which nbformat's schemas do not use, and it builds some 35 parsers at import
  (2.5 s here; python-jsonschema/jsonschema#1428). This works where conftest is imported before nbformat:
  ``make test-fast`` runs without nbval's plugin (``-p no:nbval``), which imports it at start-up.
- The garbage collector freezes what exists once the tests are collected (torch, transformers, matplotlib:
  the modules), and runs less often: each full collection walked that whole heap, 17 of them 6 s of a run.
  Reference counting frees what it always frees; only cycles wait longer.
"""

from __future__ import annotations

import contextlib
import gc
import io
import sys
from dataclasses import dataclass

import pytest
import torch
from helpers import TINY_TRAINING, family_dataset, in_process_runner

from attnres_helpers.__main__ import main
from attnres_helpers.data import load_splits
from attnres_helpers.model import preset
from attnres_helpers.train import train

sys.modules.setdefault("rfc3987_syntax", None)  # None in sys.modules: `import rfc3987_syntax` raises ImportError


def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)  # Python's default: 700, 10, 10


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def threads_restored():
    """A test that sets torch's threads (the CLI's --threads) leaves the next one one thread."""
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def val_tokens() -> torch.Tensor:
    return load_splits()[1]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict:
    """Trained tiny models (20 steps): rope with 3 layers (so "upper" averages two layers), alibi with 2;
    ``{"rope": model, "alibi": model, "dirs": {encoding: run folder}}``."""
    models, dirs = {}, {}
    for encoding, n_layer in (("rope", 3), ("alibi", 2)):
        dirs[encoding] = tmp_path_factory.mktemp(f"run-{encoding}")
        models[encoding], _ = train(
            preset("tiny", encoding=encoding, n_layer=n_layer),
            out_dir=dirs[encoding],
            seed=0,
            checkpoint_every=0,
            progress=False,
            **TINY_TRAINING,
        )
    return {**models, "dirs": dirs}


@pytest.fixture
def in_process():
    """The runner's pool as threads of this process, for the test (helpers.in_process_runner)."""
    with in_process_runner():
        yield


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    """The reference: the tiny family (helpers.family_dataset) trained and measured uninterrupted, in
    this process, one run at a time (threads share torch's global RNG, which seeds the weights); tests
    copy from it and never change it."""
    from attnres_helpers.experiments import runner

    ds = family_dataset(tmp_path_factory.mktemp("reference"))
    with in_process_runner():
        runner.run_datasets([ds], jobs=1, progress=False)
    return ds


@pytest.fixture(scope="session")
def hf_run(tmp_path_factory):
    """A Llama of our trainer (HFConfig), trained 2 steps: a sealed run folder named like the shipped ones."""
    pytest.importorskip("transformers")
    from attnres_helpers.hf import HFConfig

    out = tmp_path_factory.mktemp("hf") / "hf-llama-s0"
    train(
        HFConfig("llama", train_len=16, n_layer=1, n_head=2, d_model=16),
        steps=2,
        batch_tokens=32,
        warmup=1,
        out_dir=out,
        checkpoint_every=0,
        progress=False,
    )
    return out


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """``python -m attnres_helpers ARGS`` in-process: the exit status (a message passed to sys.exit is
    status 1 on stderr, as the interpreter does it), stdout and stderr."""
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exit_:
            if isinstance(exit_.code, str):
                err.write(exit_.code + "\n")
                code = 1
            else:
                code = exit_.code or 0
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli():
    """:func:`run_cli`, as a fixture."""
    return run_cli


@pytest.fixture(scope="session")
def registry_model():
    """A loader of the registry's real models (see :func:`_registry_model`)."""
    return _registry_model


def _registry_model(entry):
    """A real model of the registry (attnres_helpers.hf.models), verified and loaded from the cache: a skip
    naming the command that fetches it where it is absent, a failure under ATTNRES_REQUIRE_PRETRAINED=1."""
    import os

    from attnres_helpers.hf import fetch

    if not fetch.model_dir(entry).is_dir():
        if os.environ.get("ATTNRES_REQUIRE_PRETRAINED"):
            pytest.fail(f"the converted model is missing: {fetch.fetch_command(entry)}")
        pytest.skip(f"the converted model is absent ({fetch.fetch_command(entry)}, or make pretrained)")
    return fetch.load(entry)


@pytest.fixture(scope="module")
def catalogue():
    """The trained explorer's catalogue of the shipped store (tests/test_widgets*.py)."""
    from attnres_helpers import experiments
    from attnres_helpers.widgets import trained_catalogue

    return trained_catalogue(experiments.STORE)
