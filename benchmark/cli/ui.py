"""``python -m benchmark ui``: the MLflow UI on the results' store."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import (
    add_store_arguments,
    existing_store,
)
from benchmark.results_layout import ResultsDir

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    ui = commands.add_parser("ui", help="the MLflow UI on the results' store; prints the runs page of each suite")
    ui.add_argument("--port", type=int, default=None, help="port to serve on (default $PORT, else 5000)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    add_store_arguments(ui)


def command_ui(args: argparse.Namespace, console: Output) -> int:
    """Start ``mlflow ui`` (one worker: it starts in seconds) with its log in the results
    directory, print where each suite's runs are once it answers, and serve until Ctrl-C."""
    from benchmark import tracking

    port = args.port if args.port is not None else int(os.environ.get("PORT") or 5000)
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    tracking_uri = existing_store(args)
    client = tracking.client(tracking_uri)
    experiments = [e for e in tracking.retry(lambda: client.search_experiments()) if e.name != "Default"]
    for experiment in experiments:
        if experiment.tags.get("mlflow.experimentKind") != tracking.EXPERIMENT_TAGS["mlflow.experimentKind"]:
            # an experiment made before this tag: MLflow 3 would open it in its GenAI view
            try:
                for key, value in tracking.EXPERIMENT_TAGS.items():
                    tracking.retry(lambda: client.set_experiment_tag(experiment.experiment_id, key, value))
            except Exception:  # noqa: BLE001 - a read-only store: the link below opens the runs all the same
                pass
    server = tracking_uri.startswith(("http://", "https://"))  # a tracking server serves its own UI
    address = tracking_uri.rstrip("/") if server else f"http://{'localhost' if args.host in ('127.0.0.1', '0.0.0.0') else args.host}:{port}"
    if server:
        _print_pages(console, address, experiments, "")
        return 0
    log_path = ResultsDir(args.results_dir).ui_log
    command = [
        str(Path(sys.executable).with_name("mlflow")),
        "ui",
        "--backend-store-uri",
        tracking_uri,
        "--default-artifact-root",
        str(ResultsDir(args.results_dir).artifacts.resolve()),
        "--host",
        args.host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with open(log_path, "ab") as log:  # its access log would bury the links
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_this_process
        )
    try:
        _wait_until_answering(f"http://127.0.0.1:{port}/health" if args.host in ("127.0.0.1", "0.0.0.0") else f"{address}/health", process, log_path)
        _print_pages(console, address, experiments, f" (Ctrl-C stops it; its log: {log_path})")
        process.wait()
        raise ConfigError(f"the MLflow UI stopped with exit code {process.returncode}: {_last_line(log_path)} (its log: {log_path})")
    except KeyboardInterrupt:
        console.print("MLflow UI stopped", highlight=False, markup=False)
        return 0
    finally:  # the server and the processes it started (uvicorn, its job runners): its whole group
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)


def _die_with_this_process() -> None:
    """In the server's process, before it runs mlflow: SIGTERM when ``ui`` ends, however it ends."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (linux/prctl.h)


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _print_pages(console: Output, address: str, experiments: list[Any], note: str) -> None:
    view = "?workflowType=machine_learning"  # MLflow 3 opens on its GenAI view otherwise
    console.print(f"MLflow UI at {address}/#/experiments{view}{note}; the runs of each suite and study:", markup=False, highlight=False, soft_wrap=True)
    for experiment in experiments:
        console.print(f"  {experiment.name}: {address}/#/experiments/{experiment.experiment_id}/runs{view}", markup=False, highlight=False, soft_wrap=True)
    if not experiments:
        console.print("  (none yet: run a suite first)", markup=False, highlight=False)
    # seen in headless Chromium: these links hold the classic view, but a run opened from the
    # table gets the GenAI side bar ("Evaluations"); MLflow's UI keeps the choice in the
    # browser's local storage (mlflow.workflowType, default genai), set only by its switch
    console.print("  (a run opened from its table keeps the classic view once the side bar is switched to 'Model training')", markup=False, highlight=False)


def _wait_until_answering(url: str, process: subprocess.Popen, log_path: Path, timeout: float = 120.0) -> None:
    """Return once ``url`` answers; ConfigError naming the log's last line when the server ends first or never answers."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigError(f"the MLflow UI did not start (exit code {process.returncode}): {_last_line(log_path)} (its log: {log_path})")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise ConfigError(f"the MLflow UI did not answer at {url} within {timeout:.0f} s (its log: {log_path})")


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "it wrote nothing"


COMMANDS = {"ui": command_ui}
