"""MLflow tracking: a parent run per invocation, a child run per RunSpec.

Everything goes through ``MlflowClient`` with explicit run ids (no global active run), so
worker processes can log to their own child runs. Metrics are buffered and sent with
``log_batch``; a run that fails is marked FAILED with its error, never left RUNNING.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import logging
import os
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from benchmark import stores
from benchmark.provenance import code_version, command_line, environment_tags, kernel_tags, source_tags
from benchmark.results_layout import ResultsDir

DEFAULT_RESULTS_DIR = Path("results")
MLFLOW_BATCH_LIMIT = 1000  # metrics per log_batch call accepted by MLflow

T = TypeVar("T")


def default_tracking_uri(results_dir: Path = DEFAULT_RESULTS_DIR) -> str:
    """$MLFLOW_TRACKING_URI if set, else SQLite in ``results_dir``."""
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if env_uri:
        return env_uri
    return f"sqlite:///{ResultsDir(results_dir).mlflow_db.resolve()}"


# MLflow logs every failed SQL statement with its traceback before raising it; the error reaches
# its caller anyway, which reports it in one line (a run's error, a full disk, a corrupt store)
logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

MLFLOW_TABLES = {"experiments", "runs", "alembic_version"}
_checked_stores: set[tuple[str, bool, bool]] = set()  # (uri, deep, writing) checked in this process


def describe_uri(tracking_uri: str, short: bool = False) -> str:
    """The store as a reader should see it: a SQLite file by its path relative to the working
    directory when it lies below it (``short``: its name only), a server without its password (``redact``)."""
    path = stores.sqlite_path(tracking_uri)
    if path is not None:
        if short:
            return path.name
        try:
            return str(path.resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(path)
    return redact(tracking_uri)


def redact(url: str) -> str:
    """The URL without its password (for logs and MLflow)."""
    if "://" in url and "@" in url.split("://", 1)[1]:
        scheme, rest = url.split("://", 1)
        credentials, host = rest.rsplit("@", 1)
        return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}" if ":" in credentials else url
    return url


def ensure_store(tracking_uri: str, deep: bool = False, writing: bool = False) -> None:
    """Make the store at ``tracking_uri`` safe to use, once per process: an existing SQLite file is
    checked (an empty, truncated, corrupt or foreign one is refused, never taken for a new store;
    ``deep``, for a command's first look: every page), a missing one is created whole under a lock
    (see benchmark.stores), and a tracking server is asked whether it answers. StoreError (one
    line) when the store cannot be used; ``writing``: also when this process cannot write it."""
    if any(uri == tracking_uri and done_deep >= deep and done_writing >= writing for uri, done_deep, done_writing in _checked_stores):
        return
    scheme = tracking_uri.split("://", 1)[0].split("+", 1)[0] if "://" in tracking_uri else ""
    if scheme not in TRACKING_SCHEMES:
        raise stores.StoreError(
            f"tracking URI {describe_uri(tracking_uri)!r}: unsupported scheme {scheme!r}; use sqlite:///PATH, "
            "http(s)://HOST:PORT (an MLflow server), postgresql://..., mysql://... or mssql://..."
        )
    path = stores.sqlite_path(tracking_uri)
    if path is not None:
        template = stores.Template(f"mlflow-{importlib.metadata.version('mlflow')}", functools.partial(_adopt_mlflow_db, path))
        if not stores.create_once(path, "an MLflow tracking store", MLFLOW_TABLES, _create_mlflow_db, deep, template) and writing:
            stores.check_writable_file(path, "the MLflow tracking store")
    elif scheme in ("http", "https"):
        _check_server(tracking_uri)
    elif scheme:  # a database server: connect now, so that a wrong URL fails before anything starts
        _open_server_store(tracking_uri)
    _checked_stores.add((tracking_uri, deep, writing))


TRACKING_SCHEMES = {"", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks"}


def _open_server_store(tracking_uri: str, attempts: int = 6) -> None:
    """Connect to a database server's store; MLflow creates its tables on first use. Launches
    that start at once on a new database race to create them: the losers see a duplicate key
    or an existing table, and try again once the winner is done."""
    from mlflow.tracking._tracking_service.utils import _get_store

    for attempt in range(attempts):
        try:
            _get_store(tracking_uri)
            return
        except Exception as error:  # noqa: BLE001 - drivers raise many types
            if stores.is_disk_full(error):
                raise
            text = str(error)
            racing = any(sign in text for sign in ("duplicate key", "already exists", "UniqueViolation", "Duplicate entry"))
            if racing and attempt + 1 < attempts:
                getattr(_get_store, "cache_clear", lambda: None)()
                time.sleep(0.5 * (attempt + 1))
                continue
            first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
            raise stores.StoreError(f"cannot open the tracking store {describe_uri(tracking_uri)}: {first}") from None


def _create_mlflow_db(path: Path) -> None:
    """MLflow's schema in a new SQLite file at ``path`` (its engine closed again afterwards)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    uri = f"sqlite:///{path}"  # (its "Creating initial MLflow database tables..." is silenced above)
    store = SqlAlchemyStore(uri, str(path.parent / "mlartifacts"))
    store.engine.dispose()
    getattr(SqlAlchemyStore, "_engine_map", {}).pop(uri, None)


def _adopt_mlflow_db(path: Path, connection: Any) -> None:
    """In a copy of an empty store: the default experiment as MLflow would have made it here."""
    now = int(time.time() * 1000)
    connection.execute(
        "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? WHERE experiment_id = 0",
        ((Path.cwd() / path.parent / "mlartifacts" / "0").as_posix(), now, now),
    )


def _check_server(tracking_uri: str, timeout: float = 10.0) -> None:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(tracking_uri.rstrip("/") + "/health", timeout=timeout).close()
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise stores.StoreError(f"the MLflow tracking server {tracking_uri} does not answer: {reason}") from None


def client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    ensure_store(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri)


def retry(call: Callable[[], T], attempts: int = 12, delay: float = 0.25, max_delay: float = 10.0) -> T:
    """Retry a store call that SQLite may refuse while another process writes ("database is
    locked"): up to about a minute and a half, so that launches sharing a store wait their turn."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - MLflow wraps the SQLite error in several types
            if attempt == attempts - 1 or "locked" not in str(error).lower():
                raise
            time.sleep(min(delay * 2**attempt, max_delay))
    raise AssertionError("unreachable")


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


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
