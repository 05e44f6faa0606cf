"""The reader's copies that `make lab` opens (scripts/reading_copies.py): reading never changes a tracked
notebook, a pull reaches the copies the reader has not changed, and a changed copy is never overwritten
unless asked by name."""

import importlib.util

import pytest
from helpers import ROOT

_spec = importlib.util.spec_from_file_location("reading_copies", ROOT / "scripts" / "reading_copies.py")
reading_copies = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reading_copies)


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for name in ("01_a.ipynb", "02_b.ipynb"):
        (tmp_path / "notebooks" / name).write_text(f'{{"cells": ["{name} v1"]}}')
    return tmp_path


def test_first_start_copies_every_notebook(repo):
    lines = reading_copies.refresh(repo)
    assert lines == [f"copied notebooks/{n} -> reading/{n}" for n in ("01_a.ipynb", "02_b.ipynb")]
    for name in ("01_a.ipynb", "02_b.ipynb"):
        assert (repo / "reading" / name).read_bytes() == (repo / "notebooks" / name).read_bytes()
    assert reading_copies.refresh(repo) == []  # a second start has nothing to do


def test_a_pull_replaces_untouched_copies_and_keeps_the_readers(repo):
    reading_copies.refresh(repo)
    (repo / "reading" / "02_b.ipynb").write_text('{"cells": ["my notes"]}')  # the reader ran and saved it
    for name in ("01_a.ipynb", "02_b.ipynb"):
        (repo / "notebooks" / name).write_text(f'{{"cells": ["{name} v2"]}}')  # a git pull
    lines = reading_copies.refresh(repo)
    assert lines[0] == "copied notebooks/01_a.ipynb -> reading/01_a.ipynb"
    assert lines[1].startswith("kept your copy of 02_b.ipynb (notebooks/02_b.ipynb has changed")
    assert lines[1].endswith("python scripts/reading_copies.py --reset 02_b.ipynb")
    assert (repo / "reading" / "01_a.ipynb").read_text() == '{"cells": ["01_a.ipynb v2"]}'
    assert (repo / "reading" / "02_b.ipynb").read_text() == '{"cells": ["my notes"]}'
    # asked by name, the reader's copy is replaced
    assert reading_copies.refresh(repo, ("02_b.ipynb",)) == ["replaced notebooks/02_b.ipynb -> reading/02_b.ipynb"]
    assert (repo / "reading" / "02_b.ipynb").read_text() == '{"cells": ["02_b.ipynb v2"]}'


def test_a_copy_changed_by_the_reader_stays_when_nothing_was_pulled(repo):
    reading_copies.refresh(repo)
    (repo / "reading" / "01_a.ipynb").write_text("mine")
    assert reading_copies.refresh(repo) == []
    assert (repo / "reading" / "01_a.ipynb").read_text() == "mine"


def test_unknown_reset_name_is_one_line_error_and_debris_is_removed(repo):
    reading_copies.refresh(repo)
    debris = repo / "reading" / ".01_a.ipynb.tmp-12345"  # a killed start's temporary
    debris.write_text("half")
    with pytest.raises(SystemExit, match=r"^error: no notebook named 09_x.ipynb in "):
        reading_copies.refresh(repo, ("09_x.ipynb",))
    reading_copies.refresh(repo)
    assert not debris.exists()
