"""The project's trained sets of models: what they are (:mod:`.specs`) and the one path that trains and
measures them (:mod:`.runner`).

    attnres reproduce              # the 15 shipped models (notebooks 03, 04) and their store
    attnres measure --json         # the shipped checkpoints, verified and measured again
    attnres reproduce family-v2    # the v2 family of notebook 05 (plan v2), resumable
    attnres results --json         # records from a stored measurement, no model loaded
"""

from ..paths import DATA, HF_CHECKPOINTS, ROOT, data_path
from .runner import (
    load_results,
    measure_checkpoints,
    measure_spec,
    reproduce,
    reuse_shipped,
    run_datasets,
    run_family_v2,
    sha256sums,
    ship_hf_checkpoints,
    train_and_measure,
    train_spec,
    train_specs,
    verify_checkpoints,
)
from .specs import (
    CHECKPOINTS,
    ENCODINGS,
    EXTRA_SEEDS,
    FAMILY,
    FAMILY_COMMAND,
    FAMILY_RUNS,
    FAMILY_STORE,
    FAMILY_TRAINING,
    FAMILY_V2,
    FAMILY_V2_COMMAND,
    FAMILY_V2_RUNS,
    FAMILY_V2_STORE,
    HF_COMMAND,
    HF_RUNS,
    HF_SHIPPED,
    HF_STORE,
    HF_TRAINED,
    LARGE_TRAINING,
    MEASURE,
    MODEL,
    REPRODUCE_COMMAND,
    SEEDS,
    SHIPPED_AS,
    STORE,
    SWEEP_POINTS,
    TRAINING,
    Dataset,
    RunSpec,
    checkpoint_dir,
    default_config,
    default_dataset,
    extra_seed_settings,
    family_dataset,
    family_specs,
    family_v2_dataset,
    family_v2_specs,
    hf_dataset,
    large_dataset,
    run_meta,
    slug,
    sweep_dataset,
)

__all__ = [name for name in dir() if not name.startswith("_")]
