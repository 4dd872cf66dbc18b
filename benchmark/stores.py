"""Opening the SQLite files that hold results (MLflow's ``mlflow.db``, Optuna's ``optuna.db``) safely.

Two promises. A store file that exists is checked before any library touches it: an empty,
truncated, corrupt or foreign file is refused with one line naming it, never taken for a new
store (which MLflow and Optuna would otherwise do, writing their tables into it). A store
that does not exist yet is created whole or not at all: under a lock beside it
(``<file>.lock``), in a temporary file renamed into place, so that launches racing to create
it never run the schema set-up twice (which once left ``mlflow.db`` unusable) and a launch
killed while creating it leaves nothing behind.

SQLite wants a local disk: for launches on several machines use a database server
(PostgreSQL, MySQL) or an MLflow tracking server, as docs/execution.md says.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from agents.errors import ConfigError

SQLITE_HEADER = b"SQLite format 3\x00"
LOCK_WAIT_SECONDS = 600.0  # creating a store takes a second or two; this only bounds a stuck lock


class StoreError(ConfigError):
    """A store that cannot be used as it is (bad input: exit 2; nothing was changed)."""


class DiskFull(OSError):
    """No space left on the device that holds the results."""


class StoreBusy(RuntimeError):
    """A store another process keeps locked (a failure while running: exit 1)."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the disk is full: ENOSPC, or SQLite's
    'database or disk is full' wrapped by SQLAlchemy and MLflow."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "database or disk is full" in str(error) or "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return False


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL (None for other URLs and in-memory databases)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def check_usable_directory(directory: Path, what: str) -> None:
    """``check_writable_directory`` without creating anything: ``directory`` when it exists, else
    the existing directory it would be made in (StoreError, one line, naming the problem)."""
    directory = Path(directory)
    if directory.exists() or not directory.parent.exists():  # nothing to create: the plain check names the problem
        check_writable_directory(directory, what)
        return
    if not directory.parent.is_dir():
        raise StoreError(f"{what} {directory} cannot be created: {directory.parent} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=directory.parent):
            pass
    except OSError as error:
        _raise_for(error, f"{what} {directory} cannot be created")


def check_writable_directory(directory: Path, what: str) -> None:
    """StoreError unless ``directory`` exists (or can be made, its parent existing) and a file
    can be written in it: the test is a real write, which also catches read-only mounts and
    a full disk (DiskFull)."""
    directory = Path(directory)
    if not directory.exists():
        if not directory.parent.exists():
            raise StoreError(f"{what} {directory} cannot be created: its parent {directory.parent} does not exist")
        try:
            directory.mkdir()
        except FileExistsError:
            pass
        except OSError as error:
            _raise_for(error, f"{what} {directory} cannot be created")
    if not directory.is_dir():
        raise StoreError(f"{what} {directory} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        _raise_for(error, f"{what} {directory} is not writable")


def check_writable_file(path: Path, what: str) -> None:
    """StoreError unless this process may write ``path`` and create files beside it (SQLite's
    journal): a read-only mount or file is found before a run starts, not at its first write."""
    if not os.access(path, os.W_OK):
        raise StoreError(f"{what} {path} is read-only")
    check_writable_directory(path.parent, f"the directory of {what}")


def _raise_for(error: OSError, context: str) -> None:
    if is_disk_full(error):
        raise DiskFull(errno.ENOSPC, context) from None
    raise StoreError(f"{context}: {error.strerror or error}") from None


def check_sqlite_store(path: Path, what: str, required_tables: set[str], deep: bool = False) -> None:
    """StoreError naming ``path`` unless it is an intact SQLite database with ``required_tables``
    (StoreBusy when another process has held it locked for half a minute).

    Cheap: the header, the file size its page count implies, and the table list (one page), read
    under a shared lock so that a writer mid-commit (page 1 already counting pages not yet
    written) is never taken for truncation; ``deep`` adds SQLite's ``quick_check`` of every
    page (a second or so per GB)."""
    size, header = _size_and_header(path, what)
    if size == 0:
        raise StoreError(f"{path} is empty (0 bytes), not {what}: if nothing was ever stored in it, delete it and launch again")
    if not header.startswith(SQLITE_HEADER):
        raise StoreError(f"{path} is not an SQLite database (corrupt, or another kind of file), so not {what}: move it aside")
    # read-write where allowed: a hot journal (a writer killed mid-transaction) is then rolled back,
    # as any later open would; read-only SQLite cannot roll it back and would report an error
    mode = "rw" if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK) else "ro"
    try:
        connection = sqlite3.connect(f"file:{path}?mode={mode}", uri=True, timeout=30, isolation_level=None)
        try:
            connection.execute("begin")
            tables = {row[0] for row in connection.execute("select name from sqlite_master where type = 'table'")}
            _check_length(path, *_size_and_header(path, what))  # under the shared lock the select took
            problems = [row[0] for row in connection.execute("pragma quick_check(3)")] if deep else ["ok"]
            connection.execute("commit")
        finally:
            connection.close()
    except sqlite3.OperationalError as error:
        if "locked" in str(error) or "busy" in str(error):
            raise StoreBusy(f"{path} has been locked by another process for 30 s ({error}): try again") from None
        _check_length(path, *_size_and_header(path, what))  # a truncated file says so rather than "corrupt"
        raise StoreError(f"{path} is corrupt (SQLite: {error}): restore it from a copy or move it aside") from None
    except sqlite3.DatabaseError as error:
        _check_length(path, *_size_and_header(path, what))
        raise StoreError(f"{path} is corrupt (SQLite: {error}): restore it from a copy or move it aside") from None
    if problems != ["ok"]:
        raise StoreError(f"{path} is corrupt (SQLite's check: {'; '.join(problems)}): restore it from a copy or move it aside")
    leftovers = sorted(table for table in tables if table.startswith("_alembic_tmp_"))
    if leftovers:
        raise StoreError(
            f"{path} holds {', '.join(leftovers)}, left by a schema migration that was interrupted: restore the file "
            f"from a copy (or drop {'that table' if len(leftovers) == 1 else 'those tables'} after checking that what "
            f"{'it copies' if len(leftovers) == 1 else 'they copy'} is complete)"
        )
    missing = required_tables - tables
    if missing:
        found = ", ".join(sorted(tables)[:8]) or "none"
        raise StoreError(f"{path} is an SQLite database but not {what} (no table {sorted(missing)[0]!r}; its tables: {found})")


def _size_and_header(path: Path, what: str) -> tuple[int, bytes]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            return size, file.read(100)
    except IsADirectoryError:
        raise StoreError(f"{path} is a directory, not {what}") from None
    except OSError as error:
        raise StoreError(f"cannot read {what} {path}: {error.strerror or error}") from None


def _check_length(path: Path, size: int, header: bytes) -> None:
    """StoreError when the file is shorter than the page count its header gives."""
    if len(header) < 100:
        return
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[24:28] == header[92:96] and pages and size < pages * page_size:  # the page count is valid
        raise StoreError(f"{path} is truncated ({size:,} of {pages * page_size:,} bytes): restore it from a copy or move it aside")


@dataclass(frozen=True)
class Template:
    """How to make a new store by copying an empty one instead of setting its schema up: a
    schema set up by migrations takes seconds (MLflow's runs every alembic migration since its
    first), a copy milliseconds. ``key`` names the library and version that made the copy (kept
    in the user's cache: ``$XDG_CACHE_HOME/reprorl``); ``adopt`` rewrites in a copy what the
    original tied to its place (paths, times). A cache that cannot be read or written, or holds
    a damaged copy, only costs that time: the library then makes the store as before."""

    key: str
    adopt: Callable[[sqlite3.Connection], None]

    @property
    def path(self) -> Path | None:
        try:
            return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "reprorl" / f"{self.key}.db"
        except RuntimeError:  # no home directory
            return None

    def copy_to(self, target: Path, what: str, required_tables: set[str]) -> bool:
        """Whether ``target`` (which must not exist) is now a checked, adopted copy."""
        source = self.path
        if source is None or not source.is_file():
            return False
        try:
            shutil.copyfile(source, target)
            check_sqlite_store(target, what, required_tables, deep=True)
            with contextlib.closing(sqlite3.connect(target)) as connection, connection:
                self.adopt(connection)
            return True
        except (OSError, sqlite3.Error, StoreError) as error:
            if is_disk_full(error):
                raise
            target.unlink(missing_ok=True)
            return False

    def keep(self, store: Path) -> None:
        """Keep a copy of the new, still empty ``store`` for next time (atomically: a racing
        launch reads the old copy or this one, whole)."""
        kept = self.path
        if kept is None:
            return
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            handle, name = tempfile.mkstemp(dir=kept.parent, prefix=f".{kept.name}.")
            os.close(handle)
            try:
                shutil.copyfile(store, name)
                os.replace(name, kept)
            finally:
                Path(name).unlink(missing_ok=True)
        except OSError:
            pass


def create_once(
    path: Path,
    what: str,
    required_tables: set[str],
    create: Callable[[Path], None],
    deep: bool = False,
    template: Template | None = None,
) -> bool:
    """Check the store at ``path`` (``deep``: every page), or create it when it does not exist: a
    copy of ``template``, else ``create(temporary_path)``; True when this call created it.
    Concurrent callers wait on ``<path>.lock``: one creates, the others then check what it made."""
    if path.exists():
        check_sqlite_store(path, what, required_tables, deep)
        return False
    if not path.parent.is_dir():
        raise StoreError(f"cannot create {what} at {path}: directory {path.parent} does not exist")
    check_writable_directory(path.parent, f"the directory of {what}")
    with FileLock(path.with_name(path.name + ".lock"), timeout=LOCK_WAIT_SECONDS):
        if path.exists():  # another launch created it while this one waited
            check_sqlite_store(path, what, required_tables)
            return False
        for leftover in path.parent.glob(f".{path.name}.*.creating*"):  # a creation killed midway (we hold the lock)
            leftover.unlink(missing_ok=True)
        for suffix in ("-journal", "-wal", "-shm"):  # of a database deleted since: SQLite would apply it to the new one
            orphan = path.with_name(path.name + suffix)
            if orphan.exists():
                orphan.replace(orphan.with_name(f"{orphan.name}.orphaned-{int(time.time())}"))
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".creating")
        os.close(handle)
        temporary = Path(name)
        temporary.unlink()  # the libraries create their database themselves
        try:
            if not (template and template.copy_to(temporary, what, required_tables)):
                create(temporary)
                check_sqlite_store(temporary, what, required_tables)
                if template:
                    template.keep(temporary)
            os.replace(temporary, path)
        except OSError as error:
            if is_disk_full(error):
                raise DiskFull(errno.ENOSPC, f"cannot create {what} at {path}") from None
            raise
        except Exception as error:
            if is_disk_full(error):
                raise DiskFull(errno.ENOSPC, f"cannot create {what} at {path}") from None
            raise
        finally:
            for leftover in (temporary, temporary.with_name(temporary.name + "-journal")):
                leftover.unlink(missing_ok=True)
        _fsync_directory(path.parent)
    return True


def _fsync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
