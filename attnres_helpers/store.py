"""The measurement store: ŝ and per-position NLL are what a measurement keeps; R is a query over them.

For every run (a trained model) and every (eval_len, bca) it was measured at, a store holds

- ``s_hat (layers, H, T)``, float32 (float16 in the large stores): the §4.3 estimator of every layer and head (Sun et al. 2022, Eq. 11);
- ``nll (T,)``, float64: the mean next-token negative log-likelihood at each position of the same windows.

One store is one safetensors file (nothing is ever unpickled): the tensors are named
``<run>/<eval_len>/<bca 0|1>/s_hat`` and ``.../nll``, and the header's metadata holds a JSON object
with each run's keys (encoding, seed, train_len, model config, ...) and how the data were made.
R under any boundary, head convention, layer selection or temperature, and perplexity over any
span of positions, are computed from these arrays by :func:`records`: nothing is re-run.

    python -m attnres_helpers results --json [--boundary zero|drop]   # records from the shipped store
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .files import atomic_write
from .metric import BOUNDARIES, HEAD_MODES, Boundary, layer_resolution

HEADER_KEY = "attnres"
RUN_KEYS = ("encoding", "seed", "train_len")  # every run's metadata has at least these


@dataclass(frozen=True)
class Profile:
    """One measurement: a run at one eval length, with or without BCA."""

    run: str
    meta: dict  # the run's keys: encoding, seed, train_len, and any others (config, params, device, ...)
    eval_len: int
    bca: bool
    s_hat: torch.Tensor = field(repr=False)  # (layers, H, T) float32 (stored as float32 or float16)
    nll: torch.Tensor = field(repr=False)  # (T,) float64

    def __post_init__(self):
        if not isinstance(self.run, str) or not self.run or "/" in self.run:
            raise ValueError(f"run names must be non-empty strings without '/', got {self.run!r}")
        if not isinstance(self.meta, dict):
            raise ValueError(f"run {self.run!r}: metadata must be a JSON object, got {type(self.meta).__name__}")
        missing = [k for k in RUN_KEYS if k not in self.meta]
        if missing:
            raise ValueError(f"run {self.run!r}: metadata lacks {missing}")
        if not isinstance(self.meta["train_len"], int) or not isinstance(self.eval_len, int):
            raise ValueError(f"run {self.run!r}: train_len and eval_len must be integers")
        T = self.eval_len
        if self.s_hat.ndim != 3 or self.s_hat.shape[-1] != T or self.nll.shape != (T,):
            raise ValueError(f"run {self.run!r} at eval_len {T}: s_hat must be (layers, H, {T}) and nll ({T},), "
                             f"got {tuple(self.s_hat.shape)} and {tuple(self.nll.shape)}")
        if torch.isnan(self.s_hat).any() or torch.isposinf(self.s_hat).any() or not torch.isfinite(self.nll).all():
            raise ValueError(f"run {self.run!r} at eval_len {T}: s_hat has NaN or +inf, or nll is not finite")

    @property
    def key(self) -> str:
        return f"{self.run}/{self.eval_len}/{int(self.bca)}"


def save_profiles(path: str | Path, profiles: list[Profile], about: dict | None = None,
                  dtype: torch.dtype = torch.float32) -> None:
    """Write ``profiles`` to one safetensors file, atomically. ``about`` (how the data were made:
    command, training and measuring settings) goes into the header beside each run's metadata.
    ``dtype`` is float32, or float16 for large stores (R then moves by well under 1e-3 relative);
    either way, every R is computed from the stored values, so a store and its records agree."""
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"dtype must be torch.float32 or torch.float16, got {dtype}")
    tensors, runs = {}, {}
    for p in profiles:
        if p.key + "/s_hat" in tensors:
            raise ValueError(f"two profiles for {p.key}")
        if runs.setdefault(p.run, p.meta) != p.meta:
            raise ValueError(f"run {p.run!r} has two different metadata")
        tensors[p.key + "/s_hat"] = p.s_hat.detach().to("cpu", dtype).contiguous()
        tensors[p.key + "/nll"] = p.nll.detach().to("cpu", torch.float64).contiguous()
    header = json.dumps({"about": about or {}, "runs": runs}, allow_nan=False)
    atomic_write(Path(path), lambda tmp: save_file(tensors, tmp, metadata={HEADER_KEY: header}))


def load_profiles(path: str | Path) -> tuple[list[Profile], dict]:
    """(profiles, about) from a store file; a missing, corrupt or inconsistent file raises an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"measurement store {path} is missing")
    try:
        with safe_open(path, framework="pt") as f:
            header = json.loads((f.metadata() or {})[HEADER_KEY])
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, KeyError, ValueError, TypeError) as err:
        raise ValueError(f"measurement store {path} is corrupt or not a store ({err})") from err
    runs = header.get("runs") if isinstance(header, dict) else None
    if not isinstance(runs, dict):
        raise ValueError(f"measurement store {path} has no run metadata")
    profiles = []
    for name in sorted(tensors):
        if not name.endswith("/s_hat"):
            continue
        key = name[: -len("/s_hat")]
        try:
            run, eval_len, bca = key.split("/")
            if bca not in ("0", "1"):
                raise ValueError(f"the mask part must be 0 or 1, got {bca!r}")
            profiles.append(Profile(run, runs[run], int(eval_len), bca == "1", tensors[name].float(),
                                    tensors[key + "/nll"].double()))
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"measurement store {path}: entry {key!r} is malformed ({err})") from err
    if not profiles:
        raise ValueError(f"measurement store {path} holds no profiles")
    return profiles, header.get("about", {})


def perplexities(nll: torch.Tensor, train_len: int) -> dict:
    """Perplexity over all positions, over positions < L, and over positions ≥ L (None when T ≤ L),
    all of the same windows: exp of the mean NLL over each span."""
    ppl = lambda span: math.exp(float(span.mean())) if span.numel() else None  # noqa: E731
    return {"perplexity": ppl(nll), "perplexity_first_L": ppl(nll[:train_len]),
            "perplexity_past_L": ppl(nll[train_len:])}


def records(profiles: list[Profile], boundary: Boundary = "zero", head_modes=HEAD_MODES,
            temperature: float = 1.0) -> list[dict]:
    """Tidy records, one per (profile, head_mode, layer), with ``layer`` an int, ``"mean"`` (every
    layer, as in Table 3) or ``"upper"`` (the layers above the first; absent for one-layer models).

    Each record holds the run's metadata keys, eval_len, bca, head_mode, boundary, layer,
    ``resolution`` = R(temperature · ŝ) and the three perplexities of :func:`perplexities`.
    """
    if boundary not in BOUNDARIES:
        raise ValueError(f"unknown boundary {boundary!r}; choose one of {BOUNDARIES}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    out = []
    for p in profiles:
        ppl = perplexities(p.nll, p.meta["train_len"])
        for head_mode in head_modes:
            per_layer = layer_resolution(p.s_hat.double() * temperature, head_mode, boundary)  # (layers,)
            layers = list(enumerate(per_layer.tolist())) + [("mean", float(per_layer.mean()))]
            if len(per_layer) > 1:
                layers.append(("upper", float(per_layer[1:].mean())))
            for layer, r in layers:
                out.append({"run": p.run, **p.meta, "eval_len": p.eval_len, "bca": p.bca, "head_mode": head_mode,
                            "boundary": boundary, "layer": layer, "resolution": r, **ppl})
    return out
