"""The shipped experiment, run end to end on tiny models in tmp_path: train, measure, store, verify,
re-measure. Nothing here reads data/checkpoints/ or data/results/ (they may be being regenerated). The
runner's workers are threads of this process (helpers.InProcessPool); its real process pool is tested in
tests/test_runner_processes.py."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import TINY_MEASURE, TINY_TRAINING, in_process_runner

from attnres_helpers import experiments
from attnres_helpers.model import preset
from attnres_helpers.store import as_stored, load_curves, load_profiles, records
from attnres_helpers.tables import record_mismatches

TINY = {"train_len": 16, "n_layer": 2, "n_head": 2, "d_model": 32}
ENCODINGS, SEEDS = ("rope", "sinusoidal"), (0, 1)


SETTINGS = {"model": TINY, "training": TINY_TRAINING, "measure": TINY_MEASURE}

pytestmark = pytest.mark.usefixtures("in_process")  # every test: the runner's pool as threads


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    store = root.parent / "results" / "default.safetensors"
    with in_process_runner():
        profiles = experiments.reproduce(
            root, store, encodings=ENCODINGS, seeds=SEEDS, jobs=1, progress=False, **SETTINGS
        )
    remeasured = experiments.measure_checkpoints(root, ENCODINGS, SEEDS, progress=False, **TINY_MEASURE)
    return root, store, profiles, remeasured


def test_reproduce_writes_every_checkpoint_and_the_store(tiny_run):
    root, store, profiles, _ = tiny_run
    for enc in ENCODINGS:
        for seed in SEEDS:
            d = experiments.checkpoint_dir(enc, seed, root)
            assert sorted(p.name for p in d.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors"]
            config = json.loads((d / "config.json").read_text())
            assert config["model"] == preset("default", encoding=enc, **TINY).to_dict()
            assert {k: config["train"][k] for k in TINY_TRAINING} == TINY_TRAINING and config["train"]["seed"] == seed
    # rope: 2 lengths x (no BCA, BCA); sinusoidal: 2 lengths, no BCA
    assert sorted((p.run, p.eval_len, p.bca) for p in profiles) == sorted(
        [(f"rope-s{s}", T, bca) for s in SEEDS for T in (16, 32) for bca in (False, True)]
        + [(f"sinusoidal-s{s}", T, False) for s in SEEDS for T in (16, 32)]
    )
    loaded, about = load_profiles(store)
    assert about == {
        "command": experiments.REPRODUCE_COMMAND,
        "measure": {"multiples": [1, 2], "n_windows": 2},
        "training": TINY_TRAINING,
    }
    assert sorted(p.key for p in loaded) == sorted(p.key for p in profiles)
    by_key = {p.key: p for p in profiles}
    for p in loaded:  # exactly the arrays reproduce returns: the measured ones as stored (store.as_stored)
        assert torch.equal(p.s_hat, by_key[p.key].s_hat) and torch.equal(p.nll, by_key[p.key].nll)
        assert p.meta == json.loads(json.dumps(by_key[p.key].meta))
    meta = by_key["rope-s1/32/1"].meta
    assert (meta["encoding"], meta["seed"], meta["train_len"]) == ("rope", 1, 16)
    assert meta["model"]["xpos_scale_base"] == 8.0 and meta["training"]["steps"] == TINY_TRAINING["steps"]


def test_load_results_are_the_records_of_the_store(tiny_run):
    _, store, profiles, _ = tiny_run
    shipped = experiments.load_results(store)
    again = records(load_profiles(store)[0], curves=load_curves(store))
    assert [{k: v for k, v in r.items() if "resolution" not in k} for r in shipped] == [
        {k: v for k, v in r.items() if "resolution" not in k} for r in again
    ]
    for a, b in zip(shipped, again):  # R to float precision: SIMD reductions may round differently run to run
        assert a["resolution"] == pytest.approx(b["resolution"], rel=1e-12, abs=1e-15)
        assert a["resolution_sink_free"] == pytest.approx(b["resolution_sink_free"], rel=1e-12, abs=1e-15)
    assert record_mismatches(shipped, records(profiles)) == []
    # per model: profiles x 2 head modes x (2 layers + "mean" + "upper")
    per_model = {"rope": 4 * 2 * 4, "sinusoidal": 2 * 2 * 4}
    for enc, n in per_model.items():
        for seed in SEEDS:
            assert sum(r["encoding"] == enc and r["seed"] == seed for r in shipped) == n
    drop = experiments.load_results(store, boundary="drop")
    assert [r["boundary"] for r in drop] == ["drop"] * len(shipped)
    for a, b in zip(drop, shipped):
        assert {k: v for k, v in a.items() if k != "boundary" and "resolution" not in k} == {
            k: v for k, v in b.items() if k != "boundary" and "resolution" not in k
        }
        if a["bca"] and a["eval_len"] > a["train_len"]:  # BCA masks the far distances: p_{N-1} = 0, no boundary term
            assert a["resolution"] == pytest.approx(b["resolution"], rel=1e-12)
        else:  # drop leaves out the last term, p_{N-1}² > 0
            assert a["resolution"] < b["resolution"]
    assert [a["perplexity"] for a in drop] == [b["perplexity"] for b in shipped]


def test_remeasuring_the_checkpoints_gives_the_stored_profiles(tiny_run):
    _, _, profiles, remeasured = tiny_run
    by_key = lambda ps: sorted(ps, key=lambda p: p.key)  # noqa: E731
    assert [p.key for p in by_key(remeasured)] == [p.key for p in by_key(profiles)]
    stored_as = experiments.default_dataset().dtype  # int16 codes: compared like with like, through as_stored
    for a, b in zip(by_key(as_stored(remeasured, stored_as)), by_key(profiles)):
        assert torch.equal(a.s_hat, b.s_hat) and torch.equal(a.nll, b.nll) and a.meta == b.meta
        assert torch.equal(a.key0, b.key0)


def test_sha256sums_name_every_checkpoint_file(tiny_run):
    root = tiny_run[0]
    lines = (root / "SHA256SUMS").read_text().splitlines()
    assert len(lines) == 2 * 2 * 3  # 4 models x (weights, config, their own SHA256SUMS)
    assert all(len(line.split("  ")[0]) == 64 for line in lines)
    assert sorted(line.split("  ")[1] for line in lines) == sorted(
        f"{e}-s{s}/{f}" for e in ENCODINGS for s in SEEDS for f in ("SHA256SUMS", "config.json", "model.safetensors")
    )
    assert experiments.sha256sums(root) == (root / "SHA256SUMS").read_text()
    experiments.verify_checkpoints(root)  # no error


def _flip_byte(path, offset=-10):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _rope_to_alibi(path):
    text = path.read_text()
    assert '"rope"' in text
    path.write_text(text.replace('"rope"', '"alibi"'))


@pytest.mark.parametrize(
    "name, tamper",
    [
        ("rope-s0/model.safetensors", _flip_byte),
        ("rope-s0/config.json", _rope_to_alibi),
        ("sinusoidal-s1/model.safetensors", lambda p: _flip_byte(p, offset=200)),
    ],
)
def test_a_tampered_checkpoint_is_refused(tiny_run, tmp_path, name, tamper):
    root = shutil.copytree(tiny_run[0], tmp_path / "ckpt")
    experiments.verify_checkpoints(root)
    tamper(root / name)
    with pytest.raises(ValueError, match=f"{root / name} does not match SHA256SUMS"):
        experiments.verify_checkpoints(root)
    # measured or not, any tampered file under root stops the measurement before a model is built
    with pytest.raises(ValueError, match=str(root / name)):
        experiments.measure_checkpoints(root, encodings=("rope",), seeds=(0,), progress=False)


def test_missing_extra_and_malformed_checkpoint_files_are_refused(tiny_run, tmp_path):
    root = shutil.copytree(tiny_run[0], tmp_path / "ckpt")
    (root / "rope-s1" / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"rope-s1/model\.safetensors is listed in SHA256SUMS but missing"):
        experiments.verify_checkpoints(root)
    shutil.copy(tiny_run[0] / "rope-s1" / "model.safetensors", root / "rope-s1")
    (root / "rope-s1" / "extra.json").write_text("{}")
    with pytest.raises(ValueError, match=r"rope-s1/extra\.json is not listed in SHA256SUMS"):
        experiments.verify_checkpoints(root)
    (root / "rope-s1" / "extra.json").unlink()
    experiments.verify_checkpoints(root)
    (root / "SHA256SUMS").write_text("not a sum  rope-s0/config.json\n")
    with pytest.raises(ValueError, match="SHA256SUMS has a malformed line"):
        experiments.verify_checkpoints(root)
    (root / "SHA256SUMS").unlink()
    with pytest.raises(FileNotFoundError, match="SHA256SUMS is missing"):
        experiments.measure_checkpoints(root, encodings=("rope",), seeds=(0,), progress=False)


def test_reproduce_reuses_finished_runs(tiny_run, monkeypatch):
    """A second reproduce trains nothing: train() finds each finished run and loads it (same wall time)."""
    root, store = tiny_run[0], tiny_run[1]
    from attnres_helpers.experiments import work

    calls = []
    real_train = work.train
    monkeypatch.setattr(work, "train", lambda *a, **k: calls.append(k) or real_train(*a, **k))
    spec = experiments.default_dataset(root, store, ("rope",), (0,), **SETTINGS).specs[0]
    summary = work.train_spec(spec)
    saved = json.loads((experiments.checkpoint_dir("rope", 0, root) / "config.json").read_text())
    assert calls and summary["results"]["wall_s"] == saved["results"]["wall_s"]  # loaded, not retrained


def test_load_results_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="reproduce"):
        experiments.load_results(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ValueError, match="bad.safetensors"):
        experiments.load_results(bad)


def test_family_settings():
    assert len(experiments.FAMILY) == 21
    specs = experiments.family_specs(seeds=(0, 1), runs_root=Path("/nonexistent"))
    assert len(specs) == 42 and len({s.name for s in specs}) == 42
    by_name = {s.name: s for s in specs}
    xpos = by_name["xpos-B-64--gamma-1-6-s1"]
    assert (xpos.cfg.encoding, xpos.cfg.scale_base, xpos.cfg.xpos_gamma, xpos.seed) == ("xpos", 64.0, 1.6, 1)
    assert xpos.meta["config"] == "xpos B 64, gamma 1.6" and xpos.meta["model"]["train_len"] == 128
    alibi = by_name["alibi-slopes-x0-25-s0"]
    assert alibi.cfg.alibi_slope_scale == 0.25 and alibi.meta["params"] == {"alibi_slope_scale": 0.25}
    assert by_name["rope-base-100000-s0"].cfg.rope_base == 1e5
    assert {s.cfg.encoding for s in specs} == {"rope", "xpos", "alibi", "sinusoidal", "nope"}
    assert all(s.training == {**experiments.TRAINING, "steps": 400, "warmup": 40} and s.cfg.n_layer == 4 for s in specs)
    assert all(s.meta["training"]["steps"] == 400 and s.meta["training"]["weight_decay"] == 0.1 for s in specs)
    assert [s.seed for s in specs] == [0] * 21 + [1] * 21  # seed by seed: a stopped run keeps every member
    ds = experiments.family_dataset(seeds=(0,), device="cuda")
    assert ds.dtype == torch.int16 and ds.average_heads and len(ds.specs) == 21
    assert ds.about["command"].endswith("--device cuda")


def test_run_datasets_trains_measures_and_then_keeps(tmp_path):
    """One tiny run through the runner's pool; a second call finds it in the store and re-runs nothing."""
    spec = experiments.RunSpec(
        "tiny-rope-s3",
        preset("tiny"),
        3,
        tmp_path / "runs" / "tiny-rope-s3",
        training=TINY_TRAINING,
        extra={"config": "tiny"},
        measure=dict(TINY_MEASURE),
    )
    store = tmp_path / "store.safetensors"
    ds = experiments.Dataset(store, [spec], {"command": "test"})
    kept = experiments.run_datasets([ds], jobs=1, progress=False)[store]
    assert sorted((p.eval_len, p.bca) for p in kept) == [(16, False), (16, True), (32, False), (32, True)]
    loaded, about = load_profiles(store)
    assert about == {"command": "test"} and [p.key for p in loaded] == sorted(p.key for p in kept)
    meta = loaded[0].meta
    assert (
        meta["config"] == "tiny"
        and meta["seed"] == 3
        and set(meta["trained"]) == {"train_loss", "val_loss", "wall_s", "tokens_per_s", "device"}
    )
    before = store.stat().st_mtime_ns
    again = experiments.run_datasets([ds], jobs=1, progress=False)[store]
    assert store.stat().st_mtime_ns == before and [p.key for p in again] == [p.key for p in loaded]
    # the same spec now asking for the copy probe, whose curves the store lacks, is measured again
    probed = experiments.Dataset(store, [dataclasses.replace(spec, probe=True)], {"command": "test"})
    experiments.run_datasets([probed], jobs=1, progress=False)
    assert store.stat().st_mtime_ns != before and set(load_curves(store)) == {(spec.name, False), (spec.name, True)}
    # a spec whose metadata changed is run again
    changed = experiments.Dataset(
        store,
        [
            experiments.RunSpec(
                spec.name,
                spec.cfg,
                spec.seed,
                tmp_path / "other",
                TINY_TRAINING,
                {"config": "tiny, changed"},
                dict(TINY_MEASURE),
            )
        ],
        {"command": "test"},
    )
    rerun = experiments.run_datasets([changed], jobs=1, progress=False)[store]
    assert {p.meta["config"] for p in rerun} == {"tiny, changed"}
    assert {p.meta["config"] for p in load_profiles(store)[0]} == {"tiny, changed"}


def test_a_dataset_that_averages_heads_stores_the_head_means_as_int16_codes(tmp_path):
    """average_heads: one "head" per layer, mean-scores R as from every head, mean-R not recorded;
    the copy probe stored beside the profiles where the spec asks for it."""
    spec = experiments.RunSpec(
        "tiny-rope-s4",
        preset("tiny"),
        4,
        tmp_path / "runs" / "tiny-rope-s4",
        training=TINY_TRAINING,
        measure=dict(TINY_MEASURE),
        probe=True,
    )
    store = tmp_path / "store.safetensors"
    full = experiments.run_datasets([experiments.Dataset(store, [spec], {})], jobs=1, progress=False)[store]
    averaged = tmp_path / "averaged.safetensors"
    ds = experiments.Dataset(averaged, [spec], {}, torch.int16, average_heads=True)
    kept = {p.key: p for p in experiments.run_datasets([ds], jobs=1, progress=False)[averaged]}
    loaded = {p.key: p for p in load_profiles(averaged)[0]}
    for p in full:
        q = loaded[p.key]
        assert q.s_hat.shape[1] == 1 and q.heads_averaged and kept[p.key].heads_averaged
        torch.testing.assert_close(q.layer_resolutions(), p.layer_resolutions(), rtol=1e-3, atol=1e-9)
    assert {r["head_mode"] for r in records(list(loaded.values()))} == {"mean-scores"}
    assert set(load_curves(averaged)) == {("tiny-rope-s4", False), ("tiny-rope-s4", True)}
