"""attnres_helpers.hf: capture of Hugging Face causal LMs, built from tiny configs (no network)."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the network
transformers = pytest.importorskip("transformers")

from attnres_helpers import hf  # noqa: E402
from attnres_helpers.metric import layer_resolution  # noqa: E402
from attnres_helpers.train import load_checkpoint, train  # noqa: E402

D, H, LAYERS, CTX = 32, 4, 2, 64


MODEL_TYPES = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2", "opt", "bloom")
ROPE_VARIANTS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": CTX},
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
}


def tiny(model_type: str, implementation: str = "eager", **extra):
    """A random tiny model of ``model_type`` from config (grouped-query keys where the family has them)."""
    torch.manual_seed(0)
    common = {"vocab_size": 256, "tie_word_embeddings": True, **extra}
    if model_type == "opt":
        cfg = transformers.OPTConfig(
            hidden_size=D,
            num_hidden_layers=LAYERS,
            num_attention_heads=H,
            ffn_dim=2 * D,
            word_embed_proj_dim=D,
            max_position_embeddings=CTX,
            **common,
        )
    elif model_type == "gemma2":
        cfg = transformers.Gemma2Config(
            hidden_size=D,
            intermediate_size=2 * D,
            num_hidden_layers=LAYERS,
            num_attention_heads=H,
            num_key_value_heads=2,
            head_dim=D // H,
            **common,
        )
    elif model_type == "falcon":
        cfg = transformers.FalconConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=H, **common)
    elif model_type in ("llama", "mistral", "qwen2"):
        cls = {
            "llama": transformers.LlamaConfig,
            "mistral": transformers.MistralConfig,
            "qwen2": transformers.Qwen2Config,
        }[model_type]
        cfg = cls(
            hidden_size=D,
            intermediate_size=2 * D,
            num_hidden_layers=LAYERS,
            num_attention_heads=H,
            num_key_value_heads=2,
            max_position_embeddings=CTX,
            **common,
        )
    elif model_type == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(
            hidden_size=D,
            intermediate_size=2 * D,
            num_hidden_layers=LAYERS,
            num_attention_heads=H,
            max_position_embeddings=CTX,
            **common,
        )
    elif model_type == "bloom":
        cfg = transformers.BloomConfig(hidden_size=D, n_layer=LAYERS, n_head=H, **common)
    elif model_type == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=D, n_layer=LAYERS, n_head=H, n_positions=CTX, bos_token_id=None, eos_token_id=None, **common
        )
    else:
        raise AssertionError(model_type)
    if model_type == "bloom":
        implementation = "eager"  # BLOOM has no other
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation).eval()


def ids(T: int, B: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed))


def _assert_captured_softmax_is_attention(model, x):
    attentions = model(input_ids=x, output_attentions=True).attentions
    T = x.shape[1]
    for form in hf.FORMS:
        scores = hf.captured_scores(model, x, form=form)
        assert len(scores) == LAYERS
        for s, a in zip(scores, attentions):
            assert s.shape == (2, H, T, T)
            upper = torch.ones(T, T, dtype=torch.bool).triu(1)
            assert (s[..., upper] == float("-inf")).all() and torch.isfinite(s[..., ~upper]).all()
            torch.testing.assert_close(s.softmax(-1), a.float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_softmax_of_captured_scores_is_the_models_attention(model_type):
    _assert_captured_softmax_is_attention(tiny(model_type), ids(48))


@pytest.mark.parametrize("variant", ROPE_VARIANTS)
def test_rotary_variants_are_captured_as_transformers_applies_them(variant):
    model = tiny("llama", rope_parameters={"rope_theta": 10000.0, **ROPE_VARIANTS[variant]})
    _assert_captured_softmax_is_attention(model, ids(48))
    x = ids(96, B=1)  # past the original context, where the variants differ from plain RoPE
    fft, explicit = hf.captured_s_hat(model, x, "fft"), hf.captured_s_hat(model, x, "explicit")
    torch.testing.assert_close(fft, explicit, rtol=1e-4, atol=1e-4 * float(explicit.abs().max()))
    plain = hf.captured_s_hat(tiny("llama"), x)
    assert not torch.allclose(fft, plain, atol=1e-3)  # the variant really changed the scores


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("T", [16, 2048])
def test_fft_equals_explicit(model_type, T):
    if model_type in ("gpt2", "opt") and T > CTX:
        pytest.skip("learned absolute positions cannot go past their table (tested below)")
    model, x = tiny(model_type), ids(T, B=1)
    fft, explicit = hf.captured_s_hat(model, x, "fft"), hf.captured_s_hat(model, x, "explicit")
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
    s_hat = hf.captured_s_hat(model, ids(40), "fft")
    n = torch.arange(40, dtype=torch.float64)
    for layer in s_hat:
        torch.testing.assert_close(layer, -slopes[:, None] * n, rtol=1e-6, atol=1e-6)
    raw = hf.captured_s_hat(
        model, ids(40), "explicit", form="raw"
    )  # slope · key index: mean over rows i ≥ n of m·(i−n)
    assert (raw[0, :, 0] > 0).all()  # the raw form is not −m·n: a per-row constant moved it


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox"])
def test_rotary_with_zero_qk_is_flat(model_type):
    model = tiny(model_type)
    _zero_query_key(model, model_type)
    T = 40
    s_hat = hf.captured_s_hat(model, ids(T), "fft")
    assert torch.count_nonzero(s_hat) == 0
    r = layer_resolution(s_hat, "mean-scores", "zero")
    torch.testing.assert_close(r, torch.full((LAYERS,), 1 / T**2, dtype=torch.float64))


def test_raw_and_relative_bloom_differ_by_row_constants_only():
    model, x = tiny("bloom"), ids(24)
    raw, rel = hf.captured_scores(model, x, "raw"), hf.captured_scores(model, x, "relative")
    for a, b in zip(raw, rel):
        diff = (a - b).nan_to_num(0.0, posinf=0.0, neginf=0.0).tril()  # finite part
        row = diff[..., :1].expand_as(diff).tril()
        torch.testing.assert_close(diff, row)  # constant along each row
        assert diff[..., 1:, 0].abs().max() > 0  # and not zero: BLOOM's slope · i
    with pytest.raises(ValueError, match="explicit"):
        hf.captured_s_hat(model, x, "fft", form="raw")


def test_capture_restores_the_implementation_and_works_under_sdpa():
    eager, sdpa = tiny("llama"), tiny("llama", "sdpa")
    x = ids(32)
    torch.testing.assert_close(hf.captured_s_hat(sdpa, x), hf.captured_s_hat(eager, x))
    assert sdpa.config._attn_implementation == "sdpa"


def test_bad_input_is_refused_clearly():
    llama, gpt2 = tiny("llama"), tiny("gpt2")
    with pytest.raises(hf.CaptureError, match="model_type 'falcon' computes its attention inside its own module"):
        hf.captured_s_hat(tiny("falcon"), ids(8))
    with pytest.raises(hf.CaptureError, match="passes softcap .* cannot be captured"):
        hf.captured_s_hat(tiny("gemma2", attn_logit_softcapping=50.0), ids(8))
    with pytest.raises(ValueError, match="learned absolute positions for 64 tokens; T = 65 is past them"):
        hf.captured_scores(gpt2, ids(CTX + 1))
    with pytest.raises(ValueError, match=r"\(B, T\) tensor"):
        hf.captured_s_hat(llama, ids(8)[0])
    with pytest.raises(ValueError, match="integer tensor"):
        hf.captured_s_hat(llama, ids(8).float())
    with pytest.raises(ValueError, match="T >= 2"):
        hf.captured_s_hat(llama, ids(1))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 256\)"):
        hf.captured_s_hat(llama, ids(8) + 300)
    with pytest.raises(ValueError, match="method must be one of"):
        hf.captured_s_hat(llama, ids(8), method="fast")
    with pytest.raises(ValueError, match="unknown architecture 'opt'"):
        hf.HFConfig("opt")
    with pytest.raises(ValueError, match="n_layer must be an integer"):
        hf.HFConfig("llama", n_layer=0)


def test_sliding_window_s_hat_is_undefined_past_the_window():
    """ŝ[n] for n < w equals the explicit sub-diagonal means; from w on no query attends: -inf."""
    w, T = 8, 40
    model = tiny("mistral", sliding_window=w)
    _assert_captured_softmax_is_attention_windowed(model, ids(T), w)
    fft, explicit = hf.captured_s_hat(model, ids(T, B=1), "fft"), hf.captured_s_hat(model, ids(T, B=1), "explicit")
    assert torch.isneginf(fft[..., w:]).all() and torch.isneginf(explicit[..., w:]).all()
    torch.testing.assert_close(fft[..., :w], explicit[..., :w], rtol=1e-4, atol=1e-5)


def _assert_captured_softmax_is_attention_windowed(model, x, w):
    attentions = model(input_ids=x, output_attentions=True).attentions
    for s, a in zip(hf.captured_scores(model, x), attentions):
        i = torch.arange(x.shape[1])
        outside = (i[:, None] - i[None, :] >= w) | (i[None, :] > i[:, None])
        assert torch.isneginf(s[..., outside]).all()
        torch.testing.assert_close(s.softmax(-1), a.float(), atol=1e-5, rtol=0)


def test_fft_refuses_a_padded_mask():
    model, x = tiny("llama"), ids(16)
    padding = torch.ones(2, 16, dtype=torch.long)
    padding[1, :3] = 0
    _, layers = hf.capture(model, x, attention_mask=padding)
    with pytest.raises(ValueError, match="neither causal, a causal sliding window nor BCA"):
        hf.layer_s_hat(layers[0], "fft")
    assert hf.layer_s_hat(layers[0], "explicit").shape == (H, 16)


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox", "qwen2"])
def test_window_statistics_equal_the_explicit_path(model_type):
    """ŝ by FFT (causal and BCA), key0 and the chunked NLL against the (T, T) scores and full logits."""
    from attnres_helpers.hf.pretrained import window_statistics
    from attnres_helpers.metric import expected_scores
    from attnres_helpers.model import blockwise_causal_mask

    model, T = tiny(model_type), 48
    window = ids(T + 1, B=1)[0]
    for block in (None, 8):
        stats = window_statistics(model, window, block)
        mask = None if block is None else blockwise_causal_mask(T, block)[None, None]
        logits, layers = hf.capture(model, window[None, :-1], attention_mask=mask)
        scores = [hf.layer_scores(layer) for layer in layers]
        want = torch.stack([expected_scores(s).double().mean(0) for s in scores])
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(stats["s_hat"]))
        torch.testing.assert_close(stats["s_hat"][finite], want[finite], rtol=1e-4, atol=1e-5)
        key0 = torch.stack([s[0, :, :, 0].double() for s in scores])
        torch.testing.assert_close(stats["key0"], key0, rtol=1e-4, atol=1e-5)
        nll = torch.nn.functional.cross_entropy(logits[0].float(), window[1:], reduction="none").double()
        torch.testing.assert_close(stats["nll"], nll, rtol=1e-5, atol=1e-5)
        if block is not None:
            assert torch.isneginf(stats["s_hat"][..., 2 * block :]).all()


@pytest.mark.parametrize("architecture", hf.HF_ARCHITECTURES)
def test_hf_architectures_train_and_reload_through_the_project_trainer(tmp_path, architecture):
    cfg = hf.HFConfig(architecture, train_len=16, n_layer=1, n_head=2, d_model=16)
    model, summary = train(
        cfg, steps=2, batch_tokens=32, warmup=1, out_dir=tmp_path, checkpoint_every=1, progress=False
    )
    assert summary["model"] == cfg.to_dict() and len(summary["results"]["losses"]) == 2
    loaded = load_checkpoint(tmp_path)
    assert isinstance(loaded, hf.HFCausalLM) and loaded.cfg == cfg
    x = ids(16, B=1)
    torch.testing.assert_close(loaded(x)[0], model.half().float()(x)[0], atol=5e-2, rtol=0)


def test_measure_pretrained_from_a_local_folder(tmp_path):
    tiny("llama").save_pretrained(tmp_path)
    recs = hf.measure_pretrained(str(tmp_path), multiples=(1, 2), n_windows=1)
    lengths = sorted({r["eval_len"] for r in recs})
    assert lengths == [CTX, 2 * CTX]
    assert {r["encoding"] for r in recs} == {"rope"} and all(0 <= r["resolution"] <= 1 for r in recs)


def test_cli_measure_hf_error_is_one_line(cli, tmp_path):
    out = cli("measure", str(tmp_path / "none"))
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error:")


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json"])
def test_a_folder_that_names_code_of_its_own_is_refused_before_loading(tmp_path, name):
    """Issue 31: an auto_map in a folder's config or tokenizer config would have transformers offer to
    run the folder's Python; the folder is refused in one line, and nothing is loaded."""
    import json

    from attnres_helpers.hf.pretrained import load_pretrained, load_tokenizer

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1}))
    (tmp_path / name).write_text(json.dumps({"auto_map": {"AutoTokenizer": ["evil.Tokenizer", None]}}))
    with pytest.raises(ValueError, match="never runs a model folder's code"):
        load_pretrained(tmp_path)
    with pytest.raises(ValueError, match="never runs a model folder's code"):
        load_tokenizer(tmp_path)


def test_work_files_are_kept_apart_by_store_path_and_run_and_refuse_other_weights(tmp_path):
    """Two stores of one name in two folders, or two runs of one store, never share a work file; a work
    file written for other weights or another L is refused rather than summed into (issue 31)."""
    from attnres_helpers.hf.pretrained import measure_store, work_file

    a, b = tmp_path / "a" / "s.safetensors", tmp_path / "b" / "s.safetensors"
    assert len({work_file(a, "model"), work_file(b, "model"), work_file(a, "model-no-bos")}) == 3
    model, text = tiny("llama", "sdpa"), ids(400, B=1)[0]
    work = work_file(a, "model", tmp_path / "work")
    meta = {"encoding": "rope", "seed": 0, "train_len": 32, "weights": "first"}
    first, values = measure_store(model, "model", meta, [32], n_windows=2, work=work, progress=False, ids=text)
    assert values[first[0].key]["r"].shape == (2, LAYERS) and work.is_file()
    for change in ({"weights": "second"}, {"train_len": 64}):
        with pytest.raises(ValueError, match="other settings"):
            measure_store(model, "model", {**meta, **change}, [32], n_windows=2, work=work, progress=False, ids=text)
    with pytest.raises(ValueError, match=r"lengths \[32, 32\] name a length twice: each length is measured once"):
        measure_store(model, "model", meta, [32, 32], n_windows=1, progress=False, ids=text)


def test_a_stopped_measurement_continues_from_its_work_file_to_what_one_run_gives(tmp_path, monkeypatch):
    """Stopped after its first window, a rerun with the same work file measures the other windows only
    and ends where an uninterrupted run ends: the same means and one value per window."""
    from attnres_helpers.hf import pretrained

    model, text = tiny("llama", "sdpa"), ids(400, B=1)[0]
    meta = {"encoding": "rope", "seed": 0, "train_len": 32, "weights": "w"}
    whole, whole_values = pretrained.measure_store(model, "m", meta, [32], n_windows=3, progress=False, ids=text)
    measured, real = [], pretrained.window_statistics

    def stopping(*args, **kwargs):
        if len(measured) == 1:
            raise KeyboardInterrupt
        measured.append(1)
        return real(*args, **kwargs)

    work = tmp_path / "work.safetensors"
    monkeypatch.setattr(pretrained, "window_statistics", stopping)
    with pytest.raises(KeyboardInterrupt):
        pretrained.measure_store(model, "m", meta, [32], n_windows=3, work=work, progress=False, ids=text)
    calls = []
    monkeypatch.setattr(pretrained, "window_statistics", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed, values = pretrained.measure_store(model, "m", meta, [32], n_windows=3, work=work, progress=False, ids=text)
    assert len(calls) == 2  # the first window was summed before the stop
    key = whole[0].key
    for name in ("s_hat", "nll", "key0"):
        torch.testing.assert_close(getattr(resumed[0], name), getattr(whole[0], name), rtol=1e-5, atol=1e-6)
    assert values[key]["r"].shape == (3, LAYERS)
    torch.testing.assert_close(values[key]["r"], whole_values[key]["r"], rtol=1e-5, atol=1e-9)


# ------------------------------------------------------------------- measure-hf: refused before any work


@pytest.fixture(autouse=True)
def work_in_tmp(tmp_path, monkeypatch):
    """measure-hf's default work folder (runs/pretrained-work) under the test's tmp_path, not the repository's."""
    from attnres_helpers import paths

    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")


@pytest.fixture
def llama_dir(tmp_path):
    """A tiny Llama folder (2 layers, context 64), saved as transformers saves one."""
    folder = tmp_path / "tiny-llama"
    tiny("llama", "sdpa").save_pretrained(folder)
    return folder


@pytest.fixture
def nothing_loaded(monkeypatch):
    """Loading any model fails the test: what is tested must be refused before."""
    from attnres_helpers.hf import pretrained

    monkeypatch.setattr(pretrained, "load_pretrained", lambda *a, **k: pytest.fail("a model was loaded"))


def _edit_config(folder, **keys):
    import json

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **keys}))


@pytest.mark.parametrize(
    "layers, reason",
    [
        (1, "9 weights in the folder are unused, e.g. 'model.layers.1.input_layernorm.weight'"),
        (3, "9 weights it needs are missing, e.g. 'model.layers.2.input_layernorm.weight'"),
    ],
)
def test_a_config_whose_layers_do_not_match_the_weights_is_refused_before_measuring(
    llama_dir, cli, monkeypatch, layers, reason
):
    """Fewer layers than the weights would measure a truncated model, more a random layer: both refused."""
    from attnres_helpers.hf import pretrained

    _edit_config(llama_dir, num_hidden_layers=layers)
    monkeypatch.setattr(pretrained, "window_statistics", lambda *a, **k: pytest.fail("measured"))
    out = cli("measure", str(llama_dir), "--lengths", "1", "--windows", "1", "--json")
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"error: {llama_dir}: config.json does not match the weights ({reason}); refused"
    ]


def test_the_unchanged_folder_loads_with_every_weight_used(llama_dir):
    from attnres_helpers.hf.pretrained import load_pretrained

    assert load_pretrained(llama_dir).config.num_hidden_layers == LAYERS


def _store_args(folder, store, *more):
    return ("measure", str(folder), "--lengths", "1", "--windows", "1", "--store", str(store), *more)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--lengths", "1,1"), "lengths 1 and 1 are both 64 tokens at L = 64: each length is measured once"),
        (("--lengths", "1,1.001"), "lengths 1 and 1.001 are both 64 tokens at L = 64: each length is measured once"),
        (("--bca", "2"), "BCA lengths [128] must be among the lengths [64]"),
        (("--json",), "--json prints records, and --store writes profiles instead: give one of them"),
    ],
)
def test_measure_hf_store_arguments_are_refused_before_loading(llama_dir, tmp_path, cli, nothing_loaded, args, message):
    out = cli(*_store_args(llama_dir, tmp_path / "s.safetensors"), *args)
    assert out.returncode == 1 and out.stderr.splitlines() == [f"error: {message}"]
    assert not (tmp_path / "s.safetensors").exists()


def test_a_train_len_below_two_is_a_usage_error(llama_dir, tmp_path, cli, nothing_loaded):
    out = cli(*_store_args(llama_dir, tmp_path / "s.safetensors"), "--train-len", "1")
    assert out.returncode == 2 and "argument --train-len: must be >= 2, got 1" in out.stderr
    with pytest.raises(ValueError, match="train_len must be an integer >= 2, got 1"):
        hf.pretrained.measure_pretrained_store(llama_dir, tmp_path / "s.safetensors", (1,), train_len=1)


def test_a_store_path_that_cannot_be_a_store_is_refused_before_loading(llama_dir, tmp_path, cli, nothing_loaded):
    (tmp_path / "a-file").write_text("x")
    for store, message in (
        (tmp_path, f"store {tmp_path} is a folder; give a store file, e.g. {tmp_path / 'name.safetensors'}"),
        ("", "the store path is empty; give a store file, e.g. name.safetensors"),
        (
            llama_dir / "s.safetensors",
            f"store {llama_dir / 's.safetensors'} is inside the model folder {llama_dir}; write it outside",
        ),
    ):
        out = cli(*_store_args(llama_dir, store))
        assert out.returncode == 1 and out.stderr.splitlines() == [f"error: {message}"], store
    out = cli(*_store_args(llama_dir, tmp_path / "a-file" / "s.safetensors"))  # a folder that cannot be written
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith(f"error: cannot write {tmp_path / 'a-file' / 's.safetensors'}")
    out = cli(*_store_args(llama_dir, tmp_path / "s.safetensors"), "--work", str(tmp_path / "a-file"))
    assert out.stderr.splitlines() == [
        f"error: work folder {tmp_path / 'a-file'} is a file; it names a folder for the window sums"
    ]
    work = tmp_path / "s.safetensors"
    out = cli(*_store_args(llama_dir, work), "--work", str(work))
    assert out.stderr.splitlines() == [
        f"error: work folder {work} is the store itself; it names a folder for the window sums"
    ]


def test_a_store_held_by_another_writer_is_refused_before_loading(llama_dir, tmp_path, nothing_loaded):
    from attnres_helpers.files import exclusive

    store = tmp_path / "s.safetensors"
    with exclusive(store), pytest.raises((RuntimeError, OSError), match=str(store)):
        hf.pretrained.measure_pretrained_store(llama_dir, store, (1,), n_windows=1, progress=False)
    assert not store.exists()


def test_measure_hf_adds_or_replaces_only_its_own_run_in_a_store(llama_dir, tmp_path, cli):
    """The store's other runs are kept bit for bit; each write says in one line what it did."""
    from safetensors.torch import load_file

    from attnres_helpers.store import load_profiles

    store, other = tmp_path / "s.safetensors", tmp_path / "other"
    tiny("llama", "sdpa").save_pretrained(other)
    first = cli(*_store_args(other, store))
    assert first.returncode == 0 and first.stdout.splitlines() == [f"{store}: added other; kept 0 other runs"]
    before = load_file(store)
    added = cli(*_store_args(llama_dir, store))
    assert added.stdout.splitlines() == [f"{store}: added tiny-llama; kept 1 other run (other)"], added.stderr
    again = cli(*_store_args(llama_dir, store))
    assert again.stdout.splitlines() == [f"{store}: replaced tiny-llama; kept 1 other run (other)"]
    after = load_file(store)
    assert {k.split("/")[0] for k in after} == {"other", "tiny-llama"}
    assert all(torch.equal(before[k], after[k]) for k in before)
    about = load_profiles(store)[1]
    assert set(about["commands"]) == {"other", "tiny-llama"}


def test_a_store_of_another_kind_is_refused_before_loading(llama_dir, tmp_path, cli, nothing_loaded):
    from attnres_helpers.store import Profile, save_profiles

    store = tmp_path / "default.safetensors"
    meta = {"encoding": "rope", "seed": 0, "train_len": 8}
    profile = Profile("rope-s0", meta, 8, False, torch.zeros(1, 1, 8), torch.ones(8, dtype=torch.float64))
    save_profiles(store, [profile], {"command": "python -m attnres_helpers reproduce"})
    before = store.read_bytes()
    out = cli(*_store_args(llama_dir, store))
    assert out.stderr.splitlines() == [
        f"error: {store} is a store of another kind (made by `python -m attnres_helpers reproduce`); "
        "measure-hf adds runs only to a store it made: give another --store"
    ]
    assert store.read_bytes() == before


def test_a_huge_config_json_is_refused_unread(llama_dir, cli):
    config = llama_dir / "config.json"
    with open(config, "r+b") as f:
        f.truncate(8 << 20)  # sparse: what it holds is never read
    out = cli("measure", str(llama_dir), "--lengths", "1", "--windows", "1", "--json")
    assert out.stderr.splitlines() == [f"error: {config} is {8 << 20} bytes, larger than any config (4 MiB at most)"]


def test_a_folder_whose_weights_changed_is_measured_again_not_summed_from_its_work_file(llama_dir, tmp_path, cli):
    """Issue 44 #1: a user's folder has no SHA256SUMS; its work file is keyed by a hash of the files a load
    reads, so new weights in the same folder (same name, same settings) are measured, never the old sums."""
    from attnres_helpers.store import load_profiles

    store, work = tmp_path / "s.safetensors", tmp_path / "work"
    first = cli(*_store_args(llama_dir, store), "--work", str(work))
    assert first.returncode == 0, first.stderr
    old = load_profiles(store)[0][0]
    changed = tiny("llama", "sdpa")
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(1.5)
    changed.save_pretrained(llama_dir)
    again = cli(*_store_args(llama_dir, store), "--work", str(work))
    assert again.stdout.splitlines() == [f"{store}: replaced tiny-llama; kept 0 other runs"], again.stderr
    new = load_profiles(store)[0][0]
    assert new.meta["weights"] != old.meta["weights"] and not torch.equal(new.s_hat, old.s_hat)
    fresh = tmp_path / "fresh.safetensors"
    assert cli(*_store_args(llama_dir, fresh), "--work", str(tmp_path / "fresh-work")).returncode == 0
    assert torch.equal(load_profiles(fresh)[0][0].s_hat, new.s_hat)


def test_a_work_file_needs_the_weights_it_sums(tmp_path):
    """Issue 44 #1: measure_store's work file is keyed by meta's weights; without them it is refused."""
    from attnres_helpers.hf.pretrained import measure_store

    meta = {"encoding": "rope", "seed": 0, "train_len": 32}
    with pytest.raises(ValueError, match="names no weights"):
        measure_store(
            tiny("llama", "sdpa"), "m", meta, [32], n_windows=1, work=tmp_path / "w.safetensors", progress=False
        )
    assert not (tmp_path / "w.safetensors").exists()


def test_a_work_file_named_before_weights_keyed_it_continues_only_for_its_own_weights(llama_dir, tmp_path, cli):
    """Issue 44 #1: a work file of the same weights named the old way (no weights in its name) is taken
    over, so a registry measurement stopped before continues; one of other weights, or unreadable, is not."""
    from attnres_helpers.files import folder_fingerprint
    from attnres_helpers.hf.pretrained import work_file

    store, work, weights = tmp_path / "s.safetensors", tmp_path / "work", folder_fingerprint(llama_dir)
    assert cli(*_store_args(llama_dir, store), "--work", str(work)).returncode == 0
    keyed, unkeyed = work_file(store, "tiny-llama", work, weights), work_file(store, "tiny-llama", work)
    keyed.replace(unkeyed)
    assert cli(*_store_args(llama_dir, store), "--work", str(work)).returncode == 0
    assert keyed.is_file() and not unkeyed.exists()  # taken over: its settings name these weights
    unkeyed.write_bytes(b"")
    keyed.unlink()
    assert cli(*_store_args(llama_dir, store), "--work", str(work)).returncode == 0
    assert keyed.is_file() and unkeyed.read_bytes() == b""  # not this folder's: left alone


@pytest.fixture
def registry_first(llama_dir, monkeypatch):
    """A registry entry "tiny-first" whose policy is BOS first, converted into ``llama_dir`` (sealed with a
    SHA256SUMS), its tokenizer's BOS id 1: the tiny Llama measured as Gemma is."""
    import dataclasses
    import types

    from attnres_helpers.files import sha256sums
    from attnres_helpers.hf import fetch, models, pretrained

    (llama_dir / "SHA256SUMS").write_text(sha256sums(llama_dir))
    entry = dataclasses.replace(models.GEMMA3, name="tiny-first", context=CTX)
    monkeypatch.setitem(models.PRETRAINED_MODELS, entry.name, entry)
    monkeypatch.setattr(fetch, "verify", lambda entry, folder=None: llama_dir)
    monkeypatch.setattr(pretrained, "load_tokenizer", lambda folder: types.SimpleNamespace(bos_token_id=1))
    return entry.name


def test_bos_none_never_stores_a_run_under_the_bos_first_runs_name(registry_first, tmp_path, cli):
    """Issue 44 #3: for a model whose policy puts BOS first, the run named after the model is its BOS-first
    run; `--bos none` measures the form without BOS under its own name (as --bos both names it)."""
    from attnres_helpers.store import load_profiles

    store = tmp_path / "s.safetensors"
    out = cli(*_store_args(registry_first, store), "--work", str(tmp_path / "w"))
    assert out.stdout.splitlines() == [f"{store}: added tiny-first, tiny-first-no-bos; kept 0 other runs"], out.stderr
    out = cli(*_store_args(registry_first, store), "--work", str(tmp_path / "w"), "--bos", "none")
    assert out.stdout.splitlines() == [f"{store}: replaced tiny-first-no-bos; kept 1 other run (tiny-first)"]
    assert {(p.run, p.meta["bos"]) for p in load_profiles(store)[0]} == {
        ("tiny-first", "first"),
        ("tiny-first-no-bos", "none"),
    }


def test_a_run_of_another_bos_policy_under_a_stored_runs_name_is_refused(registry_first, llama_dir, tmp_path, cli):
    """Issue 44 #3: a folder's run is named after the folder whatever --bos says; a store holding that run
    measured under another BOS policy is refused before loading, and keeps it."""
    store = tmp_path / "s.safetensors"
    assert cli(*_store_args(llama_dir, store), "--work", str(tmp_path / "w")).returncode == 0
    before = store.read_bytes()
    out = cli(*_store_args(llama_dir, store), "--work", str(tmp_path / "w"), "--bos", "first")
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"error: {store} holds the run tiny-llama measured with no BOS; --bos first would replace it with "
        "another BOS policy under the same name: give the --bos it was measured with, or another --store"
    ]
    assert store.read_bytes() == before


def test_a_work_folder_inside_a_model_folder_or_the_model_cache_is_refused(
    llama_dir, tmp_path, cli, nothing_loaded, monkeypatch
):
    """Issue 44 #5: window sums written into a verified converted folder would make every later load fail
    ("not listed in SHA256SUMS"); a work folder inside the model folder or the model cache is refused."""
    from attnres_helpers import paths

    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")
    for work, where in (
        (llama_dir, f"the model folder {llama_dir}"),
        (llama_dir / "sums", f"the model folder {llama_dir}"),
        (tmp_path / "cache" / "elsewhere", f"the model cache {tmp_path / 'cache'}"),
    ):
        out = cli(*_store_args(llama_dir, tmp_path / "s.safetensors"), "--work", str(work))
        assert out.returncode == 1 and out.stderr.splitlines() == [
            f"error: work folder {work} is inside {where}; give a --work outside it"
        ]
    assert not (llama_dir / "sums").exists() and not (tmp_path / "cache").exists()


def test_the_command_a_store_records_measures_the_same_lengths_again(llama_dir, tmp_path, cli):
    """Issue 44 #6: the recorded command wrote --lengths with 6 significant digits (0.008056640625 became
    0.00805664: 32 tokens at L = 4096, not 33); lengths are written so that they read back exactly, and the
    command, run again as recorded, measures the same lengths."""
    import shlex

    from attnres_helpers.store import load_profiles

    store = tmp_path / "a store.safetensors"
    args = ("--train-len", "4096", "--lengths", "0.008056640625,0.0078125", "--bca", "0.008056640625")
    out = cli("measure", str(llama_dir), "--windows", "1", "--store", str(store), *args)
    assert out.returncode == 0, out.stderr
    profiles, about = load_profiles(store)
    assert sorted({p.eval_len for p in profiles}) == [32, 33] and about["lengths"] == [33, 32]
    recorded = shlex.split(about["command"])
    assert recorded[:3] == ["python", "-m", "attnres_helpers"]
    assert recorded[recorded.index("--lengths") + 1] == "0.008056640625,0.0078125"
    again = cli(*recorded[3:])
    assert again.returncode == 0, again.stderr
    assert load_profiles(store)[1]["lengths"] == [33, 32]
    assert {(p.eval_len, p.bca) for p in load_profiles(store)[0]} == {(32, False), (33, False), (33, True)}


def test_a_store_or_work_file_that_is_a_named_pipe_is_refused_before_loading(llama_dir, tmp_path, cli, nothing_loaded):
    """Issue 44 #11: measure-hf opened an existing --store to read its runs; a named pipe would block."""
    import os

    from attnres_helpers.files import folder_fingerprint
    from attnres_helpers.hf.pretrained import work_file

    store = tmp_path / "pipe.safetensors"
    os.mkfifo(store)
    held = os.open(store, os.O_RDWR | os.O_NONBLOCK)  # a reader that opened it anyway would not block
    try:
        out = cli(*_store_args(llama_dir, store), "--work", str(tmp_path / "w"))
    finally:
        os.close(held)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"error: store {store} is a named pipe, not a regular file; give a regular file"
    ]
    pipe = work_file(tmp_path / "s.safetensors", "tiny-llama", tmp_path / "w", folder_fingerprint(llama_dir))
    pipe.parent.mkdir()
    os.mkfifo(pipe)
    held = os.open(pipe, os.O_RDWR | os.O_NONBLOCK)
    try:
        out = cli(*_store_args(llama_dir, tmp_path / "s.safetensors"), "--work", str(tmp_path / "w"))
    finally:
        os.close(held)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"error: work file {pipe} is a named pipe, not a regular file; give a regular file"
    ]
