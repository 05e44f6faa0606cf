"""Design-time R of a real model (issue 41): closed-form checks that can fail.

- the identity: the model as trained, on the windows its correlations were measured on, gives back the
  measured ŝ (with and without the first-token entries) at every layer;
- layer 0 (whose input has no position) under every configuration whose distance depends on n alone
  equals that configuration's measured ŝ; Self-Extend comes close (its grouped distance depends on i mod G);
- unit content reduces to notebook 02's design-time RoPE curve;
- the mean phase over pairs under a remap agrees with each pair's distance written from the rule's
  definition (:meth:`Remap.distance`), and a wrong sign or a wrong distance map breaks the identities;
- the command line: bad input in one line before any work, and a run on a tiny Llama folder;
- the score against measured R on synthetic input.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import tiny_llama

from attnres_helpers import design_store, design_vs_measured
from attnres_helpers import design_time as dt
from attnres_helpers.encodings import rope_score_curve
from attnres_helpers.masks import Mask
from attnres_helpers.metric import resolution, sink_free_scores

hf_dt = pytest.importorskip("attnres_helpers.hf.design_time")
from attnres_helpers.hf import configured_attention as ca  # noqa: E402
from attnres_helpers.hf.configurations import CONFIGURATIONS, Remap, applied  # noqa: E402

N = 64  # the pass; the configurations' L is N/2 for checks inside the pass (every window and factor in play)
POSITION_ONLY = ("pi-2", "yarn-2", "yarn-4", "ntk-2", "ntk-static-2", "rerope-4", "leaky-rerope-4-16", "window")
SELF_EXTEND = ("self-extend-8-8", "self-extend-16-16")
IDENTITY_TOL = 1e-9  # of max |ŝ|: float64 throughout once q and k are captured
LAYER0_TOL = 1e-6  # of max |ŝ|: the measured path rotates in float32


class _Stop(Exception):
    pass


def measured(model, name: str, ids: torch.Tensor, train_len: int, layers: int | None = None):
    """The configuration's measured ŝ and ŝ without key 0 (layers, T), head means, as plan v4 measures them."""
    out = []
    T = len(ids)

    def consume(layer):
        out.append((ca.configured_s_hat(layer).mean(0), ca.configured_key0(layer).mean(0)))
        if layers is not None and len(out) == layers:
            raise _Stop

    try:
        with torch.no_grad(), applied(model, CONFIGURATIONS[name], train_len), ca.capturing(consume):
            model.base_model(input_ids=ids[None], use_cache=False)
    except _Stop:
        pass
    s = torch.stack([o[0] for o in out])
    counts = CONFIGURATIONS[name].mask_for(train_len).pair_counts(T)
    return s, sink_free_scores(s, torch.stack([o[1] for o in out]), counts)


def design(model, corr, name: str, train_len: int, T: int):
    return dt.design_s_hat(corr, hf_dt.form(model, CONFIGURATIONS[name], train_len, T), T)


def assert_same(a: torch.Tensor, b: torch.Tensor, tol: float):
    """Equal -inf pattern, and finite entries within tol · max |b|."""
    assert torch.equal(torch.isfinite(a), torch.isfinite(b))
    finite = torch.isfinite(b)
    err = (a - b)[finite].abs().max().item()
    assert err <= tol * b[finite].abs().max().item(), (err, b[finite].abs().max().item())


@pytest.fixture(scope="module")
def llama():
    """A random 2-layer Llama of context 32 (so dynamic NTK grows its base at N = 64), its q and k
    projections scaled so that scores span about a nat; two windows of random tokens."""
    model = tiny_llama(hidden_size=32, layers=2, heads=4, kv_heads=2, context=32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= 8
            layer.self_attn.k_proj.weight *= 8
    ids = torch.randint(0, 256, (2, N), generator=torch.Generator().manual_seed(1))
    return model, ids, hf_dt.correlations(model, list(ids), N)


# ------------------------------------------------------------------------------------------ the identities


def test_the_model_as_trained_gives_back_its_measured_s_hat_at_every_layer(llama):
    """Two windows: the design-time ŝ equals the mean of the two measured ŝ, with and without key 0."""
    model, ids, corr = llama
    runs = [measured(model, "as-trained", w, N) for w in ids]
    s, free = design(model, corr, "as-trained", N, N)
    assert corr.windows == 2 and s.shape == (2, N)
    assert_same(s, (runs[0][0] + runs[1][0]) / 2, IDENTITY_TOL)
    assert_same(free, (runs[0][1] + runs[1][1]) / 2, IDENTITY_TOL)


@pytest.mark.parametrize("name", POSITION_ONLY)
def test_layer_0_under_a_distance_of_n_alone_equals_its_measured_s_hat(llama, name):
    """Inside the pass (T = N = 2L'), every factor, window and clamp in play; ntk-2 has grown its base."""
    model, ids, _ = llama
    corr = hf_dt.correlations(model, [ids[0]], N)
    m, m_free = measured(model, name, ids[0], N // 2, layers=1)
    s, free = design(model, corr, name, N // 2, N)
    assert_same(s[:1], m, LAYER0_TOL)
    assert_same(free[:1], m_free, LAYER0_TOL)


def test_dynamic_ntk_is_checked_where_it_differs_from_the_model_as_trained(llama):
    model, _, _ = llama
    assert not torch.equal(
        hf_dt.form(model, CONFIGURATIONS["ntk-2"], 16, N).theta,
        hf_dt.form(model, CONFIGURATIONS["as-trained"], 16, N).theta,
    )


@pytest.mark.parametrize("name", SELF_EXTEND)
def test_self_extend_at_layer_0_is_close_not_equal(llama, name):
    """Its far distance depends on i mod G; the design averages the phase over the pairs with one C_f(n).
    Measured here: max error 3.3% and 5.6% of max |ŝ|; R within 1.0% and 2.3%."""
    model, ids, _ = llama
    corr = hf_dt.correlations(model, [ids[0]], N)
    m, _ = measured(model, name, ids[0], N // 2, layers=1)
    s, _ = design(model, corr, name, N // 2, N)
    err = (s[0] - m[0]).abs().max() / m[0].abs().max()
    assert 1e-4 < err < 0.15
    assert abs(resolution(s[0]) / resolution(m[0]) - 1) < 0.05


# ------------------------------------------------------------------------------------------ the form


@pytest.mark.parametrize(("N_", "d", "base"), [(64, 64, 10000.0), (300, 32, 500.0), (1024, 64, 100000.0)])
def test_unit_content_is_notebook_02s_rope_curve(N_, d, base):
    expected = rope_score_curve(N_, d, base, scale=d**0.5)
    np.testing.assert_allclose(dt.rope_curve(N_, d, base).numpy(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("rule", "window", "params"), [("self-extend", 4, (4,)), ("rerope", 8, ()), ("leaky-rerope", 8, (4,))]
)
def test_the_mean_phase_over_pairs_follows_each_pairs_distance(rule, window, params):
    """Φ_f(n) against the mean over the bulk pairs (keys ≥ 1) of a² e^{iθ d(i, j)}, d from Remap.distance."""
    T, theta, factor = 40, torch.tensor([0.9, 0.3, 0.05], dtype=torch.float64), 1.3
    remap = Remap(rule, window, params)
    phase = dt.bulk_phase(dt.Form(theta, factor, Mask(), remap), T)
    i, j = torch.tril_indices(T, T)
    keep = j >= 1
    i, j = i[keep], j[keep]
    d = remap.distance(i, j)
    pairs = factor**2 * torch.polar(torch.ones(len(d), 3, dtype=torch.float64), d[:, None] * theta)
    for n in range(T - 1):
        at = (i - j) == n
        torch.testing.assert_close(phase[:, n], pairs[at].mean(0), atol=1e-12, rtol=0)


def test_constant_content_gives_a_flat_s_hat_where_the_mask_has_pairs():
    """θ = 0 and C_f = 1 everywhere: every pair scores scaling · a² · F, so ŝ is flat, -inf exactly where
    the mask has no pair, and without key 0 -inf where key 0's was the only one."""
    F, T = 4, 48
    one = torch.ones(1, F, 8, dtype=torch.complex128)
    corr = dt.Correlations(
        one,
        one.clone(),
        torch.ones(1, 1, F) + 0j,
        torch.ones(1, 1, F) + 0j,
        torch.ones(1, 1, dt.FIRST_KEYS, F) + 0j,
        0.5,
        1,
    )
    for mask in (Mask(), Mask("bca", 8), Mask("window", 16, 4), Mask("bca", 12, 4)):
        s, free = dt.design_s_hat(corr, dt.Form(torch.zeros(F, dtype=torch.float64), 2.0, mask), T)
        counts = mask.pair_counts(T)
        assert torch.equal(torch.isfinite(s[0]), counts > 0)
        torch.testing.assert_close(s[0][counts > 0], torch.full_like(s[0][counts > 0], 0.5 * 4 * F))
        has_key0 = mask.allowed_pairs(torch.arange(T), torch.zeros(T, dtype=torch.long))
        assert torch.equal(torch.isfinite(free[0]), counts - has_key0.double() > 0)


def test_a_rotary_whose_phase_is_not_inv_freq_times_position_is_refused():
    class Odd(torch.nn.Module):
        inv_freq, attention_scaling = torch.tensor([1.0, 0.1]), 1.0

        def forward(self, x, position_ids):
            angle = position_ids[..., None].float() ** 1.5 * self.inv_freq
            return torch.cat((angle, angle), -1).cos(), torch.cat((angle, angle), -1).sin()

    with pytest.raises(ValueError, match="not inv_freq × position"):
        hf_dt._frequencies(Odd(), torch.arange(50))


def test_passes_of_two_lengths_or_two_depths_are_refused():
    sums = dt.CorrelationSums()
    z = torch.ones(2, 4, 16, dtype=torch.complex128)
    sums.add(z, z, 0.5)
    sums.end_window()
    with pytest.raises(ValueError, match="one length"):
        sums.add(z[..., :8], z[..., :8], 0.5)
    with pytest.raises(ValueError, match="more layers"):
        sums.add(z, z, 0.5)
        sums.add(z, z, 0.5)
    assert dt.CorrelationSums().add(z, z, 0.5) is None


# ------------------------------------------------------------------------------------------ mutations


def test_the_wrong_sign_of_the_angle_breaks_the_identity(llama):
    model, ids, corr = llama
    m = (measured(model, "as-trained", ids[0], N)[0] + measured(model, "as-trained", ids[1], N)[0]) / 2
    right, _ = design(model, corr, "as-trained", N, N)
    right_form = hf_dt.form(model, CONFIGURATIONS["as-trained"], N, N)
    s, _ = dt.design_s_hat(corr, dataclasses.replace(right_form, theta=-right_form.theta), N)
    assert (s - m).abs().max() > 100 * (right - m).abs().max() + 1e-3 * m.abs().max()


def test_the_wrong_distance_map_breaks_layer_0(llama):
    """ReRoPE's far pairs taken at their true distance (no clamp) miss its measured ŝ."""
    model, ids, _ = llama
    corr = hf_dt.correlations(model, [ids[0]], N)
    m, _ = measured(model, "rerope-4", ids[0], N // 2, layers=1)
    f = hf_dt.form(model, CONFIGURATIONS["rerope-4"], N // 2, N)
    s, _ = dt.design_s_hat(corr, dataclasses.replace(f, remap=None), N)
    assert (s[0] - m[0]).abs().max() > 1e-2 * m[0].abs().max()


# ------------------------------------------------------------------------------------------ scored


def test_score_on_synthetic_input():
    layers = 3
    measured_r = {f"c{i}": torch.full((layers,), 0.1 * (i + 1), dtype=torch.float64) for i in range(5)}
    design_r = {name: 2 * r for name, r in measured_r.items()}
    out = dt.score(design_r, measured_r)
    np.testing.assert_allclose(out["ratio"], 2.0)
    np.testing.assert_allclose(out["mean_ratio"], 2.0)
    assert out["rho"] == pytest.approx(1.0) and np.allclose(out["rho_layers"], 1.0) and out["interval"] is None
    reversed_r = {name: 1 / r for name, r in measured_r.items()}
    assert dt.score(reversed_r, measured_r)["rho"] == pytest.approx(-1.0)
    tied = {**design_r, "c4": design_r["c3"]}  # mid-ranks: ranks 1, 2, 3, 4.5, 4.5 against 1 … 5
    assert dt.score(tied, measured_r)["rho"] == pytest.approx(np.corrcoef([1, 2, 3, 4.5, 4.5], [1, 2, 3, 4, 5])[0, 1])
    # per-window R: windows that agree give a degenerate interval at ρ; the measured mean is the windows' mean
    windows = {name: torch.stack([r, r, r]) for name, r in measured_r.items()}
    out = dt.score(design_r, measured_r, windows, resamples=200)
    assert out["interval"] == pytest.approx((1.0, 1.0)) and np.allclose(
        out["measured"][:, 0], [0.1, 0.2, 0.3, 0.4, 0.5]
    )
    # one window of three orders the configurations the other way: resamples with two or three draws of it
    # (7 in 27) give ρ = −1, the rest +1
    noisy = {name: torch.stack([r, 0.6 - r, r]) for name, r in measured_r.items()}
    assert dt.score(design_r, measured_r, noisy, resamples=500)["interval"] == pytest.approx((-1.0, 1.0))
    with pytest.raises(ValueError, match="at least 2"):
        dt.score({"a": design_r["c0"]}, measured_r)


# ------------------------------------------------------------------------------------------ SmolLM2


@pytest.fixture(scope="module")
def smollm2(registry_model):
    """SmolLM2-135M, plan v4's first text window of 512 tokens, and its correlations from one pass."""
    from attnres_helpers.hf import fetch
    from attnres_helpers.hf.folders import load_tokenizer
    from attnres_helpers.hf.models import SMOLLM2

    model = registry_model(SMOLLM2)
    ids = hf_dt.text_windows(load_tokenizer(fetch.model_dir(SMOLLM2)), 512)[0]
    return model, ids, hf_dt.correlations(model, [ids], 512)


@pytest.mark.pretrained
def test_smollm2_as_trained_gives_back_its_measured_s_hat_at_every_layer(smollm2):
    """Seen: 9.5e-13 nats at most (max |ŝ| 12.6), 30 layers."""
    model, ids, corr = smollm2
    m, m_free = measured(model, "as-trained", ids, 512)
    s, free = design(model, corr, "as-trained", 512, 512)
    assert s.shape == (30, 512)
    assert_same(s, m, IDENTITY_TOL)
    assert_same(free, m_free, IDENTITY_TOL)


@pytest.mark.pretrained
@pytest.mark.parametrize("name", [*POSITION_ONLY, *SELF_EXTEND])
def test_smollm2_layer_0_under_each_configuration(smollm2, name):
    """T = 512 with the configurations' L = 256 (ntk-2 is the model as trained there: SmolLM2's context is
    8192). Distance of n alone: equal to 1e-5 of max |ŝ| (seen at most 2.8e-6 nats, 8.9e-7 of max |ŝ|: the
    measured path rotates in float32). Self-Extend (8, 8) and (16, 16): seen max error 3.0e-2 and 2.2e-2
    nats (1.2% and 0.9% of max |ŝ|; RMS 7e-3 and 4e-3), R within 5.4e-4 and 1.0e-3 relative, with and
    without key 0."""
    model, ids, corr = smollm2
    m, m_free = measured(model, name, ids, 256, layers=1)
    s, free = design(model, corr, name, 256, 512)
    if name in SELF_EXTEND:
        assert (s[0] - m[0]).abs().max() < 0.05
        for a, b in ((s[0], m[0]), (free[0], m_free[0])):
            assert abs(resolution(a) / resolution(b) - 1) < 1e-2
    else:
        assert_same(s[:1], m, 1e-5)
        assert_same(free[:1], m_free, 1e-5)


# ------------------------------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A random one-layer Llama of context 64 with SmolLM2's tokenizer (where the cache holds it), and a
    GPT-2 of no rotary embedding, as `transformers` folders."""
    import transformers
    from helpers import tiny_llama_folder

    root = tmp_path_factory.mktemp("design-time")
    tiny_llama_folder(root / "llama", 64)
    gpt2 = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, n_positions=64, vocab_size=256)
    transformers.AutoModelForCausalLM.from_config(gpt2).save_pretrained(root / "gpt2")
    return root


def test_the_command_refuses_bad_input_in_one_line_before_any_work(folders, cli, monkeypatch):
    from attnres_helpers.hf import design_time as module

    monkeypatch.setattr(module, "correlations", lambda *a: pytest.fail("work began"))
    llama = str(folders / "llama")
    cases = {
        ("--model", llama, "--configuration", "yarn-3"): (2, "unknown configuration yarn-3"),
        ("--model", llama, "--configuration", "yarn-2", "--lengths", "0.5,2"): (1, "under one window"),
        ("--model", str(folders / "gpt2"), "--configuration", "yarn-2"): (1, "no rotary embedding"),
        ("--model", llama, "--configuration", "yarn-2", "--pass-len", "65"): (1, "3 to L = 64 tokens"),
        ("--model", str(folders / "absent"), "--configuration", "yarn-2"): (1, "does not exist"),
    }
    for args, (code, message) in cases.items():
        result = cli("design-time", *args)
        assert result.returncode == code and message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.pretrained
def test_the_command_writes_a_design_time_store_with_store(folders, cli, tmp_path):
    """``design-time --store PATH``: the pass's C_f(n) on the grid, read back by the store's own reader,
    its header naming the command that made it; ``--store`` with ``--configuration`` is a usage error."""
    if not (folders / "llama" / "tokenizer.json").exists():
        pytest.skip("SmolLM2's tokenizer is absent (make pretrained)")
    path = tmp_path / "design.safetensors"
    result = cli("design-time", "--model", str(folders / "llama"), "--store", str(path))
    assert result.returncode == 0 and result.stdout.startswith(f"wrote {path}: llama"), result.stderr
    store = design_store.load_store(path)
    assert store.about["train_len"] == 64 and store.about["command"].startswith("python -m attnres_helpers design-time")
    both = cli("design-time", "--configuration", "yarn-2", "--store", str(path))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


@pytest.mark.pretrained
def test_the_command_prints_the_design_time_pair_per_layer(folders, cli):
    """A tiny Llama folder (with SmolLM2's tokenizer) under Self-Extend and YaRN at L, 2L and 4L."""
    if not (folders / "llama" / "tokenizer.json").exists():
        pytest.skip("SmolLM2's tokenizer is absent (make pretrained)")
    args = ["--model", str(folders / "llama"), "--configuration", "self-extend-8-8,yarn-2", "--lengths", "1,2,4"]
    result = cli("design-time", *args)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("design-time R of llama (L = 64;")
    for name in ("self-extend-8-8", "yarn-2"):
        at = lines.index(next(line for line in lines if line.startswith(name + ": design")))
        approximate = lines[at + 1 : at + 4]
        assert [line.split(":")[0] for line in approximate] == [f"  approximate at T = {T}" for T in (64, 128, 256)]
        assert ("Self-Extend's grouped distance" in approximate[0]) == (name == "self-extend-8-8")
        assert "far value" not in approximate[0] and "far value" in approximate[1]
        assert all("layers above 0" in line for line in approximate)  # both change the model inside L
        at += 3
        assert lines[at + 1].split() == ["layer", "R(64)", "no", "sink", "R(128)", "no", "sink", "R(256)", "no", "sink"]
        values = [float(v) for v in lines[at + 2].split()[1:]]
        assert len(values) == 6 and all(0 < v < 1 for v in values)
        assert lines[at + 3].startswith(" mean ")


# ------------------------------------------------------------------------------------------ model-free form


def _model_part(model) -> dict:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "rope_parameters": dict(config.rope_parameters),
        "head_dim": head_dim,
        "max_position_embeddings": config.max_position_embeddings,
    }


@pytest.fixture(scope="module")
def wide_llama():
    """A Llama whose heads are SmolLM2's (head_dim 64, θ = 100000), context 64: the frequencies at scale."""
    return tiny_llama(hidden_size=64, layers=1, heads=1, kv_heads=1, context=64, rope_theta=100000.0)


def _family_configurations():
    from attnres_helpers.widgets.design_time import FAMILIES, configuration

    return [configuration(f.name, v) for f in FAMILIES.values() for v in (f.low, f.default, f.high)]


@pytest.mark.parametrize("which", ["llama", "wide_llama"])
def test_the_model_free_form_is_the_rotary_modules_form(which, request):
    """θ, the attention factor, remap and mask from the configuration and the model's RoPE parameters alone
    equal what the rotary module the configuration gives the model rotates by (every registry entry and the
    explorer's families at both ends and their default; inside and past the model's context, where dynamic
    NTK grows its base)."""
    fixture = request.getfixturevalue(which)
    model = fixture[0] if isinstance(fixture, tuple) else fixture
    part, context = _model_part(model), model.config.max_position_embeddings
    for configuration in CONFIGURATIONS.values():
        for train_len, T in ((context // 2, context), (context, 2 * context), (context, 3 * context + 5)):
            got = dt.model_form(part, configuration, train_len, T)
            want = hf_dt.form(model, configuration, train_len, T)
            assert torch.equal(got.theta, want.theta), (configuration.name, T)
            assert got.factor == want.factor and got.remap == want.remap and got.mask == want.mask
            assert want.theta_far is None or torch.equal(want.theta_far, got.theta)
    for configuration in _family_configurations():  # not in the registry: the module built as applied() builds it
        for train_len, T in ((64, 64), (64, 3 * context + 5)):  # L = 64: every family's sizes are whole tokens
            got = dt.model_form(part, configuration, train_len, T)
            theta, factor = _rotary_frequencies(model, configuration, train_len, T)
            assert torch.equal(got.theta, theta) and got.factor == factor, (configuration.name, T)


def _rotary_frequencies(model, configuration, train_len: int, T: int):
    """θ and a of a fresh rotary module of the model's type with the configuration's RoPE parameters."""
    before = dict(model.config.rope_parameters)
    rope = configuration.rope_for(before["rope_theta"], train_len, _model_part(model)["head_dim"])
    try:
        model.config.rope_parameters = rope or before
        return hf_dt._frequencies(type(model.base_model.rotary_emb)(config=model.config), torch.arange(T))
    finally:
        model.config.rope_parameters = before


def test_an_unknown_rope_type_is_refused():
    with pytest.raises(ValueError, match="no design-time form"):
        dt.rope_frequencies({"rope_type": "longrope", "rope_theta": 1e4}, 64, 128, 256)


@pytest.mark.parametrize("mask", [Mask("bca", 8), Mask("bca", 5, 3), Mask("bca", 64, 4), Mask("window", 16, 4), Mask()])
@pytest.mark.parametrize("T", [40, 97, 256])
def test_bcas_closed_form_pair_counts_are_the_masks(mask, T):
    assert torch.equal(dt.pair_counts(mask, T), mask.pair_counts(T))


def test_self_extends_closed_form_phase_when_g_does_not_divide_w():
    """W = 6, G = 4 (W/G = 1.5: the patch's true division) at an odd T, against each pair's distance."""
    T, theta = 45, torch.tensor([0.7, 0.2], dtype=torch.float64)
    remap = Remap("self-extend", 6, (4,))
    phase = dt.bulk_phase(dt.Form(theta, 1.1, Mask(), remap), T)
    i, j = torch.tril_indices(T, T)
    keep = j >= 1
    i, j = i[keep], j[keep]
    pairs = 1.1**2 * torch.polar(torch.ones(len(i), 2, dtype=torch.float64), remap.distance(i, j)[:, None] * theta)
    for n in range(T - 1):
        torch.testing.assert_close(phase[:, n], pairs[(i - j) == n].mean(0), atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------------ the shipped store


def _synthetic(N: int = 3000, layers: int = 2, F: int = 4, seed: int = 0) -> dt.Correlations:
    """Slowly varying content with noise that shrinks with the pairs at each distance, like a real pass."""
    g = torch.Generator().manual_seed(seed)
    n = torch.arange(N, dtype=torch.float64)
    pairs = (N - 1 - n).clamp(min=1)
    smooth = torch.exp(-n / 700)[None, None] * torch.linspace(1, 3, F, dtype=torch.float64)[None, :, None]
    noise = torch.randn(layers, F, N, 2, generator=g, dtype=torch.float64) / pairs.sqrt()[:, None]
    bulk = (smooth + 2.0) * (1 + 0.5j) + torch.complex(noise[..., 0], noise[..., 1])
    key0 = torch.complex(*torch.randn(2, layers, F, N, generator=g, dtype=torch.float64))
    means = torch.complex(*torch.randn(2, layers, 3, F, generator=g, dtype=torch.float64))
    first = torch.complex(*torch.randn(2, layers, 3, dt.FIRST_KEYS, F, generator=g, dtype=torch.float64))
    return dt.Correlations(bulk, key0, means, means.conj(), first, 0.125, 1)


ABOUT = {
    "model": "synthetic",
    "train_len": 3000,
    "text": "none",
    "head_dim": 8,
    "max_position_embeddings": 3000,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "command": "a test",
}


def test_the_store_round_trips_what_reduced_gives(tmp_path):
    corr = _synthetic()
    path = tmp_path / "dt.safetensors"
    design_store.save_store(path, corr, ABOUT)
    got, want = design_store.load_store(path), design_store.reduced(corr, ABOUT)
    for name in design_store.PARTS:
        assert torch.equal(got.grids[name], want.grids[name]) and torch.equal(got.parts[name], want.parts[name])
    assert torch.equal(got.far, want.far) and torch.equal(got.far_first, want.far_first)
    assert got.about["pass_len"] == 3000 and got.about["scaling"] == 0.125 and got.about["layers"] == 2
    assert got.model == {k: ABOUT[k] for k in ("rope_parameters", "head_dim", "max_position_embeddings")}
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically, nothing left beside it
    # the far values are the pass's (float32), the grid keeps every dense knot's own value (float16)
    torch.testing.assert_close(got.far, corr.far(), atol=1e-6, rtol=1e-6)
    grid = got.grids["bulk"]
    torch.testing.assert_close(got.parts["bulk"][..., :31], corr.bulk[..., :31], atol=2e-3, rtol=2e-3)
    assert grid[:32].tolist() == list(range(32)) and grid[-24:].tolist() == list(range(3000 - 24, 3000))


def test_reduce_and_expand_are_exact_where_they_should_be():
    grid = design_store.reduction_grid(1000, 16, 30, 8)
    line = torch.arange(1000, dtype=torch.float64)[None] * 0.3 + 2
    torch.testing.assert_close(design_store.expand(line[..., grid], grid, 1000), line)  # linear between knots
    cells = design_store.reduce(line, grid)
    # a knot among dense neighbours on both sides keeps its own value (the last dense one's cell reaches on)
    torch.testing.assert_close(cells[..., :15], line[..., :15], rtol=1e-12, atol=0)
    torch.testing.assert_close(cells[..., -7:], line[..., -7:], rtol=1e-12, atol=0)  # cumulative sums: 4e-14
    torch.testing.assert_close(
        design_store.reduce(torch.ones(1, 1000, dtype=torch.float64), grid),
        torch.ones(1, len(grid), dtype=torch.float64),
    )
    assert torch.equal(
        design_store.reduction_grid(50, 16, 30, 8), torch.arange(50)
    )  # a short pass keeps every distance


def test_the_reduced_grid_costs_under_one_percent_of_design_time_r():
    """On the synthetic pass (noise like a real one's): every configuration's R at L and 2L within 1% per layer
    of the full pass's. The shipped store records the same measure on SmolLM2 (next test)."""
    corr = _synthetic()
    reduced = design_store.reduced(corr, ABOUT).correlations()
    for configuration in CONFIGURATIONS.values():
        for T in (3000, 6000):
            form = dt.model_form(ABOUT, configuration, 3000, T)
            full, got = dt.design_r(corr, form, T), dt.design_r(reduced, form, T)
            for key in ("r", "r_sink_free"):
                assert (got[key] / full[key] - 1).abs().max() < 1e-2, (configuration.name, T, key)


def test_the_shipped_store_reads_and_states_its_reduction_error():
    """Seen when it was built: 0.84% at most in a layer (Self-Extend W = L/16 without the sink, layer 20),
    0.12% in the layer mean, over the 16 configurations at L and 2L with and without the sink."""
    from attnres_helpers.paths import STORES

    store = design_store.load_store(STORES["design_time"])
    worst = store.about["reduction_error"]["largest"]
    assert worst["layer"] < 0.01 and worst["mean"] < 0.002
    assert set(store.about["reduction_error"]["by_configuration"]) == set(CONFIGURATIONS)
    assert store.about["train_len"] == store.about["pass_len"] == 8192 and store.about["layers"] == 30
    assert STORES["design_time"].stat().st_size < 1.5e6


def _rewrite(path, tmp_path, change_tensors=None, change_about=None):
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(path, framework="pt") as f:
        about = json.loads(f.metadata()[design_store.HEADER_KEY])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if change_tensors:
        change_tensors(tensors)
    if change_about:
        change_about(about)
    out = tmp_path / "bad.safetensors"
    save_file(tensors, out, {design_store.HEADER_KEY: json.dumps(about)})
    return out


BAD = {
    "format": (None, lambda a: a.update(format=2), "format must be 1"),
    "missing key": (None, lambda a: a.pop("rope_parameters"), "rope_parameters must be"),
    "pass past L": (None, lambda a: a.update(pass_len=4000), "pass_len must be"),
    "odd head": (None, lambda a: a.update(head_dim=7), "head_dim must be"),
    "bool": (None, lambda a: a.update(windows=True), "windows must be"),
    "grid": (lambda t: t["bulk.grid"].__setitem__(5, 4), None, "bulk.grid must rise strictly"),
    "dtype": (lambda t: t.update(bulk=t["bulk"].float()), None, "bulk must be float16"),
    "shape": (lambda t: t.update(key0=t["key0"][:1]), None, "key0 must be float16 (2, 4,"),
    "nan": (lambda t: t["far"].__setitem__((0, 0, 0), float("nan")), None, "far has NaN or inf"),
    "missing": (lambda t: t.pop("far_first"), None, "far_first is missing"),
    "stray": (lambda t: t.update(extra=torch.zeros(1)), None, "tensor 'extra' is not part of the layout"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_store_is_one_line_naming_the_field(case, tmp_path):
    path = tmp_path / "dt.safetensors"
    design_store.save_store(path, _synthetic(), ABOUT)
    tensors, about, message = BAD[case]
    bad = _rewrite(path, tmp_path, tensors, about)
    with pytest.raises(ValueError) as err:
        design_store.load_store(bad)
    text = str(err.value)
    assert text.startswith(f"design-time store {bad}: ") and message in text and "\n" not in text, text


def test_a_missing_or_foreign_store_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="is missing; make it with `python -m attnres_helpers design-time"):
        design_store.load_store(tmp_path / "absent.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a store")
    with pytest.raises(ValueError, match="^design-time store .*junk.safetensors is corrupt or not a store"):
        design_store.load_store(tmp_path / "junk.safetensors")
    from safetensors.torch import save_file

    # another kind of store is refused by the one reader of store files, saying what it is
    save_file({"x": torch.zeros(1)}, tmp_path / "other.safetensors", {"attnres-configurations": "{}"})
    with pytest.raises(ValueError, match=r"other.safetensors is a configurations store \(plans v3 and v4\)"):
        design_store.load_store(tmp_path / "other.safetensors")
    save_file({"x": torch.zeros(1)}, tmp_path / "none.safetensors", {"something": "{}"})
    with pytest.raises(ValueError, match="none.safetensors is corrupt or not a store"):
        design_store.load_store(tmp_path / "none.safetensors")


def test_carried_over_scores_are_the_same_numbers():
    """design_lengths cuts the longest T's content scores where the phase is one of n alone: the same ŝ."""
    corr = _synthetic(N=600)
    for name in ("yarn-2", "rerope-4", "self-extend-8-8", "bca-4", "streaming"):
        forms = {T: dt.model_form(ABOUT, CONFIGURATIONS[name], 600, T) for T in (600, 1200)}
        both = dt.design_lengths(corr, forms)
        for T, form in forms.items():
            alone = dt.design_r(corr, form, T)
            for key in ("s_hat", "s_hat_sink_free"):
                torch.testing.assert_close(both[T][key], alone[key], rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------ against the stores


@pytest.fixture(scope="module")
def stores():
    from attnres_helpers.configured_store import load
    from attnres_helpers.paths import STORES

    return design_store.load_store(STORES["design_time"]), load(STORES["configurations_v4"])


def test_against_the_measured_store(stores):
    design, measured = stores
    rows = design_vs_measured.against_measured(design, measured, CONFIGURATIONS)
    entries = {(n, T) for (n, T) in measured.entries}
    assert {(r["configuration"], r["T"]) for r in rows} == entries
    for r in rows:
        entry = measured.entries[(r["configuration"], r["T"])]
        assert torch.equal(r["measured"], entry.window_r.double().mean(0)) and r["windows"] == entry.windows
        assert r["design"].shape == (30,) and (r["design"] > 0).all() and (r["design"] < 1).all()
    out = design_vs_measured.score_rows(rows, "2L")
    if min(r["windows"] for r in rows) == 1:
        assert out["interval"] is None and "1 window" in out["degenerate"]
    assert -1 <= out["rho"] <= 1


def test_plan_v4s_secondary_predictor_is_a_constant_per_window_column(stores):
    from attnres_helpers import plan_v4

    design, measured = stores
    data = plan_v4.collect(measured)
    values = {n: 0.1 * (i + 1) for i, n in enumerate(data.names)}
    with_design = design_vs_measured.with_design(data, values)
    column = with_design.values[design_vs_measured.DESIGN_KEY]
    assert column.shape == with_design.values["R(2L)"].shape and np.all(column == column[:, :1])
    with pytest.raises(ValueError, match="no design-time R"):
        design_vs_measured.with_design(data, {})


# ------------------------------------------------------------------------------------------ the explorer


def test_each_family_gives_back_the_registrys_entries_at_their_values():
    from attnres_helpers.widgets.design_time import FAMILIES, configuration

    L = 8192
    for family in FAMILIES.values():
        for value, name in family.registry.items():
            assert value in family.values()
            got, want = configuration(family.name, value), CONFIGURATIONS[name]
            assert got.rope_for(1e5, L) == want.rope_for(1e5, L), name
            assert got.remap_for(L) == want.remap_for(L) and got.mask_for(L) == want.mask_for(L), name
    with pytest.raises(ValueError, match="must be in"):
        configuration("YaRN", 9.0)


def test_the_explorer_updates_its_readout_and_figure_on_every_control():
    from attnres_helpers.widgets import design_time as w

    root = w.design_time_explorer()
    c = root.controls
    catalogue = w.design_time_catalogue()
    first_png, drawn = c["plot"].value, root.drawer.drawn
    assert first_png and "YaRN, factor = 2</b>" in c["readout"].value and "measured (yarn-2" in c["readout"].value
    for control, value in (("param", 3.5), ("layer", 17), ("family", "Self-Extend"), ("param", 16.0)):
        before = c["plot"].value
        c[control].value = value
        state = w.design_time_state(catalogue, c["family"].value, c["param"].value, c["layer"].value)
        assert c["readout"].value == w.design_time_readout_html(state)
        assert c["plot"].value != before and root.drawer.drawn > drawn
        drawn = root.drawer.drawn
    assert "Self-Extend, group G (W = L/G) = 16" in c["readout"].value and "self-extend-16-16" in c["readout"].value
    assert c["param"].min == 2.0 and c["param"].max == 32.0


def test_the_explorers_float32_sums_are_float64s_r():
    from attnres_helpers.widgets import design_time as w

    catalogue = w.design_time_catalogue()
    state = w.design_time_state(catalogue, "leaky ReRoPE", 16.0, 3)
    corr = catalogue["design"].correlations()  # float64 sums
    form = dt.model_form(catalogue["design"].model, w.configuration("leaky ReRoPE", 16.0), 8192, 16384)
    want = dt.design_r(corr, form, 16384)
    for key in ("r", "r_sink_free"):
        torch.testing.assert_close(state["r"]["2L"][key], want[key], rtol=1e-4, atol=0)
