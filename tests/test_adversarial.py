"""Issue 18, kept: every case of the adversarial pass, each with its clear error (the first line of its
message) or its correct result, so that no later change can undo them.

Everything is built here, in tmp_path: tiny models (the "tiny" preset, a few hundred steps at most), tiny
`transformers` models from config (nothing is downloaded), stores written and then made to lie. Nothing
under data/ or runs/ is written. One tiny family of two runs, trained once for the module (``family``),
is the reference that the kill, rerun and fault-injection tests are compared with bit for bit.

Sections: processes; debris; locks; stores that lie; verification; resource bounds; measure-hf and
measure_pretrained; fault injection (a kill at every file operation of train and of a store write).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from attnres_helpers import files, paths, stats
from attnres_helpers import train as train_mod
from attnres_helpers.__main__ import main as cli_main
from attnres_helpers.checkpoints import load_checkpoint, regenerate_command
from attnres_helpers.experiments import runner, specs
from attnres_helpers.experiments.specs import Dataset, RunSpec
from attnres_helpers.model import ModelConfig, preset
from attnres_helpers.store import Profile, as_stored, average_heads, load_profiles, records, save_profiles

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the network

TINY_TRAINING = {"steps": 250, "batch_tokens": 64, "lr": 1e-3, "warmup": 10}  # checkpoints at 100 and 200
TINY_MEASURE = {"multiples": (1, 2), "n_windows": 2}
BOUND_S = 240  # every wait below is a bounded loop; this is its limit (a loaded 2-core machine is slow)
# A driver process's first lines: this file loaded by its path (argv[1]) as the module ``t``.
LOAD_THIS_FILE = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('test_adversarial', sys.argv[1])\n"
    "t = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(t)\n"
)


def _spec(root: Path, encoding: str, seed: int, training: dict | None = None) -> RunSpec:
    name = f"{encoding}-s{seed}"
    return RunSpec(
        name,
        preset("tiny", encoding=encoding),
        seed,
        Path(root) / "runs" / name,
        dict(training or TINY_TRAINING),
        extra={"config": f"tiny {encoding}"},
        measure=dict(TINY_MEASURE),
    )


def _dataset(root: Path) -> Dataset:
    """The module's tiny family: RoPE seed 0 and ALiBi seed 1, into ``root/store/family.safetensors``."""
    root = Path(root)
    return Dataset(
        root / "store" / "family.safetensors",
        [_spec(root, "rope", 0), _spec(root, "alibi", 1)],
        {"command": "tests/test_adversarial.py"},
    )


def _store_tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path, framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def _assert_same_tensors(a: Path, b: Path) -> None:
    ta, tb = _store_tensors(a), _store_tensors(b)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and torch.equal(ta[name], tb[name]), name


def _assert_same_models(a: Dataset, b: Dataset) -> None:
    for sa, sb in zip(a.specs, b.specs):
        name = "model.safetensors"
        assert (sa.out_dir / name).read_bytes() == (sb.out_dir / name).read_bytes(), sa.name


def _debris(folder: Path) -> list[str]:
    return sorted(p.name for p in Path(folder).rglob(".*.tmp-*"))


def _dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=BOUND_S)
    return child.pid


def _one_line(exit_info) -> str:
    """The message of a CLI error (``sys.exit(message)``), checked to be one line."""
    message = str(exit_info.value.code)
    assert len(message.splitlines()) == 1, message
    return message


@contextmanager
def _read_only(path: Path):
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


def _thread_pool(jobs: int) -> ThreadPoolExecutor:
    """runner._pool with threads: the same parent loop and store writes, in this process (so that a
    monkeypatch reaches everything, and a loop over every kill point stays fast)."""
    return ThreadPoolExecutor(max(1, jobs))


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> Dataset:
    """The reference: the tiny family trained and measured uninterrupted, through the real process pool."""
    ds = _dataset(tmp_path_factory.mktemp("reference"))
    runner.run_datasets([ds], jobs=2, progress=False)
    return ds


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory) -> Path:
    """A Llama of our trainer (HFConfig), trained 2 steps: a sealed run folder named like the shipped ones."""
    pytest.importorskip("transformers")
    from attnres_helpers.hf import HFConfig

    out = tmp_path_factory.mktemp("hf") / "hf-llama-s0"
    train_mod.train(
        HFConfig("llama", train_len=16, n_layer=1, n_head=2, d_model=16),
        steps=2,
        batch_tokens=32,
        warmup=1,
        out_dir=out,
        checkpoint_every=0,
        progress=False,
    )
    return out


def _copy_run(run_dir: Path, tmp_path: Path, name: str | None = None) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / (name or run_dir.name)))


def _reseal(run_dir: Path) -> None:
    (run_dir / "SHA256SUMS").write_text(
        "".join(f"{files.sha256_file(run_dir / n)}  {n}\n" for n in ("config.json", "model.safetensors"))
    )


def _rewrite_json(path: Path, edit) -> None:
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


# ============================================================================================ processes


def _children(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(c) for c in (task / "children").read_text().split()}
        except (OSError, ValueError):
            pass
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by whoever adopted it, counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_killing_the_parent_leaves_no_worker_and_a_rerun_is_identical(family, tmp_path):
    """SIGKILL run_datasets' parent (2 jobs) while both workers train: every worker dies with it; a rerun
    resumes (the kernel dropped the dead parent's lock, checkpoints reused) and ends bit-identical to the
    uninterrupted run."""
    ds = _dataset(tmp_path)
    driver = LOAD_THIS_FILE + (
        "from pathlib import Path\nfrom attnres_helpers.experiments import runner\n"
        "runner.run_datasets([t._dataset(Path(sys.argv[2]))], jobs=2, progress=False)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", driver, __file__, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline and parent.poll() is None:
            workers |= {c for c in _children(parent.pid) if "spawn_main" in _cmdline(c)}
            started = all(s.out_dir.is_dir() for s in ds.specs)
            checkpointed = any(any(s.out_dir.glob("state-*.safetensors")) for s in ds.specs)
            if len(workers) == 2 and started and checkpointed:
                break
            time.sleep(0.05)
        assert parent.poll() is None, f"the run ended before it could be killed: {parent.stderr.read()[-2000:]!r}"
        assert len(workers) == 2, "the two workers never appeared"
        everyone = workers | _children(parent.pid)  # the workers and multiprocessing's resource tracker
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=BOUND_S)
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline and any(_alive(pid) for pid in everyone):
            time.sleep(0.1)
        assert not [pid for pid in everyone if _alive(pid)], "processes outlived their killed parent"
        # no worker keeps the dead command's stdout open: a reader of it (`... | grep`) sees its end at once
        with ThreadPoolExecutor(1) as reader:
            reader.submit(parent.stdout.read).result(timeout=BOUND_S)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=BOUND_S)
        for pid in workers:  # only if the test failed: never leave one behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        parent.stdout.close()
        parent.stderr.close()
    assert not all((s.out_dir / "config.json").is_file() for s in ds.specs)  # it was killed mid-run
    kept = runner.run_datasets([ds], jobs=2, progress=False)[ds.store]  # the rerun: the lock is free
    assert {p.run for p in kept} == {"rope-s0", "alibi-s1"}
    _assert_same_models(ds, family)
    _assert_same_tensors(ds.store, family.store)
    assert _debris(tmp_path) == [] and not multiprocessing.active_children()


def test_a_worker_that_raises_stops_the_run_at_once(tmp_path):
    """The first run fails (its folder is a file); the long second run is stopped, the third never starts."""
    bad = _spec(tmp_path, "rope", 0)
    bad.out_dir.parent.mkdir(parents=True)
    bad.out_dir.write_text("not a folder")
    long = _spec(tmp_path, "alibi", 1, {**TINY_TRAINING, "steps": 20000})
    never = _spec(tmp_path, "nope", 2)
    ds = Dataset(tmp_path / "store" / "s.safetensors", [bad, long, never], {"command": "test"})
    with pytest.raises(RuntimeError) as err:
        runner.run_datasets([ds], jobs=1, progress=False)
    assert str(err.value).splitlines()[0] == (
        f"run rope-s0 ({bad.out_dir}): FileExistsError: cannot write {bad.out_dir / 'model.safetensors'}: the run "
        f"folder {bad.out_dir} cannot be written (File exists); choose another out_dir"
    )
    assert not never.out_dir.exists() and not (long.out_dir / "config.json").exists()
    assert not ds.store.exists() and not multiprocessing.active_children()


def test_train_specs_reports_a_failure_while_an_earlier_run_still_trains(tmp_path):
    """train_specs (the family's first seeds): the second run fails while the first trains; the error comes at
    once, not when the first has finished."""
    long = _spec(tmp_path, "alibi", 1, {**TINY_TRAINING, "steps": 20000})
    bad = _spec(tmp_path, "rope", 0)
    bad.out_dir.parent.mkdir(parents=True)
    bad.out_dir.write_text("not a folder")
    with pytest.raises(RuntimeError, match=r"^run rope-s0 \("):
        runner.train_specs([long, bad], jobs=2, progress=False)
    assert not (long.out_dir / "config.json").exists() and not multiprocessing.active_children()


def test_a_read_only_store_folder_fails_before_any_run_naming_the_store(family, tmp_path):
    ds = _dataset(tmp_path)
    ds.store.parent.mkdir(parents=True)
    with _read_only(ds.store.parent):
        with pytest.raises(OSError) as err:
            runner.run_datasets([ds], jobs=2, progress=False)
    lock = ds.store.with_name("family.safetensors.lock")
    assert str(err.value) in (
        f"cannot write {ds.store}: its lock {lock} cannot be taken (Operation not permitted)",  # chattr +i (root)
        f"cannot write {ds.store}: its lock {lock} cannot be taken (Permission denied)",
    )  # chmod
    assert not (tmp_path / "runs").exists()  # nothing trained for a store that cannot be written


def test_a_store_write_that_fails_stops_the_run_at_its_first_write(family, tmp_path):
    """The store file cannot be replaced: the error comes when the first run finishes, naming the store,
    and the runs behind it are stopped (the long one) or never started."""
    first = _copy_run(family.specs[0].out_dir, tmp_path / "runs")  # finished: reused, measured at once
    spec = family.specs[0]
    first_spec = RunSpec(spec.name, spec.cfg, spec.seed, first, spec.training, spec.extra, spec.measure)
    long = _spec(tmp_path, "alibi", 1, {**TINY_TRAINING, "steps": 20000})
    never = _spec(tmp_path, "nope", 2)
    store = tmp_path / "store" / "s.safetensors"
    other = load_profiles(family.store)[0][0]
    save_profiles(store, [Profile("other-s0", other.meta, other.eval_len, other.bca, other.s_hat, other.nll)])
    before = store.read_bytes()
    with _read_only(store):
        with pytest.raises(OSError) as err:
            runner.run_datasets(
                [Dataset(store, [first_spec, long, never], {"command": "test"})], jobs=1, progress=False
            )
    assert str(err.value) == f"cannot write {store}: Operation not permitted"
    assert not never.out_dir.exists() and not (long.out_dir / "config.json").exists()
    assert store.read_bytes() == before and _debris(tmp_path) == [] and not multiprocessing.active_children()


def test_train_into_a_read_only_out_fails_before_training_naming_the_target(tmp_path, monkeypatch):
    out = tmp_path / "ro"
    out.mkdir()
    steps = []
    monkeypatch.setattr(train_mod, "get_batch", lambda *a, **k: steps.append(1) or pytest.fail("a step ran"))
    with _read_only(out):
        with pytest.raises(SystemExit) as exit_info:
            cli_main(
                [
                    "train",
                    "--preset",
                    "tiny",
                    "--steps",
                    "3",
                    "--warmup",
                    "1",
                    "--batch-tokens",
                    "64",
                    "--quiet",
                    "--checkpoint-every",
                    "0",
                    "--out",
                    str(out),
                ]
            )
    assert _one_line(exit_info) == (
        f"error: cannot write {out / 'model.safetensors'}: the run folder {out} cannot be "
        "written (Operation not permitted); choose another out_dir"
    )
    assert steps == [] and list(out.iterdir()) == []


# ============================================================================================ debris


def test_a_dead_writers_store_temporary_is_removed_at_the_next_start(family, tmp_path):
    ds = _dataset(tmp_path)
    shutil.copytree(family.store.parent, ds.store.parent)  # every run is in the store: nothing to run
    dead, alive = (
        ds.store.parent / f".family.safetensors.tmp-{_dead_pid()}",
        ds.store.parent / f".family.safetensors.tmp-{os.getpid()}",
    )
    dead.write_bytes(b"half a store")
    alive.write_bytes(b"a live writer's")
    runner.run_datasets([ds], jobs=1, progress=False)
    assert not dead.exists() and alive.exists()  # only a dead process's temporary is debris
    alive.unlink()
    _assert_same_tensors(ds.store, family.store)


def test_a_finished_run_with_leftover_state_is_cleaned_and_keeps_its_seal(family, tmp_path):
    """Killed between config.json and deleting the resume state (its SHA256SUMS, written before config.json,
    is there): the next train() call deletes the state and keeps the seal; sha256sums() of a root never
    lists resume state."""
    spec = family.specs[0]
    run = _copy_run(spec.out_dir, tmp_path / "root")
    (run / "state.json").write_text('{"step": 200, "tensor_file": "state-0000200.safetensors"}')
    save_file({"x": torch.zeros(2)}, run / "state-0000200.safetensors")
    listed = runner.sha256sums(run.parent)
    assert "state" not in listed and "rope-s0/config.json" in listed
    (run.parent / "SHA256SUMS").write_text(listed)
    with pytest.raises(ValueError) as err:
        runner.verify_checkpoints(run.parent)
    assert str(err.value) == (
        f"{run / 'state-0000200.safetensors'} is not listed in SHA256SUMS: refused (remove it, "
        f"or regenerate with `{specs.REPRODUCE_COMMAND}`)"
    )
    (run.parent / "SHA256SUMS").unlink()
    train_mod.train(spec.cfg, seed=spec.seed, out_dir=run, checkpoint_every=100, progress=False, **spec.training)
    assert sorted(p.name for p in run.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors"]
    assert (run / "SHA256SUMS").read_text() == (spec.out_dir / "SHA256SUMS").read_text()


def test_safetensors_files_are_written_with_no_temporary_of_their_own(tmp_path):
    """safetensors' save_file writes ``.tmpXXXXXX`` beside its target and renames it (a kill leaves it, under a
    name nothing cleans); write_safetensors writes the same bytes into the file itself: it works in a folder
    where no file can be created, where save_file cannot."""
    tensors = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.float16)}
    folder = tmp_path / "folder"
    folder.mkdir()
    target = folder / "model.safetensors"
    target.write_bytes(b"")
    with _read_only(folder):  # no file can be created in it; the existing one can still be written
        files.write_safetensors(tensors, target, {"k": "v"})
        with pytest.raises(SafetensorError):
            save_file(tensors, folder / "model.safetensors")
    save_file(tensors, tmp_path / "reference.safetensors", metadata={"k": "v"})
    assert target.read_bytes() == (tmp_path / "reference.safetensors").read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]


# ============================================================================================ locks


def test_a_second_writer_is_refused_naming_the_lock_and_a_killed_writers_lock_is_free(family, tmp_path):
    """files.exclusive is the kernel's flock: a live holder refuses the run, a killed one's lock is free at once
    (its file stays, holding a PID that is never trusted); more cases in tests/test_files.py."""
    ds = _dataset(tmp_path)
    shutil.copytree(family.store.parent, ds.store.parent)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from attnres_helpers import files\n"
            "with files.exclusive(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()",
            str(ds.store),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RuntimeError) as err:
            runner.run_datasets([ds], jobs=1, progress=False)
        lock = ds.store.with_name("family.safetensors.lock")
        assert str(err.value) == (
            f"{ds.store} is being written by another process (pid {holder.pid}, lock {lock}); wait for it, "
            "or stop that process"
        )
    finally:
        holder.kill()  # a writer killed while holding it
        holder.stdin.close()
        holder.wait(timeout=BOUND_S)
        holder.stdout.close()
    assert lock.read_text() == str(holder.pid)
    runner.run_datasets([ds], jobs=1, progress=False)
    assert lock.read_text() == str(os.getpid())  # left after release, and free


# ============================================================================================ stores that lie


def _lying_store(path: Path, profile: Profile, meta=None, nll=None) -> Path:
    """A store file written without Profile's checks: ``meta`` and ``nll`` as given."""
    header = {"about": {}, "runs": {profile.run: meta if meta is not None else profile.meta}}
    key = profile.key
    nll = profile.nll if nll is None else nll
    save_file(
        {f"{key}/s_hat": profile.s_hat.contiguous(), f"{key}/nll": nll.double()},
        path,
        metadata={"attnres": json.dumps(header)},
    )  # json.dumps writes NaN as NaN
    return path


@pytest.fixture(scope="module")
def profile(family) -> Profile:
    return next(p for p in load_profiles(family.store)[0] if p.run == "rope-s0" and p.eval_len == 32 and not p.bca)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"train_len": -3}, "run 'rope-s0': train_len must be an integer in [2, 1048576], got -3"),
        ({"train_len": 0}, "run 'rope-s0': train_len must be an integer in [2, 1048576], got 0"),
        ({"run": "someone-else"}, "run 'rope-s0': metadata may not hold the record keys ['run']"),
        ({"seed": float("nan")}, "run 'rope-s0': seed must be an integer, got nan"),
    ],
)
def test_store_metadata_that_lies_is_refused_at_read(profile, tmp_path, change, message):
    path = _lying_store(tmp_path / "lie.safetensors", profile, meta={**profile.meta, **change})
    with pytest.raises(ValueError) as err:
        load_profiles(path)
    assert str(err.value) == f"measurement store {path}: entry 'rope-s0/32/0' is malformed ({message})"
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["results", "--json", "--store", str(path)])
    assert _one_line(exit_info) == f"error: {err.value}"


def test_negative_nll_is_refused_at_read(profile, tmp_path):
    path = _lying_store(tmp_path / "lie.safetensors", profile, nll=-profile.nll)
    with pytest.raises(ValueError) as err:
        load_profiles(path)
    assert str(err.value) == (
        f"measurement store {path}: entry 'rope-s0/32/0' is malformed (run 'rope-s0' at eval_len "
        "32: nll must be finite and >= 0 (a negative log-likelihood of a probability))"
    )


def test_nll_past_exps_range_is_an_infinite_perplexity_and_valid_json(profile, tmp_path, capsys):
    huge = Profile(
        profile.run, profile.meta, profile.eval_len, profile.bca, profile.s_hat, torch.full_like(profile.nll, 710.0)
    )
    path = tmp_path / "huge.safetensors"
    save_profiles(path, [huge])
    assert {r["perplexity"] for r in records([huge])} == {math.inf}
    cli_main(["results", "--json", "--store", str(path)])
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert {(r["perplexity"], r["perplexity_first_L"], r["perplexity_past_L"]) for r in out} == {(None, None, None)}
    cli_main(["results", "--store", str(path)])  # the text form: inf, no OverflowError
    assert "ppl <L inf" in capsys.readouterr().out


def test_the_trained_explorer_draws_nll_past_exps_range(family, tmp_path):
    """NLL above 709: the readout says inf, the figure draws at its ceiling (finite axis limits), no warning."""
    import dataclasses
    import warnings

    from attnres_helpers.widgets import find_by_class, trained_explorer

    profiles, about = load_profiles(family.store)
    huge = [dataclasses.replace(p, nll=torch.full_like(p.nll, 710.0)) for p in profiles]
    path = tmp_path / "huge.safetensors"
    save_profiles(path, huge, about)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow in exp would be one
        ui = trained_explorer(path)
        find_by_class(ui, "attnres-t-bca").value = True  # a second drawing
    assert find_by_class(ui, "attnres-error").value == ""
    assert "positions &lt; L inf · positions ≥ L inf" in find_by_class(ui, "attnres-trained-readout").value


def test_results_store_empty_string_is_refused():
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["results", "--store", ""])
    assert _one_line(exit_info) == "error: --store must name a store file, got an empty string"


def test_a_float16_store_refuses_values_it_cannot_hold(profile, tmp_path):
    big = Profile(profile.run, profile.meta, profile.eval_len, profile.bca, profile.s_hat * 0 + 70000.0, profile.nll)
    with pytest.raises(ValueError) as err:
        save_profiles(tmp_path / "f16.safetensors", [big], dtype=torch.float16)
    assert str(err.value) == (
        "rope-s0/32/0: s_hat has values beyond torch.float16's range (|x| > 65504); store it as float32 or int16"
    )
    assert list(tmp_path.iterdir()) == []
    save_profiles(
        tmp_path / "f16.safetensors",
        [Profile(big.run, big.meta, big.eval_len, big.bca, big.s_hat * 0 + 65504.0, big.nll)],
        dtype=torch.float16,
    )
    assert load_profiles(tmp_path / "f16.safetensors")[0][0].s_hat.max() == 65504.0  # the largest it holds


def test_a_store_refuses_an_nll_past_float32s_range(profile, tmp_path):
    """The NLL is stored as float32: a finite NLL above 3.4e38 would be written as inf, which no store
    reads back; both the writer and as_stored refuse it by name, and nothing is written."""
    huge = Profile(profile.run, profile.meta, profile.eval_len, profile.bca, profile.s_hat, profile.nll * 0 + 1e39)
    message = "rope-s0/32/0: nll has values beyond torch.float32's range (|x| > 3.40282e+38)"
    for dtype in (torch.float32, torch.int16):
        with pytest.raises(ValueError) as err:
            save_profiles(tmp_path / "big.safetensors", [huge], dtype=dtype)
        assert str(err.value) == message
        with pytest.raises(ValueError) as err:
            as_stored([huge], dtype)
        assert str(err.value) == message
    assert list(tmp_path.iterdir()) == []


# ============================================================================================ verification


@pytest.fixture
def root(family, tmp_path) -> Path:
    """A shipped-style root of the family's two runs with one SHA256SUMS (as reproduce writes it)."""
    root = tmp_path / "checkpoints"
    for spec in family.specs:
        shutil.copytree(spec.out_dir, root / spec.name)
    (root / "SHA256SUMS").write_text(runner.sha256sums(root))
    runner.verify_checkpoints(root)
    return root


@pytest.mark.parametrize("name", ["rope-s0/pytorch_model.bin", "notes.txt", "rope-s0/sub/model.safetensors"])
def test_unlisted_files_at_any_depth_are_refused(root, name):
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(b"anything")
    with pytest.raises(ValueError) as err:
        runner.verify_checkpoints(root)
    assert str(err.value) == (
        f"{root / name} is not listed in SHA256SUMS: refused (remove it, or regenerate with "
        f"`{specs.REPRODUCE_COMMAND}`)"
    )
    if name.startswith("rope-s0/"):  # the run's own SHA256SUMS refuses it too
        with pytest.raises(ValueError, match=r"is not listed in SHA256SUMS: refused"):
            load_checkpoint(root / "rope-s0")


def test_a_link_to_dev_zero_is_refused_without_reading_it(root, monkeypatch):
    real_open = open

    def guarded(path, *args, **kwargs):
        assert isinstance(path, int) or os.path.realpath(path) != "/dev/zero", "/dev/zero was opened"
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", guarded)
    target = root / "rope-s0" / "model.safetensors"
    target.unlink()
    target.symlink_to("/dev/zero")
    for check in (lambda: runner.verify_checkpoints(root), lambda: load_checkpoint(root / "rope-s0")):
        with pytest.raises(ValueError) as err:
            check()
        assert str(err.value) == f"{target} is not a regular file (a link, a device or a folder): refused"
    (root / "zero").symlink_to("/dev/zero")  # unlisted, too
    with pytest.raises(ValueError, match=f"{root / 'zero'} is not listed in SHA256SUMS: refused"):
        runner.verify_checkpoints(root)


def test_a_file_over_the_hashing_bound_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"x" * 11)
    monkeypatch.setattr("builtins.open", lambda *a, **k: pytest.fail("the file was opened"))
    with pytest.raises(ValueError) as err:
        files.sha256_file(path, max_bytes=10)
    assert str(err.value) == f"{path} is 11 bytes, over the 10-byte bound: refused"


def test_a_binary_sha256sums_names_the_file(root):
    (root / "SHA256SUMS").write_bytes(bytes(range(256)))
    with pytest.raises(ValueError) as err:
        runner.verify_checkpoints(root)
    assert str(err.value) == (
        f"{root / 'SHA256SUMS'} is not a text file; regenerate the folder with `{specs.REPRODUCE_COMMAND}`"
    )


def test_an_oversized_or_linked_sha256sums_is_refused_unread(root):
    sums = root / "SHA256SUMS"
    with open(sums, "r+b") as f:
        f.truncate(files.MAX_SUMS_BYTES + 1)  # sparse: nothing is written
    message = (
        f"{sums} is a link or over {files.MAX_SUMS_BYTES} bytes: refused; regenerate the folder with "
        f"`{specs.REPRODUCE_COMMAND}`"
    )
    with pytest.raises(ValueError) as err:
        runner.verify_checkpoints(root)
    assert str(err.value) == message
    sums.unlink()
    sums.symlink_to("/dev/zero")  # not a regular file: as good as missing
    with pytest.raises(FileNotFoundError, match="SHA256SUMS is missing"):
        runner.verify_checkpoints(root)
    sums.unlink()
    (root / "elsewhere").write_text(runner.sha256sums(root))
    sums.symlink_to(root / "elsewhere")
    with pytest.raises(ValueError) as err:
        runner.verify_checkpoints(root)
    assert str(err.value) == message


def _hf_root(hf_run: Path, tmp_path: Path) -> Path:
    """A data/hf_checkpoints-style root: the run's config.json and model, one SHA256SUMS (ship_hf_checkpoints)."""
    root = tmp_path / "hf_checkpoints"
    runner.ship_hf_checkpoints(hf_run.parent, root, runs=(hf_run.name,))
    return root


def test_a_missing_hf_sha256sums_names_hf_train(hf_run, tmp_path):
    root = _hf_root(hf_run, tmp_path)
    load_checkpoint(root / "hf-llama-s0")  # verified by the root's SHA256SUMS
    (root / "SHA256SUMS").unlink()
    command = specs.HF_COMMAND
    for fix in (None, command):
        with pytest.raises(FileNotFoundError) as err:
            runner.verify_checkpoints(root, fix)
        assert str(err.value) == f"{root / 'SHA256SUMS'} is missing; regenerate the folder with `{command}`"
    with pytest.raises(ValueError) as err:
        load_checkpoint(root / "hf-llama-s0")
    assert str(err.value) == (
        f"checkpoint {root / 'hf-llama-s0'} has no SHA256SUMS (neither in it nor above it): it "
        f"cannot be verified and is refused; regenerate it with `{command}`"
    )
    # where the shipped HF checkpoints are verified (notebook 06: verify_checkpoints(HF_CHECKPOINTS)), the
    # default names hf-train; nothing under data/ is read to decide it
    assert regenerate_command(paths.HF_CHECKPOINTS) == command
    assert regenerate_command(paths.HF_CHECKPOINTS / "hf-bloom-s0") == command
    assert regenerate_command(specs.CHECKPOINTS) == specs.REPRODUCE_COMMAND


def test_an_hf_checkpoint_with_a_flipped_byte_or_no_sha256sums_is_refused(hf_run, tmp_path):
    run = _copy_run(hf_run, tmp_path)
    data = bytearray((run / "model.safetensors").read_bytes())
    data[-10] ^= 1
    (run / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:
        load_checkpoint(run)
    assert str(err.value) == (
        f"{run / 'model.safetensors'} does not match SHA256SUMS (corrupt or tampered); "
        f"regenerate with `{specs.HF_COMMAND}`"
    )
    (run / "SHA256SUMS").unlink()  # and without any SHA256SUMS
    with pytest.raises(ValueError) as err:
        load_checkpoint(run)
    assert str(err.value) == (
        f"checkpoint {run} has no SHA256SUMS (neither in it nor above it): it cannot be "
        f"verified and is refused; regenerate it with `{specs.HF_COMMAND}`"
    )


def test_a_relabelled_config_is_refused(family, tmp_path):
    run = _copy_run(family.specs[0].out_dir, tmp_path)
    _rewrite_json(run / "config.json", lambda c: c["model"].update(encoding="alibi"))
    with pytest.raises(ValueError) as err:
        load_checkpoint(run)
    assert str(err.value) == (
        f"{run / 'config.json'} does not match SHA256SUMS (corrupt or tampered); regenerate "
        f"with `{specs.REPRODUCE_COMMAND}`"
    )


def test_a_tampered_d_model_is_refused_before_anything_is_allocated(family, tmp_path, monkeypatch):
    run = _copy_run(family.specs[0].out_dir, tmp_path)
    _rewrite_json(run / "config.json", lambda c: c["model"].update(d_model=65536))
    with pytest.raises(ValueError, match="config.json does not match SHA256SUMS"):
        load_checkpoint(run)
    _reseal(run)  # hashes that match: the config's own bound refuses it, before any model is built
    monkeypatch.setattr(ModelConfig, "build", lambda cfg: pytest.fail("a model was built"))
    with pytest.raises(ValueError) as err:
        load_checkpoint(run)
    assert str(err.value) == (
        f"checkpoint file {run / 'config.json'} has a bad model config: the model would have "
        "103,097,303,040 parameters (2 layers of width 65536), over the bound of 1,000,000,000"
    )


# ============================================================================================ resource bounds


def test_train_threads_are_bounded(tmp_path, capsys):
    most = 4 * os.cpu_count()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train", "--preset", "tiny", "--threads", "100000", "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 2 and capsys.readouterr().err.splitlines() == [
        f"python -m attnres_helpers train: error: argument --threads: must be at most {most} (4 x the "
        f"{os.cpu_count()} CPUs), got 100000 (see --help)"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--n-layer", "100000", "--d-model", "4096"], "error: n_layer must be at most 1024, got 100000"),
        (
            ["--n-layer", "1000", "--d-model", "1024"],
            "error: the model would have 12,592,392,192 parameters (1000 layers "
            "of width 1024), over the bound of 1,000,000,000",
        ),
        (["--d-model", "131072", "--n-head", "2"], "error: d_model must be at most 65536, got 131072"),
    ],
)
def test_model_size_is_bounded_before_anything_is_built(tmp_path, monkeypatch, args, message):
    monkeypatch.setattr(ModelConfig, "build", lambda cfg: pytest.fail("a model was built"))
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train", "--preset", "tiny", "--quiet", "--out", str(tmp_path / "run"), *args])
    assert _one_line(exit_info) == message and not (tmp_path / "run").exists()


def test_resamples_are_bounded():
    from attnres_helpers import analysis

    message = "n_resamples must be at most 1,000,000 (the plan uses 10,000), got 1,000,000,000"
    x, y, clusters = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0], ["a", "a", "b", "c"]
    for call in (
        lambda: stats.spearman_permutation_test(x, y, n_resamples=10**9),
        lambda: stats.spearman_cluster_bootstrap(x, y, clusters, n_resamples=10**9),
        lambda: stats.cluster_bootstrap_spearmans([x], y, clusters, n_resamples=10**9),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message
    points = [
        analysis.Point(
            f"s{i}",
            "rope",
            False,
            {"R(2L) upper": v, "rise 2L": w, "design R(2L)": v, "R(2L) mean": v},
            {"rise 2L": {0: w}},
        )
        for i, (v, w) in enumerate(zip(x, y))
    ]
    with pytest.raises(ValueError) as err:
        analysis.run_plan(points, n_resamples=10**9)
    assert str(err.value) == message


# ============================================================================================ measure-hf


def _tiny_llama(**config):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        vocab_size=256,
        tie_word_embeddings=True,
        **config,
    )
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("llama") / "tiny-llama"
    _tiny_llama().save_pretrained(folder)
    return folder


@pytest.fixture
def no_hub(monkeypatch):
    """No network: the hub check fails as it does offline (and nothing may get past it)."""

    def refuse(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)


def _variant(folder: Path, tmp_path: Path, edit) -> Path:
    copy = Path(shutil.copytree(folder, tmp_path / f"{folder.name}-edited"))
    edit(copy)
    return copy


def _zero_bytes(folder):
    (folder / "model.safetensors").write_bytes(b"")


def _truncated(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _corrupt_header(folder):
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:40] = b"!" * 32
    (folder / "model.safetensors").write_bytes(bytes(data))


def _only_a_pickle(folder):
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"a pickle that must never be opened")


def _zero_heads(folder):
    _rewrite_json(folder / "config.json", lambda c: c.update(num_attention_heads=0))


def _wider_config(folder):
    _rewrite_json(folder / "config.json", lambda c: c.update(hidden_size=24))


def _heads_not_dividing(folder):
    _rewrite_json(folder / "config.json", lambda c: c.update(num_attention_heads=3))


@pytest.mark.parametrize(
    "edit, reason",
    [
        (
            _zero_bytes,
            "cannot load a safetensors causal LM (SafetensorError: Error while deserializing header: header too small)",
        ),
        (
            _truncated,
            "cannot load a safetensors causal LM (SafetensorError: Error while deserializing header: "
            "incomplete metadata, file not fully covered)",
        ),
        (_corrupt_header, "cannot load a safetensors causal LM (SafetensorError: Error while deserializing header: "),
        (
            _only_a_pickle,
            "cannot load a safetensors causal LM (OSError: Error no file named model.safetensors found in directory ",
        ),
        (_zero_heads, None),
        (
            _wider_config,
            "cannot load a safetensors causal LM (RuntimeError: the weights' shapes do not match config.json)",
        ),
        (
            _heads_not_dividing,
            "cannot load a safetensors causal LM (StrictDataclassClassValidationError: Class "
            "validation error for validator 'validate_architecture': ValueError: The hidden size (16) "
            "is not a multiple of the number of attention heads (3).)",
        ),
    ],
)
def test_measure_hf_on_broken_folders_is_one_line_naming_the_folder(llama_folder, tmp_path, no_hub, edit, reason):
    from attnres_helpers import hf

    folder = _variant(llama_folder, tmp_path, edit)
    reports = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: reports.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)  # transformers' own log (its load report)
    try:
        expected = (
            f"{folder}: {reason}"
            if reason
            else f"{folder / 'config.json'}: num_attention_heads must be a positive integer, got 0"
        )
        with pytest.raises(ValueError) as err:
            hf.measure_pretrained(str(folder), lengths=(1,), n_windows=1)
        assert str(err.value).startswith(expected) and len(str(err.value).splitlines()) == 1
        with pytest.raises(SystemExit) as exit_info:
            cli_main(["measure-hf", "--model", str(folder), "--lengths", "1", "--windows", "1", "--json"])
        assert _one_line(exit_info) == f"error: {err.value}"
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [r for r in reports if "LOAD REPORT" in r]  # our one line, not transformers' report too


def test_a_model_with_huge_logits_gives_infinite_perplexity_and_valid_json(llama_folder, tmp_path, capsys):
    from attnres_helpers import hf

    model = _tiny_llama()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(1e6)  # tied: the logits are about 1e12 a token
    folder = tmp_path / "huge"
    model.save_pretrained(folder)
    recs = hf.measure_pretrained(folder, lengths=(1,), n_windows=1)
    assert recs and {r["perplexity"] for r in recs} == {math.inf}
    assert all(0 <= r["resolution"] <= 1 for r in recs)
    capsys.readouterr()
    cli_main(["measure-hf", "--model", str(folder), "--lengths", "1", "--windows", "1", "--json"])
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert {r["perplexity"] for r in out} == {None}


def test_measure_hf_method_explicit_agrees_with_fft(llama_folder, capsys):
    """The CLI's --method explicit (the O(T²) path) gives the FFT path's records, R to 1e-4 relative."""
    runs = {}
    for method in ("fft", "explicit"):
        cli_main(["measure-hf", "--model", str(llama_folder), "--lengths", "1,2", "--windows", "1", "--json",
                  "--method", method])  # fmt: skip
        runs[method] = json.loads(capsys.readouterr().out)
    assert len(runs["fft"]) == len(runs["explicit"]) > 0
    for a, b in zip(runs["fft"], runs["explicit"]):
        assert (a["layer"], a["eval_len"]) == (b["layer"], b["eval_len"])
        assert a["resolution"] == pytest.approx(b["resolution"], rel=1e-4, abs=1e-9)
        assert a["perplexity"] == b["perplexity"]


def test_a_hub_name_without_network_is_one_line(tmp_path, monkeypatch, no_hub):
    from attnres_helpers import hf

    monkeypatch.chdir(tmp_path)
    message = (
        "'someorg/some-model' is not a local folder and the Hugging Face hub cannot be reached (no network); "
        "give the path of a downloaded model folder"
    )
    with pytest.raises(ValueError) as err:
        hf.measure_pretrained("someorg/some-model")
    assert str(err.value) == message
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["measure-hf", "--model", "someorg/some-model"])
    assert _one_line(exit_info) == f"error: {message}"


def test_the_hub_is_tried_once_with_a_short_timeout(monkeypatch, tmp_path):
    from attnres_helpers.hf import pretrained

    calls = []
    monkeypatch.setattr(
        socket,
        "create_connection",
        lambda address, timeout: calls.append((address, timeout)) or (_ for _ in ()).throw(OSError("unreachable")),
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="cannot be reached"):
        pretrained.load_pretrained("someorg/some-model")
    assert calls == [(("huggingface.co", 443), 5.0)]


@pytest.mark.parametrize("name", ["runs/my-model", "/nonexistent/model", "./my-model", "~/no-such-model-here"])
def test_a_missing_local_path_is_a_local_error(tmp_path, monkeypatch, name):
    from attnres_helpers import hf

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # a mistyped run folder under a local runs/
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("the hub was contacted"))
    with pytest.raises(FileNotFoundError) as err:
        hf.measure_pretrained(name)
    assert str(err.value) == f"model folder {Path(name).expanduser()} does not exist"


def test_the_projects_own_folders_point_to_the_right_command(family, hf_run, tmp_path, no_hub):
    from attnres_helpers import hf

    for run, command, store in (
        (family.specs[0].out_dir, specs.REPRODUCE_COMMAND, "data/results/default.safetensors"),
        (hf_run, specs.HF_COMMAND, "data/results/hf.safetensors"),
    ):
        with pytest.raises(ValueError) as err:
            hf.measure_pretrained(str(run))
        assert str(err.value) == (
            f"{run} is a checkpoint in this project's own format, not a transformers folder: "
            f"its measurements are read by `python -m attnres_helpers results --store {store}` "
            f"and made by `{command}`; in Python, load it with "
            "attnres_helpers.checkpoints.load_checkpoint"
        )
        with pytest.raises(SystemExit) as exit_info:
            cli_main(["measure-hf", "--model", str(run)])
        assert _one_line(exit_info) == f"error: {err.value}"


def test_measure_pretrained_takes_a_path(llama_folder):
    from attnres_helpers import hf

    recs = hf.measure_pretrained(llama_folder, lengths=(1,), n_windows=1)
    assert {r["run"] for r in recs} == {"tiny-llama"} and {r["eval_len"] for r in recs} == {32}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lengths": (float("inf"),)}, "lengths must be multiples of L in (0, 64], got [inf]"),
        ({"lengths": ()}, "no lengths to measure"),
        ({"lengths": (True,)}, "lengths must be multiples of L in (0, 64], got [True]"),
        ({"n_windows": True}, "n_windows must be a positive integer, got True"),
        ({"n_windows": 0}, "n_windows must be a positive integer, got 0"),
        ({"train_len": 1.5}, "train_len must be an integer >= 2, got 1.5"),
    ],
)
def test_measure_pretrained_arguments_are_checked_before_loading(llama_folder, monkeypatch, kwargs, message):
    from attnres_helpers.hf import pretrained

    monkeypatch.setattr(pretrained, "load_pretrained", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError) as err:
        pretrained.measure_pretrained(llama_folder, **kwargs)
    assert str(err.value) == message


# ============================================================================================ fault injection


class Killed(BaseException):
    """Stands for a kill: not an Exception, so no handler of ours catches it."""


class _KillAt:
    """Every file operation of files.py and train.py (os.open, os.write, os.close, os.link, os.chmod,
    os.fsync, os.replace, os.fdopen) and every Path.unlink, counted; the k-th raises Killed before it
    happens (k None: count only)."""

    OPS = ("open", "write", "close", "link", "chmod", "fsync", "replace", "fdopen")

    def __init__(self, monkeypatch, k: int | None):
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


def _drop_flocks(lock: Path) -> None:
    """Close this process's descriptors of ``lock`` (which drops their flock), as a kill would: a kill
    simulated in this process before files.exclusive's own close leaves its descriptor open."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == os.path.realpath(lock):
                os.close(int(fd))
        except OSError:  # the listing's own descriptor, gone
            pass


TRAIN_RUN = {
    "steps": 6,
    "batch_tokens": 64,
    "lr": 1e-3,
    "warmup": 2,
    "seed": 3,
    "checkpoint_every": 2,
    "progress": False,
}  # resume state at steps 2 and 4, then the model, config.json and SHA256SUMS


@pytest.mark.slow
def test_a_kill_at_every_file_operation_of_train_resumes_bit_identically(tmp_path, monkeypatch):
    cfg = preset("tiny", encoding="rope")
    with monkeypatch.context() as m:
        counter = _KillAt(m, None)
        train_mod.train(cfg, out_dir=tmp_path / "reference", **TRAIN_RUN)
    n_ops = counter.count
    reference = (tmp_path / "reference" / "model.safetensors").read_bytes()
    assert n_ops >= 7 * 6  # seven atomic writes of six operations each, and the unlinks
    for k in range(n_ops):
        out = tmp_path / f"killed-{k}"
        with monkeypatch.context() as m:
            kill = _KillAt(m, k)
            with pytest.raises(Killed):
                train_mod.train(cfg, out_dir=out, **TRAIN_RUN)
            assert kill.fired
        train_mod.train(cfg, out_dir=out, **TRAIN_RUN)  # resume
        assert (out / "model.safetensors").read_bytes() == reference, f"kill at operation {k}"
        assert sorted(p.name for p in out.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors"], k
        load_checkpoint(out)
        shutil.rmtree(out)


def test_a_kill_at_every_file_operation_of_a_store_write_leaves_the_old_or_the_new_store(family, tmp_path, monkeypatch):
    """The store holds the first run; the second (trained, measured here) is added. A kill at any file
    operation of the run leaves the old store or the new one, whole, and a rerun completes it."""
    monkeypatch.setattr(runner, "_pool", _thread_pool)
    base = tmp_path / "base"
    ds = _dataset(base)
    for spec in ds.specs:  # both trained: what is written in this test is the store (and the lock)
        shutil.copytree(next(s for s in family.specs if s.name == spec.name).out_dir, spec.out_dir)
    first = [p for p in load_profiles(family.store)[0] if p.run == "rope-s0"]
    save_profiles(
        ds.store,
        first,
        ds.about,
        ds.dtype,
        {k: c for k, c in runner.load_curves(family.store).items() if k[0] == "rope-s0"},
    )
    old = ds.store.read_bytes()
    with monkeypatch.context() as m:
        counter = _KillAt(m, None)
        runner.run_datasets([_dataset(shutil.copytree(base, tmp_path / "count"))], jobs=1, progress=False)
    n_ops = counter.count
    assert n_ops >= 6 + 3  # one store write, the lock taken and released
    old_keys = sorted(p.key for p in first)
    new_keys = sorted(p.key for p in load_profiles(family.store)[0])
    for k in range(n_ops):
        copy = _dataset(shutil.copytree(base, tmp_path / f"killed-{k}"))
        with monkeypatch.context() as m:
            kill = _KillAt(m, k)
            with pytest.raises(Killed):
                runner.run_datasets([copy], jobs=1, progress=False)
            assert kill.fired
        lock = copy.store.with_name("family.safetensors.lock")
        _drop_flocks(lock)  # what the kernel does when a process is killed
        keys = sorted(p.key for p in load_profiles(copy.store)[0])  # loads: never a partial store
        assert keys in (old_keys, new_keys), k
        assert copy.store.read_bytes() == old or keys == new_keys, k
        runner.run_datasets([copy], jobs=1, progress=False)  # the rerun completes it
        _assert_same_tensors(copy.store, family.store)
        assert _debris(copy.store.parent) == []
        shutil.rmtree(copy.store.parent.parent)


# ============================================================================================ torchrun

DISTRIBUTED_DRIVER = (
    LOAD_THIS_FILE
    + """import os
from pathlib import Path
from attnres_helpers.experiments import runner
real = runner.train_and_measure
log = Path(sys.argv[2]) / f"rank-{os.environ['RANK']}.txt"
def logged(spec, *args, **kwargs):
    with open(log, "a") as f:
        f.write(spec.name + "\\n")
    return real(spec, *args, **kwargs)
runner.train_and_measure = logged
runner.run_datasets_distributed([t._dataset(Path(sys.argv[2]))], progress=False)
"""
)


@pytest.mark.slow
def test_two_gloo_ranks_under_torchrun_merge_the_store_of_a_single_process_run(family, tmp_path):
    """torchrun --nproc-per-node 2 on CPU: each rank trains and measures one of the two runs into its part;
    rank 0 merges them: the same model bytes and store tensors as the single-process run, no part left."""
    driver = tmp_path / "driver.py"
    driver.write_text(DISTRIBUTED_DRIVER)
    ds = _dataset(tmp_path / "root")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(driver),
            __file__,
            str(tmp_path / "root"),
        ],
        capture_output=True,
        text=True,
        timeout=BOUND_S * 2,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [(tmp_path / "root" / f"rank-{r}.txt").read_text() for r in (0, 1)] == ["rope-s0\n", "alibi-s1\n"]
    _assert_same_models(ds, family)
    _assert_same_tensors(ds.store, family.store)
    assert sorted(p.name for p in ds.store.parent.iterdir() if p.suffix != ".lock") == [
        "family.safetensors"
    ]  # no part, lock or debris


def test_a_rerun_under_torchrun_merges_what_a_stopped_one_left_and_runs_the_rest(family, tmp_path, monkeypatch):
    """One rank, in this process: rope-s0 is in a part a stopped run left (its training finished), alibi-s1
    is not; rank 0 merges the part first, so only alibi-s1 is trained and measured."""
    ds = _dataset(tmp_path)
    for spec in ds.specs:
        shutil.copytree(next(s for s in family.specs if s.name == spec.name).out_dir, spec.out_dir)
    rope = [p for p in load_profiles(family.store)[0] if p.run == "rope-s0"]
    save_profiles(runner.part_path(ds.store, 1, 2), rope, ds.about)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(runner, "_die_with_parent", lambda parent: None)  # not for the test process itself
    ran, real = [], runner.train_and_measure
    monkeypatch.setattr(runner, "train_and_measure", lambda spec, *a, **k: ran.append(spec.name) or real(spec, *a, **k))
    kept = runner.run_datasets_distributed([ds], progress=False)[ds.store]
    assert ran == ["alibi-s1"] and {p.run for p in kept} == {"rope-s0", "alibi-s1"}
    _assert_same_tensors(ds.store, family.store)
    assert sorted(p.name for p in ds.store.parent.iterdir() if p.suffix != ".lock") == ["family.safetensors"]


def test_parts_a_stopped_distributed_run_left_are_merged_at_the_next_start(family, tmp_path):
    ds = _dataset(tmp_path)
    ds.store.parent.mkdir(parents=True)
    profiles = load_profiles(family.store)[0]
    save_profiles(ds.store, [p for p in profiles if p.run == "rope-s0"], ds.about)
    save_profiles(runner.part_path(ds.store, 1, 2), [p for p in profiles if p.run == "alibi-s1"], ds.about)
    save_profiles(runner.part_path(ds.store, 0, 3), [p for p in profiles if p.run == "alibi-s1"], ds.about)  # twice
    kept = runner._merge_parts([ds])[ds.store]
    assert sorted(p.key for p in kept) == sorted(p.key for p in profiles)
    _assert_same_tensors(ds.store, family.store)
    assert sorted(p.name for p in ds.store.parent.iterdir() if p.suffix != ".lock") == ["family.safetensors"]


def test_merged_int16_parts_are_returned_as_the_store_holds_them(family, tmp_path):
    """As family-v2 --distributed writes them: head means, the parts float32, the store int16 codes. The
    merge returns exactly what the store then holds (store.as_stored), the part's run included."""
    ds = dataclasses.replace(_dataset(tmp_path), dtype=torch.int16, average_heads=True)
    ds.store.parent.mkdir(parents=True)
    profiles = average_heads(load_profiles(family.store)[0])
    save_profiles(ds.store, [p for p in profiles if p.run == "rope-s0"], ds.about, torch.int16)
    save_profiles(runner.part_path(ds.store, 1, 2), [p for p in profiles if p.run == "alibi-s1"], ds.about)
    kept = {p.key: p for p in runner._merge_parts([ds])[ds.store]}
    stored = {p.key: p for p in load_profiles(ds.store)[0]}
    assert kept.keys() == stored.keys() == {p.key for p in profiles}
    for key, p in stored.items():
        for name in ("s_hat", "nll", "key0"):
            a, b = getattr(kept[key], name), getattr(p, name)
            assert (a is None and b is None) or torch.equal(a, b), (key, name)
    assert sorted(p.name for p in ds.store.parent.iterdir() if p.suffix != ".lock") == ["family.safetensors"]


def test_family_v2_distributed_is_for_torchrun_only(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["family-v2", "--distributed"])
    assert _one_line(exit_info) == (
        "error: --distributed needs torchrun: `torchrun --nproc-per-node N -m attnres_helpers family-v2 --distributed`"
    )
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["family-v2"])
    assert _one_line(exit_info) == (
        "error: started by torchrun (RANK and WORLD_SIZE are set): pass --distributed, or run it with plain python"
    )
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["family-v2", "--distributed"])
    assert _one_line(exit_info) == "error: RANK must be in [0, WORLD_SIZE), got RANK=2, WORLD_SIZE=2"
