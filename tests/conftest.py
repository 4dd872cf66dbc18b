import contextlib
import gc
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

# One intra-op thread per test process, as every run of the suite uses (RunSpec.torch_threads):
# tests that drive an algorithm directly would otherwise take a thread per core each, and two
# xdist workers on two cores then oversubscribe them several times over.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_inherited_terminal_size():
    """A CLI the tests start writes as it does to any pipe: readline, once something imports it
    (pytest's debugger support does), exports COLUMNS=80 and LINES=24 into the process
    environment behind os.environ's back, and the CLI honours COLUMNS like a user's (its tables
    fit it). The tests of narrow terminals set COLUMNS themselves."""
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
        os.unsetenv(name)


TINY_SUITE = """
name: tiny
seeds: [0, 1]
budget: {total_steps: 512, eval_every: 256, eval_episodes: 2}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 2, num_steps: 64, num_minibatches: 2, num_epochs: 2, hidden_sizes: [16, 16]}
  - algo: sac
    envs: [Pendulum-v1]
    budget: {total_steps: 300, eval_every: 150}
    seeds: [0]
    hyperparameters: {learning_starts: 100, batch_size: 32, hidden_sizes: [16, 16], buffer_size: 1000}
"""


@pytest.fixture
def write_suite(tmp_path: Path):
    """Write YAML text to a suite file in tmp_path and return its path."""

    def write(text: str, name: str = "suite.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def tiny_suite(write_suite) -> Path:
    return write_suite(TINY_SUITE, "tiny.yaml")


DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds each long test took in a full run (setup, call and teardown), longest first: a
scheduling hint, never an assertion. ``WRITE_TEST_DURATIONS=1 make test`` rewrites it."""
_measured: dict[str, float] = {}


def pytest_collection_modifyitems(config, items):
    """The longest tests first (as measured; a learning test not measured yet counts as long),
    dealt round the workers: pytest-xdist's worksteal hands each of W workers a contiguous share
    and lets an idle worker take the tail of a busy one's, so each share starts with every W-th
    longest test and ends with short ones. Sorted but not dealt, the first share held all the
    long tests, which then ran one after another on one worker while the others stole its tail."""
    expected = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items.sort(key=lambda item: -expected.get(item.nodeid, 60 if item.get_closest_marker("learning") else 0))
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:  # share r: items r, r + W, r + 2W, ... (the same order on every worker, as xdist requires)
        items[:] = [items[index] for share in range(workers) for index in range(share, len(items), workers)]


def pytest_collection_finish(session):
    """Freeze what collection loaded (torch, MLflow, Ray, the test modules): the collections
    during the tests then skip that heap, which lives until the end anyway (about 5% of an
    in-process training's time here)."""
    gc.collect()
    gc.freeze()


def pytest_runtest_logreport(report):
    if os.environ.get("WRITE_TEST_DURATIONS"):
        _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("WRITE_TEST_DURATIONS") and os.environ.get("PYTEST_XDIST_WORKER") is None and exitstatus == 0:
        long = {nodeid: round(seconds) for nodeid, seconds in sorted(_measured.items(), key=lambda kv: -kv[1]) if seconds >= 3}
        DURATIONS.write_text(json.dumps(long, indent=0) + "\n")


TEST_CPU_LOG = "TEST_CPU_LOG"
"""``TEST_CPU_LOG=/tmp/cpu.tsv make test`` appends one line per test: its node id, the CPU seconds
of the test's process and every process under it (those still alive, and those reaped, through
their parents' children times), and its wall seconds. On 2 busy cores CPU, not wall time, is
what a test costs CI (docs/regression.md)."""


def _process_tree_cpu_seconds() -> float:
    import psutil

    here = psutil.Process()
    total = 0.0
    for process in [here, *here.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # ended meanwhile: its parent's children times hold it once reaped
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get(TEST_CPU_LOG)
    if not log:
        yield
        return
    cpu, wall = _process_tree_cpu_seconds(), time.monotonic()
    yield
    with open(log, "a") as out:  # one short line per write: workers append to one file
        out.write(f"{item.nodeid}\t{_process_tree_cpu_seconds() - cpu:.2f}\t{time.monotonic() - wall:.2f}\n")


ROOT = Path(__file__).resolve().parent.parent


def run_cli_in_process(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m benchmark ARGS`` run by this process, as a fresh process would run it: in
    ``cwd``, with its own ``sys.argv``, its output captured and its exit code returned, and none
    of what a process keeps between commands (stores it has checked, MLflow's open engines)
    carried over to the next call. It saves the 5-10 s of imports of each new interpreter, and
    the local pool's fork server started by the first launch serves the later ones. The tests
    of what only a separate process shows (signals, kills, the terminal, every line it writes
    to stderr) start the real command. ``env`` sets environment variables for the call only."""
    from benchmark import tracking
    from benchmark.cli import app

    out, err = io.StringIO(), io.StringIO()
    directory, argv, handler = os.getcwd(), sys.argv, signal.getsignal(signal.SIGTERM)
    saved = {name: os.environ.get(name) for name in env or {}}
    try:
        os.environ.update(env or {})
        os.chdir(cwd)
        sys.argv = [str(ROOT / "benchmark" / "__main__.py"), *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = app.main(list(args))
            except SystemExit as exit:  # argparse's refusals
                code = exit.code if isinstance(exit.code, int) else 1
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        os.chdir(directory)
        sys.argv = argv
        signal.signal(signal.SIGTERM, handler)
        _forget_stores(tracking)
    return subprocess.CompletedProcess(["python", "-m", "benchmark", *args], code, out.getvalue(), err.getvalue())


def as_from_a_terminal(*args: str) -> list[str]:
    """The command line of ``python -m benchmark ARGS`` with Ctrl-C raising KeyboardInterrupt as
    in a terminal (pytest-xdist's workers ignore SIGINT, and their children inherit that)."""
    launcher = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = {['benchmark', *args]!r}; runpy.run_module('benchmark', run_name='__main__')"
    )
    return [sys.executable, "-c", launcher]


def run_cli_subprocess(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m benchmark ARGS`` in a new interpreter."""
    return subprocess.run([sys.executable, "-m", "benchmark", *args], cwd=cwd, capture_output=True, text=True, timeout=900)


def _forget_stores(tracking) -> None:
    tracking.store._checked_stores.clear()
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service import utils

    for engine in SqlAlchemyStore._engine_map.values():
        engine.dispose()
    SqlAlchemyStore._engine_map.clear()
    type(utils._tracking_store_registry)._get_store_with_resolved_uri.cache_clear()


class Reached(Exception):
    """Raised by ``stop_once`` at the first evaluation that passes its test (the run ends there)."""

    def __init__(self, evaluation) -> None:
        super().__init__(f"reached at step {evaluation.step:,}")


def stop_once(reached) -> tuple:
    """An ``on_evaluation`` callback for a learning test whose claim is "reaches X at some
    evaluation": training ends at the first evaluation for which ``reached(evaluation)`` holds
    (the loop raises ``Reached`` out of ``run``), rather than running out a budget that can only
    add evaluations the claim does not look at. Returns (callback, the evaluations seen so far)."""
    seen: list = []

    def callback(evaluation) -> None:
        seen.append(evaluation)
        if reached(evaluation):
            raise Reached(evaluation)

    return callback, seen
