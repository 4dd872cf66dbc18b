"""Optuna storages: SQLite under ``results/`` by default, PostgreSQL/MySQL URLs or ``journal:PATH``
(checked before use, created whole), and the studies in them."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

from agents.errors import ConfigError, suggest
from benchmark import stores
from benchmark.results_layout import ResultsDir
from benchmark.tracking import redact
from benchmark.tuning.settings import SETTINGS_ATTR, StudySettings

OPTUNA_TABLES = {"studies", "trials", "version_info"}


def quiet_optuna() -> None:
    """Only Optuna's errors reach the console (trials get one line each from us), and none of
    its warnings about experimental arguments (heartbeats, grouped TPE)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def default_storage_url(results_dir: Path) -> str:
    return f"sqlite:///{ResultsDir(results_dir).optuna_db.resolve()}"


def open_storage(url: str) -> Any:
    """An Optuna storage for ``url``: an RDB URL (sqlite:///PATH, postgresql://..., mysql://...)
    or ``journal:PATH`` (Optuna's journal file, for shared disks). SQLite waits up to a minute
    for a lock (several worker processes write to it); RDB trials send heartbeats, so that
    ``optuna.storages.fail_stale_trials`` can fail a trial whose process died (journal files
    have no heartbeat). ConfigError naming the URL if it cannot be opened."""
    import optuna
    import sqlalchemy.exc

    quiet_optuna()
    sqlite_file = stores.sqlite_path(url)
    if sqlite_file is not None:  # checked, or created whole under a lock (see benchmark.stores)
        stores.create_once(sqlite_file, "an Optuna study storage", OPTUNA_TABLES, _create_optuna_db)
    for attempt in range(4):
        try:
            if url.startswith("journal:"):
                path = _file_of(url)
                assert path is not None
                if not path.parent.is_dir():
                    raise ConfigError(f"directory {path.parent} does not exist")
                from optuna.storages.journal import JournalFileBackend

                return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
            engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=30, grace_period=120)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as error:
            # another process created the tables of a new database at the same moment: they exist
            # now (SQLite reports the race as "table ... already exists", other drivers as a
            # duplicate key); anything else is a real failure to open
            racing = isinstance(error, sqlalchemy.exc.IntegrityError) or "already exists" in str(error)
            if not racing or attempt == 3:
                raise _cannot_open(url, error) from None
            time.sleep(0.5)
        except Exception as error:  # noqa: BLE001 - sqlalchemy, drivers and optuna raise many types
            if stores.is_disk_full(error):
                raise
            raise _cannot_open(url, error) from None
    raise AssertionError("unreachable")


def _create_optuna_db(path: Path) -> None:
    """Optuna's schema in a new SQLite file at ``path`` (its engine closed again afterwards)."""
    import optuna

    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    storage.engine.dispose()


def _cannot_open(url: str, error: Exception) -> ConfigError:
    return ConfigError(
        f"cannot open the Optuna storage {redact(url)!r}: {type(error).__name__}: {error}. "
        "Use sqlite:///PATH, postgresql://USER@HOST/DB, mysql://USER@HOST/DB or journal:PATH"
    )


def open_existing_storage(url: str | None, results_dir: Path) -> tuple[str, Any]:
    """(url, storage) for reading a study: the default SQLite file must already exist (reading
    never creates a store)."""
    url = url or default_storage_url(results_dir)
    path = _file_of(url)
    if path is not None and not path.exists():
        raise ConfigError(f"no study storage at {path}; run `python -m benchmark tune` first, or pass --storage URL")
    return url, open_storage(url)


def _file_of(url: str) -> Path | None:
    """The file of a SQLite or journal storage URL (None for a database server)."""
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:").removeprefix("//"))
    return None


def load_study(name: str, storage: Any) -> Any:
    """An existing study; ConfigError listing the study names in the storage otherwise."""
    import optuna

    names = optuna.get_all_study_names(storage)
    if name not in names:
        listed = ", ".join(sorted(names)) or "none"
        raise ConfigError(f"no study {name!r} in this storage{suggest(name, names)}; studies: {listed}")
    return optuna.load_study(study_name=name, storage=storage)


def study_settings(study: Any) -> StudySettings:
    data = study.user_attrs.get(SETTINGS_ATTR)
    if data is None:
        raise ConfigError(f"study {study.study_name!r} was not created by `python -m benchmark tune` (it has no settings)")
    return StudySettings.from_dict(data)


def study_exists(url: str, name: str, default_url: str) -> bool:
    """Whether ``name`` is a study in the storage at ``url``, without creating anything: a
    SQLite file that does not exist yet holds no study (its directory must exist, except for
    the default store under --results-dir, made when the study starts)."""
    import optuna

    path = _file_of(url)
    if path is not None:
        if not path.exists():
            if url != default_url and not path.parent.is_dir():
                raise ConfigError(f"cannot open the Optuna storage {redact(url)!r}: directory {path.parent} does not exist")
            return False
    return name in optuna.get_all_study_names(open_storage(url))


def shared_storage(url: str) -> bool:
    """Whether other machines can join a study in this storage (not SQLite)."""
    return not url.startswith("sqlite")
