"""``python -m benchmark ui``: the MLflow UI on the results' store."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmark.cli.common import (
    add_store_arguments,
    existing_store,
)

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    ui = commands.add_parser("ui", help="the MLflow UI on the results' store; prints the runs page of each suite")
    ui.add_argument("--port", type=int, default=None, help="port to serve on (default $PORT, else 5000)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    add_store_arguments(ui)


def command_ui(args: argparse.Namespace, console: Output) -> int:
    """Print where each suite's runs are, then become ``mlflow ui`` (one worker: it starts in seconds)."""
    from agents.errors import ConfigError
    from benchmark import tracking

    port = args.port if args.port is not None else int(os.environ.get("PORT") or 5000)
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    tracking_uri = existing_store(args)
    client = tracking.client(tracking_uri)
    experiments = [e for e in tracking.retry(lambda: client.search_experiments()) if e.name != "Default"]
    server = tracking_uri.startswith(("http://", "https://"))  # a tracking server serves its own UI
    address = tracking_uri.rstrip("/") if server else f"http://{'localhost' if args.host in ('127.0.0.1', '0.0.0.0') else args.host}:{port}"
    view = "?workflowType=machine_learning"  # MLflow 3 opens on its GenAI view otherwise
    console.print(
        f"MLflow UI at {address}/#/experiments{view}{'' if server else ' (Ctrl-C stops it)'}; the runs of each suite and study:",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for experiment in experiments:
        if experiment.tags.get("mlflow.experimentKind") != tracking.EXPERIMENT_TAGS["mlflow.experimentKind"]:
            # an experiment made before this tag: MLflow 3 would open it in its GenAI view
            try:
                for key, value in tracking.EXPERIMENT_TAGS.items():
                    tracking.retry(lambda: client.set_experiment_tag(experiment.experiment_id, key, value))
            except Exception:  # noqa: BLE001 - a read-only store: the link below opens the runs all the same
                pass
        console.print(f"  {experiment.name}: {address}/#/experiments/{experiment.experiment_id}/runs{view}", markup=False, highlight=False, soft_wrap=True)
    if not experiments:
        console.print("  (none yet: run a suite first)", markup=False, highlight=False)
    if server:
        return 0
    mlflow = Path(sys.executable).with_name("mlflow")
    artifacts = (args.results_dir / "mlartifacts").resolve()
    command = [
        str(mlflow),
        "ui",
        "--backend-store-uri",
        tracking_uri,
        "--default-artifact-root",
        str(artifacts),
        "--host",
        args.host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    sys.stdout.flush()
    os.execv(command[0], command)
    return 0  # not reached


COMMANDS = {"ui": command_ui}
