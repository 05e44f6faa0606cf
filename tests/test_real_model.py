"""attnres_helpers.real_model (notebook 07's queries): its rows on a tiny synthetic store with known answers."""

import math

import pytest
import torch

from attnres_helpers import real_model
from attnres_helpers.metric import mean_over_heads
from attnres_helpers.store import Profile, as_stored, load_profiles, save_profiles

L = 16
LENGTHS = (8, 16, 32)


def run(name="smol", key0=True, windows=True, nll_first=1.0, nll_past=2.0):
    """One run at T = L/2, L, 2L (causal) and 2L (BCA): random ŝ (and key-0 scores), NLL steps at L."""
    g = torch.Generator().manual_seed(0)
    meta = {"encoding": "rope", "seed": 0, "train_len": L}
    if windows:
        meta["windows"] = {str(T): T // 4 for T in LENGTHS}
    profiles = []
    for T, bca in [(T, False) for T in LENGTHS] + [(2 * L, True)]:
        s_hat = torch.randn(3, 1, T, generator=g)
        nll = torch.tensor([nll_first] * min(T, L) + [nll_past] * max(0, T - L), dtype=torch.float64)
        k0 = s_hat + torch.rand(3, 1, T, generator=g) if key0 else None
        profiles.append(Profile(name, meta, T, bca, s_hat, nll, k0))
    return profiles


def test_length_rows_are_the_store_query_and_the_same_window_nll():
    profiles = run()
    rows = real_model.length_rows(profiles)
    assert [(r["T"], r["mask"]) for r in rows] == [(8, "causal"), (16, "causal"), (32, "causal"), (32, "BCA")]
    for row, p in zip(rows, sorted(profiles, key=lambda p: (p.eval_len, p.bca))):
        r, free = float(p.layer_resolutions().mean()), float(p.layer_resolutions(sink=False).mean())
        assert row["R"] == r and row["R sink-free"] == free and row["sink share"] == pytest.approx(1 - free / r)
        assert row["windows"] == p.eval_len // 4 and row["NLL < L"] == 1.0
        assert row["NLL ≥ L"] == (2.0 if p.eval_len > L else None)
        weights = torch.softmax(mean_over_heads(p.s_hat.double()), -1)[:, -1]
        assert row["max p(T−1)"] == pytest.approx(float(weights.max()), rel=1e-12)


def test_length_rows_of_a_store_without_windows_or_key0_scores_say_so():
    """Our own models' stores record no windows, and old ones no key-0 scores: None, not a KeyError."""
    rows = real_model.length_rows(run(key0=False, windows=False))
    assert all(r["windows"] is None and r["R sink-free"] is None and r["sink share"] is None for r in rows)
    with pytest.raises(ValueError, match="run 'smol' has no key-0 scores"):
        real_model.layer_rows(run(key0=False), [L, 2 * L], sink=False)


def test_layer_rows_give_each_layers_r_and_its_ratio(tmp_path):
    save_profiles(tmp_path / "s.safetensors", run())
    profiles, _ = load_profiles(tmp_path / "s.safetensors")
    rows = real_model.layer_rows(profiles, [L, 2 * L])
    stored = {p.eval_len: p.layer_resolutions() for p in as_stored(run()) if not p.bca}
    assert [r["layer"] for r in rows] == [0, 1, 2]
    for layer, row in enumerate(rows):
        assert row[f"R({L})"] == pytest.approx(float(stored[L][layer]), rel=1e-12)
        assert row["R(2L)/R(L)"] == pytest.approx(row[f"R({2 * L})"] / row[f"R({L})"], rel=1e-12)
    assert "R(2L)/R(L)" not in real_model.layer_rows(profiles, [8])[0]


def test_sink_score_and_side_by_side_rows():
    profiles = run()
    (row,) = real_model.sink_score_rows(profiles, 1, [2 * L], far=4)
    s = mean_over_heads(profiles[2].s_hat.double())[1]
    assert row["gap (nats)"] == pytest.approx(float(s[-1] - s[-4])) and row["ŝ[T−4]"] == float(s[-4])
    rows = real_model.side_by_side_rows({"a": profiles, "b": run("other", key0=False)}, [8, 2 * L])
    assert [(r["model"], r["T / L"]) for r in rows] == [("a", "1/2"), ("a", "2"), ("b", "1/2"), ("b", "2")]
    assert rows[1]["perplexity"] == pytest.approx(math.exp(1.5)) and rows[3]["R sink-free"] is None


@pytest.mark.parametrize(
    "call",
    [
        lambda ps: real_model.length_rows(ps),
        lambda ps: real_model.layer_rows(ps, [L, 2 * L]),
        lambda ps: real_model.sink_score_rows(ps, 0, [L]),
        lambda ps: real_model.resolution_length_figure(ps, [L, 2 * L], [0]),
        lambda ps: real_model.position_nll_figure(ps, 2 * L, window=4),
    ],
)
def test_a_multi_run_store_is_refused_not_read_as_its_last_run(call):
    """Two runs' profiles used to overwrite each other by length (four rows of whichever came last)."""
    with pytest.raises(ValueError, match=r"got profiles of 2 runs \('smol', 'other'\): pass \[p for p in profiles"):
        call(run() + run("other"))


def test_a_length_not_measured_is_named():
    with pytest.raises(ValueError, match=r"run 'smol' has no causal profile at T = 64; it has \[8, 16, 32\]"):
        real_model.layer_rows(run(), [L, 64])


def test_attention_spans_and_layer_kinds_of_a_sliding_window_layer():
    s_hat = torch.zeros(2, 1, 32)
    s_hat[1, :, 8:] = -math.inf  # layer 1 attends within a window of 8
    p = Profile("g", {"encoding": "rope", "seed": 0, "train_len": 64}, 32, False, s_hat, torch.ones(32))
    assert real_model.attention_spans(p) == [32, 8]
    assert real_model.layer_kinds(p) == {"global": [0], "window 8": [1], "all": [0, 1]}
