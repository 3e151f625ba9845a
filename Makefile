# BigFleet developer entry points. Everything runs inside .venv, which
# `make install` creates on a fresh machine; every other target depends on it.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install dev test test-unit test-workflows test-integration test-e2e test-chaos bench lint proto proto-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,test]'
	# The engine's compiled loops, cached on disk once instead of in the first test (ADR 0162).
	$(PY) -c 'from shard_engine import kernels; kernels.warm()'
	touch $(STAMP)

## The full stack on embedded defaults with a demo fleet (Ctrl-C stops it).
## DEV_ARGS passes options on, e.g. rehearsing operations:
##   make dev DEV_ARGS="--drain-seconds 120"   drains take about two minutes (escalate, force)
##   make dev DEV_ARGS="--stuck-drain"         one drain never finishes: AwaitingOperator
##   make dev DEV_ARGS="--shards 2 --fresh"    two shards, from empty state
## (`.venv/bin/bigfleet dev --help` lists them all.)
dev: install
	$(PY) -m bigfleet dev $(DEV_ARGS)

## Every test tier.
test: install
	$(PY) scripts/gen_proto.py --check
	$(PY) -m pytest -q -m "not chaos" $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -q tests/unit

test-workflows: install
	$(PY) -m pytest -q tests/workflows

test-integration: install
	$(PY) -m pytest -q tests/integration

test-e2e: install
	$(PY) -m pytest -q tests/e2e

## Fault injection: every scenario, each part in its own process (several minutes).
test-chaos: install
	$(PY) -m pytest -q -s tests/chaos $(PYTEST_ARGS)

## Benchmarks print JSON lines; figures are recorded in docs/benchmarks.md.
bench: install
	$(PY) -m bench all

## ruff, mypy --strict (packages and tests), and the layering contracts (import-linter).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

proto: install
	$(PY) scripts/gen_proto.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
