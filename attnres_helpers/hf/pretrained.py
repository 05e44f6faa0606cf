"""Measure a pretrained Hugging Face causal LM on this project's held-out text, at any length.

One window at a time goes through the model with :func:`capture.capturing`: each layer's ŝ comes from
its q and k by FFT while `transformers`' own SDPA computes the attention (no (T, T) mask or score
tensor where the mask is causal, BCA or a sliding window), the mean score on key 0 is kept for the
first-token sink, and the per-position NLL comes from the final hidden states through the output head in
chunks, so the full (T, vocab) logits never exist. What comes out is a :class:`attnres_helpers.store.Profile`
per (length, mask), like every other measurement here; R and perplexities are queries over it.

:func:`measure_store` runs a set of lengths into a store, resumably: each finished window's sums are
written (atomically) to a work file, and a rerun continues from there.

    python -m attnres_helpers measure-hf --model FOLDER --train-len 8192 --lengths 0.125,1,2 --bca 2 --json
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from ..data import eval_windows, load_splits
from ..files import differing_settings, exclusive, folder_fingerprint, regular_file, save_safetensors, sums_fingerprint
from ..measure import Sums, window_loop
from ..model import blockwise_causal_mask
from ..store import Profile, average_heads, profile_of_means, save_profiles
from .attention import METHODS, CaptureError, LayerQK, capturing, check_choice, check_input_ids, layer_key0, layer_s_hat
from .folders import load_config, load_pretrained, load_tokenizer
from .memory import NLL_CHUNK, check_fits

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

CONFIG_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "max_position_embeddings",
    "vocab_size",
    "rope_parameters",
)  # kept in a store's run metadata
UNSUPPORTED_HEADS = ("final_logit_softcapping", "logit_scale")  # applied after the head by some models


def encoding_of(config: PretrainedConfig) -> str:
    """The position encoding of a `transformers` config, in this project's names: "alibi" (BLOOM),
    "rope" (any rotary model), or "learned" (absolute position embeddings)."""
    if config.model_type == "bloom":
        return "alibi"
    rotary = ("rope_parameters", "rope_theta", "rotary_pct", "rotary_emb_base")
    return "rope" if any(getattr(config, name, None) for name in rotary) else "learned"


def nll_in_chunks(model, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = NLL_CHUNK) -> torch.Tensor:
    """Per-position NLL (T,) float64, averaged over the batch, from the final hidden states (B, T, D)
    through the model's output head ``chunk`` positions at a time."""
    changed = [name for name in UNSUPPORTED_HEADS if getattr(model.config, name, None) not in (None, 1, 1.0)]
    if changed:
        raise CaptureError(
            f"{model.config.model_type} applies {', '.join(changed)} after its output head; "
            "the per-position NLL is not implemented for it"
        )
    head = model.get_output_embeddings()
    T = hidden.shape[1]
    out = torch.empty(T, dtype=torch.float64)
    for start in range(0, T, chunk):
        logits = head(hidden[:, start : start + chunk]).float()  # (B, c, V)
        target = logits.gather(-1, targets[:, start : start + chunk, None])[..., 0]  # (B, c)
        nll = torch.logsumexp(logits, dim=-1) - target  # = cross-entropy, without writing a (B, c, V) log-softmax
        out[start : start + chunk] = nll.double().mean(0).cpu()
    return out


@torch.no_grad()
def window_pass(
    model: PreTrainedModel,
    window: torch.Tensor,
    consume: Callable,
    capture: Callable | None = None,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The capture, forward pass and NLL of one window, shared by every measurement of a `transformers`
    model (:func:`window_statistics`; a configuration's, :func:`.configured.measure_window`): ``window
    (T+1,)`` ids through the base model with every attention layer handed to ``consume`` by ``capture``
    (default :func:`.attention.capturing` of the model; a configured model's is
    :func:`.configured_attention.capturing`), every layer checked captured. Returns the final hidden states
    (1, T, D) and the per-position NLL (T,) float64 (:func:`nll_in_chunks`)."""
    x, y = window[None, :-1], window[None, 1:]
    check_input_ids(model, x)
    captured = []

    def counted(layer) -> None:
        captured.append(None)
        consume(layer)

    with capturing(model, counted) if capture is None else capture(counted):
        hidden = model.base_model(input_ids=x, attention_mask=attention_mask, use_cache=False).last_hidden_state
    layers = getattr(model.config, "num_hidden_layers", None) or model.config.n_layer
    if len(captured) != layers:
        raise CaptureError(f"{len(captured)} of {layers} attention layers were captured")
    return hidden, nll_in_chunks(model, hidden, y)


@torch.no_grad()
def window_statistics(
    model: PreTrainedModel, window: torch.Tensor, block: int | None = None, method: str = "fft"
) -> dict:
    """One held-out ``window (T+1,)`` of token ids through ``model`` (:func:`window_pass`): ``s_hat`` and
    ``key0`` ``(layers, H, T)`` float64 (Eq. 11, and the mean score on key 0) and ``nll (T,)`` float64.
    ``block``: BCA with blocks of this size (a 4-D mask handed to the model), else the causal mask."""
    check_choice("method", method, METHODS)
    T = window.shape[-1] - 1
    mask = None
    if block is not None:
        if model.config.model_type == "bloom" or getattr(model.config, "sliding_window", None):
            raise CaptureError(
                f"BCA is measured here for full-attention models whose attention goes through "
                f"transformers' AttentionInterface, not {model.config.model_type}"
            )
        mask = blockwise_causal_mask(T, block)[None, None].to(window.device)  # (1, 1, T, T) bool
    s_hats, key0s = [], []

    def consume(layer: LayerQK) -> None:
        s_hats.append(layer_s_hat(layer, method))
        key0s.append(layer_key0(layer))

    _, nll = window_pass(model, window, consume, attention_mask=mask)
    if block is not None and any(k[:, block * 2 :].isfinite().any() for k in key0s):
        raise CaptureError("the model did not apply the BCA mask it was given")
    return {"s_hat": torch.stack(s_hats), "key0": torch.stack(key0s), "nll": nll}


def held_out_ids(folder_or_model: PreTrainedModel | str | Path) -> torch.Tensor:
    """This project's held-out text as the model's tokens (N,) int64: the bytes themselves for a
    byte-level vocabulary, else the model folder's own tokenizer (loaded offline)."""
    held_out = load_splits()[1]
    config = getattr(folder_or_model, "config", None)
    if config is not None and config.vocab_size == 256:
        return held_out.long()
    folder = folder_or_model if config is None else config._name_or_path
    tokenizer = load_tokenizer(folder)
    text = bytes(held_out.tolist()).decode("utf-8", errors="replace")
    # the text's own tokens: a tokenizer that puts BOS first (Gemma's) would otherwise start the first window
    # alone with it; where BOS goes is measure_store's choice, made for every window alike
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def check_lengths(n_tokens: int, lengths: Sequence[int], n_windows: int) -> None:
    """Every length fits at least one window of T+1 tokens (raised before any measuring starts)."""
    if not lengths:
        raise ValueError("no lengths to measure")
    if len(set(lengths)) != len(lengths):
        raise ValueError(f"lengths {list(lengths)} name a length twice: each length is measured once")
    for T in lengths:
        if isinstance(T, bool) or not isinstance(T, int) or T < 2:
            raise ValueError(f"each length must be an integer >= 2 tokens, got {T!r}")
        if n_tokens < T + 1:
            raise ValueError(
                f"the held-out text has {n_tokens} tokens, too few for one window of {T + 1} at length {T}"
            )
    if isinstance(n_windows, bool) or not isinstance(n_windows, int) or n_windows < 1:
        raise ValueError(f"n_windows must be a positive integer, got {n_windows!r}")


def plan_windows(ids: torch.Tensor, lengths: Sequence[int], n_windows: int) -> dict[int, torch.Tensor]:
    """Up to ``n_windows`` disjoint windows (n, T+1) per length, evenly spread (:func:`data.eval_windows`)."""
    check_lengths(len(ids), lengths, n_windows)
    return {T: eval_windows(ids, T, n_windows) for T in lengths}


def _work_key(T: int, bca: bool) -> str:
    return f"{T}/{int(bca)}"


def _read_work(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    if not path.exists():
        return {}, {}
    regular_file(path, "work file")  # a named pipe would block the open
    try:
        with safe_open(path, framework="pt") as f:
            done = json.loads((f.metadata() or {})["done"])
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, KeyError, ValueError) as err:
        raise ValueError(f"work file {path} is corrupt ({err}); delete it to start the measurement afresh") from err
    return done, tensors


def measure_store(
    model: PreTrainedModel,
    run: str,
    meta: dict,
    lengths: Sequence[int],
    bca_lengths: Sequence[int] = (),
    n_windows: int = 8,
    work: Path | None = None,
    method: str = "fft",
    progress: bool = True,
    ids: torch.Tensor | None = None,
    bos: int | None = None,
) -> tuple[list[Profile], dict[str, dict[str, torch.Tensor]]]:
    """Profiles of ``model`` at every length (causal) and at ``bca_lengths`` with BCA (blocks of
    train_len/2), each the mean over up to ``n_windows`` held-out windows, and the values of each window
    by profile key (:func:`store.save_profiles`' ``window_values``): ``r`` and ``r_sink_free`` (windows,
    layers), the mean-scores R of that window alone with and without the first-token entries, and
    ``nll`` (windows,), its mean NLL. ``bos``: a token id put first in every window (the window's last
    text token is left out, so the text is the same with and without it).

    With ``work`` (a file), the sums of every finished window are written there after each window, and a
    rerun with the same arguments continues where it stopped. ``meta`` must hold train_len.
    """
    if not set(bca_lengths) <= set(lengths):
        raise ValueError(f"BCA lengths {sorted(bca_lengths)} must be among the lengths {sorted(lengths)}")
    ids = held_out_ids(model) if ids is None else ids
    windows = plan_windows(ids, lengths, n_windows)
    L = meta["train_len"]
    # longest first, BCA right after its causal twin: a run stopped early keeps the lengths that matter most
    jobs = sorted([(T, False) for T in lengths] + [(T, True) for T in bca_lengths], key=lambda j: (-j[0], j[1]))
    settings = {
        "run": run,
        "lengths": list(lengths),
        "bca_lengths": list(bca_lengths),
        "n_windows": n_windows,
        "method": method,
        "tokens": len(ids),
        "bos": bos,
        "weights": meta.get("weights"),  # a hash of the files loaded: two models of one name never share sums
        "train_len": L,
    }
    if work and not meta.get("weights"):
        raise ValueError(
            f"meta names no weights: the work file {work} is keyed by them (a hash of the files loaded), "
            "so that other weights never reuse its sums"
        )
    done, stored = _read_work(Path(work)) if work else ({}, {})
    written = done.get("settings") if isinstance(done.get("settings"), dict) else {}
    differ = differing_settings(written, settings) if done else []
    if differ:
        raise ValueError(
            f"work file {work} was written by a measurement with other settings ({', '.join(differ)}); "
            "delete it or use another"
        )
    done.setdefault("settings", settings)
    kept = {}  # by job: its sums, window values and count, all of them in the one work file

    def save(_: Sums) -> None:
        tensors = {f"{key}/{name}": v.contiguous() for key, job in kept.items() for name, v in job.sums.items()}
        save_safetensors(Path(work), tensors, {"done": json.dumps(done | {k: j.count for k, j in kept.items()})})

    for T, bca in jobs:
        key = _work_key(T, bca)
        earlier = {name[len(key) + 1 :]: v for name, v in stored.items() if name.startswith(f"{key}/")}
        kept[key] = Sums(earlier, done.get(key, 0), save if work else None)
    total = sum(len(windows[T]) for T, _ in jobs)
    bar = tqdm(total=total, initial=sum(j.count for j in kept.values()), desc=run, disable=not progress)
    for T, bca in jobs:

        def statistics(batch: torch.Tensor, T: int = T, bca: bool = bca) -> dict[str, torch.Tensor]:
            window = batch[0] if bos is None else torch.cat([torch.tensor([bos]), batch[0, :-1]])
            stats = window_statistics(model, window, L // 2 if bca else None, method)
            values = _window_values(run, meta, T, bca, stats)
            return stats | {f"window/{name}": value[None] for name, value in values.items()}

        window_loop(windows[T], statistics, kept[_work_key(T, bca)], bar=bar)
    bar.close()
    profiles, window_values = [], {}
    for T, bca in sorted(jobs):
        key = _work_key(T, bca)
        profile = profile_of_means(
            run, {**meta, "windows": {str(t): len(windows[t]) for t in lengths}}, T, bca, kept[key].means()
        )
        profiles.append(profile)
        window_values[profile.key] = {name: kept[key].sums[f"window/{name}"].float() for name in WINDOW_VALUES}
    return profiles, window_values


WINDOW_VALUES = ("r", "r_sink_free", "nll")  # kept for every window (the window bootstrap's input)


def _window_values(run: str, meta: dict, T: int, bca: bool, stats: dict) -> dict[str, torch.Tensor]:
    """One window's R per layer, with and without the first-token entries (:meth:`Profile.layer_resolutions`,
    the one place R is computed), and its mean NLL."""
    alone = profile_of_means(run, meta, T, bca, stats)
    r, r_sink_free = alone.layer_resolutions(), alone.layer_resolutions(sink=False)
    return {"r": r, "r_sink_free": r_sink_free, "nll": stats["nll"].mean()}


def measure_pretrained(
    name_or_path: str | Path,
    multiples: Sequence[float] = (1, 2),
    n_windows: int = 4,
    method: str = "fft",
    train_len: int | None = None,
    bca_multiples: Sequence[float] = (),
    progress: bool = False,
) -> list[dict]:
    """Records (:func:`attnres_helpers.store.records`) of a pretrained causal LM at ``k × L`` for k in
    ``multiples`` (L = ``train_len``, or the context in its config), with BCA at ``bca_multiples``.
    ``name_or_path``: a registry name (:mod:`.models`: its converted folder, verified, its context as L and
    its BOS policy, the run named as the registry names it), a model folder or a hub name. Every argument
    is checked before the model is loaded or anything is measured."""
    from ..store import records
    from .models import PRETRAINED_MODELS

    entry = PRETRAINED_MODELS.get(str(name_or_path))
    if entry is not None:
        from . import fetch

        folder, run = fetch.verify(entry), entry.name
        train_len = train_len or entry.context
    else:
        folder, run = name_or_path, Path(str(name_or_path)).name or str(name_or_path).replace("/", "--")
    L, Ts, bca_Ts = _planned(folder, multiples, bca_multiples, n_windows, method, train_len)
    model, ids, meta = _loaded(folder, run if entry is not None else str(name_or_path), L, Ts, n_windows)
    bos = None
    if entry is not None:  # the registry's BOS policy, recorded as a store records it
        bos = load_tokenizer(folder).bos_token_id if entry.bos == "first" else None
        meta |= {"bos": entry.bos, "bos_id": bos}
    return records(measure_store(model, run, meta, Ts, bca_Ts, n_windows, None, method, progress, ids, bos)[0])


def _loaded(folder, name: str, L: int, Ts: Sequence[int], n_windows: int) -> tuple:
    """(model, held-out ids, the run's metadata) of a model folder, once its text holds every length's windows."""
    model = load_pretrained(folder)
    ids = held_out_ids(model)
    check_lengths(len(ids), Ts, n_windows)
    meta = {
        "encoding": encoding_of(model.config),
        "train_len": L,
        "seed": 0,
        "model": name,
        "architecture": model.config.model_type,
    }
    return model, ids, meta


def _planned(
    name_or_path,
    multiples: Sequence[float],
    bca_multiples: Sequence[float],
    n_windows: int,
    method: str,
    train_len: int | None,
) -> tuple[int, list[int], list[int]]:
    """(L, lengths, BCA lengths) in tokens, every argument checked and L read from the config (no weight
    read): a length named twice (``1,1``, or ``1,1.001`` at a small L) is refused here, not after the work."""
    check_choice("method", method, METHODS)
    for name, values in (("lengths", multiples), ("bca", bca_multiples)):
        if not all(
            isinstance(k, (int, float)) and not isinstance(k, bool) and math.isfinite(k) and 0 < k <= 64 for k in values
        ):
            raise ValueError(f"{name} must be multiples of L in (0, 64], got {list(values)!r}")
    if not multiples:
        raise ValueError("no lengths to measure")
    if train_len is not None and (isinstance(train_len, bool) or not isinstance(train_len, int) or train_len < 2):
        raise ValueError(f"train_len must be an integer >= 2, got {train_len!r}")
    if isinstance(n_windows, bool) or not isinstance(n_windows, int) or n_windows < 1:
        raise ValueError(f"n_windows must be a positive integer, got {n_windows!r}")
    config = load_config(name_or_path)
    L = train_len or _context_length(config)
    tokens = {}
    for name, values in (("lengths", multiples), ("BCA lengths", bca_multiples)):
        tokens[name] = [int(k * L) for k in values]
        for i, T in enumerate(tokens[name]):
            if T in tokens[name][:i]:
                first = values[tokens[name].index(T)]
                raise ValueError(
                    f"{name} {first:g} and {values[i]:g} are both {T} tokens at L = {L}: each length is measured once"
                )
    if not set(tokens["BCA lengths"]) <= set(tokens["lengths"]):
        raise ValueError(
            f"BCA lengths {sorted(tokens['BCA lengths'])} must be among the lengths {sorted(tokens['lengths'])}"
        )
    check_lengths(1 << 62, tokens["lengths"], n_windows)  # every length >= 2 tokens (the text is counted later)
    scores = 8 * config.num_attention_heads if method == "explicit" else 0  # (H, T, T) float32 scores, twice
    for T in tokens["lengths"]:  # before any weight is read; a BCA window also holds its (T, T) bool mask
        check_fits(config, T, pair_bytes=scores + 2 * (T in tokens["BCA lengths"]))
    return L, tokens["lengths"], tokens["BCA lengths"]


def _context_length(config: PretrainedConfig) -> int:
    L = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    if L is None:
        raise ValueError("the config names no context length (n_positions or max_position_embeddings); give train_len")
    if L < 2:
        raise ValueError(f"the config's context length is {L}: give train_len >= 2")
    return L


def save_reduced(
    path: Path,
    profiles: list[Profile],
    about: dict,
    per_head_up_to: int,
    window_values: dict | None = None,
    kept: Sequence[Profile] = (),
) -> None:
    """Write ``profiles`` to a store with heads averaged at every length above ``per_head_up_to``
    (:func:`store.average_heads`; mean-scores R needs only the head mean), as int16 codes
    (:func:`store.quantize`: every per-layer R within 1e-3 relative of the full profiles). ``kept``:
    profiles of other runs written as they are (int16 codes of decoded codes are the same codes)."""
    lengths = {p.eval_len for p in profiles if p.eval_len > per_head_up_to}
    reduced = average_heads(profiles, lengths) + list(kept)
    save_profiles(path, reduced, about, torch.int16, window_values=window_values)


BOS_FORMS = ("first", "none", "both")  # windows with the model's BOS first, without, or both (two runs)


def bos_runs(
    run: str, bos: str, tokenizer_bos: int | None, first_by_policy: bool = False
) -> list[tuple[str, int | None]]:
    """The (run name, BOS id or None) pairs that ``bos`` asks for: "both" measures the BOS-first form as
    ``run`` and the form without as ``run-no-bos``, on the same text windows. ``first_by_policy``: the
    model's policy puts BOS first (a registry entry's), so ``run`` names its BOS-first form and "none"
    alone is ``run-no-bos`` too, never ``run``."""
    check_choice("bos", bos, BOS_FORMS)
    if bos != "none" and tokenizer_bos is None:
        raise ValueError(f"{run}: --bos {bos} asks for a BOS token, but the tokenizer has none")
    return {
        "first": [(run, tokenizer_bos)],
        "none": [(f"{run}-no-bos" if first_by_policy else run, None)],
        "both": [(run, tokenizer_bos), (f"{run}-no-bos", None)],
    }[bos]


def work_file(store: Path, run: str, work: Path | None = None, weights: str | None = None) -> Path:
    """Where ``run``'s window sums go while ``store`` is measured: ``<work>/<store name>-<hash of the store's
    full path>.<run>[.<weights>].safetensors`` (default folder runs/pretrained-work/), so two stores of one
    name, two runs of one store, or two sets of weights measured under one name (``weights``: the hash of
    the files loaded) never share one."""
    from ..paths import RUNS

    digest = hashlib.sha256(str(Path(store).resolve()).encode()).hexdigest()[:8]
    name = f"{Path(store).stem}-{digest}.{run}" + (f".{weights}" if weights else "")
    return (Path(work) if work else RUNS / "pretrained-work") / f"{name}.safetensors"


def _adopt_unkeyed_work(store: Path, run: str, work: Path | None, weights: str) -> None:
    """A work file named before work files were named by their weights (``work_file`` without ``weights``)
    becomes ``weights``' work file where its settings name these weights (a registry model's were always
    there), so a measurement stopped before continues; one of other weights, of none, or unreadable, is
    left alone."""
    old, new = work_file(store, run, work), work_file(store, run, work, weights)
    if new.exists() or not old.is_file():
        return
    try:
        settings = _read_work(old)[0].get("settings", {})
    except ValueError:  # unreadable: not this measurement's to take over
        return
    if settings.get("weights") == weights:
        old.replace(new)


MEASURE_HF = "python -m attnres_helpers measure-hf"  # how a store's about names this command


def _exact(multiples: Sequence[float]) -> str:
    """Multiples of L as a recorded command writes them: each reads back as the same float (``:g`` where
    that is exact, e.g. 0.125 or 2, else the shortest exact form), so the command measures the same lengths."""
    return ",".join(f"{k:g}" if float(f"{k:g}") == k else repr(float(k)) for k in multiples)


def _check_store_path(store: str | Path, folder: Path, work: Path | None) -> Path:
    """``store`` as a path a store can be written to, beside the model folder, not the work folder; and
    ``work`` a folder outside the model folder and the model cache."""
    if str(store) == "":
        raise ValueError("the store path is empty; give a store file, e.g. name.safetensors")
    store = Path(store)
    if store.is_dir():
        raise ValueError(f"store {store} is a folder; give a store file, e.g. {store / 'name.safetensors'}")
    if store.exists():
        regular_file(store, "store")  # its runs are read before anything is measured: a named pipe would block
    if store.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"store {store} is inside the model folder {folder}; write it outside")
    if work is not None and Path(work).resolve() == store.resolve():
        raise ValueError(f"work folder {work} is the store itself; it names a folder for the window sums")
    if work is not None and Path(work).exists() and not Path(work).is_dir():
        raise ValueError(f"work folder {work} is a file; it names a folder for the window sums")
    if work is not None:
        from .. import paths

        # sums written into a verified converted folder would make its every later load fail
        for inside, where in ((folder, "the model folder"), (paths.CACHE, "the model cache")):
            if Path(work).resolve().is_relative_to(Path(inside).resolve()):
                raise ValueError(f"work folder {work} is inside {where} {inside}; give a --work outside it")
    return store


def _kept_runs(
    store: Path, runs: Sequence[str], policies: dict[str, str] | None = None, bos: str = ""
) -> tuple[list[Profile], dict, dict, bool]:
    """The profiles, window values and commands of ``store``'s runs other than ``runs``, and whether it
    holds one of ``runs`` (nothing for a new store); a store this command did not make is refused, and so
    is one holding a run of ``runs`` measured under another BOS policy than ``policies`` gives it ("first"
    or "none"; a run from before BOS was recorded was measured without; ``bos``: the --bos asked, for the
    message), so that a run's name keeps saying how it was measured."""
    from .. import configured_store
    from ..store import load_profiles, load_window_values

    if not store.exists():
        return [], {}, {}, False
    if configured_store.is_configured_store(store):
        raise ValueError(f"{store} is a store of another kind (a configurations store); give another --store")
    profiles, about = load_profiles(store)
    made_by = str(about.get("command", "unknown"))
    if not made_by.startswith(MEASURE_HF):
        raise ValueError(
            f"{store} is a store of another kind (made by `{made_by}`); "
            "measure-hf adds runs only to a store it made: give another --store"
        )
    for p in profiles:
        stored, asked = p.meta.get("bos") or "none", (policies or {}).get(p.run)
        if asked is not None and stored != asked:
            said = {"first": "with BOS first", "none": "with no BOS"}
            raise ValueError(
                f"{store} holds the run {p.run} measured {said.get(stored, f'with bos {stored!r}')}; --bos {bos} "
                "would replace it with another BOS policy under the same name: give the --bos it was measured "
                "with, or another --store"
            )
    kept = [p for p in profiles if p.run not in runs]
    values = {key: v for key, v in load_window_values(store).items() if key.split("/")[0] not in runs}
    commands = about.get("commands") or {p.run: made_by for p in profiles}
    replaced = len(kept) < len(profiles)
    return kept, values, {run: commands.get(run, made_by) for run in {p.run for p in kept}}, replaced


def measure_pretrained_store(
    name_or_path: str | Path,
    store: Path,
    multiples: Sequence[float],
    bca_multiples: Sequence[float] = (),
    n_windows: int = 8,
    method: str = "fft",
    train_len: int | None = None,
    work: Path | None = None,
    per_head_up_to: int = 2048,
    progress: bool = True,
    bos: str | None = None,
    report: Callable[[str], object] | None = None,
) -> Path:
    """:func:`measure_store` of a model into ``store`` (see :func:`save_reduced`), resumably through
    :func:`work_file`, holding the store's lock (:func:`files.exclusive`) from before the model is loaded
    until it is written. ``name_or_path``: a registry name (:mod:`.models`: its converted folder, verified,
    its context as L and its BOS policy) or a model folder. ``bos`` (:data:`BOS_FORMS`; default the
    registry's policy, "first" meaning "both" so that the form without BOS is reported beside it, and
    "none" for a folder) is recorded in every run's metadata. An existing store keeps its other runs (a
    store another command made is refused); ``report`` is given one line saying what was added or replaced.
    Every argument is checked, and the lock taken, before the model is loaded."""

    from . import fetch

    if bos is not None:
        check_choice("bos", bos, BOS_FORMS)
    entry, folder = fetch.resolve(name_or_path)
    if bos is None:
        bos = "both" if entry is not None and entry.bos == "first" else "none"
    if entry is not None:
        train_len = train_len or entry.context
    store = _check_store_path(store, folder, work)
    L, Ts, bca_Ts = _planned(folder, multiples, bca_multiples, n_windows, method, train_len)
    name = entry.name if entry is not None else folder.name
    first_by_policy = entry is not None and entry.bos == "first"
    runs = bos_runs(name, bos, load_tokenizer(folder).bos_token_id if bos != "none" else None, first_by_policy)
    policies = {run: "first" if bos_id is not None else "none" for run, bos_id in runs}
    # the key of the work files: what is loaded, hashed once (a registry folder was just verified against its
    # SHA256SUMS, whose hash is the same value; a user's folder has none, and its files are hashed)
    weights = sums_fingerprint(folder) if entry is not None else folder_fingerprint(folder)
    for run, _ in runs:
        if work_file(store, run, work, weights).exists():
            regular_file(work_file(store, run, work, weights), "work file")  # read before anything is measured
        if work_file(store, run, work, weights).resolve() == store.resolve():
            raise ValueError(
                f"work file {work_file(store, run, work, weights)} is the store itself; give another --work"
            )
    with exclusive(store):
        kept, window_values, commands, replaced = _kept_runs(store, [run for run, _ in runs], policies, bos)
        model, ids, common = _loaded(folder, name, L, Ts, n_windows)
        common.update(weights=weights, config={k: getattr(model.config, k, None) for k in CONFIG_KEYS})
        profiles = []
        for run, bos_id in runs:
            _adopt_unkeyed_work(store, run, work, weights)
            meta = {**common, "bos": "first" if bos_id is not None else "none", "bos_id": bos_id}
            got, values = measure_store(
                model,
                run,
                meta,
                Ts,
                bca_Ts,
                n_windows,
                work_file(store, run, work, weights),
                method,
                progress,
                ids,
                bos_id,
            )
            profiles += got
            window_values.update(values)
        command = (
            f"{MEASURE_HF} --model {shlex.quote(str(name_or_path))} --train-len {L} --lengths {_exact(multiples)}"
            + (f" --bca {_exact(bca_multiples)}" if bca_multiples else "")
            + f" --windows {n_windows} --method {method} --store {shlex.quote(str(store))}"
            + f" --per-head-up-to {per_head_up_to} --bos {bos}"
        )
        about = {
            "command": command,
            "lengths": Ts,
            "bca_lengths": bca_Ts,
            "n_windows": n_windows,
            "method": method,
            "held_out_tokens": len(ids),
            "per_head_up_to": per_head_up_to,
            "bos": bos,
            "dtype": "int16 fixed point per row (store.quantize)",
            "commands": {**commands, **{run: command for run, _ in runs}},  # what made each run of the store
        }
        save_reduced(store, profiles, about, per_head_up_to, window_values, kept)
    if report is not None:
        others = sorted(commands)
        report(
            f"{store}: {'replaced' if replaced else 'added'} {', '.join(run for run, _ in runs)}; kept {len(others)} "
            f"other run{'' if len(others) == 1 else 's'}" + (f" ({', '.join(others)})" if others else "")
        )
    return store
