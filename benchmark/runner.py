"""Execute RunSpecs: a local process pool, one MLflow child run each, live progress.

Workers are spawned (not forked), so no torch or MLflow thread state is copied into them.
Only the main process handles Ctrl-C: workers ignore SIGINT, and on an interrupt the main
process stops them and marks their runs KILLED. Any child run still RUNNING when the pool
ends (a worker killed by the OS, say) is marked FAILED, found through its parent run id.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import multiprocessing
import os
import queue as queue_module
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing.managers import SyncManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from agents.api import ConfigError
from benchmark import devices, tracking
from benchmark.config import RunSpec
from benchmark.progress import Board


@dataclass
class RunOutcome:
    """One spec's result as seen by the main process."""

    spec: RunSpec
    run_id: str | None = None
    status: str = "FAILED"  # FINISHED | FAILED | KILLED
    final_return_mean: float | None = None
    final_return_std: float | None = None
    steps_per_second: float | None = None
    device: str | None = None
    error: str | None = None
    skipped: bool = False
    """Not trained now: an earlier invocation already finished this run key."""

    @property
    def ok(self) -> bool:
        return self.status == "FINISHED"


@dataclass
class Execution:
    parent_run_id: str
    experiment_id: str
    outcomes: list[RunOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(outcome.ok for outcome in self.outcomes)


def _child_params(spec: RunSpec) -> dict[str, Any]:
    params: dict[str, Any] = {"algo": spec.algo, "env_id": spec.env_id, "seed": spec.seed, "suite": spec.suite}
    params.update({f"budget.{key}": value for key, value in dataclasses.asdict(spec.budget).items()})
    params.update({f"hp.{key}": value for key, value in spec.hyperparameters.items()})
    return params


def run_in_worker(
    spec_data: dict[str, Any],
    tracking_uri: str,
    experiment_id: str,
    parent_run_id: str,
    checkpoint_dir: str | None,
    messages: Any,
    command: str = "",
    resume: bool = True,
    device: str | None = None,
    where: str = "",
) -> dict[str, Any]:
    """Train one spec inside a worker process, logging to its own MLflow child run.

    With ``resume``, a ``latest.pt`` checkpoint of this run key whose MLflow run is unfinished
    is continued in that same run; otherwise (or with ``resume=False``) any such checkpoint is
    discarded and the run starts from scratch in a new child run.
    """
    from benchmark import checkpoint, train  # imported here: torch loads once per worker, not in the parent

    import torch  # noqa: F401 - loaded before the tags are read, so that the GPU model is known

    spec = RunSpec.from_dict(spec_data)
    # the device this process trains on (its slot's); config.json keeps the one the suite asked for
    training_spec = dataclasses.replace(spec, device=device) if device is not None else spec
    tags = {
        "run_key": spec.run_key, "suite": spec.suite, "algo": spec.algo, "env_id": spec.env_id, "seed": spec.seed,
        "command": command, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
    }
    run_dir = checkpoint.run_directory(Path(checkpoint_dir), spec.run_key) if checkpoint_dir else None
    latest = run_dir / checkpoint.LATEST if run_dir is not None else None
    tracker, payload = None, None
    if latest is not None and latest.exists():
        if resume:
            tracker, payload = _reopen(latest, tracking_uri, parent_run_id, tags, messages, spec)
        if tracker is None:  # --force, or the run it belonged to is gone or finished
            latest.unlink(missing_ok=True)

    while True:
        if tracker is None:
            tracker = tracking.start_child_run(tracking_uri, experiment_id, parent_run_id, spec.label, tags, _child_params(spec))
        _send(messages, ("started", spec.run_key, tracker.run_id, payload["loop"]["step"] if payload else 0, where))
        tracker.log_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True), "config.json")
        if tracking.code_version()["git_dirty"] == "true":
            tracker.log_text(tracking.git_diff(), "git_diff.patch")

        def progress(step: int, total: int, last_eval: float | None) -> None:
            _send(messages, ("progress", spec.run_key, step, total, last_eval))

        try:
            result = train.run(
                training_spec,
                tracker,
                progress,
                Path(checkpoint_dir) if checkpoint_dir else None,
                resume=payload,
                checkpoint_metadata={"run_id": tracker.run_id},
                remove_latest_on_finish=False,
            )
            final = result.evaluations[-1]
            tracker.set_tags({"device": result.device})
            tracker.log_metrics(
                {
                    "final/eval_return_mean": final.mean,
                    "final/eval_return_std": final.std,
                    "final/steps_per_second": result.steps_per_second,
                    "final/wall_seconds": result.wall_seconds,
                },
                final.step,
            )
            evaluations = [dataclasses.asdict(evaluation) for evaluation in result.evaluations]
            tracker.log_text(json.dumps(evaluations), "evaluations.json")
            tracker.finish("FINISHED")
            if latest is not None:  # only now: a kill before this point resumes the run
                latest.unlink(missing_ok=True)
            return {
                "run_key": spec.run_key,
                "run_id": tracker.run_id,
                "status": "FINISHED",
                "final_return_mean": final.mean,
                "final_return_std": final.std,
                "steps_per_second": result.steps_per_second,
                "device": result.device,
                "resumed_from": payload["loop"]["step"] if payload else None,
            }
        except train.ResumeError as error:
            # the checkpoint does not fit this code: close that attempt, keep the file aside, start over
            assert latest is not None
            tracker.fail(error)
            bad = latest.with_suffix(".pt.bad")
            latest.replace(bad)
            _send(messages, ("note", spec.run_key, f"{error}; kept as {bad}; {spec.label} starts over in a new MLflow run"))
            tracker, payload = None, None
        except BaseException as error:
            status = "KILLED" if isinstance(error, (KeyboardInterrupt, train.Preempted)) else "FAILED"
            tracker.fail(error, status)
            if isinstance(error, KeyboardInterrupt):
                raise
            return {"run_key": spec.run_key, "run_id": tracker.run_id, "status": status, "error": f"{type(error).__name__}: {error}"}


def _reopen(
    latest: Path, tracking_uri: str, parent_run_id: str, tags: dict[str, Any], messages: Any, spec: RunSpec
) -> tuple[Any, dict[str, Any] | None]:
    """The reopened MLflow run and the checkpoint to resume from, or (None, None) when the
    checkpoint cannot be read (it is kept aside as ``latest.pt.bad``) or its run is gone."""
    from benchmark import checkpoint

    try:
        payload = checkpoint.load(latest)
        step, run_id, exact = int(payload["loop"]["step"]), payload["metadata"].get("run_id"), bool(payload.get("exact"))
    except Exception as error:  # noqa: BLE001 - any unreadable file: say so and start over
        bad = latest.with_suffix(".pt.bad")
        latest.replace(bad)
        _send(messages, ("note", spec.run_key, f"cannot read the checkpoint of {spec.label} ({type(error).__name__}: {error}); "
                                              f"kept as {bad}; the run starts over"))
        return None, None
    tracker = tracking.resume_child_run(
        tracking_uri, run_id, parent_run_id, {**tags, "resumed_exactly": str(exact).lower()}, step
    )
    return (tracker, payload) if tracker is not None else (None, None)


def _send(messages: Any, message: tuple[Any, ...]) -> None:
    """Progress to the parent; lost quietly when the parent (or Ray's queue) is gone: the run
    still checkpoints, and a lost message must never fail it."""
    try:
        messages.put(message)
    except Exception:  # noqa: BLE001 - BrokenPipe, EOFError, RayActorError...
        pass


EXECUTORS = ("local", "ray")


def execute(
    specs: list[RunSpec],
    *,
    suite_name: str,
    workers: int,
    tracking_uri: str,
    results_dir: Path,
    console: Console | None = None,
    force: bool = False,
    executor: str = "local",
    runs_per_gpu: int | None = None,
    ray_address: str | None = None,
    live: bool | None = None,
) -> Execution:
    """Run every spec under one MLflow parent run; the parent is FAILED if any child fails.

    A spec whose run key already has a FINISHED child run in the suite's experiment is not
    trained again (unless ``force``): its outcome is read from that run, so re-launching a
    half-done suite trains only what is missing, and a run with a checkpoint resumes from it.
    The parent run is tagged ``relaunch_of`` the suite's previous invocation, if there was one.

    ``executor``: 'local' (a process pool on this machine, one process per GPU run) or 'ray'
    (one Ray task per run, on the cluster at ``ray_address`` or a local Ray instance). Runs go
    to the GPU slots that the specs' device and ``runs_per_gpu`` give (see benchmark.devices),
    at most ``workers`` CPU runs at once.
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; use {' or '.join(EXECUTORS)}")
    console = console or Console(stderr=True)
    requested = _requested_device(specs)
    if executor == "local":  # Ray plans its slots from the cluster's GPUs once it is connected
        slots = devices.plan_slots(
            requested, devices.visible_gpus(devices.gpu_count()) if requested != "cpu" else [], runs_per_gpu, workers
        )
    experiment = tracking.experiment_id(tracking_uri, suite_name, results_dir / "mlartifacts")
    finished = {} if force else tracking.finished_child_runs(tracking_uri, suite_name, {spec.run_key for spec in specs})
    previous = tracking.latest_parent_run_id(tracking_uri, suite_name)
    if previous and tracking.close_if_orphaned(tracking_uri, previous):
        console.print(f"the previous invocation (parent run {previous}) died without closing its run: marked KILLED")
    tags = {"suite": suite_name, "kind": "suite", **({"relaunch_of": previous} if previous else {})}
    parent = tracking.start_parent_run(tracking_uri, experiment, f"{suite_name}-{time.strftime('%Y%m%d-%H%M%S')}", tags)
    to_run = [spec for spec in specs if spec.run_key not in finished]
    parent.log_params({
        "suite": suite_name, "num_runs": len(specs), "workers": workers, "runs_skipped": len(specs) - len(to_run),
        "force": force, "executor": executor, "device": requested, "runs_per_gpu": runs_per_gpu,
    })
    if len(to_run) < len(specs):
        console.print(
            f"{len(specs) - len(to_run)} of {len(specs)} runs already finished in the tracking store: not run again "
            "(--force reruns them)"
        )
    resumable = [spec for spec in to_run if _has_resumable_checkpoint(results_dir, spec)]
    if resumable and not force:
        console.print(f"{len(resumable)} of {len(to_run)} runs to train have a checkpoint: they resume from it in their MLflow run")
    execution = Execution(parent.run_id, experiment)
    try:
        trained = {}
        if to_run:
            job = _Job(to_run, tracking_uri, experiment, parent.run_id, str((results_dir / "checkpoints").resolve()), not force)
            board = Board(
                {spec.run_key: spec.budget.total_steps for spec in to_run},
                console,
                groups={spec.run_key: f"{spec.algo}/{spec.env_id}" for spec in to_run},
                live=live,
            )
            with board:
                if executor == "ray":
                    pool_outcomes = _execute_on_ray(job, requested, runs_per_gpu, workers, board, ray_address)
                else:
                    pool_outcomes = _execute_in_pool(job, slots[: len(to_run)], board)
            trained = {outcome.spec.run_key: outcome for outcome in pool_outcomes}
        outcomes = [trained.get(spec.run_key) or _outcome_of_finished(spec, finished[spec.run_key]) for spec in specs]
        execution.outcomes = outcomes
        parent.log_metrics(
            {"runs_finished": sum(o.ok for o in outcomes), "runs_failed": sum(not o.ok for o in outcomes)}, 0
        )
        parent.finish("FINISHED" if execution.ok else "FAILED")
    except BaseException as error:
        parent.fail(error)
        raise
    return execution


def _requested_device(specs: list[RunSpec]) -> str:
    requested = {spec.device for spec in specs}
    if len(requested) > 1:
        raise ConfigError(f"the runs of one invocation must share a device; got {sorted(requested)} (use --device)")
    return requested.pop() if requested else "cpu"


@dataclass
class _Job:
    """What every run of one invocation shares."""

    specs: list[RunSpec]
    tracking_uri: str
    experiment: str
    parent_run_id: str
    checkpoint_dir: str
    resume: bool
    command: str = field(default_factory=lambda: " ".join(sys.argv))

    def arguments(self, spec: RunSpec, messages: Any) -> tuple[Any, ...]:
        return (spec.to_dict(), self.tracking_uri, self.experiment, self.parent_run_id, self.checkpoint_dir, messages,
                self.command, self.resume)


def _has_resumable_checkpoint(results_dir: Path, spec: RunSpec) -> bool:
    from benchmark import checkpoint

    return (checkpoint.run_directory(results_dir / "checkpoints", spec.run_key) / checkpoint.LATEST).exists()


def _outcome_of_finished(spec: RunSpec, run: Any) -> RunOutcome:
    metrics = run.data.metrics
    return RunOutcome(
        spec,
        run_id=run.info.run_id,
        status="FINISHED",
        final_return_mean=metrics.get("final/eval_return_mean"),
        final_return_std=metrics.get("final/eval_return_std"),
        steps_per_second=metrics.get("final/steps_per_second"),
        device=run.data.tags.get("device"),
        skipped=True,
    )


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def init_child_process(parent_pid: int) -> None:
    """In each worker and the queue manager: ignore Ctrl-C (the parent stops its children
    itself), and die with the parent however it ends (even SIGKILL), so that no orphan keeps
    training: on Linux the kernel sends SIGTERM when the parent exits (a training run then
    writes its checkpoint before it stops)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def run_in_slot(slots: Any, stopping: Any, *arguments: Any) -> dict[str, Any]:
    """A local-pool task: take a free device slot, make it the only visible device, train,
    give the slot back. There are as many workers as slots, so one is always free. Once the
    invocation is stopping (Ctrl-C), a task that had not started yet does not start."""
    if stopping.is_set():
        return {"status": "KILLED", "error": "not started: the invocation was interrupted"}
    slot = devices.Slot(*slots.get())
    try:
        devices.enter_slot(slot)
        return run_in_worker(*arguments, device=slot.device, where=slot.describe())
    finally:
        slots.put(dataclasses.astuple(slot))


def _execute_in_pool(job: _Job, slots: list[devices.Slot], board: Board) -> list[RunOutcome]:
    """A spawned process pool with one worker per slot. A GPU run gets a fresh process (CUDA
    must not have started before it picks its device); CPU workers are reused."""
    context = multiprocessing.get_context("spawn")
    outcomes = {spec.run_key: RunOutcome(spec) for spec in job.specs}
    manager = SyncManager(ctx=context)
    manager.start(initializer=init_child_process, initargs=(os.getpid(),))
    fresh_process_per_run = any(slot.is_gpu for slot in slots)
    pool = ProcessPoolExecutor(
        max_workers=len(slots), mp_context=context, initializer=init_child_process, initargs=(os.getpid(),),
        max_tasks_per_child=1 if fresh_process_per_run else None,
    )
    messages, free_slots, stopping = manager.Queue(), manager.Queue(), manager.Event()
    for slot in slots:
        free_slots.put(dataclasses.astuple(slot))
    try:
        futures: dict[Future, RunSpec] = {
            pool.submit(run_in_slot, free_slots, stopping, *job.arguments(spec, messages)): spec for spec in job.specs
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(messages, outcomes, board)
            for future in done:
                _record(_result_of(future), futures[future], outcomes, board)
            board.refresh()
        pool.shutdown(wait=True)
    except KeyboardInterrupt:
        board.log("interrupted: stopping workers (each running run writes its checkpoint first)")
        stopping.set()
        _stop_workers(pool)
        close_unfinished_children(job.tracking_uri, job.parent_run_id, "KILLED", "interrupted by the user")
        raise
    finally:
        manager.shutdown()
    close_unfinished_children(job.tracking_uri, job.parent_run_id, "FAILED", "worker exited without reporting")
    return [outcomes[spec.run_key] for spec in job.specs]


def _result_of(future: Future) -> dict[str, Any]:
    try:
        return future.result()
    except Exception as error:  # the worker process died, or could not even start the run
        return {"status": "FAILED", "error": f"{type(error).__name__}: {error}"}


def _stop_workers(pool: ProcessPoolExecutor, grace_seconds: float = 30.0) -> None:
    """Cancel queued runs and SIGTERM running ones, which checkpoint and stop (ProcessPoolExecutor
    has no public terminate); whatever still lives after ``grace_seconds`` is killed."""
    processes = getattr(pool, "_processes", None) or {}  # the live dict: replacement workers appear in it
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        alive = [process for process in list(processes.values()) if process.is_alive()]
        if not alive:
            return
        for process in alive:
            process.terminate()
        time.sleep(0.2)
    for process in list(processes.values()):
        process.kill()


def _execute_on_ray(
    job: _Job, requested: str, runs_per_gpu: int | None, workers: int, board: Board, address: str | None
) -> list[RunOutcome]:
    """One Ray task per run. Without ``address`` a local Ray instance is started with
    ``workers`` CPUs (and the GPUs Ray detects); ``address='auto'`` joins the running cluster.
    A GPU run asks for 1/runs_per_gpu of a GPU, so Ray packs that many on one device and sets
    each task's CUDA_VISIBLE_DEVICES itself (Ray, not cuda:N, picks the GPU)."""
    try:
        import ray
        from ray.util.queue import Empty, Queue
    except ImportError:
        raise ConfigError("--executor ray needs Ray: make install (or pip install -e '.[ray]')") from None

    started_here = not ray.is_initialized()
    if started_here:
        options: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        if address:
            ray.init(address=address, **options)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, object_store_memory=100 * 1024**2, **options)
    try:
        cluster_gpus = [str(index) for index in range(int(ray.cluster_resources().get("GPU", 0)))]
        slots = devices.plan_slots(requested, cluster_gpus, runs_per_gpu, workers)
        gpu_slots = [slot for slot in slots if slot.is_gpu]
        gpu_share = len({slot.visible_devices for slot in gpu_slots}) / len(gpu_slots) if gpu_slots else 0.0
        board.log(f"Ray: {ray.cluster_resources().get('CPU', 0):.0f} CPUs, {len(cluster_gpus)} GPUs; "
                  + (f"{gpu_share:g} GPU per run" if gpu_share else "runs on CPU"))
        outcomes = {spec.run_key: RunOutcome(spec) for spec in job.specs}
        messages = Queue(actor_options={"num_cpus": 0})
        # a GPU run gets a fresh worker process: CUDA must not have started on another device
        task = ray.remote(max_calls=1 if gpu_share else 0, max_retries=0)(_run_on_ray).options(num_cpus=1, num_gpus=gpu_share)
        references = {task.remote(*job.arguments(spec, messages), gpu_share > 0): spec for spec in job.specs}
        try:
            pending = list(references)
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                while True:
                    try:
                        message = messages.get_nowait()
                    except Empty:
                        break
                    _handle_message(message, outcomes, board)
                for reference in done:
                    try:
                        data = ray.get(reference)
                    except Exception as error:  # the task's process died
                        data = {"status": "FAILED", "error": f"{type(error).__name__}: {error}"}
                    _record(data, references[reference], outcomes, board)
                board.refresh()
        except KeyboardInterrupt:
            # a cancelled task stops where it is: it resumes later from its last periodic checkpoint
            board.log("interrupted: cancelling Ray tasks")
            for reference in references:
                ray.cancel(reference, force=False)
            ray.wait(list(references), num_returns=len(references), timeout=30)
            close_unfinished_children(job.tracking_uri, job.parent_run_id, "KILLED", "interrupted by the user")
            raise
        finally:
            messages.shutdown()
    finally:
        if started_here:
            ray.shutdown()
    close_unfinished_children(job.tracking_uri, job.parent_run_id, "FAILED", "Ray task exited without reporting")
    return [outcomes[spec.run_key] for spec in job.specs]


def _run_on_ray(*arguments: Any) -> dict[str, Any]:
    """A Ray task: Ray has already set CUDA_VISIBLE_DEVICES to the GPU it assigned (if any)."""
    *worker_arguments, uses_gpu = arguments
    where = f"GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '?')} (Ray)" if uses_gpu else "CPU (Ray)"
    if not uses_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return run_in_worker(*worker_arguments, device="cuda:0" if uses_gpu else "cpu", where=where)


def _drain(messages: Any, outcomes: dict[str, RunOutcome], board: Board) -> None:
    while True:
        try:
            message = messages.get_nowait()
        except queue_module.Empty:
            return
        _handle_message(message, outcomes, board)


def _handle_message(message: tuple[Any, ...], outcomes: dict[str, RunOutcome], board: Board) -> None:
    kind, run_key = message[0], message[1]
    if kind == "started":
        run_id, resumed_from, where = message[2:]
        outcomes[run_key].run_id = run_id
        board.started(run_key, outcomes[run_key].spec.label, where, resumed_from)
    elif kind == "progress":
        step, _total, last_eval = message[2:]
        board.progressed(run_key, step, last_eval)
    elif kind == "note":
        board.log(message[2])


def _record(data: dict[str, Any], spec: RunSpec, outcomes: dict[str, RunOutcome], board: Board) -> None:
    outcome = outcomes[spec.run_key]
    outcome.run_id = data.get("run_id", outcome.run_id)
    outcome.status = data["status"]
    outcome.error = data.get("error")
    outcome.final_return_mean = data.get("final_return_mean")
    outcome.final_return_std = data.get("final_return_std")
    outcome.steps_per_second = data.get("steps_per_second")
    outcome.device = data.get("device")
    if outcome.ok:
        line = f"finished {spec.label}: final eval {outcome.final_return_mean:.1f}, {outcome.steps_per_second:,.0f} steps/s"
    else:
        line = f"{outcome.status} {spec.label}: {outcome.error}"
    board.finished(spec.run_key, spec.label, outcome.ok, line)


def close_unfinished_children(tracking_uri: str, parent_run_id: str, status: str, message: str) -> list[str]:
    """Mark every child of ``parent_run_id`` still RUNNING as ``status``; returns their ids."""
    client = tracking.client(tracking_uri)
    parent = tracking.retry(lambda: client.get_run(parent_run_id))
    query = f"tags.`mlflow.parentRunId` = '{parent_run_id}' and attributes.status = 'RUNNING'"
    runs = tracking.retry(lambda: client.search_runs([parent.info.experiment_id], query, max_results=10_000))
    for run in runs:
        tracking.retry(lambda: client.set_tag(run.info.run_id, "error", message))
        tracking.retry(lambda: client.set_terminated(run.info.run_id, status))
    return [run.info.run_id for run in runs]
