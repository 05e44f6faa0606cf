"""The runner's real worker processes (attnres_helpers.experiments.runner): killed with their parent, stopped
at once when one fails or a store write fails, and two torchrun ranks merging one store.

The stopping tests run twice: on the runner's pool as threads of this process (``in-process``, fast: each
run in flight ends at its next step) and on its real spawn pool (``processes``, marked slow: each worker a
fresh interpreter importing torch). Every wait on a process is a bounded loop (helpers.BOUND_S)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import (
    BOUND_S,
    DRIVER_PRELUDE,
    TESTS,
    TINY_TRAINING,
    assert_same_models,
    assert_same_tensors,
    copy_run,
    debris,
    family_dataset,
    in_process_runner,
    read_only,
    tiny_spec,
)

from attnres_helpers.experiments import runner
from attnres_helpers.experiments.specs import Dataset, RunSpec
from attnres_helpers.store import Profile, load_profiles, save_profiles

CHECKPOINTED = {**TINY_TRAINING, "steps": 250}  # the runner checkpoints every 100 steps on a CPU: at 100 and 200


@pytest.fixture(params=["in-process", pytest.param("processes", marks=pytest.mark.slow)])
def pool(request):
    """The runner's pool: threads of this process (helpers.InProcessPool), or its real worker processes."""
    if request.param == "in-process":
        with in_process_runner():
            yield request.param
    else:
        yield request.param


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
def test_killing_the_parent_leaves_no_worker_and_a_rerun_is_identical(tmp_path):
    """SIGKILL run_datasets' parent (2 jobs) while both workers train: every worker dies with it; a rerun
    resumes (the kernel dropped the dead parent's lock, checkpoints reused) and ends bit-identical to the
    uninterrupted run (the family trained long enough to checkpoint, in this process)."""
    reference = family_dataset(tmp_path / "reference", CHECKPOINTED)
    with in_process_runner():  # one run at a time: threads share torch's global RNG, which seeds the weights
        runner.run_datasets([reference], jobs=1, progress=False)
    ds = family_dataset(tmp_path / "killed", CHECKPOINTED)
    driver = DRIVER_PRELUDE + (
        "from pathlib import Path\nfrom attnres_helpers.experiments import runner\n"
        "training = {**t.TINY_TRAINING, 'steps': int(sys.argv[3])}\n"
        "runner.run_datasets([t.family_dataset(Path(sys.argv[2]), training)], jobs=2, progress=False)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", driver, str(TESTS), str(tmp_path / "killed"), str(CHECKPOINTED["steps"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
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
    assert_same_models(ds, reference)
    assert_same_tensors(ds.store, reference.store)
    assert debris(tmp_path) == [] and not multiprocessing.active_children()


def test_a_worker_that_raises_stops_the_run_at_once(pool, tmp_path):
    """The first run fails (its folder is a file); the long second run is stopped, the third never starts."""
    bad = tiny_spec(tmp_path, "rope", 0)
    bad.out_dir.parent.mkdir(parents=True)
    bad.out_dir.write_text("not a folder")
    long = tiny_spec(tmp_path, "alibi", 1, {**TINY_TRAINING, "steps": 20000})
    never = tiny_spec(tmp_path, "nope", 2)
    ds = Dataset(tmp_path / "store" / "s.safetensors", [bad, long, never], {"command": "test"})
    with pytest.raises(RuntimeError) as err:
        runner.run_datasets([ds], jobs=1, progress=False)
    assert str(err.value).splitlines()[0] == (
        f"run rope-s0 ({bad.out_dir}): FileExistsError: cannot write {bad.out_dir / 'model.safetensors'}: the run "
        f"folder {bad.out_dir} cannot be written (File exists); choose another out_dir"
    )
    assert not never.out_dir.exists() and not (long.out_dir / "config.json").exists()
    assert not ds.store.exists() and not multiprocessing.active_children()


def test_train_specs_reports_a_failure_while_an_earlier_run_still_trains(pool, tmp_path):
    """train_specs (the family's first seeds): the second run fails while the first trains; the error comes at
    once, not when the first has finished."""
    long = tiny_spec(tmp_path, "alibi", 1, {**TINY_TRAINING, "steps": 20000})
    bad = tiny_spec(tmp_path, "rope", 0)
    bad.out_dir.parent.mkdir(parents=True)
    bad.out_dir.write_text("not a folder")
    with pytest.raises(RuntimeError, match=r"^run rope-s0 \("):
        runner.train_specs([long, bad], jobs=2, progress=False)
    assert not (long.out_dir / "config.json").exists() and not multiprocessing.active_children()


def test_a_store_write_that_fails_stops_the_run_at_its_first_write(pool, family, tmp_path):
    """The store file cannot be replaced: the error comes when the first run finishes, naming the store,
    and the runs behind it are stopped (the long one) or never started."""
    first = copy_run(family.specs[0].out_dir, tmp_path / "runs")  # finished: reused, measured at once
    spec = family.specs[0]
    first_spec = RunSpec(spec.name, spec.cfg, spec.seed, first, spec.training, spec.extra, spec.measure)
    long = tiny_spec(tmp_path, "alibi", 1, {**TINY_TRAINING, "steps": 20000})
    never = tiny_spec(tmp_path, "nope", 2)
    store = tmp_path / "store" / "s.safetensors"
    other = load_profiles(family.store)[0][0]
    save_profiles(store, [Profile("other-s0", other.meta, other.eval_len, other.bca, other.s_hat, other.nll)])
    before = store.read_bytes()
    with read_only(store):
        with pytest.raises(OSError) as err:
            runner.run_datasets(
                [Dataset(store, [first_spec, long, never], {"command": "test"})], jobs=1, progress=False
            )
    assert str(err.value) == f"cannot write {store}: Operation not permitted"
    assert not never.out_dir.exists() and not (long.out_dir / "config.json").exists()
    assert store.read_bytes() == before and debris(tmp_path) == [] and not multiprocessing.active_children()


DISTRIBUTED_DRIVER = (
    DRIVER_PRELUDE
    + """import os
from pathlib import Path
from attnres_helpers.experiments import distributed, work
real = work.train_and_measure
log = Path(sys.argv[2]) / f"rank-{os.environ['RANK']}.txt"
def logged(spec, *args, **kwargs):
    with open(log, "a") as f:
        f.write(spec.name + "\\n")
    return real(spec, *args, **kwargs)
work.train_and_measure = logged
distributed.run_datasets_distributed([t.family_dataset(Path(sys.argv[2]))], progress=False)
"""
)


@pytest.mark.slow
def test_two_gloo_ranks_under_torchrun_merge_the_store_of_a_single_process_run(family, tmp_path):
    """torchrun --nproc-per-node 2 on CPU: each rank trains and measures one of the two runs into its part;
    rank 0 merges them: the same model bytes and store tensors as the single-process run, no part left."""
    driver = tmp_path / "driver.py"
    driver.write_text(DISTRIBUTED_DRIVER)
    ds = family_dataset(tmp_path / "root")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(driver),
            str(TESTS),
            str(tmp_path / "root"),
        ],
        capture_output=True,
        text=True,
        timeout=BOUND_S * 2,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [(tmp_path / "root" / f"rank-{r}.txt").read_text() for r in (0, 1)] == ["rope-s0\n", "alibi-s1\n"]
    assert_same_models(ds, family)
    assert_same_tensors(ds.store, family.store)
    assert sorted(p.name for p in ds.store.parent.iterdir() if p.suffix != ".lock") == [
        "family.safetensors"
    ]  # no part, lock or debris
