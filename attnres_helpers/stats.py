"""Does resolution predict extrapolation? Rank statistics over a family of configurations (notebook 05).

A *configuration* is one member of ``experiments.FAMILY`` (an encoding with some parameters,
trained from several seeds) evaluated without or with BCA: BCA is an evaluation-time switch, so
the same checkpoints give two configurations (none for sinusoidal, which cannot use BCA).
For each configuration and seed we have *predictors*, the layer-mean R of notebook 03 and the
design-time R of the encodings module, and *outcomes*, perplexities at L, 2L and 4L.

The question is about ranks across configurations: does a configuration with a higher R(2L)
extrapolate better? So the statistic is Spearman's ρ over the configurations' seed means, with a
bootstrap over seeds for its uncertainty, a leave-one-family-out check, and a baseline that knows
only each configuration's family. Everything here is numpy over the tidy records of
:mod:`attnres_helpers.measure` (plus ``config``, the FAMILY label); the notebook and the tests
share it. ``n``, the number of configurations a ρ rests on, is returned with every estimate.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .encodings import resolution_pair
from .metric import BOUNDARIES, Boundary, HeadMode
from .tables import Stat, index_records, length_label

FAMILIES = ("rope", "xpos", "alibi", "sinusoidal", "nope")  # a configuration's family is its encoding
MEASURED_PREDICTORS = ("R(L)", "R(2L)", "R(2L)/R(L)")
DESIGN_PREDICTORS = ("design R(L)", "design R(2L)")
PREDICTORS = MEASURED_PREDICTORS + DESIGN_PREDICTORS
OUTCOMES = ("ppl(L)", "ppl(2L)", "ppl(4L)", "ppl(2L)/ppl(L)", "ppl(2L) past L", "ppl(4L) past L")
N_BOOT = 2000  # bootstrap replicates
BOOT_SEED = 0  # seed of the numpy Generator that draws them
LEVEL = 0.95  # confidence level: the 2.5th and 97.5th percentiles of the replicates


# --------------------------------------------------------------------------- Spearman's ρ


def average_ranks(x) -> np.ndarray:
    """1-based ranks along the last axis, tied values sharing the mean of the ranks they span:
    rank_i = #{j : x_j < x_i} + (#{j : x_j = x_i} + 1) / 2. E.g. [10, 20, 20, 5] -> [2, 3.5, 3.5, 1]."""
    x = np.asarray(x, dtype=np.float64)
    below = (x[..., None, :] < x[..., :, None]).sum(axis=-1)  # (..., n): for each i, how many x_j < x_i
    tied = (x[..., None, :] == x[..., :, None]).sum(axis=-1)  # (..., n): how many x_j = x_i, i itself included
    return below + (tied + 1) / 2


def _rank_correlation(x, y):
    """Spearman's ρ along the last axis: Pearson's r of the average ranks, (...) from (..., n);
    NaN where either input is constant (callers check)."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx = rx - rx.mean(axis=-1, keepdims=True)
    ry = ry - ry.mean(axis=-1, keepdims=True)
    spread = np.sqrt((rx**2).sum(axis=-1) * (ry**2).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip((rx * ry).sum(axis=-1) / spread, -1.0, 1.0)


def spearman(x, y) -> float:
    """Spearman's rank correlation ρ of two samples (Spearman 1904).

    ρ = Σ (r_i − r̄)(q_i − q̄) / √(Σ (r_i − r̄)² Σ (q_i − q̄)²), with r, q the average ranks of x
    and y (:func:`average_ranks`), i.e. Pearson's r of the ranks. Without ties this is
    1 − 6 Σ (r_i − q_i)² / (n (n² − 1)). ρ = 1 for any increasing relation, −1 for a decreasing one.
    Undefined (ValueError) for fewer than 3 points, non-finite values, or a constant input.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(f"x and y must be 1-D, got shapes {x.shape} and {y.shape}")
    if len(x) != len(y):
        raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
    if len(x) < 3:
        raise ValueError(f"a rank correlation needs at least 3 points, got {len(x)}")
    for name, values in (("x", x), ("y", y)):
        if not np.isfinite(values).all():
            raise ValueError(f"{name} holds non-finite values (NaN or inf): {values}")
        if np.all(values == values[0]):
            raise ValueError(f"{name} is constant, so its ranks carry no order and Spearman's ρ is undefined")
    return float(_rank_correlation(x, y))


# --------------------------------------------------------------------------- configurations


class Configuration(NamedTuple):
    """One configuration and its per-seed values.

    ``name`` is the FAMILY label, with " +BCA" when evaluated with BCA; ``family`` its encoding;
    ``values`` maps a column (:data:`PREDICTORS`, :data:`OUTCOMES`) to ``{seed: value}``. A column
    is missing where it was not measured or is undefined (a ratio over R(L) ≤ 0).
    """

    name: str
    config: str
    bca: bool
    family: str
    values: dict


def design_params(encoding: str, model: dict) -> dict:
    """Keyword arguments of :func:`attnres_helpers.encodings.resolution_pair` that describe a trained
    model's encoding at design time; ``model`` is its ModelConfig as a dict (``cfg.to_dict()``).

    - rope, xpos: head_dim = d_model / n_head, base = rope_base, and scale = √head_dim, which
      makes the curve q·R_n k / √d for q = k = ones (the registry default 8 is √64); xpos adds
      gamma = xpos_gamma and scale_base = xpos_scale_base (an integer in the registry).
    - alibi: heads = n_head, scale = alibi_slope_scale (the curve is −scale·m_h·n).
    - sinusoidal, nope: the registry defaults (sinusoidal: the cosine sum at d = 64, scale 8;
      the model adds its table to width-d_model embeddings, which no design curve follows exactly).
    """
    if encoding in ("rope", "xpos"):
        head_dim = model["d_model"] // model["n_head"]
        params = {"head_dim": head_dim, "base": float(model["rope_base"]), "scale": math.sqrt(head_dim)}
        if encoding == "xpos":
            scale_base = float(model["xpos_scale_base"])
            if not scale_base.is_integer():
                raise ValueError(f"xpos_scale_base must be a whole number for the design curve, got {scale_base:g}")
            params.update(gamma=float(model["xpos_gamma"]), scale_base=int(scale_base))
        return params
    if encoding == "alibi":
        return {"heads": model["n_head"], "scale": float(model["alibi_slope_scale"])}
    if encoding in ("sinusoidal", "nope"):
        return {}
    raise ValueError(f"no design-time curve for encoding {encoding!r}; known: {', '.join(FAMILIES)}")


def design_resolution(encoding: str, model: dict, L: int, bca: bool = False, head_mode: HeadMode = "mean-scores",
                      boundary: Boundary = "zero") -> tuple[float, float]:
    """Design-time (R(L), R(2L)) of a trained model's encoding (:func:`design_params`).

    With BCA no query sees a key L or more positions back (blocks of L/2), so the 2L profile is
    the L profile followed by e^{s} = 0, and with boundary "zero" R(2L) = R(L) exactly.
    """
    r_L, r_2L = resolution_pair(encoding, L, head_mode, boundary, **design_params(encoding, model))
    return (r_L, r_L) if bca else (r_L, r_2L)


def _per_seed(cell: dict | None, value: str) -> dict | None:
    """{seed: record[value]} of a {seed: record} cell; None if absent or any value is not measured."""
    if not cell or any(record[value] is None for record in cell.values()):
        return None
    return {seed: float(record[value]) for seed, record in cell.items()}


def _ratio(numerator: dict | None, denominator: dict | None) -> dict | None:
    """Per-seed numerator/denominator; None if either is missing, the seeds differ, or a denominator is ≤ 0."""
    if numerator is None or denominator is None or set(numerator) != set(denominator):
        return None
    if min(denominator.values()) <= 0:
        return None
    return {s: numerator[s] / denominator[s] for s in numerator}


def configurations(records, head_mode: HeadMode = "mean-scores", models: dict | None = None,
                   boundary: Boundary = "zero") -> list[Configuration]:
    """Every (FAMILY label, BCA) in ``records``, in the records' order (without BCA first), with the
    layer-mean predictors of ``head_mode`` and every outcome per seed:

    R(L), R(2L), R(2L)/R(L) (per seed); ppl(L), ppl(2L), ppl(4L), ppl(2L)/ppl(L) (per seed),
    ppl(2L) past L, ppl(4L) past L (positions ≥ L only). With BCA every value is the one measured
    with BCA. ``models = {label: ModelConfig dict}`` adds design R(L), design R(2L)
    (:func:`design_resolution`), the same for every seed.
    """
    if boundary not in BOUNDARIES:
        raise ValueError(f"unknown boundary {boundary!r}; choose one of {BOUNDARIES}")
    index = index_records(records, head_mode, group="config")  # checks keys, one L, one encoding each
    L = records[0]["train_len"]
    families = {r["config"]: r["encoding"] for r in records}  # label -> encoding, in the records' order
    cells: dict = {}  # (label, bca) -> {multiple: {seed: record}}
    for (label, multiple, bca, layer), by_seed in index.items():
        if layer == "mean":
            cells.setdefault((label, bca), {})[multiple] = by_seed
    if not cells:
        raise ValueError(f"no layer-mean records with head_mode {head_mode!r}")
    if models is not None and set(families) - set(models):
        raise ValueError(f"models lacks the configurations {sorted(set(families) - set(models))}")

    out = []
    for (label, bca), by_multiple in sorted(cells.items(), key=lambda item: (list(families).index(item[0][0]),
                                                                              item[0][1])):
        values = {
            "R(L)": _per_seed(by_multiple.get(1), "resolution"),
            "R(2L)": _per_seed(by_multiple.get(2), "resolution"),
            **{f"ppl({length_label(k)})": _per_seed(by_multiple.get(k), "perplexity") for k in (1, 2, 4)},
            **{f"ppl({k}L) past L": _per_seed(by_multiple.get(k), "perplexity_past_L") for k in (2, 4)},
        }
        values["R(2L)/R(L)"] = _ratio(values["R(2L)"], values["R(L)"])
        values["ppl(2L)/ppl(L)"] = _ratio(values["ppl(2L)"], values["ppl(L)"])
        if models is not None and values["R(L)"] is not None:
            design = design_resolution(families[label], models[label], L, bca, head_mode, boundary)
            for column, r in zip(DESIGN_PREDICTORS, design):
                values[column] = {seed: r for seed in values["R(L)"]}
        name = f"{label} +BCA" if bca else label
        out.append(Configuration(name, label, bca, families[label],
                                 {k: v for k, v in values.items() if v is not None}))
    return out


def configuration_table(configs: list[Configuration], columns) -> list[dict]:
    """Rows for :func:`attnres_helpers.tables.format_table`: configuration, family, seeds, and a
    :class:`~attnres_helpers.tables.Stat` (seed mean ± spread) per column (None where missing)."""
    rows = []
    for c in configs:
        row = {"configuration": c.name, "family": c.family, "seeds": len(set().union(*c.values.values()))}
        for column in columns:
            row[column] = Stat.of(c.values[column]) if column in c.values else None
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- bootstrap over seeds


class Estimate(NamedTuple):
    """A statistic on the seed means (``value``), its bootstrap percentile interval [low, high],
    the number of configurations n it rests on and the number of bootstrap replicates."""

    value: float
    low: float
    high: float
    n: int
    replicates: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def _check_bootstrap(n_boot, seed, level) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer (the bootstrap Generator's seed), got {seed!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")


def _paired(configs: list[Configuration], columns) -> tuple[list[Configuration], list[tuple], list[np.ndarray]]:
    """The configurations that have every column, their seeds, and their values as ``(seeds, columns)``,
    one row per seed (the same seeds in every column: one trained model gives one row)."""
    if not configs:
        raise ValueError("configs is empty")
    known = {k for c in configs for k in c.values}
    unknown = [k for k in columns if k not in known]
    if unknown:
        raise ValueError(f"no configuration has {unknown}; known columns: {sorted(known)}")
    chosen, seeds, tables = [], [], []
    for c in configs:
        if not all(k in c.values for k in columns):
            continue
        own = tuple(sorted(c.values[columns[0]]))
        if any(tuple(sorted(c.values[k])) != own for k in columns):
            raise ValueError(f"{c.name}: columns {list(columns)} were measured on different seeds, so they "
                             f"cannot be paired: {[sorted(c.values[k]) for k in columns]}")
        chosen.append(c)
        seeds.append(own)
        tables.append(np.array([[c.values[k][s] for k in columns] for s in own]))  # (seeds, columns)
    if len(chosen) < 3:
        raise ValueError(f"only {len(chosen)} configurations have all of {list(columns)}; "
                         f"a rank correlation needs at least 3")
    return chosen, seeds, tables


def _resampled_means(chosen: list[Configuration], seeds: list[tuple], tables: list[np.ndarray], n_boot: int,
                     seed: int) -> np.ndarray:
    """``(n_boot, configurations, columns)``: in each replicate, each trained setting's seeds drawn
    with replacement (as many as it has) and its configurations' values averaged over the draw.
    The unit is the trained model: every column, and a configuration and its BCA twin (the same
    checkpoints), use the same draw."""
    rng = np.random.default_rng(seed)
    draws: dict = {}  # trained setting -> (its seeds, picks (B, k))
    out = np.empty((n_boot, len(tables), tables[0].shape[1]))
    for i, (c, own, table) in enumerate(zip(chosen, seeds, tables)):  # table (k, columns)
        if c.config not in draws:
            draws[c.config] = own, rng.integers(0, len(own), size=(n_boot, len(own)))  # (B, k)
        drawn_seeds, picks = draws[c.config]
        if drawn_seeds != own:
            raise ValueError(f"{c.name} has seeds {list(own)} but another configuration of {c.config!r} has "
                             f"{list(drawn_seeds)}; configurations of one trained setting must share seeds")
        out[:, i] = table[picks].mean(axis=1)  # (B, k, columns) -> (B, columns)
    return out


def _rank_correlations(x, y, what: str) -> np.ndarray:
    """Spearman's ρ of every replicate, ``(B,)`` from ``(B, n)``; ValueError if one is undefined."""
    rhos = _rank_correlation(x, y)
    undefined = int(np.isnan(rhos).sum())
    if undefined:
        raise ValueError(f"{what}: in {undefined} of {len(rhos)} bootstrap replicates one side is constant "
                         f"across configurations, so Spearman's ρ is undefined there")
    return rhos


def _estimate(point: float, replicates: np.ndarray, n: int, level: float) -> Estimate:
    low, high = np.percentile(replicates, [50 * (1 - level), 50 * (1 + level)])
    return Estimate(float(point), float(low), float(high), n, len(replicates))


def bootstrap_spearman(configs: list[Configuration], predictor: str, outcome: str, n_boot: int = N_BOOT,
                       seed: int = BOOT_SEED, level: float = LEVEL) -> Estimate:
    """Spearman's ρ of ``predictor`` and ``outcome`` across configurations, with a bootstrap over seeds.

    Point estimate: ρ(x̄, ȳ), x̄_c and ȳ_c the seed means of configuration c. Replicate b: for
    every trained setting, draw its k seeds with replacement, average each of its configurations
    over the draw, and compute ρ across configurations. The unit resampled is the trained model:
    a seed's predictor and outcome stay together, and a configuration and its BCA twin (the same
    checkpoints, evaluated with another mask) share the draw. The
    interval is the [(1 − level)/2, (1 + level)/2] percentiles of the ``n_boot`` replicates
    (numpy Generator ``seed``: the same inputs give the same interval). Only configurations with
    both columns count; their number is ``n``. The bootstrap shows seed noise only: the set of
    configurations is fixed, so it says nothing about configurations not in the family.
    """
    _check_bootstrap(n_boot, seed, level)
    chosen, seeds, tables = _paired(configs, (predictor, outcome))
    means = np.array([t.mean(axis=0) for t in tables])  # (n, 2)
    point = spearman(means[:, 0], means[:, 1])
    boot = _resampled_means(chosen, seeds, tables, n_boot, seed)  # (B, n, 2)
    return _estimate(point, _rank_correlations(boot[..., 0], boot[..., 1], f"ρ({predictor}, {outcome})"),
                     len(chosen), level)


def correlation_table(configs: list[Configuration], predictors, outcomes, n_boot: int = N_BOOT,
                      seed: int = BOOT_SEED, level: float = LEVEL) -> list[dict]:
    """One row per predictor × outcome: n, ρ on the seed means and its bootstrap interval
    (:func:`bootstrap_spearman`), and whether the interval excludes 0."""
    rows = []
    for predictor in predictors:
        for outcome in outcomes:
            est = bootstrap_spearman(configs, predictor, outcome, n_boot, seed, level)
            rows.append({"predictor": predictor, "outcome": outcome, "n": est.n, "rho": est.value,
                         "CI low": est.low, "CI high": est.high, "excludes 0": "yes" if est.excludes_zero else "no"})
    return rows


def leave_one_family_out(configs: list[Configuration], predictor: str, outcome: str, n_boot: int = N_BOOT,
                         seed: int = BOOT_SEED, level: float = LEVEL) -> dict[str, Estimate]:
    """Is ρ carried by one family? ``{"none": ρ on every configuration, family: ρ without that
    family's configurations, ...}`` (families in :data:`FAMILIES` order), each a
    :func:`bootstrap_spearman` estimate on what is left."""
    present = [f for f in FAMILIES if any(c.family == f for c in configs)]
    present += sorted({c.family for c in configs} - set(FAMILIES))
    out = {"none": bootstrap_spearman(configs, predictor, outcome, n_boot, seed, level)}
    for family in present:
        rest = [c for c in configs if c.family != family]
        out[family] = bootstrap_spearman(rest, predictor, outcome, n_boot, seed, level)
    return out


def family_baseline_weights(groups) -> np.ndarray:
    """``(n, n)`` weights W of the family-name baseline b = W ȳ (see :func:`baseline_comparison`):
    W_ij = 1/|G_i| for j in G_i, the other configurations of i's group, or, when i is alone in
    its group, W_ij = 1/(n − 1) for every j ≠ i. W_ii = 0 and every row sums to 1."""
    groups = list(groups)
    n = len(groups)
    if n < 2:
        raise ValueError(f"the family baseline needs at least 2 configurations, got {n}")
    weights = np.zeros((n, n))
    for i, group in enumerate(groups):
        mates = [j for j in range(n) if j != i and groups[j] == group] or [j for j in range(n) if j != i]
        weights[i, mates] = 1.0 / len(mates)
    return weights


class Comparison(NamedTuple):
    """A predictor against the family-name baseline on the same configurations and replicates:
    ρ of each with the outcome, and |ρ_predictor| − |ρ_baseline| (> 0: the predictor ranks better)."""

    predictor: Estimate
    baseline: Estimate
    difference: Estimate


def baseline_comparison(configs: list[Configuration], predictor: str, outcome: str, by_bca: bool = False,
                        n_boot: int = N_BOOT, seed: int = BOOT_SEED, level: float = LEVEL) -> Comparison:
    """How much better than the family name alone does ``predictor`` rank ``outcome``?

    The family-name baseline predicts configuration i's outcome by the mean outcome of the
    *other* configurations of its family (leave-one-out, so it never sees i's own outcome):
    b_i = mean{ȳ_j : j ≠ i, family_j = family_i}, or mean{ȳ_j : j ≠ i} when i's family has no
    other member (:func:`family_baseline_weights`). ``by_bca=True`` groups by (family, BCA) instead:
    the name plus the evaluation switch. Its score is ρ(b, ȳ); the predictor's is ρ(x̄, ȳ). Both,
    and |ρ_x| − |ρ_b|, are bootstrapped over seeds with the same replicates as
    :func:`bootstrap_spearman` (b recomputed from each replicate's ȳ), on the configurations that
    have both columns (n).
    """
    _check_bootstrap(n_boot, seed, level)
    chosen, seeds, tables = _paired(configs, (predictor, outcome))
    weights = family_baseline_weights([(c.family, c.bca) if by_bca else c.family for c in chosen])  # (n, n)
    means = np.array([t.mean(axis=0) for t in tables])  # (n, 2)
    boot = _resampled_means(chosen, seeds, tables, n_boot, seed)  # (B, n, 2)
    x, y = boot[..., 0], boot[..., 1]  # (B, n)
    point_x = spearman(means[:, 0], means[:, 1])
    try:
        point_b = spearman(weights @ means[:, 1], means[:, 1])
    except ValueError as err:
        raise ValueError(f"the family baseline of {outcome} is undefined: {err}") from None
    rho_x = _rank_correlations(x, y, f"ρ({predictor}, {outcome})")
    rho_b = _rank_correlations(y @ weights.T, y, f"family baseline of {outcome}")
    n = len(chosen)
    return Comparison(_estimate(point_x, rho_x, n, level), _estimate(point_b, rho_b, n, level),
                      _estimate(abs(point_x) - abs(point_b), np.abs(rho_x) - np.abs(rho_b), n, level))


def format_estimate(est: Estimate, digits: int = 2) -> str:
    """ "−0.62 [−0.80, −0.35]": the value and its interval, rounded (no "-0.00")."""
    def number(v: float) -> str:
        text = f"{v:.{digits}f}"
        return text[1:] if text.startswith("-") and float(text) == 0 else text

    return f"{number(est.value)} [{number(est.low)}, {number(est.high)}]"


# --------------------------------------------------------------------------- cluster bootstrap, permutation, partial ρ


def _check_resampling(n_resamples, rng, confidence_level=None) -> np.random.Generator:
    """Validate scipy-style resampling arguments; the numpy Generator that ``rng`` names."""
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if confidence_level is not None and not (isinstance(confidence_level, (int, float, np.floating))
                                             and not isinstance(confidence_level, bool)
                                             and 0 < confidence_level < 1):
        raise ValueError(f"confidence_level must lie in (0, 1), got {confidence_level!r}")
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        return np.random.default_rng(rng)
    raise ValueError(f"rng must be an integer seed, None or a numpy Generator, got {rng!r}")


def _weighted_rank_correlation(x: np.ndarray, y: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Spearman's ρ of every resample, ``(B,)``, where resample b holds ``counts[b, i]`` copies of
    point i (``counts`` (B, n)); equal to :func:`spearman` of the expanded data. The average rank of
    each copy of i is Σ_j m_j [x_j < x_i] + (Σ_j m_j [x_j = x_i] + 1)/2, and ρ is the Pearson r of
    the ranks weighted by m. NaN where a resample's x or y is constant."""
    m = counts.astype(np.float64)
    total = m.sum(axis=1, keepdims=True)  # (B, 1)

    def ranks(v):
        below = (v[None, :] < v[:, None]).astype(np.float64)  # (n, n): [v_j < v_i] at [i, j]
        tied = (v[None, :] == v[:, None]).astype(np.float64)
        return m @ below.T + (m @ tied.T + 1) / 2  # (B, n)

    def centred(r):
        return r - (m * r).sum(axis=1, keepdims=True) / total

    rx, ry = centred(ranks(x)), centred(ranks(y))
    present = m > 0
    constant = ((np.where(present, x, -np.inf).max(axis=1) == np.where(present, x, np.inf).min(axis=1))
                | (np.where(present, y, -np.inf).max(axis=1) == np.where(present, y, np.inf).min(axis=1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (m * rx * ry).sum(axis=1) / np.sqrt((m * rx**2).sum(axis=1) * (m * ry**2).sum(axis=1))
    rho = np.clip(rho, -1.0, 1.0)
    rho[constant] = np.nan
    return rho


def _cluster_index(x, clusters) -> tuple[np.ndarray, int]:
    """Each point's cluster number (0..k−1, in np.unique's order) and k; clear errors for bad labels."""
    labels = np.asarray(clusters)
    if labels.ndim != 1 or len(labels) != len(x):
        raise ValueError(f"clusters must give one label per point: {len(x)} points but clusters has shape "
                         f"{labels.shape}")
    try:
        _, index = np.unique(labels, return_inverse=True)
    except TypeError as err:
        raise ValueError(f"cluster labels must be mutually comparable (one type): {err}") from None
    index = index.reshape(-1)
    k = int(index.max()) + 1
    if k < 2:
        raise ValueError("clusters holds a single cluster; a cluster bootstrap needs at least 2")
    return index, k


def cluster_bootstrap_spearmans(xs, y, clusters, n_resamples: int = 10000, rng=0) -> np.ndarray:
    """Spearman's ρ of each predictor in ``xs`` with y on the *same* cluster-bootstrap resamples:
    ``(n_resamples, len(xs))``, NaN where a resample leaves x or y constant.

    Each resample draws the k distinct cluster labels (sorted, ``np.unique``) k times with
    replacement (``rng.integers(0, k, size=(n_resamples, k))``, all drawn at once) and takes every
    point of each drawn cluster, duplicates kept. Sharing the draws lets a difference of two ρ's be
    resampled as one statistic.
    """
    generator = _check_resampling(n_resamples, rng)
    y = np.asarray(y, dtype=np.float64)
    xs = [np.asarray(x, dtype=np.float64) for x in xs]
    for x in xs:
        spearman(x, y)  # validates: 1-D, same length, >= 3 points, finite, not constant
    index, k = _cluster_index(y, clusters)
    drawn = generator.integers(0, k, size=(n_resamples, k))  # (B, k) cluster draws
    rhos = np.empty((n_resamples, len(xs)))
    chunk = max(1, 2_000_000 // (len(y) + k))
    for start in range(0, n_resamples, chunk):
        block = drawn[start:start + chunk]  # (b, k)
        per_cluster = np.zeros((len(block), k), dtype=np.int64)
        np.add.at(per_cluster, (np.arange(len(block))[:, None], block), 1)  # times each cluster drawn
        for j, x in enumerate(xs):
            rhos[start:start + chunk, j] = _weighted_rank_correlation(x, y, per_cluster[:, index])  # (b, n) counts
    return rhos


def percentile_interval(replicates, confidence_level: float = 0.95, what: str = "Spearman's ρ") -> tuple[float, float]:
    """The 100·(1 − c)/2 and 100·(1 + c)/2 percentiles of the defined (non-NaN) replicates; a
    ValueError if more than half are undefined."""
    replicates = np.asarray(replicates, dtype=np.float64)
    kept = replicates[~np.isnan(replicates)]
    if len(kept) < len(replicates) / 2:
        raise ValueError(f"in {len(replicates) - len(kept)} of {len(replicates)} cluster-bootstrap resamples x or y "
                         f"is constant, so {what} is undefined in more than half of them; too few clusters vary")
    low, high = np.percentile(kept, [50 * (1 - confidence_level), 50 * (1 + confidence_level)])
    return float(low), float(high)


def spearman_cluster_bootstrap(x, y, clusters, n_resamples: int = 10000, confidence_level: float = 0.95,
                               rng=0) -> tuple[float, float, float]:
    """Spearman's ρ of x and y (:func:`spearman`) and a cluster-bootstrap percentile interval:
    ``(rho, low, high)``.

    Resamples as :func:`cluster_bootstrap_spearmans` (ties at average ranks); resamples where ρ_b is
    undefined (x or y constant) are dropped, and a ValueError is raised if more than half are.
    [low, high] are the 100·(1 − c)/2 and 100·(1 + c)/2 percentiles of the kept ρ_b,
    c = ``confidence_level``. With every point its own cluster this is the ordinary (point) bootstrap.
    ``rng``: an integer seed, None or a numpy Generator.
    """
    _check_resampling(n_resamples, rng, confidence_level)
    rho = spearman(x, y)
    rhos = cluster_bootstrap_spearmans([x], y, clusters, n_resamples, rng)[:, 0]
    return (rho, *percentile_interval(rhos, confidence_level))


def spearman_permutation_test(x, y, n_resamples: int = 10000, rng=0) -> tuple[float, float]:
    """Spearman's ρ of x and y and a two-sided permutation p-value: ``(rho, p_value)``.

    Each of the ``n_resamples`` resamples permutes y (independently of x) and computes ρ_b;
    p = (1 + #{b : |ρ_b| ≥ |ρ_obs|}) / (n_resamples + 1), which counts the observed data as one
    of the permutations, so 1/(n_resamples + 1) ≤ p ≤ 1. ``|ρ_b| ≥ |ρ_obs|`` is tested with a
    relative tolerance of 1e-12 so that ties with ρ_obs are not lost to rounding.
    ``rng``: an integer seed, None or a numpy Generator.
    """
    generator = _check_resampling(n_resamples, rng)
    rho = spearman(x, y)  # validates x, y
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    norm = np.sqrt((rx**2).sum() * (ry**2).sum())
    threshold = abs(rho) * (1 - 1e-12)
    extreme = 0
    chunk = max(1, 2_000_000 // len(rx))
    for start in range(0, n_resamples, chunk):
        b = min(chunk, n_resamples - start)
        permuted = generator.permuted(np.broadcast_to(ry, (b, len(ry))), axis=1)  # (b, n)
        rhos = permuted @ rx / norm  # (b,)
        extreme += int((np.abs(rhos) >= threshold).sum())
    return rho, (1 + extreme) / (n_resamples + 1)


def partial_spearman(x, y, z) -> float:
    """Partial rank correlation of x and y given z.

    x, y, z are replaced by their average ranks; with r_xy, r_xz, r_yz the Pearson correlations of
    the ranks (Spearman's ρ, :func:`spearman`), the result is
    (r_xy − r_xz r_yz) / √((1 − r_xz²)(1 − r_yz²)). ValueError where it is undefined: invalid or
    constant inputs, or |r_xz| = 1 or |r_yz| = 1 (x or y a monotone function of z).
    """
    x, y, z = (np.asarray(v, dtype=np.float64) for v in (x, y, z))
    if not (x.shape == y.shape == z.shape):
        raise ValueError(f"x, y and z must have the same shape, got {x.shape}, {y.shape} and {z.shape}")
    r_xy, r_xz, r_yz = spearman(x, y), spearman(x, z), spearman(y, z)
    denominator = (1 - r_xz**2) * (1 - r_yz**2)
    if denominator <= 1e-12:
        raise ValueError(f"the partial rank correlation is undefined: x or y is a monotone function of z "
                         f"(ρ(x, z) = {r_xz:.6g}, ρ(y, z) = {r_yz:.6g})")
    return float(np.clip((r_xy - r_xz * r_yz) / math.sqrt(denominator), -1.0, 1.0))


def group_mean_baseline(outcome, groups) -> np.ndarray:
    """The family-mean baseline: b_i = mean{y_j : g_j = g_i}, the in-sample mean of the outcome over
    the points that share i's group label (i itself included), returned per point, shape (n,)."""
    y = np.asarray(outcome, dtype=np.float64)
    labels = np.asarray(groups)
    if y.ndim != 1 or len(y) == 0:
        raise ValueError(f"outcome must be a non-empty 1-D array, got shape {y.shape}")
    if labels.ndim != 1 or len(labels) != len(y):
        raise ValueError(f"groups must give one label per point: {len(y)} outcomes but groups has shape "
                         f"{labels.shape}")
    if not np.isfinite(y).all():
        raise ValueError(f"outcome holds non-finite values (NaN or inf): {y}")
    try:
        _, index = np.unique(labels, return_inverse=True)
    except TypeError as err:
        raise ValueError(f"group labels must be mutually comparable (one type): {err}") from None
    index = index.reshape(-1)
    sums = np.bincount(index, weights=y)
    sizes = np.bincount(index)
    return (sums / sizes)[index]
