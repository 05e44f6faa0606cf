"""Sphinx configuration of the rendered book (``make book``; ``scripts/build_book.py`` stages the sources).

The notebooks are rendered as committed, executed: myst-nb never runs a cell (``nb_execution_mode = "off"``).
Everything a page needs is inside the site: the theme's own files, and MathJax from the
``sphinx-mathjax-offline`` package (Sphinx's default would load MathJax from a CDN, so math would stay raw
source on a train ride). Nothing is downloaded at build time or when a page is read.
"""

import sys
from pathlib import Path

project = "attnres: attention resolution"
author = "the attnres companion"
copyright = "the attnres companion's authors"

extensions = ["myst_nb", "sphinx-mathjax-offline"]

# Only what scripts/build_book.py staged is a page; nothing else under the staging folder is read.
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

nb_execution_mode = "off"  # the committed outputs, as they are
nb_merge_streams = True  # a cell's printed lines in one block, as JupyterLab shows them
myst_enable_extensions = ["dollarmath", "amsmath", "html_image", "colon_fence"]
myst_heading_anchors = 3  # GitHub's anchors for headings (README.md#conventions-stated-tested)

# The glossary's headings carry their anchors as HTML (`### <a id="sink"></a>Sink (attention sink)`), which
# GitHub and JupyterLab follow; the book gives each of them that id (book/book_slugs.py, importable so that
# Sphinx can pickle it with its environment).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from book_slugs import heading_slug  # noqa: E402

myst_heading_slug_func = heading_slug
# myst.header: the notebooks' sections are H2 under one H1, by design; config.cache: Sphinx keeps no config
# holding a function between builds, so it reads every page again (make book builds with -E anyway).
suppress_warnings = ["myst.header", "config.cache"]

html_theme = "sphinx_book_theme"
html_title = "attnres: attention resolution"
html_static_path = ["_static"]
html_css_files = ["attnres.css"]
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,  # the notebooks are downloadable from the repository itself
    "use_fullscreen_button": False,
    "navigation_with_keys": True,
}
html_last_updated_fmt = None
html_copy_source = False
html_show_sourcelink = False
