"""Plan v2's further pre-registered tests (secondary_v2): the lookup baseline against a hand computation,
the tests' wiring, and the verdict qualifiers built from the numbers."""

import numpy as np
import pytest

from attnres_helpers import analysis, secondary_v2
from attnres_helpers.analysis import Point


def _point(setting, family, bca, rise, r2l, copy_past=0.0, copy_within=0.0):
    values = {"rise 2L": rise, "R(2L) upper": r2l, "copy past L": copy_past, "copy within L": copy_within}
    return Point(setting, family, bca, values, {})


def test_lookup_baseline_leaves_the_setting_out():
    points = [
        _point("a1", "a", False, 1.0, 0.5),
        _point("a2", "a", False, 3.0, 0.4),
        _point("b1", "b", False, 10.0, 0.3),  # alone in its family: the mean of the other BCA-off settings
        _point("a1", "a", True, 5.0, 0.2),  # BCA twin of a1: its only family-and-mask peer is a2 (BCA on)
        _point("a2", "a", True, 7.0, 0.1),
    ]
    expected = [3.0, 1.0, (1.0 + 3.0) / 2, 7.0, 5.0]
    assert np.allclose(secondary_v2.lookup_baseline(points, "rise 2L"), expected, rtol=0, atol=1e-12)


def test_an_outcome_outside_the_plan_needs_its_sign():
    points = [_point(f"s{i}", "a", False, float(i), float(-i)) for i in range(5)]
    with pytest.raises(ValueError, match=r"outcome 'rise 9L' is not one of plan v2's .*: give its sign"):
        analysis.evaluate_v2(points, analysis.V2_PREDICTOR, "rise 9L", n_resamples=10)


def test_copy_caveat_counts_the_settings_where_the_gain_past_l_is_larger():
    class Curve:
        def __init__(self, g0):
            self.g0 = g0

        def gain(self, gap):
            return self.g0

    points = [
        _point("x", "a", False, 2.0, 0.1, copy_past=0.3, copy_within=0.1),
        _point("y", "a", False, 0.9, 0.2, copy_past=0.1, copy_within=0.2),
        _point("z", "b", False, 1.5, 0.3, copy_past=0.2, copy_within=0.1),
        _point("w", "b", True, 9.0, 0.4, copy_past=9.0, copy_within=0.0),  # BCA on: left out
    ]
    curves = {("r0", False): Curve(-0.1), ("r1", False): Curve(0.2), ("r2", True): Curve(-1.0)}
    caveat = secondary_v2.copy_caveat(points, curves)
    assert (caveat["negative_at_0"], caveat["runs"]) == (1, 2)
    assert (caveat["larger_past"], caveat["settings"]) == (2, 3)
    assert caveat["rise_larger"] == (1.5, 2.0) and caveat["rise_rest"] == (0.9, 0.9)
    assert caveat["rho_copy_rise"] == pytest.approx(1.0, abs=1e-12)
