"""MLflow stores: where a results directory's store is, opening one (a SQLite file created
whole, a server waited for), the client, and retries through a busy store."""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from benchmark import stores
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
