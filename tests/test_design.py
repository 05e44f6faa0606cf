"""The house rules of DESIGN.md, checked on the package's source: file sizes, the layering of imports
(no module imports one above it, so there are no cycles), and R computed from a stored ŝ in one place."""

import ast
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGE = ROOT / "attnres_helpers"
MAX_LINES = 650
# Low to high: a module may import its own layer's modules (not its own sub-package's siblings' parents)
# and any lower layer, never a higher one.
LAYERS = [
    {
        "paths",
        "files",
        "torchrun",
        "metric",
        "model",
        "encoding_registry",
        "probe",
        "passkey",
        "masks",
        "data",
        "notebook",
    },  # the teaching core, the repo's files
    {"encodings", "store", "configured_store", "design_time"},
    {"measure", "stats", "hf"},  # measuring: our models, statistics, transformers' models
    {"checkpoints", "train"},  # loading and training (an HF-built checkpoint needs hf's config)
    {"experiments"},  # what is trained, and the one runner
    {
        "analysis",
        "tables",
        "checks",
        "real_model",
        "plots",
        "family_plots",
        "widgets",
        "configured_analysis",
        "copy_tables",
        "configured_plots",
        "secondary_v2",
        "plan_v3_review",
        "plan_v4",
    },  # queries and pictures over stores
    {"__main__", "__init__"},
]
# Modules that may compute R from scores of their own (design-time curves and illustrative profiles),
# against those that read stored ŝ and must ask the store (Profile.layer_resolutions).
STORE_CONSUMERS = [
    "tables.py",
    "checks.py",
    "analysis.py",
    "real_model.py",
    "configured_analysis.py",
    "configured_plots.py",
    "plan_v3_review.py",
    "plan_v4.py",
    "widgets/trained.py",
    "widgets/trained_figure.py",
]
R_FUNCTIONS = {"resolution", "layer_resolution", "average_resolution"}


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def top_name(path: Path) -> str:
    """The first component under the package: 'hf' for hf/attention.py, 'store' for store.py."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def layer_of(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    raise AssertionError(f"module {name!r} is in no layer of tests/test_design.py: add it to DESIGN.md and here")


def package_imports(path: Path) -> set[str]:
    """The top-level package modules ``path`` imports (relative imports resolved), anywhere in the file."""
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(PACKAGE).parts) - 1  # 0 for a module at the top, 1 inside a sub-package
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            up = node.level - 1  # levels above the file's own package
            if up > depth:
                continue
            base = list(path.relative_to(PACKAGE).parts[: depth - up]) if depth - up > 0 else []
            target = base + (node.module.split(".") if node.module else [])
            if target:
                found.add(target[0])
            else:  # "from .. import files": the names are modules
                found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_is_over_650_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_one_above_it(path):
    own = top_name(path)
    imported = package_imports(path) - {own}
    higher = {name for name in imported if layer_of(name) > layer_of(own)}
    same = {name for name in imported if layer_of(name) == layer_of(own)}
    assert not higher, f"{path.name} ({own}, layer {layer_of(own)}) imports higher modules {sorted(higher)}"
    if own not in ("__main__", "__init__"):  # within a layer, two sub-packages may not import each other
        assert not same & {"hf", "experiments"}, f"{path.relative_to(PACKAGE)} imports {sorted(same)} of its own layer"


@pytest.mark.parametrize("name", STORE_CONSUMERS)
def test_consumers_of_a_store_ask_it_for_r(name):
    """tables, analysis, real_model and the trained explorer read stored ŝ: they never call metric's R
    functions themselves (a mutation that computes R from raw ŝ in one of them turns this red)."""
    tree = ast.parse((PACKAGE / name).read_text())
    calls = {
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
    }
    assert not calls & R_FUNCTIONS, f"{name} computes R itself ({sorted(calls & R_FUNCTIONS)}): use the store's query"
