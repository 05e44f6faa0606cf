"""The sink experiment (attnres_helpers/hf/sinks.py): its arrangements, and the weights against a closed form."""

import pytest
import torch
from helpers import tiny_llama

from attnres_helpers.hf.sinks import (
    ARRANGEMENTS,
    FOR_BOS_POLICY,
    arrange,
    key_weights,
    load_sinks,
    measure_sinks,
    save_sinks,
)

transformers = pytest.importorskip("transformers")


def test_each_arrangement_keeps_the_length_and_moves_only_the_token_it_names():
    text, at, bos = torch.arange(10, 30), 5, 2
    got = {a: arrange(text, a, at, bos) for a in ARRANGEMENTS}
    assert all(len(t) == len(text) for t in got.values())
    assert torch.equal(got["as-is"], text)
    assert got["bos-first"][0] == bos and torch.equal(got["bos-first"][1:], text[:-1])
    assert got["bos-at"][at] == bos and torch.equal(torch.cat([got["bos-at"][:at], got["bos-at"][at + 1 :]]), text[:-1])
    assert got["first-at"][at] == text[0] and sorted(got["first-at"].tolist()) == text.tolist()
    assert torch.equal(got["first-at"][at + 1 :], text[at + 1 :])  # after it, every token where it was
    with pytest.raises(ValueError, match="needs a BOS token"):
        arrange(text, "bos-at", at)
    with pytest.raises(ValueError, match="at must be inside the window"):
        arrange(text, "as-is", 19)
    with pytest.raises(ValueError, match="arrangement must be one of"):
        arrange(text, "bos-last", at, bos)


def _uniform_llama():
    """A tiny Llama whose q and k projections are zero: every query attends uniformly to its i + 1 keys."""
    model = tiny_llama(hidden_size=32, layers=2, heads=4, kv_heads=2, context=64)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "q_proj"):
                module.q_proj.weight.zero_()
                module.k_proj.weight.zero_()
    return model


def test_key_weights_of_uniform_attention_are_the_mean_of_one_over_i_plus_one():
    """Uniform attention: query i gives 1/(i + 1) to every key, so both keys get the mean of 1/(i + 1)
    over the queries at + 1 ... T - 1, in every layer; a mutation that averages over every query is red."""
    model, T, at = _uniform_llama(), 40, 7
    weights = key_weights(model, torch.arange(T) % 256, at)
    expected = (1.0 / torch.arange(at + 2, T + 1, dtype=torch.float64)).mean()
    assert weights.shape == (2, 2)
    torch.testing.assert_close(weights, expected.expand(2, 2), atol=1e-7, rtol=0)


def test_measure_sinks_has_one_entry_per_arrangement_of_the_policy_and_reads_back(tmp_path):
    model = _uniform_llama()
    out = measure_sinks(model, torch.arange(200) % 256, "first", 1, T=32, at=5, n_windows=3, progress=False)
    assert tuple(out) == FOR_BOS_POLICY["first"] and all(t.shape == (3, 2, 2) for t in out.values())
    path = save_sinks(tmp_path / "s.safetensors", {"tiny": out}, {"T": 32})
    back, about = load_sinks(path)
    assert about == {"T": 32} and set(back["tiny"]) == set(out)
    with pytest.raises(ValueError, match="bos_policy must be one of"):
        measure_sinks(model, torch.arange(200), "last", None, T=32, at=5)
    (tmp_path / "bad.safetensors").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"^sinks file .*bad\.safetensors is corrupt or not a store"):
        load_sinks(tmp_path / "bad.safetensors")


def test_a_sinks_file_that_is_a_named_pipe_is_refused_unopened(tmp_path):
    """Issue 44 #11: a named pipe is refused before it is opened (an open would block)."""
    import os

    path = tmp_path / "pipe.safetensors"
    os.mkfifo(path)
    held = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # a reader that opened it anyway would not block
    try:
        with pytest.raises(ValueError) as err:
            load_sinks(path)
    finally:
        os.close(held)
    assert str(err.value) == f"sinks file {path} is a named pipe, not a regular file; give a regular file"


@pytest.mark.parametrize(
    "args, message",
    [
        (("--length", "100", "--at", "100"), "--at must be inside the window (0 < at < 99), got 100"),
        (("--length", "2", "--at", "1"), "--length must be at least 3 tokens (a key 0, a key at and a query), got 2"),
    ],
)
def test_sinks_arguments_are_checked_before_any_model_loads(cli, monkeypatch, args, message):
    """Issue 44 (minor): `sinks --at/--length` were checked only after every model had loaded."""
    from attnres_helpers.hf import fetch

    monkeypatch.setattr(fetch, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    out = cli("reproduce", "sinks", *args)
    assert out.returncode == 1 and out.stderr.splitlines() == [f"error: {message}"]
