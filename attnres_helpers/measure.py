"""Measure a trained model: ŝ[n] per layer and head, R under both head conventions, perplexity.

The estimator is the paper's (Sun et al. 2022, §4.3 Eq. 11): ŝ[n] is the mean of the
n-th causal sub-diagonal of the pre-softmax scores, averaged over held-out windows.
What a measurement keeps is ŝ (layers, H, T) and the per-position NLL (T,) of the same
windows, and the mean score of each query on key 0 (so that the first-token sink can be taken out of ŝ
as a query, :meth:`attnres_helpers.store.Profile.sink_free_s_hat`)
(:class:`attnres_helpers.store.Profile`); R per layer under either head convention
and boundary, and perplexity before and past L, are queries over them
(:func:`attnres_helpers.store.records`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from .data import eval_windows
from .files import differing_settings, save_safetensors
from .metric import ScoreAccumulator
from .store import Profile, profile_of_means


def attention_scores(model: torch.nn.Module, tokens: torch.Tensor, bca: bool = False) -> list[torch.Tensor]:
    """Every layer's pre-softmax scores for ``tokens (B, T)``: a list of ``(B, H, T, T)``.

    Scores are q·kᵀ/√d plus any additive bias (ALiBi), with masked pairs at -inf.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
        raise ValueError(f"tokens must be a (B, T) tensor of token ids, got {getattr(tokens, 'shape', type(tokens))}")
    if tokens.shape[1] < 2:
        raise ValueError(f"need at least 2 tokens per window, got T = {tokens.shape[1]}")
    model.eval()
    _, scores = model.forward_with_scores(tokens, bca=bca)
    return scores


WINDOW_MEANS = ("s_hat", "key0", "nll")  # what every measurement of ŝ averages over its windows


def to_do(count: int, kept: Sums | WindowFiles, share: tuple[int, int] = (0, 1)) -> list[int]:
    """The windows of ``count`` that this process measures: those of its ``share`` (rank, world), every
    world-th from rank on, that are not yet done. Each rank owns the same windows whenever it looks, so a
    rank that starts after another has finished some still measures its own (dealing out only the windows
    not yet done would depend on who looked first)."""
    return [i for i in range(count)[share[0] :: share[1]] if not kept.done(i)]


def window_loop(
    windows: Sequence,
    measure: Callable[[Sequence], dict[str, torch.Tensor]],
    kept: Sums | WindowFiles,
    batch_size: int = 1,
    share: tuple[int, int] = (0, 1),
    bar=None,
    after: Callable[[range], None] | None = None,
) -> Sums | WindowFiles:
    """The one window loop of every measurement (our models', pretrained models', the configurations', the
    sinks'): ``measure`` each run of up to ``batch_size`` consecutive ``windows`` (a tensor's rows, or any
    sequence: a configuration's jobs) not yet done in what is ``kept``, fold what it returns into ``kept`` and
    write ``kept`` (its work file, atomically) after each, so that a stopped run resumes where it stopped.
    ``kept`` is :class:`Sums` (sums and a count, and values kept per window) or :class:`WindowFiles` (one
    file per window). Which windows are to do is settled before the first is measured (a file written under
    other settings is refused then); ``share`` (rank, world): :func:`to_do`.
    ``bar`` (tqdm) advances and ``after(windows done)`` runs after each batch."""
    todo = to_do(len(windows), kept, share)
    start = 0
    while start < len(todo):
        stop = start + 1
        while stop < len(todo) and stop - start < batch_size and todo[stop] == todo[stop - 1] + 1:
            stop += 1
        batch = range(todo[start], todo[stop - 1] + 1)
        kept.fold(batch, measure(windows[batch.start : batch.stop]))
        kept.write()
        if bar is not None:
            bar.update(len(batch))
        if after is not None:
            after(batch)
        start = stop
    return kept


class Sums:
    """What a window loop keeps where means are wanted: each value's sum over the windows done, and their
    count (windows are folded in order); a value named ``window/<name>`` (windows of the batch first) is kept
    for every window instead, stacked (the window bootstrap's input, a sink's weights). ``save(sums)``
    writes the work file a rerun resumes from (:func:`window_loop` calls it after each window)."""

    def __init__(self, sums: dict | None = None, count: int = 0, save: Callable[[Sums], None] | None = None):
        self.sums, self.count, self.save = dict(sums or {}), count, save

    def done(self, window: int) -> bool:
        return window < self.count

    def fold(self, windows: range, values: dict[str, torch.Tensor]) -> None:
        if windows.start != self.count:
            raise ValueError(f"windows are summed in order: window {windows.start} after {self.count}")
        for name, value in values.items():
            if name.startswith("window/"):
                earlier = self.sums.get(name)
                self.sums[name] = value if earlier is None else torch.cat([earlier, value])
            else:
                self.sums[name] = self.sums.get(name, 0.0) + value
        self.count = windows.stop

    def write(self) -> None:
        if self.save is not None:
            self.save(self)

    def means(self) -> dict[str, torch.Tensor]:
        """Each summed value over the count of windows."""
        return {name: v / self.count for name, v in self.sums.items() if not name.startswith("window/")}


class WindowFiles:
    """What a window loop keeps where each window's values are kept whole (the configurations: per-window
    R, NLL and passkey trials, the store built from them later): window i is the file ``paths[i]``, written
    (atomically) with ``settings[i]`` and ``metadata[i]`` (JSON) in its header. It is done when the file is
    there; a file written under other settings (:func:`files.differing_settings` against ``read(path)``, its
    stored settings) is refused by ``refuse(path, differing keys, stored)``, which raises."""

    def __init__(self, paths, settings, metadata, read: Callable[[Path], dict], refuse=None):
        self.paths, self.settings, self.metadata, self.read = list(paths), list(settings), list(metadata), read
        self.refuse, self.folded, self.checked = refuse, [], set()

    def done(self, window: int) -> bool:
        path = self.paths[window]
        if window in self.checked or not path.is_file():
            return window in self.checked
        stored = self.read(path)
        differ = differing_settings(stored, self.settings[window])
        if differ:
            if self.refuse is not None:
                self.refuse(path, differ, stored)
            raise ValueError(f"{path} was written with other settings ({', '.join(differ)}); delete it to redo")
        self.checked.add(window)
        return True

    def fold(self, windows: range, values: dict[str, torch.Tensor]) -> None:
        if len(windows) != 1:
            raise ValueError("one file per window: fold windows one at a time")
        self.folded.append((windows.start, values))

    def write(self) -> None:
        for i, values in self.folded:
            header = {
                "settings": json.dumps(self.settings[i]),
                **{k: json.dumps(v) for k, v in self.metadata[i].items()},
            }
            save_safetensors(self.paths[i], {k: v.contiguous() for k, v in values.items()}, header)
            self.checked.add(i)
        self.folded = []


@torch.no_grad()
def measure_windows(model: torch.nn.Module, windows: torch.Tensor, bca: bool = False, batch_size: int = 8) -> dict:
    """Run held-out ``windows (n, T+1)`` through the model, ``batch_size`` at a time (:func:`window_loop`).

    Returns ``s_hat (layers, H, T)`` (ŝ averaged over every window), ``key0 (layers, H, T)`` (the
    mean score of each query on key 0, -inf where masked) and ``nll (T,)``, the mean next-token
    negative log-likelihood at each position.
    """
    if windows.ndim != 2 or windows.shape[0] < 1 or windows.shape[1] < 3:
        raise ValueError(f"windows must be (n >= 1, T+1 >= 3) token ids, got shape {tuple(windows.shape)}")
    device = next(model.parameters()).device
    model.eval()

    def statistics(batch: torch.Tensor) -> dict[str, torch.Tensor]:
        x, y = batch[:, :-1].to(device), batch[:, 1:].to(device)  # (b, T)
        logits, scores = model.forward_with_scores(x, bca=bca)
        s_hat = []
        for layer_scores in scores:  # (b, H, T, T); every window of a batch has the same pairs at each distance
            accumulator = ScoreAccumulator()
            accumulator.update(layer_scores)
            s_hat.append(accumulator.mean() * batch.shape[0])
        nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (b, T)
        return {
            "s_hat": torch.stack(s_hat).cpu(),  # (layers, H, T): the batch's sum of each window's ŝ
            "key0": torch.stack([s[..., 0].double().sum(0) for s in scores]).cpu(),  # (layers, H, T)
            "nll": nll.double().sum(0).cpu(),  # (T,)
        }

    return window_loop(windows, statistics, Sums(), batch_size).means()


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_measure(multiples: Iterable[int] = (1, 2, 4), n_windows: int = 32, batch_size: int = 8) -> None:
    """Refuse measuring settings :func:`measure_model` cannot use, before any work: ``multiples`` a
    non-empty list of integers >= 1, ``n_windows`` and ``batch_size`` integers >= 1."""
    if isinstance(multiples, (str, bytes)) or not list(multiples) or not all(map(_count, multiples)):
        raise ValueError(f"measure multiples must be a non-empty list of integers >= 1, got {multiples!r}")
    for name, value in (("n_windows", n_windows), ("batch_size", batch_size)):
        if not _count(value):
            raise ValueError(f"measure {name} must be an integer >= 1, got {value!r}")


def measure_model(
    model: torch.nn.Module,
    val_tokens: torch.Tensor,
    run: str,
    meta: dict,
    multiples: Iterable[int] = (1, 2, 4),
    n_windows: int = 32,
    batch_size: int = 8,
) -> list[Profile]:
    """Profiles (ŝ and per-position NLL) at eval_len = k·L for k in ``multiples``, without and
    (relative encodings) with BCA. Every eval length uses its own windows, and within one length
    the positions < L and ≥ L come from the same windows.

    ``meta`` is the run's metadata (seed and any other keys; encoding and train_len are taken from
    the model). R and perplexities are then queries: :func:`attnres_helpers.store.records`.
    """
    multiples = list(multiples)
    check_measure(multiples, n_windows, batch_size)
    cfg = model.cfg
    meta = {**meta, "encoding": cfg.encoding, "train_len": cfg.train_len}
    profiles = []
    for k in multiples:
        T = k * cfg.train_len
        windows = eval_windows(val_tokens, T, n_windows)  # (n, T+1)
        for bca in (False, True):
            if bca and not model.supports_bca:
                continue
            m = measure_windows(model, windows, bca=bca, batch_size=batch_size)
            profiles.append(profile_of_means(run, meta, T, bca, m))
    return profiles
