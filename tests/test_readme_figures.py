"""The README's figures are made by a command (``make figures``: scripts/readme_figures.py), not by reading:
no notebook writes a tracked file when it runs (issue 42: Run All rewrote data/figures/)."""

import json
import re
import subprocess
import sys
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
WRITES = re.compile(r"save_png_atomic\(|\.savefig\(|save_default_image\(")


def test_no_notebook_writes_a_file_into_data():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code":
                found = WRITES.search("".join(cell["source"]))
                assert found is None, f"{path.name} cell {index} writes a file: {found.group(0)}"


def test_the_command_writes_the_readme_figures(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme_figures.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in ("readme_resolution.png", "layer_reversal.png"):
        assert f"](data/figures/{name})" in readme, f"the README no longer shows {name}"
        with Image.open(tmp_path / name) as made, Image.open(ROOT / "data" / "figures" / name) as shipped:
            assert made.size == shipped.size, f"{name}: {made.size}, shipped {shipped.size}"
