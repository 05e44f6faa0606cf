"""attnres_helpers.measure: the one window loop (window_loop, its keepers Sums and WindowFiles) and every
measurement on it."""

import ast
import json
from pathlib import Path

import pytest
import torch

from attnres_helpers.files import differing_settings
from attnres_helpers.measure import Sums, WindowFiles, attention_scores, measure_windows, window_loop
from attnres_helpers.metric import ScoreAccumulator
from attnres_helpers.model import Transformer, preset

PACKAGE = Path(__file__).resolve().parents[1] / "attnres_helpers"


def test_the_loop_returns_each_total_over_n_and_continues_where_it_stopped():
    """Each statistic summed over every batch, divided by the number of windows (not of batches); started
    from the sums and count of the first 4 windows (a work file's), it gives what one uninterrupted loop
    gives; per-window values are stacked, and the work file is written after each batch."""
    windows = torch.arange(14.0).reshape(7, 2)  # (n, T+1)
    seen = []

    def statistics(batch):
        return {"x": batch.sum(0).double(), "window/first": batch[:, 0]}

    whole = window_loop(windows, statistics, Sums(save=lambda s: seen.append((s.count, float(s.sums["x"][0])))), 3)
    torch.testing.assert_close(whole.means()["x"], windows.mean(0).double(), rtol=0, atol=1e-12)
    assert seen == [(3, 6.0), (6, 30.0), (7, 42.0)]  # after each batch: windows done, the running sum
    assert whole.sums["window/first"].tolist() == windows[:, 0].tolist() and set(whole.means()) == {"x"}
    first = Sums({"x": windows[:4].sum(0).double(), "window/first": windows[:4, 0]}, count=4)
    resumed = window_loop(windows, statistics, first, batch_size=2)
    torch.testing.assert_close(resumed.means()["x"], whole.means()["x"], rtol=0, atol=1e-12)
    assert torch.equal(resumed.sums["window/first"], whole.sums["window/first"])


def test_window_files_are_written_after_each_window_and_a_rerun_measures_only_the_rest(tmp_path):
    """The configurations' keeping: one file per window with its settings; a rerun skips the files there,
    one written under other settings is refused naming the keys that differ, and ``share`` splits the rest."""
    paths = [tmp_path / f"w{i}.safetensors" for i in range(5)]
    settings = [{"window": i, "n": 5} for i in range(5)]

    def read(path):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            return json.loads(f.metadata()["settings"])

    measured = []

    def measure(batch):
        measured.append(batch[0])
        return {"x": torch.tensor([float(batch[0])])}

    kept = WindowFiles(paths, settings, [{"trials": []}] * 5, read)
    window_loop(list(range(5)), measure, kept, share=(1, 2))
    assert measured == [1, 3] and [p.exists() for p in paths] == [False, True, False, True, False]
    window_loop(list(range(5)), measure, WindowFiles(paths, settings, [{}] * 5, read))
    assert measured == [1, 3, 0, 2, 4]
    # ranks own their windows: a rank that starts after another has finished still measures its own
    later = [tmp_path / f"r{i}.safetensors" for i in range(5)]
    measured.clear()
    window_loop(list(range(5)), measure, WindowFiles(later, settings, [{}] * 5, read), share=(0, 2))
    window_loop(list(range(5)), measure, WindowFiles(later, settings, [{}] * 5, read), share=(1, 2))
    assert measured == [0, 2, 4, 1, 3] and all(p.exists() for p in later)
    changed = [{**s, "added_later": True} for s in settings]
    with pytest.raises(ValueError, match=r"w0.safetensors was written with other settings \(added_later\)"):
        window_loop(list(range(5)), measure, WindowFiles(paths, changed, [{}] * 5, read))


def test_the_settings_check_names_every_key_that_differs_a_setting_added_later_included():
    """One check for every file written under settings (work files, window files, a store's entries): keyed
    by the settings themselves, so a setting added after the file was written differs unasked."""
    stored = json.loads(json.dumps({"lengths": (8, 16), "bos": None, "model": "m"}))
    assert differing_settings(stored, {"lengths": [8, 16], "bos": None, "model": "m"}) == []
    assert differing_settings(stored, {"lengths": [8, 16], "bos": None, "model": "m", "new": 0}) == ["new"]
    assert differing_settings(stored, {"lengths": [8], "bos": 1, "model": "m"}) == ["bos", "lengths"]
    assert differing_settings({"k": None}, {}) == ["k"]  # absent is not null


MEASUREMENTS = {  # every measurement, and the function of it that measures windows
    "measure.py": "measure_windows",
    "hf/pretrained.py": "measure_store",
    "hf/configured.py": "measure_configurations",
    "hf/sinks.py": "measure_sinks",
}


@pytest.mark.parametrize("module, function", MEASUREMENTS.items())
def test_every_measurement_runs_through_the_one_window_loop(module, function):
    """DESIGN.md: measure.window_loop is the one window loop. Each measurement calls it, and none holds a
    loop of its own over windows (a for or while loop in its measuring function; its jobs are planned in
    comprehensions)."""
    tree = ast.parse((PACKAGE / module).read_text())
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    calls = {n.func.id for n in ast.walk(body) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "window_loop" in calls, f"{module}:{function} does not call measure.window_loop"
    loops = [n for n in ast.walk(body) if isinstance(n, (ast.For, ast.While)) and _over_windows(n)]
    assert not loops, f"{module}:{function} has a window loop of its own (line {loops[0].lineno})"
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert "mean_over_windows" not in defined


def _over_windows(loop) -> bool:
    """Whether a loop measures in its own body: it calls a measuring function (a forward pass, a window's
    statistics), outside the functions it defines for window_loop (a loop over lengths or arrangements may
    hand window_loop one measuring function each)."""
    measuring = {"window_statistics", "measure_window", "key_weights", "forward_with_scores", "window_pass"}
    todo, names = list(ast.iter_child_nodes(loop)), set()
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            names.add(node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", ""))
        todo.extend(ast.iter_child_nodes(node))
    return bool(names & measuring)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_measure_windows_is_the_mean_of_each_windows_own_measurement_for_any_batch_size(encoding):
    """ŝ, key0 and NLL of 5 windows are the mean of each window measured alone, whatever the batch size
    (a batch of 2 leaves a last batch of 1). The scores are float32, and a batch's matrix products may be
    summed in another order than one window's (thread count, kernel choice): 1e-5 relative covers that;
    a batch's sum taken for its mean would be off by the batch size."""
    torch.manual_seed(0)
    model = Transformer(preset("tiny", encoding=encoding)).eval()
    windows = torch.randint(0, 256, (5, model.cfg.train_len + 1))
    alone = []
    for window in windows:
        accumulators = []
        for layer_scores in attention_scores(model, window[None, :-1]):  # (1, H, T, T)
            accumulators.append(ScoreAccumulator())
            accumulators[-1].update(layer_scores)
        alone.append(torch.stack([a.mean() for a in accumulators]))  # (layers, H, T)
    expected = torch.stack(alone).mean(0)
    for batch_size in (1, 2, 5):
        m = measure_windows(model, windows, batch_size=batch_size)
        torch.testing.assert_close(m["s_hat"], expected, rtol=1e-5, atol=1e-6)
        assert m["nll"].shape == (model.cfg.train_len,) and m["key0"].shape == expected.shape
    one, two = measure_windows(model, windows, batch_size=1), measure_windows(model, windows, batch_size=2)
    for name in ("key0", "nll"):
        torch.testing.assert_close(one[name], two[name], rtol=1e-5, atol=1e-6)
