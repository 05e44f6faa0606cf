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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from .masks import Mask
from .metric import layer_resolution, resolution

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

    @property
    def length(self) -> int:
        return self.bulk.shape[-1]

    @property
    def layers(self) -> int:
        return self.bulk.shape[0]

    def far(self) -> torch.Tensor:
        """(layers, F): C_f(∞) = mean over heads of mean q̃_f · conj(mean k̃_f) (plan v4's far value)."""
        return (self.q_mean * self.k_mean.conj()).mean(1)

    def far_first(self) -> torch.Tensor:
        """(layers, J, F): mean over heads of mean q̃_f · conj(k̃_f(j)), the far value of key j's pairs."""
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
        theta = self.theta if self.theta_far is None else self.theta_far
        return rotation(theta, self.factor if self.factor_far is None else self.factor_far, positions)


def pair_phase(form: Form, queries: torch.Tensor, keys: torch.Tensor, T: int) -> torch.Tensor:
    """A_f(p_i) · conj(A_f(p_j)) of the listed pairs (i ≥ j) under the form: (F, m) complex128."""
    n = queries - keys
    near = form.near(n.double()) * form.factor  # a² e^{iθ n}
    if form.remap is None:
        return near
    pq, pk = form.remap.far_positions(T)
    far = form.far(pq[queries].double()) * form.far(pk[keys].double()).conj()
    return torch.where(n < form.remap.window, near, far)


def bulk_phase(form: Form, T: int) -> torch.Tensor:
    """Φ_f(n): the mean of A_f(p_i) conj(A_f(p_{i−n})) over the bulk pairs at each distance (keys ≥ 1):
    (F, T) complex128. Without a remap a² e^{iθ n}; under one, past its window, the far positions' mean
    over queries n + 1 … T − 1 (one FFT; exact for any remap under the causal and window masks)."""
    n = torch.arange(T)
    near = form.near(n.double()) * form.factor
    if form.remap is None:
        return near
    if form.mask.kind == "bca":
        raise ValueError("a remap under BCA is not in the registry: its pairs per distance are not contiguous")
    pq, pk = form.remap.far_positions(T)
    keys = form.far(pk.double())
    keys[:, 0] = 0
    pairs = (T - 1 - n).clamp(min=1).double()
    far = _correlate(form.far(pq.double()), keys) / pairs
    return torch.where(n < form.remap.window, near, far)


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


def _content_times_phase(measured: torch.Tensor, m: int, far: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
    """Re Σ_f C_f(n) · Φ_f(n), (layers, T) float64: C the measured (layers, F, ·) at n < m, the far value
    (layers, F) from m on; Φ (F, T)."""
    out = torch.empty(measured.shape[0], phase.shape[-1], dtype=torch.float64)
    out[:, :m] = (measured[..., :m] * phase[:, :m]).real.sum(1)
    out[:, m:] = (far.to(phase.dtype) @ phase[:, m:]).real
    return out


def design_s_hat(corr: Correlations, form: Form, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Design-time ŝ (layers, T) float64 with and without the first-token entries (-inf where no pair
    is left). C_f(n) past the measured distances is its far value (plan v4's rule)."""
    if T < 2:
        raise ValueError(f"T must be at least 2, got {T}")
    N, layers = corr.length, corr.layers
    n = torch.arange(T)
    far_first = corr.far_first()  # (layers, J, F)
    bulk_mean = corr.scaling * _content_times_phase(corr.bulk, min(T, N - 1), corr.far(), bulk_phase(form, T))
    key0_phase = pair_phase(form, n, torch.zeros_like(n), T)
    key0_score = corr.scaling * _content_times_phase(corr.key0, min(T, N), far_first[:, 0], key0_phase)

    base = Mask(form.mask.kind, form.mask.size)
    base_key0 = base.allowed_pairs(n, torch.zeros_like(n)).double()
    key0_count = torch.maximum(base_key0, torch.tensor(float(form.mask.sinks > 0)))
    bulk_count = base.pair_counts(T) - base_key0
    sums = torch.where(bulk_count > 0, bulk_count * bulk_mean, torch.zeros_like(bulk_mean)) + key0_count * key0_score
    extra = torch.zeros(T, dtype=torch.float64)
    queries, keys = form.mask.sink_pairs(T)
    added = keys >= 1  # key 0's added pairs are key0_count's
    if added.any():
        queries, keys = queries[added], keys[added]
        if int(keys.max()) >= FIRST_KEYS:
            raise ValueError(f"masks keeping more than {FIRST_KEYS} first tokens are not supported")
        phase = pair_phase(form, queries, keys, T)  # (F, m)
        scores = corr.scaling * (far_first[:, keys, :].transpose(-1, -2) * phase).real.sum(1)  # (layers, m)
        sums = sums.index_add(1, queries - keys, scores)
        extra = extra.index_add(0, queries - keys, torch.ones(len(keys), dtype=torch.float64))
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


def measured_r(entries: Mapping[str, object], sink: bool = True) -> dict[str, torch.Tensor]:
    """Measured R per layer (layers,) of configurations-store entries (:class:`configured_store.Entry`,
    plan v4 on), by the store's own query: ``entry.profile().layer_resolutions(sink=sink)``."""
    return {name: entry.profile().layer_resolutions(sink=sink) for name, entry in entries.items()}


def r_of_s_hat(s_hat: torch.Tensor) -> torch.Tensor:
    """R per layer (mean-scores, boundary zero) of any measured ŝ, (layers, T) head means or (layers, H, T)."""
    s_hat = torch.as_tensor(s_hat).double()
    return layer_resolution(s_hat[:, None] if s_hat.ndim == 2 else s_hat)


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
    order): ``ratio`` (C, layers) design/measured, ``mean_ratio`` (C,) of the layer means, ``rho``
    Spearman's ρ of the layer means across configurations, ``rho_layers`` (layers,) the same per layer.
    ``window_r`` (each (W, layers), the per-window measured R, e.g. ``Entry.window_r``): the measured
    layer mean becomes the mean over windows, and ``interval`` is ρ's 95% percentile interval over
    ``resamples`` window-bootstrap resamples (windows drawn jointly for all configurations)."""
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
    with np.errstate(invalid="ignore", divide="ignore"):
        out["ratio"] = D / M
        out["mean_ratio"] = D.mean(1) / M.mean(1)
    out["rho"] = float(_rows_spearman(D.mean(1), M.mean(1)))
    out["rho_layers"] = _rows_spearman(D.T, M.T)
    out["interval"] = interval
    return out
