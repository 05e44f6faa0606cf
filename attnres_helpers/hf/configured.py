"""Measure one pretrained model under every inference-time configuration, window by window (plan v3).

For each configuration (:mod:`.configurations`), length T in {L, 2L} and window, one forward pass gives:

- every layer's ŝ per head under the configuration's mask (:func:`masks.expected_scores_masked`, from
  the rotated q and k the model itself uses, captured through `transformers`' attention interface) and
  each query's score on key 0 (for ŝ without the first-token sink);
- the per-position NLL of the window's text, and which targets lie inside a written passkey sentence;
- the passkey trials written into that window (:mod:`attnres_helpers.passkey`), scored teacher-forced.

Each (configuration, T, window) is one file under ``runs/configurations/`` (float32, atomic), so a
stopped run resumes where it stopped and never mixes settings: a file written with other settings is
refused with its name. :func:`attnres_helpers.configured_store.build` turns the files into the shipped
store. Inside L, configurations marked ``same_as_trained_up_to_L`` are the model as trained (checked
by the tests at small scale) and are measured once, as ``as-trained``.

    python -m attnres_helpers configurations [--windows 8] [--log runs/configurations.log]
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from .. import passkey
from ..configured_store import read_window_file
from ..data import eval_windows, load_corpus
from ..files import save_safetensors
from ..masks import Mask, expected_scores_masked
from .attention import LayerQK, capturing, layer_key0, layer_s_hat
from .configurations import CONFIGURATIONS, Configuration, applied
from .pretrained import _nll_in_chunks

if TYPE_CHECKING:
    from transformers import PreTrainedModel

N_WINDOWS = 8
TRIALS_PER_DISTANCE = 2
N_CONTROLS = 2  # ceiling and absent, each, per window


def corpus_ids(tokenizer) -> torch.Tensor:
    """The whole corpus (both splits: SmolLM2 never saw our split) as the tokenizer's ids (N,) int64."""
    return torch.tensor(tokenizer(load_corpus().decode("utf-8"))["input_ids"], dtype=torch.long)


def plan_jobs(train_len: int, configurations: Sequence[str], n_windows: int) -> list[tuple[str, int, int]]:
    """(configuration, T, window) in the order they run: every window at L first (where configurations
    that equal the model as trained are measured once, as as-trained), then 2L window by window, each
    window under every configuration, so a stopped run leaves every configuration with as many windows."""
    unknown = [c for c in configurations if c not in CONFIGURATIONS]
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; known: {', '.join(CONFIGURATIONS)}")
    at_L = [c for c in configurations if not CONFIGURATIONS[c].same_as_trained_up_to_L]
    if any(CONFIGURATIONS[c].same_as_trained_up_to_L for c in configurations) and "as-trained" not in at_L:
        at_L.insert(0, "as-trained")
    jobs = [(c, train_len, w) for w in range(n_windows) for c in at_L]
    return jobs + [(c, 2 * train_len, w) for w in range(n_windows) for c in configurations]


def window_layout(ids: torch.Tensor, T: int, train_len: int, window: int, n_windows: int, tokenize) -> passkey.Layout:
    """Window ``window`` of ``n_windows`` evenly spread windows of T+1 tokens, with its passkey trials
    (drawn by ``default_rng(T + window)``: the same for every configuration)."""
    text = eval_windows(ids, T, n_windows)[window]
    return passkey.layout(
        text,
        tokenize,
        passkey.distances_for(train_len, T + 1),
        TRIALS_PER_DISTANCE,
        N_CONTROLS,
        N_CONTROLS,
        seed=T + window,
    )


@torch.no_grad()
def measure_window(model: PreTrainedModel, layout: passkey.Layout, mask: Mask | None) -> dict[str, torch.Tensor]:
    """One forward pass of ``layout.tokens`` under ``mask`` (None: causal): s_hat and key0
    (layers, H, T) float32, nll (T,) float32, the passkey scores (n,) and ``inserted`` (T,)."""
    x = layout.tokens[None, :-1]
    T = x.shape[1]
    s_hats, key0s = [], []

    def consume(layer: LayerQK) -> None:
        if mask is None:
            s_hats.append(layer_s_hat(layer).float())
        else:
            s_hats.append(expected_scores_masked(layer.q, layer.k, layer.scaling, mask).float())
        key0s.append(layer_key0(layer).float())

    attention_mask = None if mask is None else mask.allowed(T)[None, None]
    with capturing(model, consume):
        hidden = model.base_model(input_ids=x, attention_mask=attention_mask, use_cache=False).last_hidden_state[0]
    nll = _nll_in_chunks(model, hidden[None], layout.tokens[None, 1:]).float()
    head = model.get_output_embeddings()
    scores = passkey.score(lambda pos: torch.log_softmax(head(hidden[pos]).float(), -1), layout.tokens, layout.trials)
    return {
        "s_hat": torch.stack(s_hats),
        "key0": torch.stack(key0s),
        "nll": nll,
        "inserted": layout.inserted,
        "passkey_logprob": scores.logprob.float(),
        "passkey_correct": scores.correct,
    }


def job_settings(
    configuration: Configuration, T: int, train_len: int, window: int, n_windows: int, model_id: str, theta: float
) -> dict:
    """Everything that determines a window file's numbers: a file written with other settings is refused."""
    return {
        "configuration": configuration.name,
        "rope": configuration.rope_for(theta, train_len),
        "mask": configuration.mask_for(train_len).as_dict(),
        "T": T,
        "train_len": train_len,
        "window": window,
        "n_windows": n_windows,
        "model": model_id,
        "trials_per_distance": TRIALS_PER_DISTANCE,
        "controls": N_CONTROLS,
        "key_sentence": passkey.KEY_SENTENCE,
        "query_sentence": passkey.QUERY_SENTENCE,
    }


def job_path(folder: Path, name: str, T: int, window: int) -> Path:
    return Path(folder) / name / str(T) / f"window-{window}.safetensors"


def _done(path: Path, settings: dict) -> bool:
    if not path.is_file():
        return False
    stored, _, _ = read_window_file(path)
    if stored != settings:
        differ = sorted(k for k in settings if stored.get(k) != settings[k])
        raise ValueError(f"window file {path} was measured with other settings ({', '.join(differ)}); delete it")
    return True


def measure_configurations(
    model: PreTrainedModel,
    tokenizer,
    folder: Path,
    model_id: str,
    train_len: int,
    configurations: Sequence[str] = tuple(CONFIGURATIONS),
    n_windows: int = N_WINDOWS,
    log=None,
    progress: bool = True,
) -> int:
    """Measure every job of :func:`plan_jobs` not yet in ``folder``; returns how many were measured.
    Every setting is checked, and every window laid out, before the first forward pass."""
    ids = corpus_ids(tokenizer)
    tokenize = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    jobs = plan_jobs(train_len, configurations, n_windows)
    layouts = {}
    for T in sorted({T for _, T, _ in jobs}):
        if len(ids) // (T + 1) < n_windows:
            raise ValueError(f"the corpus has {len(ids)} tokens: fewer than {n_windows} windows of {T + 1}")
        for w in range(n_windows):
            layouts[(T, w)] = window_layout(ids, T, train_len, w, n_windows, tokenize)
    todo = []
    for name, T, w in jobs:
        theta = model.config.rope_parameters["rope_theta"]
        settings = job_settings(CONFIGURATIONS[name], T, train_len, w, n_windows, model_id, theta)
        if not _done(job_path(folder, name, T, w), settings):
            todo.append((name, T, w, settings))
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="configurations", disable=not progress)
    for name, T, w, settings in todo:
        with applied(model, CONFIGURATIONS[name], train_len) as mask:
            out = measure_window(model, layouts[(T, w)], mask)
        trials = [t.__dict__ for t in layouts[(T, w)].trials]
        path = job_path(folder, name, T, w)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_safetensors(
            path,
            {k: v.contiguous() for k, v in out.items()},
            {"settings": json.dumps(settings), "trials": json.dumps(trials)},
        )
        bar.update(1)
        if log is not None:
            print(f"{name} T={T} window {w}: {bar.format_dict['elapsed']:.0f} s elapsed", file=log, flush=True)
    bar.close()
    return len(todo)
