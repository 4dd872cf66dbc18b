"""MLflow tracking, by job: ``store`` (where a results directory's store is, opening it, the
client, retries through a busy store), ``runs`` (a parent run per invocation, a child run per
RunSpec, written with explicit run ids so that workers log to their own child runs) and
``queries`` (the runs of an experiment, the finished and the running ones). The names below are
the package's face: callers write ``tracking.start_child_run``, whichever module holds it.
"""

from __future__ import annotations

from benchmark.tracking.queries import (
    finished_child_runs,
    latest_child_run,
    latest_parent_run_id,
    process_gone,
    run_status,
    running_children,
    running_parent_runs,
    search_all_runs,
)
from benchmark.tracking.runs import (
    CLAIMS_TAG,
    EXPERIMENT_TAGS,
    MlflowTracker,
    child_params,
    close_run,
    experiment_id,
    judged_by,
    resume_child_run,
    start_child_run,
    start_parent_run,
    supersede_attempts,
)
from benchmark.tracking.store import (
    DEFAULT_RESULTS_DIR,
    MLFLOW_BATCH_LIMIT,
    MLFLOW_TABLES,
    TRACKING_SCHEMES,
    client,
    default_tracking_uri,
    describe_uri,
    ensure_store,
    redact,
    retry,
)

__all__ = [
    "CLAIMS_TAG",
    "DEFAULT_RESULTS_DIR",
    "EXPERIMENT_TAGS",
    "MLFLOW_BATCH_LIMIT",
    "MLFLOW_TABLES",
    "MlflowTracker",
    "TRACKING_SCHEMES",
    "child_params",
    "client",
    "close_run",
    "default_tracking_uri",
    "describe_uri",
    "ensure_store",
    "experiment_id",
    "finished_child_runs",
    "judged_by",
    "latest_child_run",
    "latest_parent_run_id",
    "process_gone",
    "redact",
    "resume_child_run",
    "retry",
    "run_status",
    "running_children",
    "running_parent_runs",
    "search_all_runs",
    "start_child_run",
    "start_parent_run",
    "supersede_attempts",
]
