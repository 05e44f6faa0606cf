"""Train a byte-level Transformer on the shipped corpus, with atomic checkpoints and exact resume.

Optimiser as in the paper's setup (Sun et al. 2022, §4.1): Adam with β = (0.9, 0.98), here AdamW with
weight decay on matrices only; linear warmup then cosine decay to MIN_LR_RATIO·lr; gradient clipping.

Files in ``out_dir``
  - while training: ``state.json`` (step, settings, loss log, the name of the tensor file) and
    ``state-<step>.safetensors`` (fp32 weights, AdamW moments and step counts, torch's CPU RNG state).
    Each file is written to a temporary name and ``os.replace``d; state.json is replaced last and names
    its tensor file, so it always points at a complete checkpoint. Nothing is ever pickled.
  - when done: ``model.safetensors`` (fp16 weights), then ``SHA256SUMS`` (its hash and that of the
    config.json about to be written: the seal, written only over what training just wrote), then
    ``config.json`` (model config, training settings, final train/validation loss, tokens/s, wall time),
    which marks the run finished; then the resume state is deleted. A finished run is reused only if it
    matches its seal (:func:`checkpoints.verify_finished`); it is never re-sealed.

Batches depend only on (seed, step) (``batch_generator``), so a run interrupted and resumed from its
last checkpoint ends bit-identical on CPU to an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .checkpoints import (
    CONFIG_JSON,
    MODEL_FILE,
    build_model,
    load_checkpoint,
    load_weights,
    read_json,
    read_tensors,
    verify_finished,
)
from .data import eval_windows, get_batch, load_splits
from .files import SUMS_FILE, atomic_write, sha256_file, write_text_atomic
from .files import write_safetensors as save_file  # no temporary of safetensors' own
from .model import ModelConfig, Transformer
from .torchrun import check_device

BETAS = (0.9, 0.98)
GRAD_CLIP = 1.0
MIN_LR_RATIO = 0.1  # the cosine decays to lr * MIN_LR_RATIO
EVAL_WINDOWS = 128  # held-out windows of train_len for the final train/validation loss
STATE_JSON = "state.json"


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
def evaluate_loss(
    model: Transformer, tokens: torch.Tensor, max_windows: int = EVAL_WINDOWS, batch_size: int = 32
) -> float:
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


# ---------------------------------------------------------------- resume state


def _json_text(obj: dict) -> str:
    return json.dumps(obj, indent=1) + "\n"


def _write_json(path: Path, obj: dict) -> None:
    write_text_atomic(path, _json_text(obj))


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
    meta = read_json(state_path)
    if {k: meta.get(k) for k in expected_meta} != expected_meta:
        raise ValueError(
            f"checkpoint file {state_path} was written by a run with other settings; "
            "use another out_dir or resume=False"
        )
    if not (
        isinstance(meta.get("tensor_file"), str)
        and isinstance(meta.get("step"), int)
        and isinstance(meta.get("losses"), list)
        and isinstance(meta.get("wall_s"), float)
    ):
        raise ValueError(f"checkpoint file {state_path} lacks one of 'step', 'tensor_file', 'losses', 'wall_s'")
    tensor_path = out_dir / meta["tensor_file"]
    tensors = read_tensors(tensor_path)
    load_weights(model, {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}, tensor_path)
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
                raise ValueError(
                    f"checkpoint file {tensor_path} has a corrupt optimiser state "
                    f"(optim.{index}.{name} is non-finite or negative)"
                )
    try:
        optimizer.load_state_dict({"state": slots, "param_groups": reference["param_groups"]})
    except (KeyError, ValueError, RuntimeError) as err:
        raise ValueError(f"checkpoint file {tensor_path} has a bad optimiser state ({err})") from err
    torch.set_rng_state(tensors["rng.torch_cpu"])
    return meta


# ---------------------------------------------------------------------------------------------- train


def train(
    cfg: ModelConfig,
    steps: int = 500,
    batch_tokens: int = 4096,
    lr: float = 2e-3,
    warmup: int = 50,
    seed: int = 0,
    out_dir: str | Path = "runs/model",
    checkpoint_every: int = 100,
    resume: bool = True,
    device: str = "cpu",
    progress: bool = True,
    weight_decay: float = 0.1,
) -> tuple[torch.nn.Module, dict]:
    """Train `cfg` for `steps` steps of `batch_tokens` tokens (batch_tokens/train_len windows of train_len).

    Writes checkpoints every `checkpoint_every` steps (0: never) and the shipped fp16 model at the end.
    With resume=True an interrupted run in out_dir continues from its last checkpoint, and a finished
    run with the same settings is loaded (fp16 weights) instead of retrained. Returns (model, summary),
    where summary is the content of config.json.
    """
    settings = training_settings(steps, batch_tokens, lr, warmup, seed, weight_decay)
    _check_settings(cfg, settings, checkpoint_every, device)
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        _check_writable(out_dir)  # makes it
    for debris in out_dir.glob(".*.tmp-*"):  # left by a process killed mid-write (atomic_write's temporaries)
        debris.unlink(missing_ok=True)
    meta = {"model": cfg.to_dict(), "train": settings}

    if resume and (out_dir / CONFIG_JSON).is_file():
        _delete_state(out_dir)  # a run killed after its config.json was written: its last step
        verify_finished(out_dir)  # hashes first: its seal, never rewritten
        finished = read_json(out_dir / CONFIG_JSON)
        if {k: finished.get(k) for k in meta} != meta:
            raise ValueError(
                f"checkpoint file {out_dir / CONFIG_JSON} is a finished run with other settings; "
                "use another out_dir or resume=False"
            )
        return load_checkpoint(out_dir), finished
    _check_writable(out_dir)  # before any step: a folder that cannot be written is an error now

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
    bar = tqdm(
        range(start, steps), initial=start, total=steps, disable=not progress, desc=f"{cfg.encoding} seed {seed}"
    )
    t_start = time.perf_counter()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        x, y = get_batch(train_tokens, batch_size, cfg.train_len, batch_generator(seed, step))
        _, loss = model(x.to(device), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            raise ValueError(
                f"training diverged: the loss is {loss.item()} at step {step}; the last good "
                f"checkpoint in {out_dir} is kept (lower --lr, or resume with other settings "
                "in another --out)"
            )
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

    summary = {
        **meta,
        "results": {
            "train_loss": evaluate_loss(model, train_tokens),
            "val_loss": evaluate_loss(model, val_tokens),
            "tokens_per_s": steps * batch_tokens / wall_s,
            "wall_s": wall_s,
            "device": str(device),
            "torch": torch.__version__,
            "losses": losses,
        },
    }
    half = {k: v.detach().cpu().half().contiguous() for k, v in model.state_dict().items()}
    atomic_write(out_dir / MODEL_FILE, lambda tmp: save_file(half, tmp))
    config = _json_text(summary)
    digest = hashlib.sha256(config.encode()).hexdigest()
    write_text_atomic(
        out_dir / SUMS_FILE, f"{digest}  {CONFIG_JSON}\n{sha256_file(out_dir / MODEL_FILE)}  {MODEL_FILE}\n"
    )
    write_text_atomic(out_dir / CONFIG_JSON, config)  # from here on the run is finished
    _delete_state(out_dir)
    return model.eval(), summary


def training_settings(
    steps: int, batch_tokens: int, lr: float, warmup: int, seed: int, weight_decay: float = 0.1
) -> dict:
    """Everything that determines a training run besides the model config, as config.json records it."""
    return {
        "steps": steps,
        "batch_tokens": batch_tokens,
        "lr": lr,
        "warmup": warmup,
        "seed": seed,
        "weight_decay": weight_decay,
        "betas": list(BETAS),
        "grad_clip": GRAD_CLIP,
        "min_lr_ratio": MIN_LR_RATIO,
    }


def check_training(cfg: ModelConfig, seed: int, device: str = "cpu", checkpoint_every: int = 0, **training) -> None:
    """What :func:`train` refuses at its start (settings, device), for a caller that checks every run
    before any trains; ``training``: steps, batch_tokens, lr, warmup and optionally weight_decay."""
    _check_settings(cfg, training_settings(**training, seed=seed), checkpoint_every, device)


def _delete_state(out_dir: Path) -> None:
    """A finished run's resume state is deleted (anything else in the folder stays unlisted in its
    SHA256SUMS, so the loader refuses it)."""
    for stale in [out_dir / STATE_JSON, *out_dir.glob("state-*.safetensors")]:
        stale.unlink(missing_ok=True)


def _check_writable(out_dir: Path) -> None:
    """Make ``out_dir`` and write a file in it before any step, so that a folder that cannot be written
    fails now, naming the run's target, and not after the training."""
    probe = out_dir / f".write-check.tmp-{os.getpid()}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600))
        probe.unlink()
    except OSError as err:
        raise type(err)(
            f"cannot write {out_dir / MODEL_FILE}: the run folder {out_dir} cannot be written "
            f"({err.strerror or err}); choose another out_dir"
        ) from None


def _check_settings(cfg: ModelConfig, settings: dict, checkpoint_every: int, device: str) -> None:
    if not hasattr(cfg, "build"):
        raise ValueError(f"cfg must be a ModelConfig or an hf.HFConfig, got {type(cfg).__name__}")
    integers = {
        **{name: settings[name] for name in ("steps", "batch_tokens", "warmup", "seed")},
        "checkpoint_every": checkpoint_every,
    }
    for name, value in integers.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    for name in ("lr", "weight_decay"):
        if not isinstance(settings[name], (int, float)) or isinstance(settings[name], bool):
            raise ValueError(f"{name} must be a number, got {settings[name]!r}")
    if settings["steps"] < 1:
        raise ValueError(f"steps must be >= 1, got {settings['steps']}")
    if settings["batch_tokens"] < cfg.train_len or settings["batch_tokens"] % cfg.train_len:
        raise ValueError(
            f"batch_tokens ({settings['batch_tokens']}) must be a positive multiple of train_len ({cfg.train_len})"
        )
    if not (math.isfinite(settings["lr"]) and 0 < settings["lr"] <= 1):
        raise ValueError(f"lr must be a finite number in (0, 1], got {settings['lr']}")
    if not 0 <= settings["warmup"] <= settings["steps"]:
        raise ValueError(f"warmup must be in [0, steps], got {settings['warmup']}")
    if not (math.isfinite(settings["weight_decay"]) and 0 <= settings["weight_decay"] <= 10):
        raise ValueError(f"weight_decay must be a finite number in [0, 10], got {settings['weight_decay']}")
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be >= 0 (0: never), got {checkpoint_every}")
    check_device(device)
