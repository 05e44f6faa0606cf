"""The registry of real pretrained models (attnres_helpers/hf/models.py): entries are checked when made,
and every list of real models is read from it. No model is needed."""

import dataclasses

import pytest
from helpers import ROOT

from attnres_helpers.hf import fetch
from attnres_helpers.hf.models import GEMMA3, PRETRAINED_MODELS, SMOLLM2, PretrainedModel, Wheel, pretrained_model
from attnres_helpers.paths import CACHE


def test_the_registry_holds_both_models_under_their_names():
    assert list(PRETRAINED_MODELS) == ["smollm2-135m-instruct", "gemma-3-270m"]
    assert all(name == m.name for name, m in PRETRAINED_MODELS.items())
    assert pretrained_model("gemma-3-270m") is GEMMA3
    assert [int(k * GEMMA3.context) for k in GEMMA3.multiples] == [512, 1024, 2048, 4096]
    assert SMOLLM2.bos == "none" and GEMMA3.bos == "first"
    assert len({m.store for m in PRETRAINED_MODELS.values()}) == len(PRETRAINED_MODELS)
    assert fetch.model_dir(GEMMA3) == CACHE / "gemma-3-270m"


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(PretrainedModel) if f.name != "bca_multiples"])
def test_an_entry_missing_a_field_is_refused(field):
    empty = {"wheels": (), "context": None, "windows": None, "per_head_up_to": None, "multiples": ()}.get(field, "")
    with pytest.raises(ValueError, match=f"the field '{field}' is empty"):
        dataclasses.replace(GEMMA3, **{field: empty})
    with pytest.raises(TypeError):  # a field left out altogether
        PretrainedModel(**{f.name: getattr(GEMMA3, f.name) for f in dataclasses.fields(GEMMA3) if f.name != field})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gguf_sha256": "ab" * 31}, "64 lower-case hex"),
        ({"bos": "last"}, "bos must be one of"),
        ({"name": "Gemma 3"}, "a name is lower-case"),
        ({"windows": 0}, "windows must be a positive integer"),
        ({"multiples": (1 / 3,)}, "whole tokens"),
        ({"wheels": (Wheel("gemma", "x.whl", "0" * 64, "m"),)}, "pinned requirement"),
    ],
)
def test_an_entry_with_a_bad_field_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(GEMMA3, **change)


def test_an_unknown_name_is_one_line_and_a_non_zero_exit(cli):
    with pytest.raises(
        ValueError, match="no pretrained model 'gemma'; the registry has smollm2-135m-instruct, gemma-3-270m"
    ):
        pretrained_model("gemma")
    done = cli("fetch", "gemma")  # in-process (tests/test_cli.py starts the command as a process)
    assert (
        done.returncode != 0 and done.stderr.strip().count("\n") == 0 and "no pretrained model 'gemma'" in done.stderr
    )


def test_the_makefile_and_ci_read_the_models_from_the_registry():
    """No model name or store path is written into the Makefile or .ci/run: they fetch and measure every entry."""
    text = (ROOT / "Makefile").read_text() + (ROOT / ".ci" / "run").read_text()
    assert "attnres fetch\n" in text and "attnres reproduce pretrained\n" in text
    for m in PRETRAINED_MODELS.values():
        assert m.name not in text and m.store_path.name not in text
        assert m.store_path.parent.is_dir()
