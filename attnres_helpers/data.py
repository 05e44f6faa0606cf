"""Byte-level tokens from the shipped corpus, a deterministic train/validation split, and batching.

The corpus (data/corpus/corpus.txt.gz) is English text every CPython carries: pydoc_data topics and
standard-library docstrings, built by scripts/build_corpus.py. One token = one byte, so the vocabulary
is the 256 byte values and no tokenizer is needed.
"""

import gzip
import hashlib
import zlib
from pathlib import Path

import torch

VOCAB_SIZE = 256
CORPUS_PATH = Path(__file__).resolve().parent.parent / "data" / "corpus" / "corpus.txt.gz"
# sha256 of the uncompressed corpus built on CPython 3.11.7 (see data/corpus/README.md).
CORPUS_SHA256 = "f1d51c9aabf22948e85b8b6d6950d1b1bc50b8ceef0f7ab8eaad5288a149910e"
SPLIT_BLOCK = 16384  # bytes per block of the interleaved split
VAL_EVERY = 10  # every 10th block is validation (~10% of the corpus, spread over all of it)


def load_corpus(path: str | Path = CORPUS_PATH, sha256: str | None = CORPUS_SHA256) -> bytes:
    """The uncompressed corpus bytes, checked against `sha256` (None skips the check)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} is missing; rebuild it with `python scripts/build_corpus.py`")
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error) as err:
        raise ValueError(f"corpus file {path} is not a valid gzip file ({err})") from err
    digest = hashlib.sha256(raw).hexdigest()
    if sha256 is not None and digest != sha256:
        raise ValueError(f"corpus file {path} is corrupt or was rebuilt: sha256 {digest}, expected {sha256}")
    return raw


def encode(text: str | bytes) -> torch.Tensor:
    """UTF-8 bytes -> (N,) uint8 token ids in [0, 256)."""
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if not raw:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def decode(tokens: torch.Tensor) -> str:
    """(N,) token ids -> text (invalid UTF-8, e.g. a cut multi-byte character, becomes U+FFFD)."""
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


def train_val_split(
    tokens: torch.Tensor, block: int = SPLIT_BLOCK, val_every: int = VAL_EVERY
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut `tokens` into consecutive blocks; block k is validation when k % val_every == val_every - 1.

    Returns (train, val), each the concatenation of its blocks in corpus order. Deterministic, and the
    held-out text comes from every part of the corpus rather than from its last modules only.
    """
    if block < 1 or val_every < 2:
        raise ValueError(f"need block >= 1 and val_every >= 2, got block={block}, val_every={val_every}")
    if len(tokens) < block * val_every:
        raise ValueError(f"tokens has {len(tokens)} entries, fewer than block*val_every = {block * val_every}")
    blocks = torch.split(tokens, block)
    val = [b for k, b in enumerate(blocks) if k % val_every == val_every - 1]
    train = [b for k, b in enumerate(blocks) if k % val_every != val_every - 1]
    return torch.cat(train), torch.cat(val)


def load_splits(path: str | Path = CORPUS_PATH) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) uint8 tokens of the shipped corpus."""
    return train_val_split(encode(load_corpus(path)))


def _check_window(tokens: torch.Tensor, T: int) -> None:
    if T < 1:
        raise ValueError(f"window length T must be >= 1, got {T}")
    if len(tokens) < T + 1:
        raise ValueError(f"tokens has {len(tokens)} entries, too few for one window of T+1 = {T + 1}")


def get_batch(
    tokens: torch.Tensor, batch_size: int, T: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of T+1 tokens: inputs x = w[:, :-1] and next-byte targets y = w[:, 1:], (B, T) int64.

    Start positions are uniform over [0, len - T - 1], drawn from `generator` only, so a generator seeded
    from (seed, step) gives the same batch on every run.
    """
    _check_window(tokens, T)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    starts = torch.randint(0, len(tokens) - T, (batch_size,), generator=generator)  # (B,)
    windows = tokens[starts[:, None] + torch.arange(T + 1)].long()  # (B, T+1)
    return windows[:, :-1], windows[:, 1:]


def eval_windows(tokens: torch.Tensor, T: int, max_windows: int | None = None) -> torch.Tensor:
    """Non-overlapping held-out windows of T+1 tokens, (W, T+1) int64; x = w[:, :-1], y = w[:, 1:].

    The tokens hold n = len // (T+1) disjoint windows; when max_windows < n, an evenly spaced subset of
    them is returned (first and last included), so the choice is deterministic and covers the whole split.
    """
    _check_window(tokens, T)
    n_windows = len(tokens) // (T + 1)
    all_windows = tokens[: n_windows * (T + 1)].view(n_windows, T + 1)  # (n, T+1)
    if max_windows is not None:
        if max_windows < 1:
            raise ValueError(f"max_windows must be >= 1 or None, got {max_windows}")
        if max_windows < n_windows:
            picks = torch.linspace(0, n_windows - 1, max_windows).round().long()
            all_windows = all_windows[picks]
    return all_windows.long()
