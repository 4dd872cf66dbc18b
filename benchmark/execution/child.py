"""What every child process of the local pool runs first (the workers and the queue manager).

Kept free of torch and the rest: the queue manager imports this module to start, and it only
serves queues, so it should not pay seconds of imports.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h
_parent_pid: int | None = None  # set in each child by init_child_process


def init_child_process(parent_pid: int) -> None:
    """In each worker and the queue manager: ignore Ctrl-C (the parent stops its children
    itself), and die with the parent however it ends (even SIGKILL), so that no orphan keeps
    training: on Linux the kernel sends SIGTERM when the parent exits (a training run then
    writes its checkpoint before it stops)."""
    global _parent_pid
    _parent_pid = parent_pid
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    exit_if_orphaned()


def exit_if_orphaned() -> None:
    """Exit at once if the launch that started this child is gone. A worker that was training
    when the launch died took the kernel's SIGTERM as a stop request (its run checkpoints and
    stops) and would then wait for more work forever: the pool's queues never reach end of
    file, since every worker holds their other ends too."""
    if _parent_pid is not None and os.getppid() != _parent_pid:
        os._exit(1)
