"""scripts/execute_notebooks.py (`make execute`): a notebook is rewritten only where its outputs changed in
substance, so running the notebooks on a checkout leaves git status clean."""

import copy
import importlib.util
from pathlib import Path

import nbformat
import pytest
from helpers import ROOT

SCRIPT = ROOT / "scripts" / "execute_notebooks.py"
spec = importlib.util.spec_from_file_location("execute_notebooks", SCRIPT)
execute_notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(execute_notebooks)


def notebook(path: Path, *sources: str, tags: dict[int, list[str]] | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s, metadata={"tags": (tags or {}).get(i, [])}) for i, s in enumerate(sources)]
    nbformat.write(nb, path)
    return path


def test_a_second_run_leaves_the_file_byte_for_byte(tmp_path):
    # two flushes of one stream, a timing behind a comment marker and one behind a tag: all volatile
    path = notebook(
        tmp_path / "a.ipynb",
        "print('one', flush=True)\nprint('two')",
        "# NBVAL_IGNORE_OUTPUT\nimport time; print(time.perf_counter_ns())",
        "import time; print(time.perf_counter_ns())",
        "(tmp := __import__('pathlib').Path('data.txt')).read_text()",
        tags={2: ["nbval-ignore-output"]},
    )
    (tmp_path / "data.txt").write_text("first")
    assert execute_notebooks.execute(path, timeout=60)  # outputs filled in: a change of substance, written
    assert "first" in nbformat.read(path, 4).cells[3].outputs[0].data["text/plain"]
    written = path.read_bytes()
    assert execute_notebooks.execute(path, timeout=60) is False  # new timings only
    assert path.read_bytes() == written
    assert nbformat.read(path, 4).cells[0].outputs[0].text == "one\ntwo\n"  # merged as nbconvert merges
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ipynb", "data.txt"]  # no temporary left


def test_substance_leaves_out_flushes_timings_and_widget_ids_but_not_outputs():
    """What :func:`execute` compares (each kernel run above costs seconds, so the cases are built here)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("print('one'); print('two')"),
        nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(1)"),
        nbformat.v4.new_code_cell("w"),
        nbformat.v4.new_code_cell("2"),
        nbformat.v4.new_code_cell("print(3)", metadata={"tags": ["nbval-skip"]}),
    ]
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="one\ntwo\n")]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="123\n")]
    view = {"model_id": "a1", "version_major": 2, "version_minor": 0}
    nb.cells[2].outputs = [nbformat.v4.new_output("display_data", data={execute_notebooks.WIDGET_VIEW: view})]
    nb.cells[3].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=1)]
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", name="stdout", text="3\n")]
    same = copy.deepcopy(nb)  # as JupyterLab saves it: each flush its own output; other timings and ids
    same.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in ("one\n", "two\n")]
    same.cells[1].outputs[0].text = "456\n"
    same.cells[4].outputs = []
    same.cells[2].outputs[0].data[execute_notebooks.WIDGET_VIEW]["model_id"] = "b2"
    same.cells[3].metadata["execution"] = {"iopub.status.idle": "2026-12-03T09:00:00Z"}
    same.metadata["widgets"] = {"state": {}}
    assert execute_notebooks.substance(same) == execute_notebooks.substance(nb)
    changed = copy.deepcopy(nb)
    changed.cells[3].outputs[0].data["text/plain"] = "3"
    assert execute_notebooks.substance(changed) != execute_notebooks.substance(nb)


def test_a_failing_cell_names_the_notebook_and_leaves_it(tmp_path):
    path = notebook(tmp_path / "b.ipynb", "1 / 0")
    before = path.read_bytes()
    with pytest.raises(SystemExit, match=r"b\.ipynb: a cell failed \(ZeroDivisionError.*the file is unchanged"):
        execute_notebooks.execute(path, timeout=60)
    assert path.read_bytes() == before


def test_a_missing_notebook_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        execute_notebooks.main(["no/such.ipynb"])
    assert exit_info.value.code == 2
    assert "no such notebook: no/such.ipynb" in capsys.readouterr().err
