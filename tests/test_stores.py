"""Store files checked before use and created whole under a lock; run-key claims held by live processes only."""

import importlib.metadata
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark import stores, tracking
from benchmark.execution import claims

TABLES = {"experiments", "runs", "alembic_version"}


def make_store(path: Path) -> None:
    tracking.ensure_store(f"sqlite:///{path}")


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    make_store(path)
    return path


def test_a_new_store_is_created_whole_and_checked_afterwards(mlflow_db):
    stores.check_sqlite_store(mlflow_db, "a store", TABLES)
    leftovers = [p.name for p in mlflow_db.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temporary file stays behind


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda path, good: path.write_bytes(b""), r"is empty \(0 bytes\), not a store"),
        (lambda path, good: path.write_bytes(good.read_bytes()[:30_000]), r"is truncated \(30,000 of [\d,]+ bytes\)"),
        (lambda path, good: path.write_bytes(b"PK\x03\x04" + os.urandom(4000)), "is not an SQLite database"),
        (
            lambda path, good: sqlite3.connect(path).execute("create table studies (x)").connection.commit(),
            r"an SQLite database but not a store \(no table 'alembic_version'; its tables: studies\)",
        ),
    ],
    ids=["empty", "truncated", "foreign-file", "foreign-sqlite"],
)
def test_a_damaged_or_foreign_file_is_refused_and_left_as_it_is(tmp_path, mlflow_db, damage, message):
    path = tmp_path / "mlflow.db"
    damage(path, mlflow_db)
    before = path.read_bytes()
    with pytest.raises(stores.StoreError, match=message):
        stores.create_once(path, "a store", TABLES, lambda temporary: pytest.fail("must not create over an existing file"))
    assert path.read_bytes() == before


def test_a_leftover_of_an_interrupted_migration_is_named(tmp_path, mlflow_db):
    path = tmp_path / "mlflow.db"
    path.write_bytes(mlflow_db.read_bytes())
    with sqlite3.connect(path) as connection:
        connection.execute("create table _alembic_tmp_latest_metrics (x)")
    with pytest.raises(stores.StoreError, match="_alembic_tmp_latest_metrics, left by a schema migration that was interrupted"):
        stores.check_sqlite_store(path, "a store", TABLES)


def test_a_creation_killed_midway_leaves_no_store(tmp_path):
    path = tmp_path / "mlflow.db"

    def crash(temporary: Path) -> None:
        sqlite3.connect(temporary).execute("create table experiments (x)").connection.commit()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stores.create_once(path, "a store", TABLES, crash)
    assert not path.exists() and [p.name for p in tmp_path.iterdir()] == ["mlflow.db.lock"]


def _schema(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as connection:
        return sorted(connection.execute("select type, name, sql from sqlite_master").fetchall(), key=str)


def test_a_new_store_is_a_copy_of_the_cached_empty_one_fitted_to_its_place(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first, second = tmp_path / "one" / "mlflow.db", tmp_path / "two" / "mlflow.db"
    first.parent.mkdir(), second.parent.mkdir()
    make_store(first)  # MLflow sets the schema up; its empty store is kept
    assert [p.name for p in (tmp_path / "cache" / "reprorl").iterdir()] == [f"mlflow-{importlib.metadata.version('mlflow')}.db"]
    monkeypatch.setattr(tracking.store, "_create_mlflow_db", lambda path: pytest.fail("a cached copy exists: MLflow must not be asked"))
    make_store(second)
    assert _schema(second) == _schema(first)
    with sqlite3.connect(second) as connection:
        assert connection.execute("select artifact_location from experiments").fetchall() == [(f"{second.parent}/mlartifacts/0",)]
    client = tracking.client(f"sqlite:///{second}")
    run = client.create_run(client.create_experiment("copied"))
    client.log_metric(run.info.run_id, "x", 1.0)
    assert client.get_run(run.info.run_id).data.metrics == {"x": 1.0}


def test_a_damaged_cached_store_is_made_again_by_mlflow(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    template = tmp_path / "cache" / "reprorl" / f"mlflow-{importlib.metadata.version('mlflow')}.db"
    template.parent.mkdir(parents=True)
    template.write_bytes(b"SQLite format 3\x00" + bytes(5000))
    make_store(tmp_path / "mlflow.db")
    stores.check_sqlite_store(tmp_path / "mlflow.db", "a store", TABLES, deep=True)
    stores.check_sqlite_store(template, "the copy", TABLES, deep=True)  # replaced by the new store's
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _create_in_process(path: str, barrier) -> None:
    barrier.wait()
    tracking.ensure_store(f"sqlite:///{path}")
    tracking.experiment_id(f"sqlite:///{path}", "raced", Path(path).parent / "mlartifacts")


def test_processes_racing_to_create_a_store_and_an_experiment_all_succeed(tmp_path):
    """The race that once left mlflow.db unusable ("table _alembic_tmp_latest_metrics already
    exists") and made a second launch fail ("duplicate column name")."""
    path = tmp_path / "mlflow.db"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    processes = [context.Process(target=_create_in_process, args=(str(path), barrier)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [process.exitcode for process in processes] == [0, 0, 0, 0]
    stores.check_sqlite_store(path, "a store", TABLES)
    client = tracking.client(f"sqlite:///{path}")
    assert [e.name for e in client.search_experiments()].count("raced") == 1


def test_a_directory_that_cannot_be_written_is_refused(tmp_path):
    with pytest.raises(stores.StoreError, match="cannot be created: its parent .* does not exist"):
        stores.check_writable_directory(tmp_path / "no" / "results", "results directory")
    (tmp_path / "file").write_text("x")
    with pytest.raises(stores.StoreError, match="is not a directory"):
        stores.check_writable_directory(tmp_path / "file", "results directory")


def test_disk_full_is_recognized_through_wrapping_exceptions():
    import errno

    from mlflow.exceptions import MlflowException

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            raise MlflowException("(sqlite3.OperationalError) ...") from inner
    except MlflowException as outer:
        assert stores.is_disk_full(outer)
    assert stores.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert not stores.is_disk_full(OSError(errno.EACCES, "Permission denied"))


# ------------------------------------------------------------------------------------- claims


def test_a_claim_is_exclusive_and_says_who_holds_it(tmp_path):
    holder = claims.Holder.here("parent-1", "ppo/CartPole-v1/seed0")
    claim = claims.take(tmp_path, "key", holder)
    assert claim is not None
    assert claims.holder(tmp_path, "key") == holder  # each lock is its own open file: held even against this process
    assert claims.take(tmp_path, "key", claims.Holder.here("parent-2"), wait=0.1) is None
    claim.release()
    assert claims.holder(tmp_path, "key") is None
    assert claims.holder(tmp_path, "never-claimed") is None and not (tmp_path / "never-claimed.lock").exists()


HOLD = """
import sys, time
from pathlib import Path
from benchmark.execution import claims
claim = claims.take(Path(sys.argv[1]), "key", claims.Holder.here("parent-1", "label"))
print("held" if claim else "refused", flush=True)
time.sleep(600)
"""


def test_a_live_holder_keeps_its_claim_and_a_killed_one_loses_it(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    try:
        assert process.stdout.readline().strip() == "held"
        found = claims.holder(tmp_path, "key")
        assert found is not None and found.pid == process.pid and found.invocation == "parent-1"
        assert f"pid {process.pid}" in found.describe()
        assert claims.take(tmp_path, "key", claims.Holder.here("parent-2"), wait=0.2) is None  # never a live one
        second = subprocess.run(
            [sys.executable, "-c", HOLD.replace("time.sleep(600)", ""), str(tmp_path)],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert second.stdout.strip() == "refused"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert claims.holder(tmp_path, "key") is None  # the kernel dropped the lock with the process
    claim = claims.take(tmp_path, "key", claims.Holder.here("parent-2"))
    assert claim is not None and claims.holder(tmp_path, "key").invocation == "parent-2"  # taken over
    claim.release()


def test_an_invocation_lock_tells_a_live_launch_from_a_dead_one(tmp_path):
    assert claims.invocation_alive(tmp_path, "unknown") is False  # no lock file: it has ended (or never ran here)
    with claims.Invocation(tmp_path, "abc"):
        process = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from benchmark.execution import claims; print(claims.invocation_alive(Path(sys.argv[1]), 'abc'))",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert process.stdout.strip() == "True"
    assert claims.invocation_alive(tmp_path, "abc") is False  # released and removed
    lock = tmp_path / claims.INVOCATIONS / "dead.lock"
    lock.parent.mkdir(exist_ok=True)
    lock.write_text("")  # what a killed launch leaves
    assert claims.invocation_alive(tmp_path, "dead") is False


KILLED_WRITER = """
import os, signal, sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("pragma cache_size=1")  # spill to the file: the journal holds the pages it overwrote
connection.execute("begin")
for index in range(20000):
    connection.execute("insert into experiments (name, artifact_location, lifecycle_stage) values (?, 'x', 'active')", (f"e{index}",))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_mid_transaction_leaves_a_store_that_opens(tmp_path, mlflow_db):
    """kill -9 inside a write leaves a hot journal; the check rolls it back (as SQLite does on any
    read-write open) instead of calling the store corrupt."""
    path = tmp_path / "mlflow.db"
    path.write_bytes(mlflow_db.read_bytes())
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], check=False)
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0
    stores.check_sqlite_store(path, "a store", TABLES, deep=True)
    assert not (tmp_path / "mlflow.db-journal").exists()
    client = tracking.client(f"sqlite:///{path}")
    assert [e.name for e in client.search_experiments()] == ["Default"]  # the killed transaction is gone


def test_a_store_another_process_keeps_locked_is_busy_not_corrupt(tmp_path, mlflow_db, monkeypatch):
    path = tmp_path / "mlflow.db"
    path.write_bytes(mlflow_db.read_bytes())
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("begin exclusive")
    real_connect = sqlite3.connect
    monkeypatch.setattr(stores.sqlite3, "connect", lambda *a, **k: real_connect(*a, **{**k, "timeout": 0.2}))
    try:
        with pytest.raises(stores.StoreBusy, match="locked by another process"):
            stores.check_sqlite_store(path, "a store", TABLES)
    finally:
        holder.execute("rollback")
        holder.close()
    stores.check_sqlite_store(path, "a store", TABLES)


def test_the_check_never_takes_a_store_mid_commit_for_a_truncated_one(tmp_path, mlflow_db):
    """While another process commits, page 1 can already count pages not yet written: the check
    must read the header under SQLite's lock, after the commit, not before it (it once reported
    such a store as truncated). Here a writer holds the lock with page 1 counting ten more pages
    than the file has, then restores it and commits."""
    import threading

    path = tmp_path / "mlflow.db"
    path.write_bytes(mlflow_db.read_bytes())
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("begin exclusive")
    with open(path, "r+b") as file:
        header = bytearray(file.read(100))
        original = bytes(header)
        header[28:32] = (int.from_bytes(header[28:32], "big") + 10).to_bytes(4, "big")
        file.seek(0)
        file.write(header)
    outcome = []
    checker = threading.Thread(target=lambda: outcome.append(_check_or_error(path)))
    checker.start()
    checker.join(1.0)
    assert checker.is_alive()  # waiting for the commit
    with open(path, "r+b") as file:
        file.write(original)
    writer.execute("commit")
    writer.close()
    checker.join(30)
    assert outcome == [None]


def _check_or_error(path: Path) -> str | None:
    try:
        stores.check_sqlite_store(path, "a store", TABLES)
    except stores.StoreError as error:
        return str(error)
    return None


def test_a_journal_left_by_a_deleted_store_is_not_applied_to_a_new_one(tmp_path):
    (tmp_path / "mlflow.db-journal").write_bytes(os.urandom(4096))
    make_store(tmp_path / "mlflow.db")
    stores.check_sqlite_store(tmp_path / "mlflow.db", "a store", TABLES, deep=True)
    assert not (tmp_path / "mlflow.db-journal").exists() and list(tmp_path.glob("mlflow.db-journal.orphaned-*"))


def test_a_run_of_another_suite_is_never_resumed_and_links_accumulate(tmp_path):
    """Suites that share a run key share its checkpoint directory: a checkpoint whose run lives in
    another suite's experiment is not resumed into this one. And a run that supersedes twice
    keeps both links."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    smoke = tracking.experiment_id(uri, "smoke", tmp_path / "a")
    ci = tracking.experiment_id(uri, "ci", tmp_path / "a")
    client = tracking.client(uri)
    other = client.create_run(smoke, tags={"run_key": "k"}).info.run_id
    assert tracking.resume_child_run(uri, other, "parent", {}, 100, experiment_id=ci) is None
    assert client.get_run(other).data.tags.get("mlflow.parentRunId") is None  # untouched

    first, second, current = (client.create_run(ci, tags={"run_key": "k"}).info.run_id for _ in range(3))
    client.set_terminated(first, "KILLED")
    assert set(tracking.supersede_attempts(uri, ci, "k", current, "here")) == {first, second}
    third = client.create_run(ci, tags={"run_key": "k"}).info.run_id
    tracking.supersede_attempts(uri, ci, "k", current, "here")
    assert set(client.get_run(current).data.tags["supersedes"].split()) == {first, second, third}
    assert client.get_run(second).info.status == "KILLED" and client.get_run(first).info.status == "KILLED"
    foreign = client.create_run(ci, tags={"run_key": "k", "claims_id": "elsewhere"}).info.run_id
    tracking.supersede_attempts(uri, ci, "k", current, "here")
    assert client.get_run(foreign).info.status == "RUNNING"  # another results directory's: never ours to close
