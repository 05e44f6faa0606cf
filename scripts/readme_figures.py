"""The README's two figures, made by a command and not by reading (``make figures``): reading a notebook, Run
All included, writes no tracked file.

- ``data/figures/readme_resolution.png``: notebook 01's last figure, what R does with a score profile and R
  against the temperature of the scores;
- ``data/figures/layer_reversal.png``: notebook 03's section 5, R per layer at L, 2L and 4L of the fifteen
  shipped models, read from the shipped store (``data/results/default.safetensors``).

Each figure is drawn by the same function, from the same data, with the same settings as in its notebook, and
written by ``plots.save_png_atomic`` (no version tag, every save setting fixed): the same bytes on every run,
so ``git status`` stays clean unless a figure's function or the store changed.

Usage: python scripts/readme_figures.py [--out DIR]   (default data/figures)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from attnres_helpers.notebook import NOTEBOOK_RC  # noqa: E402
from attnres_helpers.paths import STORES, data_path  # noqa: E402
from attnres_helpers.plots import layer_resolution_figure, readme_resolution_figure, save_png_atomic  # noqa: E402
from attnres_helpers.store import load_curves, load_profiles  # noqa: E402
from attnres_helpers.store import records as store_records  # noqa: E402
from attnres_helpers.tables import pair_table  # noqa: E402


def layer_reversal_figure():
    """Notebook 03's section 5 figure, from the shipped store (the notebook's cells, without the notebook)."""
    profiles, _ = load_profiles(STORES["default"])
    records = store_records(profiles, curves=load_curves(STORES["default"]))
    encodings = [row["encoding"] for row in pair_table(records)]
    return layer_resolution_figure(
        records, encodings, "mean-scores", columns=("R(L)", "R(2L)", "R(4L)"), reference_column="R(2L)"
    )


FIGURES = {"readme_resolution.png": readme_resolution_figure, "layer_reversal.png": layer_reversal_figure}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default: data/figures")
    args = parser.parse_args(argv)
    import matplotlib.pyplot as plt

    plt.rcParams.update(NOTEBOOK_RC)  # the notebooks' settings (notebook.setup)
    out = args.out or data_path("figures")
    out.mkdir(parents=True, exist_ok=True)
    for name, make in FIGURES.items():
        figure = make()
        save_png_atomic(figure, out / name)
        plt.close(figure)
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
