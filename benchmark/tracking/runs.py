"""MLflow runs: a parent run per invocation, a child run per RunSpec, written through
``MlflowClient`` with explicit run ids (no global active run), so that worker processes log to
their own child runs. Metrics are buffered and sent with ``log_batch``; a run that fails is
marked FAILED with its error, never left RUNNING."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

from benchmark import stores
from benchmark.provenance import code_version, command_line, environment_tags, kernel_tags, source_tags
from benchmark.tracking.queries import search_all_runs
from benchmark.tracking.store import MLFLOW_BATCH_LIMIT, client, retry


class MlflowTracker:
    """Logs one run's metrics in batches; implements benchmark.training.results.Tracker."""

    def __init__(self, tracking_uri: str, run_id: str, flush_every: int = 500):
        self.client = client(tracking_uri)
        self.run_id = run_id
        self.flush_every = flush_every
        self._pending: list[Any] = []
        self.logged_through: dict[str, int] = {}
        """metric key -> the last step an earlier attempt of this run stored: a resumed run
        does not log those steps again."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        self._pending += [Metric(key, float(value), timestamp, step) for key, value in metrics.items() if step > self.logged_through.get(key, -1)]
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        while self._pending:
            chunk, self._pending = self._pending[:MLFLOW_BATCH_LIMIT], self._pending[MLFLOW_BATCH_LIMIT:]
            retry(lambda: self.client.log_batch(self.run_id, metrics=chunk))

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(key, str(value)) for key, value in params.items()]
        for start in range(0, len(items), 100):
            retry(lambda: self.client.log_batch(self.run_id, params=items[start : start + 100]))

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(key, str(value)) for key, value in tags.items()]
        retry(lambda: self.client.log_batch(self.run_id, tags=items))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        retry(lambda: self.client.log_artifact(self.run_id, str(path), artifact_path))

    def log_text(self, text: str, artifact_file: str) -> None:
        retry(lambda: self.client.log_text(self.run_id, text, artifact_file))

    def finish(self, status: str = "FINISHED") -> None:
        self.flush()
        retry(lambda: self.client.set_terminated(self.run_id, status))

    def fail(self, error: BaseException, status: str | None = None) -> bool:
        """Mark ``status`` (default: FAILED, KILLED for an interrupt) with the error as a tag and an
        artifact. Best effort: when the store itself fails (a full disk, say) the run stays open,
        and the next launch that trains its run key closes it; False then."""
        status = status or ("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        message = f"{type(error).__name__}: {error}"
        self._pending.clear()
        try:
            self.set_tags({"error": message[:5000]})
            self.log_text("".join(traceback.format_exception(error)), "error.txt")
        except Exception:  # noqa: BLE001 - the error is the caller's to report; the status matters more
            pass
        try:
            retry(lambda: self.client.set_terminated(self.run_id, status))
        except Exception:  # noqa: BLE001
            return False
        return True


EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
"""MLflow 3's UI opens an experiment of this kind on its runs table (not the GenAI view)."""


def experiment_id(tracking_uri: str, name: str, artifact_root: Path) -> str:
    """Id of experiment ``name``, created with artifacts under ``artifact_root`` if new; safe when
    launches race to create it (the loser reads the winner's). StoreError for a deleted one."""
    from mlflow.exceptions import MlflowException

    mlflow_client = client(tracking_uri)
    experiment = retry(lambda: mlflow_client.get_experiment_by_name(name))
    if experiment is None:
        location = (artifact_root / name).resolve().as_uri()
        try:
            return retry(lambda: mlflow_client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS))
        except MlflowException as error:
            experiment = retry(lambda: mlflow_client.get_experiment_by_name(name))
            if experiment is None:  # not a lost race
                raise error from None
    if experiment.lifecycle_stage != "active":
        raise stores.StoreError(
            f"experiment {name!r} (id {experiment.experiment_id}) was deleted from the tracking store: restore it "
            f"(mlflow experiments restore --experiment-id {experiment.experiment_id}) or remove it for good (mlflow gc)"
        )
    if experiment.tags.get("mlflow.experimentKind") is None:  # made by an earlier version
        for key, value in EXPERIMENT_TAGS.items():
            retry(lambda: mlflow_client.set_experiment_tag(experiment.experiment_id, key, value))
    return experiment.experiment_id


CLAIMS_TAG = "claims_id"
"""The identity of the claims directory a run's launch used (``benchmark.execution.claims.directory_id``)."""


def judged_by(tags: dict[str, str], claims_id: str) -> bool:
    """Whether a launch using claims directory ``claims_id`` may judge this run's liveness by its
    claims: the run was made through the same directory, or by a version that had no claims. A
    run of another results directory sharing the store is never its to close."""
    return tags.get(CLAIMS_TAG, claims_id) == claims_id


def supersede_attempts(tracking_uri: str, experiment_id: str, run_key: str, run_id: str, claims_id: str) -> list[str]:
    """Link the earlier unfinished runs of ``run_key`` to ``run_id``, which replaces them: a
    ``superseded_by`` tag on each (and ``supersedes`` on the new one), and the ones still RUNNING
    (their process died before they could close) marked KILLED. Only for a caller that holds the
    run key's claim in claims directory ``claims_id``: then no live process of that directory
    trains any of them. Returns the ids linked."""
    mlflow_client = client(tracking_uri)
    query = f"tags.run_key = '{run_key}' and attributes.status != 'FINISHED'"
    earlier = [
        run
        for run in search_all_runs(mlflow_client, experiment_id, query)
        if run.info.run_id != run_id and "superseded_by" not in run.data.tags and judged_by(run.data.tags, claims_id)
    ]
    for run in earlier:
        if run.info.status == "RUNNING":
            close_run(tracking_uri, run.info.run_id, "KILLED", f"its process ended without closing it; replaced by run {run_id}")
        retry(lambda: mlflow_client.set_tag(run.info.run_id, "superseded_by", run_id))
    if earlier:
        before = retry(lambda: mlflow_client.get_run(run_id)).data.tags.get("supersedes", "")
        linked = " ".join(dict.fromkeys([*before.split(), *(run.info.run_id for run in earlier)]))
        retry(lambda: mlflow_client.set_tag(run_id, "supersedes", linked))
    return [run.info.run_id for run in earlier]


def close_run(tracking_uri: str, run_id: str, status: str, error: str) -> None:
    """End a run with ``status`` and the reason as its ``error`` tag."""
    mlflow_client = client(tracking_uri)
    retry(lambda: mlflow_client.set_tag(run_id, "error", error))
    retry(lambda: mlflow_client.set_terminated(run_id, status))


def start_parent_run(tracking_uri: str, experiment: str, run_name: str, tags: dict[str, Any]) -> MlflowTracker:
    mlflow_client = client(tracking_uri)
    all_tags = {
        **source_tags(),
        **code_version(),
        **environment_tags(),
        "command": command_line(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        **tags,
    }
    run = retry(lambda: mlflow_client.create_run(experiment, run_name=run_name, tags={k: str(v) for k, v in all_tags.items()}))
    return MlflowTracker(tracking_uri, run.info.run_id)


def child_params(spec: Any) -> dict[str, Any]:
    """A RunSpec as MLflow params: algo, env_id, seed, suite, budget.*, hp.*, env.kwargs/wrappers."""
    params: dict[str, Any] = {"algo": spec.algo, "env_id": spec.env_id, "seed": spec.seed, "suite": spec.suite}
    params.update({f"budget.{key}": value for key, value in dataclasses.asdict(spec.budget).items()})
    params.update({f"hp.{key}": value for key, value in spec.hyperparameters.items()})
    params.update({f"env.{name}": json.dumps(value, sort_keys=True) for name, value in (("kwargs", spec.env_kwargs), ("wrappers", spec.wrappers)) if value})
    return params


def start_child_run(
    tracking_uri: str,
    experiment: str,
    parent_run_id: str,
    run_name: str,
    tags: dict[str, Any],
    params: dict[str, Any],
) -> MlflowTracker:
    mlflow_client = client(tracking_uri)
    all_tags = {**source_tags(), **code_version(), **environment_tags(), **kernel_tags(), **tags, "mlflow.parentRunId": parent_run_id}
    run = retry(lambda: mlflow_client.create_run(experiment, run_name=run_name, tags={k: str(v) for k, v in all_tags.items()}))
    tracker = MlflowTracker(tracking_uri, run.info.run_id)
    tracker.log_params(params)
    return tracker


def resume_child_run(
    tracking_uri: str,
    run_id: str | None,
    parent_run_id: str,
    tags: dict[str, Any],
    resumed_from_step: int,
    experiment_id: str | None = None,
) -> MlflowTracker | None:
    """Reopen the unfinished child run ``run_id`` under ``parent_run_id``, or None when it no
    longer exists, was deleted, already finished or belongs to an experiment other than
    ``experiment_id`` (another suite that trains the same run key).

    The tracker skips every (metric, step) the earlier attempt stored, so no step is logged twice.
    """
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    mlflow_client = client(tracking_uri)
    try:
        run = retry(lambda: mlflow_client.get_run(run_id))
    except MlflowException:
        return None
    if run.info.lifecycle_stage != "active" or run.info.status == "FINISHED":
        return None
    if experiment_id is not None and run.info.experiment_id != experiment_id:
        return None
    tracker = MlflowTracker(tracking_uri, run_id)
    for key in run.data.metrics:
        history = retry(lambda: mlflow_client.get_metric_history(run_id, key))
        tracker.logged_through[key] = max((metric.step for metric in history), default=-1)
    previous_parent = run.data.tags.get("mlflow.parentRunId", "")
    attempts = int(run.data.tags.get("resume_count", "0")) + 1
    if "error" in run.data.tags:
        retry(lambda: mlflow_client.delete_tag(run_id, "error"))
    tracker.set_tags(
        {  # the new parent first: a run RUNNING under its dead parent is another launch's to close
            **tags,
            "mlflow.parentRunId": parent_run_id,
            "first_parent_run_id": run.data.tags.get("first_parent_run_id", previous_parent),
            "resume_count": attempts,
            "resumed_from_step": resumed_from_step,
        }
    )
    retry(lambda: mlflow_client.update_run(run_id, status="RUNNING"))
    return tracker
