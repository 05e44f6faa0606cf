"""Where the repository's files are (the shipped data/, the git-ignored runs/ and model cache), and
which command makes each folder of trained runs and the store its measurements go to.

The package can be installed without the repository (a wheel carries no data/), so the root is, in
order: ``$ATTNRES_ROOT``; the folder above the package when it holds ``data/corpus``; the first folder
at or above the working directory that holds ``data/corpus``. The model cache (weights never go into
git) is ``$ATTNRES_CACHE``, else ``<root>/.cache``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MARKER = Path("data") / "corpus"


def _find_root() -> Path:
    if os.environ.get("ATTNRES_ROOT"):
        return Path(os.environ["ATTNRES_ROOT"]).expanduser().resolve()
    above_package = Path(__file__).resolve().parent.parent
    for candidate in (above_package, *[Path.cwd(), *Path.cwd().parents]):
        if (candidate / MARKER).is_dir():
            return candidate
    return above_package  # files are then reported missing, each with the command that makes it


ROOT = _find_root()
DATA = ROOT / "data"
RUNS = ROOT / "runs"
CACHE = Path(os.environ["ATTNRES_CACHE"]).expanduser() if os.environ.get("ATTNRES_CACHE") else ROOT / ".cache"


def data_path(*parts: str) -> Path:
    """A path inside the shipped data/ folder."""
    return DATA.joinpath(*parts)


CHECKPOINTS = DATA / "checkpoints"  # the fifteen shipped models (reproduce)
HF_CHECKPOINTS = DATA / "hf_checkpoints"  # seed 0 of the HF Llama and BLOOM (hf-train)
FAMILY_RUNS = RUNS / "family"  # plan v1's family, trained here (git-ignored)
FAMILY_V2_RUNS = RUNS / "family_v2"  # plan v2's family, trained here (git-ignored)
HF_RUNS = RUNS / "hf"  # the HF architectures, trained here (git-ignored)
RESULTS = DATA / "results"
REPRODUCE_COMMAND = "python -m attnres_helpers reproduce"
HF_COMMAND = "python -m attnres_helpers hf-train"
FAMILY_COMMAND = "python -m attnres_helpers family"
FAMILY_V2_COMMAND = "python -m attnres_helpers family-v2"
CONFIGURATIONS_COMMAND = "python -m attnres_helpers reproduce configurations"  # plan v4's run and store
CONFIGURATIONS_RUNS = RUNS / "configurations-v4"  # <model>/<configuration>/<T>/window-<w>, git-ignored
# Every shipped store, by name: the one place that says where each is. Specs, commands, scripts, tests and
# notebooks read it; the command that makes each is in brackets.
STORES = {
    "default": RESULTS / "default.safetensors",  # the fifteen shipped models, notebooks 03 and 04 (reproduce)
    "family": RESULTS / "family.safetensors",  # plan v1's family, notebook 05, exploratory (family)
    "family_v2": RESULTS / "family_v2.safetensors",  # plan v2's family, notebook 05 (family-v2)
    "hf": RESULTS / "hf.safetensors",  # transformers' architectures trained here, notebook 06 (hf-train)
    "large": RESULTS / "large.safetensors",  # the GPU-trained configuration, notebook 03 (scripts/gpu_runs.py)
    "copy_control": RESULTS / "copy_control.safetensors",  # the copy probe's scrambled control (copy-control)
    "pretrained": RESULTS / "pretrained.safetensors",  # SmolLM2-135M-Instruct, notebook 07 (measure-pretrained)
    "gemma3": RESULTS / "gemma3.safetensors",  # Gemma 3 270M, notebook 07 (measure-pretrained)
    "sinks": RESULTS / "sinks.safetensors",  # does a real model's sink follow its token? notebook 07 (sinks)
    "configurations": RESULTS / "configurations.safetensors",  # plan v3, notebook 08 (configurations at 4627c06)
    "configurations_v4": RESULTS / "configurations_v4.safetensors",  # plan v4, notebook 08 (configurations)
    "design_time": RESULTS / "design_time.safetensors",  # SmolLM2's C_f(n) on a grid, notebook 10 (hf.design_time)
    "round2": DATA / "sweep" / "round2.safetensors",  # the GPU sweep's second round (scripts/gpu_runs.py)
}
CONFIGURATIONS_STORE = STORES["configurations"]
CONFIGURATIONS_V4_STORE = STORES["configurations_v4"]
SINKS = STORES["sinks"]
CONFIGURATIONS_PLAN = RESULTS / "configurations_plan_v3.md"
CONFIGURATIONS_PLAN_V4 = RESULTS / "configurations_plan_v4.md"
# Each folder of trained runs: the command that makes it, and the store its measurements go to.
RUN_FOLDERS = {
    HF_CHECKPOINTS: (HF_COMMAND, STORES["hf"]),
    HF_RUNS: (HF_COMMAND, STORES["hf"]),
    FAMILY_V2_RUNS: (FAMILY_V2_COMMAND, STORES["family_v2"]),
    FAMILY_RUNS: (FAMILY_COMMAND, STORES["family"]),
    CHECKPOINTS: (REPRODUCE_COMMAND, STORES["default"]),
}


def made_by(run_dir: Path) -> tuple[str, Path]:
    """(command, store) for a run folder or a root of runs, for error messages and hints: by the folder it
    is in (:data:`RUN_FOLDERS`), else by its config.json (a `transformers` architecture, in it or in a run
    folder one level down, is ``hf-train``'s; read only to choose the hint, and only if it is a small
    regular file), else ``reproduce``'s."""
    run_dir = Path(run_dir).absolute()
    for root, made in RUN_FOLDERS.items():
        if run_dir == root.absolute() or root.absolute() in run_dir.parents:
            return made
    for config in [run_dir / "config.json", *sorted(run_dir.glob("*/config.json"))[:64]]:
        try:
            if not config.is_symlink() and config.is_file() and config.stat().st_size < 1 << 20:
                model = json.loads(config.read_text()).get("model")
                if isinstance(model, dict) and "architecture" in model:
                    return RUN_FOLDERS[HF_CHECKPOINTS]
        except (OSError, ValueError, AttributeError):
            pass
    return RUN_FOLDERS[CHECKPOINTS]


def first_commit(path: Path) -> str:
    """The commit that added ``path`` to git ("<hash> <date>"), or why it cannot be told here (not a
    clone, git missing, the file not committed): the order of a plan and its data, printed by notebooks."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "log", "--diff-filter=A", "--format=%h %ad", "--date=short", "--", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "git is not available here"
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else "not in git here"
