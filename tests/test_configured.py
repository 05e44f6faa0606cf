"""Plan v3's store and analysis on synthetic window files with known answers (no model needed)."""

import json
import math
from itertools import permutations

import numpy as np
import pytest
import torch

from attnres_helpers import configured_analysis as ca
from attnres_helpers import configured_store as cs
from attnres_helpers.files import save_safetensors
from attnres_helpers.metric import layer_resolution
from attnres_helpers.passkey import KEY_DIGITS
from attnres_helpers.paths import STORES
from attnres_helpers.stats import spearman

L, LAYERS, H = 1024, 2, 3
CONFIGS = {"as-trained": None, "bca": {"kind": "bca", "size": 512, "sinks": 0}, "pi-2": None}
KNOWN = {name: {"label": name.upper(), "same_as_trained_up_to_L": name == "bca"} for name in CONFIGS}


def window_file(folder, name, T, w, scale, correct):
    """A window file whose ŝ is a line of slope −scale (so R is known), NLL 1 before L and 1 + scale
    past it, and two trials: one at distance L/4 that passes iff ``correct``, one past L likewise."""
    n = torch.arange(T, dtype=torch.float32)
    s_hat = (-scale * n).expand(LAYERS, H, T).clone()
    key0 = torch.full((LAYERS, H, T), -1e3)
    nll = torch.where(n < L, 1.0, 1.0 + scale)
    inserted = torch.zeros(T, dtype=torch.bool)
    inserted[10:20] = True
    nll[10:20] = 50.0  # inside a written sentence: left out of the text's NLL
    trials = [
        {"name": "a", "key": "12345", "kind": "trial", "key_at": 100, "query_at": 100 + L // 4},
        {"name": "b", "key": "12345", "kind": "trial", "key_at": 5, "query_at": 5 + (L + 1 if T > L else L // 2)},
        {"name": "c", "key": "12345", "kind": "ceiling", "key_at": 300, "query_at": 323},
        {"name": "d", "key": "12345", "kind": "absent", "key_at": -1, "query_at": 400},
    ]
    mask = CONFIGS[name] if T > L else None
    settings = {
        "configuration": name,
        "rope": None,
        "mask": mask or {"kind": "causal", "size": None, "sinks": 0},
        "T": T,
        "train_len": L,
        "window": w,
        "n_windows": 3,
        "model": "toy",
        "key_sentence": "k",
        "query_sentence": "q",
    }
    if mask and mask["kind"] == "bca":
        s_hat[..., 2 * mask["size"] :] = float("-inf")
        key0[..., 2 * mask["size"] :] = float("-inf")
    tensors = {
        "s_hat": s_hat,
        "key0": key0,
        "nll": nll,
        "inserted": inserted,
        "passkey_logprob": torch.tensor([-1.0, -2.0, -0.5, -9.0]),
        "passkey_correct": torch.tensor([KEY_DIGITS if correct else 2, KEY_DIGITS if correct else 0, KEY_DIGITS, 1]),
    }
    path = folder / name / str(T) / f"window-{w}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors(path, tensors, {"settings": json.dumps(settings), "trials": json.dumps(trials)})


@pytest.fixture
def store(tmp_path):
    for w in range(3):
        window_file(tmp_path / "w", "as-trained", L, w, 0.5, True)
        window_file(tmp_path / "w", "pi-2", L, w, 0.2, w > 0)
        for name, scale, correct in (("as-trained", 0.3, False), ("bca", 0.05, False), ("pi-2", 0.1, True)):
            window_file(tmp_path / "w", name, 2 * L, w, scale + 0.01 * w, correct)
    return cs.load(cs.build(tmp_path / "w", tmp_path / "s.safetensors", KNOWN))


def test_the_store_keeps_each_windows_r_and_the_text_nll(store):
    e = store.entry("as-trained", 2 * L)
    expected = layer_resolution(torch.full((H, 2 * L), 0.0) - 0.31 * torch.arange(2 * L).double(), "mean-scores")
    assert e.windows == 3 and math.isclose(float(e.window_r[1, 0]), float(expected), rel_tol=1e-5)
    assert torch.allclose(cs.nll_mean(e, 0, L), torch.ones(3, dtype=torch.float64))  # the written span left out
    assert torch.allclose(cs.nll_mean(e, L, 2 * L), 1.3 + 0.01 * torch.arange(3, dtype=torch.float64))
    assert store.entry("bca", L) is store.entry("as-trained", L)  # the same computation inside L
    with pytest.raises(KeyError):
        store.entry("pi-2", 4 * L)


def test_summary_and_validity_on_known_answers(store):
    s = ca.summary(store, n_resamples=200)
    assert s["as-trained"]["passkey ≤ L/2 at L"].value == 1.0 and s["bca"]["passkey past L"].value == 0.0
    assert s["pi-2"]["passkey ≤ L/2 at L"].value == pytest.approx(2 / 3)
    assert s["as-trained"]["NLL rise"].value == pytest.approx(0.31)
    est = s["as-trained"]["NLL rise"]
    assert 0.30 - 1e-6 <= est.low <= est.value <= est.high <= 0.32 + 1e-6  # within the windows' own range
    ok, text = ca.validity(s)
    assert ok and "valid" in text


def test_exact_permutation_p_is_the_share_of_orderings_as_extreme():
    x, y = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
    rho, p = ca.exact_permutation_spearman(x, y)
    assert rho == pytest.approx(spearman(x, y))
    brute = np.mean([abs(spearman(x, list(q))) >= abs(rho) - 1e-12 for q in permutations(y)])
    assert p == pytest.approx(brute)
    assert ca.exact_permutation_spearman([1, 2, 3, 4], [1, 2, 3, 4]) == (pytest.approx(1.0), pytest.approx(2 / 24))


def test_cross_test_and_verdict(store):
    t = ca.cross_test(store, "R(2L)", "NLL rise", n_resamples=100)
    assert t.n == 3 and t.p == pytest.approx(1 / 3) and ca.verdict(t) == "inconclusive"  # 3 cannot reach p < 0.05
    strong = ca.CrossTest("R(2L)", "NLL rise", 7, -0.9, 0.01, -0.99, -0.5, 1)
    assert ca.verdict(strong) == "supports"
    assert ca.verdict(ca.CrossTest("R(2L)", "NLL rise", 7, 0.9, 0.01, 0.5, 0.99, 1)) == "evidence against"
    assert ca.verdict(ca.CrossTest("R(2L)", "passkey past L", 7, 0.9, 0.01, 0.5, 0.99, 5)) == "inconclusive"
    invalid = ca.CrossTest("R(2L)", "passkey past L", 7, 0.9, 0.01, 0.5, 0.99, 1)
    assert ca.verdict(invalid, valid=False) == "inconclusive"


@pytest.mark.parametrize("predictor, outcome", [("R(2L)", "passkey past L"), ("drop", "NLL rise")])
def test_cross_test_interval_is_the_percentiles_of_each_resamples_spearman(predictor, outcome):
    """On the shipped store, against the plain loop it replaced: one draw at a time, the window means of
    each configuration, spearman of the pair, resamples where a side is constant left out."""
    store = cs.load(STORES["configurations"])
    t = ca.cross_test(store, predictor, outcome, n_resamples=300, rng=3)
    names = [c for c in store.configurations() if ca._has_both(store, c, store.train_len)]
    values = {c: ca.per_window(store, c) for c in names}
    W_L, W_2L = (min(len(values[c][k]) for c in names) for k in ("R(L)", "R(2L)"))

    def mean(c, key, d_L, d_2L):
        v = values[c]
        if key == "drop":
            return v["R(2L)"][:W_2L][d_2L].mean() / v["R(L)"][:W_L][d_L].mean()
        W, d = (W_L, d_L) if key in ca.L_WINDOW_KEYS else (W_2L, d_2L)
        return np.nanmean(v[key][:W][d])

    boot = []
    for d_L, d_2L in zip(ca._indices(W_L, 300, 3), ca._indices(W_2L, 300, 4)):
        xb, yb = [mean(c, predictor, d_L, d_2L) for c in names], [mean(c, outcome, d_L, d_2L) for c in names]
        if len(set(xb)) > 1 and len(set(yb)) > 1:
            boot.append(spearman(xb, yb))
    assert len(boot) > 100
    assert (t.low, t.high) == pytest.approx(tuple(np.percentile(boot, [2.5, 97.5])), abs=1e-12)


def test_a_torn_or_mislabelled_window_file_is_refused(tmp_path):
    window_file(tmp_path, "as-trained", L, 0, 0.5, True)
    path = tmp_path / "as-trained" / str(L) / "window-0.safetensors"
    path.rename(path.with_name("window-1.safetensors"))
    window_file(tmp_path, "as-trained", L, 0, 0.5, True)
    with pytest.raises(ValueError, match="window-1.safetensors holds"):
        cs.build(tmp_path, tmp_path / "s.safetensors", KNOWN)
    path.with_name("window-1.safetensors").write_bytes(b"torn")
    with pytest.raises(ValueError, match="window-1.safetensors is unreadable"):
        cs.build(tmp_path, tmp_path / "s.safetensors", KNOWN)
    with pytest.raises(FileNotFoundError, match="no window files"):
        cs.build(tmp_path / "none", tmp_path / "s.safetensors", KNOWN)


def test_building_again_never_loses_windows_the_files_no_longer_hold(store, tmp_path):
    before = store.entry("bca", 2 * L).windows
    (tmp_path / "w" / "bca" / str(2 * L) / "window-2.safetensors").unlink()
    again = cs.load(cs.build(tmp_path / "w", tmp_path / "s.safetensors", KNOWN))
    assert again.entry("bca", 2 * L).windows == before == 3
    assert torch.equal(again.entry("bca", 2 * L).window_r, store.entry("bca", 2 * L).window_r)
