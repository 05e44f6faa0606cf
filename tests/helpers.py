"""Plain helpers of the test suite (fixtures are in ``tests/conftest.py``): the repository root, the one set
of tiny training and measuring settings, the tiny family of two runs, the tiny Llama, the runner's pool in
this process, and the small checks and file edits that several test files share.

Imported as ``helpers`` (pytest puts ``tests/`` on ``sys.path``); a driver process loads it from its file
(:data:`DRIVER_PRELUDE`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]  # the repository
TESTS = ROOT / "tests"

# The tiny runs' training settings (a RunSpec's ``training``, or train()'s keywords beside seed, out_dir,
# checkpoint_every and progress), and their measuring settings.
TINY_TRAINING = {"steps": 20, "batch_tokens": 128, "lr": 3e-3, "warmup": 2}
TINY_MEASURE = {"multiples": (1, 2), "n_windows": 2}
# The command line of a tiny training run of 3 steps (add --out and any other option).
TINY_CLI_TRAIN = ("train", "--preset", "tiny", "--steps", "3", "--batch-tokens", "64", "--warmup", "1", "--quiet")
BOUND_S = 240  # every wait on another process is a bounded loop; this is its limit (a loaded 2-core machine is slow)

# A driver process's first lines (argv[1] is this folder): these helpers, loaded from their file as ``t``
# (the package is installed; nothing is put on sys.path).
DRIVER_PRELUDE = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('helpers', sys.argv[1] + '/helpers.py')\n"
    "t = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(t)\n"
)


# ------------------------------------------------------------------------------------------ tiny runs


def tiny_spec(
    root: Path,
    encoding: str,
    seed: int,
    training: dict | None = None,
    config: str | None = None,
    measure: dict | None = None,
):
    """A RunSpec of the "tiny" preset named ``<encoding>-s<seed>``, trained into ``root/runs/<name>``."""
    from attnres_helpers.experiments.specs import RunSpec
    from attnres_helpers.model import preset

    name = f"{encoding}-s{seed}"
    return RunSpec(
        name,
        preset("tiny", encoding=encoding),
        seed,
        Path(root) / "runs" / name,
        dict(training or TINY_TRAINING),
        extra={"config": config or f"tiny {encoding}"},
        measure=dict(measure or TINY_MEASURE),
    )


def family_dataset(root: Path, training: dict | None = None):
    """The tiny family: RoPE seed 0 and ALiBi seed 1, into ``root/store/family.safetensors``."""
    from attnres_helpers.experiments.specs import Dataset

    root = Path(root)
    return Dataset(
        root / "store" / "family.safetensors",
        [tiny_spec(root, "rope", 0, training), tiny_spec(root, "alibi", 1, training)],
        {"command": "tests/helpers.py family_dataset"},
    )


def tiny_llama(
    hidden_size: int = 16,
    layers: int = 1,
    heads: int = 2,
    kv_heads: int = 1,
    context: int = 32,
    implementation: str = "sdpa",
    vocab_size: int = 256,
    **config,
):
    """A random tiny ``transformers`` Llama from config (seeded; nothing is downloaded), in eval mode."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=context,
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        **config,
    )
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation).eval()


# ------------------------------------------------------------------------------------------ the pool, in process


class Terminated(BaseException):
    """A stopped in-process worker's run: not an Exception, so no handler of ours catches it."""


_worker = threading.local()


class InProcessPool(ThreadPoolExecutor):
    """runner._Pool on threads of this process: the same parent loop, store writes and stops, and a
    monkeypatch reaches the workers. runner._stop calls the pool's :meth:`terminate`, which here ends each
    run in flight at its next training step (as a terminated worker process leaves its last checkpoint).
    Its threads share torch's global RNG, which train() seeds for the weights: runs whose bytes are
    compared are run one at a time (jobs=1)."""

    def __init__(self, jobs: int):
        super().__init__(max(1, jobs))
        self.stopped = threading.Event()

    def terminate(self) -> None:
        self.stopped.set()

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(self._work, fn, *args, **kwargs)

    def _work(self, fn, *args, **kwargs):
        _worker.pool = self
        try:
            return fn(*args, **kwargs)
        finally:
            _worker.pool = None


def _stoppable(get_batch):
    def batch(*args, **kwargs):
        pool = getattr(_worker, "pool", None)
        if pool is not None and pool.stopped.is_set():
            raise Terminated
        return get_batch(*args, **kwargs)

    return batch


@contextmanager
def in_process_runner():
    """The runner's workers as threads of this process (:class:`InProcessPool`) for the block; no interpreter
    is started. The real process pool is tested in tests/test_runner_processes.py."""
    from attnres_helpers import train as train_mod
    from attnres_helpers.experiments import runner

    with pytest.MonkeyPatch.context() as m:
        m.setattr(runner, "_Pool", InProcessPool)
        m.setattr(train_mod, "get_batch", _stoppable(train_mod.get_batch))
        yield


# ------------------------------------------------------------------------------------------ checks


def store_tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path, framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def assert_same_tensors(a: Path, b: Path) -> None:
    """Two store files hold the same tensor names, dtypes and values."""
    ta, tb = store_tensors(a), store_tensors(b)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and torch.equal(ta[name], tb[name]), name


def assert_same_models(a, b) -> None:
    """The runs of two datasets have byte-identical model.safetensors, run by run."""
    for sa, sb in zip(a.specs, b.specs):
        name = "model.safetensors"
        assert (sa.out_dir / name).read_bytes() == (sb.out_dir / name).read_bytes(), sa.name


def debris(folder: Path) -> list[str]:
    """Temporaries of atomic writes left under ``folder``."""
    return sorted(p.name for p in Path(folder).rglob(".*.tmp-*"))


def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=BOUND_S)
    return child.pid


def one_line(exit_info) -> str:
    """The message of a CLI error (``sys.exit(message)``), checked to be one line."""
    message = str(exit_info.value.code)
    assert len(message.splitlines()) == 1, message
    return message


# ------------------------------------------------------------------------------------------ file edits


@contextmanager
def read_only(path: Path):
    """``path`` cannot be written while inside, even by root (for whom chmod changes nothing): chattr +i
    where we are root, else chmod. Skips where neither is possible."""
    path = Path(path)
    if os.geteuid() == 0:
        if (
            shutil.which("chattr") is None
            or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0
        ):
            pytest.skip("root, and chattr +i is refused here: no way to make a read-only folder")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        if path.is_file():
            pytest.skip("a read-only file can still be replaced by its folder's owner")
        mode = path.stat().st_mode
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(mode)


def copy_run(run_dir: Path, tmp_path: Path, name: str | None = None) -> Path:
    return Path(shutil.copytree(run_dir, Path(tmp_path) / (name or Path(run_dir).name)))


def reseal(run_dir: Path) -> None:
    """Rewrite a run's SHA256SUMS for its (edited) files: a folder whose hashes match but whose content is
    inconsistent, to reach the checks behind the hash check."""
    from attnres_helpers.files import sha256_file

    (Path(run_dir) / "SHA256SUMS").write_text(
        "".join(f"{sha256_file(Path(run_dir) / n)}  {n}\n" for n in ("config.json", "model.safetensors"))
    )


def rewrite_json(path: Path, edit) -> None:
    obj = json.loads(Path(path).read_text())
    edit(obj)
    Path(path).write_text(json.dumps(obj))


# ------------------------------------------------------------------------------------------ fault injection


class Killed(BaseException):
    """Stands for a kill: not an Exception, so no handler of ours catches it."""


class KillAt:
    """Every file operation of files.py and train.py (os.open, os.write, os.close, os.link, os.chmod,
    os.fsync, os.replace, os.fdopen) and every Path.unlink, counted; the k-th raises Killed before it
    happens (k None: count only)."""

    OPS = ("open", "write", "close", "link", "chmod", "fsync", "replace", "fdopen")

    def __init__(self, monkeypatch, k: int | None):
        from attnres_helpers import files
        from attnres_helpers import train as train_mod

        self.k, self.count, self.fired = k, 0, False
        proxy = type("KillingOS", (), {"__getattr__": lambda _, name: getattr(os, name)})()
        for op in self.OPS:
            setattr(proxy, op, self._wrap(getattr(os, op)))
        for module in (files, train_mod):
            monkeypatch.setattr(module, "os", proxy)
        monkeypatch.setattr(Path, "unlink", self._wrap(Path.unlink))

    def _wrap(self, real):
        def op(*args, **kwargs):
            if not self.fired:
                if self.count == self.k:
                    self.fired = True
                    raise Killed
                self.count += 1
            return real(*args, **kwargs)

        return op


# ------------------------------------------------------------------------------------------ widgets


def part(root, css_class: str):
    """The widget under ``root`` with this CSS class (the explorers' contract classes); fails if there is none."""
    from attnres_helpers.widgets import find_by_class

    found = find_by_class(root, css_class)
    assert found is not None, f"no widget with class {css_class}"
    return found


def shown(x: float) -> float:
    """x as an explorer's readout shows it (3 significant figures)."""
    from attnres_helpers.widgets import format_sig

    return float(format_sig(x))


async def past_the_redraw_timer() -> None:
    """Wait in the running loop until a redraw timer started before the call has fired. Twice the delay is
    enough on any machine, however late the loop wakes: asyncio runs the callbacks that are due in the order
    of their deadlines, and the timer's comes before this sleep's."""
    from attnres_helpers.widgets import REDRAW_DELAY_S

    await asyncio.sleep(2 * REDRAW_DELAY_S)


# ------------------------------------------------------------------ training-free configurations, by definition


def definition_distance(name: str, i: torch.Tensor, j: torch.Tensor, L: int) -> torch.Tensor:
    """d(i, j) as each training-free configuration defines it (float64), for a model of context L: written
    from each method's definition, not from the package's per-token positions."""
    n = (i - j).double()
    if name.startswith("self-extend"):
        W, G = {"self-extend-8-8": (L // 8, 8), "self-extend-16-16": (L // 16, 16)}[name]
        grouped = (i // G + W - W / G) - j // G  # LongLM's self_extend_patch/Llama.py: grouped query, key positions
        return torch.where(n < W, n, grouped.double())
    if name == "rerope-4":
        return n.clamp(max=L // 4)
    if name == "leaky-rerope-4-16":
        w = L // 4
        return torch.where(n < w, n, w + (n - w) / 16)
    if name == "lm-infinite":
        return n.clamp(max=L)
    return n


_reference_state = {}


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Full-matrix attention from unrotated q and k and the per-pair distance of the definition."""
    name, rotary, mask, layers, L = (_reference_state[k] for k in ("name", "rotary", "mask", "layers", "L"))
    B, H, n, d = query.shape
    groups = H // key.shape[1]
    k, v = key.repeat_interleave(groups, 1).double(), value.repeat_interleave(groups, 1).double()
    rotary(query, torch.arange(n)[None])  # a dynamic RoPE updates its frequencies for this length
    theta, factor = rotary.inv_freq.double(), float(rotary.attention_scaling)
    qc = torch.complex(query.double()[..., : d // 2], query.double()[..., d // 2 :])
    kc = torch.complex(k[..., : d // 2], k[..., d // 2 :])
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    phase = torch.polar(
        torch.ones(n, n, d // 2, dtype=torch.float64), definition_distance(name, i, j, L)[..., None] * theta
    )
    scores = factor**2 * scaling * (qc[..., :, None, :] * kc.conj()[..., None, :, :] * phase).real.sum(-1)
    scores = scores.masked_fill(~(mask.allowed(n) & (j <= i)), float("-inf"))
    layers.append(scores)
    return (scores.softmax(-1) @ v).to(query.dtype).transpose(1, 2).contiguous(), None


def reference_run(model, ids, configuration, L: int):
    """Logits and every layer's (B, H, T, T) scores of ``model`` under ``configuration`` by the full-matrix
    reference (:func:`definition_distance`; float64)."""
    import transformers

    from attnres_helpers.hf import configured_attention as ca
    from attnres_helpers.hf.configurations import applied

    transformers.AttentionInterface.register("attnres_reference", _reference_attention)
    layers = []
    with applied(model, configuration, L):
        _reference_state.update(
            name=configuration.name, rotary=ca.current_rotary(), mask=configuration.mask_for(L), layers=layers, L=L
        )
        model.set_attn_implementation("attnres_reference")
        logits = model(input_ids=ids, use_cache=False).logits
    return logits, layers


def tiny_llama_folder(folder: Path, context: int) -> Path:
    """A random one-layer Llama of context ``context`` saved as a `transformers` folder at ``folder``, with
    SmolLM2's tokenizer files where the model cache holds them (vocabulary 49152, so its ids fit)."""
    from attnres_helpers.hf import fetch
    from attnres_helpers.hf.models import SMOLLM2

    tiny_llama(hidden_size=16, layers=1, heads=2, kv_heads=1, context=context, vocab_size=49152).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (fetch.model_dir(SMOLLM2) / name).exists():
            shutil.copy(fetch.model_dir(SMOLLM2) / name, folder / name)
    return folder
