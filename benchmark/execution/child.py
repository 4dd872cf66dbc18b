"""What every child process of the local pool runs first (the workers and the queue manager).

Kept free of torch and the rest: the queue manager imports this module to start, and it only
serves queues, so it should not pay seconds of imports.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h
_launch_pid: int | None = None  # set in each child by init_child_process
_launch_handle: int | None = None  # a pidfd of the launch (Linux), readable once it has ended
_parent_pid: int | None = None


def init_child_process(launch_pid: int, environ: dict[str, str] | None = None) -> None:
    """In each worker and the queue manager: ignore Ctrl-C (the launch stops its children
    itself), and die with the launch however it ends (even SIGKILL), so that no orphan keeps
    training: the child gets SIGTERM when the launch exits (a training run then writes its
    checkpoint before it stops). The kernel sends it when the parent exits; a worker forked by
    the launch's fork server (which lives on while its children do) watches the launch itself.
    ``environ``: the launch's environment now, which a worker forked from a server started
    earlier takes over (as a spawned one would have)."""
    global _launch_pid, _launch_handle, _parent_pid
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    _launch_pid, _parent_pid = launch_pid, os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.excepthook = sys.__excepthook__  # the fork server's quiet one covers a worker's start only (``preload``)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the fork server ignores it (``preload``)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    try:
        _launch_handle = os.pidfd_open(launch_pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or the launch is already gone (checked below)
        _launch_handle = None
    exit_if_orphaned()
    if _parent_pid != launch_pid:
        threading.Thread(target=_terminate_when_the_launch_ends, name="launch-watch", daemon=True).start()


def init_queue_manager(launch_pid: int) -> None:
    """In the queue manager: as ``init_child_process``, but a SIGTERM ends it only once the
    launch has ended (the kernel's signal at the launch's death). A SIGTERM sent to the whole
    process group (a shell's timeout, a batch scheduler) reaches the launch too, which then
    needs its queues to stop its workers; it shuts the manager down itself."""
    init_child_process(launch_pid)
    signal.signal(signal.SIGTERM, lambda signum, frame: exit_if_orphaned())
    if _parent_pid == launch_pid:  # the kernel's signal comes once, and might come early: watch the launch too
        threading.Thread(target=_terminate_when_the_launch_ends, name="launch-watch", daemon=True).start()


def start_helpers_ignoring_ctrl_c() -> None:
    """Have multiprocessing start its helper interpreters (the fork server, the queue manager,
    spawned workers) with SIGINT ignored. A terminal's Ctrl-C goes to the whole process group,
    and one that reached a helper in its interpreter's own first tenths of a second, before any
    code of ours runs there, printed Python's traceback of its start; a Python that starts with
    SIGINT ignored keeps it ignored (the fork server's preload puts the usual handler back once
    it has imported). The launch ignores SIGINT only while the helper is forked and executed
    (about a millisecond, in the main thread), not while it starts: blocking the signal would not
    do (the helper starts with an empty mask), and ignoring it in the launch for the whole start
    lost the launch's own Ctrl-C. A helper that outlives a Ctrl-C this way is ended by the launch
    (``local._stop_manager``): left alive mid-start, multiprocessing's exit would wait for it
    forever. Idempotent."""
    import multiprocessing.util

    spawn = multiprocessing.util.spawnv_passfds
    if getattr(spawn, "ignores_ctrl_c", False):
        return

    def spawnv_passfds(path: bytes, args: Sequence[Any], passfds: Sequence[int]) -> int:
        handler = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread() or handler is None:
            return spawn(path, args, passfds)  # a handler Python cannot put back: leave it alone
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return spawn(path, args, passfds)
        finally:
            signal.signal(signal.SIGINT, handler)

    spawnv_passfds.ignores_ctrl_c = True  # type: ignore[attr-defined]
    multiprocessing.util.spawnv_passfds = spawnv_passfds


def exit_if_orphaned() -> None:
    """Exit at once if the launch that started this child is gone. A worker that was training
    when the launch died took SIGTERM as a stop request (its run checkpoints and stops) and
    would then wait for more work forever: the pool's queues never reach end of file, since
    every worker holds their other ends too."""
    if _launch_pid is not None and (os.getppid() != _parent_pid or _launch_ended(timeout=0)):
        os._exit(1)


def _launch_ended(timeout: float | None) -> bool:
    """Whether the launch has ended, waiting up to ``timeout`` seconds (None: until it does)."""
    if _launch_handle is not None:
        return bool(select.select([_launch_handle], [], [], timeout)[0])
    assert _launch_pid is not None  # callers run after init_child_process
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            os.kill(_launch_pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(1.0)


def _terminate_when_the_launch_ends() -> None:
    if _launch_ended(timeout=None):
        os.kill(os.getpid(), signal.SIGTERM)
