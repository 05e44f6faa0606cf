"""paths.STORES is the one answer to "where is store X?": every shipped store exists, and no module,
script or notebook spells a store's file name itself."""

import ast
from pathlib import Path

import nbformat

from attnres_helpers.paths import ROOT, STORES


def test_every_shipped_store_exists():
    missing = [name for name, path in STORES.items() if not path.is_file()]
    assert missing == [], f"shipped stores missing: {missing}"


def _string_constants(source: str) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_no_store_file_name_is_written_outside_paths():
    names = {path.name for path in STORES.values()}
    sources = {
        str(p.relative_to(ROOT)): p.read_text()
        for folder in ("attnres_helpers", "scripts")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p.name != "paths.py"
    }
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = [c.source for c in nbformat.read(path, 4).cells if c.cell_type == "code"]
        sources[path.name] = "\n".join(line for cell in code for line in cell.splitlines() if not line.startswith("%"))
    found = [
        f"{where}: {value!r}"
        for where, source in sources.items()
        for value in _string_constants(source)
        if " " not in value and any(value == n or value.endswith("/" + n) for n in names)
    ]
    assert found == [], "a store path spelled outside paths.STORES: " + "; ".join(found)


def test_the_pretrained_registry_names_its_stores_in_stores():
    from attnres_helpers.hf.models import PRETRAINED_MODELS

    assert all(m.store_path == STORES[m.store] and Path(m.store_path).is_file() for m in PRETRAINED_MODELS.values())


def test_notebooks_take_every_path_from_paths():
    """A notebook reaches a repository path through attnres_helpers.paths, never through a re-export of it."""
    import re

    from attnres_helpers import paths

    path_names = {name for name, value in vars(paths).items() if isinstance(value, Path) and name.isupper()}
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, 4).cells:
            if cell.cell_type == "code":
                for module, name in re.findall(r"\b(experiments|specs|runner)\.([A-Z_0-9]+)\b", cell.source):
                    if name in path_names:
                        found.append(f"{path.name}: {module}.{name}")
    assert found == [], found
