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
  stored ŝ here as everywhere else (:meth:`Entry.profile`). Each is kept up to its last distance with a
  value (a mask that reaches only so far leaves nothing beyond; the reader pads the codes back), and the
  key-0 codes only past L: plan v4's rule for a store that would pass the data budget (all of them would
  make data/ about 86 MB), so R without the sink at T = L is the one computed when the store was built;
- ``window_entropy`` (windows, layers, blocks of 512 queries) float32: the mean attention entropy.

:func:`load` gives it back as a :class:`ConfiguredStore`; its queries are in :mod:`attnres_helpers.configured_analysis`.

    python -m attnres_helpers reproduce configurations    # plan v4's run, then its store (hours, resumable)
    python -m attnres_helpers measure MODEL --configuration NAME,... --build-only   # a store from finished windows
    python -m attnres_helpers results data/results/configurations_v4.safetensors --json
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .files import differing_settings, exclusive, save_safetensors
from .passkey import KEY_DIGITS, KINDS
from .paths import CONFIGURATIONS_COMMAND
from .store import Profile, dequantize, open_store, quantize, store_kind

HEADER_KEY = "attnres-configurations"
NLL_BLOCK = 512
PASSKEY_FIELDS = ("distance", "kind", "query_at", "logprob", "correct")
MISSING = torch.iinfo(torch.int16).min  # store.quantize's code for -inf (a distance with no pairs)
# the settings of a window file that are its own (its job's); every other one is the store's, shared by every
# window file of it: a setting added later is shared, so checked across them, unless it is added here
PER_WINDOW_SETTINGS = ("configuration", "kind", "rope", "remap", "mask", "T", "window", "trials")


def shared_settings(settings: dict) -> dict:
    """The settings of a window file that every window file of one store shares (all but its job's own)."""
    return {k: v for k, v in settings.items() if k not in PER_WINDOW_SETTINGS}


def read_window_file(path: Path) -> tuple[dict, list[dict], dict[str, torch.Tensor]]:
    """(settings, trials, tensors) of one window file; an unreadable one is an error naming it."""
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        settings, trials = json.loads(meta["settings"]), json.loads(meta["trials"])
    except Exception as err:  # a torn or foreign file: one line naming it
        raise ValueError(f"window file {path} is unreadable ({type(err).__name__}: {err}); delete it to redo") from None
    if not isinstance(settings, dict) or not isinstance(trials, list):
        raise ValueError(
            f"window file {path} is malformed (its settings or trials are not JSON objects); delete it to redo"
        )
    return settings, trials, tensors


WINDOW_SETTINGS = ("configuration", "T", "window", "train_len", "rope", "mask")  # and plan v4's kind, remap


def _whole(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_window(path: Path, settings: dict, trials: list, tensors: dict[str, torch.Tensor]) -> None:
    """One window file's contents against :mod:`attnres_helpers.hf.configured`'s layout, before
    :func:`build` reads a field of it: a ValueError naming the file and what is wrong."""

    def bad(what: str):
        raise ValueError(f"window file {path}: {what}; delete it to redo")

    wanted = WINDOW_SETTINGS + (("kind", "remap") if settings.get("plan") == "v4" else ())
    missing = [k for k in wanted if k not in settings]
    if missing:
        bad(f"its settings lack {', '.join(missing)}")
    name, T = settings["configuration"], settings["T"]
    if not isinstance(name, str) or not name or "/" in name:
        bad(f"configuration must be a name, got {name!r}")
    for key, low in (("T", 1), ("window", 0), ("train_len", 2)):
        if not _whole(settings[key], low):
            bad(f"{key} must be an integer >= {low}, got {settings[key]!r}")
    if not isinstance(settings["mask"], dict):
        bad(f"mask must be a JSON object, got {settings['mask']!r}")
    for i, t in enumerate(trials):
        if not isinstance(t, dict) or t.get("kind") not in KINDS:
            bad(f"trial {i} is not an object with a kind in {KINDS}: {t!r}")
        for key in ("key_at", "query_at"):
            if key not in t:
                bad(f"trial {i} lacks {key}")
        absent = t["kind"] == "absent"
        if not _whole(t["query_at"], 1) or t["query_at"] >= T:
            bad(f"trial {i}'s query_at must be an integer in [1, {T}), got {t['query_at']!r}")
        if not (t["key_at"] == -1 if absent else _whole(t["key_at"], 0) and t["key_at"] < t["query_at"]):
            where = "-1" if absent else "an integer before its query_at"
            bad(f"trial {i}'s key_at must be {where}, got {t['key_at']!r}")
    s_hat = tensors.get("s_hat")
    layers_heads = None if s_hat is None or s_hat.ndim != 3 else tuple(s_hat.shape[:2])
    n = len(trials)
    layout = {  # name: (what it holds, its shape, or None where s_hat's shape is unknown)
        "s_hat": ("float", layers_heads and (*layers_heads, T), "(layers, heads, T)"),
        "key0": ("float", layers_heads and (*layers_heads, T), "s_hat's (layers, heads, T)"),
        "nll": ("float", (T,), "(T,)"),
        "inserted": ("bool", (T,), "(T,)"),
        "passkey_logprob": ("float", (n,), "(trials,)"),
        "passkey_correct": ("integer", (n,), "(trials,)"),
    }
    if settings.get("plan") == "v4":
        layout["entropy"] = ("float", layers_heads and (layers_heads[0], T), "(layers, T)")
    holds = {
        "float": lambda t: t.is_floating_point(),
        "bool": lambda t: t.dtype == torch.bool,
        "integer": lambda t: not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool,
    }
    for key, (kind, shape, form) in layout.items():
        t = tensors.get(key)
        if t is None:
            bad(f"it has no {key} tensor")
        if not holds[kind](t) or shape is None or tuple(t.shape) != shape:
            bad(f"{key} must be {kind} {form} (T = {T}, {n} trials), got {t.dtype} {tuple(t.shape)}")
    for key in ("nll", "passkey_logprob", *(("entropy",) if "entropy" in layout else ())):
        if not torch.isfinite(tensors[key]).all():
            bad(f"{key} has NaN or inf")
    correct = tensors["passkey_correct"]
    if ((correct < 0) | (correct > KEY_DIGITS)).any():
        bad(f"passkey_correct must count digits, 0 to {KEY_DIGITS}, got {correct.tolist()}")


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
        raise FileNotFoundError(f"no window files under {folder}: run `{CONFIGURATIONS_COMMAND}` first")
    groups: dict[tuple[str, int], dict[int, Path]] = {}
    for path in files:
        T, w = path.parent.name, path.stem.removeprefix("window-")
        if not (re.fullmatch(r"[1-9][0-9]*", T) and re.fullmatch(r"0|[1-9][0-9]*", w)):
            raise ValueError(
                f"window file {path} is not named <configuration>/<T>/window-<w>.safetensors; move it away"
            )
        groups.setdefault((path.parent.parent.name, int(T)), {})[int(w)] = path
    orphans = [f"{name}/{T}" for (name, T), by_window in sorted(groups.items()) if 0 not in by_window]
    if orphans:  # their other windows would be left out silently (windows 0 … n − 1 enter)
        raise FileNotFoundError(
            f"{', '.join(orphans[:3])}{' …' if len(orphans) > 3 else ''} under {folder} "
            f"{'has' if len(orphans) == 1 else f'({len(orphans)} of {len(groups)}) have'} window files but no "
            "window-0 file, and a store is built from windows 0 … n − 1: measure again to redo window 0"
        )
    tensors, entries, common = {}, {}, None
    for (name, T), by_window in sorted(groups.items()):
        n = 0
        while n in by_window:
            n += 1
        values, sums = [], None
        for w in range(n):
            settings, trials, raw = read_window_file(by_window[w])
            check_window(by_window[w], settings, trials, raw)
            if (settings["configuration"], settings["T"], settings["window"]) != (name, T, w):
                raise ValueError(f"window file {by_window[w]} holds {settings['configuration']} T={settings['T']}")
            shared = shared_settings(settings)
            if common is None:
                common, first = shared, by_window[w]
            elif differ := differing_settings(common, shared):
                raise ValueError(
                    f"window file {by_window[w]} was measured with other settings ({', '.join(differ)}) than "
                    f"{first}; delete the files of one of them"
                )
            if w and (raw["s_hat"].shape, len(trials)) != (sums["s_hat"].shape, len(values[0]["passkey/kind"])):
                raise ValueError(
                    f"window file {by_window[w]} holds s_hat {tuple(raw['s_hat'].shape)} and {len(trials)} trials, "
                    f"window 0 of {name} T={T} {tuple(sums['s_hat'].shape)} and {len(values[0]['passkey/kind'])}; "
                    "delete it to redo"
                )
            try:
                values.append(_window_values(settings, trials, raw))
            except ValueError as err:  # the Profile's checks (NaN, shapes): name the file
                raise ValueError(f"window file {by_window[w]}: {err}; delete it to redo") from None
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
            for field in ("s_hat", "key0") if T > settings["train_len"] else ("s_hat",):  # plan v4's budget rule
                codes, low, step = quantize(getattr(mean, field).float().mean(1))  # (layers, T): one head, the mean
                codes = _defined_prefix(codes)
                tensors |= {f"{prefix}/{field}": codes, f"{prefix}/{field}.low": low, f"{prefix}/{field}.step": step}
    for prefix, (info, old) in _kept_from(store, entries, common, folder).items():
        entries[prefix] = info
        tensors.update(old)
    about = {
        **common,
        "entries": entries,
        "configurations": configurations,
        "nll_block": NLL_BLOCK,
        "command": CONFIGURATIONS_COMMAND,
    }
    with exclusive(store):  # every store is written under its lock
        save_safetensors(store, tensors, {HEADER_KEY: json.dumps(about, allow_nan=False)})
    return store


def _defined_prefix(codes: torch.Tensor) -> torch.Tensor:
    """int16 codes ``(layers, T)`` up to the last distance that any layer has a value at (a mask that reaches
    only so far leaves -inf beyond, coded -32768): the reader pads them back, so nothing is lost."""
    defined = (codes != MISSING).any(0).nonzero()
    return codes[:, : int(defined.max()) + 1 if len(defined) else 1].contiguous()


def _kept_from(store: Path, entries: dict, common: dict, folder: Path) -> dict[str, tuple[dict, dict]]:
    """Entries of an existing ``store`` with more windows than the window files now give (files lost,
    a cache cleared): a store never loses measured windows by being built again. A store measured with
    other settings, or an entry kept beside window files of it measured with other settings (its mask,
    positions, kind), is refused, naming the fields: an entry is never kept as measured under settings
    it was not measured with."""
    if not store.is_file() or not is_configured_store(store):
        return {}
    load(store)  # a malformed store is refused, naming the field, before any of it is kept
    _, about, tensors = open_store(store, (HEADER_KEY,), "configurations store")
    kept = {}
    for prefix, info in about["entries"].items():
        if prefix in entries and entries[prefix]["windows"] >= info["windows"]:
            continue
        if prefix in entries:  # fewer windows now: the stored ones only if measured alike
            new = entries[prefix]
            differ = [k for k in differing_settings(info, new) if k != "windows"]
            if differ:
                had, now = info["windows"], new["windows"]
                raise ValueError(
                    f"{store} holds {prefix} from {had} windows measured with other settings "
                    f"({', '.join(differ)}) than the {now} window file{'' if now == 1 else 's'} of it under "
                    f"{folder}: measure its windows {now} … {had - 1} too, or move the store away to build it "
                    "from the window files alone"
                )
        kept[prefix] = (info, {n: t for n, t in tensors.items() if n.startswith(prefix + "/")})
    differ = differing_settings({k: about.get(k) for k in common}, common)
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
        key0 = None if self.key0 is None else self.key0[:, None]  # none inside L (plan v4's budget rule)
        return Profile(self.configuration, meta, self.T, False, self.s_hat[:, None], nll, key0)

    def layer_resolutions(self, sink: bool = True) -> torch.Tensor:
        """R of every layer (float64) of the stored window-mean ŝ (:meth:`profile`), with or without the
        first-token entries. Inside L plan v4's store keeps no key-0 scores (the plan's data-budget rule), so
        there R without them is ``mean_r_sink_free``: R of the same window-mean ŝ without the first-token
        entries, computed when the store was built."""
        r = self.profile().layer_resolutions(sink=sink)
        return self.mean_r_sink_free.double() if r is None else r

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
    """Whether ``path`` is a readable regular safetensors file whose header is this store's
    (:func:`store.store_kind`; a named pipe is not opened, it would block)."""
    return store_kind(path) == HEADER_KEY


def load(path: str | Path) -> ConfiguredStore:
    """The store at ``path`` (:func:`store.open_store`); a missing or malformed one is one error naming it and
    the field (:func:`_checked_entries`: every field against the layout :func:`build` writes)."""
    path = Path(path)
    try:
        _, about, tensors = open_store(path, (HEADER_KEY,), "configurations store")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"configurations store {path} is missing; build it with `{CONFIGURATIONS_COMMAND}`"
        ) from None
    try:
        return ConfiguredStore(about, _checked_entries(about, tensors))
    except ValueError as err:
        raise ValueError(f"configurations store {path}: {err}") from None


def _dtype(t: torch.dtype) -> str:
    return str(t).removeprefix("torch.")


def _tensor(tensors: dict, name: str, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """``tensors[name]``, checked to be ``dtype`` of ``shape`` (None: any size there)."""
    t = tensors.get(name)
    if t is None:
        raise ValueError(f"{name} is missing")
    if t.dtype != dtype or t.ndim != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        want = "(" + ", ".join("n" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"{name} must be {_dtype(dtype)} {want}, got {_dtype(t.dtype)} {tuple(t.shape)}")
    return t


def _within(name: str, t: torch.Tensor, low: int, high: int) -> None:
    if ((t < low) | (t > high)).any():
        raise ValueError(f"{name} must be in {low}..{high}, got {sorted(set(t.flatten().tolist()))[:10]}")


def _finite(name: str, t: torch.Tensor) -> torch.Tensor:
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} has NaN or inf")
    return t


def _checked_entries(about, tensors: dict[str, torch.Tensor]) -> dict[tuple[str, int], Entry]:
    """Every entry of a store's header and tensors, each field checked against :func:`build`'s layout;
    a ValueError saying which field is wrong and how."""
    if not isinstance(about, dict):
        raise ValueError(f"the header must be a JSON object, got {type(about).__name__}")
    for key in ("entries", "train_len", "configurations"):
        if key not in about:
            raise ValueError(f"the header lacks {key!r}")
    entries, L, known = about["entries"], about["train_len"], about["configurations"]
    if not _whole(L, 2):
        raise ValueError(f"the header's train_len must be an integer >= 2, got {L!r}")
    if not isinstance(known, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("label"), str) and isinstance(v.get("same_as_trained_up_to_L"), bool)
        for v in known.values()
    ):
        raise ValueError("the header's configurations must map each name to its label and same_as_trained_up_to_L")
    if about.get("nll_block", NLL_BLOCK) != NLL_BLOCK:
        raise ValueError(f"the header's nll_block must be {NLL_BLOCK}, got {about['nll_block']!r}")
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f"the header's entries must be a non-empty JSON object, got {entries!r:.80}")
    layout = set()
    out = {}
    for prefix, info in entries.items():
        if not isinstance(info, dict):
            raise ValueError(f"entry {prefix!r} must be a JSON object, got {info!r:.80}")
        for key in ("configuration", "T", "windows", "mask"):
            if key not in info:
                raise ValueError(f"entry {prefix!r} lacks {key!r}")
        name, T, W = info["configuration"], info["T"], info["windows"]
        if not _whole(T, 1) or not _whole(W, 1):
            raise ValueError(f"entry {prefix!r}: T and windows must be integers >= 1, got {T!r} and {W!r}")
        if not isinstance(name, str) or prefix != f"{name}/{T}":
            raise ValueError(f"entry {prefix!r} must be named <configuration>/<T>, got {name!r} and T = {T}")
        if name not in known:
            raise ValueError(f"entry {prefix!r}: {name!r} is not among the header's configurations")
        if info["mask"] is not None and not isinstance(info["mask"], dict):
            raise ValueError(f"entry {prefix!r}: mask must be a JSON object or null, got {info['mask']!r}")
        if info.get("kind") is not None and not isinstance(info["kind"], str):
            raise ValueError(f"entry {prefix!r}: kind must be a name, got {info['kind']!r}")
        blocks = -(-T // NLL_BLOCK)
        r = _tensor(tensors, f"{prefix}/window_r", torch.float32, (W, None))
        layers = r.shape[1]
        get = {"window_r": r}
        for key, shape in (("window_r_sink_free", (W, layers)), ("mean_r", (layers,)), ("mean_r_sink_free", (layers,))):
            get[key] = _tensor(tensors, f"{prefix}/{key}", torch.float32, shape)
        for key, t in get.items():
            _finite(f"{prefix}/{key}", t)
        get["nll_sum"] = _finite(f"{prefix}/nll_sum", _tensor(tensors, f"{prefix}/nll_sum", torch.float32, (W, blocks)))
        get["nll_count"] = _tensor(tensors, f"{prefix}/nll_count", torch.int32, (W, blocks))
        _within(f"{prefix}/nll_count", get["nll_count"], 0, NLL_BLOCK)
        if (get["nll_sum"] < 0).any():
            raise ValueError(f"{prefix}/nll_sum must be >= 0 (sums of negative log-likelihoods)")
        dtypes = {"distance": torch.int64, "kind": torch.int8, "query_at": torch.int64, "logprob": torch.float32}
        first = _tensor(tensors, f"{prefix}/passkey/distance", torch.int64, (W, None))
        passkey = {
            k: _tensor(tensors, f"{prefix}/passkey/{k}", dtypes.get(k, torch.int8), tuple(first.shape))
            for k in PASSKEY_FIELDS
        }
        _within(f"{prefix}/passkey/kind", passkey["kind"], 0, len(KINDS) - 1)
        _within(f"{prefix}/passkey/correct", passkey["correct"], 0, KEY_DIGITS)
        _within(f"{prefix}/passkey/query_at", passkey["query_at"], 1, T - 1)
        _finite(f"{prefix}/passkey/logprob", passkey["logprob"])
        absent = passkey["kind"] == KINDS.index("absent")
        d = passkey["distance"]
        if (absent & (d != -1)).any() or (~absent & ((d < 1) | (d > passkey["query_at"]))).any():
            raise ValueError(f"{prefix}/passkey/distance must be -1 for an absent key, else in 1..query_at")
        names = [f"{prefix}/{k}" for k in get] + [f"{prefix}/passkey/{k}" for k in PASSKEY_FIELDS]
        v4 = {}
        if f"{prefix}/s_hat" in tensors or f"{prefix}/key0" in tensors:  # plan v4 on: int16 codes
            for field in ("s_hat", "key0") if T > L or f"{prefix}/key0" in tensors else ("s_hat",):
                name_ = f"{prefix}/{field}"
                codes = _tensor(tensors, name_, torch.int16, (layers, None))
                if not 1 <= codes.shape[1] <= T:
                    raise ValueError(f"{name_} must hold 1 to {T} distances, got {codes.shape[1]}")
                codes = torch.nn.functional.pad(codes, (0, T - codes.shape[1]), value=MISSING)  # build's trim undone
                for suffix in (".low", ".step"):
                    _finite(name_ + suffix, _tensor(tensors, name_ + suffix, torch.float64, (layers, 1)))
                if not (tensors[name_ + ".step"] > 0).all():
                    raise ValueError(f"{name_}.step must be > 0")
                v4[field] = dequantize(codes, tensors[name_ + ".low"], tensors[name_ + ".step"])
                if torch.isinf(v4[field][codes != MISSING]).any():
                    raise ValueError(f"{name_} decodes to values past float32's range")
                names += [name_, name_ + ".low", name_ + ".step"]
        if f"{prefix}/window_entropy" in tensors:
            entropy = _tensor(tensors, f"{prefix}/window_entropy", torch.float32, (W, layers, blocks))
            if not torch.isfinite(entropy).all():  # not also >= 0: a one-key softmax's is -2e-7 in float32
                raise ValueError(f"{prefix}/window_entropy must be finite (nats)")
            v4["window_entropy"] = entropy
            names.append(f"{prefix}/window_entropy")
        layout.update(names)
        out[(name, T)] = Entry(name, T, L, **get, passkey=passkey, kind=info.get("kind"), mask=info["mask"], **v4)
    stray = sorted(set(tensors) - layout)
    if stray:
        raise ValueError(f"tensor {stray[0]!r} is not part of any entry's layout")
    return out


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
            stored = {tag: r for tag, r in stored.items() if r is not None}  # no key-0 codes inside L
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
