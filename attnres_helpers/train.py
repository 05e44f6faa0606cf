"""Train a byte-level Transformer on the shipped corpus, with atomic checkpoints and exact resume.

Optimiser as in the paper's setup (Sun et al. 2022, §4.1): Adam with β = (0.9, 0.98), here AdamW with
weight decay on matrices only; linear warmup then cosine decay to MIN_LR_RATIO·lr; gradient clipping.

Files in ``out_dir``
  - while training: ``state.json`` (step, settings, loss log, the name of the tensor file) and
    ``state-<step>.safetensors`` (fp32 weights, AdamW moments and step counts, torch's CPU RNG state).
    Each file is written to a temporary name and ``os.replace``d; state.json is replaced last and names
    its tensor file, so it always points at a complete checkpoint. Nothing is ever pickled.
  - when done (the resume state is then deleted): ``model.safetensors`` (fp16 weights) and
    ``config.json`` (model config, training settings, final train/validation loss, tokens/s, wall time).

Batches depend only on (seed, step) (``batch_generator``), so a run interrupted and resumed from its
last checkpoint ends bit-identical on CPU to an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from .data import eval_windows, get_batch, load_splits
from .files import atomic_write
from .model import ModelConfig, Transformer

BETAS = (0.9, 0.98)
GRAD_CLIP = 1.0
MIN_LR_RATIO = 0.1  # the cosine decays to lr * MIN_LR_RATIO
EVAL_WINDOWS = 128  # held-out windows of train_len for the final train/validation loss
STATE_JSON, MODEL_FILE, CONFIG_JSON = "state.json", "model.safetensors", "config.json"


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup over `warmup` steps to `lr`, then cosine decay to MIN_LR_RATIO·lr at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)  # 0 -> 1
    return lr * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_generator(seed: int, step: int) -> torch.Generator:
    """The generator that draws the batch of `step`: a pure function of (seed, step), so resume is exact."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (embedding, linear weights), none on biases and LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS, foreach=False)


@torch.no_grad()
def evaluate_loss(model: Transformer, tokens: torch.Tensor, max_windows: int = EVAL_WINDOWS,
                  batch_size: int = 32) -> float:
    """Mean next-byte cross-entropy (nats) over deterministic windows of train_len (data.eval_windows)."""
    device = next(model.parameters()).device
    windows = eval_windows(tokens, model.cfg.train_len, max_windows)  # (W, L+1)
    was_training = model.training
    model.eval()
    total = 0.0
    for batch in windows.split(batch_size):
        batch = batch.to(device)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        total += loss.item() * len(batch)
    model.train(was_training)
    return total / len(windows)


# ---------------------------------------------------------------- atomic files, checkpoints, loading

def _write_json(path: Path, obj: dict) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=1) + "\n"))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} is missing")
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"checkpoint file {path} is not valid JSON ({err})") from err
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint file {path} must hold a JSON object")
    return obj


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} is missing")
    try:
        return load_file(path)  # safetensors: no pickle
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"checkpoint file {path} is corrupt or truncated ({err})") from err


def build_model(cfg) -> torch.nn.Module:
    """The model of a config: our :class:`Transformer` for a :class:`ModelConfig`, a `transformers`
    architecture (:class:`attnres_helpers.hf.HFCausalLM`) for an ``hf.HFConfig``."""
    if isinstance(cfg, ModelConfig):
        return Transformer(cfg)
    from .hf import HFCausalLM, HFConfig  # transformers is imported only when one is asked for

    if isinstance(cfg, HFConfig):
        return HFCausalLM(cfg)
    raise ValueError(f"cfg must be a ModelConfig or an hf.HFConfig, got {type(cfg).__name__}")


def _is_config(cfg) -> bool:
    hf = sys.modules.get("attnres_helpers.hf")  # an HFConfig exists only once hf was imported
    return isinstance(cfg, ModelConfig) or (hf is not None and isinstance(cfg, hf.HFConfig))


def _model_config(meta: dict, path: Path):
    try:
        if isinstance(meta["model"], dict) and "architecture" in meta["model"]:
            from .hf import HFConfig

            return HFConfig.from_dict(meta["model"])
        return ModelConfig.from_dict(meta["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"checkpoint file {path} has a bad model config: {err}") from err


def _load_weights(model: Transformer, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Copy tensors into the model after checking names, shapes and finiteness (errors name `path`)."""
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"checkpoint file {path} does not match the model config: "
                         f"missing tensors {missing}, unexpected tensors {unexpected}")
    for name, ref in expected.items():
        if tensors[name].shape != ref.shape:
            raise ValueError(f"checkpoint file {path}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                             f"the model config needs {tuple(ref.shape)}")
        if not torch.isfinite(tensors[name]).all():
            raise ValueError(f"checkpoint file {path}: tensor {name} has non-finite values")
    model.load_state_dict({name: t.float() for name, t in tensors.items()})


def load_checkpoint(path: str | Path) -> torch.nn.Module:
    """The shipped model in `path` (a run directory, or its model.safetensors), fp32 on CPU, eval mode.

    Reads config.json and model.safetensors with json and safetensors only (never unpickles). A missing,
    corrupt, truncated or mismatched file raises an error that names it.
    """
    path = Path(path)
    run_dir = path.parent if path.is_file() else path
    config_path, weights_path = run_dir / CONFIG_JSON, run_dir / MODEL_FILE
    cfg = _model_config(_read_json(config_path), config_path)
    if isinstance(cfg, ModelConfig):
        _check_header(weights_path, cfg, config_path)
    elif not weights_path.is_file():  # (an HFConfig is bounded by its own validation)
        raise FileNotFoundError(f"checkpoint file {weights_path} is missing")
    model = build_model(cfg)
    _load_weights(model, _read_tensors(weights_path), weights_path)
    return model.eval()


def _check_header(weights_path: Path, cfg: ModelConfig, config_path: Path) -> None:
    """Compare the config with the weights' shapes from the safetensors header alone, before any
    model is built: a config.json that disagrees with its weights (or asks for a huge model) is
    refused without allocating it."""
    if not weights_path.is_file():
        raise FileNotFoundError(f"checkpoint file {weights_path} is missing")
    try:
        with safe_open(weights_path, framework="pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"checkpoint file {weights_path} is corrupt or truncated ({err})") from err
    blocks = {name.split(".")[1] for name in shapes if name.startswith("blocks.")}
    expected = {"wte.weight": (cfg.vocab_size, cfg.d_model), "blocks.0.attn.qkv.weight": (3 * cfg.d_model, cfg.d_model)}
    if len(blocks) != cfg.n_layer or any(shapes.get(k) != v for k, v in expected.items()):
        raise ValueError(f"checkpoint file {config_path} does not match the weights in {weights_path}: the config asks for "
                         f"{cfg.n_layer} layers of width {cfg.d_model}, the weights have {len(blocks)} layers and "
                         f"embedding shape {shapes.get('wte.weight')}")


def _save_state(out_dir: Path, step: int, model, optimizer, meta: dict) -> None:
    """Resume checkpoint: tensors first, then state.json naming them, then delete older tensor files."""
    # clone: tied matrices (an HF model's embedding and head) must not share memory in safetensors
    tensors = {f"model.{k}": v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
    for index, slots in optimizer.state_dict()["state"].items():
        tensors.update({f"optim.{index}.{k}": v.detach().cpu().contiguous() for k, v in slots.items()})
    tensors["rng.torch_cpu"] = torch.get_rng_state()
    tensor_file = f"state-{step:07d}.safetensors"
    atomic_write(out_dir / tensor_file, lambda tmp: save_file(tensors, tmp))
    _write_json(out_dir / STATE_JSON, {**meta, "step": step, "tensor_file": tensor_file})
    for old in out_dir.glob("state-*.safetensors"):
        if old.name != tensor_file:
            old.unlink()


def _load_state(out_dir: Path, expected_meta: dict, model, optimizer) -> dict:
    """Restore model, optimiser and RNG from out_dir/state.json and its tensor file; returns the JSON.

    The JSON must record the same model config and training settings as `expected_meta`.
    """
    state_path = out_dir / STATE_JSON
    meta = _read_json(state_path)
    if {k: meta.get(k) for k in expected_meta} != expected_meta:
        raise ValueError(f"checkpoint file {state_path} was written by a run with other settings; "
                         "use another out_dir or resume=False")
    if not (isinstance(meta.get("tensor_file"), str) and isinstance(meta.get("step"), int)
            and isinstance(meta.get("losses"), list) and isinstance(meta.get("wall_s"), float)):
        raise ValueError(f"checkpoint file {state_path} lacks one of 'step', 'tensor_file', 'losses', 'wall_s'")
    tensor_path = out_dir / meta["tensor_file"]
    tensors = _read_tensors(tensor_path)
    _load_weights(model, {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}, tensor_path)
    reference = optimizer.state_dict()  # param_groups come from this run's own settings (checked equal)
    slots: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            slots.setdefault(int(index), {})[name] = value
    n_params = sum(len(g["params"]) for g in reference["param_groups"])
    if sorted(slots) != list(range(n_params)) or "rng.torch_cpu" not in tensors:
        raise ValueError(f"checkpoint file {tensor_path} lacks optimiser state for some parameters or the RNG state")
    if tensors["rng.torch_cpu"].shape != torch.get_rng_state().shape:
        raise ValueError(f"checkpoint file {tensor_path} has an RNG state of the wrong size")
    for index, slot in slots.items():
        for name, value in slot.items():
            if not torch.isfinite(value).all() or (name in ("exp_avg_sq", "step") and (value < 0).any()):
                raise ValueError(f"checkpoint file {tensor_path} has a corrupt optimiser state "
                                 f"(optim.{index}.{name} is non-finite or negative)")
    try:
        optimizer.load_state_dict({"state": slots, "param_groups": reference["param_groups"]})
    except (KeyError, ValueError, RuntimeError) as err:
        raise ValueError(f"checkpoint file {tensor_path} has a bad optimiser state ({err})") from err
    torch.set_rng_state(tensors["rng.torch_cpu"])
    return meta


# ---------------------------------------------------------------------------------------------- train

def train(cfg: ModelConfig, steps: int = 500, batch_tokens: int = 4096, lr: float = 2e-3, warmup: int = 50,
          seed: int = 0, out_dir: str | Path = "runs/model", checkpoint_every: int = 100, resume: bool = True,
          device: str = "cpu", progress: bool = True, weight_decay: float = 0.1):
    """Train `cfg` for `steps` steps of `batch_tokens` tokens (batch_tokens/train_len windows of train_len).

    Writes checkpoints every `checkpoint_every` steps (0: never) and the shipped fp16 model at the end.
    With resume=True an interrupted run in out_dir continues from its last checkpoint, and a finished
    run with the same settings is loaded (fp16 weights) instead of retrained. Returns (model, summary),
    where summary is the content of config.json.
    """
    settings = {"steps": steps, "batch_tokens": batch_tokens, "lr": lr, "warmup": warmup, "seed": seed,
                "weight_decay": weight_decay, "betas": list(BETAS), "grad_clip": GRAD_CLIP,
                "min_lr_ratio": MIN_LR_RATIO}
    _check_settings(cfg, settings, checkpoint_every, device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for debris in out_dir.glob(".*.tmp-*"):  # left by a process killed mid-write (atomic_write's temporaries)
        debris.unlink(missing_ok=True)
    meta = {"model": cfg.to_dict(), "train": settings}

    if resume and (out_dir / CONFIG_JSON).is_file():
        finished = _read_json(out_dir / CONFIG_JSON)
        if {k: finished.get(k) for k in meta} != meta:
            raise ValueError(f"checkpoint file {out_dir / CONFIG_JSON} is a finished run with other settings; "
                             "use another out_dir or resume=False")
        return load_checkpoint(out_dir), finished

    torch.manual_seed(seed)  # weight init
    model = build_model(cfg).to(device)
    optimizer = make_optimizer(model, lr, weight_decay)
    train_tokens, val_tokens = load_splits()
    start, losses, wall_s = 0, [], 0.0
    if resume and (out_dir / STATE_JSON).is_file():
        saved = _load_state(out_dir, meta, model, optimizer)
        start, losses, wall_s = saved["step"], saved["losses"], saved["wall_s"]

    batch_size = batch_tokens // cfg.train_len
    model.train()
    bar = tqdm(range(start, steps), initial=start, total=steps, disable=not progress,
               desc=f"{cfg.encoding} seed {seed}")
    t_start = time.perf_counter()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        x, y = get_batch(train_tokens, batch_size, cfg.train_len, batch_generator(seed, step))
        _, loss = model(x.to(device), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            raise ValueError(f"training diverged: the loss is {loss.item()} at step {step}; the last good "
                             f"checkpoint in {out_dir} is kept (lower --lr, or resume with other settings "
                             "in another --out)")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        losses.append(loss.item())
        elapsed = wall_s + time.perf_counter() - t_start
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{(step + 1) * batch_tokens / elapsed:,.0f}", refresh=False)
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            _save_state(out_dir, step + 1, model, optimizer, {**meta, "losses": losses, "wall_s": elapsed})
    bar.close()
    wall_s += time.perf_counter() - t_start

    summary = {**meta, "results": {
        "train_loss": evaluate_loss(model, train_tokens), "val_loss": evaluate_loss(model, val_tokens),
        "tokens_per_s": steps * batch_tokens / wall_s, "wall_s": wall_s,
        "device": str(device), "torch": torch.__version__, "losses": losses}}
    half = {k: v.detach().cpu().half().contiguous() for k, v in model.state_dict().items()}
    atomic_write(out_dir / MODEL_FILE, lambda tmp: save_file(half, tmp))
    _write_json(out_dir / CONFIG_JSON, summary)
    for stale in [out_dir / STATE_JSON, *out_dir.glob("state-*.safetensors")]:
        stale.unlink(missing_ok=True)
    return model.eval(), summary


def _check_settings(cfg: ModelConfig, settings: dict, checkpoint_every: int, device: str) -> None:
    if not _is_config(cfg):
        raise ValueError(f"cfg must be a ModelConfig or an hf.HFConfig, got {type(cfg).__name__}")
    integers = {**{name: settings[name] for name in ("steps", "batch_tokens", "warmup", "seed")},
                "checkpoint_every": checkpoint_every}
    for name, value in integers.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    for name in ("lr", "weight_decay"):
        if not isinstance(settings[name], (int, float)) or isinstance(settings[name], bool):
            raise ValueError(f"{name} must be a number, got {settings[name]!r}")
    if settings["steps"] < 1:
        raise ValueError(f"steps must be >= 1, got {settings['steps']}")
    if settings["batch_tokens"] < cfg.train_len or settings["batch_tokens"] % cfg.train_len:
        raise ValueError(f"batch_tokens ({settings['batch_tokens']}) must be a positive multiple of "
                         f"train_len ({cfg.train_len})")
    if not (math.isfinite(settings["lr"]) and 0 < settings["lr"] <= 1):
        raise ValueError(f"lr must be a finite number in (0, 1], got {settings['lr']}")
    if not 0 <= settings["warmup"] <= settings["steps"]:
        raise ValueError(f"warmup must be in [0, steps], got {settings['warmup']}")
    if not (math.isfinite(settings["weight_decay"]) and 0 <= settings["weight_decay"] <= 10):
        raise ValueError(f"weight_decay must be a finite number in [0, 10], got {settings['weight_decay']}")
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be >= 0 (0: never), got {checkpoint_every}")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available")
