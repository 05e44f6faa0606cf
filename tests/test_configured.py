"""Plan v3's store and analysis on synthetic window files with known answers (no model needed)."""

import json
import math
import os
import re
import zlib
from itertools import permutations

import numpy as np
import pytest
import torch
from safetensors import safe_open

from attnres_helpers import configured_analysis as ca
from attnres_helpers import configured_store as cs
from attnres_helpers.files import save_safetensors
from attnres_helpers.metric import layer_resolution
from attnres_helpers.passkey import KEY_DIGITS
from attnres_helpers.paths import CONFIGURATIONS_COMMAND, STORES
from attnres_helpers.stats import ConfidenceInterval, CorrelationResult, spearman
from attnres_helpers.store import Profile, save_profiles

L, LAYERS, H = 1024, 2, 3
CONFIGS = {"as-trained": None, "bca": {"kind": "bca", "size": 512, "sinks": 0}, "pi-2": None}
KNOWN = {name: {"label": name.upper(), "same_as_trained_up_to_L": name == "bca"} for name in CONFIGS}


def window_file(folder, name, T, w, scale, correct, plan=None):
    """A window file whose ŝ is a line of slope −scale (so R is known), NLL 1 before L and 1 + scale
    past it, and two trials: one at distance L/4 that passes iff ``correct``, one past L likewise.
    ``plan="v4"``: with plan v4's settings (kind, remap) and each query's attention entropy."""
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
    if plan == "v4":
        settings |= {"plan": "v4", "kind": "masked" if mask else "as-trained", "remap": None}
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
    if plan == "v4":
        tensors["entropy"] = torch.full((LAYERS, T), 1.5)
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
    assert s["as-trained"]["passkey ≤ L/2 at L"].statistic == 1.0 and s["bca"]["passkey past L"].statistic == 0.0
    assert s["pi-2"]["passkey ≤ L/2 at L"].statistic == pytest.approx(2 / 3)
    assert s["as-trained"]["NLL rise"].statistic == pytest.approx(0.31)
    est = s["as-trained"]["NLL rise"]
    low, high = est.confidence_interval
    assert 0.30 - 1e-6 <= low <= est.statistic <= high <= 0.32 + 1e-6  # within the windows' own range
    ok, text = ca.validity(s)
    assert ok and "valid" in text


def _cross(outcome, rho, low, high, largest_tie=1):
    interval = ConfidenceInterval(low, high)
    return CorrelationResult(rho, interval, 7, 0.01, "R(2L)", outcome, True, largest_tie=largest_tie)


def test_cross_test_and_verdict(store):
    t = ca.cross_test(store, "R(2L)", "NLL rise", n_resamples=100)
    assert t.n == 3 and t.exact and t.pvalue == pytest.approx(1 / 3)  # exact over 3! orderings
    assert ca.verdict(t) == "inconclusive"  # 3 cannot reach p < 0.05
    x = [ca.per_window(store, c)["R(2L)"].mean() for c in store.configurations()]
    y = [ca.per_window(store, c)["NLL rise"].mean() for c in store.configurations()]
    brute = np.mean([abs(spearman(x, list(q))) >= abs(t.statistic) - 1e-12 for q in permutations(y)])
    assert t.pvalue == pytest.approx(brute) and t.statistic == pytest.approx(spearman(x, y))
    assert ca.verdict(_cross("NLL rise", -0.9, -0.99, -0.5)) == "supports"
    assert ca.verdict(_cross("NLL rise", 0.9, 0.5, 0.99)) == "evidence against"
    assert ca.verdict(_cross("passkey past L", 0.9, 0.5, 0.99, 5)) == "inconclusive"
    assert ca.verdict(_cross("passkey past L", 0.9, 0.5, 0.99), valid=False) == "inconclusive"


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
    for d_L, d_2L in zip(ca.window_draws(W_L, 300, 3), ca.window_draws(W_2L, 300, 4)):
        xb, yb = [mean(c, predictor, d_L, d_2L) for c in names], [mean(c, outcome, d_L, d_2L) for c in names]
        if len(set(xb)) > 1 and len(set(yb)) > 1:
            boot.append(spearman(xb, yb))
    assert len(boot) > 100
    assert tuple(t.confidence_interval) == pytest.approx(tuple(np.percentile(boot, [2.5, 97.5])), abs=1e-12)


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


# ------------------------------------------------------------------ malformed stores and window files (issue 44)


@pytest.fixture
def v4_store(tmp_path):
    """A plan v4 store (every field of the layout: R, NLL blocks, passkey, ŝ and key-0 codes, entropy) of
    as-trained at L and 2L and bca at 2L, two windows each; its path."""
    for w in range(2):
        window_file(tmp_path / "w", "as-trained", L, w, 0.5, True, plan="v4")
        for name in ("as-trained", "bca"):
            window_file(tmp_path / "w", name, 2 * L, w, 0.3, False, plan="v4")
    return cs.build(tmp_path / "w", tmp_path / "s.safetensors", KNOWN)


def test_v4_codes_stop_at_the_last_distance_with_a_value_and_key0_is_kept_past_L_only(v4_store, tmp_path):
    """bca's blocks of 512 reach 1023 tokens: its codes stop there and read back as -inf beyond, equal
    to the window files' own means; inside L no key-0 codes (plan v4's budget rule), so R without the
    sink there is the one the build computed, and ``results`` leaves the recomputed one out."""
    with safe_open(v4_store, framework="pt") as f:
        shapes = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    assert shapes[f"bca/{2 * L}/s_hat"] == shapes[f"bca/{2 * L}/key0"] == (LAYERS, 2 * 512)
    assert shapes[f"as-trained/{2 * L}/s_hat"] == (LAYERS, 2 * L) and f"as-trained/{L}/key0" not in shapes
    store = cs.load(v4_store)
    bca = store.entry("bca", 2 * L)
    n = torch.arange(2 * L, dtype=torch.float32)
    assert torch.isinf(bca.s_hat[:, 1024:]).all() and torch.isinf(bca.key0[:, 1024:]).all()
    step = 0.3 * 1023 / 65534  # store.quantize: the error is at most step / 2
    assert torch.allclose(bca.s_hat[:, :1024], (-0.3 * n[:1024]).expand(LAYERS, -1), atol=step / 2 + 1e-6)
    inside = store.entry("as-trained", L)
    assert inside.key0 is None and inside.profile().layer_resolutions(sink=False) is None
    assert torch.equal(inside.layer_resolutions(sink=False), inside.mean_r_sink_free.double())
    # R of the int16 codes against R of the float means: a line this steep (0.5 a token) moves R by 1e-3
    assert torch.allclose(inside.layer_resolutions(), inside.mean_r.double(), rtol=1e-2)
    past = store.entry("as-trained", 2 * L)
    assert torch.allclose(past.layer_resolutions(sink=False), past.mean_r_sink_free.double(), rtol=1e-2)
    recs = [r for r in cs.records(store) if r.get("layer") == "mean" and r["configuration"] == "as-trained"]
    assert {r["eval_len"]: "resolution_of_stored_s_hat_sink_free" in r for r in recs} == {L: False, 2 * L: True}


class Header(str):
    """A store header's raw text, as a change returns it."""


def rewritten(path, change):
    """A copy of store ``path`` with ``change(about, tensors)`` applied (a :class:`Header` it returns is
    the header's text)."""
    with safe_open(path, framework="pt") as f:
        about = json.loads(f.metadata()[cs.HEADER_KEY])
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    header = change(about, tensors)
    out = path.with_name("bad.safetensors")
    save_safetensors(out, tensors, {cs.HEADER_KEY: header if isinstance(header, Header) else json.dumps(about)})
    return out


P = f"as-trained/{2 * L}"


def _set(name, index, value):
    def change(about, t):
        t[f"{P}/{name}"][index] = value

    return change


def _replace(name, new):
    def change(about, t):
        t[f"{P}/{name}"] = new(t[f"{P}/{name}"])

    return change


MALFORMED_STORES = {  # issue 44 #4: each was accepted silently or raised KeyError, AttributeError or IndexError
    "NaN sink-free R": (_set("window_r_sink_free", (0, 0), math.nan), rf"{P}/window_r_sink_free has NaN or inf"),
    "NaN sink-free R of the mean": (_set("mean_r_sink_free", 1, math.nan), rf"{P}/mean_r_sink_free has NaN or inf"),
    "an unknown passkey kind": (_set("passkey/kind", (0, 1), 7), rf"{P}/passkey/kind must be in 0..2"),
    "a correct of 100": (_set("passkey/correct", (1, 0), 100), rf"{P}/passkey/correct must be in 0..5"),
    "mean_r of the wrong length": (
        _replace("mean_r", lambda t: t[:1].clone()),
        rf"{P}/mean_r must be float32 \(2,\), got float32 \(1,\)",
    ),
    "sink-free R with fewer layers": (
        _replace("window_r_sink_free", lambda t: t[:, :1].clone()),
        rf"{P}/window_r_sink_free must be float32 \(2, 2\), got float32 \(2, 1\)",
    ),
    "a 1-D window_r": (_replace("window_r", lambda t: t[:, 0].clone()), rf"{P}/window_r must be float32 \(2, n\)"),
    "window_r as float64": (_replace("window_r", lambda t: t.double()), rf"{P}/window_r must be float32"),
    "passkey fields of different lengths": (
        _replace("passkey/logprob", lambda t: t[:, :2].clone()),
        rf"{P}/passkey/logprob must be float32 \(2, 4\), got float32 \(2, 2\)",
    ),
    "a query past T": (_set("passkey/query_at", (0, 0), 2 * L), rf"{P}/passkey/query_at must be in 1..{2 * L - 1}"),
    "a distance past its query": (_set("passkey/distance", (0, 0), 5000), rf"{P}/passkey/distance must be -1"),
    "an NLL count past its block": (_set("nll_count", (0, 0), 513), rf"{P}/nll_count must be in 0..512"),
    "NLL blocks of another length": (
        _replace("nll_sum", lambda t: t[:, :3].clone()),
        rf"{P}/nll_sum must be float32 \(2, 4\)",
    ),
    "no s_hat step": (lambda a, t: t.pop(f"{P}/s_hat.step"), rf"{P}/s_hat.step is missing"),
    "key0 stored as floats": (_replace("key0", lambda t: t.float()), rf"{P}/key0 must be int16 \(2, n\)"),
    "codes past T": (
        _replace("s_hat", lambda t: torch.cat([t, t[:, :1]], 1)),
        rf"{P}/s_hat must hold 1 to {2 * L} distances, got {2 * L + 1}",
    ),
    "a step of 0": (_replace("s_hat.step", lambda t: t * 0), rf"{P}/s_hat.step must be > 0"),
    "NaN entropy": (_set("window_entropy", (0, 0, 0), math.nan), rf"{P}/window_entropy must be finite"),
    "entropy of another shape": (
        _replace("window_entropy", lambda t: t[:, :, :1].clone()),
        rf"{P}/window_entropy must be float32 \(2, 2, 4\)",
    ),
    "a stray tensor": (lambda a, t: t.update({f"{P}/extra": torch.zeros(1)}), rf"tensor '{P}/extra' is not part"),
    "no entries": (lambda a, t: a.pop("entries"), "the header lacks 'entries'"),
    "no train_len": (lambda a, t: a.pop("train_len"), "the header lacks 'train_len'"),
    "train_len a string": (
        lambda a, t: a.update(train_len="1024"),
        "the header's train_len must be an integer >= 2, got '1024'",
    ),
    "no configurations": (lambda a, t: a.pop("configurations"), "the header lacks 'configurations'"),
    "a configuration without a label": (
        lambda a, t: a["configurations"]["bca"].pop("label"),
        "the header's configurations must map each name to its label",
    ),
    "entries as a list": (
        lambda a, t: a.update(entries=list(a["entries"].values())),
        "the header's entries must be a non-empty",
    ),
    "an entry without windows": (lambda a, t: a["entries"][P].pop("windows"), rf"entry '{P}' lacks 'windows'"),
    "an entry of more windows than its arrays": (
        lambda a, t: a["entries"][P].update(windows=3),
        rf"{P}/window_r must be float32 \(3, n\), got float32 \(2, 2\)",
    ),
    "an entry named for another T": (
        lambda a, t: a["entries"][P].update(T=L),
        rf"entry '{P}' must be named <configuration>/<T>",
    ),
    "a header that is a list": (lambda a, t: Header("[]"), "the header must be a JSON object, got list"),
    "a header that is not JSON": (lambda a, t: Header("{"), "the header is not JSON"),
}


@pytest.mark.parametrize("case", MALFORMED_STORES)
def test_a_malformed_configurations_store_is_one_line_naming_the_store_and_field(v4_store, case):
    change, message = MALFORMED_STORES[case]
    assert cs.load(v4_store).entry("as-trained", 2 * L).window_entropy.shape == (2, LAYERS, 4)  # the intact one reads
    bad = rewritten(v4_store, change)
    with pytest.raises(ValueError, match=rf"^configurations store {re.escape(str(bad))}: {message}") as err:
        cs.load(bad)
    assert "\n" not in str(err.value)


def test_results_on_a_malformed_configurations_store_is_one_line(v4_store, cli):
    """Issue 44 #4: a NaN sink-free R was printed as null, and the text form failed on it."""
    bad = rewritten(v4_store, _set("window_r_sink_free", (0, 0), math.nan))
    for form in (["--json"], []):
        result = cli("results", str(bad), *form)
        assert result.returncode == 1 and result.stdout == "", result.stdout
        assert result.stderr.splitlines() == [
            f"error: configurations store {bad}: {P}/window_r_sink_free has NaN or inf"
        ]


def _window_changed(folder, change, name="as-trained", T=L, w=0):
    """Window ``w`` of ``name`` at ``T`` (under ``folder``) rewritten by ``change(settings, trials, tensors)``."""
    path = folder / name / str(T) / f"window-{w}.safetensors"
    settings, trials, tensors = cs.read_window_file(path)
    change(settings, trials, tensors)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_safetensors(path, tensors, {"settings": json.dumps(settings), "trials": json.dumps(trials)})
    return path


MALFORMED_WINDOWS = {  # issue 44 #7: KeyError tracebacks, or messages that did not name the file
    "a settings key missing": (lambda s, tr, t: s.pop("mask"), "its settings lack mask"),
    "no s_hat tensor": (lambda s, tr, t: t.pop("s_hat"), "it has no s_hat tensor"),
    "a trial without query_at": (lambda s, tr, t: tr[0].pop("query_at"), "trial 0 lacks query_at"),
    "a trial of an unknown kind": (lambda s, tr, t: tr[1].update(kind="other"), "trial 1 is not an object with a kind"),
    "a trial past the window": (
        lambda s, tr, t: tr[0].update(query_at=L),
        rf"trial 0's query_at must be .* \[1, {L}\)",
    ),
    "T as a string": (lambda s, tr, t: s.update(T=str(L)), f"T must be an integer >= 1, got '{L}'"),
    "fewer passkey scores than trials": (
        lambda s, tr, t: t.update(passkey_logprob=t["passkey_logprob"][:2]),
        r"passkey_logprob must be float \(trials,\) \(T = 1024, 4 trials\), got torch.float32 \(2,\)",
    ),
    "s_hat of another length": (
        lambda s, tr, t: t.update(s_hat=t["s_hat"][..., :-1]),
        r"s_hat must be float \(layers, heads, T\)",
    ),
    "an NLL with NaN": (lambda s, tr, t: t["nll"].__setitem__(3, math.nan), "nll has NaN or inf"),
    "an s_hat with NaN": (
        lambda s, tr, t: t["s_hat"].__setitem__((0, 0, 3), math.nan),
        r"run .* s_hat has NaN or \+inf",
    ),
    "a correct of 100": (lambda s, tr, t: t["passkey_correct"].__setitem__(0, 100), "passkey_correct must count"),
    "v4 without entropy": (
        lambda s, tr, t: s.update(plan="v4", kind="as-trained", remap=None),
        "it has no entropy tensor",
    ),
}


@pytest.mark.parametrize("case", MALFORMED_WINDOWS)
def test_a_malformed_window_file_is_one_line_naming_it(tmp_path, case):
    change, message = MALFORMED_WINDOWS[case]
    for w in range(2):
        window_file(tmp_path, "as-trained", L, w, 0.5, True)
    path = _window_changed(tmp_path, change, w=1)
    with pytest.raises(ValueError, match=rf"^window file {re.escape(str(path))}: {message}") as err:
        cs.build(tmp_path, tmp_path / "s.safetensors", KNOWN)
    assert "\n" not in str(err.value) and str(err.value).endswith("delete it to redo")
    assert not (tmp_path / "s.safetensors").exists()


def test_windows_of_one_configuration_with_other_shapes_are_refused_naming_the_file(tmp_path):
    """Issue 44 #7: two layers in window 0 and one in window 1 was torch's size mismatch, naming no file."""
    for w in range(2):
        window_file(tmp_path, "as-trained", L, w, 0.5, True)
    path = _window_changed(tmp_path, lambda s, tr, t: t.update(s_hat=t["s_hat"][:1], key0=t["key0"][:1]), w=1)
    with pytest.raises(ValueError, match=rf"^window file {re.escape(str(path))} holds s_hat \(1, 3, {L}\)"):
        cs.build(tmp_path, tmp_path / "s.safetensors", KNOWN)
    _window_changed(tmp_path, lambda s, tr, t: s.update(model="other"), w=1)
    with pytest.raises(
        ValueError, match=rf"^window file {re.escape(str(path))} was measured with other settings \(model\)"
    ):
        cs.build(tmp_path, tmp_path / "s.safetensors", KNOWN)


def test_window_files_without_a_window_0_are_one_clear_line(tmp_path):
    """Issue 44 #8: window 0 of every configuration deleted to redo them was "'NoneType' object is not a
    mapping"; one configuration's deleted left it out of the store silently. One line naming them."""
    for w in range(2):
        window_file(tmp_path, "as-trained", L, w, 0.5, True)
        window_file(tmp_path, "pi-2", 2 * L, w, 0.5, True)
    (tmp_path / "pi-2" / str(2 * L) / "window-0.safetensors").unlink()
    with pytest.raises(FileNotFoundError) as err:
        cs.build(tmp_path, tmp_path / "s.safetensors", KNOWN)
    assert str(err.value) == (
        f"pi-2/{2 * L} under {tmp_path} has window files but no window-0 file, and a store is built from "
        "windows 0 … n − 1: measure again to redo window 0"
    )
    (tmp_path / "as-trained" / str(L) / "window-0.safetensors").unlink()
    with pytest.raises(FileNotFoundError) as err:
        cs.build(tmp_path, tmp_path / "s.safetensors", KNOWN)
    assert str(err.value).startswith(f"as-trained/{L}, pi-2/{2 * L} under {tmp_path} (2 of 2) have window files but")
    assert not (tmp_path / "s.safetensors").exists()
    odd = tmp_path / "pi-2" / str(2 * L) / "window-x.safetensors"
    odd.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^window file {re.escape(str(odd))} is not named <configuration>/<T>/"):
        cs.build(tmp_path, tmp_path / "s.safetensors", KNOWN)


@pytest.fixture
def toy_model(tmp_path):
    """A model folder that ``configurations --build-only`` accepts: its config only (no weight is read)."""
    folder = tmp_path / "toy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": L}))
    return folder


def test_build_only_writes_only_a_configurations_store(tmp_path, toy_model, cli):
    """Issue 44 #2: `configurations --build-only --store FILE` (now `measure MODEL --configuration NAME
    --build-only --store FILE`) overwrote an ordinary store, a sinks file or a text file and exited 0, and
    `--store ""` meant the shipped store. Each is one line before any write, the file unchanged; a
    configurations store is built again in place."""
    for w in range(2):
        window_file(tmp_path / "w", "as-trained", L, w, 0.5, True)
    ordinary = tmp_path / "default.safetensors"
    save_profiles(
        ordinary,
        [Profile("a", {"encoding": "rope", "seed": 0, "train_len": 8}, 8, False, torch.zeros(1, 1, 8), torch.ones(8))],
    )
    sinks = tmp_path / "sinks.safetensors"
    save_safetensors(sinks, {"m/as-is": torch.zeros(1, 1, 2)}, {"attnres-sinks": "{}"})
    text = tmp_path / "notes.txt"
    text.write_text("mine")
    folder = tmp_path / "a-folder"
    folder.mkdir()
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)  # never opened: it would block
    before = {p: p.read_bytes() for p in (ordinary, sinks, text)}
    base = ["measure", str(toy_model), "--configuration", "as-trained", "--work", str(tmp_path / "w"), "--build-only"]
    for store in (ordinary, sinks, text, folder, pipe):
        result = cli(*base, "--store", str(store))
        assert result.returncode == 1 and result.stderr.splitlines() == [
            f"error: {store} is not a configurations store; give another --store (nothing was written)"
        ], result.stderr
    result = cli(*base, "--store", "")
    assert result.returncode == 1 and result.stderr.splitlines() == ["error: --store is empty: give the store's path"]
    assert before == {p: p.read_bytes() for p in before} and not list(folder.iterdir())
    good = tmp_path / "configured.safetensors"
    for _ in range(2):  # built, then built again over itself
        result = cli(*base, "--store", str(good))
        assert result.returncode == 0 and result.stdout.strip() == str(good), result.stderr
    assert cs.load(good).entry("as-trained", L).windows == 2


def test_build_only_over_a_malformed_window_file_is_one_line(tmp_path, toy_model, cli):
    """Issue 44 #7 and #8 from the command line: one line naming the file, status 1."""
    window_file(tmp_path / "w", "as-trained", L, 0, 0.5, True)
    path = _window_changed(tmp_path / "w", lambda s, tr, t: tr[0].pop("query_at"))
    base = ["measure", str(toy_model), "--configuration", "as-trained", "--work", str(tmp_path / "w"), "--build-only"]
    result = cli(*base, "--store", str(tmp_path / "s.safetensors"))
    assert result.returncode == 1 and result.stderr.splitlines() == [
        f"error: window file {path}: trial 0 lacks query_at; delete it to redo"
    ]
    path.rename(path.with_name("window-1.safetensors"))
    result = cli(*base, "--store", str(tmp_path / "s.safetensors"))
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"error: as-trained/{L} under {tmp_path / 'w'} has window files but no window-0")


def _word_tokenizer(text, add_special_tokens=True):
    """A tokenizer for a tiny random Llama (256 ids): words, digits one by one, punctuation (no model files)."""
    pieces = re.findall(r" ?[^\W\d]+|\d| ?[^\w\s]|\s+", text)
    return {"input_ids": [zlib.crc32(p.encode()) % 256 for p in pieces]}


def test_more_windows_than_the_work_folder_was_measured_with_names_the_folder_once(tmp_path):
    """Issue 44 #14: `configurations --windows 2` after `--windows 1` said to delete one window file, and
    deleting it moved the error to the next of 80. Every job is checked before any is measured: one error
    naming the work folder (every window there was placed for one window) and the flag that goes on with them."""
    from helpers import tiny_llama

    from attnres_helpers.hf.configured import measure_configurations

    model, work = tiny_llama(context=L), tmp_path / "work"

    def run(n_windows):
        return measure_configurations(
            model, _word_tokenizer, work, "toy", L, ["as-trained", "pi-2"], n_windows, progress=False
        )

    assert run(1) == 4  # as-trained and pi-2 at L and 2L
    before = {p: p.stat().st_mtime_ns for p in work.rglob("*")}
    with pytest.raises(ValueError) as err:
        run(2)
    assert str(err.value) == (
        f"the window files under {work} were measured with other settings (n_windows; "
        f"as-trained/{L}/window-0.safetensors among them): clear {work} to measure again, "
        "or run with --windows 1 to go on with them"
    )
    assert before == {p: p.stat().st_mtime_ns for p in work.rglob("*")}  # nothing measured, nothing removed
    assert run(1) == 0
    path = work / "pi-2" / str(2 * L) / "window-0.safetensors"
    settings, trials, tensors = cs.read_window_file(path)
    save_safetensors(path, tensors, {"settings": json.dumps(settings | {"rope": None}), "trials": json.dumps(trials)})
    with pytest.raises(ValueError) as err:
        run(1)
    assert (
        str(err.value)
        == f"window file {path} was measured with other settings (rope); clear {work / 'pi-2'} to measure pi-2 again"
    )


def test_a_stored_entry_of_other_settings_is_not_kept_as_measured(store, tmp_path):
    """Issue 44 #19 (round 4's leftover): bca at 2L was kept from the store (3 windows, blocks of 512) after its
    window files were cleared and 1 window measured again with blocks of 256: the store then said bca held 3
    windows of the new settings. Refused in one line naming the store, the entry and the settings."""
    folder = tmp_path / "w" / "bca" / str(2 * L)
    for path in folder.glob("window-*.safetensors"):
        path.unlink()
    window_file(tmp_path / "w", "bca", 2 * L, 0, 0.05, False)
    _window_changed(tmp_path / "w", lambda s, tr, t: s["mask"].update(size=256), "bca", 2 * L)
    before = (tmp_path / "s.safetensors").read_bytes()
    with pytest.raises(ValueError) as err:
        cs.build(tmp_path / "w", tmp_path / "s.safetensors", KNOWN)
    assert str(err.value) == (
        f"{tmp_path / 's.safetensors'} holds bca/{2 * L} from 3 windows measured with other settings (mask) than "
        f"the 1 window file of it under {tmp_path / 'w'}: measure its windows 1 … 2 too, or move the store away "
        "to build it from the window files alone"
    )
    assert (tmp_path / "s.safetensors").read_bytes() == before


def test_a_missing_store_or_run_names_the_command_that_makes_it(v4_store, tmp_path):
    """The store's header, a missing store and an empty run folder all name today's command (the old
    ``configurations`` verb is an alias for one round only)."""
    assert CONFIGURATIONS_COMMAND == "python -m attnres_helpers reproduce configurations"
    with safe_open(v4_store, framework="pt") as f:
        assert json.loads(f.metadata()[cs.HEADER_KEY])["command"] == CONFIGURATIONS_COMMAND
    with pytest.raises(FileNotFoundError, match=rf"is missing; build it with `{CONFIGURATIONS_COMMAND}`$"):
        cs.load(tmp_path / "none.safetensors")
    with pytest.raises(FileNotFoundError, match=rf"no window files under .*: run `{CONFIGURATIONS_COMMAND}` first$"):
        cs.build(tmp_path / "empty", tmp_path / "s.safetensors", KNOWN)
