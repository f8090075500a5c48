# gptrm — two commands: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test proto proto-check lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## run: embedded etcd + coordinator + one local agent (simulated GPUs unless NVML works), in the foreground
run: $(STAMP)
	$(PY) -m coordinator.devcluster

## test: install into .venv, check the generated code, run the whole test suite
test: $(STAMP) proto-check
	$(PY) -m pytest

proto: $(STAMP)
	$(PY) proto/generate.py

proto-check: $(STAMP)
	$(PY) proto/generate.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check agent coordinator common tests proto

## bench: speed and memory benchmarks (not part of `make test`)
bench: $(STAMP)
	@set -e; for f in tests/bench/bench_*.py; do echo "== $$f"; $(PY) $$f; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
