"""Training, checkpoints and resume (attnres_helpers.train) on the tiny preset; the train command's bounds
(threads, model size, a run folder that cannot be written) checked before any step; a kill at every file
operation of train() resumed bit for bit (slow)."""

import json
import math
import os
import shutil

import pytest
import torch
from helpers import TINY_CLI_TRAIN, KillAt, Killed, one_line, read_only, reseal
from safetensors.torch import load_file, save_file

import attnres_helpers.train as train_mod
from attnres_helpers.__main__ import main as cli_main
from attnres_helpers.files import sha256sums
from attnres_helpers.model import PRESETS, ModelConfig, preset
from attnres_helpers.train import MIN_LR_RATIO, atomic_write, load_checkpoint, lr_at, train

TINY = PRESETS["tiny"]
RUN = dict(steps=12, batch_tokens=128, lr=3e-3, warmup=2, seed=1, checkpoint_every=4, progress=False)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny run: (run directory, in-memory fp32 model, summary)."""
    out = tmp_path_factory.mktemp("run")
    model, summary = train(TINY, out_dir=out, **RUN)
    return out, model, summary


def _copy(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / "copy")


def test_lr_schedule_warmup_then_cosine():
    lr, steps, warmup = 1.0, 101, 10
    assert lr_at(0, steps, lr, warmup) == pytest.approx(0.1)
    assert lr_at(9, steps, lr, warmup) == pytest.approx(1.0)
    assert lr_at(10, steps, lr, warmup) == pytest.approx(1.0)
    assert lr_at(55, steps, lr, warmup) == pytest.approx(MIN_LR_RATIO + (1 - MIN_LR_RATIO) / 2)  # cosine midpoint
    assert lr_at(100, steps, lr, warmup) == pytest.approx(MIN_LR_RATIO)
    schedule = [lr_at(s, steps, lr, warmup) for s in range(10, steps)]
    assert all(a >= b for a, b in zip(schedule, schedule[1:]))


def test_a_few_steps_lower_the_loss(tmp_path):
    _, summary = train(
        TINY,
        steps=30,
        batch_tokens=256,
        lr=3e-3,
        warmup=3,
        seed=0,
        out_dir=tmp_path,
        checkpoint_every=0,
        progress=False,
    )
    losses, results = summary["results"]["losses"], summary["results"]
    assert losses[0] == pytest.approx(math.log(256), abs=0.1)  # uniform over bytes at init
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0
    assert results["val_loss"] < math.log(256) - 1.0 and results["train_loss"] < math.log(256) - 1.0
    assert results["tokens_per_s"] > 0


def test_shipped_form_is_fp16_and_round_trips(finished):
    out, model, summary = finished
    assert sorted(p.name for p in out.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors"]  # state removed
    assert (out / "SHA256SUMS").read_text() == sha256sums(out)  # the finished run is sealed
    assert all(t.dtype == torch.float16 for t in load_file(out / "model.safetensors").values())
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads(json.dumps(summary)) and config["model"] == TINY.to_dict()
    assert config["train"]["betas"] == [0.9, 0.98] and config["train"]["steps"] == RUN["steps"]
    loaded = load_checkpoint(out)
    # the loaded config holds xPos's B resolved (L/2), so it equals TINY field by field once resolved
    assert not loaded.training and loaded.cfg.to_dict() == TINY.to_dict()
    assert loaded.cfg.xpos_scale_base == TINY.train_len / 2 and loaded.cfg.scale_base == TINY.scale_base
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in loaded.parameters())
    for name, p in loaded.state_dict().items():  # exactly the fp16 rounding of the trained weights
        assert torch.equal(p, model.state_dict()[name].half().float()), name
    idx = torch.randint(0, 256, (3, TINY.train_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, got = model(idx)[0], loaded(idx)[0]
    assert (got - ref).abs().max() < 2e-2 and not torch.equal(got, ref)
    assert torch.equal(load_checkpoint(out / "model.safetensors").state_dict()["wte.weight"], loaded.wte.weight)


def test_loading_never_unpickles(finished, monkeypatch):
    def no_pickle(*args, **kwargs):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", no_pickle)
    load_checkpoint(finished[0])


class Interrupted(Exception):
    pass


def _interrupt_at(monkeypatch, step):
    """Make train() raise Interrupted when it draws the batch of `step`; returns the call log."""
    calls = []
    real_get_batch = train_mod.get_batch

    def get_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == step + 1:
            raise Interrupted
        return real_get_batch(*args, **kwargs)

    monkeypatch.setattr(train_mod, "get_batch", get_batch)
    return calls


def test_interrupted_and_resumed_run_is_bit_identical(finished, tmp_path, monkeypatch):
    out, model, summary = finished
    _interrupt_at(monkeypatch, step=7)  # checkpoints at steps 4 and 8: the last complete one is step 4
    with pytest.raises(Interrupted):
        train(TINY, out_dir=tmp_path, **RUN)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["step"] == 4 and len(state["losses"]) == 4
    assert [p.name for p in tmp_path.glob("state-*.safetensors")] == ["state-0000004.safetensors"]
    monkeypatch.undo()

    calls = _interrupt_at(monkeypatch, step=10**9)  # count batches only
    torch.manual_seed(12345)  # the global RNG state at resume time must not matter
    resumed, resumed_summary = train(TINY, out_dir=tmp_path, **RUN)
    assert len(calls) == RUN["steps"] - 4  # it resumed rather than restarted
    for name, p in resumed.state_dict().items():
        assert torch.equal(p, model.state_dict()[name]), name
    assert resumed_summary["results"]["losses"] == summary["results"]["losses"]
    assert (tmp_path / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_finished_run_is_loaded_not_retrained(finished, monkeypatch):
    calls = _interrupt_at(monkeypatch, step=0)  # any batch drawn would raise
    _, summary = train(TINY, out_dir=finished[0], **RUN)
    assert calls == [] and summary == json.loads((finished[0] / "config.json").read_text())


def test_resume_with_other_settings_is_refused(tmp_path, monkeypatch):
    _interrupt_at(monkeypatch, step=5)
    with pytest.raises(Interrupted):
        train(TINY, out_dir=tmp_path, **RUN)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="state.json.*other settings"):
        train(TINY, out_dir=tmp_path, **{**RUN, "lr": 1e-3})
    train(TINY, out_dir=tmp_path, **RUN)  # finishes
    with pytest.raises(ValueError, match="config.json.*finished run with other settings"):
        train(preset("tiny", encoding="alibi"), out_dir=tmp_path, **RUN)


def _rewrite_json(path, edit):
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (lambda d: (d / "config.json").write_text("{not json"), r"config\.json is not valid JSON"),
        (
            lambda d: _rewrite_json(d / "config.json", lambda o: o["model"].update(extra=1)),
            r"config\.json.*unknown \['extra'\]",
        ),
        (
            lambda d: _rewrite_json(d / "config.json", lambda o: o["model"].pop("n_head")),
            r"config\.json.*missing \['n_head'\]",
        ),
        (
            lambda d: _rewrite_json(d / "config.json", lambda o: o["model"].update(d_model=64)),
            r"model\.safetensors.*shape",
        ),
        (
            lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:500]),
            r"model\.safetensors is corrupt or truncated",
        ),
        (
            lambda d: save_file(
                {k: v for k, v in load_file(d / "model.safetensors").items() if k != "ln_f.weight"},
                d / "model.safetensors",
            ),
            r"model\.safetensors.*name or shape, e\.g\. 'ln_f\.weight'",
        ),
        (
            lambda d: save_file(
                {k: v.fill_(float("nan")) for k, v in load_file(d / "model.safetensors").items()},
                d / "model.safetensors",
            ),
            r"model\.safetensors.*non-finite",
        ),
    ],
)
def test_corrupt_checkpoint_errors_name_the_file(finished, tmp_path, corrupt, match):
    run_dir = _copy(finished[0], tmp_path)
    corrupt(run_dir)
    with pytest.raises(ValueError, match=r"does not match SHA256SUMS"):  # the hash check comes first
        load_checkpoint(run_dir)
    reseal(run_dir)  # hashes that match an inconsistent folder: the checks behind them
    with pytest.raises(ValueError, match=match):
        load_checkpoint(run_dir)


def test_missing_unlisted_and_unsealed_checkpoint_files_are_refused(finished, tmp_path):
    run_dir = _copy(finished[0], tmp_path)
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"notes\.txt is not listed in SHA256SUMS"):
        load_checkpoint(run_dir)
    (run_dir / "notes.txt").unlink()
    (run_dir / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"model\.safetensors is listed in SHA256SUMS but missing"):
        load_checkpoint(run_dir)
    (run_dir / "SHA256SUMS").unlink()
    with pytest.raises(ValueError, match=r"has no SHA256SUMS .* cannot be verified"):
        load_checkpoint(run_dir)


def test_corrupt_resume_state_errors_name_the_file(tmp_path, monkeypatch):
    _interrupt_at(monkeypatch, step=5)
    with pytest.raises(Interrupted):
        train(TINY, out_dir=tmp_path, **RUN)
    monkeypatch.undo()
    tensors = tmp_path / "state-0000004.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"state-0000004\.safetensors is corrupt or truncated"):
        train(TINY, out_dir=tmp_path, **RUN)
    (tmp_path / "state.json").write_text("")
    with pytest.raises(ValueError, match=r"state\.json is not valid JSON"):
        train(TINY, out_dir=tmp_path, **RUN)


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "weights.safetensors"
    target.write_bytes(b"previous complete file")

    def write_half_then_fail(tmp):
        tmp.write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, write_half_then_fail)
    assert target.read_bytes() == b"previous complete file"
    assert [p.name for p in tmp_path.iterdir()] == ["weights.safetensors"]


def test_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    real_save = train_mod.save_file
    saves = []

    def save_file_failing_second_time(tensors, path):
        saves.append(path)
        if len(saves) == 2:
            with open(path, "wb") as f:
                f.write(b"half a checkpoint")
            raise OSError("disk full")
        real_save(tensors, path)

    monkeypatch.setattr(train_mod, "save_file", save_file_failing_second_time)
    with pytest.raises(OSError, match="disk full"):
        train(TINY, out_dir=tmp_path, **RUN)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state-0000004.safetensors", "state.json"]
    assert json.loads((tmp_path / "state.json").read_text())["step"] == 4
    monkeypatch.undo()
    train(TINY, out_dir=tmp_path, **RUN)  # resumes from step 4 and finishes
    assert (tmp_path / "config.json").is_file()


def test_bad_settings_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="batch_tokens"):
        train(TINY, steps=2, batch_tokens=100, warmup=1, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="warmup"):
        train(TINY, steps=2, batch_tokens=128, warmup=5, out_dir=tmp_path, progress=False)
    with (
        pytest.raises(ValueError, match="no CUDA device")
        if not torch.cuda.is_available()
        else pytest.raises(ValueError, match="steps")
    ):
        train(
            TINY,
            steps=0 if torch.cuda.is_available() else 2,
            batch_tokens=128,
            warmup=1,
            out_dir=tmp_path,
            device="cuda",
            progress=False,
        )


def test_cli_train_applies_overrides(tmp_path, capsys):
    out = tmp_path / "cli"
    cli_main(
        [
            "train",
            "--preset",
            "tiny",
            "--encoding",
            "alibi",
            "--n-layer",
            "1",
            "--seed",
            "2",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--batch-tokens",
            "64",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    printed = json.loads(capsys.readouterr().out)
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == preset("tiny", encoding="alibi", n_layer=1).to_dict()
    assert config["train"]["seed"] == 2 and config["train"]["steps"] == 3
    assert printed["out"] == str(out) and printed["val_loss"] == config["results"]["val_loss"]
    with pytest.raises(SystemExit, match="error: train_len"):
        cli_main(["train", "--preset", "tiny", "--train-len", "15", "--out", str(tmp_path / "bad"), "--quiet"])


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"lr": float("inf")}, r"lr must be a finite number in \(0, 1\], got inf"),
        ({"lr": float("nan")}, "lr must be a finite number"),
        ({"lr": 0.0}, "lr must be"),
        ({"lr": 1.5}, "lr must be"),
        ({"weight_decay": float("nan")}, r"weight_decay must be a finite number in \[0, 10\], got nan"),
        ({"weight_decay": float("inf")}, "weight_decay must be"),
        ({"weight_decay": -0.1}, "weight_decay must be"),
        ({"steps": 2.5}, "steps must be an integer"),
        ({"seed": 1.0}, "seed must be an integer"),
        ({"warmup": True}, "warmup must be an integer"),
        ({"checkpoint_every": -1}, "checkpoint_every"),
    ],
)
def test_bad_training_settings_are_refused_before_training(tmp_path, monkeypatch, changes, match):
    calls = _interrupt_at(monkeypatch, step=0)  # a drawn batch would raise Interrupted
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=match):
        train(TINY, out_dir=out, **{**RUN, **changes})
    assert calls == [] and not out.exists()


def test_a_non_finite_loss_stops_training_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    real_forward = train_mod.Transformer.forward
    steps = []

    def forward(self, idx, targets=None, bca=False):
        logits, loss = real_forward(self, idx, targets, bca)
        if self.training:
            steps.append(1)
            if len(steps) == 7:  # step 6 diverges
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(train_mod.Transformer, "forward", forward)
    with pytest.raises(ValueError, match="training diverged: the loss is nan at step 6"):
        train(TINY, out_dir=tmp_path, **RUN)
    assert json.loads((tmp_path / "state.json").read_text())["step"] == 4
    assert not (tmp_path / "model.safetensors").exists()


def _interrupted_run(tmp_path, monkeypatch):
    """A run stopped at step 5: state.json and state-0000004.safetensors in tmp_path."""
    _interrupt_at(monkeypatch, step=5)
    with pytest.raises(Interrupted):
        train(TINY, out_dir=tmp_path, **RUN)
    monkeypatch.undo()
    return tmp_path / "state-0000004.safetensors"


def _first_key(tensors, suffix):
    return sorted(k for k in tensors if k.endswith(suffix))[0]


def _nan_exp_avg_sq(t):
    key = _first_key(t, ".exp_avg_sq")
    t[key].view(-1)[0] = float("nan")
    return key


def _negative_exp_avg_sq(t):
    key = _first_key(t, ".exp_avg_sq")
    t[key].view(-1)[3] = -1e-3
    return key


def _negative_step(t):
    key = _first_key(t, ".step")
    t[key].fill_(-4.0)
    return key


def _inf_exp_avg(t):
    key = _first_key(t, ".exp_avg")
    t[key].view(-1)[0] = float("inf")
    return key


def _short_rng(t):
    t["rng.torch_cpu"] = t["rng.torch_cpu"][:-8].clone()
    return "rng"


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (_nan_exp_avg_sq, r"corrupt optimiser state \(optim\.\d+\.exp_avg_sq is non-finite or negative\)"),
        (_negative_exp_avg_sq, r"corrupt optimiser state \(optim\.\d+\.exp_avg_sq is non-finite or negative\)"),
        (_negative_step, r"corrupt optimiser state \(optim\.\d+\.step is non-finite or negative\)"),
        (_inf_exp_avg, r"corrupt optimiser state \(optim\.\d+\.exp_avg is non-finite or negative\)"),
        (_short_rng, "RNG state of the wrong size"),
    ],
)
def test_corrupt_optimiser_state_is_refused_on_resume(tmp_path, monkeypatch, corrupt, match):
    path = _interrupted_run(tmp_path, monkeypatch)
    tensors = load_file(path)
    corrupt(tensors)
    save_file(tensors, path)
    calls = _interrupt_at(monkeypatch, step=0)
    with pytest.raises(ValueError, match=r"state-0000004\.safetensors has (a|an) " + match):
        train(TINY, out_dir=tmp_path, **RUN)
    assert calls == []  # refused before any step


def test_untouched_resume_state_still_resumes(tmp_path, monkeypatch, finished):
    path = _interrupted_run(tmp_path, monkeypatch)
    save_file(load_file(path), path)  # rewritten unchanged: accepted
    resumed, _ = train(TINY, out_dir=tmp_path, **RUN)
    for name, p in resumed.state_dict().items():
        assert torch.equal(p, finished[1].state_dict()[name]), name


def test_debris_of_killed_writes_is_removed_at_the_next_start(tmp_path, monkeypatch, finished):
    path = _interrupted_run(tmp_path, monkeypatch)
    debris = [
        tmp_path / ".state.json.tmp-123",
        tmp_path / ".state-0000008.safetensors.tmp-4567",
        tmp_path / ".model.safetensors.tmp-99",
    ]
    for d in debris:
        d.write_bytes(b"half a file")
    keep = [tmp_path / "notes.txt", tmp_path / ".hidden", tmp_path / "state.json.tmp-1"]
    for k in keep:
        k.write_text("mine")
    calls = _interrupt_at(monkeypatch, step=10**9)
    resumed, _ = train(TINY, out_dir=tmp_path, **RUN)
    assert len(calls) == RUN["steps"] - 4  # resumed from state-0000004, the debris ignored
    assert not any(d.exists() for d in debris) and all(k.read_text() == "mine" for k in keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["SHA256SUMS", "config.json", "model.safetensors"] + [k.name for k in keep]
    )
    assert (tmp_path / "model.safetensors").read_bytes() == (finished[0] / "model.safetensors").read_bytes()
    assert path.name not in {p.name for p in tmp_path.iterdir()}
    # a finished run is loaded (once the user's own files are gone: the loader refuses unlisted files),
    # and the debris is removed all the same
    for k in keep:
        k.unlink()
    (tmp_path / ".config.json.tmp-7").write_text("{")
    train(TINY, out_dir=tmp_path, **RUN)
    assert not (tmp_path / ".config.json.tmp-7").exists()


def test_written_files_have_the_usual_permissions(finished):
    import os

    mask = os.umask(0)
    os.umask(mask)
    for name in ("config.json", "model.safetensors"):
        assert (finished[0] / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lr", "inf"], "error: lr must be a finite number in (0, 1], got inf"),
        (["--weight-decay", "nan"], "error: weight_decay must be a finite number in [0, 10], got nan"),
        (["--n-layer", "0"], "error: n_layer must be a positive integer, got 0"),
        (["--rope-base", "nan"], "error: rope_base must be a finite number, got nan"),
        (["--out", ""], "error: --out must name a folder, got an empty string"),
    ],
)
def test_cli_train_errors_are_one_line(cli, tmp_path, args, message):
    out = tmp_path / "run"
    result = cli(*TINY_CLI_TRAIN, "--out", str(out), *args)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [message]
    assert not out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "garbage"], "argument --device: device must be cpu, cuda or cuda:N, got 'garbage'"),
        (["--threads", "-3"], "argument --threads: must be >= 0, got -3"),
        (["--n-layer", "2.5"], "argument --n-layer: invalid int value: '2.5'"),
    ],
)
def test_cli_train_bad_arguments_are_usage_errors(cli, tmp_path, args, message):
    """argparse refuses these: exit status 2 and exactly one line naming the argument (no usage block)."""
    out = tmp_path / "run"
    result = cli("train", "--preset", "tiny", "--quiet", "--out", str(out), *args)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"attnres train: error: {message} (see --help)"]
    assert not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--device", "gpu"],
        ["train", "--threads", "-1"],
        ["reproduce", "--jobs", "0"],
        ["family", "--device", "tpu"],
    ],
)
def test_cli_argument_checks_in_process(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    assert exit_info.value.code == 2 and "error: argument" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cuda:x", "cuda:"])
def test_cli_device_index_must_be_a_number(device, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(
            [
                "train",
                "--device",
                device,
                "--preset",
                "tiny",
                "--steps",
                "1",
                "--warmup",
                "0",
                "--quiet",
                "--out",
                str(tmp_path / "run"),
            ]
        )
    assert exit_info.value.code == 2 and "argument --device" in capsys.readouterr().err


def test_oversized_config_is_refused_from_the_header_before_any_model_is_built(finished, tmp_path, monkeypatch):
    """A config.json asking for 16 layers of width 2048 (about 3.2 GB, inside the model's own size bound) is
    compared with the weights' header shapes first: refused with the file named, and no Transformer is ever
    constructed."""
    run_dir = _copy(finished[0], tmp_path)
    _rewrite_json(run_dir / "config.json", lambda c: c["model"].update(d_model=2048, n_layer=16))
    reseal(run_dir)
    built = []
    real_build = ModelConfig.build
    monkeypatch.setattr(ModelConfig, "build", lambda cfg: built.append(torch.empty(0).device) or real_build(cfg))
    with pytest.raises(ValueError, match=r"config\.json does not match the weights.*16 layers of width 2048"):
        load_checkpoint(run_dir)
    assert [str(d) for d in built] == ["meta"]  # built once, on the meta device (no memory), to read its shapes


def test_train_into_a_read_only_out_fails_before_training_naming_the_target(tmp_path, monkeypatch):
    out = tmp_path / "ro"
    out.mkdir()
    steps = []
    monkeypatch.setattr(train_mod, "get_batch", lambda *a, **k: steps.append(1) or pytest.fail("a step ran"))
    with read_only(out):
        with pytest.raises(SystemExit) as exit_info:
            cli_main([*TINY_CLI_TRAIN, "--checkpoint-every", "0", "--out", str(out)])
    assert one_line(exit_info) == (
        f"error: cannot write {out / 'model.safetensors'}: the run folder {out} cannot be "
        "written (Operation not permitted); choose another out_dir"
    )
    assert steps == [] and list(out.iterdir()) == []


TRAIN_RUN = {
    "steps": 6,
    "batch_tokens": 64,
    "lr": 1e-3,
    "warmup": 2,
    "seed": 3,
    "checkpoint_every": 2,
    "progress": False,
}  # resume state at steps 2 and 4, then the model, config.json and SHA256SUMS


@pytest.mark.slow
def test_a_kill_at_every_file_operation_of_train_resumes_bit_identically(tmp_path, monkeypatch):
    cfg = preset("tiny", encoding="rope")
    with monkeypatch.context() as m:
        counter = KillAt(m, None)
        train_mod.train(cfg, out_dir=tmp_path / "reference", **TRAIN_RUN)
    n_ops = counter.count
    reference = (tmp_path / "reference" / "model.safetensors").read_bytes()
    assert n_ops >= 7 * 6  # seven atomic writes of six operations each, and the unlinks
    for k in range(n_ops):
        out = tmp_path / f"killed-{k}"
        with monkeypatch.context() as m:
            kill = KillAt(m, k)
            with pytest.raises(Killed):
                train_mod.train(cfg, out_dir=out, **TRAIN_RUN)
            assert kill.fired
        train_mod.train(cfg, out_dir=out, **TRAIN_RUN)  # resume
        assert (out / "model.safetensors").read_bytes() == reference, f"kill at operation {k}"
        assert sorted(p.name for p in out.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors"], k
        load_checkpoint(out)
        shutil.rmtree(out)


def test_train_threads_are_bounded(tmp_path, capsys):
    most = 4 * os.cpu_count()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train", "--preset", "tiny", "--threads", "100000", "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 2 and capsys.readouterr().err.splitlines() == [
        f"attnres train: error: argument --threads: must be at most {most} (4 x the "
        f"{os.cpu_count()} CPUs), got 100000 (see --help)"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--n-layer", "100000", "--d-model", "4096"], "error: n_layer must be at most 1024, got 100000"),
        (
            ["--n-layer", "1000", "--d-model", "1024"],
            "error: the model would have 12,592,392,192 parameters (1000 layers "
            "of width 1024), over the bound of 1,000,000,000",
        ),
        (["--d-model", "131072", "--n-head", "2"], "error: d_model must be at most 65536, got 131072"),
    ],
)
def test_model_size_is_bounded_before_anything_is_built(tmp_path, monkeypatch, args, message):
    monkeypatch.setattr(ModelConfig, "build", lambda cfg: pytest.fail("a model was built"))
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train", "--preset", "tiny", "--quiet", "--out", str(tmp_path / "run"), *args])
    assert one_line(exit_info) == message and not (tmp_path / "run").exists()
