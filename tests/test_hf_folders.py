"""hf.measure_pretrained and ``measure-hf`` on local folders and hub names (attnres_helpers.hf.pretrained and
hf.folders), with tiny ``transformers`` models built from config (helpers.tiny_llama; nothing is
downloaded): a broken folder is one line naming it, huge logits an infinite perplexity in valid JSON, the
explicit path agrees with the FFT, a hub name without network is one line and tried once with a short
timeout, a missing local path is a local error, this project's own run folders name their command, and
every argument is checked before loading."""

import json
import logging
import math
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch
from helpers import one_line, rewrite_json, tiny_llama

from attnres_helpers.__main__ import main as cli_main
from attnres_helpers.experiments import specs

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the network


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("llama") / "tiny-llama"
    tiny_llama().save_pretrained(folder)
    return folder


@pytest.fixture
def no_hub(monkeypatch):
    """No network: the hub check fails as it does offline (and nothing may get past it)."""

    def refuse(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)


def _variant(folder: Path, tmp_path: Path, edit) -> Path:
    copy = Path(shutil.copytree(folder, tmp_path / f"{folder.name}-edited"))
    edit(copy)
    return copy


def _zero_bytes(folder):
    (folder / "model.safetensors").write_bytes(b"")


def _truncated(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _corrupt_header(folder):
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:40] = b"!" * 32
    (folder / "model.safetensors").write_bytes(bytes(data))


def _only_a_pickle(folder):
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"a pickle that must never be opened")


def _zero_heads(folder):
    rewrite_json(folder / "config.json", lambda c: c.update(num_attention_heads=0))


def _wider_config(folder):
    rewrite_json(folder / "config.json", lambda c: c.update(hidden_size=24))


def _heads_not_dividing(folder):
    rewrite_json(folder / "config.json", lambda c: c.update(num_attention_heads=3))


@pytest.mark.parametrize(
    "edit, reason",
    [
        (
            _zero_bytes,
            "cannot load a safetensors causal LM (SafetensorError: Error while deserializing header: header too small)",
        ),
        (
            _truncated,
            "cannot load a safetensors causal LM (SafetensorError: Error while deserializing header: "
            "incomplete metadata, file not fully covered)",
        ),
        (_corrupt_header, "cannot load a safetensors causal LM (SafetensorError: Error while deserializing header: "),
        (
            _only_a_pickle,
            "cannot load a safetensors causal LM (OSError: Error no file named model.safetensors found in directory ",
        ),
        (_zero_heads, None),
        (
            _wider_config,
            "cannot load a safetensors causal LM (RuntimeError: the weights' shapes do not match config.json)",
        ),
        (
            _heads_not_dividing,
            "cannot load a safetensors causal LM (StrictDataclassClassValidationError: Class "
            "validation error for validator 'validate_architecture': ValueError: The hidden size (16) "
            "is not a multiple of the number of attention heads (3).)",
        ),
    ],
)
def test_measure_hf_on_broken_folders_is_one_line_naming_the_folder(llama_folder, tmp_path, no_hub, edit, reason):
    from attnres_helpers import hf

    folder = _variant(llama_folder, tmp_path, edit)
    reports = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: reports.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)  # transformers' own log (its load report)
    try:
        expected = (
            f"{folder}: {reason}"
            if reason
            else f"{folder / 'config.json'}: num_attention_heads must be a positive integer, got 0"
        )
        with pytest.raises(ValueError) as err:
            hf.measure_pretrained(str(folder), multiples=(1,), n_windows=1)
        assert str(err.value).startswith(expected) and len(str(err.value).splitlines()) == 1
        with pytest.raises(SystemExit) as exit_info:
            cli_main(["measure", str(folder), "--lengths", "1", "--windows", "1", "--json"])
        assert one_line(exit_info) == f"error: {err.value}"
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [r for r in reports if "LOAD REPORT" in r]  # our one line, not transformers' report too


def test_a_model_with_huge_logits_gives_infinite_perplexity_and_valid_json(llama_folder, tmp_path, capsys):
    from attnres_helpers import hf

    model = tiny_llama()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(1e6)  # tied: the logits are about 1e12 a token
    folder = tmp_path / "huge"
    model.save_pretrained(folder)
    recs = hf.measure_pretrained(folder, multiples=(1,), n_windows=1)
    assert recs and {r["perplexity"] for r in recs} == {math.inf}
    assert all(0 <= r["resolution"] <= 1 for r in recs)
    capsys.readouterr()
    cli_main(["measure", str(folder), "--lengths", "1", "--windows", "1", "--json"])
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert {r["perplexity"] for r in out} == {None}


def test_measure_hf_method_explicit_agrees_with_fft(llama_folder, capsys):
    """The CLI's --method explicit (the O(T²) path) gives the FFT path's records, R to 1e-4 relative."""
    runs = {}
    for method in ("fft", "explicit"):
        cli_main(["measure", str(llama_folder), "--lengths", "1,2", "--windows", "1", "--json",
                  "--method", method])  # fmt: skip
        runs[method] = json.loads(capsys.readouterr().out)
    assert len(runs["fft"]) == len(runs["explicit"]) > 0
    for a, b in zip(runs["fft"], runs["explicit"]):
        assert (a["layer"], a["eval_len"]) == (b["layer"], b["eval_len"])
        assert a["resolution"] == pytest.approx(b["resolution"], rel=1e-4, abs=1e-9)
        assert a["perplexity"] == b["perplexity"]


def test_a_hub_name_without_network_is_one_line(tmp_path, monkeypatch, no_hub):
    from attnres_helpers import hf

    monkeypatch.chdir(tmp_path)
    message = (
        "'someorg/some-model' is not a local folder and the Hugging Face hub cannot be reached (no network); "
        "give the path of a downloaded model folder"
    )
    with pytest.raises(ValueError) as err:
        hf.measure_pretrained("someorg/some-model")
    assert str(err.value) == message
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["measure", "someorg/some-model"])
    assert one_line(exit_info) == f"error: {message}"


def test_the_hub_is_tried_once_with_a_short_timeout(monkeypatch, tmp_path):
    from attnres_helpers.hf import pretrained

    calls = []
    monkeypatch.setattr(
        socket,
        "create_connection",
        lambda address, timeout: calls.append((address, timeout)) or (_ for _ in ()).throw(OSError("unreachable")),
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="cannot be reached"):
        pretrained.load_pretrained("someorg/some-model")
    assert calls == [(("huggingface.co", 443), 5.0)]


@pytest.mark.parametrize("name", ["runs/my-model", "/nonexistent/model", "./my-model", "~/no-such-model-here"])
def test_a_missing_local_path_is_a_local_error(tmp_path, monkeypatch, name):
    from attnres_helpers import hf

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # a mistyped run folder under a local runs/
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("the hub was contacted"))
    with pytest.raises(FileNotFoundError) as err:
        hf.measure_pretrained(name)
    assert str(err.value) == f"model folder {Path(name).expanduser()} does not exist"


def test_the_projects_own_folders_point_to_the_right_command(family, hf_run, tmp_path, no_hub):
    from attnres_helpers import hf

    for run, command, store in (
        (family.specs[0].out_dir, specs.REPRODUCE_COMMAND, "data/results/default.safetensors"),
        (hf_run, specs.HF_COMMAND, "data/results/hf.safetensors"),
    ):
        with pytest.raises(ValueError) as err:
            hf.measure_pretrained(str(run))
        assert str(err.value) == (
            f"{run} is a checkpoint in this project's own format, not a transformers folder: "
            f"its measurements are read by `attnres results {store}` "
            f"and made by `{command}`; in Python, load it with "
            "attnres_helpers.checkpoints.load_checkpoint"
        )
        with pytest.raises(SystemExit) as exit_info:  # `attnres measure RUN` measures it as a run trained here
            cli_main(["measure-hf", "--model", str(run)])
        assert one_line(exit_info) == f"error: {err.value}"


def test_measure_pretrained_takes_a_path(llama_folder):
    from attnres_helpers import hf

    recs = hf.measure_pretrained(llama_folder, multiples=(1,), n_windows=1)
    assert {r["run"] for r in recs} == {"tiny-llama"} and {r["eval_len"] for r in recs} == {32}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"multiples": (float("inf"),)}, "lengths must be multiples of L in (0, 64], got [inf]"),
        ({"multiples": ()}, "no lengths to measure"),
        ({"multiples": (True,)}, "lengths must be multiples of L in (0, 64], got [True]"),
        ({"n_windows": True}, "n_windows must be a positive integer, got True"),
        ({"n_windows": 0}, "n_windows must be a positive integer, got 0"),
        ({"train_len": 1.5}, "train_len must be an integer >= 2, got 1.5"),
    ],
)
def test_measure_pretrained_arguments_are_checked_before_loading(llama_folder, monkeypatch, kwargs, message):
    from attnres_helpers.hf import pretrained

    monkeypatch.setattr(pretrained, "load_pretrained", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError) as err:
        pretrained.measure_pretrained(llama_folder, **kwargs)
    assert str(err.value) == message


def test_a_folder_without_tokenizer_files_is_one_line(tmp_path, no_hub):
    """Issue 44 #10: a model whose vocabulary is not bytes needs the folder's tokenizer; without one,
    transformers gave five lines of advice about sentencepiece and tiktoken. One line naming the folder."""
    import transformers

    from attnres_helpers.hf.folders import load_tokenizer

    folder = tmp_path / "no-tokenizer"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=300
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    expected = (
        f"model folder {folder} has no tokenizer (none of tokenizer.json, tokenizer.model, vocab.json, "
        "vocab.txt, spiece.model, tokenizer_config.json); copy the model's tokenizer files into it"
    )
    with pytest.raises(ValueError) as err:
        load_tokenizer(folder)
    assert str(err.value) == expected
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["measure", str(folder), "--lengths", "1", "--train-len", "8", "--windows", "1"])
    assert one_line(exit_info) == f"error: {expected}"
    (folder / "tokenizer.json").write_text("{not json")  # present but broken: transformers' reason, in one line
    with pytest.raises(ValueError) as err:
        load_tokenizer(folder)
    assert str(err.value).startswith(f"{folder}: cannot load its tokenizer (") and len(str(err.value).splitlines()) == 1


def test_a_folder_in_the_model_cache_named_by_path_sweeps_dead_processes_debris(llama_folder, tmp_path, monkeypatch):
    """Issue 44 #15: a converted model named by its path (`measure-hf --model .cache/NAME`, as the shipped
    pretrained store's command does) touches the cache without fetch.verify: its debris goes too."""
    from attnres_helpers import paths
    from attnres_helpers.hf.folders import local_folder

    cache = tmp_path / "cache"
    model = Path(shutil.copytree(llama_folder, cache / "tiny-llama"))
    monkeypatch.setattr(paths, "CACHE", cache)
    dead, live = cache / f".tiny-llama.tmp-{2**31 - 1}", cache / f".other.tmp-{os.getppid()}"
    downloads = cache / "downloads" / "tiny-llama" / f".x.gguf.tmp-{2**31 - 1}"
    for path in (dead, live, downloads):
        path.mkdir(parents=True)
    assert local_folder(model) == model
    assert not dead.exists() and not downloads.exists() and live.is_dir()
    assert local_folder(llama_folder) == llama_folder  # outside the cache: nothing is swept there


@pytest.mark.parametrize("bos", ["none", "first"])
def test_measure_hf_takes_a_registry_name(llama_folder, monkeypatch, capsys, bos):
    """Issue 44 #9: `measure-hf --model smollm2-135m-instruct --json` said "model folder … does not exist"
    with the converted model present. A registry name (here a tiny stand-in) is its verified folder, its
    context as L, its BOS policy and its name as the run's."""
    import dataclasses
    from types import SimpleNamespace

    from attnres_helpers.hf import fetch, models, pretrained

    entry = dataclasses.replace(models.SMOLLM2, name="tiny-registry", context=16, bos=bos)
    monkeypatch.setitem(models.PRETRAINED_MODELS, entry.name, entry)
    verified = []
    monkeypatch.setattr(fetch, "verify", lambda e: verified.append(e.name) or llama_folder)
    monkeypatch.setattr(pretrained, "load_tokenizer", lambda folder: SimpleNamespace(bos_token_id=7))
    cli_main(["measure", entry.name, "--json", "--lengths", "1,2", "--windows", "1"])
    recs = json.loads(capsys.readouterr().out)
    assert verified == [entry.name]
    assert {r["run"] for r in recs} == {entry.name} and {r["eval_len"] for r in recs} == {16, 32}
    assert {(r["train_len"], r["bos"], r["bos_id"]) for r in recs} == {(16, bos, 7 if bos == "first" else None)}
    model = tiny_llama()
    ids = pretrained.held_out_ids(model)
    meta = {"encoding": "rope", "train_len": 16, "seed": 0, "model": entry.name, "architecture": "llama"}
    profiles, _ = pretrained.measure_store(
        model,
        entry.name,
        meta | {"bos": bos, "bos_id": 7 if bos == "first" else None},
        [16, 32],
        n_windows=1,
        progress=False,
        ids=ids,
        bos=7 if bos == "first" else None,
    )
    from attnres_helpers.store import records

    assert json.loads(json.dumps(records(profiles))) == recs  # the same measurement, BOS first where the policy says
