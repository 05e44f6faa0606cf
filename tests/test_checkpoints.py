"""A finished run's seal (checkpoints.verify_finished, through train()): a finished run is reused only as its
own SHA256SUMS vouches for it, refused in one line otherwise, and never re-sealed; training writes the seal
over what it just wrote, before config.json marks the run finished.

Verification (checkpoints.verify_checkpoints and load_checkpoint): unlisted files at any depth, links to
devices, binary, oversized or linked SHA256SUMS, HF checkpoints without their sums, a relabelled or
tampered config refused before anything is allocated; each refusal names the command that regenerates."""

import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import TINY_CLI_TRAIN, copy_run, reseal, rewrite_json
from safetensors.torch import save_file

import attnres_helpers.train as train_mod
from attnres_helpers import checkpoints, files, paths
from attnres_helpers.checkpoints import RETRAIN, load_checkpoint, regenerate_command, verify_checkpoints
from attnres_helpers.experiments import runner, specs
from attnres_helpers.files import sha256sums
from attnres_helpers.model import PRESETS, ModelConfig

TINY = PRESETS["tiny"]
RUN = dict(steps=3, batch_tokens=64, lr=1e-3, warmup=1, seed=0, checkpoint_every=0, progress=False)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    train_mod.train(TINY, out_dir=out, **RUN)
    return out


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 1
    path.write_bytes(bytes(data))


def _unsealed(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished run with a weight byte flipped and its SHA256SUMS deleted."""
    run = Path(shutil.copytree(finished, tmp_path / "run"))
    _flip(run / "model.safetensors")
    (run / "SHA256SUMS").unlink()
    return run


def test_train_refuses_a_finished_run_without_its_seal_and_never_reseals_it(finished, tmp_path):
    run = _unsealed(finished, tmp_path)
    with pytest.raises(ValueError) as err:
        train_mod.train(TINY, out_dir=run, **RUN)
    assert str(err.value) == f"finished run {run} has no SHA256SUMS: refused, never re-sealed; {RETRAIN}"
    assert not (run / "SHA256SUMS").exists()
    with pytest.raises(ValueError, match="has no SHA256SUMS"):
        load_checkpoint(run)


def test_train_refuses_a_finished_run_that_does_not_match_its_seal(finished, tmp_path):
    run = Path(shutil.copytree(finished, tmp_path / "run"))
    _flip(run / "model.safetensors")
    seal = (run / "SHA256SUMS").read_bytes()
    with pytest.raises(ValueError) as err:
        train_mod.train(TINY, out_dir=run, **RUN)
    assert str(err.value) == (
        f"finished run {run} does not match its SHA256SUMS (a file changed, missing or unlisted): "
        f"refused, never re-sealed; {RETRAIN}"
    )
    assert (run / "SHA256SUMS").read_bytes() == seal


def test_cli_train_on_a_finished_run_without_its_seal_is_one_line(finished, tmp_path, cli):
    run = _unsealed(finished, tmp_path)
    result = cli(*TINY_CLI_TRAIN, "--out", str(run))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"error: finished run {run} has no SHA256SUMS: refused, never re-sealed; {RETRAIN}\n"
    assert not (run / "SHA256SUMS").exists()


def test_retraining_with_resume_false_seals_what_it_wrote(finished, tmp_path):
    run = Path(shutil.copytree(finished, tmp_path / "run"))
    train_mod.train(TINY, out_dir=run, **{**RUN, "seed": 1}, resume=False)  # other weights, other config.json
    assert (run / "SHA256SUMS").read_text() == sha256sums(run)
    load_checkpoint(run)


def test_the_seal_is_written_before_config_json_marks_the_run_finished(tmp_path, monkeypatch):
    written, real = [], train_mod.write_text_atomic
    monkeypatch.setattr(
        train_mod, "write_text_atomic", lambda path, text: written.append(Path(path).name) or real(path, text)
    )
    train_mod.train(TINY, out_dir=tmp_path / "run", **RUN)
    assert written == ["SHA256SUMS", "config.json"]
    assert (tmp_path / "run" / "SHA256SUMS").read_text() == sha256sums(tmp_path / "run")


def test_a_finished_run_with_leftover_state_is_cleaned_and_keeps_its_seal(family, tmp_path):
    """Killed between config.json and deleting the resume state (its SHA256SUMS, written before config.json,
    is there): the next train() call deletes the state and keeps the seal; sha256sums() of a root never
    lists resume state."""
    spec = family.specs[0]
    run = copy_run(spec.out_dir, tmp_path / "root")
    (run / "state.json").write_text('{"step": 200, "tensor_file": "state-0000200.safetensors"}')
    save_file({"x": torch.zeros(2)}, run / "state-0000200.safetensors")
    listed = checkpoints.sha256sums(run.parent)
    assert "state" not in listed and "rope-s0/config.json" in listed
    (run.parent / "SHA256SUMS").write_text(listed)
    with pytest.raises(ValueError) as err:
        verify_checkpoints(run.parent)
    assert str(err.value) == (
        f"{run / 'state-0000200.safetensors'} is not listed in SHA256SUMS: refused (remove it, "
        f"or regenerate with `{specs.REPRODUCE_COMMAND}`)"
    )
    (run.parent / "SHA256SUMS").unlink()
    train_mod.train(spec.cfg, seed=spec.seed, out_dir=run, checkpoint_every=100, progress=False, **spec.training)
    assert sorted(p.name for p in run.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors"]
    assert (run / "SHA256SUMS").read_text() == (spec.out_dir / "SHA256SUMS").read_text()


@pytest.fixture
def root(family, tmp_path) -> Path:
    """A shipped-style root of the family's two runs with one SHA256SUMS (as reproduce writes it)."""
    root = tmp_path / "checkpoints"
    for spec in family.specs:
        shutil.copytree(spec.out_dir, root / spec.name)
    (root / "SHA256SUMS").write_text(checkpoints.sha256sums(root))
    verify_checkpoints(root)
    return root


@pytest.mark.parametrize("name", ["rope-s0/pytorch_model.bin", "notes.txt", "rope-s0/sub/model.safetensors"])
def test_unlisted_files_at_any_depth_are_refused(root, name):
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(b"anything")
    with pytest.raises(ValueError) as err:
        verify_checkpoints(root)
    assert str(err.value) == (
        f"{root / name} is not listed in SHA256SUMS: refused (remove it, or regenerate with "
        f"`{specs.REPRODUCE_COMMAND}`)"
    )
    if name.startswith("rope-s0/"):  # the run's own SHA256SUMS refuses it too
        with pytest.raises(ValueError, match=r"is not listed in SHA256SUMS: refused"):
            load_checkpoint(root / "rope-s0")


def test_a_link_to_dev_zero_is_refused_without_reading_it(root, monkeypatch):
    real_open = open

    def guarded(path, *args, **kwargs):
        assert isinstance(path, int) or os.path.realpath(path) != "/dev/zero", "/dev/zero was opened"
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", guarded)
    target = root / "rope-s0" / "model.safetensors"
    target.unlink()
    target.symlink_to("/dev/zero")
    for check in (lambda: verify_checkpoints(root), lambda: load_checkpoint(root / "rope-s0")):
        with pytest.raises(ValueError) as err:
            check()
        assert str(err.value) == f"{target} is not a regular file (a link, a device or a folder): refused"
    (root / "zero").symlink_to("/dev/zero")  # unlisted, too
    with pytest.raises(ValueError, match=f"{root / 'zero'} is not listed in SHA256SUMS: refused"):
        verify_checkpoints(root)


def test_a_binary_sha256sums_names_the_file(root):
    (root / "SHA256SUMS").write_bytes(bytes(range(256)))
    with pytest.raises(ValueError) as err:
        verify_checkpoints(root)
    assert str(err.value) == (
        f"{root / 'SHA256SUMS'} is not a text file; regenerate the folder with `{specs.REPRODUCE_COMMAND}`"
    )


def test_an_oversized_or_linked_sha256sums_is_refused_unread(root):
    sums = root / "SHA256SUMS"
    with open(sums, "r+b") as f:
        f.truncate(files.MAX_SUMS_BYTES + 1)  # sparse: nothing is written
    message = (
        f"{sums} is a link or over {files.MAX_SUMS_BYTES} bytes: refused; regenerate the folder with "
        f"`{specs.REPRODUCE_COMMAND}`"
    )
    with pytest.raises(ValueError) as err:
        verify_checkpoints(root)
    assert str(err.value) == message
    sums.unlink()
    sums.symlink_to("/dev/zero")  # not a regular file: as good as missing
    with pytest.raises(FileNotFoundError, match="SHA256SUMS is missing"):
        verify_checkpoints(root)
    sums.unlink()
    (root / "elsewhere").write_text(checkpoints.sha256sums(root))
    sums.symlink_to(root / "elsewhere")
    with pytest.raises(ValueError) as err:
        verify_checkpoints(root)
    assert str(err.value) == message


def _hf_root(hf_run: Path, tmp_path: Path) -> Path:
    """A data/hf_checkpoints-style root: the run's config.json and model, one SHA256SUMS (ship_hf_checkpoints)."""
    root = tmp_path / "hf_checkpoints"
    runner.ship_hf_checkpoints(hf_run.parent, root, runs=(hf_run.name,))
    return root


def test_a_missing_hf_sha256sums_names_hf_train(hf_run, tmp_path):
    root = _hf_root(hf_run, tmp_path)
    load_checkpoint(root / "hf-llama-s0")  # verified by the root's SHA256SUMS
    (root / "SHA256SUMS").unlink()
    command = specs.HF_COMMAND
    for fix in (None, command):
        with pytest.raises(FileNotFoundError) as err:
            verify_checkpoints(root, fix)
        assert str(err.value) == f"{root / 'SHA256SUMS'} is missing; regenerate the folder with `{command}`"
    with pytest.raises(ValueError) as err:
        load_checkpoint(root / "hf-llama-s0")
    assert str(err.value) == (
        f"checkpoint {root / 'hf-llama-s0'} has no SHA256SUMS (neither in it nor above it): it "
        f"cannot be verified and is refused; regenerate it with `{command}`"
    )
    # where the shipped HF checkpoints are verified (notebook 06: verify_checkpoints(HF_CHECKPOINTS)), the
    # default names hf-train; nothing under data/ is read to decide it
    assert regenerate_command(paths.HF_CHECKPOINTS) == command
    assert regenerate_command(paths.HF_CHECKPOINTS / "hf-bloom-s0") == command
    assert regenerate_command(specs.CHECKPOINTS) == specs.REPRODUCE_COMMAND


def test_an_hf_checkpoint_with_a_flipped_byte_or_no_sha256sums_is_refused(hf_run, tmp_path):
    run = copy_run(hf_run, tmp_path)
    data = bytearray((run / "model.safetensors").read_bytes())
    data[-10] ^= 1
    (run / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:
        load_checkpoint(run)
    assert str(err.value) == (
        f"{run / 'model.safetensors'} does not match SHA256SUMS (corrupt or tampered); "
        f"regenerate with `{specs.HF_COMMAND}`"
    )
    (run / "SHA256SUMS").unlink()  # and without any SHA256SUMS
    with pytest.raises(ValueError) as err:
        load_checkpoint(run)
    assert str(err.value) == (
        f"checkpoint {run} has no SHA256SUMS (neither in it nor above it): it cannot be "
        f"verified and is refused; regenerate it with `{specs.HF_COMMAND}`"
    )


def test_a_relabelled_config_is_refused(family, tmp_path):
    run = copy_run(family.specs[0].out_dir, tmp_path)
    rewrite_json(run / "config.json", lambda c: c["model"].update(encoding="alibi"))
    with pytest.raises(ValueError) as err:
        load_checkpoint(run)
    assert str(err.value) == (
        f"{run / 'config.json'} does not match SHA256SUMS (corrupt or tampered); regenerate "
        f"with `{specs.REPRODUCE_COMMAND}`"
    )


def test_a_tampered_d_model_is_refused_before_anything_is_allocated(family, tmp_path, monkeypatch):
    run = copy_run(family.specs[0].out_dir, tmp_path)
    rewrite_json(run / "config.json", lambda c: c["model"].update(d_model=65536))
    with pytest.raises(ValueError, match="config.json does not match SHA256SUMS"):
        load_checkpoint(run)
    reseal(run)  # hashes that match: the config's own bound refuses it, before any model is built
    monkeypatch.setattr(ModelConfig, "build", lambda cfg: pytest.fail("a model was built"))
    with pytest.raises(ValueError) as err:
        load_checkpoint(run)
    assert str(err.value) == (
        f"checkpoint file {run / 'config.json'} has a bad model config: the model would have "
        "103,097,303,040 parameters (2 layers of width 65536), over the bound of 1,000,000,000"
    )
