"""Measure one pretrained RoPE model under every training-free configuration, window by window (plan v4).

For each configuration (:mod:`.configurations`), length T in {L, 2L} and window, one forward pass under
:func:`.configurations.applied` (attention by query blocks, :mod:`.configured_attention`) gives:

- every layer's ŝ (Eq. 11, head mean) of the merged scores the softmax sees, under the configuration's
  mask and positions, and each query's score on key 0 (head mean), for ŝ without the first-token sink;
- every layer's attention entropy per query (head mean, nats);
- the per-position NLL of the window's text, and which targets lie inside a written passkey sentence;
- the passkey trials written into that window (:func:`attnres_helpers.passkey.wanted_v4`), scored
  teacher-forced.

Each (configuration, T, window) is one file under the work folder (float32, atomic), so a stopped run
resumes where it stopped and never mixes settings: a file written with other settings is refused with
its name. :func:`attnres_helpers.configured_store.build` turns the files into the store. Inside L,
configurations marked ``same_as_trained_up_to_L`` are the model as trained (checked by the tests) and
are measured once, as ``as-trained``.

    python -m attnres_helpers measure NAME|FOLDER --configuration NAME,... [--windows 8] [--store PATH]
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from .. import passkey
from ..configured_store import PER_WINDOW_SETTINGS, read_window_file
from ..data import eval_windows, load_corpus
from ..measure import WindowFiles, to_do, window_loop
from . import configured_attention
from .configurations import CONFIGURATIONS, Configuration, applied, check_applies
from .pretrained import window_pass

if TYPE_CHECKING:
    from transformers import PreTrainedModel

N_WINDOWS = 8
TRIALS_PER_DISTANCE = 2
PLAN = "v4"


def corpus_ids(tokenizer) -> torch.Tensor:
    """The whole corpus (both splits: SmolLM2 never saw our split) as the tokenizer's ids (N,) int64."""
    return torch.tensor(tokenizer(load_corpus().decode("utf-8"))["input_ids"], dtype=torch.long)


def plan_jobs(train_len: int, configurations: Sequence[str], n_windows: int) -> list[tuple[str, int, int]]:
    """(configuration, T, window) in the order they run, window by window: each window at L (where
    configurations that equal the model as trained are measured once, as as-trained), then at 2L under
    every configuration, so a stopped run leaves every configuration with as many windows at both lengths."""
    unknown = [c for c in configurations if c not in CONFIGURATIONS]
    if unknown:
        raise ValueError(f"unknown configurations {', '.join(unknown)}; known: {', '.join(CONFIGURATIONS)}")
    at_L = [c for c in configurations if not CONFIGURATIONS[c].same_as_trained_up_to_L]
    if any(CONFIGURATIONS[c].same_as_trained_up_to_L for c in configurations) and "as-trained" not in at_L:
        at_L.insert(0, "as-trained")
    return [
        (c, T, w)
        for w in range(n_windows)
        for T, names in ((train_len, at_L), (2 * train_len, configurations))
        for c in names
    ]


def window_layout(ids: torch.Tensor, T: int, train_len: int, window: int, n_windows: int, tokenize) -> passkey.Layout:
    """Window ``window`` of ``n_windows`` evenly spread windows of T+1 tokens, with plan v4's passkey
    trials (drawn by ``default_rng(T + window)``: the same for every configuration)."""
    text = eval_windows(ids, T, n_windows)[window]
    wanted = passkey.wanted_v4(train_len, T, TRIALS_PER_DISTANCE)
    return passkey.layout(text, tokenize, (), seed=T + window, wanted=wanted, split=train_len)


@torch.no_grad()
def measure_window(
    model: PreTrainedModel, layout: passkey.Layout, configuration: Configuration, train_len: int
) -> dict[str, torch.Tensor]:
    """One forward pass of ``layout.tokens`` under ``configuration`` (the capture, pass and NLL of every
    `transformers` measurement, :func:`.pretrained.window_pass`): s_hat and key0 (layers, 1, T)
    float32 (head means), entropy (layers, T) float32 (head mean), nll (T,) float32, the passkey scores
    (n,) and ``inserted`` (T,), on the CPU wherever the model is."""
    s_hats, key0s, entropies = [], [], []

    def consume(layer: configured_attention.ConfiguredLayer) -> None:
        s_hats.append(configured_attention.configured_s_hat(layer).mean(0, keepdim=True).float())
        key0s.append(configured_attention.configured_key0(layer).mean(0, keepdim=True).float())
        entropies.append(layer.entropy.mean((0, 1)).float())

    head = model.get_output_embeddings()
    device = head.weight.device
    with applied(model, configuration, train_len):
        hidden, nll = window_pass(model, layout.tokens.to(device), consume, configured_attention.capturing)
    hidden, nll = hidden[0], nll.float()
    log_probs = lambda pos: torch.log_softmax(head(hidden[pos.to(device)]).float(), -1).cpu()  # noqa: E731
    scores = passkey.score(log_probs, layout.tokens, layout.trials)
    return {
        "s_hat": torch.stack(s_hats).cpu(),
        "key0": torch.stack(key0s).cpu(),
        "entropy": torch.stack(entropies).cpu(),
        "nll": nll,
        "inserted": layout.inserted,
        "passkey_logprob": scores.logprob.float(),
        "passkey_correct": scores.correct,
    }


def job_settings(
    configuration: Configuration,
    T: int,
    train_len: int,
    window: int,
    n_windows: int,
    model_id: str,
    theta: float,
    head_dim: int,
) -> dict:
    """Everything that determines a window file's numbers: a file written with other settings is refused."""
    remap = configuration.remap_for(train_len)
    return {
        "plan": PLAN,
        "configuration": configuration.name,
        "kind": configuration.kind,
        "rope": configuration.rope_for(theta, train_len, head_dim),
        "remap": None if remap is None else remap.as_dict(),
        "mask": configuration.mask_for(train_len).as_dict(),
        "T": T,
        "train_len": train_len,
        "window": window,
        "n_windows": n_windows,
        "model": model_id,
        "trials": passkey.wanted_v4(train_len, T, TRIALS_PER_DISTANCE),
        "key_sentence": passkey.KEY_SENTENCE,
        "query_sentence": passkey.QUERY_SENTENCE,
    }


def job_path(folder: Path, name: str, T: int, window: int) -> Path:
    return Path(folder) / name / str(T) / f"window-{window}.safetensors"


def _refuse(path: Path, differ: list[str], stored: dict) -> None:
    """A window file measured with other settings (``differ``, :func:`files.differing_settings`): an error
    naming the folder to clear: the work folder where a setting every window shares differs (any but
    :data:`configured_store.PER_WINDOW_SETTINGS`: ``--windows``, the model, L, the plan, the passkey
    sentences), else the configuration's."""
    work, name = path.parent.parent.parent, path.parent.parent.name
    if any(k not in PER_WINDOW_SETTINGS for k in differ):  # every window file under work shares them
        n = stored.get("n_windows")
        keep = f", or run with --windows {n} to go on with them" if differ == ["n_windows"] else ""
        raise ValueError(
            f"the window files under {work} were measured with other settings ({', '.join(differ)}; "
            f"{path.relative_to(work)} among them): clear {work} to measure again{keep}"
        )
    raise ValueError(
        f"window file {path} was measured with other settings ({', '.join(differ)}); "
        f"clear {path.parent.parent} to measure {name} again"
    )


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
    share: tuple[int, int] = (0, 1),
) -> int:
    """Measure every job of :func:`plan_jobs` not yet in ``folder``; returns how many were measured.
    Every configuration is checked against the model, every setting against the files, and every
    window laid out, before the first forward pass. ``share`` (rank, world): this process measures
    the jobs of its rank not yet done (:func:`measure.to_do`; torchrun's ranks; each job is its own file)."""
    jobs = plan_jobs(train_len, configurations, n_windows)
    for name in {name for name, _, _ in jobs}:
        check_applies(model, CONFIGURATIONS[name])
    ids = corpus_ids(tokenizer)
    tokenize = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    layouts = {}
    for T in sorted({T for _, T, _ in jobs}):
        if len(ids) // (T + 1) < n_windows:
            raise ValueError(f"the corpus has {len(ids)} tokens: fewer than {n_windows} windows of {T + 1}")
        for w in range(n_windows):
            layouts[(T, w)] = window_layout(ids, T, train_len, w, n_windows, tokenize)
    theta = model.config.rope_parameters["rope_theta"]
    head_dim = model.base_model.rotary_emb.inv_freq.numel() * 2
    settings = [
        job_settings(CONFIGURATIONS[name], T, train_len, w, n_windows, model_id, theta, head_dim) for name, T, w in jobs
    ]
    kept = WindowFiles(
        [job_path(folder, name, T, w) for name, T, w in jobs],
        settings,
        [{"trials": [t.__dict__ for t in layouts[(T, w)].trials]} for _, T, w in jobs],
        lambda path: read_window_file(path)[0],
        _refuse,
    )
    todo = to_do(len(jobs), kept, share)
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="configurations", disable=not progress)

    def measure(batch: list) -> dict[str, torch.Tensor]:
        name, T, w = batch[0]
        return measure_window(model, layouts[(T, w)], CONFIGURATIONS[name], train_len)

    def after(batch: range) -> None:
        name, T, w = jobs[batch.start]
        if log is not None:
            print(f"{name} T={T} window {w}: {bar.format_dict['elapsed']:.0f} s elapsed", file=log, flush=True)

    window_loop(jobs, measure, kept, share=share, bar=bar, after=after)
    bar.close()
    return len(todo)


def measure_and_build(
    model: str,
    configurations: Sequence[str] | None = None,
    n_windows: int = N_WINDOWS,
    work: str | Path | None = None,
    store: str | Path | None = None,
    log: str | Path | None = None,
    progress: bool = True,
    build_only: bool = False,
    device: str = "cpu",
) -> Path:
    """The ``configurations`` command: ``model`` (a registry name, verified, or a `transformers` folder)
    under ``configurations`` (default: all), measured into ``work`` (default
    ``runs/configurations-v4/<model>``) unless ``build_only``, then the store built from every finished
    window (default SmolLM2's shipped v4 store, else ``<work>/store.safetensors``). The store's kind and
    every configuration against the model's config are checked before any weight is read. ``device``: cpu,
    or cuda[:N] where torch sees a GPU (checked first). Under torchrun each rank measures its share of the
    jobs and rank 0 alone builds the store, after a barrier."""
    from ..configured_store import build, is_configured_store
    from ..files import exclusive, folder_fingerprint, sums_fingerprint
    from ..paths import CONFIGURATIONS_RUNS, CONFIGURATIONS_V4_STORE
    from ..torchrun import check_device, distributed_rank, process_group
    from . import fetch
    from .configurations import check_config
    from .folders import load_config, load_pretrained
    from .memory import check_fits
    from .models import SMOLLM2
    from .pretrained import load_tokenizer

    check_device(device)
    chosen = list(configurations or CONFIGURATIONS)
    unknown = [c for c in chosen if c not in CONFIGURATIONS]
    if unknown:
        raise ValueError(f"unknown configurations {', '.join(unknown)}; known: {', '.join(CONFIGURATIONS)}")
    entry, folder = fetch.resolve(model)
    name = entry.name if entry is not None else folder.name
    default = CONFIGURATIONS_V4_STORE if entry is SMOLLM2 else CONFIGURATIONS_RUNS / name / "store.safetensors"
    store = Path(store) if store else default
    if store.exists() and not is_configured_store(store):
        raise ValueError(f"{store} is not a configurations store; give another --store (nothing was written)")
    work = Path(work) if work else CONFIGURATIONS_RUNS / name
    if not build_only:
        config = load_config(folder)
        for c in chosen:
            check_config(config, CONFIGURATIONS[c])  # one line, before any weight is read
        train_len = entry.context if entry is not None else config.max_position_embeddings
        check_fits(config, 2 * train_len, device)  # the longest window, before any weight is read
        ranked = distributed_rank()  # under torchrun: each rank its share of the jobs, rank 0 the one writer
        rank, world = (0, 1) if ranked is None else ranked[:2]
        with (  # the work folder's lock and the log before the model is loaded
            exclusive(work / f"measuring-{rank}of{world}"),
            open(log, "a") if log else contextlib.nullcontext() as out,
            process_group() if ranked else contextlib.nullcontext(),
        ):
            if entry is not None:
                loaded, model_id = fetch.load(entry), f"{entry.title}@{sums_fingerprint(folder)}"
            else:
                loaded, model_id = load_pretrained(folder), f"{folder.name}@{folder_fingerprint(folder)}"
            loaded, tokenizer = loaded.to(device), load_tokenizer(folder)
            measure_configurations(
                loaded, tokenizer, work, model_id, train_len, chosen, n_windows, out, progress, (rank, world)
            )
            if ranked:
                import torch.distributed as dist

                dist.barrier()
        if rank != 0:
            return store
    known = {
        c.name: {"label": c.label, "kind": c.kind, "same_as_trained_up_to_L": c.same_as_trained_up_to_L}
        for c in CONFIGURATIONS.values()
    }
    return build(work, store, known)
