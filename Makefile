# reprorl: `make bench` runs a suite, `make test` runs the tests. Both create .venv first.
PYTHON ?= python3
VENV   ?= .venv
# The CPU wheel; GPU users: make install TORCH="torch==2.13.0 --index-url ..." or any torch spec.
TORCH  ?= torch==2.13.0
SUITE  ?= smoke
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
ARGS   ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install bench test perf ui list clean-results

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

bench: $(STAMP)
	$(BIN)/python -m benchmark run --suite $(SUITE) --workers $(WORKERS) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

# micro-benchmarks (pytest-benchmark): buffer insert/sample at capacity 1M, one update per algorithm
perf: $(STAMP)
	$(BIN)/python -m pytest benchmarks -p no:xdist --benchmark-enable --benchmark-only \
		--benchmark-columns=min,median,mean,ops,rounds --benchmark-sort=fullname $(ARGS)

list: $(STAMP)
	$(BIN)/python -m benchmark list

ui: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri sqlite:///results/mlflow.db --default-artifact-root ./results/mlartifacts
