"""The companion's findings as checks over measurement records: does a measured table show the RoPE
reversal of the paper's Table 3 (RoPE best inside L, below ALiBi past it, ALiBi level, BCA restoring,
and the same in perplexity)? Each check holds or not on the seed means, and in how many seeds.
"""

from __future__ import annotations

from typing import NamedTuple

from .metric import HeadMode
from .tables import LEVEL_TOLERANCE, Table, cell_stat, index_records, length_label

CHECK_DESCRIPTIONS = {
    "rope_highest_at_L": "RoPE has the highest R(L) of RoPE, sinusoidal and ALiBi",
    "rope_below_alibi_at_2L": "RoPE's R(2L) is below ALiBi's",
    "rope_lowest_at_2L": "RoPE has the lowest R(2L) of RoPE, sinusoidal and ALiBi",
    "alibi_level": f"ALiBi stays about level, |R(2L)/R(L) − 1| < {LEVEL_TOLERANCE}",
    "bca_raises_rope": "BCA raises RoPE's R(2L)",
    "bca_raises_xpos": "BCA raises xPos's R(2L)",
    "rope_better_first_L": "2L windows, positions < L: RoPE's perplexity is below ALiBi's",
    "rope_worse_past_L": "2L windows, positions ≥ L: RoPE's perplexity is above ALiBi's",
}


class Check(NamedTuple):
    """A named qualitative finding: whether it holds on the seed means, and in how many seeds."""

    holds: bool
    seeds_holding: int
    seeds: int


# The findings as functions of ``r(encoding, multiple, bca=False)`` -> R, ``ppl(encoding, column)`` -> a
# perplexity of the 2L windows, and the level tolerance. A missing value raises LookupError.
_RIVALS = ("sinusoidal", "alibi")
_CHECKS = {
    "rope_highest_at_L": lambda r, ppl, tol: r("rope", 1) > max(r(e, 1) for e in _RIVALS),
    "rope_below_alibi_at_2L": lambda r, ppl, tol: r("rope", 2) < r("alibi", 2),
    "rope_lowest_at_2L": lambda r, ppl, tol: r("rope", 2) < min(r(e, 2) for e in _RIVALS),
    "alibi_level": lambda r, ppl, tol: abs(r("alibi", 2) - r("alibi", 1)) < tol * abs(r("alibi", 1)),
    "bca_raises_rope": lambda r, ppl, tol: r("rope", 2, True) > r("rope", 2),
    "bca_raises_xpos": lambda r, ppl, tol: r("xpos", 2, True) > r("xpos", 2),
    "rope_better_first_L": lambda r, ppl, tol: ppl("rope", "perplexity_first_L") < ppl("alibi", "perplexity_first_L"),
    "rope_worse_past_L": lambda r, ppl, tol: ppl("rope", "perplexity_past_L") > ppl("alibi", "perplexity_past_L"),
}


def reversal_checks(
    records: list[dict],
    head_mode: HeadMode = "mean-scores",
    tolerance: float = LEVEL_TOLERANCE,
    layer: str | int = "mean",
    partial: bool = False,
) -> dict[str, Check]:
    """Does the measured table show the reversal (:data:`CHECK_DESCRIPTIONS`)?

    R is that of ``layer`` ("mean": every layer, as in Table 3; "upper": the layers above the first;
    or an index); perplexities are of the same 2L windows. Each check is evaluated on the seed means,
    and again on each seed that has every value the checks need; ``Check(holds, seeds_holding, seeds)``.
    With ``partial=True``, checks that need an encoding the records lack are left out instead of
    raising (e.g. a sweep point without xPos).
    """
    index = index_records(records, head_mode)

    def cell(encoding: str, k: int, bca: bool) -> dict:
        found = index.get((encoding, k, bca, layer))
        if not found:
            raise LookupError(
                f"reversal_checks needs R({length_label(k)}){'+BCA' if bca else ''} of {encoding!r} "
                f"({head_mode}, layer {layer!r}); the records have none"
            )
        return found

    def on_means(encoding: str, k: int, bca: bool = False) -> float:
        return cell_stat(cell(encoding, k, bca), "resolution").mean

    def ppl_on_means(encoding: str, column: str) -> float:
        stat = cell_stat(cell(encoding, 2, False), column)
        if stat is None:
            raise LookupError(f"reversal_checks needs {column} at 2L of {encoding!r}; the records have none")
        return stat.mean

    names = list(CHECK_DESCRIPTIONS)
    if partial:

        def usable(name: str) -> bool:
            try:
                _CHECKS[name](on_means, ppl_on_means, tolerance)
                return True
            except LookupError:
                return False

        names = [n for n in names if usable(n)]
    try:
        holds = {n: _CHECKS[n](on_means, ppl_on_means, tolerance) for n in names}
    except LookupError as err:
        raise ValueError(str(err).strip("'\"")) from None
    seeds = sorted({s for cell_ in index.values() for s in cell_})
    per_seed = []
    for seed in seeds:
        try:
            per_seed.append(
                {
                    n: _CHECKS[n](
                        lambda e, k, bca=False, seed=seed: cell(e, k, bca)[seed]["resolution"],
                        lambda e, column, seed=seed: cell(e, 2, False)[seed][column],
                        tolerance,
                    )
                    for n in names
                }
            )
        except (LookupError, TypeError):  # this seed lacks a value some check needs
            continue
    return {name: Check(holds[name], sum(p[name] for p in per_seed), len(per_seed)) for name in names}


def format_checks(checks: dict[str, Check]) -> str:
    """One line per check: its description, True/False on the seed means, and the seed count."""
    width = max(len(CHECK_DESCRIPTIONS[name]) for name in checks)
    return "\n".join(
        f"{CHECK_DESCRIPTIONS[name]:<{width}}  {str(c.holds):<5}  (true in {c.seeds_holding} of {c.seeds} seeds)"
        for name, c in checks.items()
    )


def checks_table(checks: dict[str, Check], caption: str = "") -> Table:
    """:func:`format_checks` as a :class:`Table`: each finding, whether it holds on the seed means, and
    in how many seeds."""
    rows = [
        {
            "finding": CHECK_DESCRIPTIONS[name],
            "on the seed means": str(c.holds),
            "seeds": f"{c.seeds_holding} of {c.seeds}",
        }
        for name, c in checks.items()
    ]
    return Table(rows, ["finding", "on the seed means", "seeds"], caption=caption)


def checks_grid(found: dict[tuple[str, str], dict[str, Check]], caption: str = "") -> Table:
    """Several sets of checks (keyed by (layers, head convention)) as one table: a row per finding, a column per
    set, each cell whether it holds on the seed means and in how many seeds ("holds, 3 of 3")."""
    keys = list(found)
    names = list(found[keys[0]])
    if any(list(checks) != names for checks in found.values()):
        raise ValueError("every set of checks must hold the same findings, in the same order")
    columns = [f"{layer}, {head_mode}" for layer, head_mode in keys]

    def cell(c: Check) -> str:
        return f"{'holds' if c.holds else 'not'}, {c.seeds_holding} of {c.seeds}"

    rows = [
        {"finding": CHECK_DESCRIPTIONS[name], **{col: cell(found[k][name]) for col, k in zip(columns, keys)}}
        for name in names
    ]
    return Table(rows, ["finding", *columns], caption=caption)


SMALL_SHIFT = 0.05  # a relative change of R below this is "almost no sink" (notebook 04)


def _sink_shift(r: dict) -> float:
    return abs(r["resolution_sink_free"] - r["resolution"]) / r["resolution"]


def _listing(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def sink_note(
    records: list[dict], encodings: list[str], train_len: int, small: float = SMALL_SHIFT
) -> tuple[dict, str]:
    """How far removing the first-token entries moves each encoding's layer-mean R (the largest relative change
    over seeds, lengths, masks and head conventions), and the Markdown paragraph notebook 04 builds from it:
    which encodings move by less than ``small``, which more and where the largest change is."""
    layer_means = [r for r in records if r["layer"] == "mean"]
    shift = {e: max(_sink_shift(r) for r in layer_means if r["encoding"] == e) for e in encodings}
    below = [e for e, s in shift.items() if s < small]
    above = [e for e, s in shift.items() if s >= small]
    text = (
        f"For {_listing(below)} the first-token entries move the layer-mean $R$ by less than {small:.0%} "
        "(every seed, length, mask and head convention): these small models have almost no first-token sink, "
        "and no conclusion about them depends on the choice."
    )
    if above:
        worst = max((r for r in layer_means if r["encoding"] in above), key=_sink_shift)
        where = f"{worst['run']}, $T = {worst['eval_len'] // train_len}L$, {'with' if worst['bca'] else 'without'} BCA"
        text += (
            f" {_listing(above)}{' is' if len(above) == 1 else ' are'} different: without the sink the layer-mean $R$ "
            f"moves by up to {_sink_shift(worst):.0%} ({where}), so there $R$ describes the first-token sink as much "
            "as position."
        )
    text += (
        " The conclusions of this notebook use $R$ with the sink, $\\hat s$ as Eq. 11 defines it over every key, "
        "the quantity the paper and notebook 03 report; $R$ without the sink stands beside each headline $R$ below."
    )
    return shift, text
