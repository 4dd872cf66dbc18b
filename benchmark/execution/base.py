"""The executor contract: where work runs, whatever the machine.

An executor takes a job, a list of tasks (a task is a picklable callable: a process group of
a suite, ``GroupTask``, or a tuning trial), runs each in a worker process somewhere on a device
it assigns, and gives back, while they run, the workers' typed messages and each finished
task's result (or the exception that ended its worker); ``cancel`` stops the job (running
runs checkpoint first where the executor can signal them). ``drive`` is the loop a suite's
launch runs around a submission.

Executors: ``local`` (a process pool on this machine), ``ray`` (Ray tasks, a local instance
or a cluster), ``slurm`` (Slurm jobs through submitit; submitit's local executor runs the
same code path on one machine).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from benchmark import tracking
from benchmark.config import RunSpec
from benchmark.execution import claims, outcomes
from benchmark.execution.messages import Message, Note, Progress, Sink, Started
from benchmark.execution.progress import Board
from benchmark.execution.worker import Launch, train_group
from benchmark.run_record import RunRecord

Group = list[RunSpec]
"""Specs trained in one process: one, or seeds of one configuration batched."""


class Task(Protocol):
    """One unit of work for a worker process: called there with the sink of its messages, the
    device the executor assigned ('cpu', 'cuda:0'...) and how the board names where it runs."""

    def __call__(self, messages: Sink | None, device: str, where: str) -> Any: ...


@dataclass(frozen=True)
class GroupTask:
    """A suite's process group: ``train_group`` on the assigned device."""

    group: Group
    launch: Launch

    def __call__(self, messages: Sink | None, device: str, where: str) -> list[RunRecord]:
        return train_group(self.group, self.launch, messages, device=device, where=where)


class Submission(abc.ABC):
    """A submitted job, while it runs."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> list[tuple[int, Any]]:
        """Block up to ``timeout`` seconds; the tasks that ended since the last call, as (index
        in the job, what the task returned or the exception that ended its worker)."""

    @abc.abstractmethod
    def messages(self) -> list[Message]:
        """The workers' messages received since the last call, in order."""

    @property
    @abc.abstractmethod
    def done(self) -> bool:
        """Every task has ended and been returned by ``wait``."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop the job: queued groups never start, running ones are signalled to checkpoint
        and stop (where the executor can), and the call returns once they are gone or a grace
        period has passed."""

    def close(self) -> None:
        """Release what the submission holds (queues, pools, a Ray instance it started)."""


class Executor(abc.ABC):
    """Where tasks run: one worker process per task at a time, as many at once as it has room for."""

    name: str = ""
    #: a line the board logs on Ctrl-C
    interrupt_note: str = "interrupted: stopping the workers"

    @abc.abstractmethod
    def submit(self, tasks: list[Task], log: Callable[[str], None]) -> Submission:
        """Start running ``tasks``; ``log`` takes a line for the launch's log."""


def drive(executor: Executor, groups: list[Group], launch: Launch, board: Board) -> list[RunRecord]:
    """Run ``groups`` on ``executor`` with live progress on ``board``; one outcome per spec in
    order. On Ctrl-C the job is cancelled and every child run still open is marked KILLED;
    after the job, any child run a dead worker left RUNNING is marked FAILED."""
    specs = [spec for group in groups for spec in group]
    found = {spec.run_key: RunRecord(spec, "FAILED", error="the worker ended without reporting") for spec in specs}
    submission = executor.submit([GroupTask(group, launch) for group in groups], board.log)
    try:
        while not submission.done:
            ended = submission.wait(0.5)
            for message in submission.messages():
                _show(message, found, board)
            for index, result in ended:
                if isinstance(result, BaseException):  # the worker died, or could not even start the runs
                    result = [outcomes.failed(spec, result) for spec in groups[index]]
                for outcome in result:
                    _record(outcome, found, board)
            board.refresh()
        for message in submission.messages():
            _show(message, found, board)
    except KeyboardInterrupt:
        board.log(executor.interrupt_note)
        submission.cancel()
        close_unfinished_children(launch.tracking_uri, launch.parent_run_id, "KILLED", "interrupted by the user", launch.claims_dir)
        raise
    finally:
        submission.close()
    close_unfinished_children(launch.tracking_uri, launch.parent_run_id, "FAILED", f"{executor.name} worker exited without reporting", launch.claims_dir)
    return [found[spec.run_key] for spec in specs]


def _show(message: Message, found: dict[str, RunRecord], board: Board) -> None:
    if getattr(message, "run_key", None) not in found:
        return
    if isinstance(message, Started):
        found[message.run_key].run_id = message.run_id
        board.started(message.run_key, found[message.run_key].spec.label, message.where, message.resumed_from)
    elif isinstance(message, Progress):
        board.progressed(message.run_key, message.step, message.last_eval)
    elif isinstance(message, Note):
        board.log(message.text)


def _record(outcome: RunRecord, found: dict[str, RunRecord], board: Board) -> None:
    key = outcome.spec.run_key
    if outcome.run_id is None:  # a worker that died after it had started the run
        outcome.run_id = found[key].run_id
    found[key] = outcome
    if outcome.status == "CLAIMED":
        board.elsewhere(key, outcome.spec.label, outcome.claimed_by or "another launch")
        return
    board.finished(key, outcome.spec.label, outcome.ok, outcomes.line(outcome))


def close_unfinished_children(tracking_uri: str, parent_run_id: str, status: str, message: str, claims_dir: str | None = None) -> list[str]:
    """Mark every child of ``parent_run_id`` still RUNNING as ``status`` (once this launch's
    workers are gone); with ``claims_dir``, not one whose run key is claimed, which another
    launch has taken over meanwhile. Returns their ids."""
    client = tracking.client(tracking_uri)
    parent = tracking.retry(lambda: client.get_run(parent_run_id))
    closed = []
    for run in tracking.running_children(tracking_uri, parent.info.experiment_id, parent_run_id):
        if claims_dir is not None and claims.holder(Path(claims_dir), run.data.tags.get("run_key", "")) is not None:
            continue
        tracking.close_run(tracking_uri, run.info.run_id, status, message)
        closed.append(run.info.run_id)
    return closed
