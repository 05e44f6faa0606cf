"""The runner (attnres_helpers.experiments.runner) in this process, its pool replaced by threads
(helpers.InProcessPool), on tiny runs in tmp_path: which runs a store keeps, drops and measures again, the
store's lock over a whole command (a second writer refused), what it prints, inputs checked before any
work, seals written only over verified weights, a dead writer's debris removed, a kill at every file
operation of a store write, and the parts of a torchrun run merged. Its real worker processes are tested
in tests/test_runner_processes.py."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    BOUND_S,
    TINY_MEASURE,
    TINY_TRAINING,
    KillAt,
    Killed,
    assert_same_tensors,
    dead_pid,
    debris,
    family_dataset,
    in_process_runner,
    one_line,
    read_only,
    tiny_spec,
)

from attnres_helpers import experiments, files
from attnres_helpers.__main__ import main as cli_main
from attnres_helpers.checkpoints import RETRAIN, load_checkpoint, seal_root
from attnres_helpers.experiments import distributed, runner, work
from attnres_helpers.experiments.specs import Dataset
from attnres_helpers.store import average_heads, load_curves, load_profiles, save_profiles

RUNS = (("rope", 0, "rope base 10000"), ("alibi", 1, "alibi slopes x1"))  # SHIPPED_AS labels

pytestmark = pytest.mark.usefixtures("in_process")  # every test: the runner's pool as threads


def _dataset(root: Path, seeds=(0, 1), measure: dict = TINY_MEASURE) -> Dataset:
    """The tiny family labelled as SHIPPED_AS settings, into ``root/store.safetensors``."""
    specs = [tiny_spec(root, enc, seed, config=label, measure=measure) for enc, seed, label in RUNS if seed in seeds]
    return Dataset(root / "store.safetensors", specs, {"command": "test", "measure": TINY_MEASURE})


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Two tiny runs trained and measured into one store; the root that holds runs/ and the store."""
    root = tmp_path_factory.mktemp("trained")
    with in_process_runner():
        runner.run_datasets([_dataset(root)], jobs=1, progress=False)
    return root


@pytest.fixture
def ds(trained, tmp_path) -> Dataset:
    return _dataset(Path(shutil.copytree(trained, tmp_path / "root")))


@pytest.fixture
def measured(monkeypatch) -> list[str]:
    """The names of the runs the runner trains and measures from here on."""
    names, real = [], runner.train_and_measure
    monkeypatch.setattr(
        runner, "train_and_measure", lambda spec, *a, **k: names.append(spec.name) or real(spec, *a, **k)
    )
    return names


def _runs(store: Path) -> set[str]:
    return {p.run for p in load_profiles(store)[0]}


def test_a_kept_run_is_measured_again_when_the_dataset_asks_other_multiples_or_windows(ds, measured):
    runner.run_datasets([ds], jobs=1, progress=False)
    assert measured == []  # the same settings: kept
    assert all(p.meta["measure"] == {"multiples": [1, 2], "n_windows": 2} for p in load_profiles(ds.store)[0])
    runner.run_datasets(
        [_dataset(ds.store.parent, measure={"multiples": (1, 2), "n_windows": 3})], jobs=1, progress=False
    )
    assert sorted(measured) == ["alibi-s1", "rope-s0"]
    assert {p.meta["measure"]["n_windows"] for p in load_profiles(ds.store)[0]} == {3}
    runner.run_datasets(
        [_dataset(ds.store.parent, measure={"multiples": (1,), "n_windows": 3})], jobs=1, progress=False
    )
    assert len(measured) == 4 and {p.eval_len for p in load_profiles(ds.store)[0]} == {16}


@pytest.mark.parametrize("header_windows, again", [(2, []), (5, ["alibi-s1", "rope-s0"])])
def test_a_run_stored_without_its_measuring_settings_is_judged_by_the_header(ds, measured, header_windows, again):
    """A store written before runs recorded ``measure``: its runs count as measured with the header's n_windows."""
    profiles, curves = load_profiles(ds.store)[0], load_curves(ds.store)
    old = [dataclasses.replace(p, meta={k: v for k, v in p.meta.items() if k != "measure"}) for p in profiles]
    save_profiles(ds.store, old, {"measure": {"multiples": [1, 2], "n_windows": header_windows}}, curves=curves)
    runner.run_datasets([ds], jobs=1, progress=False)
    assert sorted(measured) == again


def test_runs_a_dataset_does_not_list_are_kept_and_leave_only_by_name(ds, measured, capsys):
    """Only rope-s0 listed, and measured again (other windows), so the store is rewritten: alibi-s1 stays."""
    only_rope = _dataset(ds.store.parent, seeds=(0,), measure={"multiples": (1, 2), "n_windows": 3})
    alibi = [p for p in load_profiles(ds.store)[0] if p.run == "alibi-s1"]
    runner.run_datasets([only_rope], jobs=1, progress=False)
    assert measured == ["rope-s0"] and capsys.readouterr().out.splitlines() == [
        f"{ds.store} keeps, as they are, the runs its dataset does not list: alibi-s1 (--drop RUN)",
        f"{len(load_profiles(ds.store)[0])} profiles written to {ds.store}",
    ]
    kept = [p for p in load_profiles(ds.store)[0] if p.run == "alibi-s1"]
    assert [p.key for p in kept] == [p.key for p in alibi] and all(
        torch.equal(a.s_hat, b.s_hat) and a.meta == b.meta for a, b in zip(kept, alibi)
    )
    with pytest.raises(ValueError) as err:
        runner.run_datasets([only_rope], jobs=1, progress=False, drop=["alibi-s2"])
    assert str(err.value) == f"--drop alibi-s2: no run of that name in {ds.store}"
    runner.run_datasets([only_rope], jobs=1, progress=False, drop=["alibi-s1"])
    assert capsys.readouterr().out.splitlines() == [
        f"{ds.store}: dropping run alibi-s1 (--drop)",
        f"{len(load_profiles(ds.store)[0])} profiles written to {ds.store}",
    ]
    assert _runs(ds.store) == {"rope-s0"} and measured == ["rope-s0"]


@pytest.fixture
def family_v2(ds, monkeypatch):
    """run_family_v2 on the tiny dataset (its two runs labelled as SHIPPED_AS settings), in tmp_path."""
    monkeypatch.setattr(
        runner,
        "family_v2_dataset",
        lambda store, seeds, device, runs_root, extra=False: _dataset(ds.store.parent, seeds),
    )
    run = functools.partial(runner.run_family_v2, ds.store, runs_root=ds.store.parent / "runs")
    monkeypatch.setattr(experiments, "run_family_v2", run)  # what the CLI calls
    return run


def test_family_v2_holds_the_store_lock_for_the_whole_command(ds, family_v2, monkeypatch):
    shutil.rmtree(ds.specs[0].out_dir)  # seed 0 of a SHIPPED_AS setting: trained first, by train_specs
    ds.store.unlink()
    held = []

    def probe(where: str) -> None:
        try:
            with files.exclusive(ds.store):
                held.append((where, False))
        except RuntimeError:
            held.append((where, True))

    real_train_specs, real_work = runner.train_specs, runner.train_and_measure
    monkeypatch.setattr(
        runner, "train_specs", lambda specs, *a, **k: probe("first") or real_train_specs(specs, *a, **k)
    )
    monkeypatch.setattr(runner, "reuse_shipped", lambda runs_root: probe("reuse"))
    monkeypatch.setattr(runner, "train_and_measure", lambda spec, *a, **k: probe(spec.name) or real_work(spec, *a, **k))
    family_v2(jobs=1, progress=False)
    assert sorted(held) == [("alibi-s1", True), ("first", True), ("reuse", True), ("rope-s0", True)]
    assert _runs(ds.store) == {"rope-s0", "alibi-s1"}
    with files.exclusive(ds.store):  # another command holds it: refused at once, before anything trains
        with pytest.raises(RuntimeError, match=f"^{ds.store} is being written by"):
            family_v2(jobs=1, progress=False)
    assert len(held) == 4


def test_family_v2_measure_only_with_nothing_to_measure_says_so_and_writes_nothing(ds, family_v2, cli):
    before = ds.store.stat()
    result = cli("reproduce", "family-v2", "--measure-only")
    assert result.returncode == 0
    assert result.stdout == f"nothing needed measuring: {ds.store} already holds every run asked for; nothing written\n"
    after = ds.store.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # --drop reaches the runner; a dropped run the dataset lists (trained) is measured again
    result = cli("reproduce", "family-v2", "--measure-only", "--drop", "alibi-s1")
    assert result.stdout.splitlines() == [
        f"{ds.store}: dropping run alibi-s1 (--drop)",
        f"{len(load_profiles(ds.store)[0])} profiles written to {ds.store}",
    ]
    assert _runs(ds.store) == {"rope-s0", "alibi-s1"}


def _folder_store(ds):
    return dataclasses.replace(ds, store=ds.store.parent / "a-folder")


@pytest.mark.parametrize(
    "case, error",
    [
        ("folder", "store {root}/a-folder is a folder (or another non-file): give the path of a store file"),
        ("windows", "run rope-s0 ({root}/runs/rope-s0): ValueError: measure n_windows must be an integer >= 1, got 0"),
        ("drop", "--drop rope-s9: no run of that name in {root}/store.safetensors"),
        ("under a file", "cannot write {root}/store.safetensors/store.safetensors: "),  # its lock cannot be made
    ],
)
def test_inputs_are_checked_before_any_work(ds, family_v2, monkeypatch, case, error):
    shutil.rmtree(ds.store.parent / "runs")  # nothing trained: any work would show
    monkeypatch.setattr(runner, "train_specs", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setattr(runner, "train_and_measure", lambda *a, **k: pytest.fail("trained"))
    root = ds.store.parent
    call = functools.partial(runner.run_datasets, jobs=1, progress=False)
    if case == "folder":
        (root / "a-folder").mkdir()
        call = functools.partial(call, [_folder_store(ds)])
    elif case == "windows":
        call = functools.partial(call, [_dataset(root, measure={"multiples": (1,), "n_windows": 0})])
    elif case == "drop":
        call = functools.partial(family_v2, drop=["rope-s9"], progress=False)
    else:
        call = functools.partial(
            runner.run_family_v2, ds.store / "store.safetensors", runs_root=root / "runs", progress=False
        )
    with pytest.raises((ValueError, RuntimeError, OSError)) as err:
        call()
    assert str(err.value).startswith(error.format(root=root))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """A root as reproduce writes it (one tiny run, sealed), and its store: the root."""
    root = tmp_path_factory.mktemp("shipped")
    with in_process_runner():
        experiments.reproduce(*_reproduce_args(root), jobs=1, progress=False, **_SETTINGS)
    return root


_SETTINGS = {
    "model": {"train_len": 16, "n_layer": 1, "n_head": 2, "d_model": 16},
    "training": TINY_TRAINING,
    "measure": TINY_MEASURE,
}


def _reproduce_args(root: Path) -> tuple:
    return root / "ckpt", root / "results" / "default.safetensors", ("rope",), (0,)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("seal", ["deleted", "kept"])
def test_reproduce_never_reseals_a_changed_run_whose_store_is_complete(shipped, tmp_path, seal):
    root = Path(shutil.copytree(shipped, tmp_path / "shipped"))
    ckpt, run = root / "ckpt", root / "ckpt" / "rope-s0"
    _flip(run / "model.safetensors")
    if seal == "deleted":
        (run / "SHA256SUMS").unlink()
        message = f"finished run {run} has no SHA256SUMS: refused, never re-sealed; {RETRAIN}"
    else:
        (ckpt / "SHA256SUMS").unlink()
        message = (
            f"finished run {run} does not match its SHA256SUMS (a file changed, missing or unlisted): "
            f"refused, never re-sealed; {RETRAIN}"
        )
    before = {p: p.read_bytes() for p in ckpt.rglob("SHA256SUMS")}
    with pytest.raises(ValueError) as err:
        experiments.reproduce(*_reproduce_args(root), jobs=1, progress=False, **_SETTINGS)
    assert str(err.value) == message
    assert {p: p.read_bytes() for p in ckpt.rglob("SHA256SUMS")} == before
    with pytest.raises(ValueError, match="SHA256SUMS"):
        load_checkpoint(run)


def test_reused_shipped_runs_keep_their_own_seal(shipped, tmp_path):
    """reuse_shipped copies seeds 1 and 2 with their SHA256SUMS: the copies are finished, verified runs."""
    ckpt = tmp_path / "ckpt"
    for seed in (0, 1, 2):
        shutil.copytree(shipped / "ckpt" / "rope-s0", ckpt / f"rope-s{seed}")
    seal_root(ckpt)
    runs = tmp_path / "runs"
    shutil.copytree(ckpt / "rope-s0", runs / "rope-base-10000-s0")
    assert runner.reuse_shipped(runs, ckpt) == {"rope base 10000": True}
    for seed in (1, 2):
        copied = runs / f"rope-base-10000-s{seed}"
        assert sorted(p.name for p in copied.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors"]
        load_checkpoint(copied)


def test_hf_checkpoints_are_shipped_only_from_sealed_runs(shipped, tmp_path):
    runs = Path(shutil.copytree(shipped / "ckpt", tmp_path / "runs"))
    (runs / "rope-s0" / "SHA256SUMS").unlink()
    with pytest.raises(ValueError, match=r"^finished run .*rope-s0 has no SHA256SUMS"):
        runner.ship_hf_checkpoints(runs, tmp_path / "hf", ["rope-s0"])
    assert not (tmp_path / "hf").exists()


def test_a_read_only_store_folder_fails_before_any_run_naming_the_store(family, tmp_path):
    ds = family_dataset(tmp_path)
    ds.store.parent.mkdir(parents=True)
    with read_only(ds.store.parent):
        with pytest.raises(OSError) as err:
            runner.run_datasets([ds], jobs=2, progress=False)
    lock = ds.store.with_name("family.safetensors.lock")
    assert str(err.value) in (
        f"cannot write {ds.store}: its lock {lock} cannot be taken (Operation not permitted)",  # chattr +i (root)
        f"cannot write {ds.store}: its lock {lock} cannot be taken (Permission denied)",
    )  # chmod
    assert not (tmp_path / "runs").exists()  # nothing trained for a store that cannot be written


def test_a_dead_writers_store_temporary_is_removed_at_the_next_start(family, tmp_path):
    ds = family_dataset(tmp_path)
    shutil.copytree(family.store.parent, ds.store.parent)  # every run is in the store: nothing to run
    dead, alive = (
        ds.store.parent / f".family.safetensors.tmp-{dead_pid()}",
        ds.store.parent / f".family.safetensors.tmp-{os.getpid()}",
    )
    dead.write_bytes(b"half a store")
    alive.write_bytes(b"a live writer's")
    runner.run_datasets([ds], jobs=1, progress=False)
    assert not dead.exists() and alive.exists()  # only a dead process's temporary is debris
    alive.unlink()
    assert_same_tensors(ds.store, family.store)


def test_run_datasets_refuses_a_store_another_process_holds_and_a_killed_holders_lock_is_free(family, tmp_path):
    """files.exclusive is the kernel's flock: a live holder refuses the run, a killed one's lock is free at once
    (its file stays, holding a PID that is never trusted); more cases in tests/test_files.py."""
    ds = family_dataset(tmp_path)
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


def _drop_flocks(lock: Path) -> None:
    """Close this process's descriptors of ``lock`` (which drops their flock), as a kill would: a kill
    simulated in this process before files.exclusive's own close leaves its descriptor open."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == os.path.realpath(lock):
                os.close(int(fd))
        except OSError:  # the listing's own descriptor, gone
            pass


def test_a_kill_at_every_file_operation_of_a_store_write_leaves_the_old_or_the_new_store(family, tmp_path, monkeypatch):
    """The store holds the first run; the second (trained, measured here) is added. A kill at any file
    operation of the run leaves the old store or the new one, whole, and a rerun completes it."""
    base = tmp_path / "base"
    ds = family_dataset(base)
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
        counter = KillAt(m, None)
        runner.run_datasets([family_dataset(shutil.copytree(base, tmp_path / "count"))], jobs=1, progress=False)
    n_ops = counter.count
    assert n_ops >= 6 + 3  # one store write, the lock taken and released
    old_keys = sorted(p.key for p in first)
    new_keys = sorted(p.key for p in load_profiles(family.store)[0])
    for k in range(n_ops):
        copy = family_dataset(shutil.copytree(base, tmp_path / f"killed-{k}"))
        with monkeypatch.context() as m:
            kill = KillAt(m, k)
            with pytest.raises(Killed):
                runner.run_datasets([copy], jobs=1, progress=False)
            assert kill.fired
        lock = copy.store.with_name("family.safetensors.lock")
        _drop_flocks(lock)  # what the kernel does when a process is killed
        keys = sorted(p.key for p in load_profiles(copy.store)[0])  # loads: never a partial store
        assert keys in (old_keys, new_keys), k
        assert copy.store.read_bytes() == old or keys == new_keys, k
        runner.run_datasets([copy], jobs=1, progress=False)  # the rerun completes it
        assert_same_tensors(copy.store, family.store)
        assert debris(copy.store.parent) == []
        shutil.rmtree(copy.store.parent.parent)


def test_a_rerun_under_torchrun_merges_what_a_stopped_one_left_and_runs_the_rest(family, tmp_path, monkeypatch):
    """One rank, in this process: rope-s0 is in a part a stopped run left (its training finished), alibi-s1
    is not; rank 0 merges the part first, so only alibi-s1 is trained and measured."""
    ds = family_dataset(tmp_path)
    for spec in ds.specs:
        shutil.copytree(next(s for s in family.specs if s.name == spec.name).out_dir, spec.out_dir)
    rope = [p for p in load_profiles(family.store)[0] if p.run == "rope-s0"]
    save_profiles(distributed.part_path(ds.store, 1, 2), rope, ds.about)
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
    monkeypatch.setattr(work, "die_with_parent", lambda parent: None)  # not for the test process itself
    ran, real = [], work.train_and_measure
    monkeypatch.setattr(work, "train_and_measure", lambda spec, *a, **k: ran.append(spec.name) or real(spec, *a, **k))
    kept = distributed.run_datasets_distributed([ds], progress=False)[ds.store]
    assert ran == ["alibi-s1"] and {p.run for p in kept} == {"rope-s0", "alibi-s1"}
    assert_same_tensors(ds.store, family.store)
    assert sorted(p.name for p in ds.store.parent.iterdir() if p.suffix != ".lock") == ["family.safetensors"]


def test_parts_a_stopped_distributed_run_left_are_merged_at_the_next_start(family, tmp_path):
    ds = family_dataset(tmp_path)
    ds.store.parent.mkdir(parents=True)
    profiles = load_profiles(family.store)[0]
    save_profiles(ds.store, [p for p in profiles if p.run == "rope-s0"], ds.about)
    alibi = [p for p in profiles if p.run == "alibi-s1"]
    save_profiles(distributed.part_path(ds.store, 1, 2), alibi, ds.about)
    save_profiles(distributed.part_path(ds.store, 0, 3), alibi, ds.about)  # twice
    kept = distributed._merge_parts([ds])[ds.store]
    assert sorted(p.key for p in kept) == sorted(p.key for p in profiles)
    assert_same_tensors(ds.store, family.store)
    assert sorted(p.name for p in ds.store.parent.iterdir() if p.suffix != ".lock") == ["family.safetensors"]


def test_merged_int16_parts_are_returned_as_the_store_holds_them(family, tmp_path):
    """As family-v2 --distributed writes them: head means, the parts float32, the store int16 codes. The
    merge returns exactly what the store then holds (store.as_stored), the part's run included."""
    ds = dataclasses.replace(family_dataset(tmp_path), dtype=torch.int16, average_heads=True)
    ds.store.parent.mkdir(parents=True)
    profiles = average_heads(load_profiles(family.store)[0])
    save_profiles(ds.store, [p for p in profiles if p.run == "rope-s0"], ds.about, torch.int16)
    save_profiles(distributed.part_path(ds.store, 1, 2), [p for p in profiles if p.run == "alibi-s1"], ds.about)
    kept = {p.key: p for p in distributed._merge_parts([ds])[ds.store]}
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
        cli_main(["reproduce", "family-v2", "--distributed"])
    assert one_line(exit_info) == (
        "error: --distributed needs torchrun: "
        "`torchrun --nproc-per-node N -m attnres_helpers reproduce family-v2 --distributed`"
    )
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["reproduce", "family-v2"])
    assert one_line(exit_info) == (
        "error: started by torchrun (RANK and WORLD_SIZE are set): pass --distributed, or run it with plain python"
    )
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["reproduce", "family-v2", "--distributed"])
    assert one_line(exit_info) == "error: RANK must be in [0, WORLD_SIZE), got RANK=2, WORLD_SIZE=2"
