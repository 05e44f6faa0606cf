"""The shipped design-time store (issue 41, notebook 10): the model's part of design-time R, the content
correlations C_f(n) of one pass as trained (:class:`attnres_helpers.design_time.Correlations`), kept on a
grid of distances (:func:`reduction_grid`: dense at small n and near n = N − 1, log-spaced between; linear
interpolation back) with the far values as they are, and in its header what the grid costs in design-time R
against the full pass. Written atomically by :func:`save_store` (``attnres design-time --store``), read and
checked field by field by :func:`load_store`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .design_time import FIRST_KEYS, Correlations

HEADER_KEY = "attnres-design-time"
STORE_FORMAT = 1
# Each part's grid: every n < head, `middle` knots log-spaced from both ends, the last `tail` distances. The
# key-0 entries are one token's each (no mean to keep smooth) and weigh 1/(T − n) of ŝ[n] except at the last
# distances of T = L: a coarser grid costs them nothing measurable (0.84% at most in a layer either way).
GRIDS = {"bulk": {"head": 32, "middle": 136, "tail": 24}, "key0": {"head": 8, "middle": 40, "tail": 24}}
PARTS = tuple(GRIDS)  # C_f(n) of the bulk pairs and the key-0 entries, kept on their grids
CODE_DTYPE = torch.float16  # (real, imaginary) of the values on the grid


def reduction_grid(N: int, head: int, middle: int, tail: int) -> torch.Tensor:
    """The distances kept, (G,) int64 from 0 to N − 1: every n < ``head``, every n ≥ N − ``tail``, and
    ``middle`` knots in between, log-spaced from both ends (in n up to N/2, in N − 1 − n beyond). Near
    n = 0, C_f(n) changes fastest; near n = N − 1 the pass has few pairs at each distance (N − 1 − n), so one
    token's entry is much of the mean there, and at T = L those distances take much of the softmax's weight;
    in between, C_f(n) is the content correlation of thousands of pairs and varies slowly."""
    if N < 2:
        raise ValueError(f"a pass of N >= 2 tokens, got {N}")
    if head + tail + middle >= N:
        return torch.arange(N)
    half = middle // 2 + 2
    up = torch.logspace(math.log10(head), math.log10(N / 2), half, dtype=torch.float64)[1:-1]
    down = N - 1 - torch.logspace(math.log10(tail), math.log10(N / 2), middle - half + 4, dtype=torch.float64)[1:-1]
    knots = torch.cat([torch.arange(head), up.round().long(), torch.tensor([N // 2]), down.round().long()])
    return torch.unique(torch.cat([knots, torch.arange(N - tail, N)]))


def reduce(values: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """(..., N) -> (..., G): each knot's value is the mean of ``values`` over its cell (from the midpoint to
    the knot before to the midpoint to the knot after), so a knot among dense neighbours keeps its own value
    and a sparse knot the local mean (the noise of single distances averaged out)."""
    N = values.shape[-1]
    edges = torch.cat([grid[:1], (grid[:-1] + grid[1:] + 1) // 2, torch.tensor([N])])  # cell k: [edges[k], edges[k+1])
    sums = torch.nn.functional.pad(values.cumsum(-1), (1, 0))
    return (sums[..., edges[1:]] - sums[..., edges[:-1]]) / (edges[1:] - edges[:-1]).to(values.real.dtype)


def expand(values: torch.Tensor, grid: torch.Tensor, N: int) -> torch.Tensor:
    """(..., G) -> (..., N): linear interpolation between the knots (exact at every knot)."""
    n = torch.arange(N)
    right = torch.searchsorted(grid, n).clamp(1, len(grid) - 1)
    left = right - 1
    w = ((n - grid[left]).double() / (grid[right] - grid[left]).double()).clamp(0, 1)
    return values[..., left] * (1 - w) + values[..., right] * w


def _to_code(z: torch.Tensor, dtype=CODE_DTYPE) -> torch.Tensor:
    return torch.stack([z.real, z.imag], -1).to(dtype).contiguous()


def _from_code(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return torch.complex(x[..., 0], x[..., 1])


@dataclass(frozen=True)
class DesignStore:
    """A design-time store: the header (``about``: model, L, the pass, the model's RoPE parameters, the grid's
    settings, the reduction's measured error, the command) and the model's part on the grid."""

    about: dict
    grids: dict[str, torch.Tensor]  # bulk, key0: (G,) int64
    parts: dict[str, torch.Tensor]  # bulk, key0: (layers, F, G) complex128 (decoded)
    far: torch.Tensor  # (layers, F) complex128
    far_first: torch.Tensor  # (layers, J, F)

    @property
    def train_len(self) -> int:
        return self.about["train_len"]

    @property
    def model(self) -> dict:
        """What :func:`model_form` needs of the model."""
        return {k: self.about[k] for k in ("rope_parameters", "head_dim", "max_position_embeddings")}

    def correlations(self) -> Correlations:
        """The model's part at every distance of the pass, interpolated from the grid (:func:`expand`)."""
        N = self.about["pass_len"]
        full = {name: expand(part, self.grids[name], N) for name, part in self.parts.items()}
        none = torch.zeros(0, dtype=torch.complex128)
        return Correlations(
            full["bulk"],
            full["key0"],
            none,
            none,
            none,
            self.about["scaling"],
            self.about["windows"],
            far_value=self.far,
            far_first_value=self.far_first,
        )


def grids(N: int) -> dict[str, torch.Tensor]:
    """Each part's grid for a pass of N tokens (:data:`GRIDS`)."""
    return {name: reduction_grid(N, **settings) for name, settings in GRIDS.items()}


def reduced(corr: Correlations, about: Mapping) -> DesignStore:
    """``corr`` (a full pass) kept on the grids as a store keeps it (float16 codes, decoded): what the
    shipped store gives back, for measuring what the reduction costs before it is written."""
    grid = grids(corr.length)
    parts = {name: _from_code(_to_code(reduce(getattr(corr, name), grid[name]))) for name in PARTS}
    far, far_first = (_from_code(_to_code(x, torch.float32)) for x in (corr.far(), corr.far_first()))
    about = {**about, "pass_len": corr.length, "scaling": corr.scaling, "windows": corr.windows}
    return DesignStore(about, grid, parts, far, far_first)


def save_store(path, corr: Correlations, about: Mapping) -> None:
    """Write ``corr`` on its grids with the header ``about`` (atomically; :func:`load_store` reads it)."""
    import json

    from .files import exclusive, save_safetensors

    grid = grids(corr.length)
    header = {**about, "format": STORE_FORMAT, "pass_len": corr.length, "scaling": corr.scaling}
    header |= {"windows": corr.windows, "layers": corr.layers, "grids": GRIDS}
    tensors = {f"{name}.grid": grid[name].contiguous() for name in PARTS}
    tensors |= {name: _to_code(reduce(getattr(corr, name), grid[name])) for name in PARTS}
    tensors |= {"far": _to_code(corr.far(), torch.float32), "far_first": _to_code(corr.far_first(), torch.float32)}
    _check_about(header)
    _check_tensors(tensors, header)
    with exclusive(path):
        save_safetensors(path, tensors, {HEADER_KEY: json.dumps(header, allow_nan=False)})


ABOUT = {  # header key: (type, what it must be)
    "format": (int, f"{STORE_FORMAT}"),
    "model": (str, "the model's name"),
    "train_len": (int, "L, an integer >= 2"),
    "pass_len": (int, "the pass's tokens, 3 to L"),
    "windows": (int, "passes, >= 1"),
    "layers": (int, "layers, >= 1"),
    "scaling": (float, "the score's scaling, > 0"),
    "head_dim": (int, "an even head size"),
    "max_position_embeddings": (int, "the model's context, >= 1"),
    "rope_parameters": (dict, "the model's RoPE parameters with a numeric rope_theta"),
    "command": (str, "the command that made it"),
}


def _check_about(about) -> None:
    if not isinstance(about, dict):
        raise ValueError(f"the header must be a JSON object, got {type(about).__name__}")
    for key, (kind, what) in ABOUT.items():
        value = about.get(key)
        ok = isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool)
        if ok and key == "format":
            ok = value == STORE_FORMAT
        elif ok and kind in (int, float):
            low = {"train_len": 2, "pass_len": 3, "head_dim": 2}.get(key, 1)
            ok = value > 0 if kind is float else value >= low
        if ok and key == "head_dim":
            ok = value % 2 == 0
        if ok and key == "pass_len":
            ok = value <= about.get("train_len", value)
        if ok and key == "rope_parameters":
            ok = isinstance(value.get("rope_theta"), (int, float)) and not isinstance(value.get("rope_theta"), bool)
        if not ok:
            raise ValueError(f"the header's {key} must be {what}, got {value!r:.80}")


def _check_tensors(tensors: Mapping[str, torch.Tensor], about: Mapping) -> None:
    """Every tensor against the header: names, dtypes, shapes, the grids, finite values."""
    layers, F, N = about["layers"], about["head_dim"] // 2, about["pass_len"]
    layout = {}
    for name in PARTS:
        grid = tensors.get(f"{name}.grid")
        if grid is None or grid.dtype != torch.int64 or grid.ndim != 1 or len(grid) < 2:
            got = "nothing" if grid is None else f"{str(grid.dtype).removeprefix('torch.')} {tuple(grid.shape)}"
            raise ValueError(f"{name}.grid must be int64 (G,) with G >= 2, got {got}")
        if grid[0] != 0 or grid[-1] != N - 1 or not (grid[1:] > grid[:-1]).all():
            raise ValueError(f"{name}.grid must rise strictly from 0 to pass_len - 1 = {N - 1}")
        layout[name] = (CODE_DTYPE, (layers, F, len(grid), 2))
    layout["far"] = (torch.float32, (layers, F, 2))
    layout["far_first"] = (torch.float32, (layers, FIRST_KEYS, F, 2))
    for name, (dtype, shape) in layout.items():
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"{name} is missing")
        if t.dtype != dtype or tuple(t.shape) != shape:
            want = f"{str(dtype).removeprefix('torch.')} {shape}"
            raise ValueError(f"{name} must be {want}, got {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} has NaN or inf")
    stray = sorted(set(tensors) - {*layout, *(f"{name}.grid" for name in PARTS)})
    if stray:
        raise ValueError(f"tensor {stray[0]!r} is not part of the layout")


def load_store(path) -> DesignStore:
    """The design-time store at ``path`` (read by :func:`attnres_helpers.store.open_store`, the one reader of
    every store file); a missing or malformed one is one error naming it and the field."""
    from .store import open_store

    try:
        _, about, tensors = open_store(path, (HEADER_KEY,), "design-time store")
    except FileNotFoundError:
        raise FileNotFoundError(f"design-time store {path} is missing; make it with `{STORE_COMMAND}`") from None
    try:
        _check_about(about)
        _check_tensors(tensors, about)
    except ValueError as err:
        raise ValueError(f"design-time store {path}: {err}") from None
    parts = {name: _from_code(tensors[name]) for name in PARTS}
    grid = {name: tensors[f"{name}.grid"] for name in PARTS}
    return DesignStore(about, grid, parts, _from_code(tensors["far"]), _from_code(tensors["far_first"]))


def _store_command() -> str:
    from .paths import ROOT, STORES

    return f"python -m attnres_helpers design-time --store {STORES['design_time'].relative_to(ROOT)}"


STORE_COMMAND = _store_command()  # makes the shipped store (paths.STORES["design_time"])
