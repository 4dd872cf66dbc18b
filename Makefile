# reprorl: `make bench` runs a suite, `make test` runs the tests. Both create .venv first.
PYTHON ?= python3
VENV   ?= .venv
# The CPU wheel; GPU users: make install TORCH="torch==2.13.0 --index-url ..." or any torch spec.
TORCH  ?= torch==2.13.0
# optional extras installed with the package: dev (tests), ray (--executor ray), slurm (--executor slurm: submitit)
EXTRAS ?= dev,ray,slurm
SUITE  ?= smoke
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
# make tune: the algorithm, the environment, and how many trials to add to the study
ALGO   ?=
ENV    ?=
TRIALS ?= 20
# trials at once: WORKERS when given, else 2 (many parallel trials turn TPE into random search)
TUNE_WORKERS = $(if $(filter command line environment,$(origin WORKERS)),$(WORKERS),2)
ARGS   ?=
# make ui: the port of the MLflow UI
PORT   ?= 5000
SUDO   := $(if $(filter 0,$(shell id -u)),,sudo -n)
INSTALL_CHROMIUM = { $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -q >/dev/null 2>&1 && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; }; } || true
# evaluate --video: MuJoCo draws offscreen through EGL (Mesa's software renderer without a GPU);
# installed from the OS packages where apt can (best effort: the tests skip what has no backend)
INSTALL_GL = { $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q libegl1 libgl1-mesa-dri >/dev/null 2>&1 || { $(SUDO) apt-get update -q >/dev/null 2>&1 && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q libegl1 libgl1-mesa-dri >/dev/null 2>&1; }; } || true

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
COMPARE_STAMP := $(VENV)/.compare-installed
DOCS_STAMP := $(VENV)/.docs-installed

# a micro-benchmark fails `make perf-regress` when its median is this much slower than the
# stored baseline (150% = 2.5x): see docs/performance.md, "Speed regressions", for why 2.5x
PERF_FACTOR ?= 150%
PERF_BASELINE := results/perf/baseline

.PHONY: install bench test test-example lint docs test-all perf perf-micro perf-baseline perf-regress report report-check baseline regress tune dashboard ui list clean-results

install: $(STAMP)

# pip byte-compiles what it installs one file at a time (two thirds of a 3-minute install on 2
# cores); COMPILE does it on every core instead. Like pip it skips a file this Python cannot
# compile (torch ships a 3.12-only test helper), and it leaves the packages' own test suites out.
PIP_INSTALL = $(BIN)/pip install --quiet --no-compile
COMPILE = $(BIN)/python -m compileall -qq -j 0 -x 'site-packages/.+/tests/' $(VENV)/lib || true

$(STAMP): pyproject.toml Makefile examples/redq/pyproject.toml
	@{ ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1 ' && ldconfig -p | grep -q 'libEGL_mesa.so.0 '; } || ! command -v apt-get >/dev/null 2>&1 || $(INSTALL_GL)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(PIP_INSTALL) $(TORCH)
	$(PIP_INSTALL) -e ".[$(EXTRAS)]"
	$(PIP_INSTALL) --no-deps -e examples/redq
	$(COMPILE)
	touch $(STAMP)

bench: $(STAMP)
	$(BIN)/python -m benchmark run --suite $(SUITE) --workers $(WORKERS) $(ARGS)

# on every core, as CI runs them: two workers more than the cores (the tests wait on the processes
# they start about a third of the time; each worker holds 1-2 GB); TEST_WORKERS=0: in one process
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 2 )))
test: $(STAMP)
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal) $(ARGS)

# the example plug-in's own tests (examples/redq, installed with the package: docs/benchmark-your-own.md)
test-example: $(STAMP)
	cd examples/redq && $(abspath $(BIN))/python -m pytest -q

# ruff's lint rules and its formatting, then mypy over agents/ and benchmark/ (settings in
# pyproject.toml); `ruff format` fixes the formatting
LINTED = agents benchmark reprorl tests microbenchmarks docs examples
lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

# make test and the learning tests it leaves out (the `extended` marker: tests/test_learning.py)
test-all: $(STAMP)
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal) -m "extended or not extended" $(ARGS)

# throughput side by side with Stable-Baselines3 and Stable Baselines Jax (installs the compare and
# compare-jax extras first): PPO, SAC, TD3
# on HalfCheetah-v5 and DQN on CartPole-v1, beside the env-only and update-floor bounds; the table
# is printed and written to results/perf/compare.json. ARGS='--profile' adds where the time goes.
perf: $(COMPARE_STAMP)
	$(BIN)/python -m benchmark perf $(ARGS)

$(COMPARE_STAMP): $(STAMP)
	$(PIP_INSTALL) -e ".[$(EXTRAS),compare,compare-jax]"
	$(COMPILE)
	touch $(COMPARE_STAMP)

# the documentation site (mkdocs.yml): built into site/, strictly (a broken link or page fails);
# ARGS=serve serves it with live reload at http://127.0.0.1:8000 instead
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs $(if $(filter serve,$(ARGS)),serve,build --strict --quiet)

$(DOCS_STAMP): $(STAMP)
	$(PIP_INSTALL) -e ".[$(EXTRAS),docs]"
	touch $(DOCS_STAMP)

# micro-benchmarks (pytest-benchmark): buffer insert/sample at capacity 1M, one update per algorithm
perf-micro: $(STAMP)
	$(PERF_PYTEST) $(ARGS)

# the measured suite report from MLflow: results/reports/$(SUITE)/report.md and report.html
report: $(STAMP)
	$(BIN)/python -m benchmark report --suite $(SUITE) $(ARGS)

# run the ci suite and store its final scores in results/baselines/ci.json (commit that file)
baseline: $(STAMP)
	$(BIN)/python -m benchmark baseline --suite ci --workers $(WORKERS) $(ARGS)

# rerun the ci suite on new seeds; exits 1 and names the configuration when one regressed
regress: $(STAMP)
	$(BIN)/python -m benchmark regress --suite ci --workers $(WORKERS) $(ARGS)

PERF_PYTEST = $(BIN)/python -m pytest microbenchmarks -p no:xdist --benchmark-enable --benchmark-only \
	--benchmark-columns=min,median,mean,ops,rounds --benchmark-sort=fullname

# store the micro-benchmarks' timings as the speed baseline (commit results/perf/baseline)
# (timed into a temporary directory that replaces the stored one only when every benchmark ran)
perf-baseline: $(STAMP)
	rm -rf $(PERF_BASELINE).new
	$(PERF_PYTEST) --benchmark-storage=file://$(PERF_BASELINE).new --benchmark-save=baseline $(ARGS)
	rm -rf $(PERF_BASELINE) && mv $(PERF_BASELINE).new $(PERF_BASELINE)

# fail when a micro-benchmark's median is slower than the baseline by more than PERF_FACTOR
perf-regress: $(STAMP)
	@test -d $(PERF_BASELINE) || { echo "no speed baseline in $(PERF_BASELINE): run make perf-baseline first"; exit 2; }
	$(PERF_PYTEST) --benchmark-storage=file://$(PERF_BASELINE) --benchmark-compare \
		--benchmark-compare-fail=median:$(PERF_FACTOR) $(ARGS)

# add TRIALS trials to the Optuna study of ALGO on ENV (results/optuna.db), WORKERS at once;
# then: python -m benchmark tune show|export ALGO-ENV
tune: $(STAMP)
	@test -n "$(ALGO)" -a -n "$(ENV)" || { echo "usage: make tune ALGO=ppo ENV=CartPole-v1 [TRIALS=20] [WORKERS=n] [ARGS='--steps 50000 ...']"; exit 2; }
	$(BIN)/python -m benchmark tune --algo $(ALGO) --env $(ENV) --trials $(TRIALS) --workers $(TUNE_WORKERS) $(ARGS)

# browse the Optuna studies in results/optuna.db
dashboard: $(STAMP)
	$(BIN)/optuna-dashboard sqlite:///results/optuna.db

list: $(STAMP)
	$(BIN)/python -m benchmark list

# the MLflow UI on results/mlflow.db at http://localhost:$(PORT)/ (prints each suite's runs page)
ui: $(STAMP)
	$(BIN)/python -m benchmark ui --port $(PORT) $(ARGS)

# report.html in headless Chromium at desktop and phone width (installs Debian's chromium when missing);
# the screenshots are kept in results/reports/screenshots: look at them
report-check: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || $(INSTALL_CHROMIUM)
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { echo "report-check needs Chromium (apt-get install chromium)"; exit 2; }
	REPORT_SCREENSHOTS=results/reports/screenshots $(BIN)/python -m pytest tests/test_report_browser.py tests/test_readme_browser.py -p no:xdist -q -rs
