# The two commands of the README: `make run` and `make test`. Both install what they need first.
SHELL := /bin/bash
HOST ?= 127.0.0.1
PORT ?= 8000
# WikiText-2 and other evaluation data; on these machines it sits beside the repository.
export PRUNECAST_DATA_DIR ?= $(abspath ../shared/data)
export HF_HUB_OFFLINE ?= 1

.PHONY: run test test-fast lint fmt typecheck install install-dev

install:
	scripts/bootstrap.sh runtime

install-dev:
	scripts/bootstrap.sh dev

## run: install, migrate the store and serve the API (embedded: SQLite + in-process worker by default)
run: install
	.venv/bin/prunecast migrate
	.venv/bin/prunecast serve --host $(HOST) --port $(PORT)

lint: install-dev
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

## fmt: format and fix what ruff can (imports, simple rewrites)
fmt: install-dev
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

## typecheck: mypy, as strict as pyproject.toml says (every def typed, no unused ignores)
typecheck: install-dev
	.venv/bin/mypy

## test-fast: the suite without PostgreSQL, Redis or a real model (tests marked services or slow)
test-fast: install-dev
	.venv/bin/pytest -q -m "not slow and not services" $(PYTEST_ARGS)

## test: install (Python and Debian packages), start PostgreSQL and Redis if down, lint, run the suite
test: install-dev
	scripts/system-packages.sh
	scripts/services.sh
	$(MAKE) --no-print-directory lint
	.venv/bin/pytest $(PYTEST_ARGS)
