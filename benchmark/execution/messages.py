"""What a worker tells the launch while it trains: typed messages, and the sinks that carry them.

A local pool carries them on a multiprocessing queue, Ray on a Ray queue, Slurm (where the
launch and the jobs may be on different machines) as JSON lines in a file on the shared
results directory. Losing a message never fails a run: it still checkpoints and records its
result in the tracking store.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Started:
    """Training of ``run_key`` starts (or resumes from env step ``resumed_from``) in MLflow run ``run_id``."""

    run_key: str
    run_id: str
    resumed_from: int
    where: str
    """The device and executor, as the board shows them ('cuda:0 (GPU 1)', 'CPU (Ray)')."""


@dataclass(frozen=True)
class Progress:
    """``run_key`` has trained ``step`` of ``total`` env steps; its last evaluation's mean return."""

    run_key: str
    step: int
    total: int
    last_eval: float | None


@dataclass(frozen=True)
class Note:
    """A line for the launch's log about ``run_key`` (an unreadable checkpoint set aside, say)."""

    run_key: str
    text: str


@dataclass(frozen=True)
class TrialStarted:
    """Task ``task`` of a tuning invocation runs trial ``trial_number`` (so that the launch can
    mark the trial FAIL if the worker dies)."""

    task: int
    trial_number: int
    where: str


Message = Started | Progress | Note | TrialStarted
KINDS: dict[str, type] = {cls.__name__: cls for cls in (Started, Progress, Note, TrialStarted)}


class Sink(Protocol):
    def put(self, message: Message) -> None: ...


def send(sink: Sink | None, message: Message) -> None:
    """Put ``message``; lost quietly when the launch (or its queue) is gone."""
    if sink is None:
        return
    try:
        sink.put(message)
    except Exception:  # noqa: BLE001 - BrokenPipe, EOFError, RayActorError, a full disk...
        pass


def drain(source: Any) -> list[Message]:
    """Every message waiting on a queue (multiprocessing's, Ray's) or a ``FileSource``."""
    if isinstance(source, FileSource):
        return source.read()
    found: list[Message] = []
    while True:
        try:
            found.append(source.get_nowait())
        except Exception as error:
            if isinstance(error, queue.Empty) or type(error).__name__ == "Empty":  # Ray's Empty is its own class
                return found
            raise


class FileSink:
    """Appends messages as JSON lines to ``path`` (one ``write`` per line: lines of concurrent
    writers with O_APPEND do not interleave)."""

    def __init__(self, path: Path | str):
        self.path = str(path)

    def put(self, message: Message) -> None:
        line = json.dumps({"kind": type(message).__name__, **dataclasses.asdict(message)}) + "\n"
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line.encode())
        finally:
            os.close(descriptor)


class FileSource:
    """Reads the messages FileSinks appended to ``path`` since the last read; a partly
    written last line waits for the next read, a malformed one is skipped."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0

    def read(self) -> list[Message]:
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        found: list[Message] = []
        for line in complete.splitlines():
            try:
                fields = json.loads(line)
                found.append(KINDS[fields.pop("kind")](**fields))
            except (ValueError, KeyError, TypeError):
                continue
        return found
