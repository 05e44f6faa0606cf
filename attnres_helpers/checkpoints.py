"""Loading a trained model: the one loader, verified, for every checkpoint this project trains.

A finished run folder holds ``config.json`` (model config, training settings, results),
``model.safetensors`` (fp16 weights) and ``SHA256SUMS`` (written by :func:`attnres_helpers.train.train`);
a shipped root (``data/checkpoints/``, ``data/hf_checkpoints/``) has one SHA256SUMS for all its runs.
:func:`load_checkpoint` checks, before any weight tensor is allocated:

1. the hashes (streamed, bounded; :func:`files.verify_sha256sums`) of the run folder, or of the root
   above it: a missing, changed or unlisted file, or no SHA256SUMS at all, is refused with its name;
2. the config against the weights, from the safetensors header alone: the model is built on PyTorch's
   ``meta`` device (no memory) and every tensor's name and shape is compared, so a relabelled or
   inflated ``config.json`` is refused before anything is allocated.

It reads JSON and safetensors only: nothing is ever unpickled. A finished run is trusted by its own
SHA256SUMS alone (:func:`verify_finished`), and a root of runs is sealed (:func:`seal_root`) only over
runs that match theirs: nothing is ever re-sealed over files as they happen to be.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from .files import SUMS_FILE, verify_sha256sums, write_text_atomic
from .files import sha256sums as files_sha256sums
from .model import ModelConfig
from .paths import CHECKPOINTS, made_by

if TYPE_CHECKING:
    from .hf import HFConfig

MODEL_FILE, CONFIG_JSON = "model.safetensors", "config.json"


def read_json(path: Path) -> dict:
    """A checkpoint's JSON object; an error naming the file if it is missing, invalid or not an object."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} is missing")
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"checkpoint file {path} is not valid JSON ({err})") from err
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint file {path} must hold a JSON object")
    return obj


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (no pickle); an error naming it if it is missing or corrupt."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} is missing")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"checkpoint file {path} is corrupt or truncated ({err})") from err


def build_model(cfg: ModelConfig | HFConfig) -> torch.nn.Module:
    """The model of a config (``cfg.build()``): our Transformer for a :class:`ModelConfig`, a
    `transformers` architecture (:class:`attnres_helpers.hf.HFCausalLM`) for an ``hf.HFConfig``."""
    if not hasattr(cfg, "build"):
        raise ValueError(f"cfg must be a ModelConfig or an hf.HFConfig, got {type(cfg).__name__}")
    return cfg.build()


def model_config(meta: dict, path: Path) -> ModelConfig | HFConfig:
    """The ModelConfig (or hf.HFConfig) recorded in a config.json; an error naming the file if it is bad."""
    try:
        if isinstance(meta["model"], dict) and "architecture" in meta["model"]:
            from .hf import HFConfig

            return HFConfig.from_dict(meta["model"])
        return ModelConfig.from_dict(meta["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"checkpoint file {path} has a bad model config: {err}") from err


def expected_shapes(cfg: ModelConfig | HFConfig) -> dict[str, tuple[int, ...]]:
    """Every weight's name and shape for ``cfg``, from a model built on the meta device (no memory)."""
    with torch.device("meta"):
        model = build_model(cfg)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def check_weights_header(weights_path: Path, cfg: ModelConfig | HFConfig, config_path: Path) -> None:
    """Compare the config with the weights' names and shapes from the safetensors header alone."""
    if not weights_path.is_file():
        raise FileNotFoundError(f"checkpoint file {weights_path} is missing")
    try:
        with safe_open(weights_path, framework="pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"checkpoint file {weights_path} is corrupt or truncated ({err})") from err
    expected = expected_shapes(cfg)
    if shapes != expected:
        differ = sorted(name for name in set(shapes) | set(expected) if shapes.get(name) != expected.get(name))
        raise ValueError(
            f"checkpoint file {config_path} does not match the weights in {weights_path}: the config asks "
            f"for {cfg.n_layer} layers of width {cfg.d_model}; {len(differ)} tensors differ in name or "
            f"shape, e.g. {differ[0]!r}: config {expected.get(differ[0])}, weights {shapes.get(differ[0])}"
        )


def load_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Copy tensors into the model after checking names, shapes and finiteness (errors name ``path``)."""
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint file {path} does not match the model config: "
            f"missing tensors {missing}, unexpected tensors {unexpected}"
        )
    for name, ref in expected.items():
        if tensors[name].shape != ref.shape:
            raise ValueError(
                f"checkpoint file {path}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                f"the model config needs {tuple(ref.shape)}"
            )
        if not torch.isfinite(tensors[name]).all():
            raise ValueError(f"checkpoint file {path}: tensor {name} has non-finite values")
    model.load_state_dict({name: t.float() for name, t in tensors.items()})


def verify_run(run_dir: Path, fix: str) -> None:
    """Verify ``run_dir`` by its own SHA256SUMS, else by the SHA256SUMS of the root above it (which must
    list the run's files); no SHA256SUMS at all is refused."""
    if (run_dir / SUMS_FILE).is_file():
        verify_sha256sums(run_dir, fix)
    elif (run_dir.parent / SUMS_FILE).is_file():
        listed = (run_dir.parent / SUMS_FILE).read_text(errors="replace")
        if f"  {run_dir.name}/{MODEL_FILE}" not in listed:
            raise ValueError(
                f"{run_dir.parent / SUMS_FILE} does not list {run_dir.name}/{MODEL_FILE}: unverified "
                f"checkpoint refused; regenerate with `{fix}`"
            )
        verify_sha256sums(run_dir.parent, fix)
    else:
        raise ValueError(
            f"checkpoint {run_dir} has no {SUMS_FILE} (neither in it nor above it): it cannot be "
            f"verified and is refused; regenerate it with `{fix}`"
        )


RETRAIN = "retrain it from scratch: delete the run folder and run its command again (train: --no-resume)"


def verify_finished(run_dir: Path) -> None:
    """A finished run against its own SHA256SUMS, the hash of record of what its training wrote (never a
    root's): no SHA256SUMS, or a file changed, missing or unlisted, is refused in one line naming the run and
    saying how to retrain it; nothing here (nor anywhere) re-seals it."""
    run_dir = Path(run_dir)
    if not (run_dir / SUMS_FILE).is_file():
        raise ValueError(f"finished run {run_dir} has no {SUMS_FILE}: refused, never re-sealed; {RETRAIN}")
    try:
        verify_sha256sums(run_dir, RETRAIN)
    except ValueError as err:
        raise ValueError(
            f"finished run {run_dir} does not match its {SUMS_FILE} (a file changed, missing or unlisted): "
            f"refused, never re-sealed; {RETRAIN}"
        ) from err


def regenerate_command(run_dir: Path) -> str:
    """The command that makes ``run_dir`` again, for error messages (:func:`paths.made_by`)."""
    return made_by(run_dir)[0]


def load_checkpoint(path: str | Path, fix: str | None = None) -> torch.nn.Module:
    """The model in ``path`` (a run folder, or its model.safetensors), fp32 on CPU, eval mode, after
    :func:`verify_run` and :func:`check_weights_header`; ``fix`` is the command named in its errors
    (default: :func:`regenerate_command`)."""
    path = Path(path)
    run_dir = path.parent if path.is_file() else path
    fix = fix or regenerate_command(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"checkpoint folder {run_dir} does not exist; make it with `{fix}`")
    verify_run(run_dir, fix)
    config_path, weights_path = run_dir / CONFIG_JSON, run_dir / MODEL_FILE
    cfg = model_config(read_json(config_path), config_path)
    check_weights_header(weights_path, cfg, config_path)
    model = build_model(cfg)
    load_weights(model, read_tensors(weights_path), weights_path)
    return model.eval()


# ------------------------------------------------------------------------------------------ roots of runs


def sha256sums(root: Path = CHECKPOINTS) -> str:
    """``sha256  relative/path`` lines for every file under ``root`` but SHA256SUMS, sorted; never a run's
    resume state (``state.json``, ``state-*.safetensors``) or a killed write's temporary (``.*.tmp-*``): a
    folder holding them is not a finished set of checkpoints, and the verifier then refuses them as unlisted."""
    text = files_sha256sums(root)
    return "".join(line for line in text.splitlines(keepends=True) if not _transient(line.split("  ", 1)[1].strip()))


def _transient(name: str) -> bool:
    base = Path(name).name
    return (
        base == "state.json"
        or (base.startswith("state-") and base.endswith(".safetensors"))
        or (base.startswith(".") and ".tmp-" in base)
    )


def verify_checkpoints(root: Path = CHECKPOINTS, fix: str | None = None) -> None:
    """Check every file under ``root`` against ``root/SHA256SUMS`` (:func:`files.verify_sha256sums`): a
    file that is missing, unlisted or changed raises a ValueError naming it (a tampered config.json or
    weight byte is caught before any model is built); ``fix`` is the command that regenerates ``root``
    (default: by the folder, :func:`checkpoints.regenerate_command`: ``hf-train`` for data/hf_checkpoints/)."""
    verify_sha256sums(root, fix or regenerate_command(Path(root)))


def seal_root(root: Path) -> None:
    """Write ``root/SHA256SUMS`` (where it changes) over the run folders under ``root``, each first
    verified against its own seal (:func:`checkpoints.verify_finished`): a root is sealed only over
    weights that their runs' hashes of record vouch for, never over files as they happen to be."""
    root = Path(root)
    text = sha256sums(root)
    for name in sorted({line.split("  ", 1)[1].split("/", 1)[0] for line in text.splitlines()}):
        if not (root / name).is_dir():
            raise ValueError(f"{root / name} is not a run folder: refused (a root of checkpoints holds runs only)")
        verify_finished(root / name)
    sums = root / SUMS_FILE
    if not sums.is_file() or sums.read_text(errors="replace") != text:
        write_text_atomic(sums, text)
