"""The reader's copies that `make lab` opens (scripts/reading_copies.py): reading never changes a tracked
notebook, a pull reaches the copies the reader has not changed, and a changed copy is never overwritten
unless asked by name."""

import importlib.util
import sys

import pytest
from helpers import ROOT, dead_pid, read_only

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
    debris = repo / "reading" / f".01_a.ipynb.tmp-{dead_pid()}"  # a killed start's temporary
    debris.write_text("half")
    with pytest.raises(SystemExit, match=r"^error: no notebook named 09_x.ipynb in "):
        reading_copies.refresh(repo, ("09_x.ipynb",))
    reading_copies.refresh(repo)
    assert not debris.exists()


def test_only_dead_processes_temporaries_are_removed(repo):
    """Issue 44 #17: a start removed every .*.tmp-* in reading/, a live writer's too (four starts at once
    failed with 'cannot write reading/...'); only a dead process's are removed now."""
    import os

    (repo / "reading").mkdir()
    live = repo / "reading" / f".01_a.ipynb.tmp-{os.getppid()}"  # another process's, alive
    dead = repo / "reading" / f".02_b.ipynb.tmp-{dead_pid()}"
    for path in (live, dead):
        path.write_text("half")
    reading_copies.refresh(repo)
    assert live.read_text() == "half" and not dead.exists()


def _run(capsys, *argv):
    """The script's main: (status, stderr lines), stdout checked to hold no traceback."""
    try:
        status = reading_copies.main(list(argv))
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (print(exit_.code, file=sys.stderr) or 1)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return status, out.err.splitlines()


def _full_disk(path, write):
    err = OSError(f"cannot write {path}: No space left on device")  # as files.atomic_write names a failure
    err.errno = 28
    raise err


@pytest.mark.parametrize(
    "case", ["missing-root", "reading-is-a-file", "record-is-a-list", "full-disk", "read-only-root"]
)
def test_every_user_error_is_one_line_and_nothing_of_the_readers_is_lost(repo, capsys, monkeypatch, case):
    """Issue 44 #16: each of these gave a traceback; now one line on stderr, status 1, and the reader's
    files as they were."""
    root, expected = repo, None
    if case == "missing-root":
        root = repo / "mistyped"
        expected = f"error: --root {root} holds no notebooks/ folder; give the repository's folder"
    elif case == "reading-is-a-file":
        (repo / "reading").write_text("my notes")
        expected = f"error: {repo / 'reading'} is not a folder; move it away, and the copies are made there"
    elif case == "record-is-a-list":
        reading_copies.refresh(repo)
        (repo / "reading" / "01_a.ipynb").write_text("mine")
        (repo / "reading" / ".made-from.json").write_text("[1, 2]")
        (repo / "notebooks" / "01_a.ipynb").write_text('{"cells": ["v2"]}')
        status, lines = _run(capsys, "--root", str(root))
        assert status == 0 and (repo / "reading" / "01_a.ipynb").read_text() == "mine"  # unrecorded: the reader's
        assert lines == []
        return
    elif case == "full-disk":
        reading_copies.refresh(repo)
        (repo / "notebooks" / "01_a.ipynb").write_text('{"cells": ["v2"]}')
        monkeypatch.setattr(reading_copies, "atomic_write", _full_disk)
        expected = f"error: cannot write {repo / 'reading' / '01_a.ipynb'}: No space left on device"
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    if case == "read-only-root":
        with read_only(repo):
            status, lines = _run(capsys, "--root", str(root))
        assert status == 1 and len(lines) == 1 and lines[0].startswith("error: ")
        assert str(repo / "reading") in lines[0]
    else:
        status, lines = _run(capsys, "--root", str(root))
        assert status == 1 and lines == [expected]
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before


def test_a_copy_that_is_a_link_is_kept_and_said(repo, capsys):
    """Issue 44 #16: a copy that is a symlink (the reader's own arrangement) gave a traceback; it is kept,
    with one line saying how to replace it."""
    (repo / "reading").mkdir()
    (repo / "mine.ipynb").write_text("my notebook")
    (repo / "reading" / "01_a.ipynb").symlink_to(repo / "mine.ipynb")
    status, _ = _run(capsys, "--root", str(repo))
    out = reading_copies.refresh(repo)
    assert status == 0 and out == [
        "kept reading/01_a.ipynb: it is a link or not a file, not a copy made here; to replace it: "
        "python scripts/reading_copies.py --reset 01_a.ipynb"
    ]
    assert (repo / "reading" / "01_a.ipynb").is_symlink() and (repo / "mine.ipynb").read_text() == "my notebook"


def test_inside_the_lab_every_link_leads_to_the_copies(repo):
    """reading/README.md and reading/GLOSSARY.md link the copies beside them, not notebooks/; the copies link
    reading/GLOSSARY.md; every other relative link goes one folder up (issue 42: README links in the lab)."""
    (repo / "README.md").write_text(
        "[01](notebooks/01_a.ipynb) [sink](GLOSSARY.md#sink) ![f](data/figures/x.png) [d](DESIGN.md) "
        "[web](https://example.org/a) [here](#two-commands)\n"
    )
    (repo / "GLOSSARY.md").write_text("[notebook 02](notebooks/02_b.ipynb) [conventions](README.md#conventions)\n")
    (repo / "notebooks" / "01_a.ipynb").write_text('{"cells": ["[sink](../GLOSSARY.md#sink)"]}')
    lines = reading_copies.refresh(repo)
    assert lines[-2:] == [f"made reading/{n} from {n}, its links leading to your copies" for n in reading_copies.GUIDES]
    readme = (repo / "reading" / "README.md").read_text().splitlines()
    assert readme[0].startswith("<!-- Made by make lab")
    assert readme[1] == (
        "[01](01_a.ipynb) [sink](GLOSSARY.md#sink) ![f](../data/figures/x.png) [d](../DESIGN.md) "
        "[web](https://example.org/a) [here](#two-commands)"
    )
    glossary = (repo / "reading" / "GLOSSARY.md").read_text().splitlines()[1]
    assert glossary == "[notebook 02](02_b.ipynb) [conventions](README.md#conventions)"
    assert (repo / "reading" / "01_a.ipynb").read_text() == '{"cells": ["[sink](GLOSSARY.md#sink)"]}'
    assert reading_copies.refresh(repo) == []  # nothing changed: nothing made again
    (repo / "README.md").write_text("[02](notebooks/02_b.ipynb)\n")  # a pull changes the README
    assert reading_copies.refresh(repo) == ["made reading/README.md from README.md, its links leading to your copies"]
    assert (repo / "reading" / "README.md").read_text().splitlines()[1] == "[02](02_b.ipynb)"
