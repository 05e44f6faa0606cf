"""Design-time curves: closed forms, derivations checked against explicit vectors, the registry, bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnres_helpers.encodings import (
    DESIGN_CURVES,
    SCALE_LIMIT,
    alibi_score_curve,
    alibi_slopes,
    curve_pair,
    default_params,
    kerple_log_score_curve,
    resolution_pair,
    rope_score_curve,
    score_curve,
    sinusoidal_score_curve,
    t5_buckets,
    t5_score_curve,
    xpos_score_curve,
)
from attnres_helpers.metric import resolution


def geometric_resolution(x: float, N: int, boundary: str = "zero") -> float:
    """R of e^{s[n]} ∝ x^n over n = 0..N-1, summed by hand (Eq. 3)."""
    r_zero = (1 - x) ** 2 * (1 + x ** (2 * N - 1)) / ((1 - x**N) ** 2 * (1 + x))
    last = x ** (N - 1) * (1 - x) / (1 - x**N)  # p_{N-1}
    return r_zero if boundary == "zero" else r_zero - last**2


def rotation(angle: float) -> np.ndarray:
    return np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])


def rotate(v: np.ndarray, position: int, theta: np.ndarray) -> np.ndarray:
    """RoPE as written (Su et al. eq. 13): each pair (v_2i, v_2i+1) rotated by position · θ_i."""
    return np.concatenate([rotation(position * t) @ v[2 * i : 2 * i + 2] for i, t in enumerate(theta)])


# --------------------------------------------------------------------------- closed forms


@settings(max_examples=40, deadline=None)
@given(
    slope=st.floats(0.01, 2.0),
    scale=st.floats(0.1, 3.0),
    N=st.integers(2, 300),
    boundary=st.sampled_from(["zero", "drop"]),
)
def test_alibi_single_slope_matches_geometric_closed_form(slope, scale, N, boundary):
    s = score_curve("alibi", N, slope=slope, scale=scale)  # (N,)
    x = math.exp(-slope * scale)
    assert float(resolution(s, boundary)) == pytest.approx(geometric_resolution(x, N, boundary), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("heads", [1, 8, 12])
def test_alibi_heads_under_both_head_conventions(heads):
    L, slopes = 256, alibi_slopes(heads)
    mean_scores = resolution_pair("alibi", L, head_mode="mean-scores", heads=heads)
    mean_r = resolution_pair("alibi", L, head_mode="mean-R", heads=heads)
    for got, N in zip(mean_scores, (L, 2 * L)):  # mean of linear biases = one bias with the mean slope
        assert got == pytest.approx(geometric_resolution(math.exp(-slopes.mean()), N), rel=1e-9)
    for got, N in zip(mean_r, (L, 2 * L)):
        assert got == pytest.approx(np.mean([geometric_resolution(math.exp(-m), N) for m in slopes]), rel=1e-9)
    assert score_curve("alibi", 16, heads=heads).shape == (heads, 16)


def test_alibi_slopes_follow_the_official_sequence():
    np.testing.assert_allclose(alibi_slopes(8), [2.0**-k for k in range(1, 9)])
    twelve = [2.0**-k for k in range(1, 9)] + [2.0**-k for k in (0.5, 1.5, 2.5, 3.5)]  # 8, then every other of 16
    np.testing.assert_allclose(alibi_slopes(12), twelve)


def test_rope_equals_rotated_ones_under_scaled_dot_product():
    d, base, N, m = 16, 100.0, 40, 57
    theta = base ** (-np.arange(0, d, 2) / d)
    ones = np.ones(d)
    explicit = [rotate(ones, m, theta) @ rotate(ones, m - n, theta) / math.sqrt(d) for n in range(N)]
    np.testing.assert_allclose(rope_score_curve(N, head_dim=d, base=base, scale=math.sqrt(d)), explicit, atol=1e-12)


@pytest.mark.parametrize("scale", [0.5, 8.0])
def test_rope_is_scale_times_mean_cosine(scale):
    d, base, N = 64, 10000.0, 300
    by_hand = [scale * sum(math.cos(n * base ** (-2 * i / d)) for i in range(d // 2)) / (d // 2) for n in range(N)]
    np.testing.assert_allclose(score_curve("rope", N, scale=scale), by_hand, atol=1e-12)
    assert score_curve("rope", N, scale=scale)[0] == pytest.approx(scale)


def test_rope_random_alignment_is_rho_times_the_ones_curve():
    d, base, rho, samples = 8, 10.0, 0.6, 40000
    theta = base ** (-np.arange(0, d, 2) / d)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((samples, d))
    k = rho * q + math.sqrt(1 - rho**2) * rng.standard_normal((samples, d))  # corr(q_j, k_j) = rho
    for n in (0, 1, 3, 7):
        rotated = np.stack([rotate(row, n, theta) for row in k[:4000]])  # q·R_n k over a subsample
        monte_carlo = np.mean(np.sum(q[:4000] * rotated, axis=1)) / math.sqrt(d)
        expected = rope_score_curve(8, head_dim=d, base=base, rho=rho, scale=math.sqrt(d))[n]
        assert monte_carlo == pytest.approx(expected, abs=0.15)  # MC std ≈ 0.02
    np.testing.assert_allclose(rope_score_curve(64, rho=rho), rho * rope_score_curve(64))


def test_xpos_equals_explicitly_scaled_and_rotated_ones():
    d, base, gamma, B, N, m = 8, 10000.0, 0.4, 16.0, 30, 45
    theta = base ** (-np.arange(0, d, 2) / d)
    zeta = np.repeat((np.arange(0, d, 2) / d + gamma) / (1 + gamma), 2)  # (d,), per coordinate
    ones = np.ones(d)
    explicit = [
        rotate(ones * zeta ** (m / B), m, theta) @ rotate(ones * zeta ** (-(m - n) / B), m - n, theta) / 2
        for n in range(N)
    ]
    np.testing.assert_allclose(
        xpos_score_curve(N, head_dim=d, base=base, gamma=gamma, scale_base=B, scale=d / 2), explicit, atol=1e-10
    )


def test_xpos_tends_to_rope_as_gamma_grows():
    rope = rope_score_curve(2048)
    gaps = [np.abs(xpos_score_curve(2048, gamma=g) - rope).max() for g in (1.0, 1e2, 1e4, 1e6)]
    assert all(later < earlier for earlier, later in zip(gaps, gaps[1:]))
    assert gaps[-1] < 1e-4
    assert gaps[0] > 0.5  # and at a modest gamma it really is different


def test_sinusoidal_curve_is_the_rope_curve_and_the_pe_dot_product():
    np.testing.assert_array_equal(
        sinusoidal_score_curve(500, head_dim=32, base=500.0, scale=3.0),
        rope_score_curve(500, head_dim=32, base=500.0, scale=3.0),
    )
    d, m, N = 16, 70, 50
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)

    def pe(pos):  # Vaswani et al.: sin on even, cos on odd coordinates
        return np.ravel(np.column_stack([np.sin(pos * omega), np.cos(pos * omega)]))

    explicit = [pe(m) @ pe(m - n) / (d / 2) for n in range(N)]
    np.testing.assert_allclose(sinusoidal_score_curve(N, head_dim=d, scale=1.0), explicit, atol=1e-12)


@pytest.mark.parametrize("N", [2, 17, 1024])
def test_nope_is_flat_whatever_the_scale(N):
    for scale in (0.0, 1.0, 4.0):
        s = score_curve("nope", N, scale=scale)
        assert float(resolution(s, "zero")) == pytest.approx(1 / N**2, rel=1e-12)
        assert float(resolution(s, "drop")) == pytest.approx(0.0, abs=1e-15)
    assert resolution_pair("nope", N, boundary="zero") == pytest.approx((1 / N**2, 1 / (2 * N) ** 2))


def test_kerple_forms():
    n = np.arange(100)
    np.testing.assert_allclose(kerple_log_score_curve(100, p=2.0, a=0.5, scale=1.5), -3.0 * np.log(1 + 0.5 * n))
    np.testing.assert_allclose(score_curve("kerple-power", 100, p=1.0, a=0.25), score_curve("alibi", 100, slope=0.25))
    np.testing.assert_allclose(score_curve("kerple-power", 100, p=2.0, a=0.5, scale=2.0), -(n**2.0))


def test_t5_buckets_match_the_bucketing_formula():
    b = t5_buckets(4096)  # 32 buckets, 16 exact, log-spaced to 128
    np.testing.assert_array_equal(b[:16], np.arange(16))
    assert (b[16], b[32], b[64], b[127], b[128], b[4095]) == (16, 21, 26, 31, 31, 31)  # 16 + ⌊16·log(n/16)/log 8⌋
    assert np.all(np.diff(b) >= 0)
    np.testing.assert_allclose(score_curve("t5", 4096, bias_decay=0.5, scale=2.0), -b)


def test_t5_flat_tail_lowers_resolution_with_length():
    r_L, r_2L = resolution_pair("t5", 1024)
    assert r_2L < r_L


def test_resolution_pair_is_r_over_both_prefixes():
    for name in DESIGN_CURVES:
        curve = score_curve(name, 600)
        expected = [float(resolution(c if c.ndim == 1 else c.mean(0))) for c in (curve[..., :300], curve)]
        assert resolution_pair(name, 300) == pytest.approx(expected, rel=1e-12, abs=1e-15)


# --------------------------------------------------------------------------- registry


def test_every_registry_range_is_valid_and_every_default_inside_it():
    for name, encoding in DESIGN_CURVES.items():
        assert encoding.params, name
        assert "scale" in encoding.params, f"{name} has no scale"
        for key, p in encoding.params.items():
            assert p.low < p.high and p.step > 0, (name, key)
            assert p.low <= p.default <= p.high, (name, key)
            assert p.kind in ("float", "int", "log"), (name, key)
            if p.kind == "log":
                assert p.low > 0
                steps = (math.log10(p.default) - math.log10(p.low)) / p.step
            else:
                steps = (p.default - p.low) / p.step
            assert steps == pytest.approx(round(steps), abs=1e-9), f"{name}.{key} default is off the slider grid"
            if p.kind == "int":
                assert all(float(v).is_integer() for v in (p.default, p.low, p.high, p.step)), (name, key)
            p.check(key, p.default)
            p.check(key, p.low)
            p.check(key, p.high)


def test_registry_defaults_are_the_function_defaults():
    for name, encoding in DESIGN_CURVES.items():
        np.testing.assert_array_equal(score_curve(name, 64), encoding.curve(64), err_msg=name)
        assert default_params(name) == {k: p.default for k, p in encoding.params.items()}


def test_every_encoding_responds_to_scale_except_nope():
    for name in DESIGN_CURVES:
        low, high = DESIGN_CURVES[name].params["scale"].default, 2 * DESIGN_CURVES[name].params["scale"].default
        moved = resolution_pair(name, 256, scale=low) != resolution_pair(name, 256, scale=high)
        assert moved == (name != "nope"), name


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: score_curve("rope", 1), "N must be an integer >= 2"),
        (lambda: score_curve("alibi", 0), "N must be an integer >= 2"),
        (lambda: score_curve("rope", 2.5), "N must be an integer"),
        (lambda: resolution_pair("rope", 1), "L must be an integer >= 2"),
        (lambda: rope_score_curve(16, head_dim=63), "head_dim must be an even integer"),
        (lambda: score_curve("xpos", 16, head_dim=63), "head_dim must be an even integer"),
        (lambda: rope_score_curve(16, base=1.0), "base must be > 1"),
        (lambda: sinusoidal_score_curve(16, base=0.5), "base must be > 1"),
        (lambda: score_curve("rope", 16, base=5.0), r"base=5 is outside its range \[10, 1e\+07\]"),
        (lambda: score_curve("alibi", 16, slope=-0.1), "slope must be >= 0"),
        (lambda: xpos_score_curve(16, gamma=0.0), "gamma must be > 0"),
        (lambda: xpos_score_curve(16, gamma=-1.0), "gamma must be > 0"),
        (lambda: score_curve("xpos", 16, gamma=20.0), r"gamma=20 is outside its range \[0.05, 10\]"),
        (lambda: score_curve("rope", 16, scale=100.0), r"scale=100 is outside its range \[0, 32\]"),
        (lambda: score_curve("rope", 16, scale=math.nan), "scale must be a finite number"),
        (lambda: score_curve("rope", 16, rho=1.5), r"rho=1.5 is outside its range \[-1, 1\]"),
        (lambda: score_curve("alibi", 16, heads=0), r"heads=0 is outside its range \[1, 64\]"),
        (lambda: score_curve("alibi", 16, heads=2.5), "heads must be an integer"),
        (lambda: score_curve("kerple-power", 16, p=3.0), r"p=3 is outside its range"),
        (
            lambda: score_curve("t5", 16, num_buckets=128, max_distance=8),
            "max_distance must exceed num_buckets // 2 = 64",
        ),
        (
            lambda: score_curve("rope", 16, gamma=0.4),
            "rope has no parameter 'gamma'; its parameters: head_dim, base, rho, scale",
        ),
        (
            lambda: score_curve("roformer", 16),
            "unknown encoding 'roformer'; known encodings: sinusoidal, rope, xpos, alibi, nope, kerple-log, "
            "kerple-power, t5",
        ),
        (lambda: resolution_pair("rope", 16, boundary="open"), "unknown boundary"),
        (lambda: resolution_pair("alibi", 16, head_mode="max"), "unknown head_mode"),
    ],
)
def test_bad_parameters_raise_value_errors_that_name_them(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ------------------------------------------------------------ bad input at the door (adversarial review, round 2)


@pytest.mark.parametrize("name", [["rope"], ("rope",), None, 3])
def test_score_curve_name_must_be_a_string(name):
    with pytest.raises(ValueError, match="must be a string.*known encodings: sinusoidal, rope, xpos, alibi"):
        score_curve(name, 8)


# --- 6. upper bounds on scale-like parameters ---------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: score_curve("alibi", 16, slope=1e308), r"slope must lie in \[0, 1e\+06\], got 1e\+308"),
        (lambda: alibi_score_curve(16, slope=1e7), r"slope must lie in \[0, 1e\+06\]"),
        (lambda: alibi_score_curve(16, scale=1e308), r"scale must lie in \[-1e\+06, 1e\+06\]"),
        (lambda: rope_score_curve(16, scale=-1e308), r"scale must lie in \[-1e\+06, 1e\+06\]"),
        (lambda: kerple_log_score_curve(16, p=1e308, scale=1e308), r"p must lie in \[0, 1e\+06\]"),
        (lambda: kerple_log_score_curve(16, a=1e300), r"a must lie in \[0, 1e\+06\]"),
        (lambda: t5_score_curve(16, bias_decay=1e300), r"bias_decay must lie in \[0, 1e\+06\]"),
    ],
)
def test_scale_like_parameters_have_a_finite_upper_bound(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_largest_allowed_slope_still_gives_a_finite_resolution():
    assert resolution(score_curve("alibi", 4096, slope=SCALE_LIMIT, scale=1.0)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="slope must be >= 0"):  # the lower bound's message is unchanged
        score_curve("alibi", 16, slope=-0.1)


# --- 7. curve_pair needs 2L distances -----------------------------------------------------


def test_curve_pair_refuses_a_curve_that_is_not_2L_long():
    curve = score_curve("rope", 16)
    assert curve_pair(curve, 8) == resolution_pair("rope", 8)
    for L in (16, 20, 5):
        with pytest.raises(ValueError, match=rf"2L = {2 * L} distances .* for L = {L}, got 16"):
            curve_pair(curve, L)
    with pytest.raises(ValueError, match=r"2L = 32 distances"):
        curve_pair(score_curve("alibi", 16), 16)  # (H, N) too
    with pytest.raises(ValueError, match="L must be an integer >= 2"):
        curve_pair(curve, 1)


# --- 8. messages name the L the user gave -------------------------------------------------
