"""What the local pool's fork server imports once per launch, so that the workers it forks
start with it loaded instead of importing it each (about 10 s of CPU per worker here: torch,
the training loop, MLflow's SQL store, TorchDynamo).

Then everything imported is frozen (``gc.freeze``, what the gc docs advise before fork without
exec): the workers' collections never scan it (nor copy its pages to write reference counts),
and the server's own exit, when its launch ends, skips collecting it (2-3 s with torch loaded,
which a caller reading the launch's output until EOF would wait for).

Nothing here runs an operation: the server only imports, so no CUDA context, OpenMP pool or
open database is copied into a worker (torch and pyarrow start a helper thread at import,
neither holding state a forked child needs; Python 3.12+ would warn about them at each fork).

The server ignores SIGTERM: one sent to the launch's whole process group (a shell's timeout, a
batch scheduler) would end it while its workers write their preemption checkpoints and close
their runs, and the launch, which learns of its workers' ends through the server, would take
them for dead and leave their runs RUNNING. It exits with its launch all the same (when the
launch's end of its pipe closes); each worker restores SIGTERM (``child.init_child_process``).

Ctrl-C in the first seconds of a launch printed the traceback of these imports from the server
(multiprocessing's fork server ignores SIGINT only once its preload is done): SIGINT is ignored
during the imports, and Python's handler put back after them, which the server then replaces
with its own and its workers restore. A worker that cannot start because its launch is
stopping (its queues gone: FileNotFoundError, EOFError, a broken connection) dies without a
traceback; one that starts puts Python's own hook back (``child.init_child_process``).
"""

import gc
import signal
import sys
import warnings

signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)


def _quiet_when_stopping(kind: type[BaseException], value: BaseException, traceback: object) -> None:
    """The fork server's children's hook until they start: their launch stopping is no error of theirs."""
    if not issubclass(kind, (KeyboardInterrupt, FileNotFoundError, EOFError, ConnectionError)):
        sys.__excepthook__(kind, value, traceback)  # type: ignore[arg-type]


sys.excepthook = _quiet_when_stopping

warnings.filterwarnings("ignore", message=r".*multi-threaded, use of fork\(\) may lead to deadlocks", category=DeprecationWarning)

import mlflow.store.tracking.sqlalchemy_store  # noqa: E402,F401 - the worker's MLflow client opens the SQL store
import torch._dynamo  # noqa: E402,F401 - torch.optim imports it on an optimizer's first use (4 s)

import benchmark.execution.local  # noqa: E402,F401 - the pool's task, the devices, agents
import benchmark.execution.worker  # noqa: E402,F401
import benchmark.training.loop  # noqa: E402,F401

gc.freeze()
signal.signal(signal.SIGINT, signal.default_int_handler)
