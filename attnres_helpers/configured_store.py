"""The store of plans v3 and v4 (notebook 08): one model under training-free configurations, per window.

:func:`build` reads the window files of :mod:`attnres_helpers.hf.configured` (each window's ŝ per head,
key-0 scores, per-position NLL and passkey scores) and writes one safetensors file with, for every
(configuration, T):

- ``window_r`` and ``window_r_sink_free`` (windows, layers) float32: R of each window's ŝ, computed by
  :meth:`store.Profile.layer_resolutions` (mean-scores, boundary "zero"), with and without the
  first-token entries. The full ŝ of 56 windows at 16384 tokens would not fit the repository's data
  budget, so the per-window R is what is kept, computed in the one place R is computed;
- ``mean_r`` and ``mean_r_sink_free`` (layers,): R of the window-mean ŝ (notebook 07's estimator);
- ``nll_sum`` and ``nll_count`` (windows, blocks of 512 positions): the NLL of the text's targets, the
  written passkey sentences left out;
- ``passkey/{distance, kind, query_at, logprob, correct}`` (windows, trials);

and, from plan v4's window files on (plan v3's store has none of them):

- ``s_hat`` and ``key0`` (layers, T) int16 codes with their rows' ``.low`` and ``.step``
  (:func:`store.quantize`): the window-mean ŝ and key-0 scores (head means), so that R is a query over
  stored ŝ here as everywhere else (:meth:`Entry.profile`);
- ``window_entropy`` (windows, layers, blocks of 512 queries) float32: the mean attention entropy.

:func:`load` gives it back as a :class:`ConfiguredStore`; its queries are in :mod:`attnres_helpers.configured_analysis`.

    python -m attnres_helpers configurations --build-only     # the store from the finished windows
    python -m attnres_helpers results --json --store data/results/configurations.safetensors
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .files import exclusive, save_safetensors
from .passkey import KEY_DIGITS, KINDS
from .store import Profile, dequantize, quantize

HEADER_KEY = "attnres-configurations"
NLL_BLOCK = 512
PASSKEY_FIELDS = ("distance", "kind", "query_at", "logprob", "correct")
SHARED_SETTINGS = ("plan", "model", "train_len", "n_windows", "key_sentence", "query_sentence")  # one per store


def read_window_file(path: Path) -> tuple[dict, list[dict], dict[str, torch.Tensor]]:
    """(settings, trials, tensors) of one window file; an unreadable one is an error naming it."""
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        settings, trials = json.loads(meta["settings"]), json.loads(meta["trials"])
    except Exception as err:  # a torn or foreign file: one line naming it
        raise ValueError(f"window file {path} is unreadable ({type(err).__name__}: {err}); delete it to redo") from None
    return settings, trials, tensors


def _profile(settings: dict, tensors: dict, s_hat=None, key0=None, nll=None) -> Profile:
    meta = {"encoding": "rope", "seed": 0, "train_len": settings["train_len"], "mask": settings["mask"]}
    return Profile(
        settings["configuration"],
        meta,
        settings["T"],
        False,
        tensors["s_hat"] if s_hat is None else s_hat,
        tensors["nll"].double() if nll is None else nll,
        tensors["key0"] if key0 is None else key0,
    )


def _window_values(settings: dict, trials: list[dict], tensors: dict) -> dict[str, torch.Tensor]:
    p = _profile(settings, tensors)
    text = ~tensors["inserted"]
    nll = torch.where(text, tensors["nll"].double(), 0.0)
    blocks = -(-settings["T"] // NLL_BLOCK)
    pad = blocks * NLL_BLOCK - settings["T"]
    kinds = [KINDS.index(t["kind"]) for t in trials]
    distance = [t["query_at"] - t["key_at"] if t["kind"] != "absent" else -1 for t in trials]
    values = {}
    if "entropy" in tensors:  # plan v4
        entropy = tensors["entropy"].double()  # (layers, T)
        values["window_entropy"] = (
            torch.nn.functional.pad(entropy, (0, pad)).view(-1, blocks, NLL_BLOCK).sum(-1)
            / torch.nn.functional.pad(torch.ones(settings["T"]), (0, pad)).view(blocks, NLL_BLOCK).sum(-1)
        ).float()
    return values | {
        "window_r": p.layer_resolutions().float(),
        "window_r_sink_free": p.layer_resolutions(sink=False).float(),
        "nll_sum": torch.nn.functional.pad(nll, (0, pad)).view(blocks, NLL_BLOCK).sum(-1).float(),
        "nll_count": torch.nn.functional.pad(text.long(), (0, pad)).view(blocks, NLL_BLOCK).sum(-1).int(),
        "passkey/distance": torch.tensor(distance, dtype=torch.int64),
        "passkey/kind": torch.tensor(kinds, dtype=torch.int8),
        "passkey/query_at": torch.tensor([t["query_at"] for t in trials], dtype=torch.int64),
        "passkey/logprob": tensors["passkey_logprob"].float(),
        "passkey/correct": tensors["passkey_correct"].to(torch.int8),
    }


def build(folder: Path, store: Path, configurations: dict[str, dict]) -> Path:
    """Write ``store`` from every finished window file under ``folder`` (``<configuration>/<T>/window-<w>``).
    A (configuration, T) enters with its windows 0 … n − 1 that are all present; the header says how many.
    ``configurations``: {name: {"label": ..., "same_as_trained_up_to_L": bool}}, kept in the header (those
    marked are read as the model as trained inside L)."""
    folder, store = Path(folder), Path(store)
    files = sorted(folder.glob("*/*/window-*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no window files under {folder}: run `python -m attnres_helpers configurations` first")
    groups: dict[tuple[str, int], dict[int, Path]] = {}
    for path in files:
        groups.setdefault((path.parent.parent.name, int(path.parent.name)), {})[int(path.stem.split("-")[1])] = path
    tensors, entries, common = {}, {}, None
    for (name, T), by_window in sorted(groups.items()):
        n = 0
        while n in by_window:
            n += 1
        if n == 0:
            continue
        values, sums = [], None
        for w in range(n):
            settings, trials, raw = read_window_file(by_window[w])
            if (settings["configuration"], settings["T"], settings["window"]) != (name, T, w):
                raise ValueError(f"window file {by_window[w]} holds {settings['configuration']} T={settings['T']}")
            shared = {
                k: settings.get(k)
                for k in ("plan", "model", "train_len", "n_windows", "key_sentence", "query_sentence")
            }
            if common is None:
                common = shared
            elif shared != common:
                raise ValueError(f"window file {by_window[w]} was measured with other settings than the others")
            values.append(_window_values(settings, trials, raw))
            part = {k: raw[k].double() for k in ("s_hat", "key0", "nll")}
            sums = part if sums is None else {k: sums[k] + part[k] for k in part}
        mean = _profile(settings, raw, sums["s_hat"].float() / n, sums["key0"].float() / n, sums["nll"] / n)
        prefix = f"{name}/{T}"
        for key in values[0]:
            tensors[f"{prefix}/{key}"] = torch.stack([v[key] for v in values]).contiguous()
        tensors[f"{prefix}/mean_r"] = mean.layer_resolutions().float()
        tensors[f"{prefix}/mean_r_sink_free"] = mean.layer_resolutions(sink=False).float()
        entries[prefix] = {
            "configuration": name,
            "T": T,
            "windows": n,
            "rope": settings["rope"],
            "mask": settings["mask"],
        }
        if settings.get("plan") == "v4":
            entries[prefix] |= {"kind": settings["kind"], "remap": settings["remap"]}
            for field in ("s_hat", "key0"):
                codes, low, step = quantize(getattr(mean, field).float().mean(1))  # (layers, T): one head, the mean
                tensors |= {f"{prefix}/{field}": codes, f"{prefix}/{field}.low": low, f"{prefix}/{field}.step": step}
    for prefix, (info, old) in _kept_from(store, entries, common).items():
        entries[prefix] = info
        tensors.update(old)
    about = {
        **common,
        "entries": entries,
        "configurations": configurations,
        "nll_block": NLL_BLOCK,
        "command": "python -m attnres_helpers configurations",
    }
    with exclusive(store):  # every store is written under its lock
        save_safetensors(store, tensors, {HEADER_KEY: json.dumps(about, allow_nan=False)})
    return store


def _kept_from(store: Path, entries: dict, common: dict) -> dict[str, tuple[dict, dict]]:
    """Entries of an existing ``store`` with more windows than the window files now give (files lost,
    a cache cleared): a store never loses measured windows by being built again. A store measured with
    other settings is refused, naming the fields."""
    if not store.is_file() or not is_configured_store(store):
        return {}
    with safe_open(store, framework="pt") as f:
        about = json.loads(f.metadata()[HEADER_KEY])
        kept = {}
        for prefix, info in about["entries"].items():
            if prefix in entries and entries[prefix]["windows"] >= info["windows"]:
                continue
            kept[prefix] = (info, {n: f.get_tensor(n) for n in f.keys() if n.startswith(prefix + "/")})
    differ = sorted(k for k in common if about.get(k) != common[k])
    if kept and differ:
        raise ValueError(f"{store} holds windows measured with other settings ({', '.join(differ)}); move it away")
    return kept


@dataclass(frozen=True)
class Entry:
    """One (configuration, T): per-window arrays (windows first) and the R of the window-mean ŝ."""

    configuration: str
    T: int
    train_len: int
    window_r: torch.Tensor  # (W, layers)
    window_r_sink_free: torch.Tensor
    mean_r: torch.Tensor  # (layers,)
    mean_r_sink_free: torch.Tensor
    nll_sum: torch.Tensor  # (W, blocks)
    nll_count: torch.Tensor
    passkey: dict[str, torch.Tensor]  # each (W, trials)
    kind: str | None = None  # plan v4 on: the configuration's kind
    mask: dict | None = None
    s_hat: torch.Tensor | None = None  # (layers, T) window-mean ŝ, head mean (plan v4 on)
    key0: torch.Tensor | None = None  # (layers, T)
    window_entropy: torch.Tensor | None = None  # (W, layers, blocks)

    @property
    def windows(self) -> int:
        return self.window_r.shape[0]

    def profile(self) -> Profile:
        """The stored window-mean ŝ and key-0 scores as a :class:`store.Profile` (one head: their head
        mean), so R comes from :meth:`store.Profile.layer_resolutions` like every other store's; its NLL is
        each block's mean at every position of the block. Plan v3's store keeps no ŝ: a ValueError."""
        if self.s_hat is None:
            raise ValueError(f"{self.configuration} at T = {self.T}: this store keeps R, not ŝ (plan v3)")
        blocks = self.nll_sum.double().sum(0) / self.nll_count.double().sum(0).clamp(min=1)
        nll = blocks.repeat_interleave(NLL_BLOCK)[: self.T]
        meta = {"encoding": "rope", "seed": 0, "train_len": self.train_len, "mask": self.mask}
        return Profile(self.configuration, meta, self.T, False, self.s_hat[:, None], nll, self.key0[:, None])

    def passed(self) -> torch.Tensor:
        """(W, trials) bool: every digit top-1."""
        return self.passkey["correct"] == KEY_DIGITS


@dataclass(frozen=True)
class ConfiguredStore:
    about: dict
    entries: dict[tuple[str, int], Entry]

    @property
    def train_len(self) -> int:
        return self.about["train_len"]

    def configurations(self) -> list[str]:
        """The measured configurations, in the registry's order."""
        measured = {name for name, _ in self.entries}
        return [name for name in self.about["configurations"] if name in measured]

    def labels(self) -> dict[str, str]:
        return {name: info["label"] for name, info in self.about["configurations"].items()}

    def entry(self, configuration: str, T: int) -> Entry:
        """The entry; inside L a configuration that equals the model as trained there reads as-trained's."""
        if (configuration, T) in self.entries:
            return self.entries[(configuration, T)]
        known = self.about["configurations"].get(configuration, {})
        if T <= self.train_len and known.get("same_as_trained_up_to_L"):
            return self.entries[("as-trained", T)]
        raise KeyError(f"the store has no {configuration} at T = {T}")


def is_configured_store(path: str | Path) -> bool:
    """Whether ``path`` is a readable safetensors file whose header is this store's (False otherwise)."""
    try:
        with safe_open(Path(path), framework="pt") as f:
            return HEADER_KEY in (f.metadata() or {})
    except Exception:  # not a safetensors file at all: the ordinary store reader says why
        return False


def load(path: str | Path) -> ConfiguredStore:
    """The store at ``path``; a missing or malformed one is one error naming it and the field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"configurations store {path} is missing; build it with `python -m attnres_helpers configurations`"
        )
    try:
        with safe_open(path, framework="pt") as f:
            about = json.loads((f.metadata() or {})[HEADER_KEY])
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as err:
        raise ValueError(f"configurations store {path} is corrupt or not a configurations store ({err})") from None
    entries = {}
    for prefix, info in about["entries"].items():
        try:
            get = {
                k: tensors[f"{prefix}/{k}"]
                for k in ("window_r", "window_r_sink_free", "mean_r", "mean_r_sink_free", "nll_sum", "nll_count")
            }
            passkey = {k: tensors[f"{prefix}/passkey/{k}"] for k in PASSKEY_FIELDS}
        except KeyError as err:
            raise ValueError(f"configurations store {path}: {prefix} lacks {err}") from None
        W = info["windows"]
        bad = [k for k, t in {**get, **passkey}.items() if t.ndim >= 2 and t.shape[0] != W]
        if bad or not all(torch.isfinite(get[k]).all() for k in ("window_r", "mean_r")):
            raise ValueError(f"configurations store {path}: {prefix} has malformed {bad or 'R values'}")
        v4 = {}
        if f"{prefix}/s_hat" in tensors:
            for field in ("s_hat", "key0"):
                codes, low, step = (tensors.get(f"{prefix}/{field}{suffix}") for suffix in ("", ".low", ".step"))
                if codes is None or low is None or step is None or codes.shape != (get["mean_r"].shape[0], info["T"]):
                    raise ValueError(f"configurations store {path}: {prefix}/{field} is missing or malformed")
                v4[field] = dequantize(codes, low, step)
            v4["window_entropy"] = tensors.get(f"{prefix}/window_entropy")
        entries[(info["configuration"], info["T"])] = Entry(
            info["configuration"],
            info["T"],
            about["train_len"],
            **get,
            passkey=passkey,
            kind=info.get("kind"),
            mask=info["mask"],
            **v4,
        )
    return ConfiguredStore(about, entries)


def nll_mean(entry: Entry, first: int, last: int) -> torch.Tensor:
    """(W,) mean NLL over text positions in [first, last) (block-aligned), per window."""
    if first % NLL_BLOCK or last % NLL_BLOCK:
        raise ValueError(f"positions must be multiples of {NLL_BLOCK}, got {first}, {last}")
    a, b = first // NLL_BLOCK, last // NLL_BLOCK
    return entry.nll_sum[:, a:b].double().sum(-1) / entry.nll_count[:, a:b].double().sum(-1).clamp(min=1)


def records(store: ConfiguredStore) -> list[dict]:
    """One record per (configuration, T, layer | "mean"): R with and without the sink (the mean over
    windows of per-window R, and R of the window-mean ŝ), and per (configuration, T, distance) the
    passkey accuracy, as ``results`` prints them."""
    out = []
    for (name, T), e in sorted(store.entries.items()):
        stored = None
        if e.s_hat is not None:  # plan v4 on: R of the stored ŝ, recomputed here
            profile = e.profile()
            stored = {"": profile.layer_resolutions(), "_sink_free": profile.layer_resolutions(sink=False)}
        for layer in [*range(e.window_r.shape[1]), "mean"]:
            pick = (lambda t: t.mean(-1)) if layer == "mean" else (lambda t, i=layer: t[..., i])
            record = {
                "configuration": name,
                "eval_len": T,
                "layer": layer,
                "windows": e.windows,
                "resolution": float(pick(e.window_r).mean()),
                "resolution_sink_free": float(pick(e.window_r_sink_free).mean()),
                "resolution_of_mean_s_hat": float(pick(e.mean_r)),
                "resolution_of_mean_s_hat_sink_free": float(pick(e.mean_r_sink_free)),
            }
            if e.kind is not None:
                record["kind"] = e.kind
            if stored is not None:
                record |= {f"resolution_of_stored_s_hat{tag}": float(pick(r)) for tag, r in stored.items()}
            out.append(record)
        passed = e.passed()
        for kind_index, kind in enumerate(KINDS):
            of_kind = e.passkey["kind"] == kind_index
            for d in sorted(set(e.passkey["distance"][of_kind].tolist())):
                picked = of_kind & (e.passkey["distance"] == d)
                out.append(
                    {
                        "configuration": name,
                        "eval_len": T,
                        "passkey": kind,
                        "distance": d,
                        "trials": int(picked.sum()),
                        "accuracy": float(passed[picked].double().mean()),
                        "mean_logprob": float(e.passkey["logprob"][picked].double().mean()),
                    }
                )
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in out]
