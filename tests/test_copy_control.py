"""experiments.copy_control: the copy-control command holds its store's lock from the start."""

import pytest

from attnres_helpers import files
from attnres_helpers.experiments import copy_control


def test_a_second_copy_control_on_one_store_is_refused_before_any_work(tmp_path, monkeypatch):
    out = tmp_path / "copy_control.safetensors"
    monkeypatch.setattr(copy_control, "load_splits", lambda: pytest.fail("work started under a held lock"))
    with files.exclusive(out):
        with pytest.raises(RuntimeError, match="is being written by another process"):
            copy_control.measure_copy_control(out=out, progress=False)
    assert not out.exists()
