"""The local executor: a process pool on this machine, one worker per device slot.

Workers are forked from a fork server that has only imported what they need
(``benchmark.execution.preload``), never from the launch, so no torch or MLflow state of a
running process is copied into them, and each starts in a fraction of a second.
Only the launch handles Ctrl-C: workers ignore SIGINT, and on an interrupt the launch sends
them SIGTERM (a training run writes its checkpoint, then stops). Workers die with the launch
however it ends (even SIGKILL), so no orphan keeps training.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing.managers import SyncManager
from typing import Any

from benchmark.execution import devices
from benchmark.execution.base import Executor, Submission, Task
from benchmark.execution.child import exit_if_orphaned, init_child_process, init_queue_manager, start_helpers_ignoring_ctrl_c
from benchmark.execution.messages import Message, drain


class NotStarted(RuntimeError):
    """A task the pool dropped because the invocation was interrupted before it started."""


def run_in_slot(slots: Any, stopping: Any, task: Task, messages: Any) -> Any:
    """A pool task: take a free device slot, make it the only visible device, run the task,
    give the slot back. There are as many workers as slots, so one is always free. Once the
    invocation is stopping (Ctrl-C), a task that had not started yet does not start."""
    if stopping.is_set():
        raise NotStarted("not started: the invocation was interrupted")
    slot = devices.Slot(*slots.get())
    try:
        devices.enter_slot(slot)
        return task(messages, slot.device, slot.describe())
    finally:
        exit_if_orphaned()  # before touching the dead launch's queues, which can block
        slots.put(dataclasses.astuple(slot))


def worker_context() -> multiprocessing.context.BaseContext:
    """The fork server's context, with its imports set. The server starts with the first
    worker a launch wants and serves every later pool of this process; it exits with it."""
    start_helpers_ignoring_ctrl_c()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["benchmark.execution.preload"])
    return context


class LocalExecutor(Executor):
    """One worker process per slot (``benchmark.execution.devices``): a GPU run gets a fresh
    process (CUDA must not have started before it picks its device); CPU workers are reused."""

    name = "local"
    interrupt_note = "interrupted: stopping workers (each running run writes its checkpoint first)"

    def __init__(self, slots: list[devices.Slot]):
        self.slots = slots

    def submit(self, tasks: list[Task], log: Callable[[str], None]) -> Submission:
        return _PoolSubmission(tasks, self.slots[: len(tasks)])


def _stop_manager(manager: SyncManager) -> None:
    """End the queue manager whatever its start reached: ``shutdown`` exists only once ``start``
    has heard from it (a Ctrl-C while it started gave "AttributeError: 'SyncManager' object has
    no attribute 'shutdown'" and exit 1); before that, its process holds nothing yet and is
    killed (it ignores Ctrl-C, and multiprocessing's exit would wait for it)."""
    shutdown = getattr(manager, "shutdown", None)
    process = getattr(manager, "_process", None)
    if shutdown is not None:
        shutdown()
    elif process is not None and process.pid is not None:
        process.kill()
        process.join()


class _PoolSubmission(Submission):
    def __init__(self, tasks: list[Task], slots: list[devices.Slot]):
        try:
            self._start(tasks, slots)
        except BaseException:  # a Ctrl-C while the helpers start: stop what did start (its threads would hold the launch open), then raise it
            if hasattr(self, "_stopping"):
                self._stopping.set()
            if hasattr(self, "_pool"):
                _stop_workers(self._pool)
            if hasattr(self, "_manager"):
                _stop_manager(self._manager)
            raise
        self._pending = set(self._futures)

    def _start(self, tasks: list[Task], slots: list[devices.Slot]) -> None:
        start_helpers_ignoring_ctrl_c()
        self._manager = SyncManager(ctx=multiprocessing.get_context("spawn"))  # queues only: imports nothing heavy
        self._manager.start(initializer=init_queue_manager, initargs=(os.getpid(),))
        self._pool = ProcessPoolExecutor(
            max_workers=len(slots),
            mp_context=worker_context(),
            initializer=init_child_process,
            initargs=(os.getpid(), dict(os.environ)),
            max_tasks_per_child=1 if any(slot.is_gpu for slot in slots) else None,
        )
        self._messages, free_slots, self._stopping = self._manager.Queue(), self._manager.Queue(), self._manager.Event()
        for slot in slots:
            free_slots.put(dataclasses.astuple(slot))
        self._futures: dict[Future, int] = {
            self._pool.submit(run_in_slot, free_slots, self._stopping, task, self._messages): index for index, task in enumerate(tasks)
        }

    def wait(self, timeout: float) -> list[tuple[int, Any]]:
        ended, self._pending = wait(self._pending, timeout=timeout, return_when=FIRST_COMPLETED)
        return [(self._futures[future], _result_of(future)) for future in ended]

    def messages(self) -> list[Message]:
        return drain(self._messages)

    @property
    def done(self) -> bool:
        return not self._pending

    def cancel(self) -> None:
        self._stopping.set()
        _stop_workers(self._pool)

    def close(self) -> None:
        try:
            if not self._pending:
                self._pool.shutdown(wait=True)
        finally:
            self._manager.shutdown()


def _result_of(future: Future) -> Any:
    try:
        return future.result()
    except BaseException as error:  # noqa: BLE001 - the worker process died, or the task raised: its result
        return error


def _stop_workers(pool: ProcessPoolExecutor, grace_seconds: float = 30.0) -> None:
    """Cancel queued runs and SIGTERM running ones, which checkpoint and stop (ProcessPoolExecutor
    has no public terminate); whatever still lives after ``grace_seconds`` is killed. Returns once
    every worker has ended: their run claims are released then, so the runs they left open can
    be closed."""
    processes = getattr(pool, "_processes", None) or {}  # the live dict: replacement workers appear in it
    workers = list(processes.values())  # kept: the pool forgets the workers as it shuts down
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        workers += [process for process in list(processes.values()) if process not in workers]
        alive = [process for process in workers if _alive(process)]
        if not alive:
            return
        for process in alive:
            _signal(process, signal.SIGTERM)
        time.sleep(0.2)
    for process in workers:
        if _alive(process):
            _signal(process, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_alive(process) for process in workers) and time.monotonic() < deadline:
        time.sleep(0.1)


def _alive(process: multiprocessing.process.BaseProcess) -> bool:
    """Whether a worker still runs. The fork server reports its children's ends; had it died (it
    reports every child dead then), the kernel is asked (a zombie not yet reaped counts as alive
    for a moment: harmless)."""
    if process.is_alive():
        return True
    try:
        os.kill(process.pid, 0)  # type: ignore[arg-type]
    except ProcessLookupError:
        return False
    except PermissionError:  # the pid was reused by another user's process: ours is gone
        return False
    return True


def _signal(process: multiprocessing.process.BaseProcess, signum: int) -> None:
    try:
        os.kill(process.pid, signum)  # type: ignore[arg-type]
    except ProcessLookupError:
        pass
