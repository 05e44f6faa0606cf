"""The shipped experiment, run end to end on tiny models: train, measure, write, re-measure."""

import json

import pytest
import torch

from attnres_helpers import experiments
from attnres_helpers.tables import record_mismatches

TINY = {"train_len": 16, "n_layer": 2, "n_head": 2, "d_model": 32}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ckpt")
    results = root / "results.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(experiments, "MODEL", TINY)
        mp.setattr(experiments, "TRAINING", {"steps": 6, "batch_tokens": 64, "lr": 1e-3, "warmup": 2})
        mp.setattr(experiments, "MEASURE", {"multiples": (1, 2), "n_windows": 3})
        records = experiments.reproduce(root, results, encodings=("rope", "sinusoidal"), seeds=(0, 1), jobs=1,
                                        progress=False)
        remeasured = experiments.measure_checkpoints(root, ("rope", "sinusoidal"), (0, 1), progress=False)
    return root, results, records, remeasured


def test_reproduce_writes_every_checkpoint_and_record(tiny_run):
    root, results, records, _ = tiny_run
    for enc in ("rope", "sinusoidal"):
        for seed in (0, 1):
            d = experiments.checkpoint_dir(enc, seed, root)
            assert (d / "model.safetensors").is_file() and (d / "config.json").is_file()
    shipped = experiments.load_results(results)
    assert shipped == records
    # rope: 2 lengths x (no BCA, BCA); sinusoidal: 2 lengths, no BCA; each x 2 head modes x (2 layers + mean)
    per_model = {"rope": 2 * 2 * 2 * 3, "sinusoidal": 2 * 2 * 3}
    for enc, n in per_model.items():
        for seed in (0, 1):
            assert sum(r["encoding"] == enc and r["seed"] == seed for r in records) == n
    assert json.loads(results.read_text())["command"] == experiments.REPRODUCE_COMMAND


def test_remeasuring_the_checkpoints_gives_the_shipped_records(tiny_run):
    _, _, records, remeasured = tiny_run
    assert record_mismatches(remeasured, records) == []


def test_sha256sums_name_every_checkpoint_file(tiny_run):
    root = tiny_run[0]
    lines = (root / "SHA256SUMS").read_text().splitlines()
    assert len(lines) == 2 * 2 * 2  # 4 models x (weights, config)
    assert all(len(line.split("  ")[0]) == 64 for line in lines)
    assert experiments.sha256sums(root) == (root / "SHA256SUMS").read_text()


def test_reproduce_reuses_finished_runs(tiny_run, monkeypatch):
    root, results, records, _ = tiny_run
    calls = []
    monkeypatch.setattr(experiments, "MODEL", TINY)
    monkeypatch.setattr(experiments, "TRAINING", {"steps": 6, "batch_tokens": 64, "lr": 1e-3, "warmup": 2})
    real_train = experiments.train
    monkeypatch.setattr(experiments, "train", lambda *a, **k: calls.append(k) or real_train(*a, **k))
    wall = experiments.train_one(experiments.model_config("rope"), 0, experiments.checkpoint_dir("rope", 0, root))
    saved = json.loads((experiments.checkpoint_dir("rope", 0, root) / "config.json").read_text())
    assert calls and wall == saved["results"]["wall_s"]  # loaded, not retrained: same wall time


def test_load_results_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="reproduce"):
        experiments.load_results(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        experiments.load_results(bad)
    bad.write_text(json.dumps({"no_records": []}))
    with pytest.raises(ValueError, match="bad.json"):
        experiments.load_results(bad)
