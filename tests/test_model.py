"""The model: shapes, what each encoding puts into the scores, BCA, and the capture path."""

import math

import pytest
import torch

from attnres_helpers.encodings import t5_buckets as t5_buckets_np
from attnres_helpers.measure import attention_scores, measure_windows
from attnres_helpers.model import MODEL_ENCODINGS, ModelConfig, Transformer, blockwise_causal_mask, preset
from attnres_helpers.positions import ENCODING_POSITIONS, alibi_slopes, apply_rotary, t5_buckets
from attnres_helpers.store import Profile, records


def tiny(encoding, **kw):
    """A random tiny model; the learned biases (zero and one at initialisation) get random values too."""
    torch.manual_seed(0)
    model = Transformer(preset("tiny", encoding=encoding, **kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "t5_bias" in name or "kerple" in name:
                p.uniform_(0.2, 2.0) if "kerple" in name else p.normal_()
    return model


@pytest.mark.parametrize("encoding", MODEL_ENCODINGS)
def test_shapes_and_capture_matches_sdpa(encoding):
    model = tiny(encoding)
    x = torch.randint(0, 256, (3, 24))
    logits, loss = model(x, x)
    assert logits.shape == (3, 24, 256) and loss.ndim == 0
    logits2, scores = model.forward_with_scores(x)
    assert len(scores) == model.cfg.n_layer
    assert all(s.shape == (3, model.cfg.n_head, 24, 24) for s in scores)
    torch.testing.assert_close(logits, logits2, atol=1e-5, rtol=1e-5)
    upper = ~torch.ones(24, 24, dtype=torch.bool).tril()
    assert torch.isneginf(scores[0][..., upper]).all()
    assert torch.isfinite(scores[0][..., ~upper]).all()


def manual_first_layer_scores(model, x):
    """q·kᵀ/√d + bias for layer 0, written out independently of the attention module."""
    cfg = model.cfg
    B, T = x.shape
    h = model.wte(x)
    if cfg.encoding == "sinusoidal":
        pos = torch.arange(T)[:, None].float()
        i = torch.arange(0, cfg.d_model, 2).float()
        pe = torch.zeros(T, cfg.d_model)
        pe[:, 0::2] = torch.sin(pos / 10000 ** (i / cfg.d_model))
        pe[:, 1::2] = torch.cos(pos / 10000 ** (i / cfg.d_model))
        h = h * math.sqrt(cfg.d_model) + pe
    h = model.blocks[0].ln_1(h)
    attn = model.blocks[0].attn
    q, k, _ = attn.qkv(h).split(cfg.d_model, dim=2)
    q = q.view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2)
    k = k.view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2)
    s = torch.zeros(B, cfg.n_head, T, T)
    half = cfg.head_dim // 2
    for i in range(T):
        for j in range(i + 1):
            qi, kj = q[:, :, i], k[:, :, j]
            if cfg.encoding in ("rope", "xpos"):
                theta = cfg.rope_base ** (-torch.arange(half).float() * 2 / cfg.head_dim)
                # pair (a, a+half) rotated by the angle difference (i - j)·θ
                c, sn = torch.cos((i - j) * theta), torch.sin((i - j) * theta)
                q1, q2, k1, k2 = qi[..., :half], qi[..., half:], kj[..., :half], kj[..., half:]
                per_pair = c * (q1 * k1 + q2 * k2) + sn * (q1 * k2 - q2 * k1)
                if cfg.encoding == "xpos":
                    zeta = (torch.arange(half).float() * 2 / cfg.head_dim + cfg.xpos_gamma) / (1 + cfg.xpos_gamma)
                    per_pair = per_pair * zeta ** ((i - j) / cfg.xpos_scale_base)
                dot = per_pair.sum(-1)
            else:
                dot = (qi * kj).sum(-1)
            s[:, :, i, j] = dot / math.sqrt(cfg.head_dim)
            if cfg.encoding == "alibi":
                s[:, :, i, j] -= alibi_slopes(cfg.n_head) * cfg.alibi_slope_scale * (i - j)
            if cfg.encoding == "t5":  # the table of layer 0 at T5's bucket (encodings' numpy version)
                s[:, :, i, j] += attn.t5_bias[int(t5_buckets_np(T, 32, max(cfg.train_len, 32))[i - j])]
            if cfg.encoding == "kerple":  # −p·log(1 + a·n), p and a clamped at 0.01
                p, a = attn.kerple_p.clamp(min=0.01), attn.kerple_a.clamp(min=0.01)
                s[:, :, i, j] -= p * torch.log(1 + a * (i - j))
    return s


@pytest.mark.parametrize("encoding", MODEL_ENCODINGS)
def test_captured_scores_equal_manual_qk_plus_bias(encoding):
    model = tiny(encoding, xpos_scale_base=8.0)  # a small B so the xPos decay is visible
    x = torch.randint(0, 256, (2, 12))
    got = attention_scores(model, x)[0]
    want = manual_first_layer_scores(model, x)
    lower = torch.ones(12, 12, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., lower], want[..., lower], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("encoding", ["rope", "xpos"])
def test_rotary_scores_depend_only_on_distance(encoding):
    """With the same q and k at every position, the score is a function of i − j alone
    (xPos's ζ^{(i−j)/B} scaling included: it is relative too once q and k are scaled)."""
    cfg = preset("tiny", encoding=encoding, xpos_scale_base=8.0)
    T, d = 20, cfg.head_dim
    tables = ENCODING_POSITIONS[encoding].tables(cfg, T, "cpu")
    cos, sin, q_scale, k_scale = (tables[name] for name in ("cos", "sin", "q_scale", "k_scale"))
    v = torch.randn(1, 1, 1, d).expand(1, 1, T, d)
    w = torch.randn(1, 1, 1, d).expand(1, 1, T, d)
    s = apply_rotary(v, cos, sin, q_scale) @ apply_rotary(w, cos, sin, k_scale).transpose(-2, -1)  # (1,1,T,T)
    s = s[0, 0]
    for n in range(T):
        diag = torch.diagonal(s, offset=-n)
        torch.testing.assert_close(diag, diag[0].expand_as(diag), atol=1e-4, rtol=1e-4)
    if encoding == "xpos":  # the decay is really there: xPos differs from plain RoPE far away
        rope = ENCODING_POSITIONS["rope"].tables(preset("tiny", encoding="rope"), T, "cpu")
        s_rope = apply_rotary(v, rope["cos"], rope["sin"], rope["q_scale"]) @ apply_rotary(
            w, rope["cos"], rope["sin"], rope["k_scale"]
        ).transpose(-2, -1)
        assert not torch.allclose(s[-1, 0], s_rope[0, 0, -1, 0], atol=1e-3)


def test_alibi_bias_matches_slopes():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))
    model = tiny("alibi")
    model.blocks[0].attn.qkv.weight.data.zero_()  # q·k = 0: the score is the bias alone
    s = attention_scores(model, torch.randint(0, 256, (1, 10)))[0][0]  # (H, T, T)
    slopes = alibi_slopes(model.cfg.n_head)
    for i in range(10):
        for j in range(i + 1):
            torch.testing.assert_close(s[:, i, j], -slopes * (i - j))


def test_bca_mask_structure():
    m = blockwise_causal_mask(12, 3)
    for i in range(12):
        allowed = {j for j in range(12) if m[i, j]}
        block = i // 3
        assert allowed == set(range(max(0, (block - 1) * 3), i + 1))
    assert (torch.arange(12)[:, None] - torch.arange(12)[None, :])[m].max() == 2 * 3 - 1


def test_bca_scores_are_masked_and_equal_at_train_len():
    model = tiny("rope")
    L = model.cfg.train_len
    x = torch.randint(0, 256, (1, 2 * L))
    plain = attention_scores(model, x)[0]
    bca = attention_scores(model, x, bca=True)[0]
    mask = blockwise_causal_mask(2 * L, L // 2)
    assert torch.isneginf(bca[..., ~mask]).all()
    torch.testing.assert_close(bca[..., mask], plain[..., mask])
    # at T = L, BCA allows every causal pair: nothing changes
    y = x[:, :L]
    torch.testing.assert_close(model(y)[0], model(y, bca=True)[0])


def test_bca_rejected_for_absolute_positions():
    with pytest.raises(ValueError, match="relative"):
        tiny("sinusoidal")(torch.randint(0, 256, (1, 8)), bca=True)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(encoding="learned"), "unknown encoding"),
        (dict(train_len=1), "train_len"),
        (dict(d_model=30, n_head=4), "divisible"),
        (dict(d_model=12, n_head=4), "even"),
        (dict(rope_base=1.0), "rope_base"),
        (dict(alibi_slope_scale=-1.0), "alibi_slope_scale"),
    ],
)
def test_bad_config_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kw)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(rope_base=float("nan")), "rope_base must be a finite number"),
        (dict(rope_base=float("inf")), "rope_base must be a finite number"),
        (dict(rope_base=-float("inf")), "rope_base must be a finite number"),
        (dict(rope_base=2e9), r"rope_base must be in \(1, 1e9\]"),
        (dict(n_layer=0), "n_layer must be a positive integer, got 0"),
        (dict(n_layer=-1), "n_layer must be a positive integer, got -1"),
        (dict(n_layer="2"), "n_layer must be a positive integer, got '2'"),
        (dict(n_layer=2.0), "n_layer must be a positive integer, got 2.0"),
        (dict(n_layer=True), "n_layer must be a positive integer"),
        (dict(n_head=0), "n_head must be a positive integer, got 0"),
        (dict(d_model=0), "d_model must be a positive integer, got 0"),
        (dict(train_len=0), "train_len must be a positive integer"),
        (dict(train_len=15), "even"),
        (dict(vocab_size=0), "vocab_size must be a positive integer"),
        (dict(xpos_gamma=float("nan")), "xpos_gamma must be a finite number"),
        (dict(xpos_gamma=0.0), r"xpos_gamma must be in \(0, 100\]"),
        (dict(xpos_scale_base=float("inf")), "xpos_scale_base must be a finite number"),
        (dict(xpos_scale_base=0.0), r"xpos_scale_base in \(0, 1e9\]"),
        (dict(xpos_scale_base="512"), "xpos_scale_base must be a finite number"),
        (dict(alibi_slope_scale=float("nan")), "alibi_slope_scale must be a finite number"),
        (dict(alibi_slope_scale=2e3), r"alibi_slope_scale must be in \[0, 1000\]"),
    ],
)
def test_every_config_field_is_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kw)
    with pytest.raises(ValueError, match=match):
        preset("tiny", **kw)  # presets go through the same checks


def test_config_defaults_and_xpos_scale_base():
    cfg = ModelConfig(encoding="xpos")
    assert (cfg.train_len, cfg.n_layer, cfg.n_head, cfg.d_model) == (128, 4, 4, 128)
    assert cfg.xpos_scale_base is None and cfg.scale_base == 64.0
    assert cfg.to_dict()["xpos_scale_base"] == 64.0  # L/2, written out
    assert ModelConfig(encoding="xpos", xpos_scale_base=512.0).to_dict()["xpos_scale_base"] == 512.0
    assert ModelConfig(encoding="xpos", train_len=256).to_dict()["xpos_scale_base"] == 128.0
    assert preset("tiny", encoding="xpos").scale_base == 8.0
    assert preset("small") == ModelConfig(train_len=64, n_layer=2)
    assert (preset("large").n_layer, preset("large").d_model, preset("large").train_len) == (8, 256, 256)
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


def test_xpos_scale_base_none_is_the_same_model_as_half_L():
    resolved = tiny("xpos", xpos_scale_base=8.0)  # tiny: L = 16
    default = tiny("xpos")
    x = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    assert torch.equal(default(x)[0], resolved(x)[0])
    assert not torch.equal(tiny("xpos", xpos_scale_base=512.0)(x)[0], default(x)[0])


def test_config_round_trip_and_strict_keys():
    cfg = preset("tiny", encoding="xpos")  # xpos_scale_base None: B = L/2, written out by to_dict
    again = ModelConfig.from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict() and again.scale_base == cfg.scale_base == cfg.train_len / 2
    assert again == preset("tiny", encoding="xpos", xpos_scale_base=cfg.train_len / 2)
    explicit = preset("tiny", encoding="xpos", xpos_scale_base=5.0)
    assert ModelConfig.from_dict(explicit.to_dict()) == explicit
    with pytest.raises(ValueError, match="unknown"):
        ModelConfig.from_dict({**cfg.to_dict(), "extra": 1})
    with pytest.raises(ValueError, match="missing"):
        ModelConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "n_head"})


def test_bad_tokens_rejected():
    model = tiny("rope")
    with pytest.raises(ValueError, match="tokens"):
        attention_scores(model, torch.randint(0, 256, (8,)))
    with pytest.raises(ValueError, match="2 tokens"):
        attention_scores(model, torch.randint(0, 256, (1, 1)))


@pytest.mark.parametrize("encoding", MODEL_ENCODINGS)
def test_measure_on_tiny_model_gives_finite_resolution(encoding):
    model = tiny(encoding)
    L = model.cfg.train_len
    windows = torch.randint(0, 256, (5, 2 * L + 1))
    m = measure_windows(model, windows, batch_size=2)
    assert m["s_hat"].shape == (model.cfg.n_layer, model.cfg.n_head, 2 * L)
    assert m["nll"].shape == (2 * L,)
    profile = Profile(
        "tiny", {"encoding": encoding, "seed": 0, "train_len": L}, 2 * L, False, m["s_hat"].float(), m["nll"]
    )
    recs = records([profile])
    # 2 head modes x (2 layers + "mean" + "upper")
    assert len(recs) == 2 * (model.cfg.n_layer + 2)
    assert {r["layer"] for r in recs} == {0, 1, "mean", "upper"}
    for r in recs:
        assert math.isfinite(r["resolution"]) and r["resolution"] < 1
        assert math.isfinite(r["perplexity"]) and r["perplexity"] > 1
        assert math.isfinite(r["perplexity_past_L"])
    # an untrained model predicts bytes roughly uniformly: perplexity near 256
    assert 150 < recs[0]["perplexity"] < 400


@pytest.mark.parametrize("max_distance", [32, 128, 500])
def test_t5_buckets_equal_the_design_time_buckets(max_distance):
    """The model's torch buckets and encodings' numpy buckets are one function (exact, log-spaced, last)."""
    got = t5_buckets(torch.arange(2000), 32, max_distance).numpy()
    want = t5_buckets_np(2000, 32, max_distance)
    assert (got == want).all() and got[15] == 15 and got[-1] == 31
