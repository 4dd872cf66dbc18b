"""MLflow tracking: a parent run per invocation, a child run per RunSpec.

Everything goes through ``MlflowClient`` with explicit run ids (no global active run), so
worker processes can log to their own child runs. Metrics are buffered and sent with
``log_batch``; a run that fails is marked FAILED with its error, never left RUNNING.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, TypeVar

DEFAULT_RESULTS_DIR = Path("results")
MLFLOW_BATCH_LIMIT = 1000  # metrics per log_batch call accepted by MLflow
PACKAGES = ("torch", "numpy", "gymnasium", "mujoco", "mlflow", "optuna")

T = TypeVar("T")


def default_tracking_uri(results_dir: Path = DEFAULT_RESULTS_DIR) -> str:
    """$MLFLOW_TRACKING_URI if set, else SQLite in ``results_dir``."""
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if env_uri:
        return env_uri
    return f"sqlite:///{(results_dir / 'mlflow.db').resolve()}"


def client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def retry(call: Callable[[], T], attempts: int = 6, delay: float = 0.25) -> T:
    """Retry a store call that SQLite may refuse while another process writes ("database is locked")."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - MLflow wraps the SQLite error in several types
            if attempt == attempts - 1 or "locked" not in str(error).lower():
                raise
            time.sleep(delay * 2**attempt)
    raise AssertionError("unreachable")


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str]:
    """git sha and dirty flag of the working tree (``unknown`` outside a git checkout)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": "unknown", "git_dirty": "unknown"}
    return {"git_sha": sha, "git_dirty": str(dirty).lower()}


def git_diff(root: Path | None = None) -> str:
    """``git diff HEAD`` of the working tree (what a dirty run ran that the sha does not say);
    untracked files are not code the run imported, and do not count as dirty either."""
    root = root or Path(__file__).resolve().parent.parent
    try:
        return subprocess.run(["git", "diff", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_models() -> str:
    """Names of the visible CUDA devices ('none' without CUDA); torch is imported only if loaded."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return "none"
    return "; ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


@functools.lru_cache(maxsize=1)
def environment_tags() -> dict[str, str]:
    """Versions of Python and of the packages that decide the numbers, and the CPU/GPU models."""
    tags = {
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "gpu_model": gpu_models(),
    }
    for package in PACKAGES:
        try:
            tags[f"version.{package}"] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            tags[f"version.{package}"] = "not installed"
    return tags


class MlflowTracker:
    """Logs one run's metrics in batches; implements benchmark.train.Tracker."""

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
        self._pending += [
            Metric(key, float(value), timestamp, step)
            for key, value in metrics.items()
            if step > self.logged_through.get(key, -1)
        ]
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

    def fail(self, error: BaseException, status: str | None = None) -> None:
        """Mark ``status`` (default: FAILED, KILLED for an interrupt) with the error as a tag and an artifact."""
        status = status or ("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        message = f"{type(error).__name__}: {error}"
        try:
            self._pending.clear()
            self.set_tags({"error": message[:5000]})
            self.log_text("".join(traceback.format_exception(error)), "error.txt")
        finally:
            retry(lambda: self.client.set_terminated(self.run_id, status))


def experiment_id(tracking_uri: str, name: str, artifact_root: Path) -> str:
    """Id of experiment ``name``, created with artifacts under ``artifact_root`` if new."""
    mlflow_client = client(tracking_uri)
    experiment = retry(lambda: mlflow_client.get_experiment_by_name(name))
    if experiment is not None:
        return experiment.experiment_id
    location = (artifact_root / name).resolve().as_uri()
    return retry(lambda: mlflow_client.create_experiment(name, artifact_location=location))


def search_all_runs(mlflow_client: Any, experiment_id: str, query: str, order_by: list[str] | None = None) -> list[Any]:
    """Every run of ``experiment_id`` matching ``query``, through all result pages."""
    runs, token = [], None
    while True:
        page = retry(
            lambda: mlflow_client.search_runs([experiment_id], query, max_results=1000, order_by=order_by, page_token=token)
        )
        runs += list(page)
        token = page.token
        if not token:
            return runs


def finished_child_runs(tracking_uri: str, experiment_name: str, run_keys: set[str]) -> dict[str, Any]:
    """run key -> its most recent FINISHED child run in ``experiment_name``, for the keys given."""
    mlflow_client = client(tracking_uri)
    experiment = retry(lambda: mlflow_client.get_experiment_by_name(experiment_name))
    if experiment is None or not run_keys:
        return {}
    found: dict[str, Any] = {}
    query = "attributes.status = 'FINISHED' and tags.run_key != ''"
    for run in search_all_runs(mlflow_client, experiment.experiment_id, query, ["attributes.start_time DESC"]):
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
    runs = retry(
        lambda: mlflow_client.search_runs(
            [experiment.experiment_id], "tags.kind = 'suite'", max_results=1, order_by=["attributes.start_time DESC"]
        )
    )
    return runs[0].info.run_id if runs else None


def start_parent_run(tracking_uri: str, experiment: str, run_name: str, tags: dict[str, Any]) -> MlflowTracker:
    mlflow_client = client(tracking_uri)
    all_tags = {
        **code_version(), **environment_tags(), "command": " ".join(sys.argv), "host": socket.gethostname(),
        "pid": os.getpid(), **tags,
    }
    run = retry(lambda: mlflow_client.create_run(experiment, run_name=run_name, tags={k: str(v) for k, v in all_tags.items()}))
    return MlflowTracker(tracking_uri, run.info.run_id)


def close_if_orphaned(tracking_uri: str, parent_run_id: str) -> bool:
    """Mark a suite invocation still RUNNING as KILLED when its process, on this host, is gone
    (it was killed without a chance to close its run); True if it was closed."""
    mlflow_client = client(tracking_uri)
    run = retry(lambda: mlflow_client.get_run(parent_run_id))
    tags = run.data.tags
    if run.info.status != "RUNNING" or tags.get("host") != socket.gethostname() or not tags.get("pid", "").isdigit():
        return False
    if _pid_alive(int(tags["pid"])):  # (a reused pid errs on the side of leaving the run open)
        return False
    retry(lambda: mlflow_client.set_tag(parent_run_id, "error", "its process died without closing the run"))
    retry(lambda: mlflow_client.set_terminated(parent_run_id, "KILLED"))
    return True


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_child_run(
    tracking_uri: str,
    experiment: str,
    parent_run_id: str,
    run_name: str,
    tags: dict[str, Any],
    params: dict[str, Any],
) -> MlflowTracker:
    mlflow_client = client(tracking_uri)
    all_tags = {**code_version(), **environment_tags(), **tags, "mlflow.parentRunId": parent_run_id}
    run = retry(lambda: mlflow_client.create_run(experiment, run_name=run_name, tags={k: str(v) for k, v in all_tags.items()}))
    tracker = MlflowTracker(tracking_uri, run.info.run_id)
    tracker.log_params(params)
    return tracker


def resume_child_run(
    tracking_uri: str, run_id: str | None, parent_run_id: str, tags: dict[str, Any], resumed_from_step: int
) -> MlflowTracker | None:
    """Reopen the unfinished child run ``run_id`` under ``parent_run_id``, or None when it no
    longer exists, was deleted or already finished.

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
    tracker = MlflowTracker(tracking_uri, run_id)
    for key in run.data.metrics:
        history = retry(lambda: mlflow_client.get_metric_history(run_id, key))
        tracker.logged_through[key] = max((metric.step for metric in history), default=-1)
    previous_parent = run.data.tags.get("mlflow.parentRunId", "")
    attempts = int(run.data.tags.get("resume_count", "0")) + 1
    retry(lambda: mlflow_client.update_run(run_id, status="RUNNING"))
    if "error" in run.data.tags:
        retry(lambda: mlflow_client.delete_tag(run_id, "error"))
    tracker.set_tags({
        **tags,
        "mlflow.parentRunId": parent_run_id,
        "first_parent_run_id": run.data.tags.get("first_parent_run_id", previous_parent),
        "resume_count": attempts,
        "resumed_from_step": resumed_from_step,
    })
    return tracker
