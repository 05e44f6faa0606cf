"""Measure a trained model: ŝ[n] per layer and head, R under both head conventions, perplexity.

The estimator is the paper's (Sun et al. 2022, §4.3 Eq. 11): ŝ[n] is the mean of the
n-th causal sub-diagonal of the pre-softmax scores, averaged over held-out windows;
R is computed per layer (heads averaged before R, ``"mean-scores"``, or R averaged over
heads, ``"mean-R"``), then averaged over layers ("the average resolution is shown in
Table 3"). Boundary convention: ``"zero"`` throughout.

Records are tidy dicts, one per (eval_len, bca, head_mode, layer), with ``layer`` an
int or ``"mean"``: encoding, seed, train_len, eval_len, bca, head_mode, layer,
resolution, perplexity, perplexity_past_L.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .resolution import HEAD_MODES, ScoreAccumulator, layer_resolution


def attention_scores(model, tokens: torch.Tensor, bca: bool = False) -> list[torch.Tensor]:
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


@torch.no_grad()
def measure_windows(model, windows: torch.Tensor, bca: bool = False, batch_size: int = 8) -> dict:
    """Run held-out ``windows (n, T+1)`` through the model.

    Returns ``s_hat (layers, H, T)`` (ŝ averaged over every window) and ``nll (T,)``,
    the mean next-token negative log-likelihood at each position.
    """
    if windows.ndim != 2 or windows.shape[0] < 1 or windows.shape[1] < 3:
        raise ValueError(f"windows must be (n >= 1, T+1 >= 3) token ids, got shape {tuple(windows.shape)}")
    device = next(model.parameters()).device
    accumulators = [ScoreAccumulator() for _ in range(model.cfg.n_layer)]
    nll_sum = torch.zeros(windows.shape[1] - 1, dtype=torch.float64)
    model.eval()
    for start in range(0, windows.shape[0], batch_size):
        batch = windows[start : start + batch_size].to(device)
        x, y = batch[:, :-1], batch[:, 1:]  # (b, T)
        logits, scores = model.forward_with_scores(x, bca=bca)
        for acc, layer_scores in zip(accumulators, scores):
            acc.update(layer_scores)  # (b, H, T, T)
        nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (b, T)
        nll_sum += nll.double().sum(0).cpu()
    s_hat = torch.stack([acc.mean() for acc in accumulators])  # (layers, H, T)
    return {"s_hat": s_hat, "nll": nll_sum / windows.shape[0]}


def records_from(s_hat: torch.Tensor, nll: torch.Tensor, **keys) -> list[dict]:
    """Tidy records for one (model, eval_len, bca): both head modes, each layer and the mean."""
    train_len = keys["train_len"]
    ppl = math.exp(float(nll.mean()))
    past = nll[train_len:]
    ppl_past = math.exp(float(past.mean())) if past.numel() else None
    out = []
    for head_mode in HEAD_MODES:
        per_layer = layer_resolution(s_hat, head_mode)  # (layers,)
        layers = list(enumerate(per_layer.tolist())) + [("mean", float(per_layer.mean()))]
        for layer, r in layers:
            out.append(
                {
                    **keys,
                    "head_mode": head_mode,
                    "layer": layer,
                    "resolution": r,
                    "perplexity": ppl,
                    "perplexity_past_L": ppl_past,
                }
            )
    return out


def measure_model(model, val_tokens: torch.Tensor, seed: int, multiples=(1, 2, 4), n_windows: int = 32, batch_size: int = 8) -> list[dict]:
    """Records at eval_len = k·L for k in ``multiples``, without and (relative encodings) with BCA."""
    from .data import eval_windows

    cfg = model.cfg
    records = []
    for k in multiples:
        T = k * cfg.train_len
        windows = eval_windows(val_tokens, T, n_windows)  # (n, T+1)
        for bca in (False, True):
            if bca and cfg.encoding == "sinusoidal":
                continue  # BCA needs a relative encoding
            m = measure_windows(model, windows, bca=bca, batch_size=batch_size)
            keys = dict(encoding=cfg.encoding, seed=seed, train_len=cfg.train_len, eval_len=T, bca=bca)
            records += records_from(m["s_hat"], m["nll"], **keys)
    return records
