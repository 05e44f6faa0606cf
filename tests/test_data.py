"""Corpus integrity, the deterministic split, and batching (attnres_helpers.data)."""

import gzip
import platform
import subprocess
import sys

import pytest
import torch
from helpers import ROOT
from hypothesis import given
from hypothesis import strategies as st

from attnres_helpers.data import (
    CORPUS_PATH,
    CORPUS_SHA256,
    decode,
    encode,
    eval_windows,
    get_batch,
    load_corpus,
    load_splits,
    train_val_split,
)


def test_shipped_corpus_matches_its_sha256_and_readme():
    raw = load_corpus()
    readme = (CORPUS_PATH.parent / "README.md").read_text()
    assert CORPUS_SHA256 in readme
    assert f"{len(raw):,} bytes" in readme
    assert len(raw) > 1_000_000
    raw.decode("utf-8")  # valid UTF-8 throughout


@pytest.mark.skipif(platform.python_version() != "3.11.7", reason="the shipped corpus was built on CPython 3.11.7")
def test_build_script_reproduces_the_shipped_corpus(tmp_path):
    # A fresh interpreter: libraries imported here (torch, pytest) monkeypatch stdlib functions.
    out = tmp_path / "rebuilt.txt.gz"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_corpus.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert CORPUS_SHA256 in run.stdout
    assert load_corpus(out) == load_corpus()


def test_corrupt_or_missing_corpus_errors_name_the_file(tmp_path):
    tampered = tmp_path / "tampered.txt.gz"
    tampered.write_bytes(gzip.compress(load_corpus() + b"x"))
    with pytest.raises(ValueError, match="tampered.txt.gz.*sha256"):
        load_corpus(tampered)
    not_gzip = tmp_path / "plain.txt.gz"
    not_gzip.write_bytes(b"plain text")
    with pytest.raises(ValueError, match="plain.txt.gz.*gzip"):
        load_corpus(not_gzip)
    truncated = tmp_path / "truncated.txt.gz"
    truncated.write_bytes(CORPUS_PATH.read_bytes()[:1000])
    with pytest.raises(ValueError, match="truncated.txt.gz"):
        load_corpus(truncated)
    with pytest.raises(FileNotFoundError, match="absent.txt.gz"):
        load_corpus(tmp_path / "absent.txt.gz")


@given(st.text())
def test_encode_decode_round_trip(text):
    tokens = encode(text)
    assert tokens.dtype == torch.uint8 and len(tokens) == len(text.encode("utf-8"))
    assert decode(tokens) == text


def test_split_interleaves_blocks_and_loses_nothing():
    tokens = torch.arange(1000) % 256
    train, val = train_val_split(tokens, block=7, val_every=4)
    # blocks 3, 7, 11, ... (0-based) are validation: 1000 // 7 = 142 full blocks + one of 6 tokens (block 142)
    val_starts = range(3 * 7, 1000, 4 * 7)
    assert torch.equal(val, torch.cat([tokens[s : s + 7] for s in val_starts]))
    assert len(train) + len(val) == 1000
    kept = torch.ones(1000, dtype=torch.bool)
    for s in val_starts:
        kept[s : s + 7] = False
    assert torch.equal(train, tokens[kept])


def test_shipped_split_is_about_ten_percent_and_deterministic():
    train, val = load_splits()
    train2, val2 = load_splits()
    assert torch.equal(train, train2) and torch.equal(val, val2)
    assert 0.09 < len(val) / (len(train) + len(val)) < 0.11


def test_get_batch_windows_are_shifted_corpus_slices_and_seeded():
    tokens = torch.arange(5000) % 251  # no repeats inside a window of < 251, so slices are identifiable
    x, y = get_batch(tokens, batch_size=8, T=32, generator=torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y):
        assert torch.equal((row_x + 1) % 251, row_y)  # contiguous: next token of the arange
    x2, y2 = get_batch(tokens, batch_size=8, T=32, generator=torch.Generator().manual_seed(3))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = get_batch(tokens, batch_size=8, T=32, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(x, x3)


def test_get_batch_reaches_both_ends():
    tokens = torch.arange(10)
    x, y = get_batch(tokens, batch_size=500, T=9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, tokens[:9].expand(500, 9)) and torch.equal(y, tokens[1:].expand(500, 9))


def test_eval_windows_are_disjoint_evenly_spaced_and_cover_both_ends():
    tokens = torch.arange(1000)
    windows = eval_windows(tokens, T=9)  # 100 windows of 10
    assert windows.shape == (100, 10) and torch.equal(windows.flatten(), tokens)
    subset = eval_windows(tokens, T=9, max_windows=4)
    assert torch.equal(subset[:, 0], torch.tensor([0, 330, 660, 990]))
    assert torch.equal(eval_windows(tokens, T=9, max_windows=500), windows)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda t: get_batch(t, 4, 10, torch.Generator()), "too few"),
        (lambda t: get_batch(t, 0, 4, torch.Generator()), "batch_size"),
        (lambda t: eval_windows(t, 0), "T must be"),
        (lambda t: eval_windows(t, 4, max_windows=0), "max_windows"),
        (lambda t: train_val_split(t, block=2, val_every=10), "fewer than"),
    ],
)
def test_bad_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.arange(10))
