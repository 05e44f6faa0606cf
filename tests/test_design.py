"""The house rules of DESIGN.md, checked on the package's source: a cap on file sizes, the layering of imports
(no module imports one above it), no import circle (the layers allow imports within a layer, so this is its own
test), no other module's private names, and R computed from a stored ŝ in one place."""

import ast
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGE = ROOT / "attnres_helpers"
MAX_LINES = 650
# Low to high: a module may import its own layer's modules and any lower layer's, never a higher one's; within a
# layer, only __main__ and __init__ may import a sub-package of that layer (hf, experiments).
LAYERS = [
    {
        "paths",
        "files",
        "torchrun",
        "metric",
        "model",
        "encoding_registry",
        "positions",
        "probe",
        "passkey",
        "masks",
        "data",
        "notebook",
    },  # the teaching core, the repo's files
    {"encodings", "store", "configured_store", "design_time", "design_store"},  # stores and design time
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
        "design_vs_measured",
    },  # queries and pictures over stores
    {"__main__", "__init__", "cli"},  # the command line (cli: its parser, which imports no package module)
]
# The modules that read stored ŝ and must ask the store for R (Profile.layer_resolutions); others may compute R
# from scores of their own (design-time curves, illustrative profiles).
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
    """The store's consumers (tables, checks, the plans' code, real_model, the trained explorer) read stored ŝ:
    they never call metric's R functions themselves (a mutation that computes R from raw ŝ in one of them turns
    this red)."""
    tree = ast.parse((PACKAGE / name).read_text())
    calls = {
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
    }
    assert not calls & R_FUNCTIONS, f"{name} computes R itself ({sorted(calls & R_FUNCTIONS)}): use the store's query"


# ------------------------------------------------------------------------------------------ the import graph


def module_name(path: Path) -> str:
    """The dotted module of ``path`` inside the package: 'hf.fetch', 'experiments' for its __init__, 'store'."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in modules()}


def runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` that can run: all of ``ast.walk`` but the body of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def resolved_imports(path: Path) -> list[tuple[str, list[str]]]:
    """Every import of ``path`` that runs (module level and inside functions, relative and absolute; not
    those under ``if TYPE_CHECKING:``), as (the package module it reads from, '' for the package itself,
    and the names it takes from it); ``import attnres_helpers.x`` takes no names."""
    own = module_name(path)
    package = own.split(".") if path.name == "__init__.py" else own.split(".")[:-1]
    package = [p for p in package if p]
    found = []
    for node in runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "attnres_helpers" or alias.name.startswith("attnres_helpers."):
                    found.append((alias.name.removeprefix("attnres_helpers").lstrip("."), []))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + (node.module.split(".") if node.module else []))
            elif node.module and (node.module == "attnres_helpers" or node.module.startswith("attnres_helpers.")):
                target = node.module.removeprefix("attnres_helpers").lstrip(".")
            else:
                continue
            found.append((target, [alias.name for alias in node.names]))
    return found


def import_edges(path: Path) -> set[str]:
    """The package modules ``path`` imports ('' is the package's own __init__): ``from . import fetch`` in
    hf/ is hf.fetch, ``from .x import y`` is x (and x.y where y is a module). A package's __init__ that a
    module sits inside is left out: Python has run it before the module (``from . import fetch`` does not
    import hf/__init__ again)."""
    own = module_name(path)
    inside = {".".join(own.split(".")[:i]) for i in range(len(own.split(".")))}  # '', 'hf' for hf.fetch
    edges = set()
    for target, names in resolved_imports(path):
        for name in names:
            sub = f"{target}.{name}" if target else name
            if sub in MODULES:
                edges.add(sub)
        if target in MODULES or target == "":
            edges.add(target)
    return edges - inside - {own}


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as the modules around it (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_graph() -> dict[str, set[str]]:
    """Each package module (a sub-package's __init__ included; the package's own is named '') and the
    package modules it imports."""
    return {name: import_edges(path) for name, path in MODULES.items()}


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_imports_are_resolved_as_python_resolves_them():
    graph = package_graph()
    assert "hf.folders" in graph["hf.fetch"] and "experiments.work" in graph["experiments.distributed"]
    assert {"files", "hf.attention"} <= graph["hf.pretrained"]


def test_no_import_cycle_among_the_package_modules():
    """Every import, those inside functions included: a circle made by a deferred import is a circle."""
    cycle = import_cycle(package_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_another_modules_private_name(path):
    """Each module's public names are what others use: no ``from .x import _name``."""
    private = {
        f"{target}.{name}"
        for target, names in resolved_imports(path)
        for name in names
        if name.startswith("_") and target != module_name(path)
    }
    assert not private, f"{path.relative_to(PACKAGE)} imports private names {sorted(private)}"
