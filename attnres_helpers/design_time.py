"""R at design time for a real RoPE model (issue 41): the model's content correlations from one pass, the
configuration's own form, and no forward pass at the length asked.

For a RoPE model the pre-softmax score of query i on key j is, per layer and head,

    e_ij = scaling · Σ_f Re( q̃_f(i) · conj(k̃_f(j)) · A_f(p_i) · conj(A_f(p_j)) ),   A_f(p) = a · e^{iθ_f p},

with q̃_f, k̃_f the unrotated query and key as complex pairs (`transformers`' halves: dimension f and
f + d/2), θ_f and a the configuration's frequencies and attention factor, and p the position the
configuration gives a token (true positions for pairs closer than a remap's window, far positions beyond
it). Averaged over the pairs at distance n (Eq. 11) this is

    ŝ[n] = scaling · Σ_f Re( C_f(n) · Φ_f(n) ),   C_f(n) = mean over pairs of q̃_f(i) · conj(k̃_f(i − n)),

Φ_f(n) = a² e^{iθ_f d(n)} for a distance map that depends on n alone (PI, YaRN, NTK, ReRoPE, leaky
ReRoPE), and the mean of A_f(p_i) conj(A_f(p_{i−n})) over the pairs where it does not (Self-Extend's
grouped distance depends on i mod G): that mean assumes C_f does not depend on i mod G.

**The model's part** (:class:`Correlations`, head means, from a pass of the model as trained at N ≤ L
tokens): C_f(n) of the bulk pairs (keys ≥ 1) by FFT for n ≤ N − 2; the first-token entries
q̃_f(n) · conj(k̃_f(0)) for n < N, kept apart because key 0 is the attention sink (one entry a distance,
18 nats above the bulk in SmolLM2); and the means of q̃ and k̃ for the far values. **Beyond the measured
range** (plan v4's pre-registered rule) C_f(n) is its far value mean q̃_f · conj(mean k̃_f), the limit of
uncorrelated pairs, the means over tokens 1 … N − 1 (the bulk's; key 0 is its own term); the key-0
entries and the pairs that sink-keeping masks add (keys 1 … s − 1, whose queries lie past the measured
window for every mask of the registry at N ≤ L) take mean q̃_f · conj(k̃_f(j)) in the same way.

**The configuration's part** (:class:`Form`): θ_f and a (near and far), the remap's window and far
positions, and the mask's pair counts. :func:`design_s_hat` combines the two at any T:

    ŝ[n] = (bulk pairs · bulk mean + key-0 pair · its score + added sink pairs · theirs) / all pairs,

and ŝ without the first-token entries drops the key-0 pair (as :func:`metric.sink_free_scores` does).
:func:`score` compares design-time R with measured R across configurations.

**Without the model** (notebook 10): :func:`model_form` writes the configuration's part from the model's RoPE
parameters alone (`transformers`' formulas, tested equal to its rotary module), and the shipped store
(``paths.STORES["design_time"]``) keeps the model's part with C_f(n) on a grid
(:func:`reduction_grid`: dense at small n and near n = N − 1, log-spaced between; linear interpolation back),
the far values as they are, and in its header what the grid costs in design-time R against the full pass
(:mod:`attnres_helpers.design_store`); :mod:`attnres_helpers.design_vs_measured` scores it against a
configurations store and reports it as plan v4's secondary predictor.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from .masks import Mask
from .metric import resolution

FIRST_KEYS = 10  # first keys kept one by one (the registry's most sinks: LM-Infinite's 10)


def complex_pairs(x: torch.Tensor) -> torch.Tensor:
    """(..., T, d) real, `transformers`' halves -> (..., d/2, T) complex128, x_f + i x_{f+d/2}, time last."""
    half = x.shape[-1] // 2
    return torch.complex(x[..., :half].double(), x[..., half:].double()).transpose(-1, -2)


def rotation(theta: torch.Tensor, factor: float, positions: torch.Tensor) -> torch.Tensor:
    """A_f(p) = a · e^{iθ_f p}: (F,) frequencies, (T,) positions -> (F, T) complex128."""
    angle = theta.double()[:, None] * positions.double()[None, :]
    return factor * torch.polar(torch.ones_like(angle), angle)


def unrotate(x: torch.Tensor, theta: torch.Tensor, factor: float) -> torch.Tensor:
    """q or k rotated at positions 0 … T − 1 by RoPE of frequencies θ and factor a -> the unrotated
    complex pairs: (..., T, d) -> (..., d/2, T) complex128. Undone in float64, so a pair's score
    rebuilt with float64 phases is the rotated pair's score to float64 rounding."""
    z = complex_pairs(x)
    return z * rotation(theta, 1.0, torch.arange(z.shape[-1])).conj() / factor


def _correlate(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ_i x(i) · conj(y(i − n)) for n = 0 … T − 1 along the last axis (complex, by FFT, nothing wraps)."""
    T = x.shape[-1]
    n_fft = 1 << (2 * T - 1).bit_length()
    return torch.fft.ifft(torch.fft.fft(x, n=n_fft) * torch.fft.fft(y, n=n_fft).conj())[..., :T]


@dataclass
class Correlations:
    """The model's part, per layer and head-averaged, from ``windows`` passes of N tokens each.

    ``bulk`` (layers, F, N): C_f(n) over the pairs (i, i − n) with i − n ≥ 1, defined for n ≤ N − 2;
    ``key0`` (layers, F, N): q̃_f(n) · conj(k̃_f(0)); ``q_mean``, ``k_mean`` (layers, H, F): means over
    tokens 1 … N − 1; ``first_keys`` (layers, H, J, F): k̃ of keys 0 … J − 1; ``scaling``: the score's."""

    bulk: torch.Tensor
    key0: torch.Tensor
    q_mean: torch.Tensor
    k_mean: torch.Tensor
    first_keys: torch.Tensor
    scaling: float
    windows: int
    far_value: torch.Tensor | None = None  # (layers, F): the far value itself, where q̃ and k̃ are not kept
    far_first_value: torch.Tensor | None = None  # (layers, J, F)
    planar_dtype: torch.dtype = torch.float64  # float32: half the memory traffic, ŝ within ~1e-6 nats (explorer)
    _planar: dict = field(default_factory=dict, repr=False, compare=False)

    def planar(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``bulk`` or ``key0`` as (real, imaginary), each (F, layers, N) contiguous in ``planar_dtype``, made
        once: the layout :func:`_content_times_phase` sums over frequencies fastest in."""
        if name not in self._planar:
            z = getattr(self, name).transpose(0, 1)
            self._planar[name] = tuple(x.to(self.planar_dtype).contiguous() for x in (z.real, z.imag))
        return self._planar[name]

    @property
    def length(self) -> int:
        return self.bulk.shape[-1]

    @property
    def layers(self) -> int:
        return self.bulk.shape[0]

    def far(self) -> torch.Tensor:
        """(layers, F): C_f(∞) = mean over heads of mean q̃_f · conj(mean k̃_f) (plan v4's far value)."""
        if self.far_value is not None:
            return self.far_value
        return (self.q_mean * self.k_mean.conj()).mean(1)

    def far_first(self) -> torch.Tensor:
        """(layers, J, F): mean over heads of mean q̃_f · conj(k̃_f(j)), the far value of key j's pairs."""
        if self.far_first_value is not None:
            return self.far_first_value
        return (self.q_mean[:, :, None, :] * self.first_keys.conj()).mean(1)


class CorrelationSums:
    """Adds up :class:`Correlations` layer by layer and window by window (:meth:`add` each layer's
    unrotated q̃, k̃ (H, F, N) of a window in layer order, then :meth:`result`)."""

    def __init__(self):
        self.layers: list[dict[str, torch.Tensor]] = []
        self.scaling: float | None = None
        self.heads: int | None = None
        self.windows = 0
        self._next = 0

    def add(self, q: torch.Tensor, k: torch.Tensor, scaling: float) -> None:
        H, F, N = q.shape
        if N < 3 or k.shape != q.shape:
            raise ValueError(f"q̃ and k̃ must both be (H, F, N >= 3), got {tuple(q.shape)} and {tuple(k.shape)}")
        if self.scaling is not None and scaling != self.scaling:
            raise ValueError(f"layers differ in scaling ({scaling} against {self.scaling})")
        if self.heads is not None and H != self.heads:
            raise ValueError(f"layers differ in heads ({H} against {self.heads})")
        if self.layers and N != self.layers[0]["bulk"].shape[-1]:
            raise ValueError(f"every pass must have one length: {N} tokens against {self.layers[0]['bulk'].shape[-1]}")
        self.scaling, self.heads = scaling, H
        keys = k.clone()
        keys[..., 0] = 0  # key 0 is its own term
        sums = {
            "bulk": _correlate(q, keys).sum(0),  # (F, N): Σ_h Σ_i q̃(i) conj(k̃(i − n)), i − n ≥ 1
            "key0": (q * k[..., :1].conj()).sum(0),  # (F, N)
            "q_mean": q[..., 1:].mean(-1),  # (H, F)
            "k_mean": k[..., 1:].mean(-1),
            "first_keys": _pad_keys(k[..., :FIRST_KEYS], FIRST_KEYS).transpose(-1, -2),  # (H, J, F)
        }
        if self._next == len(self.layers):
            if self.windows:
                raise ValueError("a window has more layers than the first one")
            self.layers.append(sums)
        else:
            for name, value in sums.items():
                self.layers[self._next][name] = self.layers[self._next][name] + value
        self._next += 1

    def end_window(self) -> None:
        if self._next != len(self.layers) or not self.layers:
            raise ValueError(f"a window gave {self._next} layers, the first gave {len(self.layers)}")
        self.windows += 1
        self._next = 0

    def result(self) -> Correlations:
        if self._next:
            self.end_window()
        if not self.windows:
            raise ValueError("no window was added")
        stack = lambda name: torch.stack([layer[name] for layer in self.layers])  # noqa: E731
        heads, N = self.heads * self.windows, self.layers[0]["bulk"].shape[-1]
        pairs = (N - 1 - torch.arange(N, dtype=torch.float64)).clamp(min=1)  # bulk pairs a window has at n
        return Correlations(
            bulk=stack("bulk") / (heads * pairs),
            key0=stack("key0") / heads,
            q_mean=stack("q_mean") / self.windows,
            k_mean=stack("k_mean") / self.windows,
            first_keys=stack("first_keys") / self.windows,
            scaling=float(self.scaling),
            windows=self.windows,
        )


def _pad_keys(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` zero-padded on its last axis to ``size`` (a pass shorter than FIRST_KEYS tokens)."""
    return torch.nn.functional.pad(x, (0, size - x.shape[-1])) if x.shape[-1] < size else x


@dataclass(frozen=True)
class Form:
    """The configuration's part at one length: near frequencies θ (F,) and factor a; far ones (None:
    the near ones) for a remap's far positions; the remap (``window``, ``far_positions(T)``) or None;
    the mask."""

    theta: torch.Tensor
    factor: float
    mask: Mask
    remap: object | None = None
    theta_far: torch.Tensor | None = None
    factor_far: float | None = None

    def near(self, positions: torch.Tensor) -> torch.Tensor:
        return rotation(self.theta, self.factor, positions)

    def far(self, positions: torch.Tensor) -> torch.Tensor:
        """A_f at far positions, each distinct position rotated once (grouped positions repeat G times)."""
        theta = self.theta if self.theta_far is None else self.theta_far
        distinct, where = torch.unique(positions, return_inverse=True)
        return rotation(theta, self.factor if self.factor_far is None else self.factor_far, distinct)[:, where]


_NEAR: dict = {}  # (θ's bytes, a) -> a² e^{iθ n} for n = 0 … the longest asked (a few, the last used kept)


def near_phase(form: Form, T: int) -> torch.Tensor:
    """a² e^{iθ n} for n = 0 … T − 1, (F, T) complex128: made once per (θ, a) at the longest T asked, and cut
    for a shorter one (an explorer asks the same frequencies at L and 2L, and again as a remap changes)."""
    key = (form.theta.numpy().tobytes(), float(form.factor))
    got = _NEAR.pop(key, None)
    if got is None or got.shape[-1] < T:  # e^{iθ(128 j + k)} = e^{iθ 128 j} e^{iθ k}: two short tables, no long trig
        blocks = -(-T // 128)
        coarse = rotation(form.theta, form.factor, 128 * torch.arange(blocks, dtype=torch.float64))  # (F, blocks)
        fine = rotation(form.theta, form.factor, torch.arange(128, dtype=torch.float64))  # (F, 128)
        got = (coarse[:, :, None] * fine[:, None, :]).reshape(len(form.theta), -1)[:, :T]
    _NEAR[key] = got  # most recently used last
    while len(_NEAR) > 4:
        _NEAR.pop(next(iter(_NEAR)))
    return got[:, :T]


def pair_phase(form: Form, queries: torch.Tensor, keys: torch.Tensor, T: int) -> torch.Tensor:
    """A_f(p_i) · conj(A_f(p_j)) of the listed pairs (i ≥ j) under the form: (F, m) complex128."""
    n = queries - keys
    near = near_phase(form, int(n.max()) + 1)[:, n] if len(n) else form.near(n.double())  # a² e^{iθ n}
    if form.remap is None:
        return near
    pq, pk = form.remap.far_positions(T)
    far = form.far(pq[queries].double()) * form.far(pk[keys].double()).conj()
    return torch.where(n < form.remap.window, near, far)


def _far_phase(form: Form, distance: torch.Tensor) -> torch.Tensor:
    """a_far² e^{iθ_far d} of far pairs at the (float) distances ``d``: (F, len(d)) complex128."""
    return form.far(distance) * (form.factor if form.factor_far is None else form.factor_far)


def bulk_phase(form: Form, T: int) -> torch.Tensor:
    """Φ_f(n): the mean of A_f(p_i) conj(A_f(p_{i−n})) over the bulk pairs at each distance (keys ≥ 1):
    (F, T) complex128. Without a remap a² e^{iθ n}; under one, past its window, the far positions' mean over
    queries n + 1 … T − 1 (exact under the causal and window masks): for ReRoPE and leaky ReRoPE the far
    distance depends on n alone (``pq[n] − pk[0]``); for Self-Extend, n = aG + b gives the far distance
    a + W − W/G, plus 1 for the queries whose offset i mod G is below b, counted in closed form; any other
    rule by one FFT over the far positions."""
    n = torch.arange(T)
    near = near_phase(form, T)
    if form.remap is None:
        return near
    if form.mask.kind == "bca":
        raise ValueError("a remap under BCA is not in the registry: its pairs per distance are not contiguous")
    pq, pk = form.remap.far_positions(T)
    pairs = (T - 1 - n).clamp(min=1).double()
    if form.remap.rule in ("rerope", "leaky-rerope"):
        far = _far_phase(form, pq.double() - pk[0].double())
    elif form.remap.rule == "self-extend":
        G = int(form.remap.params[0])
        a, b = n // G, n % G
        below = lambda X: (X // G) * b + torch.minimum(X % G, b)  # noqa: E731  # i < X with i mod G < b
        share = (below(torch.full_like(n, T)) - below(n + 1)).double() / pairs
        step = rotation(form.theta if form.theta_far is None else form.theta_far, 1.0, torch.ones(1))  # e^{iθ}
        base = _far_phase(form, a.double() + (pq[0].double() - pk[0].double()))
        far = base * ((1 - share) + share * step)
    else:
        keys = form.far(pk.double())
        keys[:, 0] = 0
        far = _correlate(form.far(pq.double()), keys) / pairs
    far = torch.where(n < T - 1, far, torch.zeros_like(far))  # no bulk pair at n = T − 1
    return torch.where(n < form.remap.window, near, far)


def pair_counts(mask: Mask, T: int) -> torch.Tensor:
    """``mask.pair_counts(T)`` (the tests check it), with BCA's counts in closed form: for B ≤ n < 2B one pair
    for each query i ≥ n whose offset i mod B is at least n − B (a count of residues, not a (T, T) table)."""
    return _pair_counts(mask, T).clone()


@functools.lru_cache(maxsize=64)
def _pair_counts(mask: Mask, T: int) -> torch.Tensor:
    if mask.kind != "bca":
        return mask.pair_counts(T)
    B, n = mask.size, torch.arange(T)
    low = (n - B).clamp(min=0)
    at_least = lambda X: (X // B) * (B - low) + (X % B - low).clamp(min=0)  # noqa: E731  # i < X, i mod B >= low
    counts = torch.where(n < B, T - n, torch.where(n < 2 * B, at_least(torch.full_like(n, T)) - at_least(n), 0))
    queries, keys = mask.sink_pairs(T)
    return counts.double().index_add(0, queries - keys, torch.ones(len(queries), dtype=torch.float64))


def approximations(form: Form, T: int, N: int, changed: bool) -> list[str]:
    """What the design-time ŝ at T from a pass of N tokens takes as approximate under ``form`` (``changed``:
    the configuration changes the model's attention at T; then every layer above 0 is approximate)."""
    out = []
    if T > N:  # bulk pairs at n >= N - 1, which the pass has none of
        out.append(f"C_f(n) for n >= {N - 1} is its far value mean q̃·conj(mean k̃) (plan v4's rule)")
    if changed:
        out.append("layers above 0 keep the model as trained's C_f (their q, k change with the configuration)")
    if not form.mask.is_causal_at(T):
        out.append(f"the {form.mask.kind} mask's pairs take C_f(n) of all pairs at n")
    if form.remap is not None and form.remap.rule == "self-extend" and T > form.remap.window:
        out.append("Self-Extend's grouped distance (i mod G) is averaged over the pairs with one C_f(n)")
    if form.mask.sinks > 1 and len(form.mask.sink_pairs(T)[0]):
        out.append(f"the pairs of sink keys 1 to {form.mask.sinks - 1} take their far value")
    return out or ["nothing: the measured pass itself"]


def _content_times_phase(corr: Correlations, name: str, m: int, far: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
    """Re Σ_f C_f(n) · Φ_f(n), (layers, T) float64: C the measured ``corr.<name>`` at n < m, the far value
    (layers, F) from m on; Φ (F, T). Summed frequency by frequency into one (layers, m) array (no
    (layers, F, T) temporary)."""
    re, im = corr.planar(name)  # (F, layers, N)
    out = torch.zeros(re.shape[1], phase.shape[-1], dtype=torch.float64)
    head = torch.zeros(re.shape[1], m, dtype=re.dtype)
    p_re, p_im = (x[:, :m].to(re.dtype).contiguous() for x in (phase.real, phase.imag))
    for f in range(re.shape[0]):
        head.addcmul_(re[f, :, :m], p_re[f])
        head.addcmul_(im[f, :, :m], p_im[f], value=-1.0)
    out[:, :m] = head
    out[:, m:] = (far.to(phase.dtype) @ phase[:, m:]).real
    return out


def content_scores(corr: Correlations, form: Form, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(layers, T) each: the bulk pairs' mean score and key 0's score at each distance under ``form``."""
    N, n = corr.length, torch.arange(T)
    phase = bulk_phase(form, T)
    bulk_mean = corr.scaling * _content_times_phase(corr, "bulk", min(T, N - 1), corr.far(), phase)
    key0_phase = phase if form.remap is None else pair_phase(form, n, torch.zeros_like(n), T)
    key0_score = corr.scaling * _content_times_phase(corr, "key0", min(T, N), corr.far_first()[:, 0], key0_phase)
    return bulk_mean, key0_score


def scores_carry_over(short: Form, long: Form) -> bool:
    """Whether :func:`content_scores` of ``long`` at a longer T, cut to the shorter one, are those of ``short``
    (same frequencies and factors, and a phase of n alone: no remap, or ReRoPE's or leaky ReRoPE's)."""
    same = lambda a, b: (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))  # noqa: E731
    return (
        torch.equal(short.theta, long.theta)
        and short.factor == long.factor
        and same(short.theta_far, long.theta_far)
        and short.factor_far == long.factor_far
        and short.remap == long.remap
        and (short.remap is None or short.remap.rule in ("rerope", "leaky-rerope"))
    )


def design_s_hat(
    corr: Correlations, form: Form, T: int, scores: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Design-time ŝ (layers, T) float64 with and without the first-token entries (-inf where no pair
    is left). C_f(n) past the measured distances is its far value (plan v4's rule). ``scores``: the
    :func:`content_scores` of a longer T to cut (where :func:`scores_carry_over` says they are these)."""
    if T < 2:
        raise ValueError(f"T must be at least 2, got {T}")
    layers, n = corr.layers, torch.arange(T)
    far_first = corr.far_first()  # (layers, J, F)
    bulk_mean, key0_score = (x[:, :T] for x in (scores or content_scores(corr, form, T)))

    base = Mask(form.mask.kind, form.mask.size)
    base_key0 = base.allowed_pairs(n, torch.zeros_like(n)).double()
    key0_count = torch.maximum(base_key0, torch.tensor(float(form.mask.sinks > 0)))
    bulk_count = pair_counts(base, T) - base_key0
    sums = torch.where(bulk_count > 0, bulk_count * bulk_mean, torch.zeros_like(bulk_mean)) + key0_count * key0_score
    extra = torch.zeros(T, dtype=torch.float64)
    queries, keys = form.mask.sink_pairs(T)
    added = keys >= 1  # key 0's added pairs are key0_count's
    if added.any():
        queries, keys = queries[added], keys[added]
        if int(keys.max()) >= FIRST_KEYS:
            raise ValueError(f"masks keeping more than {FIRST_KEYS} first tokens are not supported")
        for j in keys.unique().tolist():  # one key at a time: (layers, F) @ (F, its pairs)
            at = queries[keys == j]
            phase_j = pair_phase(form, at, torch.full_like(at, j), T)
            scores = corr.scaling * (far_first[:, j, :].to(phase_j.dtype) @ phase_j).real
            sums = sums.index_add(1, at - j, scores)
            extra = extra.index_add(0, at - j, torch.ones(len(at), dtype=torch.float64))
    total = bulk_count + key0_count + extra
    inf = torch.tensor(float("-inf"), dtype=torch.float64)
    s_hat = torch.where(total > 0, sums / total.clamp(min=1), inf)
    rest = total - key0_count
    free = torch.where(rest > 0, (sums - key0_count * key0_score) / rest.clamp(min=1), inf)
    return s_hat.expand(layers, T), free.expand(layers, T)


def r_pair(s_hat: torch.Tensor, free: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """R per layer (boundary zero) of design-time ŝ with and without the first-token entries."""
    return resolution(s_hat), resolution(free)


def rope_curve(N: int, head_dim: int = 64, base: float = 10000.0) -> torch.Tensor:
    """Design-time ŝ of unit content (q̃_f = k̃_f = 1 + i, so C_f = 2) under plain RoPE, scaling 1/√d:
    notebook 02's :func:`encodings.rope_score_curve` with scale √d, from this module's formula."""
    F = head_dim // 2
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    unit = torch.full((1, F, N), 2.0 + 0j, dtype=torch.complex128)
    ones = torch.full((1, 1, F), 1.0 + 1.0j, dtype=torch.complex128)
    first = ones[:, :, None].expand(-1, -1, FIRST_KEYS, -1)
    corr = Correlations(unit, unit.clone(), ones, ones, first, head_dim**-0.5, 1)
    return design_s_hat(corr, Form(theta, 1.0, Mask()), N)[0][0]


# --------------------------------------------------------------------------- scored against the measurement


def _rows_spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's ρ (mid-ranks) of each row of x (m, C) with y (C,) or each row of y (m, C); NaN where constant."""
    from scipy.stats import rankdata

    rx, ry = rankdata(x, axis=-1), rankdata(y, axis=-1)
    rx, ry = rx - rx.mean(-1, keepdims=True), ry - ry.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(-1) / np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1))


def score(
    design: Mapping[str, torch.Tensor],
    measured: Mapping[str, torch.Tensor],
    window_r: Mapping[str, torch.Tensor] | None = None,
    resamples: int = 10_000,
    seed: int = 0,
) -> dict:
    """Design-time against measured R, per layer, across the configurations both hold (in ``design``'s
    order; a store's entries give them with :func:`score_rows`): ``ratio`` (C, layers) design/measured,
    ``mean_ratio`` (C,) of the layer means, ``rho`` Spearman's ρ of the layer means across configurations,
    ``rho_layers`` (layers,) the same per layer.
    ``window_r`` (each (W, layers), the per-window measured R, e.g. ``Entry.window_r``): the measured
    layer mean becomes the mean over windows, and ``interval`` is ρ's 95% percentile interval over
    ``resamples`` window-bootstrap resamples (windows drawn jointly for all configurations); with one window
    there is no interval (``interval`` None, ``degenerate`` says why)."""
    names = [name for name in design if name in measured]
    if len(names) < 2:
        raise ValueError(f"need at least 2 configurations in both, got {names}")
    D = torch.stack([torch.as_tensor(design[n]).double() for n in names]).numpy()  # (C, layers)
    M = torch.stack([torch.as_tensor(measured[n]).double() for n in names]).numpy()
    if D.shape != M.shape:
        raise ValueError(f"design R {D.shape} and measured R {M.shape} differ in layers")
    out = {"names": names, "design": D, "measured": M}
    interval = None
    if window_r is not None:
        per_window = np.stack([torch.as_tensor(window_r[n]).double().numpy() for n in names])  # (C, W, layers)
        M = per_window.mean(1)
        out["measured"] = M
        W = per_window.shape[1]
        draws = np.random.default_rng(seed).integers(0, W, size=(resamples, W))
        boot = per_window.mean(-1)[:, draws].mean(-1).T  # (resamples, C): layer-mean R of each resample
        rhos = _rows_spearman(np.broadcast_to(D.mean(1), boot.shape), boot)
        rhos = rhos[np.isfinite(rhos)]
        interval = tuple(np.percentile(rhos, [2.5, 97.5])) if len(rhos) else (math.nan, math.nan)
        out["windows"] = W
        if W < 2:  # every resample is the one window: an interval of zero width that says nothing
            interval = None
            out["degenerate"] = f"no interval: {W} window, so every window-bootstrap resample is that window"
    with np.errstate(invalid="ignore", divide="ignore"):
        out["ratio"] = D / M
        out["mean_ratio"] = D.mean(1) / M.mean(1)
    out["rho"] = float(_rows_spearman(D.mean(1), M.mean(1)))
    out["rho_layers"] = _rows_spearman(D.T, M.T)
    out["interval"] = interval
    return out


# --------------------------------------------------------------------------- the configuration's part, model-free


def rope_frequencies(rope: Mapping, head_dim: int, max_positions: int, T: int) -> tuple[torch.Tensor, float]:
    """θ (F,) float64 and the attention factor a that `transformers` 5's Llama rotary module, built with the
    RoPE parameters ``rope`` (``rope_type`` default, linear, dynamic or yarn; ``rope_theta``; the type's own
    keys) and called at positions 0 … T − 1, rotates by: its formulas, in float32 as it computes them, without
    importing it (the tests check every configuration of the registry against the module itself). Dynamic
    NTK's base grows only where T passes the model's ``max_positions``."""
    kind, base, dim = rope.get("rope_type", "default"), rope["rope_theta"], head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if kind in ("default", "linear"):
        inv = 1.0 / (base**exponents)
        return (inv / rope["factor"] if kind == "linear" else inv).double(), 1.0
    if kind == "dynamic":
        if T <= max_positions:
            return (1.0 / (base**exponents)).double(), 1.0
        factor = rope["factor"]
        seq = torch.tensor(T)
        grown = base * ((factor * seq / max_positions) - (factor - 1)) ** (dim / (dim - 2))
        return (1.0 / (grown**exponents)).double(), 1.0
    if kind == "yarn":
        factor, original = rope["factor"], rope["original_max_position_embeddings"]
        attention = rope.get("attention_factor")
        if attention is None:
            attention = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        fast, slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

        def correction(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction(fast), correction(slow)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos = base ** (torch.arange(0, dim, 2).float() / dim)
        keep = 1 - ramp  # the share of each frequency left as it was (extrapolated)
        inv = (1.0 / (factor * pos)) * (1 - keep) + (1.0 / pos) * keep
        return inv.double(), float(attention)
    raise ValueError(f"RoPE type {kind!r} has no design-time form here (default, linear, dynamic, yarn)")


def model_form(model: Mapping, configuration, train_len: int, T: int) -> Form:
    """The configuration's part at T without the model: ``model`` gives the model's ``rope_parameters``,
    ``head_dim`` and ``max_position_embeddings`` (a design-time store's header keeps them);
    ``configuration`` is an entry of the registry (:class:`.hf.configurations.Configuration`) or any
    object with its ``rope_for``, ``remap_for`` and ``mask_for``. The same form as
    :func:`.hf.design_time.form` reads from the rotary module the configuration gives the model."""
    params = dict(model["rope_parameters"])
    rope = configuration.rope_for(params["rope_theta"], train_len, model["head_dim"]) or params
    theta, factor = rope_frequencies(rope, model["head_dim"], model["max_position_embeddings"], T)
    return Form(theta, factor, configuration.mask_for(train_len), configuration.remap_for(train_len))


def design_r(corr: Correlations, form: Form, T: int, scores=None) -> dict[str, torch.Tensor]:
    """Design-time ``s_hat``, ``s_hat_sink_free`` (layers, T) and ``r``, ``r_sink_free`` (layers,) at T."""
    s_hat, free = design_s_hat(corr, form, T, scores)
    r, r_free = r_pair(s_hat, free)
    return {"s_hat": s_hat, "s_hat_sink_free": free, "r": r, "r_sink_free": r_free}


def design_lengths(corr: Correlations, forms: Mapping[int, Form]) -> dict[int, dict[str, torch.Tensor]]:
    """:func:`design_r` at each T of ``{T: form}``, the content scores of the longest T cut for a shorter one
    wherever :func:`scores_carry_over` allows (the same numbers, once)."""
    longest = max(forms)
    scores = content_scores(corr, forms[longest], longest)
    return {
        T: design_r(corr, form, T, scores if T == longest or scores_carry_over(form, forms[longest]) else None)
        for T, form in sorted(forms.items())
    }
