"""A finished run's seal (checkpoints.verify_finished, through train()): a finished run is reused only as its
own SHA256SUMS vouches for it, refused in one line otherwise, and never re-sealed; training writes the seal
over what it just wrote, before config.json marks the run finished."""

import shutil
from pathlib import Path

import pytest

import attnres_helpers.train as train_mod
from attnres_helpers.checkpoints import RETRAIN, load_checkpoint
from attnres_helpers.files import sha256sums
from attnres_helpers.model import PRESETS

TINY = PRESETS["tiny"]
RUN = dict(steps=3, batch_tokens=64, lr=1e-3, warmup=1, seed=0, checkpoint_every=0, progress=False)
CLI_RUN = ["train", "--preset", "tiny", "--steps", "3", "--batch-tokens", "64", "--warmup", "1", "--quiet"]


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
    result = cli(*CLI_RUN, "--out", str(run))
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
