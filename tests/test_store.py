"""The measurement store (attnres_helpers.store): ŝ and per-position NLL are kept, R and perplexity
are queries over them. Tiny models are trained in tmp_path; no shipped file is read.

Stores that lie are refused at read (metadata, negative NLL), and values a store cannot hold at write
(float16's range, an NLL past float32's); an NLL past exp's range is an infinite perplexity and valid JSON."""

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import one_line
from safetensors import safe_open
from safetensors.torch import save_file

from attnres_helpers.__main__ import main as cli_main
from attnres_helpers.data import eval_windows
from attnres_helpers.measure import measure_model, measure_windows
from attnres_helpers.metric import BOUNDARIES, HEAD_MODES, layer_resolution
from attnres_helpers.probe import CopyCurve
from attnres_helpers.store import (
    STORE_DTYPES,
    Profile,
    as_stored,
    load_curves,
    load_profiles,
    load_window_values,
    perplexities,
    records,
    save_profiles,
)

L = 16  # the tiny preset's training length


@pytest.fixture(scope="module")
def trained(tiny_models):
    """The shared trained tiny models (conftest): rope with 3 layers, alibi with 2."""
    return tiny_models


@pytest.fixture(scope="module")
def profiles(trained, val_tokens):
    """Profiles of the trained rope model at L and 2L, with and without BCA."""
    return measure_model(
        trained["rope"], val_tokens, "rope-s0", {"seed": 0, "note": "test"}, multiples=(1, 2), n_windows=4, batch_size=4
    )


@pytest.fixture(scope="module")
def store(profiles, tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "default.safetensors"
    save_profiles(path, profiles, {"command": "test", "measure": {"multiples": (1, 2)}})
    return path


def by_key(recs):
    return {(r["run"], r["eval_len"], r["bca"], r["head_mode"], r["layer"]): r for r in recs}


# -------------------------------------------------------------------------- (a) stored ŝ -> R is measure's R


def test_measure_model_profiles(profiles, trained):
    assert [(p.eval_len, p.bca) for p in profiles] == [(L, False), (L, True), (2 * L, False), (2 * L, True)]
    for p in profiles:
        assert p.meta == {"seed": 0, "note": "test", "encoding": "rope", "train_len": L}
        assert p.s_hat.dtype == torch.float32 and p.s_hat.shape == (3, 2, p.eval_len)
        assert p.nll.dtype == torch.float64 and p.nll.shape == (p.eval_len,)
    plain, bca = profiles[2], profiles[3]  # 2L: BCA masks every distance >= L (blocks of L/2)
    assert torch.isneginf(bca.s_hat[..., L:]).all() and torch.isfinite(bca.s_hat[..., :L]).all()
    assert torch.isfinite(plain.s_hat).all()
    # 20 steps already beat uniform over bytes (log 256 = 5.5 nats) by more than a nat
    assert float(plain.nll[:L].mean()) < math.log(256) - 1.0


def test_stored_profiles_give_the_measured_records(profiles, store):
    """A float32 store keeps ŝ exactly and the NLL to float32: every R is the measured one exactly,
    every perplexity within float32's rounding (1e-6 relative)."""
    loaded, about = load_profiles(store)
    assert about == {"command": "test", "measure": {"multiples": [1, 2]}}
    assert [p.key for p in loaded] == sorted(p.key for p in profiles)
    for p in loaded:
        original = next(q for q in profiles if q.key == p.key)
        assert torch.equal(p.s_hat, original.s_hat) and p.nll.dtype == torch.float64
        torch.testing.assert_close(p.nll, original.nll, rtol=1e-6, atol=0)
        assert torch.equal(p.nll, original.nll.float().double())
        assert (p.run, p.meta, p.eval_len, p.bca) == (original.run, original.meta, original.eval_len, original.bca)
    for boundary in BOUNDARIES:
        for temperature in (1.0, 0.5):
            in_memory = by_key(records(profiles, boundary, temperature=temperature))
            assert len(in_memory) == 4 * 2 * (3 + 2)  # profiles x head modes x (3 layers, mean, upper)
            from_store = by_key(records(loaded, boundary, temperature=temperature))
            assert from_store.keys() == in_memory.keys()
            for key, rec in in_memory.items():
                for name, value in rec.items():
                    if name.startswith("perplexity") and value is not None:
                        assert from_store[key][name] == pytest.approx(value, rel=1e-6)
                    else:
                        assert from_store[key][name] == value, (key, name)


@pytest.mark.parametrize("dtype", STORE_DTYPES)
def test_as_stored_is_what_a_store_gives_back(profiles, tmp_path, dtype):
    """as_stored(profiles, dtype) equals load_profiles(save_profiles(profiles, dtype)) tensor for tensor,
    so a fresh measurement compares with a store like with like."""
    path = tmp_path / "store.safetensors"
    save_profiles(path, profiles, dtype=dtype)
    loaded = {p.key: p for p in load_profiles(path)[0]}
    for p in as_stored(profiles, dtype):
        q = loaded[p.key]
        for name in ("s_hat", "nll", "key0"):
            a, b = getattr(p, name), getattr(q, name)
            assert a.dtype == b.dtype and torch.equal(a, b), (p.key, name, dtype)
    with pytest.raises(ValueError, match="dtype must be one of"):
        as_stored(profiles, torch.float64)


@pytest.mark.parametrize("dtype", STORE_DTYPES)
def test_as_stored_is_idempotent_and_stores_unchanged(profiles, tmp_path, dtype):
    """What as_stored returns, coded again, is itself, and a store written from it holds the same
    tensors as one written from the measurement: so a store rewritten from its own decoded profiles (as
    the runner rewrites it after every run) never drifts. The hard cases for int16 codes are here too:
    float64 input, a row far from 0 with a range below float32's spacing there, and -inf entries."""
    offset = torch.full((1, 1, 8), 1000.0, dtype=torch.float64) + torch.arange(8.0, dtype=torch.float64) * 1e-7
    s_hat = torch.cat([torch.randn(1, 1, 8, generator=torch.Generator().manual_seed(0)).double(), offset], 1)
    s_hat[0, 0, -2:] = -math.inf
    hard = Profile("hard", {"encoding": "rope", "seed": 0, "train_len": 4}, 8, False, s_hat, torch.rand(8).double())
    for p in (*profiles, hard):
        once = as_stored([p], dtype)
        twice = as_stored(once, dtype)
        for name in ("s_hat", "nll", "key0"):
            a, b = getattr(once[0], name), getattr(twice[0], name)
            assert (a is None and b is None) or torch.equal(a, b), (p.key, name)
        save_profiles(tmp_path / "measured.safetensors", [p], dtype=dtype)
        save_profiles(tmp_path / "decoded.safetensors", once, dtype=dtype)
        with (
            safe_open(tmp_path / "measured.safetensors", "pt") as f,
            safe_open(tmp_path / "decoded.safetensors", "pt") as g,
        ):
            assert sorted(f.keys()) == sorted(g.keys())
            for key in f.keys():
                assert torch.equal(f.get_tensor(key), g.get_tensor(key)), (p.key, key)


def test_records_are_layer_resolution_of_the_stored_s_hat(profiles, store):
    loaded, _ = load_profiles(store)
    for boundary in BOUNDARIES:
        recs = by_key(records(loaded, boundary, temperature=2.0))
        for p in loaded:
            for head_mode in HEAD_MODES:
                direct = layer_resolution(p.s_hat.double() * 2.0, head_mode, boundary)  # (layers,)
                assert direct.shape == (3,)
                expected = {
                    0: float(direct[0]),
                    1: float(direct[1]),
                    2: float(direct[2]),
                    "mean": float(direct.mean()),
                    "upper": float(direct[1:].mean()),
                }
                for layer, r in expected.items():
                    rec = recs[(p.run, p.eval_len, p.bca, head_mode, layer)]
                    assert rec["resolution"] == r and rec["boundary"] == boundary
                    # and what float32 arithmetic on the same ŝ gives, to float32 accuracy
                    single = layer_resolution(p.s_hat * 2.0, head_mode, boundary)
                    if isinstance(layer, int):
                        assert rec["resolution"] == pytest.approx(float(single[layer]), rel=1e-4, abs=1e-6)
                    ppl = perplexities(p.nll, L)
                    assert rec["perplexity"] == math.exp(float(p.nll.mean()))
                    assert {k: rec[k] for k in ppl} == ppl


def test_perplexities_spans():
    nll = torch.log(torch.arange(1.0, 9.0, dtype=torch.float64))  # ppl of position n is n + 1
    out = perplexities(nll, 4)
    assert out["perplexity"] == pytest.approx(math.exp(math.log(math.factorial(8)) / 8))
    assert out["perplexity_first_L"] == pytest.approx(24 ** (1 / 4))  # geometric mean of 1..4
    assert out["perplexity_past_L"] == pytest.approx((5 * 6 * 7 * 8) ** (1 / 4))
    at_L = perplexities(nll[:4], 4)
    assert at_L["perplexity_first_L"] == at_L["perplexity"] == out["perplexity_first_L"]
    assert at_L["perplexity_past_L"] is None


def test_float16_store_records_follow_the_stored_values(profiles, tmp_path):
    path = tmp_path / "half.safetensors"
    save_profiles(path, profiles, dtype=torch.float16)
    loaded, about = load_profiles(path)
    assert about == {}
    rounded = [
        Profile(p.run, p.meta, p.eval_len, p.bca, p.s_hat.half().float(), p.nll.float().double(), p.key0.half().float())
        for p in profiles
    ]
    assert by_key(records(loaded)) == by_key(records(rounded))  # R of exactly what is stored
    full, half = by_key(records(profiles)), by_key(records(loaded))
    for key, rec in full.items():
        assert half[key]["resolution"] == pytest.approx(rec["resolution"], rel=1e-3, abs=1e-5)
        assert half[key]["perplexity"] == pytest.approx(rec["perplexity"], rel=1e-6)  # nll stored as float32


# ------------------------------------------------------------- (b) causal: positions < L see the same context


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_first_L_of_a_2L_window_is_the_L_window(trained, val_tokens, encoding):
    model = trained[encoding]
    windows = eval_windows(val_tokens, 2 * L, 6)  # (6, 2L+1)
    long = measure_windows(model, windows, batch_size=4)
    short = measure_windows(model, windows[:, : L + 1], batch_size=4)
    torch.testing.assert_close(long["nll"][:L], short["nll"], rtol=1e-6, atol=0)
    assert not torch.allclose(long["nll"][L:], long["nll"][:L])  # the second half is other text
    meta = {"encoding": encoding, "seed": 0, "train_len": L}
    at_2L = Profile("r", meta, 2 * L, False, long["s_hat"], long["nll"])
    at_L = Profile("r", meta, L, False, short["s_hat"], short["nll"])
    first_L = records([at_2L])[0]["perplexity_first_L"]
    assert first_L == pytest.approx(records([at_L])[0]["perplexity"], rel=1e-6)
    assert records([at_L])[0]["perplexity_first_L"] == records([at_L])[0]["perplexity"]


# -------------------------------------------------------------------- (c) boundary and layer selections


def test_drop_boundary_differs_from_zero_for_a_trained_model(profiles):
    zero, drop = by_key(records(profiles, "zero")), by_key(records(profiles, "drop"))
    assert zero.keys() == drop.keys()
    for key, z in zero.items():
        d = drop[key]
        assert (z["boundary"], d["boundary"]) == ("zero", "drop")
        _, eval_len, bca, _, _ = key
        if bca and eval_len == 2 * L:  # BCA masks the last distances: no boundary term to drop
            assert d["resolution"] == pytest.approx(z["resolution"], rel=1e-12)
        else:
            assert d["resolution"] < z["resolution"]  # drop leaves out p_{N-1}² > 0


def test_upper_is_the_mean_over_layers_above_the_first(profiles):
    for boundary in BOUNDARIES:
        recs = by_key(records(profiles, boundary))
        for p in profiles:
            for head_mode in HEAD_MODES:
                layer = {k: recs[(p.run, p.eval_len, p.bca, head_mode, k)]["resolution"] for k in (0, 1, 2)}
                upper = recs[(p.run, p.eval_len, p.bca, head_mode, "upper")]["resolution"]
                mean = recs[(p.run, p.eval_len, p.bca, head_mode, "mean")]["resolution"]
                assert upper == pytest.approx((layer[1] + layer[2]) / 2, rel=1e-12)
                assert mean == pytest.approx((layer[0] + layer[1] + layer[2]) / 3, rel=1e-12)
                assert upper != mean


def test_one_layer_profiles_have_no_upper_record():
    s_hat = -torch.arange(8.0).expand(1, 2, 8).clone()  # (1 layer, 2 heads, 8)
    p = Profile(
        "one", {"encoding": "rope", "seed": 0, "train_len": 4}, 8, False, s_hat, torch.zeros(8, dtype=torch.float64)
    )
    recs = records([p], head_modes=("mean-scores",))
    assert [r["layer"] for r in recs] == [0, "mean"]
    assert recs[0]["resolution"] == recs[1]["resolution"] == pytest.approx(float(layer_resolution(s_hat[0])))
    assert recs[0]["perplexity"] == 1.0 and recs[0]["perplexity_past_L"] == 1.0


# ------------------------------------------------------------------------------------------ (e) store errors


def _profile(**changes):
    fields = {
        "run": "r",
        "meta": {"encoding": "rope", "seed": 0, "train_len": 4},
        "eval_len": 8,
        "bca": False,
        "s_hat": torch.zeros(2, 2, 8),
        "nll": torch.ones(8, dtype=torch.float64),
    }
    return Profile(**{**fields, **changes})


def test_missing_and_corrupt_stores(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        load_profiles(tmp_path / "missing.safetensors")
    bad = tmp_path / "random.safetensors"
    bad.write_bytes(
        torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8).numpy().tobytes()
    )
    with pytest.raises(ValueError, match=r"random\.safetensors is corrupt or not a store"):
        load_profiles(bad)
    good = tmp_path / "good.safetensors"
    save_profiles(good, [_profile()])
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-20])
    with pytest.raises(ValueError, match=r"truncated\.safetensors is corrupt"):
        load_profiles(truncated)
    from safetensors.torch import save_file

    plain = tmp_path / "plain.safetensors"  # a safetensors file, but no store header
    save_file({"x": torch.zeros(3)}, plain)
    with pytest.raises(ValueError, match=r"plain\.safetensors is corrupt or not a store"):
        load_profiles(plain)
    empty = tmp_path / "empty.safetensors"
    save_profiles(empty, [])
    with pytest.raises(ValueError, match=r"empty\.safetensors holds no profiles"):
        load_profiles(empty)
    lacking = tmp_path / "lacking.safetensors"  # an s_hat without its nll
    save_file(
        {"r/8/0/s_hat": torch.zeros(2, 2, 8)},
        lacking,
        metadata={"attnres": json.dumps({"runs": {"r": {"encoding": "rope", "seed": 0, "train_len": 4}}})},
    )
    with pytest.raises(ValueError, match=r"lacking\.safetensors: entry 'r/8/0' is malformed"):
        load_profiles(lacking)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"s_hat": torch.full((2, 2, 8), float("nan"))}, "NaN"),
        ({"s_hat": torch.zeros(2, 2, 8).index_fill_(2, torch.tensor([3]), float("inf"))}, r"\+inf"),
        ({"nll": torch.full((8,), float("inf"), dtype=torch.float64)}, "nll must be finite and >= 0"),
        (
            {"nll": torch.ones(8, dtype=torch.float64).index_fill_(0, torch.tensor([0]), float("nan"))},
            "nll must be finite",
        ),
        ({"nll": -torch.ones(8, dtype=torch.float64)}, "nll must be finite and >= 0"),
        ({"meta": {"encoding": "rope", "seed": 0, "train_len": -3}}, r"train_len must be an integer in \[2"),
        ({"meta": {"encoding": "rope", "seed": 0, "train_len": 0}}, r"train_len must be an integer in \[2"),
        (
            {"meta": {"encoding": "rope", "seed": 0, "train_len": 4, "run": "x"}},
            r"may not hold the record keys \['run'\]",
        ),
        ({"key0": torch.zeros(2, 2, 7)}, "key0 must have s_hat's shape"),
        ({"key0": torch.full((2, 2, 8), float("nan"))}, "key0 has NaN"),
        ({"s_hat": torch.zeros(2, 8)}, r"s_hat must be \(layers, H, 8\)"),
        ({"s_hat": torch.zeros(2, 2, 7)}, r"s_hat must be \(layers, H, 8\)"),
        ({"nll": torch.ones(7, dtype=torch.float64)}, r"nll \(8,\)"),
        ({"eval_len": 16}, r"eval_len 16"),
        ({"meta": {"encoding": "rope", "seed": 0}}, r"lacks \['train_len'\]"),
        ({"run": "a/b"}, "without '/'"),
        ({"run": ""}, "non-empty"),
    ],
)
def test_bad_profiles_raise(changes, match):
    with pytest.raises(ValueError, match=match):
        _profile(**changes)


def test_masked_distances_are_allowed():
    s_hat = torch.zeros(2, 2, 8)
    s_hat[..., 4:] = float("-inf")  # BCA
    assert _profile(s_hat=s_hat).s_hat.shape == (2, 2, 8)


def test_save_profiles_refuses_inconsistent_input(tmp_path):
    with pytest.raises(ValueError, match="two profiles for r/8/0"):
        save_profiles(tmp_path / "x.safetensors", [_profile(), _profile()])
    with pytest.raises(ValueError, match="two different metadata"):
        save_profiles(
            tmp_path / "x.safetensors",
            [_profile(), _profile(bca=True, meta={"encoding": "rope", "seed": 1, "train_len": 4})],
        )
    with pytest.raises(ValueError, match="dtype"):
        save_profiles(tmp_path / "x.safetensors", [_profile()], dtype=torch.bfloat16)
    with pytest.raises(ValueError):  # NaN in the metadata is not JSON
        save_profiles(
            tmp_path / "x.safetensors",
            [_profile(meta={"encoding": "rope", "seed": 0, "train_len": 4, "lr": float("nan")})],
        )
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left


def test_records_refuse_bad_queries():
    with pytest.raises(ValueError, match="boundary"):
        records([_profile()], boundary="wrap")
    for temperature in (0.0, -1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="temperature"):
            records([_profile()], temperature=temperature)


# ------------------------------------------------------------------------------- (h) the results subcommand


def test_cli_results_json_is_the_records_of_the_store(cli, store):
    expected = records(load_profiles(store)[0])
    zero = cli("results", str(store), "--json")
    assert zero.returncode == 0, zero.stderr
    printed = json.loads(zero.stdout)
    assert len(printed) == len(expected) == 40
    assert printed == json.loads(json.dumps(expected))
    drop = cli("results", str(store), "--json", "--boundary", "drop")
    assert drop.returncode == 0, drop.stderr
    printed_drop = json.loads(drop.stdout)
    assert printed_drop == json.loads(json.dumps(records(load_profiles(store)[0], "drop")))
    assert len(printed_drop) == len(printed) and {r["boundary"] for r in printed_drop} == {"drop"}
    differ = [not math.isclose(a["resolution"], b["resolution"], rel_tol=1e-12) for a, b in zip(printed, printed_drop)]
    assert sum(differ) == 30  # all but the 10 records of BCA at 2L, whose last distances are masked


def test_cli_results_errors_are_one_line(cli, tmp_path):
    missing = cli("results", str(tmp_path / "none.safetensors"), "--json")
    assert missing.returncode != 0 and missing.stdout == ""
    assert missing.stderr.splitlines() == [f"error: measurement store {tmp_path / 'none.safetensors'} is missing"]
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 64)
    corrupt = cli("results", str(bad))
    assert corrupt.returncode != 0 and len(corrupt.stderr.splitlines()) == 1 and "Traceback" not in corrupt.stderr
    assert corrupt.stderr.startswith(f"error: measurement store {bad} is corrupt")


def test_cli_measure_prints_the_records_results_prints_for_the_same_measurement(
    profiles, tmp_path, capsys, monkeypatch
):
    """`measure --json` re-measures and prints the records as the shipped store would keep them, so they
    equal what `results --json` prints from a store of that measurement (here: the tiny profiles, the
    measurement stubbed; int16 codes move R by up to about 1e-3, so a raw measurement would not match)."""
    from attnres_helpers import experiments

    monkeypatch.setattr(experiments, "measure_checkpoints", lambda progress=True: profiles)
    path = tmp_path / "shipped.safetensors"
    save_profiles(path, profiles, dtype=experiments.default_dataset().dtype)
    cli_main(["results", "--json", str(path)])
    from_store = json.loads(capsys.readouterr().out)
    cli_main(["measure", "--json"])
    measured = json.loads(capsys.readouterr().out)
    assert measured == from_store and len(measured) == len(records(profiles))


def test_cli_results_text(store, capsys):
    cli_main(["results", str(store)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 * 2  # every profile: the layer mean and the upper layers, mean-scores
    recs = by_key(records(load_profiles(store)[0]))
    first = recs[("rope-s0", L, False, "mean-scores", "mean")]
    assert lines[0].split()[:9] == [
        "rope-s0",
        "eval_len",
        str(L),
        "bca",
        "False",
        "layers",
        "mean",
        "R",
        f"{first['resolution']:.4f}",
    ]
    assert "ppl >=L" not in lines[0] and "ppl >=L" in lines[-1]


def test_int16_store_keeps_every_per_layer_r_within_1e3(profiles, tmp_path):
    """Fixed-point codes per (layer, head) row: -inf kept, each value within (max − min)/131068, and
    every per-layer R (both head modes, with and without the sink) within 1e-3 relative."""
    from attnres_helpers.store import quantize

    path = tmp_path / "int16.safetensors"
    save_profiles(path, profiles, dtype=torch.int16)
    loaded = {p.key: p for p in load_profiles(path)[0]}
    for p in profiles:
        q = loaded[p.key]
        assert torch.equal(torch.isneginf(q.s_hat), torch.isneginf(p.s_hat))
        finite = torch.isfinite(p.s_hat)
        span = (p.s_hat.masked_fill(~finite, -1e9).amax(-1) - p.s_hat.masked_fill(~finite, 1e9).amin(-1)).clamp(min=0)
        assert ((q.s_hat - p.s_hat).abs().masked_fill(~finite, 0).amax(-1) <= span / 131068 + 1e-6).all()
        for mode in ("mean-scores", "mean-R"):
            for sink in (True, False):
                a, b = p.layer_resolutions(mode, sink=sink), q.layer_resolutions(mode, sink=sink)
                torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-9)
    codes, low, step = quantize(torch.tensor([[-math.inf, -math.inf]]))
    assert codes.tolist() == [[-32768, -32768]]  # a row with nothing finite stays -inf


def test_window_values_are_stored_beside_their_profiles_and_read_back(tmp_path):
    path = tmp_path / "w.safetensors"
    values = {"r/8/0": {"r": torch.rand(3, 2, dtype=torch.float64), "nll": torch.rand(3, dtype=torch.float64)}}
    save_profiles(path, [_profile()], window_values=values)
    back = load_window_values(path)
    assert set(back) == {"r/8/0"} and set(back["r/8/0"]) == {"r", "nll"}
    for name, t in values["r/8/0"].items():
        torch.testing.assert_close(back["r/8/0"][name], t.float().double(), rtol=0, atol=0)  # float32 as stored
    assert len(load_profiles(path)[0]) == 1  # the window values are not profiles
    assert load_window_values(_plain(tmp_path)) == {}
    with pytest.raises(ValueError, match="window values of 'r/16/0', which has no profile"):
        save_profiles(tmp_path / "x.safetensors", [_profile()], window_values={"r/16/0": {"r": torch.zeros(1)}})
    with pytest.raises(ValueError, match="finite"):
        save_profiles(
            tmp_path / "x.safetensors", [_profile()], window_values={"r/8/0": {"r": torch.tensor([math.nan])}}
        )
    ragged = {"r/8/0": {"r": torch.zeros(3, 2), "nll": torch.zeros(2)}}
    save_profiles(path, [_profile()], window_values=ragged)
    with pytest.raises(ValueError, match="differ in their number of windows"):
        load_window_values(path)


def _plain(tmp_path: Path) -> Path:
    path = tmp_path / "plain.safetensors"
    save_profiles(path, [_profile()])
    return path


# ------------------------------------------------------------------------ (i) every stored field checked at read


def _rewritten(tmp_path: Path, changes: dict, dtype=torch.int16) -> Path:
    """A store of ``_profile`` (random ŝ and key0, a copy curve) with ``changes`` (name: tensor, None to
    delete it) written in by safetensors' own writer, none of our checks."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    p = _profile(s_hat=torch.randn(2, 2, 8, generator=g), key0=torch.randn(2, 2, 8, generator=g))
    curve = CopyCurve((0, 2, 6), torch.rand(3, 4, generator=g), torch.rand(3, 4, generator=g))
    path = tmp_path / "lie.safetensors"
    save_profiles(path, [p], dtype=dtype, curves={("r", False): curve})
    with safe_open(path, framework="pt") as f:
        tensors, metadata = {n: f.get_tensor(n) for n in f.keys()}, f.metadata()
    for name, t in changes.items():
        tensors.pop(name) if t is None else tensors.__setitem__(name, t)
    save_file(tensors, path, metadata=metadata)
    return path


ROWS, F64 = (2, 2, 1), torch.float64


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"s_hat.step": -torch.ones(ROWS, dtype=F64)}, "s_hat.low must be finite and s_hat.step finite and > 0"),
        ({"key0.step": torch.zeros(ROWS, dtype=F64)}, "key0.low must be finite and key0.step finite and > 0"),
        ({"s_hat.low": torch.full(ROWS, math.nan, dtype=F64)}, "s_hat.low must be finite"),
        (
            {"s_hat.step": torch.ones(ROWS, dtype=torch.int64)},
            "s_hat.step must be float64 (2, 2, 1), one per row of the codes; got torch.int64 (2, 2, 1)",
        ),
        (
            {"s_hat.low": torch.tensor(0.0, dtype=F64)},
            "s_hat.low must be float64 (2, 2, 1), one per row of the codes; got torch.float64 ()",
        ),
        (
            {"key0.low": torch.zeros(2, 2, 8, dtype=F64)},
            "key0.low must be float64 (2, 2, 1), one per row of the codes; got torch.float64 (2, 2, 8)",
        ),
        ({"s_hat.step": None}, "s_hat.step must be float64 (2, 2, 1), one per row of the codes; got none"),
        ({"s_hat.step": torch.full(ROWS, 1e300, dtype=F64)}, "s_hat decodes to values past float32's range"),
        (
            {"s_hat": torch.ones(2, 2, 8, dtype=torch.int8)},
            "s_hat is torch.int8: a store holds float32, float16 or int16 codes",
        ),
        ({"s_hat": torch.ones(2, 2, 8, dtype=torch.int32)}, "s_hat is torch.int32: a store holds"),
        ({"key0": torch.ones(2, 2, 8, dtype=torch.bool)}, "key0 is torch.bool: a store holds"),
        (
            {"key0": torch.zeros(2, 2, 8), "key0.low": None, "key0.step": None},
            "key0 is torch.float32 but s_hat torch.int16: a store codes both alike",
        ),
        ({"nll": torch.ones(8, dtype=torch.int64)}, "nll is torch.int64: a store holds it as float32"),
    ],
)
def test_every_stored_field_is_checked_against_the_layout(tmp_path, changes, reason):
    path = _rewritten(tmp_path, {f"r/8/0/{name}": t for name, t in changes.items()})
    with pytest.raises(ValueError) as err:
        load_profiles(path)
    assert str(err.value).startswith(f"measurement store {path}: entry 'r/8/0' is malformed ({reason}")


@pytest.mark.parametrize(
    "name, why",
    [
        ("r/8/0/extra", "is not part of a store's layout"),
        ("r/16/0/nll", "has no r/16/0/s_hat beside it"),
        ("r/8/0/x/window/r", "is not part of a store's layout"),
    ],
)
def test_tensors_outside_the_layout_are_refused(tmp_path, name, why):
    path = _rewritten(tmp_path, {name: torch.ones(8)})
    with pytest.raises(ValueError) as err:
        load_profiles(path)
    assert str(err.value) == f"measurement store {path}: tensor {name!r} {why}"
    stray = _rewritten(tmp_path, {"r/8/0/s_hat.low": torch.zeros(ROWS, dtype=F64)}, torch.float32)
    with pytest.raises(
        ValueError, match=r"\(s_hat.low and s_hat.step belong to int16 codes, but s_hat is torch.float32"
    ):
        load_profiles(stray)


@pytest.mark.parametrize("spelling", ["08", "+8", "8_0", " 8"])
def test_two_spellings_of_one_eval_length_are_refused(tmp_path, spelling):
    """``r/08/0`` beside ``r/8/0`` would be a second entry of one profile: only plain decimal is read."""
    path = _rewritten(tmp_path, {f"r/{spelling}/0/s_hat": torch.zeros(2, 2, 8), f"r/{spelling}/0/nll": torch.ones(8)})
    with pytest.raises(ValueError) as err:
        load_profiles(path)
    assert str(err.value) == (
        f"measurement store {path}: entry 'r/{spelling}/0' is malformed (a key is <run>/<eval length in "
        "plain decimal>/<0 or 1>, so that no two keys name one profile)"
    )


@pytest.mark.parametrize(
    "name, t, reason",
    [
        ("r/copy/0/gaps", torch.tensor([0, 2, 2]), "gaps must be distinct and >= 0, got [0, 2, 2]"),
        ("r/copy/0/gaps", torch.tensor([0, -2, 6]), "gaps must be distinct and >= 0, got [0, -2, 6]"),
        ("r/copy/0/gaps", torch.tensor([0, math.nan, 6]), "gaps must be int64 (gaps,); got torch.float32 (3,)"),
        ("r/copy/0/gaps", torch.tensor([[0, 2, 6]]), "gaps must be int64 (gaps,); got torch.int64 (1, 3)"),
        ("r/copy/0/nll_copy", torch.rand(3), "nll_copy must be finite floats (3, probes); got torch.float32 (3,)"),
        ("r/copy/0/nll_control", torch.full((3, 4), math.nan), "nll_control must be finite floats (3, probes)"),
        ("r/x/copy/0/gaps", torch.tensor([0]), "a copy curve is named <run>/copy/<0 or 1>"),
    ],
)
def test_copy_curves_are_checked_at_read_naming_the_store_and_curve(tmp_path, name, t, reason):
    path = _rewritten(tmp_path, {name: t})
    with pytest.raises(ValueError) as err:
        load_curves(path)
    curve = name.rsplit("/", 1)[0]
    assert str(err.value).startswith(f"measurement store {path}: copy curve {curve!r} is malformed ({reason}")
    assert set(load_curves(_rewritten(tmp_path, {}))) == {("r", False)}


def test_heads_averaged_must_name_profiles_of_one_head(tmp_path):
    """A length listed as averaged has no mean-R records: its profile must hold the one mean "head"."""
    meta = {"encoding": "rope", "seed": 0, "train_len": 4, "heads_averaged": [8]}
    with pytest.raises(ValueError, match=r"^run 'r' at eval_len 8: heads_averaged lists 8, but s_hat holds 2 heads"):
        _profile(meta=meta)
    assert _profile(meta=meta, s_hat=torch.zeros(2, 1, 8)).heads_averaged
    assert not _profile(meta={**meta, "heads_averaged": [16]}).heads_averaged
    for bad in (8, [8.0], "8", [True]):
        with pytest.raises(ValueError, match=r"^run 'r': heads_averaged must be a list of eval lengths"):
            _profile(meta={**meta, "heads_averaged": bad})
    path = _rewritten(tmp_path, {})
    header = json.dumps({"runs": {"r": meta}})
    from safetensors.torch import load_file, save_file

    save_file(load_file(path), path, metadata={"attnres": header})
    with pytest.raises(ValueError, match=r"entry 'r/8/0' is malformed \(run 'r' at eval_len 8: heads_averaged lists"):
        load_profiles(path)


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
        cli_main(["results", "--json", str(path)])
    assert one_line(exit_info) == f"error: {err.value}"


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
    cli_main(["results", "--json", str(path)])
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert {(r["perplexity"], r["perplexity_first_L"], r["perplexity_past_L"]) for r in out} == {(None, None, None)}
    cli_main(["results", str(path)])  # the text form: inf, no OverflowError
    assert "ppl <L inf" in capsys.readouterr().out


def test_results_store_empty_string_is_refused():
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["results", ""])
    assert one_line(exit_info) == "error: STORE must name a store file, got an empty string"


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


@pytest.fixture
def fifo(tmp_path):
    """A named pipe with a writer's end held open by the test, so that a reader that opened it would not
    block (the test fails rather than hangs); every store reader must refuse it unread."""
    import os

    path = tmp_path / "pipe.safetensors"
    os.mkfifo(path)
    held = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    yield path
    os.close(held)


def test_a_store_that_is_not_a_regular_file_is_refused_unopened(cli, fifo, tmp_path):
    """Issue 44 #11: `results --store PIPE` blocked forever (the configurations-store check opened it first).
    Every reader of a store checks that it is a regular file before opening it: one line, exit 1."""
    from attnres_helpers.store import load_curves, load_window_values

    message = f"measurement store {fifo} is a named pipe, not a regular file; give a regular file"
    for read in (load_profiles, load_curves, load_window_values):
        with pytest.raises(ValueError) as err:
            read(fifo)
        assert str(err.value) == message, read
    out = cli("results", str(fifo))
    assert out.returncode == 1 and out.stderr.splitlines() == [f"error: {message}"]
    out = cli("results", str(tmp_path))
    assert out.stderr.splitlines() == [
        f"error: measurement store {tmp_path} is a folder, not a regular file; give a regular file"
    ]


@pytest.mark.parametrize(
    "name, kind, reader",
    [
        ("copy_control", "the copy probe's scrambled control", "notebooks 03 and 05 read it"),
        ("sinks", "a sinks file", "notebook 07 reads it"),
        ("configurations", "a configurations store", "`attnres results "),
    ],
)
def test_a_shipped_file_of_another_kind_is_named_with_what_reads_it(cli, name, kind, reader):
    """Issue 44 #12: `results --store` on copy_control.safetensors or sinks.safetensors, and the trained
    explorer on the configurations store, called sound shipped files "corrupt or not a store ('attnres')"."""
    from attnres_helpers.paths import STORES

    with pytest.raises(ValueError) as err:
        load_profiles(STORES[name])
    message = str(err.value)
    assert message.startswith(f"{STORES[name]} is {kind}") and reader in message and "\n" not in message, message
    if name != "configurations":  # results prints that one
        out = cli("results", str(STORES[name]))
        assert out.returncode == 1 and out.stderr.splitlines() == [f"error: {message}"]


def test_every_shipped_store_is_opened_by_the_one_reader_by_its_header():
    """store.open_store reads every store file, its kind told by its header: each shipped file is one kind,
    opens as it, and asked as any other kind is refused unread, saying what it is (STORE_KINDS)."""
    import re

    from attnres_helpers.paths import RESULTS
    from attnres_helpers.store import STORE_KINDS, OtherStore, open_store, store_kind

    shipped = sorted(RESULTS.glob("*.safetensors"))
    assert len(shipped) >= 10
    for path in shipped:
        kind = store_kind(path)
        assert kind in STORE_KINDS, path
        assert open_store(path, (kind,))[0] == kind
        with pytest.raises(OtherStore, match=rf"^{re.escape(str(path))} is {re.escape(STORE_KINDS[kind][:20])}"):
            open_store(path, tuple(k for k in STORE_KINDS if k != kind))
