"""The runner (attnres_helpers.experiments.runner) in this process, its pool replaced by threads, on tiny
runs in tmp_path: which runs a store keeps, drops and measures again, the store's lock over a whole
command, what it prints, inputs checked before any work, and seals written only over verified weights."""

from __future__ import annotations

import dataclasses
import functools
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from attnres_helpers import experiments, files
from attnres_helpers.checkpoints import RETRAIN, load_checkpoint, seal_root
from attnres_helpers.experiments import runner
from attnres_helpers.experiments.specs import Dataset, RunSpec
from attnres_helpers.model import preset
from attnres_helpers.store import load_curves, load_profiles, save_profiles

TRAINING = {"steps": 4, "batch_tokens": 64, "lr": 1e-3, "warmup": 1}
MEASURE = {"multiples": (1, 2), "n_windows": 2}
RUNS = (("rope-s0", "rope", 0, "rope base 10000"), ("alibi-s1", "alibi", 1, "alibi slopes x1"))  # SHIPPED_AS labels


def _threads(jobs: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, jobs))


@pytest.fixture(autouse=True)
def in_process(monkeypatch):
    """The runner's pool as threads: the same parent loop, and a monkeypatch reaches the workers."""
    monkeypatch.setattr(runner, "_pool", _threads)


def _dataset(root: Path, seeds=(0, 1), measure: dict = MEASURE) -> Dataset:
    specs = [
        RunSpec(
            name,
            preset("tiny", encoding=enc),
            seed,
            root / "runs" / name,
            dict(TRAINING),
            {"config": label},
            dict(measure),
        )
        for name, enc, seed, label in RUNS
        if seed in seeds
    ]
    return Dataset(root / "store.safetensors", specs, {"command": "test", "measure": MEASURE})


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Two tiny runs trained and measured into one store; the root that holds runs/ and the store."""
    root = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(runner, "_pool", _threads)
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
    result = cli("family-v2", "--measure-only")
    assert result.returncode == 0
    assert result.stdout == f"nothing needed measuring: {ds.store} already holds every run asked for; nothing written\n"
    after = ds.store.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # --drop reaches the runner; a dropped run the dataset lists (trained) is measured again
    result = cli("family-v2", "--measure-only", "--drop", "alibi-s1")
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
    with pytest.MonkeyPatch.context() as m:
        m.setattr(runner, "_pool", _threads)
        experiments.reproduce(*_reproduce_args(root), jobs=1, progress=False, **_SETTINGS)
    return root


_SETTINGS = {
    "model": {"train_len": 16, "n_layer": 1, "n_head": 2, "d_model": 16},
    "training": TRAINING,
    "measure": MEASURE,
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
