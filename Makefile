# delta-mirror developer tasks. Everything runs in the repo's own virtualenv (.venv).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv test lint demo bench clean distclean

# Re-installs only when pyproject.toml or requirements.txt changed (or the venv is new).
venv: $(STAMP)

$(VENV)/pyvenv.cfg:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(VENV)/pyvenv.cfg pyproject.toml requirements.txt
	$(PY) -m pip install -q -e '.[test]' -r requirements.txt
	touch $@

test: venv
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy --strict --exclude '^include/delta_mirror/airflow/' include/delta_mirror

demo: venv
	$(PY) -m delta_mirror.demo

bench: venv
	$(PY) benchmarks/run.py

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist include/*.egg-info test-artifacts bench-results
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
