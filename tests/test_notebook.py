"""The notebooks' folded answers (attnres_helpers.notebook): computed, shown closed, its text intact."""

from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from attnres_helpers.notebook import SUMMARY, fold


def test_fold_is_a_closed_disclosure_with_the_text_escaped():
    bundle = fold("Answer: 1 < 2\n", ("<table><tr><td>3</td></tr></table>",))
    html = bundle["text/html"]
    assert html.startswith(f"<details><summary><b>{SUMMARY}</b></summary>") and html.endswith("</details>")
    assert "<details open" not in html  # closed until the reader opens it
    assert "<table><tr><td>3</td></tr></table><pre>Answer: 1 &lt; 2\n</pre>" in html  # tables first, then text
    assert bundle["text/plain"] == "Answer: 1 < 2\n"


def test_folded_answer_in_a_kernel_shows_one_folded_output_and_nothing_else():
    shell = InteractiveShell.instance()
    with capture_output() as outer:
        shell.run_cell(
            "from attnres_helpers.notebook import folded_answer\n"
            "from IPython.display import display, HTML\n"
            "with folded_answer('Answer to exercise 9: click to open'):\n"
            "    display(HTML('<b>table</b>'))\n"
            "    print('Answer: 42')\n"
        )
    assert outer.stdout == ""  # nothing printed unfolded
    [shown] = outer.outputs
    assert shown.data["text/html"] == (
        "<details><summary><b>Answer to exercise 9: click to open</b></summary>"
        "<b>table</b><pre>Answer: 42\n</pre></details>"
    )


def test_an_error_inside_shows_what_was_printed_unfolded():
    shell = InteractiveShell.instance()
    with capture_output() as outer:
        result = shell.run_cell(
            "from attnres_helpers.notebook import folded_answer\n"
            "with folded_answer():\n    print('partial')\n    1 / 0\n"
        )
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert "partial" in outer.stdout.splitlines()  # printed, not just shown in the traceback's source line
    assert not any("text/html" in o.data for o in outer.outputs)


def test_every_solution_cell_is_folded_and_hides_nothing_by_cell_flags():
    """Run All must reveal no answer: every code cell that solves an exercise runs under folded_answer, with
    its source hidden, and no cell relies on outputs_hidden (which autosave drops after Run All)."""
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parents[1]
    problems, solutions = [], 0
    for path in sorted(root.glob("notebooks/*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, 4).cells):
            jupyter = cell.metadata.get("jupyter", {})
            if jupyter.get("outputs_hidden"):
                problems.append(f"{path.name} cell {i}: outputs_hidden")
            if cell.cell_type == "code" and cell.source.startswith("# Solution to exercise"):
                solutions += 1
                if "with folded_answer(" not in cell.source or not jupyter.get("source_hidden"):
                    problems.append(f"{path.name} cell {i}: a solution not folded, or its source shown")
    assert solutions >= 20 and problems == [], problems


def test_no_code_cell_is_longer_than_twenty_lines():
    """Notebooks are thin: prose, a few calls, figures; logic that needs more lives in the package."""
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parents[1]
    long = [
        f"{path.name} cell {i}: {len(cell.source.splitlines())} lines"
        for path in sorted(root.glob("notebooks/*.ipynb"))
        for i, cell in enumerate(nbformat.read(path, 4).cells)
        if cell.cell_type == "code" and len(cell.source.splitlines()) > 20
    ]
    assert long == [], long


def test_folded_answer_keeps_figures_images_markdown_and_math_folded():
    """Issue 44 #18: only each output's HTML or plain text was kept, so a figure shown inside an answer
    became "<Figure size 640x480 with 1 Axes>". Every bundle keeps its richest form, inside the fold, and a
    figure the block left open is shown there too (the inline backend would show it after the fold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from IPython.core.pylabtools import select_figure_formats

    shell = InteractiveShell.instance()
    select_figure_formats(shell, {"png"})  # as the inline backend of a kernel does
    before = set(plt.get_fignums())  # figures other tests left open in this process are not this one's
    try:
        with capture_output() as outer:
            shell.run_cell(
                "import matplotlib.pyplot as plt\n"
                "from attnres_helpers.notebook import folded_answer\n"
                "from IPython.display import Markdown, Math, SVG, display\n"
                "with folded_answer():\n"
                "    shown = plt.figure(); plt.plot([1, 2]); display(shown); plt.close(shown)\n"
                "    display(Markdown('**R** rises'))\n"
                "    display(Math(r'R = \\frac{1}{2}'))\n"
                '    display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg"><circle r="1"/></svg>\'))\n'
                "    plt.figure(); plt.plot([2, 1])  # left open\n"
                "    print('Answer: 42')\n"
            )
        assert set(plt.get_fignums()) == before  # the open figure was shown in the fold and closed
    finally:
        select_figure_formats(shell, set())
    assert outer.stdout == "" and len(outer.outputs) == 1  # nothing shown unfolded
    html = outer.outputs[0].data["text/html"]
    assert html.startswith(f"<details><summary><b>{SUMMARY}</b></summary>") and html.endswith("</details>")
    assert html.count('<img src="data:image/png;base64,iVBOR') == 2 and "Figure size" not in html
    assert "<strong>R</strong> rises" in html and "Markdown object" not in html
    assert r"R = \frac{1}{2}" in html and "Math object" not in html
    assert '<circle r="1"/>' in html and "<pre>Answer: 42\n</pre>" in html
