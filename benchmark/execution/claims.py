"""Claims: at most one live process trains a run key, however many launches share a store.

A claim is an exclusive lock (``filelock``: ``flock`` on Unix) on
``<results>/claims/<run key>.lock``, held by the process that trains the run for exactly as
long as it trains it; ``<run key>.json`` beside it says who holds it (host, pid, when that
process started, its invocation, since when). The operating system drops a lock when its
process ends, however it ends (``kill -9`` included), so a claim whose process is gone is
free to take and a live one never is, with no heartbeat and no pid test that a reused pid
could fool. An invocation holds ``invocations/<id>.lock`` the same way for its whole life,
which tells a later launch whether a suite invocation left RUNNING in MLflow is still alive.

Launches on several machines must share the results directory on a file system whose locks
reach every machine: NFSv4, NFSv3 with lockd, Lustre mounted with ``flock``, GPFS; not a
``nolock`` / ``local_lock=all`` mount, where each machine would see only its own locks.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from benchmark.results_layout import ResultsDir

INVOCATIONS = "invocations"
CLAIM_WAIT_SECONDS = 2.0
"""How long ``take`` waits for a lock: longer than any ``holder`` probe holds it (microseconds),
far shorter than a run (which holds it for its whole training)."""


def directory(results_dir: Path) -> Path:
    """Where the claims of the runs stored under ``results_dir`` live."""
    return ResultsDir(results_dir).claims


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def process_start_time(pid: int | None = None) -> str:
    """When process ``pid`` (default: this one) started, ISO 8601 (from /proc on Linux; else now)."""
    pid = os.getpid() if pid is None else pid
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        started = time.time()
    return datetime.datetime.fromtimestamp(started).astimezone().isoformat(timespec="seconds")


@dataclass(frozen=True)
class Holder:
    """Who holds a claim."""

    host: str
    pid: int
    process_started: str
    """When the holding process started (ISO 8601)."""
    invocation: str
    """The launch it belongs to: its MLflow parent run id for a run key's claim, its invocation
    id for an invocation lock ('' when unknown)."""
    since: str
    """When the claim was taken (ISO 8601)."""
    label: str = ""
    suite: str = ""
    """The suite (MLflow experiment) it trains the run for: suites that share a run key share its claim."""

    @classmethod
    def here(cls, invocation: str, label: str = "", suite: str = "") -> Holder:
        return cls(socket.gethostname(), os.getpid(), process_start_time(), invocation, _now(), label, suite)

    def describe(self) -> str:
        since = self.since.replace("T", " ")[:19]
        return f"pid {self.pid} on {self.host}{f', suite {self.suite}' if self.suite else ''}, since {since}"


class Claim:
    """A held claim on one run key; ``release`` gives it up (so does the process ending)."""

    def __init__(self, lock: FileLock, path: Path, holder: Holder):
        self._lock, self.path, self.holder = lock, path, holder

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release()

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _lock(path: Path, timeout: float) -> FileLock:
    """An flock on ``path``. Where the file system has no flock, fail rather than fall back to a
    lock file's mere existence (filelock's default), which a killed process would leave held."""
    try:
        return FileLock(path, timeout=timeout, fallback_to_soft=False)
    except TypeError:  # filelock < 4: it has no fallback to fall back to
        return FileLock(path, timeout=timeout)


def _paths(claims_dir: Path, name: str) -> tuple[Path, Path]:
    return claims_dir / f"{name}.lock", claims_dir / f"{name}.json"


def take(claims_dir: Path, name: str, holder: Holder, wait: float = CLAIM_WAIT_SECONDS) -> Claim | None:
    """The claim on ``name`` (a run key), or None when a live process holds it."""
    claims_dir.mkdir(parents=True, exist_ok=True)
    lock_path, info_path = _paths(claims_dir, name)
    lock = _lock(lock_path, wait)
    try:
        lock.acquire()
    except Timeout:
        return None
    try:
        _write_json(info_path, dataclasses.asdict(holder))
    except BaseException:
        lock.release()
        raise
    return Claim(lock, info_path, holder)


def holder(claims_dir: Path, name: str) -> Holder | None:
    """Who holds the claim on ``name`` now; None when nobody does (nothing is changed)."""
    lock_path, info_path = _paths(claims_dir, name)
    if not lock_path.exists():
        return None
    lock = _lock(lock_path, 0)
    try:
        lock.acquire()
    except Timeout:
        return _read_holder(info_path)
    lock.release()
    return None


def _read_holder(info_path: Path) -> Holder:
    try:
        data = json.loads(info_path.read_text())
        return Holder(**{field.name: data[field.name] for field in dataclasses.fields(Holder) if field.name in data})
    except (OSError, ValueError, TypeError):  # written a moment ago, or by another version
        return Holder("unknown host", 0, "?", "", "?")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically (readers see the old or the new holder, never half of one)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, sort_keys=True))
    os.replace(temporary, path)


def directory_id(claims_dir: Path) -> str:
    """This claims directory's identity (made once, at random): runs and launches record it, so
    that launches sharing a tracking store but not a results directory, which cannot see each
    other's claims, never judge each other's runs dead."""
    path = Path(claims_dir) / "id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    claims_dir.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".id.{os.getpid()}.tmp")
    temporary.write_text(uuid.uuid4().hex)
    try:
        os.link(temporary, path)  # first writer wins; a racing one reads the winner's
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)
    return path.read_text().strip()


class Invocation:
    """The lock a launch holds for its whole life (``invocations/<id>.lock``)."""

    def __init__(self, claims_dir: Path, invocation_id: str):
        self.id = invocation_id
        claim = take(claims_dir / INVOCATIONS, invocation_id, Holder.here(invocation_id), wait=0)
        if claim is None:
            raise RuntimeError(f"invocation id {invocation_id} is already in use")
        self._claim = claim

    def release(self) -> None:
        self._claim.release()
        for path in _paths(self._claim.path.parent, self.id):
            path.unlink(missing_ok=True)

    def __enter__(self) -> Invocation:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def invocation_alive(claims_dir: Path, invocation_id: str) -> bool:
    """Whether the launch ``invocation_id`` of this claims directory still runs. A launch takes
    its lock before it records anything and removes the file when it ends, so no file means it
    has ended; a file nobody holds, that it died."""
    lock_path, _ = _paths(claims_dir / INVOCATIONS, invocation_id)
    return lock_path.exists() and holder(claims_dir / INVOCATIONS, invocation_id) is not None
