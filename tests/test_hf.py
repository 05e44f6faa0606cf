"""attnres_helpers.hf: capture of Hugging Face causal LMs, built from tiny configs (no network)."""

import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the network
transformers = pytest.importorskip("transformers")

from attnres_helpers import hf  # noqa: E402
from attnres_helpers.metric import layer_resolution  # noqa: E402
from attnres_helpers.train import load_checkpoint, train  # noqa: E402

D, H, LAYERS, CTX = 32, 4, 2, 64


def tiny(model_type: str, implementation: str = "eager", **extra):
    """A random tiny model of ``model_type`` from config (grouped-query keys where the family has them)."""
    torch.manual_seed(0)
    common = {"vocab_size": 256, "tie_word_embeddings": True, **extra}
    if model_type in ("llama", "mistral", "qwen2"):
        cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "qwen2": transformers.Qwen2Config}[model_type]
        cfg = cls(hidden_size=D, intermediate_size=2 * D, num_hidden_layers=LAYERS, num_attention_heads=H,
                  num_key_value_heads=2, max_position_embeddings=CTX, **common)
    elif model_type == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(hidden_size=D, intermediate_size=2 * D, num_hidden_layers=LAYERS,
                                         num_attention_heads=H, max_position_embeddings=CTX, **common)
    elif model_type == "bloom":
        cfg = transformers.BloomConfig(hidden_size=D, n_layer=LAYERS, n_head=H, **common)
    elif model_type == "gpt2":
        cfg = transformers.GPT2Config(n_embd=D, n_layer=LAYERS, n_head=H, n_positions=CTX, bos_token_id=None,
                                      eos_token_id=None, **common)
    else:
        raise AssertionError(model_type)
    if model_type == "bloom":
        implementation = "eager"  # BLOOM has no other
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation).eval()


def ids(T: int, B: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type", hf.SUPPORTED)
def test_softmax_of_captured_scores_is_the_models_attention(model_type):
    model, x = tiny(model_type), ids(48)
    attentions = model(input_ids=x, output_attentions=True).attentions
    for form in hf.FORMS:
        scores = hf.attention_scores(model, x, form=form)
        assert len(scores) == LAYERS
        for s, a in zip(scores, attentions):
            assert s.shape == (2, H, 48, 48)
            upper = torch.ones(48, 48, dtype=torch.bool).triu(1)
            assert (s[..., upper] == float("-inf")).all() and torch.isfinite(s[..., ~upper]).all()
            torch.testing.assert_close(s.softmax(-1), a.float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", hf.SUPPORTED)
@pytest.mark.parametrize("T", [16, 2048])
def test_fft_equals_explicit(model_type, T):
    if model_type == "gpt2" and T > CTX:
        pytest.skip("GPT-2 cannot go past n_positions (tested below)")
    if model_type == "mistral" and T == 2048:
        pytest.skip("Mistral's default sliding window is longer than the test needs; covered at 16")
    model, x = tiny(model_type), ids(T, B=1)
    fft, explicit = hf.expected_scores(model, x, "fft"), hf.expected_scores(model, x, "explicit")
    assert fft.shape == (LAYERS, H, T)
    torch.testing.assert_close(fft, explicit, rtol=1e-4, atol=1e-4 * float(explicit.abs().max()))


def _zero_query_key(model, model_type):
    """Zero the q and k projections (weights and biases), leaving v and everything else."""
    with torch.no_grad():
        for module in model.modules():
            if model_type == "llama" and hasattr(module, "q_proj"):
                for lin in (module.q_proj, module.k_proj):
                    lin.weight.zero_()
            elif model_type in ("bloom", "gpt_neox") and hasattr(module, "query_key_value"):
                w = module.query_key_value.weight.view(H, 3, D // H, D)  # fused per head: q, k, v
                w[:, :2] = 0
                module.query_key_value.bias.view(H, 3, D // H)[:, :2] = 0


def test_bloom_with_zero_qk_is_minus_slope_times_distance():
    model = tiny("bloom")
    _zero_query_key(model, "bloom")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    slopes = build_alibi_tensor(torch.ones(1, 2), H, torch.float32).view(H, 2)[:, 1].double()  # the model's own
    s_hat = hf.expected_scores(model, ids(40), "fft")
    n = torch.arange(40, dtype=torch.float64)
    for layer in s_hat:
        torch.testing.assert_close(layer, -slopes[:, None] * n, rtol=1e-6, atol=1e-6)
    raw = hf.expected_scores(model, ids(40), "explicit", form="raw")  # slope · key index: mean over rows i ≥ n of m·(i−n)
    assert (raw[0, :, 0] > 0).all()  # the raw form is not −m·n: a per-row constant moved it


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox"])
def test_rotary_with_zero_qk_is_flat(model_type):
    model = tiny(model_type)
    _zero_query_key(model, model_type)
    T = 40
    s_hat = hf.expected_scores(model, ids(T), "fft")
    assert torch.count_nonzero(s_hat) == 0
    r = layer_resolution(s_hat, "mean-scores", "zero")
    torch.testing.assert_close(r, torch.full((LAYERS,), 1 / T**2, dtype=torch.float64))


def test_raw_and_relative_bloom_differ_by_row_constants_only():
    model, x = tiny("bloom"), ids(24)
    raw, rel = hf.attention_scores(model, x, "raw"), hf.attention_scores(model, x, "relative")
    for a, b in zip(raw, rel):
        diff = (a - b).nan_to_num(0.0, posinf=0.0, neginf=0.0).tril()  # finite part
        row = diff[..., :1].expand_as(diff).tril()
        torch.testing.assert_close(diff, row)  # constant along each row
        assert diff[..., 1:, 0].abs().max() > 0  # and not zero: BLOOM's slope · i
    with pytest.raises(ValueError, match="explicit"):
        hf.expected_scores(model, x, "fft", form="raw")


def test_capture_restores_the_implementation_and_works_under_sdpa():
    eager, sdpa = tiny("llama"), tiny("llama", "sdpa")
    x = ids(32)
    torch.testing.assert_close(hf.expected_scores(sdpa, x), hf.expected_scores(eager, x))
    assert sdpa.config._attn_implementation == "sdpa"


def test_bad_input_is_refused_clearly():
    llama, gpt2 = tiny("llama"), tiny("gpt2")
    opt = transformers.AutoModelForCausalLM.from_config(transformers.OPTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32, vocab_size=256,
        word_embed_proj_dim=16))
    with pytest.raises(ValueError, match="model_type 'opt' is not supported; supported: gpt2, gpt_neox, llama"):
        hf.expected_scores(opt, ids(8))
    with pytest.raises(ValueError, match="n_positions = 64 .* T = 65 is past them"):
        hf.attention_scores(gpt2, ids(CTX + 1))
    with pytest.raises(ValueError, match=r"\(B, T\) tensor"):
        hf.expected_scores(llama, ids(8)[0])
    with pytest.raises(ValueError, match="integer tensor"):
        hf.expected_scores(llama, ids(8).float())
    with pytest.raises(ValueError, match="T >= 2"):
        hf.expected_scores(llama, ids(1))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 256\)"):
        hf.expected_scores(llama, ids(8) + 300)
    with pytest.raises(ValueError, match="method must be one of"):
        hf.expected_scores(llama, ids(8), method="fast")
    with pytest.raises(ValueError, match="unknown architecture 'opt'"):
        hf.HFConfig("opt")
    with pytest.raises(ValueError, match="n_layer must be an integer"):
        hf.HFConfig("llama", n_layer=0)


def test_fft_refuses_a_mask_that_is_not_causal():
    model = tiny("mistral", sliding_window=8)
    with pytest.raises(ValueError, match="not the full causal one"):
        hf.expected_scores(model, ids(32), "fft")
    assert hf.expected_scores(model, ids(32), "explicit").shape == (LAYERS, H, 32)


@pytest.mark.parametrize("architecture", hf.HF_ARCHITECTURES)
def test_hf_architectures_train_and_reload_through_the_project_trainer(tmp_path, architecture):
    cfg = hf.HFConfig(architecture, train_len=16, n_layer=1, n_head=2, d_model=16)
    model, summary = train(cfg, steps=2, batch_tokens=32, warmup=1, out_dir=tmp_path, checkpoint_every=1,
                           progress=False)
    assert summary["model"] == cfg.to_dict() and len(summary["results"]["losses"]) == 2
    loaded = load_checkpoint(tmp_path)
    assert isinstance(loaded, hf.HFCausalLM) and loaded.cfg == cfg
    x = ids(16, B=1)
    torch.testing.assert_close(loaded(x)[0], model.half().float()(x)[0], atol=5e-2, rtol=0)


def test_measure_pretrained_from_a_local_folder(tmp_path):
    tiny("llama").save_pretrained(tmp_path)
    recs = hf.measure_pretrained(str(tmp_path), lengths=(1, 2), n_windows=1)
    lengths = sorted({r["eval_len"] for r in recs})
    assert lengths == [CTX, 2 * CTX]
    assert {r["encoding"] for r in recs} == {"rope"} and all(0 <= r["resolution"] <= 1 for r in recs)


def test_cli_measure_hf_error_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "attnres_helpers", "measure-hf", "--model", str(tmp_path / "none")],
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error:")
