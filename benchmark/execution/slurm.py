"""The Slurm executor: one Slurm job per process group, submitted with submitit.

The launch (on a login node, say) and the jobs share the results directory: submitit keeps
each job's pickled call, logs and result under ``<results>/slurm/<time>-<id>/``, and the
workers' progress comes back as JSON lines in ``messages.jsonl`` there. The tracking store
must be reachable from the compute nodes (an MLflow server or a database URL: SQLite on a
network file system is not safe for concurrent writers).

A job that Slurm times out or preempts is requeued (submitit's Checkpointable) and resumes
from its run's last periodic checkpoint. Ctrl-C cancels every job: Slurm sends SIGTERM
first, so a training run writes its checkpoint before it stops.

``cluster='local'`` runs the same code path through submitit's local executor (each job a
process on this machine): how the tests and a laptop exercise it.
"""

from __future__ import annotations

import gc
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.errors import ConfigError
from benchmark.execution.base import Executor, Submission, Task
from benchmark.execution.messages import FileSink, FileSource, Message

CLUSTERS = ("slurm", "local")
REQUEUES = 100
"""How many times a job may be requeued at its time limit (submitit's default, 3, would fail a
run longer than four time limits: each attempt resumes where the last one stopped)."""


@dataclass(frozen=True)
class SlurmOptions:
    """What each job asks Slurm for (from the command line or the suite's ``slurm:`` key)."""

    partition: str | None = None
    time_minutes: int = 24 * 60
    gpus: int = 0
    """GPUs per job: 0 trains on CPU; 1 on the job's GPU (the only one it sees)."""
    cpus: int = 1
    constraint: str | None = None
    account: str | None = None
    memory_gb: float | None = None
    signal_delay_s: int | None = None
    """How long before the time limit the job is warned (Slurm's ``--signal USR2@N``): its runs
    then stop with a checkpoint and the job is requeued. Default: 90 s (submitit's), or half of
    a time limit under 3 minutes."""

    @property
    def warning_seconds(self) -> int:
        return self.signal_delay_s if self.signal_delay_s is not None else (90 if self.time_minutes >= 3 else 30 * self.time_minutes)

    def check(self) -> None:
        if self.time_minutes < 1:
            raise ConfigError(f"slurm time must be >= 1 minute, got {self.time_minutes}")
        if self.gpus not in (0, 1):
            raise ConfigError(f"slurm gpus must be 0 or 1 per job (one process group per job), got {self.gpus}")
        if self.cpus < 1:
            raise ConfigError(f"slurm cpus must be >= 1, got {self.cpus}")
        if self.memory_gb is not None and self.memory_gb <= 0:
            raise ConfigError(f"slurm memory must be > 0 GB, got {self.memory_gb}")
        if not 0 < self.warning_seconds < 60 * self.time_minutes:
            raise ConfigError(f"slurm signal delay must be between 0 and the time limit ({60 * self.time_minutes} s), got {self.warning_seconds}")

    def parameters(self) -> dict[str, Any]:
        """submitit's AutoExecutor parameters (the slurm_ ones apply to Slurm only)."""
        parameters: dict[str, Any] = {
            "timeout_min": self.time_minutes,
            "cpus_per_task": self.cpus,
            "gpus_per_node": self.gpus,
            "tasks_per_node": 1,
            "nodes": 1,
            "name": "reprorl",
        }
        if self.memory_gb is not None:
            parameters["mem_gb"] = self.memory_gb
        parameters["slurm_signal_delay_s"] = self.warning_seconds
        for name, value in (("slurm_partition", self.partition), ("slurm_constraint", self.constraint), ("slurm_account", self.account)):
            if value:
                parameters[name] = value
        return parameters


def _import_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise ConfigError("--executor slurm needs submitit: make install (or pip install -e '.[slurm]')") from None
    return submitit


class SlurmExecutor(Executor):
    """``folder``: the shared directory of the jobs' files; ``max_jobs``: jobs in flight at
    once (None: all at once, Slurm queues them)."""

    name = "slurm"
    interrupt_note = "interrupted: cancelling Slurm jobs (each running run writes its checkpoint first)"

    def __init__(self, folder: Path, options: SlurmOptions, requested_device: str, cluster: str = "slurm", max_jobs: int | None = None):
        _import_submitit()
        options.check()
        if cluster not in CLUSTERS:
            raise ConfigError(f"unknown slurm cluster {cluster!r}; use {' or '.join(CLUSTERS)}")
        if requested_device.startswith("cuda") and options.gpus == 0:
            raise ConfigError(f"--device {requested_device} with --executor slurm needs a GPU per job: --slurm-gpus 1")
        if requested_device == "cpu" and options.gpus:
            raise ConfigError("--device cpu with --slurm-gpus 1 would hold GPUs it never uses")
        self.folder, self.options, self.cluster, self.max_jobs = Path(folder), options, cluster, max_jobs

    def submit(self, tasks: list[Task], log: Callable[[str], None]) -> Submission:
        return _SlurmSubmission(self, tasks, log)


class _Job:
    """What a Slurm job runs: one task (submitit pickles this with its arguments). Warned of its
    time limit or of preemption (submitit's signal, USR2), the job's runs stop as on SIGTERM,
    each writing a checkpoint and recorded as stopped; then submitit requeues the same call and
    the runs resume where they stopped. (Left to submitit's own handler, the signal ended the
    job in the middle of a step, and the runs were recorded as failed with its exit code.)"""

    def __call__(self, task: Task, messages: str, uses_gpu: bool) -> Any:
        import submitit

        environment = submitit.JobEnvironment()
        where = f"Slurm job {environment.job_id} on {environment.hostname}" + (f", GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '?')}" if uses_gpu else "")
        if not uses_gpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        warning = _preempt_signal()
        requeue = signal.getsignal(warning)  # submitit's: checkpoint this call, requeue the job, exit
        warned: list[int] = []

        def stop_runs(signum: int, frame: Any) -> None:
            warned.append(signum)
            os.kill(os.getpid(), signal.SIGTERM)  # the runs' own stop: a checkpoint at the next step

        signal.signal(warning, stop_runs)
        try:
            result = task(FileSink(messages), "cuda:0" if uses_gpu else "cpu", where)
        finally:
            gc.freeze()  # the process ends with this job: its exit need not collect torch's heap (seconds)
        finished = isinstance(result, list) and all(getattr(record, "ok", False) for record in result)
        if warned and not finished and callable(requeue):
            requeue(warned[0], None)  # exits: the requeued job calls this again and the runs resume
        return result

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _preempt_signal() -> signal.Signals:
    """The signal submitit warns a job with (``SUBMITIT_PREEMPT_SIGNAL``, default USR2)."""
    return signal.Signals[f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}"]


def _result_of(job: Any) -> Any:
    try:
        return job.result()
    except Exception as error:  # noqa: BLE001 - the task raised, or the job died (killed, out of memory, a node lost)
        return RuntimeError(f"Slurm job {job.job_id}: {type(error).__name__}: {str(error).strip()[-300:]}")


class _SlurmSubmission(Submission):
    GRACE_SECONDS = 60.0

    def __init__(self, executor: SlurmExecutor, tasks: list[Task], log: Callable[[str], None]):
        submitit = _import_submitit()
        folder = executor.folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(4).hex()}"  # one per submission
        folder.mkdir(parents=True, exist_ok=True)
        parameters = executor.options.parameters()
        if executor.cluster == "local":  # submitit's local executor itself: AutoExecutor does not pass it the signal's delay
            self._submitter = submitit.LocalExecutor(folder=folder, max_num_timeout=REQUEUES)
            generic = {key: value for key, value in parameters.items() if not key.startswith("slurm_") and key not in ("name", "mem_gb", "cpus_per_task")}
            self._submitter.update_parameters(**generic, signal_delay_s=executor.options.warning_seconds)
        else:
            self._submitter = submitit.AutoExecutor(folder=folder, cluster=executor.cluster, slurm_max_num_timeout=REQUEUES)
            self._submitter.update_parameters(**parameters)
        self._messages_path = folder / "messages.jsonl"
        self._source = FileSource(self._messages_path)
        self._uses_gpu, self._local = executor.options.gpus > 0, executor.cluster == "local"
        self._waiting = list(enumerate(tasks))
        self._limit = executor.max_jobs or len(tasks)
        self._jobs: dict[Any, int] = {}
        self._submit_more()
        log(f"Slurm ({executor.cluster}): {len(tasks)} jobs" + (f", {self._limit} at a time" if self._limit < len(tasks) else "") + f"; files in {folder}")

    def _submit_more(self) -> None:
        while self._waiting and len(self._jobs) < self._limit:
            index, task = self._waiting.pop(0)
            self._jobs[self._submitter.submit(_Job(), task, str(self._messages_path), self._uses_gpu)] = index

    def wait(self, timeout: float) -> list[tuple[int, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            ended = [job for job in self._jobs if job.done()]
            if ended or time.monotonic() >= deadline:
                break
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
        results = [(self._jobs.pop(job), _result_of(job)) for job in ended]
        self._submit_more()
        return results

    def messages(self) -> list[Message]:
        return self._source.read()

    @property
    def done(self) -> bool:
        return not self._jobs and not self._waiting

    def cancel(self) -> None:
        self._waiting.clear()
        for job in self._jobs:
            if self._local:  # the local controller forwards SIGTERM to its task, as Slurm does on scancel
                try:
                    os.kill(int(job.job_id), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass
            else:
                job.cancel(check=False)
        deadline = time.monotonic() + self.GRACE_SECONDS
        while time.monotonic() < deadline and not all(job.done() for job in self._jobs):
            time.sleep(0.5)
        for job in self._jobs:
            if not job.done():
                job.cancel(check=False)
