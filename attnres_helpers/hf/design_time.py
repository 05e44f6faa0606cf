"""Design-time R of a `transformers` RoPE model under a training-free configuration (issue 41).

The method is :mod:`attnres_helpers.design_time`'s; this module gives it its two parts from a model:

- :func:`correlations`: one pass of the model as trained (:func:`.configurations.applied` with
  ``as-trained`` and :func:`.configured_attention.capturing`), each layer's q and k, which
  :class:`.configured_attention.ConfiguredLayer` holds rotated at the true positions, unrotated with the
  rotary's own frequencies and factor, and summed into the content correlations C_f(n);
- :func:`form`: a configuration's frequencies θ_f and attention factor, read from the very rotary module
  :func:`.configurations.applied` gives the model (YaRN's blend and factor, dynamic NTK's base at T,
  position interpolation), its remap's far positions and its mask.

:func:`design_time` combines them at every length asked; :func:`report` is the ``design-time`` command.

    python -m attnres_helpers design-time --model NAME|FOLDER --configuration NAME [--lengths 1,2,4]

:func:`build_store` writes the shipped design-time store (one pass at L, C_f(n) on a grid, the grid's measured
cost in R in its header), without the model's weights; notebook 10 reads it:

    attnres design-time --store data/results/design_time.safetensors [--model NAME]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .. import design_store
from .. import design_time as dt
from . import configured_attention
from .configurations import CONFIGURATIONS, Configuration, applied, check_config

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _frequencies(rotary: torch.nn.Module, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
    """θ (F,) float64 and the attention factor a of ``rotary`` called at ``positions`` (as the configured
    attention calls it, so dynamic NTK's base follows the length); checked against the cos it returns."""
    cos, _ = rotary(torch.zeros(1), positions[None])
    theta, factor = rotary.inv_freq.double().cpu(), float(rotary.attention_scaling)
    F = theta.numel()
    expected = factor * torch.cos(positions.double()[:, None] * theta[None, :])
    angle = float(positions.double().abs().max()) * float(theta.max())  # float32 rounds the angle by ~6e-8 of it
    if not torch.allclose(cos[0, :, :F].double(), expected, atol=factor * (1e-3 + 2e-7 * angle), rtol=0):
        raise ValueError(f"{type(rotary).__name__}'s phases are not inv_freq × position: no design-time form")
    return theta, factor


@torch.no_grad()
def correlations(model: PreTrainedModel, windows: Sequence[torch.Tensor], train_len: int) -> dt.Correlations:
    """The model's part from passes of the model as trained over ``windows`` (each (N,) token ids, one
    forward pass each, batch 1): :class:`attnres_helpers.design_time.Correlations`."""
    sums = dt.CorrelationSums()
    with applied(model, CONFIGURATIONS["as-trained"], train_len):
        for ids in windows:
            theta, factor = _frequencies(configured_attention.current_rotary(), torch.arange(len(ids)))

            def consume(layer: configured_attention.ConfiguredLayer, theta=theta, factor=factor) -> None:
                if layer.q.shape[0] != 1:
                    raise ValueError("one window a pass (batch of 1)")
                q, k = (dt.unrotate(x[0], theta, factor) for x in (layer.q, layer.k))
                sums.add(q, k, layer.scaling)

            with configured_attention.capturing(consume):
                model.base_model(input_ids=ids[None], use_cache=False)
            sums.end_window()
    return sums.result()


def form(model: PreTrainedModel, configuration: Configuration, train_len: int, T: int) -> dt.Form:
    """The configuration's part at T: frequencies and factor from the rotary module it gives ``model``
    (near at positions 0 … T − 1; far at the remap's query, then key positions, as the attention calls
    them), its remap and its mask."""
    with applied(model, configuration, train_len):
        rotary = configured_attention.current_rotary()
        theta, factor = _frequencies(rotary, torch.arange(T))
        remap = configuration.remap_for(train_len)
        theta_far = factor_far = None
        if remap is not None:
            pq, pk = remap.far_positions(T)
            _frequencies(rotary, pq)
            theta_far, factor_far = _frequencies(rotary, pk)
    return dt.Form(theta, factor, configuration.mask_for(train_len), remap, theta_far, factor_far)


def design_time(
    model: PreTrainedModel, corr: dt.Correlations, configuration: Configuration, train_len: int, lengths: Sequence[int]
) -> dict[int, dict[str, torch.Tensor]]:
    """By T: design-time ``s_hat`` and ``s_hat_sink_free`` (layers, T), and ``r``, ``r_sink_free`` (layers,)."""
    out = {}
    for T in lengths:
        s_hat, free = dt.design_s_hat(corr, form(model, configuration, train_len, T), T)
        r, r_free = dt.r_pair(s_hat, free)
        out[T] = {"s_hat": s_hat, "s_hat_sink_free": free, "r": r, "r_sink_free": r_free}
    return out


def text_windows(tokenizer, N: int, count: int = 1) -> list[torch.Tensor]:
    """The first ``count`` of plan v4's evenly spread windows of N tokens of the whole corpus (plain text)."""
    from ..data import eval_windows
    from .configured import N_WINDOWS, corpus_ids

    return list(eval_windows(corpus_ids(tokenizer), N, max(N_WINDOWS, count))[:count, :-1])


def report(
    model: str, configurations: Sequence[str], multiples: Sequence[float], pass_len: int | None = None, windows: int = 1
) -> str:
    """The ``design-time`` command: design-time R per layer of ``model`` (a registry name, verified, or a
    `transformers` folder) under each configuration at each multiple of L, from ``windows`` passes of
    ``pass_len`` tokens (default L) of the model as trained, shared by the configurations. Bad input (an
    unknown configuration, a length under one window of L, a model without one RoPE, a pass longer than L)
    is one line before any weight is read."""
    from . import fetch
    from .configurations import check_applies
    from .folders import load_config, load_pretrained, load_tokenizer

    unknown = [c for c in configurations if c not in CONFIGURATIONS]
    if unknown or not configurations:
        raise ValueError(f"unknown configuration {', '.join(unknown) or '(none)'}; known: {', '.join(CONFIGURATIONS)}")
    if not multiples or min(multiples) < 1:
        raise ValueError(f"lengths {list(multiples)}: a length under one window of L (design time extends it)")
    entry, folder = fetch.resolve(model)
    config = load_config(folder)
    for name in configurations:
        check_config(config, CONFIGURATIONS[name])  # no rotary embedding, or several bases: before any weight
    L = entry.context if entry is not None else config.max_position_embeddings
    N = pass_len or L
    if not 3 <= N <= L:
        raise ValueError(f"the pass takes 3 to L = {L} tokens of the model as trained, got {N}")
    lengths = sorted({int(round(m * L)) for m in multiples})
    start = time.perf_counter()
    loaded = fetch.load(entry) if entry is not None else load_pretrained(folder).eval()
    for name in configurations:
        check_applies(loaded, CONFIGURATIONS[name])
    corr = correlations(loaded, text_windows(load_tokenizer(folder), N, windows), L)
    lines = [
        f"design-time R of {folder.name} (L = {L}; mean-scores, boundary zero; 'no sink': without the "
        f"first-token entries) from {windows} pass(es) of {N} tokens as trained: "
        f"load and pass {time.perf_counter() - start:.1f} s"
    ]
    for name in configurations:
        begun = time.perf_counter()
        results = design_time(loaded, corr, CONFIGURATIONS[name], L, lengths)
        lines.append(f"{name}: design {time.perf_counter() - begun:.2f} s")
        for T in lengths:
            changed = name != "as-trained" and not (CONFIGURATIONS[name].same_as_trained_up_to_L and T <= L)
            what = dt.approximations(form(loaded, CONFIGURATIONS[name], L, T), T, N, changed)
            lines.append(f"  approximate at T = {T}: " + "; ".join(what))
        lines.append("layer " + " ".join(f"{'R(' + str(T) + ')':>11} {'no sink':>9}" for T in lengths))
        for layer in range(corr.layers):
            cells = (f"{results[T]['r'][layer]:11.4g} {results[T]['r_sink_free'][layer]:9.4g}" for T in lengths)
            lines.append(f"{layer:5d} " + " ".join(cells))
        means = (f"{results[T]['r'].mean():11.4g} {results[T]['r_sink_free'].mean():9.4g}" for T in lengths)
        lines.append(" mean " + " ".join(means))
    return "\n".join(lines)


def reduction_error(corr: dt.Correlations, store: design_store.DesignStore, train_len: int, model: dict) -> dict:
    """What keeping C_f(n) on the grid costs in design-time R, against the pass at full resolution: for
    every configuration of the registry at L and 2L, with and without the first-token entries, the largest
    relative error over layers and the relative error of the layer mean (``{name: {"L"|"2L": {"r"|
    "r_sink_free": [max over layers, layer mean]}}}``), and the largest of each over all of them."""
    reduced = store.correlations()
    out, worst = {}, {"layer": 0.0, "mean": 0.0}
    for name, configuration in CONFIGURATIONS.items():
        out[name] = {}
        for tag, T in (("L", train_len), ("2L", 2 * train_len)):
            form = dt.model_form(model, configuration, train_len, T)
            full, got = dt.design_r(corr, form, T), dt.design_r(reduced, form, T)
            out[name][tag] = {}
            for key in ("r", "r_sink_free"):
                layer = float((got[key] / full[key] - 1).abs().max())
                mean = float(abs(got[key].mean() / full[key].mean() - 1))
                out[name][tag][key] = [layer, mean]
                worst = {"layer": max(worst["layer"], layer), "mean": max(worst["mean"], mean)}
    return {"largest": worst, "by_configuration": out}


def build_store(model: str, path, window: int = 0) -> str:
    """The shipped design-time store (``design_store.STORE_COMMAND``): one pass of ``model`` as trained over plan
    v4's text window ``window`` of L tokens (plain text), its C_f(n) kept on the grid
    (:func:`attnres_helpers.design_time.reduction_grid`), the far values, the model's RoPE parameters, and
    the reduction's measured cost in design-time R (:func:`reduction_error`). Returns what it did, a line."""
    from . import fetch
    from .folders import load_config, load_pretrained, load_tokenizer

    entry, folder = fetch.resolve(model)
    config = load_config(folder)
    check_config(config, CONFIGURATIONS["as-trained"])
    L = entry.context if entry is not None else config.max_position_embeddings
    start = time.perf_counter()
    loaded = fetch.load(entry) if entry is not None else load_pretrained(folder).eval()
    ids = text_windows(load_tokenizer(folder), L, window + 1)[window]
    corr = correlations(loaded, [ids], L)
    passed = time.perf_counter() - start
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    about = {
        "model": folder.name,
        "train_len": L,
        "text": f"plan v4's text window {window} of L tokens (plain text, no passkey), one pass as trained",
        "head_dim": head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": dict(config.rope_parameters),
        "command": f"{design_store.STORE_COMMAND.split(' --store')[0]} --model {model} --store {path}",
    }
    about["pass_seconds"] = round(passed, 1)
    return f"wrote {path}: {folder.name}, one pass of {L} tokens as trained ({passed:.0f} s); " + write_store(
        path, corr, about
    )


def write_store(path, corr: dt.Correlations, about: dict) -> str:
    """Measure what the grid costs (:func:`reduction_error`), keep it in the header, write the store."""
    model = {k: about[k] for k in ("rope_parameters", "head_dim", "max_position_embeddings")}
    L = about["train_len"]
    about = {**about, "reduction_error": reduction_error(corr, design_store.reduced(corr, about), L, model)}
    design_store.save_store(path, corr, about)
    worst = about["reduction_error"]["largest"]
    return (
        f"C_f(n) on {' and '.join(str(len(g)) for g in design_store.grids(corr.length).values())} of {corr.length} "
        "distances (bulk pairs and key 0): design-time R off the full "
        f"pass by at most {worst['layer']:.2%} in a layer and {worst['mean']:.2%} in the layer mean "
        f"({len(CONFIGURATIONS)} configurations, L and 2L, with and without the sink)"
    )
