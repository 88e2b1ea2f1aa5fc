# The two commands of the README: `make run` and `make test`. Both install what they need first.
SHELL := /bin/bash
HOST ?= 127.0.0.1
PORT ?= 8000
# WikiText-2 and other evaluation data; on these machines it sits beside the repository.
export PRUNECAST_DATA_DIR ?= $(abspath ../shared/data)
export HF_HUB_OFFLINE ?= 1

.PHONY: run test lint install install-dev

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

## test: install (Python and Debian packages), start PostgreSQL and Redis if down, lint, run the suite
test: install-dev
	scripts/system-packages.sh
	scripts/services.sh
	$(MAKE) --no-print-directory lint
	.venv/bin/pytest $(PYTEST_ARGS)
