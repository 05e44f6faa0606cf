"""A Hugging Face model folder, checked and loaded: the one loader of every `transformers` folder here.

Every config is read bounded (:func:`read_config`); a folder that names code of its own (``auto_map``) is
refused; the weights are safetensors only, loaded offline, and a config that does not match them (a
weight the model needs missing, one in the folder left unused, or another shape, from `transformers`'
loading info) is refused in one line naming the folder, as is any failure of `transformers` itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import paths
from ..files import remove_dead_temporaries

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "tokenizer_config.json",
)


def load_tokenizer(folder: str | Path):
    """A model folder's tokenizer, offline, never running code of the folder's own (``auto_map`` refused);
    a folder with none of :data:`TOKENIZER_FILES`, or one `transformers` cannot load, is one line naming it."""
    from transformers import AutoTokenizer

    refuse_custom_code(Path(folder))
    if Path(folder).is_dir() and not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"model folder {folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
            "copy the model's tokenizer files into it"
        )
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # transformers' own errors, of any kind and length: one line
        raise ValueError(f"{folder}: cannot load its tokenizer ({type(err).__name__}: {first_line(err)})") from None


CODE_FILES = ("config.json", "tokenizer_config.json")  # where a folder can name code of its own (auto_map)


def refuse_custom_code(folder: Path) -> None:
    """A one-line error if ``folder``'s config or tokenizer config names code of its own (``auto_map``):
    this project never runs a model folder's code."""
    for name in CODE_FILES:
        path = Path(folder) / name
        if path.is_file() and "auto_map" in read_config(path):
            raise ValueError(
                f"{path} names code of the folder's own (auto_map); this project never runs a model folder's code"
            )


MAX_CONFIG_BYTES = 1 << 22  # 4 MiB: far past any real config.json or tokenizer_config.json


def read_config(path: Path) -> dict:
    """A model folder's JSON object (config.json, tokenizer_config.json), never read past
    :data:`MAX_CONFIG_BYTES`; one line naming the file if it is larger, not JSON or not an object."""
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is {path.stat().st_size} bytes, larger than any config (4 MiB at most)")
    try:
        keys = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(keys, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return keys


def sweep_cache(cache: Path) -> None:
    """Remove what dead processes left in the model cache and in each model's downloads folder
    (:func:`files.remove_dead_temporaries`: a killed conversion's 538 MB folder, a killed download's wheel),
    a live process's kept: run by every start that touches the cache (``fetch.verify``, so every load,
    measurement and fetch of a registry model, and :func:`local_folder` for a folder in the cache), not
    only by a conversion."""
    remove_dead_temporaries(cache)
    downloads = Path(cache) / "downloads"
    if downloads.is_dir():
        for folder in downloads.iterdir():
            if folder.is_dir() and not folder.is_symlink():
                remove_dead_temporaries(folder)


def local_folder(name_or_path: str | Path) -> Path | None:
    """A local folder for anything that looks like a path (an error if it does not exist); None for a hub name."""
    text = str(name_or_path)
    looks_local = (
        isinstance(name_or_path, Path)
        or text.startswith((".", "/", "~"))
        or Path(text).exists()
        or text.count("/") != 1
        or Path(text).parent.is_dir()
    )  # "runs/x" with a local runs/: a path
    if not looks_local:
        return None
    folder = Path(text).expanduser()
    if folder.resolve().parent == paths.CACHE.resolve():  # a converted model named by its path
        sweep_cache(paths.CACHE)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    config = folder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"model folder {folder} has no config.json")
    keys = read_config(config)
    if "model" in keys and "train" in keys:
        raise ValueError(_own_format(folder, keys))
    for name in SIZE_KEYS:
        value = keys.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{config}: {name} must be a positive integer, got {value!r}")
    return folder


SIZE_KEYS = (
    "num_attention_heads",
    "n_head",
    "num_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "n_layer",
    "hidden_size",
    "n_embd",
    "head_dim",
    "vocab_size",
)  # a config's sizes, checked before any model is built


def _own_format(folder: Path, keys: dict) -> str:
    """Where a checkpoint folder in this project's own format is measured instead."""
    from ..paths import ROOT, made_by

    command, store = made_by(folder)
    store = store.relative_to(ROOT) if store.is_relative_to(ROOT) else store
    return (
        f"{folder} is a checkpoint in this project's own format, not a transformers folder: its measurements are "
        f"read by `attnres results {store}` and made by `{command}`; in Python, "
        "load it with attnres_helpers.checkpoints.load_checkpoint"
    )


def _source(name_or_path: str | Path, hub_timeout_s: float) -> tuple[str, bool]:
    """(what transformers loads, whether it is a local folder): a folder checked (:func:`local_folder`,
    no code of its own), or a hub name tried once."""
    folder = local_folder(name_or_path)
    if folder is None:
        _check_hub(str(name_or_path), hub_timeout_s)
        return str(name_or_path), False
    refuse_custom_code(folder)
    return str(folder), True


def _from_pretrained(auto, source: str, local: bool, **kwargs):
    """``auto.from_pretrained`` offline for a folder, never running its code; any failure one line."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a verified local load takes seconds: no bar in a notebook
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # a failed load is our one line, not transformers' load report too
    try:
        return auto.from_pretrained(source, local_files_only=local, trust_remote_code=False, **kwargs)
    except Exception as err:  # transformers' own errors, whatever their kind (a bad config, bad weights): one line
        raise ValueError(
            f"{source}: cannot load a safetensors causal LM ({type(err).__name__}: {first_line(err)})"
        ) from None
    finally:
        transformers_logging.set_verbosity(verbosity)


def load_config(name_or_path: str | Path, hub_timeout_s: float = 5.0) -> PretrainedConfig:
    """The config of :func:`load_pretrained`'s model, checked as it checks it, without reading a weight."""
    from transformers import AutoConfig

    return _from_pretrained(AutoConfig, *_source(name_or_path, hub_timeout_s))


def load_pretrained(name_or_path: str | Path, hub_timeout_s: float = 5.0) -> PreTrainedModel:
    """A `transformers` causal LM from a local folder (offline, safetensors weights only) or a hub name
    (tried once, failing within ``hub_timeout_s`` offline); every failure a one-line error, a config that
    does not match the weights (a weight missing, unused or of another shape) included."""
    from transformers import AutoModelForCausalLM

    source, local = _source(name_or_path, hub_timeout_s)
    model, info = _from_pretrained(
        AutoModelForCausalLM, source, local, use_safetensors=True, dtype=torch.float32, output_loading_info=True
    )
    unmatched = [
        f"{len(names)} weights {what}, e.g. {sorted(names)[0]!r}"
        for names, what in (
            (info["missing_keys"], "it needs are missing"),
            (info["unexpected_keys"], "in the folder are unused"),
            (info["mismatched_keys"], "differ in shape"),
        )
        if names
    ]  # a config of fewer layers than the weights would be a truncated model, of more a random layer
    if unmatched:
        raise ValueError(f"{source}: config.json does not match the weights ({'; '.join(unmatched)}); refused")
    n_heads = getattr(model.config, "num_attention_heads", None) or getattr(model.config, "n_head", None)
    if not n_heads:
        raise ValueError(f"{source}: the config has no attention heads")
    return model


def first_line(err: Exception) -> str:
    """The first line of an error's message, with the next one where the first only introduces it."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if "ignore_mismatched_sizes" in str(err):  # its details are in a load report we do not print
        return "the weights' shapes do not match config.json"
    if not lines:
        return type(err).__name__
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def _check_hub(name: str, timeout_s: float) -> None:
    """One quick look-up of ``name`` on the hub: a clear error within ``timeout_s`` when offline."""
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout_s).close()
    except OSError:
        raise ValueError(
            f"{name!r} is not a local folder and the Hugging Face hub cannot be reached "
            "(no network); give the path of a downloaded model folder"
        ) from None
