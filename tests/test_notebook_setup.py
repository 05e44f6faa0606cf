"""notebook.setup(): what every notebook's first code line does."""

import os

import IPython


class _Shell:
    def __init__(self):
        self.magics = []

    def run_line_magic(self, name, line):
        self.magics.append((name, line))


def test_setup_asks_for_png_figures_and_sets_the_rc_and_an_offline_hub(monkeypatch):
    import matplotlib.pyplot as plt

    from attnres_helpers.notebook import NOTEBOOK_RC, setup

    shell = _Shell()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setitem(plt.rcParams, "font.size", 7.0)
    setup()
    assert shell.magics == [("config", "InlineBackend.figure_formats = ['png']")]
    assert os.environ["HF_HUB_OFFLINE"] == "1" and all(plt.rcParams[k] == v for k, v in NOTEBOOK_RC.items())
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # outside a kernel: the rc and the environment only
    setup()
