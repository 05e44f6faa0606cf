"""Tables from measurement records: seed means ± SD (the sample standard deviation over seeds), the
paper's Table 3, the sink's weight.

Pure functions over the tidy records of :mod:`attnres_helpers.measure` (one dict per encoding,
seed, train_len, eval_len, bca, head_mode, layer), shared by the tests and notebooks 03 and 04.

A table is a list of rows, one per encoding; a row is a dict from column name to a value:
a :class:`Stat` (a quantity over seeds), a float, an int, a string, or None (not measured).
Column names say what was measured where, with L the training length:

- ``"R(L)"``, ``"R(2L)"``, ``"R(2L)+BCA"``, ... the resolution at eval length k·L of one layer
  selection: ``"mean"`` (every layer, as in Table 3, the default), ``"upper"`` (the layers above
  the first) or one layer's index;
- ``"ppl(2L)"``, ``"ppl(2L) first L"``, ``"ppl(2L) past L"`` (+BCA): perplexity over every
  position, over positions < L, and over positions ≥ L, all of the same 2L windows;
- ``"paper R(L)"``, ... the values of Sun et al. 2022, Table 3 (:data:`PAPER_TABLE3`);
- ``"R(L) no sink"``, ... (with ``sink_free=True``): the same R of ŝ without the first-token entries
  (n, 0), the records' ``resolution_sink_free``.

:func:`format_table` gives a table as plain text; :class:`Table` is the same table for a notebook,
where it renders as HTML (or Markdown) that reflows with the page. R itself is never computed here
from ŝ: every R comes from the store's query (:meth:`attnres_helpers.store.Profile.layer_resolutions`,
or the records of :func:`attnres_helpers.store.records`); :func:`truncated_profile` and
:func:`scores_profile` build the Profiles that query runs on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from html import escape
from typing import NamedTuple

import numpy as np
import torch

from .encoding_registry import TABLE_ORDER
from .metric import HEAD_MODES, Boundary, HeadMode, mean_over_heads
from .store import COPY_GAIN_COLUMNS, Profile

# Sun et al. 2022 ("A Length-Extrapolatable Transformer"), Table 3: 24 layers, training length
# L = 1024, resolution at 1024 (L) and 2048 (2L). Their xPos rows are LEX without BCA ("LEX − BCA",
# 0.98 → 0.54) and LEX with BCA (0.98 → 1.08). Typed in from the paper, not measured here.
PAPER_LABEL = "paper (Sun et al. 2022, Table 3)"
PAPER_TABLE3 = {
    "sinusoidal": {"R(L)": 0.87, "R(2L)": 0.28},  # "Transformer" (absolute sinusoidal)
    "alibi": {"R(L)": 0.81, "R(2L)": 0.88},
    "rope": {"R(L)": 0.91, "R(2L)": 0.08},  # "Roformer"
    "xpos": {"R(L)": 0.98, "R(2L)": 0.54, "R(2L)+BCA": 1.08},  # LEX − BCA; LEX
}
LEVEL_TOLERANCE = 0.15  # "about level": |R(2L) − R(L)| < 0.15·|R(L)|
TABLE_KEYS = ("encoding", "seed", "train_len", "eval_len", "bca", "head_mode", "layer")  # what identifies a table row
TABLE_VALUES = ("resolution", "perplexity", "perplexity_past_L")

# Column selections the notebooks print.
PAIR_COLUMNS = [
    "encoding",
    "seeds",
    "paper R(L)",
    "R(L)",
    "paper R(2L)",
    "R(2L)",
    "paper R(2L)+BCA",
    "R(2L)+BCA",
    "R(4L)",
]
PERPLEXITY_COLUMNS = [
    "encoding",
    "seeds",
    "ppl(L)",
    "ppl(2L) first L",
    "ppl(2L) past L",
    "ppl(4L) first L",
    "ppl(4L) past L",
]
BCA_COLUMNS = ["encoding", "seeds", "R(L)", "R(2L)", "R(2L)+BCA", "BCA ×(2L)", "R(4L)", "R(4L)+BCA", "BCA ×(4L)"]
BCA_PERPLEXITY_COLUMNS = ["encoding", "ppl(2L) past L", "ppl(2L) past L+BCA", "ppl(4L) past L", "ppl(4L) past L+BCA"]
# The copy probe's pair (store.copy_gains): the gain at g = L/2 (a window of L) and at g = 3L/2 (2L)
COPY_COLUMNS = ["encoding", "seeds", *COPY_GAIN_COLUMNS.values(), *(f"{c}+BCA" for c in COPY_GAIN_COLUMNS.values())]
NO_SINK = " no sink"  # suffix of the columns of R without the first-token entries (sink_free=True)
PAIR_SINK_COLUMNS = [
    "encoding",
    "seeds",
    "paper R(L)",
    "R(L)",
    "R(L) no sink",
    "paper R(2L)",
    "R(2L)",
    "R(2L) no sink",
    "paper R(2L)+BCA",
    "R(2L)+BCA",
    "R(4L)",
    "R(4L) no sink",
]
TRUNCATION_COLUMNS = ["encoding", "seeds", "R(L)", "R(2L), distances < L", "R(2L)"]


class Stat(NamedTuple):
    """One quantity over seeds: the mean, the spread (sample standard deviation, ddof = 1; None
    for a single seed), and the per-seed values with their seeds, in seed order."""

    mean: float
    spread: float | None
    values: tuple
    seeds: tuple

    @classmethod
    def of(cls, by_seed: dict[int, float]) -> Stat:
        """The Stat of ``{seed: value}``."""
        if not by_seed:
            raise ValueError("a Stat needs at least one value")
        seeds = tuple(sorted(by_seed))
        values = tuple(float(by_seed[s]) for s in seeds)
        mean = math.fsum(values) / len(values)
        spread = None
        if len(values) > 1:
            spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        return cls(mean, spread, values, seeds)


def length_label(multiple: int) -> str:
    """1 -> "L", 2 -> "2L": eval length as a multiple of the training length."""
    return "L" if multiple == 1 else f"{multiple}L"


def index_records(records: list[dict], head_mode: HeadMode, group: str = "encoding") -> dict:
    """{(record[group], multiple, bca, layer): {seed: record}} for one head mode, after checking the
    records: every key present, one training length, one encoding per group, eval lengths multiples
    of it, no duplicates.
    ``group`` is "encoding" for the shipped models, "config" for the family of notebook 05."""
    if head_mode not in HEAD_MODES:
        raise ValueError(f"unknown head_mode {head_mode!r}; choose one of {HEAD_MODES}")
    if not isinstance(records, (list, tuple)) or not records:
        raise ValueError("records must be a non-empty list of measurement dicts")
    required = (group,) * (group not in TABLE_KEYS) + TABLE_KEYS + TABLE_VALUES
    for r in records:
        missing = [k for k in required if k not in r]
        if missing:
            raise ValueError(f"a record lacks {missing}: {r}")
    train_lens = {r["train_len"] for r in records}
    if len(train_lens) != 1:
        raise ValueError(f"records mix training lengths {sorted(train_lens)}; select one before tabulating")
    index: dict = {}
    encoding_of: dict = {}  # record[group] -> its encoding: one each
    for r in records:
        if encoding_of.setdefault(r[group], r["encoding"]) != r["encoding"]:
            raise ValueError(
                f"{group} {r[group]!r} has records of two encodings: {encoding_of[r[group]]!r} and {r['encoding']!r}"
            )
        if r["head_mode"] != head_mode:
            continue
        if r["eval_len"] % r["train_len"]:
            raise ValueError(f"eval_len {r['eval_len']} is not a multiple of train_len {r['train_len']}")
        key = (r[group], r["eval_len"] // r["train_len"], bool(r["bca"]), r["layer"])
        cell = index.setdefault(key, {})
        if r["seed"] in cell:
            raise ValueError(f"two records for { ({k: r[k] for k in (group, *TABLE_KEYS)}) }")
        cell[r["seed"]] = r
    if not index:
        raise ValueError(f"no records with head_mode {head_mode!r}")
    return index


def cell_stat(cell: dict | None, value: str) -> Stat | None:
    """Stat over seeds of ``value`` in a {seed: record} cell; None if absent or not measured."""
    if not cell or any(record.get(value) is None for record in cell.values()):
        return None
    return Stat.of({seed: record[value] for seed, record in cell.items()})


def table_ordered(encodings: Iterable[str]) -> list[str]:
    """Rows in the registry's table order (``encoding_registry.TABLE_ORDER``), any other name after, sorted."""
    return [e for e in TABLE_ORDER if e in encodings] + sorted(set(encodings) - set(TABLE_ORDER))


def pair_table(
    records: list[dict], head_mode: HeadMode = "mean-scores", layer: str | int = "mean", sink_free: bool = False
) -> list[dict]:
    """One row per encoding: R and perplexity at every measured length, with and without BCA, as
    seed means ± SD (R of ``layer``: "mean" as in Table 3, "upper", or an index), next to the
    paper's values where it has them (the paper's are layer means). ``sink_free=True`` adds, beside
    each R column, its "... no sink" column: R of ŝ without the first-token entries (None where the
    records do not have it). The copy probe's pair, "copy within L" and "copy past L" (with and
    without BCA), comes from the records of the shortest length measured with that mask (None where
    not measured)."""
    index = index_records(records, head_mode)
    multiples = sorted({k for _, k, _, _ in index})
    rows = []
    for encoding in table_ordered({e for e, _, _, _ in index}):
        seeds = {s for (e, _, _, _), cell in index.items() if e == encoding for s in cell}
        row = {"encoding": encoding, "seeds": len(seeds)}
        for k in multiples:
            for bca in (False, True):
                cell = index.get((encoding, k, bca, layer))
                tag = "+BCA" if bca else ""
                row[f"R({length_label(k)}){tag}"] = cell_stat(cell, "resolution")
                if sink_free:
                    row[f"R({length_label(k)}){tag}{NO_SINK}"] = cell_stat(cell, "resolution_sink_free")
                row[f"ppl({length_label(k)}){tag}"] = cell_stat(cell, "perplexity")
                if k > 1:
                    row[f"ppl({length_label(k)}) first L{tag}"] = cell_stat(cell, "perplexity_first_L")
                    row[f"ppl({length_label(k)}) past L{tag}"] = cell_stat(cell, "perplexity_past_L")
        for bca in (False, True):  # a run's copy gains are the same in the records of every length
            shortest = next((k for k in multiples if (encoding, k, bca, layer) in index), None)
            cell = index.get((encoding, shortest, bca, layer))
            for key, column in COPY_GAIN_COLUMNS.items():
                row[column + ("+BCA" if bca else "")] = cell_stat(cell, key)
        for column, value in PAPER_TABLE3.get(encoding, {}).items():
            row[f"paper {column}"] = value
        rows.append(row)
    return rows


def _ratio_stat(numerator: Stat | None, denominator: Stat | None) -> Stat | None:
    """Per-seed ratios numerator/denominator; None when either is missing or a denominator is ≤ 0."""
    if numerator is None or denominator is None or min(denominator.values) <= 0:
        return None
    if numerator.seeds != denominator.seeds:
        raise ValueError(f"cannot pair per-seed values: seeds {numerator.seeds} and {denominator.seeds} differ")
    return Stat.of({s: n / d for s, n, d in zip(numerator.seeds, numerator.values, denominator.values)})


def bca_table(records: list[dict], head_mode: HeadMode = "mean-scores", layer: str | int = "mean") -> list[dict]:
    """:func:`pair_table` plus "BCA ×(kL)" columns: R(kL)+BCA / R(kL) per seed (the paper's xPos:
    1.08/0.54 = 2). None where BCA was not measured (absolute encodings) or R(kL) ≤ 0."""
    rows = pair_table(records, head_mode, layer)
    for row in rows:
        for column in [c for c in row if c.startswith("R(") and not c.endswith("+BCA")]:
            row[f"BCA ×{column[1:]}"] = _ratio_stat(row.get(f"{column}+BCA"), row[column])
    return rows


def layer_table(
    records: list[dict], encoding: str, head_mode: HeadMode = "mean-scores", sink_free: bool = False
) -> list[dict]:
    """One row per layer of one encoding: ``{"layer": i, "R(L)": Stat, "R(2L)": Stat, ...}``; with
    ``sink_free=True`` also ``"R(L) no sink"``, ...: R of ŝ without the first-token entries."""
    index = index_records(records, head_mode)
    cells = {
        (k, bca, layer): cell
        for (e, k, bca, layer), cell in index.items()
        if e == encoding and layer not in ("mean", "upper")
    }
    if not cells:
        raise ValueError(f"no per-layer records for encoding {encoding!r}")
    rows = []
    for layer in sorted({layer for _, _, layer in cells}):
        row = {"layer": layer}
        for k, bca in sorted({(k, bca) for k, bca, _ in cells}):
            column = f"R({length_label(k)}){'+BCA' if bca else ''}"
            row[column] = cell_stat(cells.get((k, bca, layer)), "resolution")
            if sink_free:
                row[column + NO_SINK] = cell_stat(cells.get((k, bca, layer)), "resolution_sink_free")
        rows.append(row)
    return rows


def scores_profile(
    s_hat: np.ndarray | torch.Tensor,
    train_len: int,
    bca: bool = False,
    key0: np.ndarray | torch.Tensor | None = None,
    run: str = "scores",
) -> Profile:
    """A store :class:`~attnres_helpers.store.Profile` around bare ŝ ``(layers, H, T)`` (numpy or torch;
    no NLL, so zeros), so that R of it is the store's query, :meth:`Profile.layer_resolutions`, the one
    place R is computed from ŝ. numpy input is taken as float64, torch input as it is."""

    def tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
        return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x, dtype=np.float64))

    s, k0 = tensor(s_hat), None if key0 is None else tensor(key0)
    if s.ndim != 3:
        raise ValueError(f"s_hat must be (layers, H, T), got shape {tuple(s.shape)}")
    return Profile(
        run,
        {"encoding": run, "seed": 0, "train_len": train_len},
        s.shape[-1],
        bca,
        s,
        torch.zeros(s.shape[-1], dtype=torch.float64),
        k0,
    )


def truncated_profile(profile: Profile, n_distances: int) -> Profile:
    """The first ``n_distances`` distances of a profile, as a Profile of their own, so that R over them
    is the store's query. Its ŝ[n] stays the mean over the original window's pairs at distance n.
    The key-0 scores are left out (R without the sink is then None): the store counts a profile's
    pairs from its own eval length, which a cut profile no longer has. To cut ŝ without the sink,
    cut ``scores_profile(profile.sink_free_s_hat(), ...)``."""
    if isinstance(n_distances, bool) or not isinstance(n_distances, int) or not 2 <= n_distances <= profile.eval_len:
        raise ValueError(f"n_distances must be an integer in [2, {profile.eval_len}], got {n_distances!r}")
    meta = {k: v for k, v in profile.meta.items() if k != "heads_averaged"}
    if profile.heads_averaged:
        meta["heads_averaged"] = [n_distances]
    return Profile(
        profile.run, meta, n_distances, profile.bca, profile.s_hat[..., :n_distances], profile.nll[:n_distances], None
    )


def select_layer(per_layer: torch.Tensor, layer: str | int = "mean") -> float:
    """One number from per-layer R ``(layers,)``, as the records select it: "mean" (every layer),
    "upper" (the layers above the first) or a layer index."""
    if layer == "mean":
        return float(per_layer.mean())
    if layer == "upper":
        if len(per_layer) < 2:
            raise ValueError("a one-layer model has no layers above the first")
        return float(per_layer[1:].mean())
    if isinstance(layer, bool) or not isinstance(layer, int) or not -len(per_layer) <= layer < len(per_layer):
        raise ValueError(f"layer must be 'mean', 'upper' or an index below {len(per_layer)}, got {layer!r}")
    return float(per_layer[layer])


def truncation_table(profiles: dict, train_len: int, head_mode: HeadMode = "mean-scores") -> list[dict]:
    """Where the change at 2L comes from, from measured ŝ (``profiles = {encoding: {T: (layers, H, T)}}``
    with T = L and 2L): R(L), R over the first L distances of the 2L profile, and R of the whole 2L
    profile, each the mean over layers, through the store's query (:func:`scores_profile`)."""
    rows = []
    for encoding, by_len in profiles.items():
        if set(by_len) != {train_len, 2 * train_len}:
            raise ValueError(
                f"profiles[{encoding!r}] must hold eval lengths {train_len} and {2 * train_len}, got {sorted(by_len)}"
            )
        at_L, at_2L = (scores_profile(by_len[T], train_len) for T in (train_len, 2 * train_len))
        rows.append(
            {
                "encoding": encoding,
                "R(L)": select_layer(at_L.layer_resolutions(head_mode)),
                "R(2L), distances < L": select_layer(truncated_profile(at_2L, train_len).layer_resolutions(head_mode)),
                "R(2L)": select_layer(at_2L.layer_resolutions(head_mode)),
            }
        )
    return rows


def _by_encoding_seed(profiles: list[Profile], multiples: tuple[int, ...] = (1, 2), bca: bool = False) -> dict:
    """{encoding: {seed: {multiple: Profile}}} of the profiles at ``multiples``·L with mask ``bca``; every
    (encoding, seed) must have each multiple once."""
    out: dict = {}
    for p in profiles:
        L = p.meta["train_len"]
        if p.bca != bca or p.eval_len % L or p.eval_len // L not in multiples:
            continue
        cell = out.setdefault(p.meta["encoding"], {}).setdefault(p.meta["seed"], {})
        if p.eval_len // L in cell:
            raise ValueError(f"two profiles of {p.meta['encoding']!r}, seed {p.meta['seed']} at {p.eval_len}")
        cell[p.eval_len // L] = p
    for encoding, by_seed in out.items():
        for seed, by_k in by_seed.items():
            if set(by_k) != set(multiples):
                raise ValueError(f"{encoding!r}, seed {seed}: profiles at {sorted(by_k)}·L, need {sorted(multiples)}·L")
    if not out:
        raise ValueError(f"no profiles at {sorted(multiples)}·L with bca={bca}")
    return out


def truncation_rows(
    profiles: list[Profile], layer: str | int = "mean", head_mode: HeadMode = "mean-scores", boundary: Boundary = "zero"
) -> list[dict]:
    """:func:`truncation_table` over seeds, from the store's profiles (causal mask): one row per encoding
    with Stats of R(L), R over the first L distances of the 2L profile, and R(2L), for ``layer``
    ("mean", "upper" or an index); columns :data:`TRUNCATION_COLUMNS`."""
    grouped = _by_encoding_seed(profiles, (1, 2))
    rows = []
    for encoding in table_ordered(grouped):
        by_seed = grouped[encoding]

        def stat(r: Callable[[dict], torch.Tensor], by_seed: dict = by_seed) -> Stat:
            return Stat.of({seed: select_layer(r(by_k), layer) for seed, by_k in by_seed.items()})

        rows.append(
            {
                "encoding": encoding,
                "seeds": len(by_seed),
                "R(L)": stat(lambda by_k: by_k[1].layer_resolutions(head_mode, boundary)),
                "R(2L), distances < L": stat(
                    lambda by_k: truncated_profile(by_k[2], by_k[2].meta["train_len"]).layer_resolutions(
                        head_mode, boundary
                    )
                ),
                "R(2L)": stat(lambda by_k: by_k[2].layer_resolutions(head_mode, boundary)),
            }
        )
    return rows


def resolution_stat(
    profiles: list[Profile],
    encoding: str,
    multiple: int = 1,
    layer: str | int = "mean",
    head_mode: HeadMode = "mean-scores",
    boundary: Boundary = "zero",
    temperature: float = 1.0,
    bca: bool = False,
    sink: bool = True,
) -> Stat:
    """R of one encoding at ``multiple``·L over its seeds (a Stat), with every ŝ multiplied by
    ``temperature``: the store's query on each seed's profile, then ``layer`` selected."""
    by_seed = _by_encoding_seed(profiles, (multiple,), bca).get(encoding)
    if not by_seed:
        raise ValueError(f"no profiles of {encoding!r} at {multiple}·L with bca={bca}")
    values = {}
    for seed, by_k in by_seed.items():
        per_layer = by_k[multiple].layer_resolutions(head_mode, boundary, temperature, sink=sink)
        if per_layer is None:
            raise ValueError(f"{by_k[multiple].key} has no key-0 scores, so no R without the sink")
        values[seed] = select_layer(per_layer, layer)
    return Stat.of(values)


def temperature_for(
    profiles: list[Profile],
    encoding: str,
    target: float,
    multiple: int = 1,
    layer: str | int = "mean",
    head_mode: HeadMode = "mean-scores",
    boundary: Boundary = "zero",
    bounds: tuple[float, float] = (1.0, 1e4),
    rtol: float = 1e-9,
) -> float:
    """The factor τ by which every ŝ of ``encoding`` has to be multiplied for the seed mean of its R at
    ``multiple``·L (layer selection ``layer``) to equal ``target``: bisection on log τ inside ``bounds``,
    until hi/lo < 1 + ``rtol``. The bounds must bracket the target (R at the lower one below it, at the
    upper one above it), else ValueError. R need not be monotonic in τ: this is a crossing, the one
    bisection finds, not necessarily the only one."""

    def r(tau: float) -> float:
        return resolution_stat(profiles, encoding, multiple, layer, head_mode, boundary, tau).mean

    lo, hi = bounds
    if not 0 < lo < hi:
        raise ValueError(f"bounds must satisfy 0 < lo < hi, got {bounds}")
    r_lo, r_hi = r(lo), r(hi)
    if not r_lo < target < r_hi:
        raise ValueError(
            f"{encoding!r}: R is {r_lo:.4g} at τ = {lo:g} and {r_hi:.4g} at τ = {hi:g}, which does not "
            f"bracket the target {target}"
        )
    while hi / lo > 1 + rtol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if r(mid) < target else (lo, mid)
    return math.sqrt(lo * hi)


def sink_free_records(records: list[dict]) -> list[dict]:
    """Copies of the records with ``resolution`` replaced by ``resolution_sink_free`` (R of ŝ without the
    first-token entries), so that every table and check of this module can be read without the sink;
    a record without that value raises."""
    missing = [r for r in records if r.get("resolution_sink_free") is None]
    if missing:
        raise ValueError(
            f"{len(missing)} records have no resolution_sink_free (a store without key-0 scores), "
            f"e.g. { ({k: missing[0].get(k) for k in TABLE_KEYS}) }"
        )
    return [{**r, "resolution": r["resolution_sink_free"]} for r in records]


def last_distance_weights(profile: Profile) -> torch.Tensor:
    """Per layer ``(layers,)``, the softmax weight p_{T−1} that R sees at the farthest distance n = T − 1:
    softmax over distances of the heads-averaged ŝ (:func:`attnres_helpers.metric.mean_over_heads`,
    as mean-scores R does). Under the causal mask that distance holds one pair, the last query's score
    on key 0 (the first token): a first-token attention sink shows as a weight far above 1/T.
    Under BCA the distance is masked and the weight is 0."""
    s = mean_over_heads(profile.s_hat.double())  # (layers, T)
    return torch.softmax(s, dim=-1)[:, -1]


def sink_table(profiles: list[Profile], multiples: tuple[int, ...] = (1, 2, 4)) -> list[dict]:
    """One row per encoding (causal mask): ``"p(T−1) at kL"``, the largest over layers of
    :func:`last_distance_weights` as a Stat over seeds, and ``"1/T at kL"``, the weight of a flat profile."""
    grouped = _by_encoding_seed(profiles, tuple(multiples))
    rows = []
    for encoding in table_ordered(grouped):
        by_seed = grouped[encoding]
        row = {"encoding": encoding, "seeds": len(by_seed)}
        for k in multiples:
            row[f"p(T−1) at {length_label(k)}"] = Stat.of(
                {seed: float(last_distance_weights(by_k[k]).max()) for seed, by_k in by_seed.items()}
            )
            row[f"1/T at {length_label(k)}"] = 1 / next(iter(by_seed.values()))[k].eval_len
        rows.append(row)
    return rows


def _format_cell(value: object, digits: int) -> str:
    def number(x: float) -> str:
        text = f"{x:.{digits}f}"
        return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.000"

    if value is None:
        return "n/a"
    if isinstance(value, Stat):
        return number(value.mean) if value.spread is None else f"{number(value.mean)} ± {number(value.spread)}"
    if isinstance(value, (int, str)):  # bool included
        return str(value)
    if isinstance(value, float):
        return number(value)
    raise ValueError(f"cannot format a table cell of type {type(value).__name__}: {value!r}")


def _cells(rows: list[dict], columns: list[str], digits: int | dict) -> list[list[str]]:
    """The formatted cells of ``columns`` (each row a list of strings), after checking the columns."""
    if not rows:
        raise ValueError("rows is empty: nothing to format")
    absent = [c for c in columns if all(c not in row for row in rows)]
    if absent:
        raise ValueError(f"columns {absent} are in no row; known: {sorted({c for row in rows for c in row})}")
    places = {c: digits.get(c, 3) if isinstance(digits, dict) else digits for c in columns}
    return [[_format_cell(row.get(c), places[c]) for c in columns] for row in rows]


def format_table(rows: list[dict], columns: list[str], digits: int | dict = 3) -> str:
    """A fixed-width plain-text table of ``columns`` (first column left-aligned, the rest right).

    Numbers are rounded to ``digits`` decimals (an int, or {column: digits} with 3 for the rest);
    a Stat prints as "mean ± SD" (its spread, the sample standard deviation), a missing value as "n/a".
    """
    cells = _cells(rows, columns, digits)
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]

    def line(items: list[str]) -> str:
        return "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(items, widths))).rstrip()

    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(c) for c in cells])


NBSP = "\u00a0"  # a no-break space: in HTML and Markdown, "± 0.0074" never splits after its "±"


class Table:
    """A table of rows for a notebook: the cells of :func:`format_table` (same rounding, "n/a"), shown
    as an HTML table (``_repr_html_``) that reflows with the page, or as Markdown
    (``_repr_markdown_``); ``str()`` and ``print`` give the plain text of :func:`format_table`, under
    the caption if there is one. A cell "mean ± SD" may break in one place only, before its "±"
    (a no-break space joins "±" to the spread), so on a narrow page a wide table fits by putting each
    spread under its mean, and no cell ever ends in a bare "±"."""

    def __init__(self, rows: list[dict], columns: list[str], digits: int | dict = 3, caption: str = ""):
        self.columns = list(columns)
        self.cells = _cells(rows, self.columns, digits)
        self.caption = caption
        self.text = format_table(rows, self.columns, digits)

    def __str__(self) -> str:
        return f"{self.caption}\n{self.text}" if self.caption else self.text

    def __repr__(self) -> str:  # text/plain in a notebook: the plain table
        return str(self)

    @staticmethod
    def _keep(cell: str) -> str:
        return cell.replace(" ± ", f" ±{NBSP}")

    def _repr_html_(self) -> str:
        def row(tag: str, items: list[str]) -> str:
            return (
                "<tr>"
                + "".join(
                    f'<{tag} style="text-align: {"left" if i == 0 else "right"}">{escape(self._keep(x))}</{tag}>'
                    for i, x in enumerate(items)
                )
                + "</tr>"
            )

        caption = (
            f'<caption style="caption-side: top; text-align: left">{escape(self.caption)}</caption>'
            if self.caption
            else ""
        )
        body = "".join(row("td", cells) for cells in self.cells)
        return f"<table>{caption}<thead>{row('th', self.columns)}</thead><tbody>{body}</tbody></table>"

    def _repr_markdown_(self) -> str:
        def row(items: list[str]) -> str:
            return "| " + " | ".join(self._keep(x).replace("|", "\\|") for x in items) + " |"

        lines = [row(self.columns), "| " + " | ".join([":---"] + ["---:"] * (len(self.columns) - 1)) + " |"]
        lines += [row(cells) for cells in self.cells]
        return (f"**{self.caption}**\n\n" if self.caption else "") + "\n".join(lines)


def record_mismatches(measured: list[dict], shipped: list[dict], tol: float = 1e-6) -> list[str]:
    """Where two lists of records differ: keys present in one only, or a value off by more than
    ``tol`` (relative or absolute), R without the sink included. An empty list means they agree."""

    def by_key(records: list[dict], name: str) -> dict[tuple, dict]:
        keyed = {}
        for r in records:
            key = tuple(r[k] for k in TABLE_KEYS)
            if key in keyed:
                raise ValueError(f"{name} holds two records for {dict(zip(TABLE_KEYS, key))}")
            keyed[key] = r
        return keyed

    a, b = by_key(measured, "measured"), by_key(shipped, "shipped")
    out = [
        f"only in {name}: {dict(zip(TABLE_KEYS, key))}"
        for name, keys in (("measured", a.keys() - b.keys()), ("shipped", b.keys() - a.keys()))
        for key in sorted(keys, key=str)
    ]
    for key in sorted(a.keys() & b.keys(), key=str):
        for value in (*TABLE_VALUES, "perplexity_first_L", "resolution_sink_free"):  # absent from older records
            x, y = a[key].get(value), b[key].get(value)
            if (x is None) != (y is None) or (x is not None and not math.isclose(x, y, rel_tol=tol, abs_tol=tol)):
                out.append(f"{value} differs at {dict(zip(TABLE_KEYS, key))}: measured {x}, shipped {y}")
    return out
