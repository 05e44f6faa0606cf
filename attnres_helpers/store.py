"""The measurement store: ŝ and per-position NLL are what a measurement keeps; R is a query over them.

For every run (a trained model) and every (eval_len, bca) it was measured at, a store holds

- ``s_hat (layers, H, T)``, float32, float16 or int16 codes (:func:`quantize`; the shipped stores say
  which in ``data/results/README.md``): the §4.3 estimator of every layer and head (Sun et al. 2022, Eq. 11);
- ``nll (T,)``, stored as float32 and read back as float64: the mean next-token negative
  log-likelihood at each position of the same windows;
- ``key0 (layers, H, T)``, optional (stores written since the sink was added): the mean score of each
  query on key 0, so that ŝ without the first-token sink (:func:`attnres_helpers.metric.sink_free_scores`)
  is a query too.

A store may average the heads at measurement for its longest lengths (run metadata
``"heads_averaged": [eval lengths]``): those profiles have one "head" holding the mean over heads,
which is all that mean-scores R needs; mean-R is not recorded for them.

One store is one safetensors file (nothing is ever unpickled): the tensors are named
``<run>/<eval_len>/<bca 0|1>/s_hat``, ``.../nll`` and ``.../key0``, and the header's metadata holds a JSON object
with each run's keys (encoding, seed, train_len, model config, ...) and how the data were made.
R under any boundary, head convention, layer selection or temperature, and perplexity over any
span of positions, are computed from these arrays by :func:`records`: nothing is re-run.

    attnres results --json [--boundary zero|drop]   # records from the shipped store
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Container
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .files import regular_file, save_safetensors
from .masks import Mask
from .metric import (
    BOUNDARIES,
    HEAD_MODES,
    Boundary,
    diagonal_counts,
    layer_resolution,
    mean_over_heads,
    sink_free_scores,
)
from .probe import OUTCOME_MULTIPLE, WITHIN_MULTIPLE, CopyCurve

HEADER_KEY = "attnres"
RUN_KEYS = ("encoding", "seed", "train_len")  # every run's metadata has at least these
COPY_GAIN_COLUMNS = {"copy_gain_within_L": "copy within L", "copy_gain_past_L": "copy past L"}
"""The copy probe's record keys (:func:`copy_gains`) and the table column each is shown under."""
# keys a record computes itself, which run metadata may not hold (they would be silently overwritten)
RECORD_KEYS = (
    "run",
    "eval_len",
    "bca",
    "head_mode",
    "boundary",
    "layer",
    "resolution",
    "resolution_sink_free",
    "perplexity",
    "perplexity_first_L",
    "perplexity_past_L",
    *COPY_GAIN_COLUMNS,
)
MAX_EVAL_LEN = 1 << 20
MAX_LOG_PERPLEXITY = 709.0  # exp() of more overflows float64: the perplexity is then reported as inf


@dataclass(frozen=True)
class Profile:
    """One measurement: a run at one eval length, with or without BCA."""

    run: str
    meta: dict  # the run's keys: encoding, seed, train_len, and any others (config, params, device, ...)
    eval_len: int
    bca: bool
    s_hat: torch.Tensor = field(repr=False)  # (layers, H, T) float32 (stored as float32, float16 or int16 codes)
    nll: torch.Tensor = field(repr=False)  # (T,) float64
    key0: torch.Tensor | None = field(default=None, repr=False)  # (layers, H, T): mean score on key 0

    def __post_init__(self):
        if not isinstance(self.run, str) or not self.run or "/" in self.run:
            raise ValueError(f"run names must be non-empty strings without '/', got {self.run!r}")
        if not isinstance(self.meta, dict):
            raise ValueError(f"run {self.run!r}: metadata must be a JSON object, got {type(self.meta).__name__}")
        missing = [k for k in RUN_KEYS if k not in self.meta]
        if missing:
            raise ValueError(f"run {self.run!r}: metadata lacks {missing}")
        reserved = sorted(set(self.meta) & set(RECORD_KEYS))
        if reserved:
            raise ValueError(f"run {self.run!r}: metadata may not hold the record keys {reserved}")
        seed = self.meta["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"run {self.run!r}: seed must be an integer, got {seed!r}")
        L, T = self.meta["train_len"], self.eval_len
        for name, value in (("train_len", L), ("eval_len", T)):
            if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_EVAL_LEN:
                raise ValueError(f"run {self.run!r}: {name} must be an integer in [2, {MAX_EVAL_LEN}], got {value!r}")
        if self.s_hat.ndim != 3 or self.s_hat.shape[-1] != T or self.nll.shape != (T,):
            raise ValueError(
                f"run {self.run!r} at eval_len {T}: s_hat must be (layers, H, {T}) and nll ({T},), "
                f"got {tuple(self.s_hat.shape)} and {tuple(self.nll.shape)}"
            )
        if self.key0 is not None and self.key0.shape != self.s_hat.shape:
            raise ValueError(
                f"run {self.run!r} at eval_len {T}: key0 must have s_hat's shape {tuple(self.s_hat.shape)}, "
                f"got {tuple(self.key0.shape)}"
            )
        averaged = self.meta.get("heads_averaged", [])
        if not isinstance(averaged, (list, tuple)) or any(
            isinstance(n, bool) or not isinstance(n, int) for n in averaged
        ):
            raise ValueError(f"run {self.run!r}: heads_averaged must be a list of eval lengths, got {averaged!r}")
        if T in averaged and self.s_hat.shape[1] != 1:
            raise ValueError(
                f"run {self.run!r} at eval_len {T}: heads_averaged lists {T}, but s_hat holds "
                f"{self.s_hat.shape[1]} heads, not their one mean"
            )
        for name, t in (("s_hat", self.s_hat), ("key0", self.key0)):
            if t is not None and (torch.isnan(t).any() or torch.isposinf(t).any()):
                raise ValueError(f"run {self.run!r} at eval_len {T}: {name} has NaN or +inf")
        if not torch.isfinite(self.nll).all() or (self.nll < 0).any():
            raise ValueError(
                f"run {self.run!r} at eval_len {T}: nll must be finite and >= 0 (a negative "
                "log-likelihood of a probability)"
            )

    @property
    def key(self) -> str:
        return f"{self.run}/{self.eval_len}/{int(self.bca)}"

    @property
    def heads_averaged(self) -> bool:
        """True where the heads were averaged at measurement (one "head" holds their mean)."""
        return self.eval_len in self.meta.get("heads_averaged", ())

    @property
    def block(self) -> int | None:
        """BCA's block (L/2) for a BCA profile, None under the full causal mask."""
        return self.meta["train_len"] // 2 if self.bca else None

    def layer_resolutions(
        self, head_mode: str = "mean-scores", boundary: Boundary = "zero", temperature: float = 1.0, sink: bool = True
    ) -> torch.Tensor | None:
        """R of every layer, ``(layers,)`` float64: the one place R is computed from a stored ŝ.
        ``sink=False``: of ŝ without the first-token entries (None when the store has no key0).
        Mean-R of a profile whose heads were averaged at measurement is refused."""
        if head_mode == "mean-R" and self.heads_averaged:
            raise ValueError(f"{self.key}: the heads were averaged at measurement, so only mean-scores R exists")
        s_hat = self.s_hat.double() if sink else self.sink_free_s_hat()
        return None if s_hat is None else layer_resolution(s_hat * temperature, head_mode, boundary)

    def sink_free_s_hat(self) -> torch.Tensor | None:
        """ŝ (layers, H, T) without the first-token entries (n, 0); None when the store has no key0."""
        if self.key0 is None:
            return None
        return sink_free_scores(self.s_hat.double(), self.key0.double(), self.pair_counts())

    def pair_counts(self) -> torch.Tensor:
        """Pairs per distance under this profile's mask: the run's ``mask`` (:class:`masks.Mask`, for an
        inference-time configuration) where its metadata names one, else causal or BCA by ``bca``."""
        if "mask" in self.meta:
            return Mask(**self.meta["mask"]).pair_counts(self.eval_len)
        return diagonal_counts(self.eval_len, self.block)


def profile_of_means(run: str, meta: dict, eval_len: int, bca: bool, means: dict) -> Profile:
    """The one Profile builder of a measurement: ``means`` holds the window means ``s_hat (layers, H, T)``,
    ``nll (T,)`` and ``key0 (layers, H, T)`` as a window loop computed them (our models' :mod:`.measure`, a
    pretrained model's :mod:`.hf.pretrained`), kept as a store keeps them: s_hat and key0 float32, nll
    float64, on the CPU."""
    return Profile(
        run, meta, eval_len, bca, means["s_hat"].float().cpu(), means["nll"].double().cpu(), means["key0"].float().cpu()
    )


def average_heads(profiles: list[Profile], lengths: Container[int] | None = None) -> list[Profile]:
    """The profiles with ŝ and key0 averaged over heads at every eval length in ``lengths`` (None: all),
    as mean-scores R averages them (:func:`metric.mean_over_heads`): one "head" of shape (layers, 1, T),
    and the run metadata's ``heads_averaged`` listing those lengths. Mean-scores R is unchanged; mean-R
    is no longer recorded for them. A store of many runs or long lengths keeps to its size this way."""
    averaged = sorted({p.eval_len for p in profiles if lengths is None or p.eval_len in lengths})

    def mean(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else mean_over_heads(t.double()).float()[:, None, :]

    return [
        Profile(
            p.run,
            {**p.meta, "heads_averaged": averaged},
            p.eval_len,
            p.bca,
            mean(p.s_hat) if p.eval_len in averaged else p.s_hat,
            p.nll,
            mean(p.key0) if p.eval_len in averaged else p.key0,
        )
        for p in profiles
    ]


def save_profiles(
    path: str | Path,
    profiles: list[Profile],
    about: dict | None = None,
    dtype: torch.dtype = torch.float32,
    curves: dict[tuple[str, bool], CopyCurve] | None = None,
    window_values: dict[str, dict[str, torch.Tensor]] | None = None,
) -> None:
    """Write ``profiles`` to one safetensors file, atomically. ``about`` (how the data were made:
    command, training and measuring settings) goes into the header beside each run's metadata.
    ``dtype`` is float32; float16; or int16, a fixed-point code per row (:func:`quantize`: each
    (layer, head) row spans its own range in 65534 steps, -inf kept), which keeps every per-layer R of
    the shipped stores within about 1.1e-3 relative where float16 does not (its steps grow with |ŝ|,
    and flat profiles feel them).
    Either way, every R is computed from the stored values, so a store and its records agree. The NLL is
    kept as float32 (``NLL_DTYPE``). :func:`as_stored` gives the profiles back as the store will.
    ``curves``: the copy probe's results by (run, bca), stored as ``<run>/copy/<bca>/...`` (float32).
    ``window_values``: by profile key, values of each window (first axis: windows), stored as
    ``<key>/window/<name>`` (float32) and read back by :func:`load_window_values`."""
    _check_dtype(dtype)
    tensors, runs = {}, {}
    for (run, bca), curve in (curves or {}).items():
        if run not in {p.run for p in profiles}:
            raise ValueError(f"copy curve of run {run!r}, which has no profile")
        prefix = f"{run}/copy/{int(bca)}"
        tensors[prefix + "/gaps"] = torch.tensor(curve.gaps, dtype=torch.int64)
        tensors[prefix + "/nll_copy"] = curve.nll_copy.to(torch.float32).contiguous()
        tensors[prefix + "/nll_control"] = curve.nll_control.to(torch.float32).contiguous()
    for p in profiles:
        if p.key + "/s_hat" in tensors:
            raise ValueError(f"two profiles for {p.key}")
        if runs.setdefault(p.run, p.meta) != p.meta:
            raise ValueError(f"run {p.run!r} has two different metadata")
        for name, t in (("s_hat", p.s_hat), ("key0", p.key0)):
            if t is not None:
                tensors.update(_encoded(p.key, name, t, dtype))
        tensors[p.key + "/nll"] = _cast(p.key, "nll", p.nll, NLL_DTYPE)
    for key, values in (window_values or {}).items():
        if key + "/s_hat" not in tensors:
            raise ValueError(f"window values of {key!r}, which has no profile")
        for name, t in values.items():
            if not name.isidentifier() or not torch.isfinite(t).all():
                raise ValueError(f"window values {key}/{name}: names are identifiers and values are finite")
            tensors[f"{key}/window/{name}"] = t.to(torch.float32).contiguous()
    header = json.dumps({"about": about or {}, "runs": runs}, allow_nan=False)
    save_safetensors(Path(path), tensors, metadata={HEADER_KEY: header})


STORE_DTYPES = (torch.float32, torch.float16, torch.int16)
CODE_MAX = 32767  # int16 codes -32767..32767 span a row's range; -32768 stands for -inf
NLL_DTYPE = torch.float32  # the per-position mean NLL as stored (about 7 significant digits), read back as float64
CODE_SCALES = (".low", ".step")  # beside int16 codes: each row's low and step (quantize)
PROFILE_TENSORS = ("s_hat", "key0", "nll", *(f + s for f in ("s_hat", "key0") for s in CODE_SCALES))
COPY_FIELDS = ("gaps", "nll_copy", "nll_control")


def as_stored(profiles: list[Profile], dtype: torch.dtype = torch.float32) -> list[Profile]:
    """The profiles exactly as a store of ``dtype`` gives them back (:func:`load_profiles` after
    :func:`save_profiles`), without writing one: ŝ and key0 coded and decoded, the NLL as
    ``NLL_DTYPE``. Compare a fresh measurement with a store through this, like with like. It is
    idempotent: what it returns, stored again, is stored unchanged."""
    _check_dtype(dtype)

    def back(t: torch.Tensor | None, key: str, name: str) -> torch.Tensor | None:
        return None if t is None else _stored(_encoded(key, name, t, dtype), f"{key}/{name}")

    return [
        Profile(
            p.run,
            p.meta,
            p.eval_len,
            p.bca,
            back(p.s_hat, p.key, "s_hat"),
            _cast(p.key, "nll", p.nll, NLL_DTYPE).double(),
            back(p.key0, p.key, "key0"),
        )
        for p in profiles
    ]


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in STORE_DTYPES:
        raise ValueError(f"dtype must be one of {STORE_DTYPES}, got {dtype}")


def _encoded(key: str, name: str, t: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors that store profile ``key``'s ŝ or key0 (``name``) as ``dtype``: the values, or for
    int16 the codes of their float32 values with the rows' ``.low`` and ``.step`` (:func:`quantize`;
    coding float32 values makes a decoded store code to itself again)."""
    full = f"{key}/{name}"
    if dtype == torch.int16:
        codes, low, step = quantize(_cast(key, name, t, torch.float32))
        return {full: codes, full + ".low": low, full + ".step": step}
    return {full: _cast(key, name, t, dtype)}


def _cast(key: str, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as ``dtype`` on the CPU; a clear error where a finite value falls outside ``dtype``'s range."""
    cast = t.detach().to("cpu", dtype).contiguous()
    if torch.isposinf(cast).any() or (torch.isneginf(cast) & torch.isfinite(t.cpu())).any():
        advice = "" if name == "nll" else "; store it as float32 or int16"
        raise ValueError(f"{key}: {name} has values beyond {dtype}'s range (|x| > {torch.finfo(dtype).max:g}){advice}")
    return cast


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed-point codes of ``t (..., T)`` (finite or -inf): (codes int16, low, step), low and step
    float64 ``(..., 1)`` per row, with value = low + (code + 32767) · step and -32768 for -inf. Each
    row's finite range is cut into 65534 steps: the error is at most step/2 = (max − min)/131068."""
    t = t.double()
    finite = torch.isfinite(t)
    low = t.masked_fill(~finite, math.inf).amin(-1, keepdim=True)
    high = t.masked_fill(~finite, -math.inf).amax(-1, keepdim=True)
    empty = ~finite.any(-1, keepdim=True)
    low, high = torch.where(empty, 0.0, low), torch.where(empty, 0.0, high)
    step = torch.where(high > low, (high - low) / (2 * CODE_MAX), torch.ones_like(low))
    codes = ((t - low) / step).round().clamp(0, 2 * CODE_MAX) - CODE_MAX
    codes = torch.where(finite, codes, torch.full_like(codes, -CODE_MAX - 1))
    return codes.to(torch.int16).contiguous(), low.contiguous(), step.contiguous()


def dequantize(codes: torch.Tensor, low: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The float32 values of :func:`quantize`'s codes (-inf where the code is -32768)."""
    values = low + (codes.double() + CODE_MAX) * step
    return torch.where(codes == -CODE_MAX - 1, -math.inf, values).float()


def _stored(tensors: dict, name: str) -> torch.Tensor | None:
    """A stored s_hat or key0 (``name`` = ``<key>/<field>``) as float32, None if absent; int16 codes are
    decoded by their rows' ``.low`` and ``.step`` (float64, (layers, H, 1), finite, step > 0), which no
    other dtype has."""
    if name not in tensors:
        return None
    t, field = tensors[name], name.rsplit("/", 1)[-1]
    scales = [tensors.get(name + suffix) for suffix in CODE_SCALES]
    if t.dtype not in STORE_DTYPES:
        raise ValueError(f"{field} is {t.dtype}: a store holds float32, float16 or int16 codes")
    if t.dtype != torch.int16:
        if scales != [None, None]:
            raise ValueError(f"{field}.low and {field}.step belong to int16 codes, but {field} is {t.dtype}")
        return t.float()
    rows = (*t.shape[:-1], 1)
    for suffix, scale in zip(CODE_SCALES, scales):
        if scale is None or scale.dtype != torch.float64 or scale.shape != rows:
            got = "none" if scale is None else f"{scale.dtype} {tuple(scale.shape)}"
            raise ValueError(f"{field}{suffix} must be float64 {rows}, one per row of the codes; got {got}")
    low, step = scales
    if not torch.isfinite(low).all() or not (torch.isfinite(step) & (step > 0)).all():
        raise ValueError(f"{field}.low must be finite and {field}.step finite and > 0")
    values = dequantize(t, low, step)
    if torch.isinf(values[t != -CODE_MAX - 1]).any():
        raise ValueError(f"{field} decodes to values past float32's range")
    return values


def load_curves(path: str | Path) -> dict[tuple[str, bool], CopyCurve]:
    """The copy probe's results in a store, by (run, bca); {} for a store without them. A curve that is
    not ``<run>/copy/<0|1>``, with gaps not distinct integers >= 0, or NLLs not finite ``(gaps, probes)``
    floats is an error naming the store and the curve."""
    out = {}
    _, _, tensors = open_store(path, (HEADER_KEY, "attnres-copy-control"))
    for name in sorted(n for n in tensors if n.endswith("/gaps")):
        prefix = name[: -len("/gaps")]
        try:
            parts = prefix.split("/")
            if len(parts) != 3 or not parts[0] or parts[1] != "copy" or parts[2] not in ("0", "1"):
                raise ValueError("a copy curve is named <run>/copy/<0 or 1>")
            out[(parts[0], parts[2] == "1")] = _curve(*(tensors[f"{prefix}/{field}"] for field in COPY_FIELDS))
        except (KeyError, ValueError) as err:
            raise ValueError(f"measurement store {path}: copy curve {prefix!r} is malformed ({err})") from err
    return out


def _curve(gaps: torch.Tensor, nll_copy: torch.Tensor, nll_control: torch.Tensor) -> CopyCurve:
    """A stored copy curve, checked: gaps int64 ``(gaps,)``, distinct and >= 0; both NLLs finite ``(gaps, probes)``."""
    if gaps.dtype != torch.int64 or gaps.ndim != 1:
        raise ValueError(f"gaps must be int64 (gaps,); got {gaps.dtype} {tuple(gaps.shape)}")
    if (gaps < 0).any() or len(set(gaps.tolist())) != len(gaps):
        raise ValueError(f"gaps must be distinct and >= 0, got {gaps.tolist()[:20]}")
    for name, t in (("nll_copy", nll_copy), ("nll_control", nll_control)):
        if not t.is_floating_point() or t.ndim != 2 or t.shape != (len(gaps), nll_copy.shape[-1]):
            raise ValueError(f"{name} must be finite floats ({len(gaps)}, probes); got {t.dtype} {tuple(t.shape)}")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} must be finite floats ({len(gaps)}, probes); it has NaN or inf")
    return CopyCurve(tuple(gaps.tolist()), nll_copy.double(), nll_control.double())


def load_window_values(path: str | Path) -> dict[str, dict[str, torch.Tensor]]:
    """The per-window values of a store (:func:`save_profiles`' ``window_values``) by profile key, float64;
    {} for a store without them. Every value of one profile has one entry per window."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    _, _, tensors = open_store(path, (HEADER_KEY,))
    for name in sorted(n for n in tensors if "/window/" in n):
        parts = name.split("/")
        key, value, t = "/".join(parts[:3]), parts[-1], tensors[name]
        if len(parts) != 5 or parts[3] != "window" or not _canonical(key) or not value.isidentifier():
            raise ValueError(f"measurement store {path}: window values {name!r} are not <key>/window/<name>")
        if not t.is_floating_point() or t.ndim < 1 or not torch.isfinite(t).all():
            raise ValueError(f"measurement store {path}: window values {name!r} are malformed")
        out.setdefault(key, {})[value] = t.double()
    for key, values in out.items():
        if len({t.shape[0] for t in values.values()}) != 1:
            raise ValueError(
                f"measurement store {path}: the window values of {key!r} differ in their number of windows"
            )
    return out


STORE_KINDS = {  # a store file's header key: what the file is, and what reads it (PATH: the file's path)
    HEADER_KEY: "a measurement store: `attnres results PATH` prints it (attnres_helpers.store.load_profiles)",
    "attnres-configurations": "a configurations store (plans v3 and v4), not a measurement store: "
    "`attnres results PATH` prints it, and notebook 08 reads it",
    "attnres-sinks": "a sinks file (notebook 07's moved first token, written by `attnres reproduce sinks`), "
    "not a measurement store: notebook 07 reads it (attnres_helpers.hf.sinks.load_sinks); no command prints it",
    "attnres-copy-control": "the copy probe's scrambled control (written by `attnres reproduce "
    "copy-control`), not a measurement store: notebooks 03 and 05 read it (attnres_helpers.store.load_curves); "
    "no command prints it",
    "attnres-design-time": "a design-time store (one pass's content correlations on a grid, written by "
    "`attnres design-time --store PATH`), not a measurement store: notebook 10 reads it "
    "(attnres_helpers.design_store.load_store); no command prints it",
}


class OtherStore(ValueError):
    """A sound store file of another kind (:data:`STORE_KINDS`) than the one asked for."""


def store_kind(path: str | Path) -> str | None:
    """The kind of store ``path`` is (its header key in :data:`STORE_KINDS`), or None for anything else: not
    a regular file (a named pipe is not opened, it would block), not safetensors, or no store's header."""
    try:
        if not Path(path).is_file():
            return None
        with safe_open(Path(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception:  # not a safetensors file at all: open_store says why
        return None
    return next((kind for kind in STORE_KINDS if kind in metadata), None)


def open_store(path: str | Path, kinds: Collection[str], what: str = "measurement store") -> tuple[str, object, dict]:
    """The one reader of every store file, before its layout's field checks (:func:`load_profiles`,
    :func:`load_curves`, :func:`load_window_values`, :func:`configured_store.load`, :func:`hf.sinks.load_sinks`):
    ``(kind, header, tensors)``, the kind told by the header's key (:data:`STORE_KINDS`). ``path`` is checked to
    be a regular file first (``what``: how the messages name it); a sound store of a kind not in ``kinds`` is an
    :class:`OtherStore` saying what it is and what reads it; a missing file, FileNotFoundError; a torn file, a
    file with no store's header, or a header that is not JSON, one ValueError naming the file."""
    path = regular_file(path, what)
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            kind = next((kind for kind in STORE_KINDS if kind in metadata), None)
            if kind is not None and kind not in kinds:  # a sound file of another kind: say which, and what reads it
                raise OtherStore(f"{path} is {STORE_KINDS[kind].replace('PATH', str(path))}")
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        if kind is None:
            raise KeyError(" or ".join(map(repr, kinds)))
    except (SafetensorError, OSError, KeyError, ValueError, TypeError) as err:
        if isinstance(err, OtherStore):
            raise
        raise ValueError(f"{what} {path} is corrupt or not a store ({err})") from None
    try:
        return kind, json.loads(metadata[kind]), tensors
    except ValueError as err:
        raise ValueError(f"{what} {path}: the header is not JSON ({err})") from None


def load_profiles(path: str | Path) -> tuple[list[Profile], dict]:
    """(profiles, about) from a store file (:func:`open_store`); a missing, corrupt or inconsistent file
    raises an error naming it."""
    path = Path(path)
    _, header, tensors = open_store(path, (HEADER_KEY,))
    runs = header.get("runs") if isinstance(header, dict) else None
    if not isinstance(runs, dict):
        raise ValueError(f"measurement store {path} has no run metadata")
    profiles = []
    for key in _profile_keys(path, tensors):  # the profiles; copy curves are read by load_curves
        try:
            run, eval_len, bca = key.split("/")
            s_hat, key0, nll = _stored(tensors, f"{key}/s_hat"), _stored(tensors, f"{key}/key0"), tensors[key + "/nll"]
            coded = [tensors[f"{key}/{name}"].dtype for name in ("s_hat", "key0") if f"{key}/{name}" in tensors]
            if coded[-1] != coded[0]:
                raise ValueError(f"key0 is {coded[1]} but s_hat {coded[0]}: a store codes both alike")
            if nll.dtype not in (NLL_DTYPE, torch.float64):
                raise ValueError(f"nll is {nll.dtype}: a store holds it as float32")
            profiles.append(Profile(run, runs[run], int(eval_len), bca == "1", s_hat, nll.double(), key0))
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"measurement store {path}: entry {key!r} is malformed ({err})") from err
    if not profiles:
        raise ValueError(f"measurement store {path} holds no profiles")
    return profiles, header.get("about", {})


def _canonical(key: str) -> bool:
    """Whether ``key`` is ``<run>/<eval length in plain decimal>/<0|1>``: one spelling for each profile."""
    return re.fullmatch(r"[^/]+/[1-9][0-9]*/[01]", key) is not None


def _profile_keys(path: Path, names: Collection[str]) -> list[str]:
    """The profile keys of a store's tensors, every name checked against the layout: ``<key>/<field>``
    (:data:`PROFILE_TENSORS`) and ``<key>/window/<name>`` beside ``<key>/s_hat``, with a key spelled
    canonically (:func:`_canonical`), and ``<run>/copy/<0|1>/<field>`` (:func:`load_curves`)."""
    keys = {name[: -len("/s_hat")] for name in names if name.endswith("/s_hat")}
    for name in names:
        parts = name.split("/")
        if len(parts) == 4 and parts[1] == "copy" and parts[2] in ("0", "1") and parts[3] in COPY_FIELDS:
            continue
        if not (len(parts) == 4 and parts[3] in PROFILE_TENSORS or len(parts) == 5 and parts[3] == "window"):
            raise ValueError(f"measurement store {path}: tensor {name!r} is not part of a store's layout")
        key = "/".join(parts[:3])
        if not _canonical(key):
            raise ValueError(
                f"measurement store {path}: entry {key!r} is malformed (a key is <run>/<eval length in plain "
                "decimal>/<0 or 1>, so that no two keys name one profile)"
            )
        if key not in keys:
            raise ValueError(f"measurement store {path}: tensor {name!r} has no {key}/s_hat beside it")
    return sorted(keys)


def perplexities(nll: torch.Tensor, train_len: int) -> dict:
    """Perplexity over all positions, over positions < L, and over positions ≥ L (None when T ≤ L),
    all of the same windows: exp of the mean NLL over each span (inf, never an OverflowError, past
    float64's range; a store refuses NLL < 0)."""
    if isinstance(train_len, bool) or not isinstance(train_len, int) or train_len < 1:
        raise ValueError(f"train_len must be a positive integer, got {train_len!r}")

    def ppl(span: torch.Tensor) -> float | None:
        if not span.numel():
            return None
        mean = float(span.mean())
        return math.exp(mean) if mean <= MAX_LOG_PERPLEXITY else math.inf

    return {
        "perplexity": ppl(nll),
        "perplexity_first_L": ppl(nll[:train_len]),
        "perplexity_past_L": ppl(nll[train_len:]),
    }


def copy_gains(curve: CopyCurve | None, train_len: int) -> dict:
    """The copy probe's pair (plan v2): the gain at g = L/2 (a window of L, inside the training length)
    and at g = 3L/2 (a window of 2L, the outcome); None where not measured."""
    out = {}
    for key, multiple in (("copy_gain_within_L", WITHIN_MULTIPLE), ("copy_gain_past_L", OUTCOME_MULTIPLE)):
        gap = int(round(multiple * train_len))
        out[key] = curve.gain(gap) if curve is not None and gap in curve.gaps else None
    return out


def records(
    profiles: list[Profile],
    boundary: Boundary = "zero",
    head_modes: Collection[str] = HEAD_MODES,
    temperature: float = 1.0,
    curves: dict[tuple[str, bool], CopyCurve] | None = None,
) -> list[dict]:
    """Tidy records, one per (profile, head_mode, layer), with ``layer`` an int, ``"mean"`` (every
    layer, as in Table 3) or ``"upper"`` (the layers above the first; absent for one-layer models).

    Each record holds the run's metadata keys, eval_len, bca, head_mode, boundary, layer,
    ``resolution`` = R(temperature · ŝ), ``resolution_sink_free`` = the same R of ŝ without the
    first-token entries (:meth:`Profile.sink_free_s_hat`; None where the store has no key0), and the
    three perplexities of :func:`perplexities`, and, where ``curves`` holds the run's copy probe at that
    mask, its pair of :func:`copy_gains`. Profiles whose heads were averaged at measurement give
    mean-scores records only.
    """
    if boundary not in BOUNDARIES:
        raise ValueError(f"unknown boundary {boundary!r}; choose one of {BOUNDARIES}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    out = []
    for p in profiles:
        ppl = perplexities(p.nll, p.meta["train_len"])
        if curves is not None:
            ppl = {**ppl, **copy_gains(curves.get((p.run, p.bca)), p.meta["train_len"])}
        for head_mode in head_modes:
            if head_mode == "mean-R" and p.heads_averaged:
                continue
            per_layer = _by_layer(p.layer_resolutions(head_mode, boundary, temperature))
            free = p.layer_resolutions(head_mode, boundary, temperature, sink=False)
            per_layer_free = _by_layer(free) if free is not None else {layer: None for layer in per_layer}
            for layer, r in per_layer.items():
                out.append(
                    {
                        "run": p.run,
                        **p.meta,
                        "eval_len": p.eval_len,
                        "bca": p.bca,
                        "head_mode": head_mode,
                        "boundary": boundary,
                        "layer": layer,
                        "resolution": r,
                        "resolution_sink_free": per_layer_free[layer],
                        **ppl,
                    }
                )
    return out


def _by_layer(per_layer: torch.Tensor) -> dict:
    """{layer index: R, "mean": mean over layers, "upper": mean over layers above the first (if any)}."""
    out = {i: float(r) for i, r in enumerate(per_layer.tolist())}
    out["mean"] = float(per_layer.mean())
    if len(per_layer) > 1:
        out["upper"] = float(per_layer[1:].mean())
    return out
