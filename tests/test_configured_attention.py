"""Every training-free configuration on a tiny random Llama, against references written from the definitions.

The reference scores each pair from its own distance, Σ_f Re(q̃_f conj(k̃_f) e^{iθ_f d(i, j)}), with d
written here from each method's definition (Self-Extend's official patch, ReRoPE's clamp, leaky ReRoPE,
LM-Infinite's cap), not from the package's per-token positions; the transformers-applied configurations
(RoPE scalings, masks) are also checked against the model's own eager attention. L = 128, T = 256, so
every mask and remap bites.
"""

import pytest
import torch

pytest.importorskip("transformers")

from helpers import reference_run, tiny_llama  # noqa: E402

from attnres_helpers.hf import configured_attention as ca  # noqa: E402
from attnres_helpers.hf.configurations import CONFIGURATIONS, KINDS, Remap, applied  # noqa: E402
from attnres_helpers.metric import expected_scores  # noqa: E402

L, T = 128, 256


@pytest.fixture(scope="module")
def model():
    return tiny_llama(hidden_size=32, layers=2, heads=4, kv_heads=2, context=L, rope_theta=500.0)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(1))


def configured_run(model, ids, configuration):
    layers = []
    with applied(model, configuration, L), ca.capturing(layers.append):
        logits = model(input_ids=ids, use_cache=False).logits
    return logits, layers


def test_the_registry_has_four_kinds_of_at_least_three_and_sixteen_entries():
    kinds = [c.kind for c in CONFIGURATIONS.values()]
    assert len(kinds) >= 16
    assert all(kinds.count(k) >= 3 for k in KINDS if k != "as-trained")
    assert kinds.count("as-trained") == 1


@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_each_configuration_attends_as_its_definition_says(model, ids, name):
    """Logits, every layer's attention probabilities and scores against the reference; ŝ by FFT and the
    key-0 scores against the merged scores' own diagonals and column; the entropy against −Σ p log p."""
    c = CONFIGURATIONS[name]
    logits, layers = configured_run(model, ids, c)
    ref_logits, ref_layers = reference_run(model, ids, c, L)
    torch.testing.assert_close(logits.double(), ref_logits.double(), atol=1e-5, rtol=0)
    for layer, ref in zip(layers, ref_layers, strict=True):
        scores = layer.scores().double()
        assert torch.equal(torch.isfinite(scores), torch.isfinite(ref))
        torch.testing.assert_close(scores.softmax(-1), ref.softmax(-1), atol=1e-5, rtol=0)
        torch.testing.assert_close(scores[torch.isfinite(ref)], ref[torch.isfinite(ref)], atol=1e-4, rtol=1e-5)
        explicit = expected_scores(scores).mean(0)
        fast = ca.configured_s_hat(layer)
        assert torch.equal(torch.isfinite(fast), torch.isfinite(explicit))
        finite = torch.isfinite(explicit)
        torch.testing.assert_close(fast[finite], explicit[finite], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ca.configured_key0(layer), scores[..., :, 0].mean(0))
        p = scores.softmax(-1)
        entropy = -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)
        torch.testing.assert_close(layer.entropy.double(), entropy, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", [n for n, c in CONFIGURATIONS.items() if not c.remap])
def test_a_transformers_configuration_equals_the_models_own_eager_attention(model, ids, name):
    """RoPE scalings and masks: the same logits as `transformers`' eager attention under the same RoPE
    parameters and the mask as an additive matrix."""
    c = CONFIGURATIONS[name]
    logits, _ = configured_run(model, ids, c)
    allowed = c.mask_for(L).allowed(T)
    additive = torch.zeros(1, 1, T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
    before = dict(model.config.rope_parameters)
    rope = c.rope_for(before["rope_theta"], L, 8)
    try:
        if rope is not None:
            model.config.rope_parameters = rope
        eager = tiny_llama(hidden_size=32, layers=2, heads=4, kv_heads=2, context=L, implementation="eager")
        eager.config.rope_parameters = model.config.rope_parameters
        eager.model.rotary_emb = type(model.model.rotary_emb)(config=eager.config)
        eager.load_state_dict(model.state_dict())
        expected = eager(input_ids=ids, attention_mask=additive, use_cache=False).logits
    finally:
        model.config.rope_parameters = before
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_inside_L_the_configurations_marked_so_are_the_model_as_trained(model, ids):
    reference, _ = configured_run(model, ids[:, :L], CONFIGURATIONS["as-trained"])
    plain = model(input_ids=ids[:, :L], use_cache=False).logits
    torch.testing.assert_close(reference, plain, atol=1e-5, rtol=0)
    for c in CONFIGURATIONS.values():
        logits, _ = configured_run(model, ids[:, :L], c)
        if c.same_as_trained_up_to_L:
            torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)
        else:
            assert (logits - reference).abs().max() > 1e-4, c.name
    assert model.config.rope_parameters == {"rope_theta": 500.0, "rope_type": "default"}  # restored
    assert model.config._attn_implementation == "sdpa"


def test_self_extend_distance_is_its_patch_formula_and_within_the_trained_range():
    r = CONFIGURATIONS["self-extend-8-8"].remap_for(8192)
    assert r == Remap("self-extend", 1024, (8,))
    i, j = torch.tensor([16383, 5000, 1500]), torch.tensor([0, 4000, 0])
    assert r.distance(i, j).tolist() == [16383 // 8 + 1024 - 128, 1000, 1500 // 8 + 1024 - 128]
    far = r.distance(torch.arange(16384), torch.zeros(16384, dtype=torch.long))
    assert float(far.max()) < 8192 / 2  # the rule (½ to ⅔)·L > W + (2L − W)/G


@pytest.mark.parametrize("width", [8, 5], ids=["flash-kernel", "explicit-scores"])
@pytest.mark.parametrize("leaf", [128, 2])
def test_attention_by_parts_is_the_dense_softmax_of_the_merged_scores(width, leaf, monkeypatch):
    """Every block size, mask and remap: the output and entropy of the dense softmax over the merged,
    masked scores, by torch's fused kernel (v as wide as q) and by explicit scores (v narrower), with
    the mixed parts masked whole or halved down to two queries."""
    monkeypatch.setattr(ca, "LEAF", leaf)
    ca._parts.cache_clear()
    from attnres_helpers.masks import CAUSAL, Mask

    g = torch.Generator().manual_seed(0)
    T = 50
    q, k = (torch.randn(1, 2, T, 8, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 2, T, width, generator=g, dtype=torch.float64)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for mask in (CAUSAL, Mask("bca", 8, 2), Mask("window", 7, 3)):
        for far in (None, (q.flip(-2), k.flip(-2), 5), (q, k.flip(-2), 11)):
            s = 0.3 * q @ k.mT
            if far is not None:
                s = torch.where(i - j < far[2], s, 0.3 * far[0] @ far[1].mT)
            p = s.masked_fill(~mask.allowed_pairs(i, j), float("-inf")).softmax(-1)
            entropy = -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)
            for block in (50, 16, 6, 1):
                out, ent = ca.blockwise_attention(q, k, v, 0.3, mask, far, block=block)
                torch.testing.assert_close(out, p @ v, atol=1e-10, rtol=0)
                torch.testing.assert_close(ent, entropy, atol=1e-10, rtol=0)
    ca._parts.cache_clear()
