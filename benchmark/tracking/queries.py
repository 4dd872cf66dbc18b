"""MLflow queries: the runs of an experiment, the finished children of a launch, the running
ones, and whether a run's process is still alive."""

from __future__ import annotations

import os
import socket
from typing import Any

from benchmark.tracking.store import client, retry


def search_all_runs(mlflow_client: Any, experiment_id: str, query: str, order_by: list[str] | None = None) -> list[Any]:
    """Every run of ``experiment_id`` matching ``query``, through all result pages."""
    runs, token = [], None
    while True:
        page = retry(lambda: mlflow_client.search_runs([experiment_id], query, max_results=1000, order_by=order_by, page_token=token))
        runs += list(page)
        token = page.token
        if not token:
            return runs


def finished_child_runs(
    tracking_uri: str, experiment_name: str | None, run_keys: set[str], experiment_id: str | None = None, started_since_ms: int = 0
) -> dict[str, Any]:
    """run key -> its most recent FINISHED child run in the experiment (by name or id), for the
    keys given; with ``started_since_ms``, only runs started at or after that time (ms since the
    epoch: a resumed run keeps its first start)."""
    mlflow_client = client(tracking_uri)
    if experiment_id is None:
        experiment = retry(lambda: mlflow_client.get_experiment_by_name(experiment_name))
        if experiment is None:
            return {}
        experiment_id = experiment.experiment_id
    if not run_keys:
        return {}
    found: dict[str, Any] = {}
    query = "attributes.status = 'FINISHED' and " + (f"tags.run_key = '{next(iter(run_keys))}'" if len(run_keys) == 1 else "tags.run_key != ''")
    if started_since_ms:
        query += f" and attributes.start_time >= {int(started_since_ms)}"
    for run in search_all_runs(mlflow_client, experiment_id, query, ["attributes.start_time DESC"]):
        key = run.data.tags.get("run_key")
        if key in run_keys and key not in found:
            found[key] = run
    return found


def latest_parent_run_id(tracking_uri: str, experiment_name: str) -> str | None:
    """The most recent suite invocation (parent run) in ``experiment_name``, if any."""
    mlflow_client = client(tracking_uri)
    experiment = retry(lambda: mlflow_client.get_experiment_by_name(experiment_name))
    if experiment is None:
        return None
    runs = retry(lambda: mlflow_client.search_runs([experiment.experiment_id], "tags.kind = 'suite'", max_results=1, order_by=["attributes.start_time DESC"]))
    return runs[0].info.run_id if runs else None


def running_parent_runs(tracking_uri: str, experiment_id: str) -> list[Any]:
    """The suite invocations (parent runs) of the experiment still marked RUNNING."""
    return search_all_runs(client(tracking_uri), experiment_id, "tags.kind = 'suite' and attributes.status = 'RUNNING'")


def running_children(tracking_uri: str, experiment_id: str, parent_run_id: str) -> list[Any]:
    """The child runs of ``parent_run_id`` still marked RUNNING."""
    query = f"tags.`mlflow.parentRunId` = '{parent_run_id}' and attributes.status = 'RUNNING'"
    return search_all_runs(client(tracking_uri), experiment_id, query)


def run_status(tracking_uri: str, run_id: str) -> str:
    return retry(lambda: client(tracking_uri).get_run(run_id)).info.status


def latest_child_run(tracking_uri: str, experiment_id: str, run_key: str) -> Any | None:
    """The most recently started run of ``run_key`` in the experiment, if any."""
    runs = retry(
        lambda: client(tracking_uri).search_runs([experiment_id], f"tags.run_key = '{run_key}'", max_results=1, order_by=["attributes.start_time DESC"])
    )
    return runs[0] if runs else None


def process_gone(tags: dict[str, str]) -> bool:
    """Whether the process a run's ``host`` and ``pid`` tags name is known to be gone: only
    answerable on that host (a reused pid errs on the side of 'alive')."""
    if tags.get("host") != socket.gethostname() or not tags.get("pid", "").isdigit():
        return False
    return not _pid_alive(int(tags["pid"]))


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
