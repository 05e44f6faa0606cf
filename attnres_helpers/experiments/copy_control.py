"""The copy probe's scrambled control on notebook 03's shipped models (issue 27, after plan v2's data).

For every shipped checkpoint (verified by hash first) and mask, the copy probe's NLL of the second span
in the copy window and in the **scrambled** window (:meth:`probe.CopyProbes.scrambled`: the first span's
own bytes in a random order), on the probes and gaps of plan v2. The difference is what the *order* of
the first copy is worth. Stored as copy curves (:func:`store.load_curves` reads them; the control is the
scrambled window) in ``data/results/copy_control.safetensors``:

    attnres reproduce copy-control
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..checkpoints import load_checkpoint
from ..data import load_splits
from ..files import exclusive, save_safetensors, sha256_file
from ..paths import STORES
from ..probe import copy_curve, copy_probes, gaps_for
from .specs import Dataset, default_dataset

COPY_CONTROL_STORE = STORES["copy_control"]
COPY_CONTROL_COMMAND = "python -m attnres_helpers copy-control"


def measure_copy_control(dataset: Dataset | None = None, out: Path = COPY_CONTROL_STORE, progress: bool = True) -> Path:
    """Both NLLs of the scrambled control for every run of ``dataset`` (default: notebook 03's), into ``out``,
    holding its lock (:func:`files.exclusive`) from the start, so a second command on it is refused at once."""
    with exclusive(Path(out)):
        return _measure_copy_control(dataset or default_dataset(), Path(out), progress)


def _measure_copy_control(dataset: Dataset, out: Path, progress: bool) -> Path:
    _, val_tokens = load_splits()
    tensors, runs = {}, {}
    for spec in tqdm(dataset.specs, desc="copy control", disable=not progress):
        model = load_checkpoint(spec.out_dir)
        gaps = gaps_for(spec.cfg.train_len)
        probes = copy_probes(val_tokens, max_gap=max(gaps))
        for bca in (False, True) if model.supports_bca else (False,):
            curve = copy_curve(model, probes, gaps, bca, scrambled=True)
            prefix = f"{spec.name}/copy/{int(bca)}"
            tensors[prefix + "/gaps"] = torch.tensor(curve.gaps, dtype=torch.int64)
            tensors[prefix + "/nll_copy"] = curve.nll_copy.float().contiguous()
            tensors[prefix + "/nll_control"] = curve.nll_control.float().contiguous()
        runs[spec.name] = {**spec.meta, "weights": sha256_file(Path(spec.out_dir) / "model.safetensors")}
    about = {"control": "scrambled first span", "command": COPY_CONTROL_COMMAND, "runs": runs}
    save_safetensors(Path(out), tensors, {"attnres-copy-control": json.dumps(about)})
    return Path(out)
