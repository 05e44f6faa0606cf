"""Is a real model's attention sink bound to a position or to a token? Move the token and see (notebook 07).

A window of text is given to the model in a few arrangements (:data:`ARRANGEMENTS`), and for every
layer the attention weight each query puts on key 0 and on key ``at`` is averaged over the heads and
over the queries that see both (positions ``at`` + 1 … T − 1):

- ``bos-first``: the model's BOS token, then the text (how Gemma is measured);
- ``bos-at``: the text with BOS written at position ``at`` instead (key 0 is then a text token);
- ``as-is``: the text alone, from its first token (how SmolLM2 is measured, and Gemma's no-BOS form);
- ``first-at``: the text with its first token moved to position ``at`` (tokens 1 … at shift down one).

A sink bound to position 0 keeps its weight on key 0 whatever token is there; a sink bound to a token
follows it to ``at``. A model without a BOS token is asked with ``as-is`` and ``first-at``.

    python -m attnres_helpers sinks [NAME ...]     # data/results/sinks.safetensors
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..data import eval_windows
from ..files import exclusive, save_safetensors
from ..measure import Sums, window_loop
from ..store import open_store
from .attention import capture, layer_scores

ARRANGEMENTS = {
    "bos-first": "BOS at position 0, then the text",
    "bos-at": "the text, with BOS at position `at`",
    "as-is": "the text alone",
    "first-at": "the text, with its first token moved to position `at`",
}
FOR_BOS_POLICY = {"first": ("bos-first", "bos-at", "as-is"), "none": ("as-is", "first-at")}
HEADER_KEY = "attnres-sinks"


def arrange(text: torch.Tensor, arrangement: str, at: int, bos: int | None = None) -> torch.Tensor:
    """The (T,) ids of one arrangement of ``text (T,)`` (see the module's list); the length stays T."""
    if arrangement not in ARRANGEMENTS:
        raise ValueError(f"arrangement must be one of {', '.join(ARRANGEMENTS)}, got {arrangement!r}")
    if not 0 < at < len(text) - 1:
        raise ValueError(f"at must be inside the window (0 < at < {len(text) - 1}), got {at}")
    if arrangement.startswith("bos") and bos is None:
        raise ValueError(f"{arrangement} needs a BOS token, and the model has none")
    if arrangement == "as-is":
        return text.clone()
    if arrangement == "bos-first":
        return torch.cat([torch.tensor([bos]), text[:-1]])
    if arrangement == "bos-at":
        return torch.cat([text[:at], torch.tensor([bos]), text[at:-1]])
    return torch.cat([text[1 : at + 1], text[:1], text[at + 1 :]])  # first-at


@torch.no_grad()
def key_weights(model, ids: torch.Tensor, at: int) -> torch.Tensor:
    """(layers, 2) float64: the attention weight on key 0 and on key ``at``, averaged over heads and over
    the queries ``at`` + 1 … T − 1 (each sees both keys, under any mask whose window exceeds T)."""
    _, layers = capture(model, ids[None])
    out = []
    for layer in layers:
        probs = layer_scores(layer).double().softmax(-1)[0, :, at + 1 :]  # (H, T - at - 1, T)
        out.append(torch.stack([probs[..., 0].mean(), probs[..., at].mean()]))
    return torch.stack(out)


def check_window(T: int, at: int, flags: bool = False) -> None:
    """A window of ``T`` tokens holds key 0, key ``at`` and a query after both (0 < at < T - 1); checked
    before any model loads. ``flags``: name them as the command line does (``--length``, ``--at``)."""
    length, where = ("--length", "--at") if flags else ("T", "at")
    if T < 3:
        raise ValueError(f"{length} must be at least 3 tokens (a key 0, a key at and a query), got {T}")
    if not 0 < at < T - 1:
        raise ValueError(f"{where} must be inside the window (0 < at < {T - 1}), got {at}")


def measure_sinks(
    model,
    ids: torch.Tensor,
    bos_policy: str,
    bos: int | None,
    T: int = 512,
    at: int = 100,
    n_windows: int = 8,
    progress: bool = True,
) -> dict[str, torch.Tensor]:
    """Per arrangement for ``bos_policy`` (:data:`FOR_BOS_POLICY`): (windows, layers, 2) weights on key 0
    and key ``at``, on ``n_windows`` disjoint windows of the text ``ids`` (:func:`data.eval_windows`), each
    window's kept (:func:`measure.window_loop`)."""
    if bos_policy not in FOR_BOS_POLICY:
        raise ValueError(f"bos_policy must be one of {', '.join(FOR_BOS_POLICY)}, got {bos_policy!r}")
    check_window(T, at)
    windows = eval_windows(ids, T - 1, n_windows)  # (n, T): the text of each window
    names = FOR_BOS_POLICY[bos_policy]
    bar = tqdm(total=len(names) * len(windows), desc="sinks", disable=not progress)
    out = {}
    for name in names:

        def weights(batch: torch.Tensor, name: str = name) -> dict[str, torch.Tensor]:
            return {"window/weights": key_weights(model, arrange(batch[0], name, at, bos), at)[None]}

        out[name] = window_loop(windows, weights, Sums(), bar=bar).sums["window/weights"]
    bar.close()
    return out


def save_sinks(path: Path, results: dict[str, dict[str, torch.Tensor]], about: dict) -> Path:
    """``results`` by model then arrangement, as ``<model>/<arrangement>`` (windows, layers, 2) float32, written
    under the store's lock (:func:`files.exclusive`)."""
    tensors = {f"{m}/{a}": t.float().contiguous() for m, by in results.items() for a, t in by.items()}
    with exclusive(Path(path)):
        save_safetensors(Path(path), tensors, metadata={HEADER_KEY: json.dumps(about, allow_nan=False)})
    return Path(path)


def load_sinks(path: Path) -> tuple[dict[str, dict[str, torch.Tensor]], dict]:
    """(results by model then arrangement, float64, and the header) of a sinks file (:func:`store.open_store`),
    every entry checked: ``<model>/<arrangement>``, (windows, layers, 2), finite."""
    _, about, tensors = open_store(path, (HEADER_KEY,), "sinks file")
    results: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        model, _, arrangement = name.partition("/")
        if not model or arrangement not in ARRANGEMENTS or t.ndim != 3 or t.shape[-1] != 2 or not t.isfinite().all():
            raise ValueError(f"sinks file {path}: entry {name!r} is malformed")
        results.setdefault(model, {})[arrangement] = t.double()
    return results, about
