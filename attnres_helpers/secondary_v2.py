"""Plan v2's pre-registered tests beyond the two primaries (notebook 05, section 9), each computed as the plan
says, and one baseline a re-analysis asked for after the data (labelled so wherever it is shown).

- the secondary outcome, the rise at 4L, tested like the primary (:func:`analysis.evaluate_v2`);
- the primary predictor with the first-token sink removed (the sink-free R, reported beside R);
- the copy outcome pooled over all configurations, both mask settings (the plan: "reported beside it");
- the RoPE base bound of Men et al. 2024 (6 RoPE settings, BCA off): Spearman's ρ of log(base / base_min(2L))
  with the rise, and its categorical prediction against what the models did;
- after the data: a family × mask lookup, leave one setting out (:func:`lookup_baseline`).
"""

from __future__ import annotations

import numpy as np

from . import analysis
from .analysis import Point
from .stats import spearman, spearman_permutation_test

RISE_4L_SIGN = -1  # as the rise at 2L: support needs ρ(R, rise 4L) < 0


def rise_4l(points: list[Point], **resampling) -> analysis.V2Result:
    """The secondary outcome: the primary predictor against the rise at 4L, tested like the primary."""
    return analysis.evaluate_v2(points, analysis.V2_PREDICTOR, "rise 4L", sign=RISE_4L_SIGN, **resampling)


def sink_free(points: list[Point], outcome: str, **resampling) -> analysis.V2Result:
    """The primary test with the primary predictor's sink-free form (R without the first-token entries)."""
    return analysis.evaluate_v2(points, analysis.V2_PREDICTOR + " sink-free", outcome, **resampling)


def pooled_copy(points: list[Point], **resampling) -> analysis.V2Result:
    """The copy outcome over every configuration, both mask settings (the primary's test is BCA off only)."""
    return analysis.evaluate_v2(points, analysis.V2_PREDICTOR, "copy past L", bca_off_only=False, **resampling)


def base_bound_test(points: list[Point], L: int, outcome: str = "rise 2L", n_resamples: int = 10000, rng=0) -> dict:
    """Men et al.'s bound as a predictor over the RoPE settings (BCA off): ρ(log(base / base_min(2L)), outcome)
    with its two-sided permutation p ("test", a :class:`~attnres_helpers.stats.PermutationTestResult`: exact
    over the 6! orderings of the 6 settings), and its categorical prediction ("keeps 2L" when base >= base_min(2L))
    checked against the outcome: a setting keeps 2L when its perplexity past L is no higher than before L
    (rise <= 1; this reading of "keeps" is this notebook's, written after the data)."""
    rows = analysis.base_bound_table(points, L, (outcome,))
    x, y = [r["log base / bound"] for r in rows], [r[outcome] for r in rows]
    test = spearman_permutation_test(x, y, n_resamples=n_resamples, rng=rng)
    predicted = [r for r in rows if r["predicted to keep 2L"]]
    return {
        "n": len(rows),
        "test": test,
        "predicted_keep": [r["setting"] for r in predicted],
        "kept": [r["setting"] for r in predicted if r[outcome] <= 1.0],
        "lowest_rise_predicted_keep": min(r[outcome] for r in predicted) if predicted else None,
    }


def lookup_baseline(points: list[Point], outcome: str) -> np.ndarray:
    """After the data (a re-analysis's baseline): each configuration's outcome predicted by the mean outcome of
    the *other* settings with the same family and mask setting, or, where its family has no other setting, of
    every other setting with the same mask setting. No value of the configuration itself enters its
    prediction, so this is a fair rival to a predictor measured on the model."""
    y = analysis.column(points, outcome)
    predicted = np.empty(len(points))
    for i, p in enumerate(points):
        same = [j for j, q in enumerate(points) if q.setting != p.setting and q.bca == p.bca and q.family == p.family]
        if not same:
            same = [j for j, q in enumerate(points) if q.setting != p.setting and q.bca == p.bca]
        predicted[i] = y[same].mean()
    return predicted


def rise_qualifiers(result: analysis.V2Result, points: list[Point]) -> list[str]:
    """The sentences a careful reader needs beside the rise verdict, from the numbers: what "beyond the mask"
    means in the plan, the within-family correlations, and the leave-one-setting-out lookup (after the data)."""
    lines = []
    if result.within:
        lines.append(
            f'By the plan\'s definition "beyond the mask" means within BCA off ({result.within[False]}); '
            "it does not mean that R beats the mask indicator."
        )
    if result.within_family:
        parts = ", ".join(
            f"{f} {c.statistic:+.2f} [{c.confidence_interval.low:+.2f}, {c.confidence_interval.high:+.2f}]"
            for f, c in result.within_family.items()
        )
        signs = {np.sign(c.statistic) for c in result.within_family.values()}
        lines.append(f"Within families (BCA off) the signs {'differ' if len(signs) > 1 else 'agree'}: {parts}.")
    lookup = spearman(lookup_baseline(points, result.outcome), analysis.column(points, result.outcome))
    primary = result.primary.statistic  # R's ρ over the same points
    lines.append(
        f"Written after the data: a family × mask lookup that never sees the configuration itself (leave one "
        f"setting out) ranks the outcome with |ρ| = {abs(lookup):.2f}, against R's {abs(primary):.2f}"
        + (": it does as well (within 0.05)." if abs(lookup) >= abs(primary) - 0.05 else ".")
    )
    return lines


def copy_caveat(points: list[Point], curves: dict) -> dict:
    """What the copy gains are, in numbers (BCA off): runs whose gain at g = 0 is negative, the settings whose
    gain past L exceeds their gain within L with their rise at 2L beside the others', and ρ(copy past L, rise 2L)."""
    causal = [c for (_, bca), c in curves.items() if not bca]
    off = [p for p in points if not p.bca]
    past, within, rise = (analysis.column(off, k) for k in ("copy past L", "copy within L", "rise 2L"))
    larger = past > within
    return {
        "negative_at_0": sum(c.gain(0) < 0 for c in causal),
        "runs": len(causal),
        "larger_past": int(larger.sum()),
        "settings": len(off),
        "rise_larger": (float(rise[larger].min()), float(rise[larger].max())) if larger.any() else None,
        "rise_rest": (float(rise[~larger].min()), float(rise[~larger].max())) if (~larger).any() else None,
        "rho_copy_rise": spearman(past, rise),
    }
