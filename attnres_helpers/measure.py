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

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from .data import eval_windows
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


WINDOW_MEANS = ("s_hat", "key0", "nll")  # what every measurement averages over its windows


def mean_over_windows(
    statistics: Callable[[torch.Tensor], dict[str, torch.Tensor]],
    windows: torch.Tensor,
    batch_size: int = 1,
    sums: dict[str, torch.Tensor] | None = None,
    done: int = 0,
    after: Callable[[int, dict, dict], None] | None = None,
) -> dict[str, torch.Tensor]:
    """The one window loop of every measurement, our models' and pretrained ones': ``statistics(batch)``
    sums ŝ, key0 ``(layers, H, T)`` and NLL ``(T,)`` over each batch of ``windows (n, T+1)`` in turn; returns
    each total divided by n. ``sums`` and ``done``: what an earlier, stopped run summed over the first
    ``done`` windows (it continues from there); ``after(done, batch_sums, sums)`` runs after each batch
    (a pretrained measurement writes its work file and keeps each window's R there)."""
    sums = dict(sums or {})
    for start in range(done, windows.shape[0], batch_size):
        batch = windows[start : start + batch_size]
        batch_sums = statistics(batch)
        for name, value in batch_sums.items():
            sums[name] = sums.get(name, 0.0) + value
        if after is not None:
            after(start + batch.shape[0], batch_sums, sums)
    return {name: value / windows.shape[0] for name, value in sums.items()}


@torch.no_grad()
def measure_windows(model: torch.nn.Module, windows: torch.Tensor, bca: bool = False, batch_size: int = 8) -> dict:
    """Run held-out ``windows (n, T+1)`` through the model (:func:`mean_over_windows`).

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

    return mean_over_windows(statistics, windows, batch_size)


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
