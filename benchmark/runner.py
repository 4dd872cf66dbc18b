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
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchmark import tracking
from benchmark.config import RunSpec


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
) -> dict[str, Any]:
    """Train one spec inside a worker process, logging to its own MLflow child run.

    With ``resume``, a ``latest.pt`` checkpoint of this run key whose MLflow run is unfinished
    is continued in that same run; otherwise (or with ``resume=False``) any such checkpoint is
    discarded and the run starts from scratch in a new child run.
    """
    from benchmark import checkpoint, train  # imported here: torch loads once per worker, not in the parent

    import torch  # noqa: F401 - loaded before the tags are read, so that the GPU model is known

    spec = RunSpec.from_dict(spec_data)
    tags = {
        "run_key": spec.run_key, "suite": spec.suite, "algo": spec.algo, "env_id": spec.env_id, "seed": spec.seed,
        "command": command,
    }
    tracker, payload = None, None
    latest = checkpoint.run_directory(Path(checkpoint_dir), spec.run_key) / checkpoint.LATEST if checkpoint_dir else None
    if latest is not None and latest.exists():
        if resume:
            payload = checkpoint.load(latest)
            step = int(payload["loop"]["step"])
            tracker = tracking.resume_child_run(tracking_uri, payload["metadata"].get("run_id"), parent_run_id, tags, step)
        if tracker is None:  # --force, or the run it belonged to is gone or finished
            payload = None
            latest.unlink(missing_ok=True)
    if tracker is None:
        tracker = tracking.start_child_run(tracking_uri, experiment_id, parent_run_id, spec.label, tags, _child_params(spec))
    _send(messages, ("started", spec.run_key, tracker.run_id, payload["loop"]["step"] if payload else 0))
    tracker.log_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True), "config.json")
    if tracking.code_version()["git_dirty"] == "true":
        tracker.log_text(tracking.git_diff(), "git_diff.patch")

    def progress(step: int, total: int, last_eval: float | None) -> None:
        _send(messages, ("progress", spec.run_key, step, total, last_eval))

    try:
        result = train.run(
            spec,
            tracker,
            progress,
            Path(checkpoint_dir) if checkpoint_dir else None,
            resume=payload,
            checkpoint_metadata={"run_id": tracker.run_id},
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
    except BaseException as error:
        status = "KILLED" if isinstance(error, (KeyboardInterrupt, train.Preempted)) else "FAILED"
        tracker.fail(error, status)
        if isinstance(error, KeyboardInterrupt):
            raise
        return {"run_key": spec.run_key, "run_id": tracker.run_id, "status": status, "error": f"{type(error).__name__}: {error}"}


def _send(messages: Any, message: tuple[Any, ...]) -> None:
    """Progress to the parent; lost quietly when the parent is gone (the run still checkpoints)."""
    try:
        messages.put(message)
    except (OSError, EOFError):
        pass


def execute(
    specs: list[RunSpec],
    *,
    suite_name: str,
    workers: int,
    tracking_uri: str,
    results_dir: Path,
    console: Console | None = None,
    force: bool = False,
) -> Execution:
    """Run every spec under one MLflow parent run; the parent is FAILED if any child fails.

    A spec whose run key already has a FINISHED child run in the suite's experiment is not
    trained again (unless ``force``): its outcome is read from that run, so re-launching a
    half-done suite trains only what is missing. The parent run is tagged ``relaunch_of`` the
    suite's previous invocation, if there was one.
    """
    console = console or Console(stderr=True)
    experiment = tracking.experiment_id(tracking_uri, suite_name, results_dir / "mlartifacts")
    finished = {} if force else tracking.finished_child_runs(tracking_uri, suite_name, {spec.run_key for spec in specs})
    previous = tracking.latest_parent_run_id(tracking_uri, suite_name)
    tags = {"suite": suite_name, "kind": "suite", **({"relaunch_of": previous} if previous else {})}
    parent = tracking.start_parent_run(tracking_uri, experiment, f"{suite_name}-{time.strftime('%Y%m%d-%H%M%S')}", tags)
    to_run = [spec for spec in specs if spec.run_key not in finished]
    parent.log_params({"suite": suite_name, "num_runs": len(specs), "workers": workers, "runs_skipped": len(specs) - len(to_run), "force": force})
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
            pool_outcomes = _execute_in_pool(
                to_run, min(workers, len(to_run)), tracking_uri, experiment, parent.run_id, results_dir, console, resume=not force
            )
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


def _init_child(parent_pid: int) -> None:
    """In each worker and the queue manager: ignore Ctrl-C (the parent stops its children
    itself), and die with the parent however it ends (even SIGKILL), so that no orphan keeps
    training: on Linux the kernel sends SIGTERM when the parent exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _execute_in_pool(
    specs: list[RunSpec],
    workers: int,
    tracking_uri: str,
    experiment: str,
    parent_run_id: str,
    results_dir: Path,
    console: Console,
    resume: bool = True,
) -> list[RunOutcome]:
    context = multiprocessing.get_context("spawn")
    command = " ".join(sys.argv)
    outcomes = {spec.run_key: RunOutcome(spec) for spec in specs}
    checkpoint_dir = str((results_dir / "checkpoints").resolve())
    manager = SyncManager(ctx=context)
    manager.start(initializer=_init_child, initargs=(os.getpid(),))
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_child, initargs=(os.getpid(),))
    messages = manager.Queue()
    columns = (
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    try:
        futures: dict[Future, RunSpec] = {
            pool.submit(run_in_worker, spec.to_dict(), tracking_uri, experiment, parent_run_id, checkpoint_dir, messages, command, resume): spec
            for spec in specs
        }
        with Progress(*columns, console=console, transient=False) as progress:
            overall = progress.add_task("all runs", total=len(specs), info="")
            bars: dict[str, int] = {}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                _drain(messages, outcomes, progress, bars)
                for future in done:
                    _record(future, futures[future], outcomes, progress, bars)
                    progress.advance(overall)
        pool.shutdown(wait=True)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping workers[/]")
        _stop_workers(pool)
        close_unfinished_children(tracking_uri, parent_run_id, "KILLED", "interrupted by the user")
        raise
    finally:
        manager.shutdown()
    close_unfinished_children(tracking_uri, parent_run_id, "FAILED", "worker exited without reporting")
    return [outcomes[spec.run_key] for spec in specs]


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel queued runs and terminate running ones (ProcessPoolExecutor has no public terminate)."""
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=10)


def _drain(messages: Any, outcomes: dict[str, RunOutcome], progress: Progress, bars: dict[str, int]) -> None:
    while True:
        try:
            message = messages.get_nowait()
        except queue_module.Empty:
            return
        kind, run_key = message[0], message[1]
        if kind == "started":
            outcomes[run_key].run_id, resumed_from = message[2], message[3]
            info = f"resumed at {resumed_from:,}" if resumed_from else ""
            bars[run_key] = progress.add_task(
                outcomes[run_key].spec.label, total=outcomes[run_key].spec.budget.total_steps, completed=resumed_from, info=info
            )
            if resumed_from:
                progress.console.print(f"resuming {outcomes[run_key].spec.label} from its checkpoint at env step {resumed_from:,}", highlight=False)
        elif kind == "progress" and run_key in bars:
            step, total, last_eval = message[2:]
            info = f"eval {last_eval:9.1f}" if last_eval is not None else ""
            progress.update(bars[run_key], completed=step, total=total, info=info)


def _record(future: Future, spec: RunSpec, outcomes: dict[str, RunOutcome], progress: Progress, bars: dict[str, int]) -> None:
    outcome = outcomes[spec.run_key]
    try:
        data = future.result()
    except Exception as error:  # the worker process died, or could not even start the run
        outcome.status, outcome.error = "FAILED", f"{type(error).__name__}: {error}"
        return
    outcome.run_id = data.get("run_id", outcome.run_id)
    outcome.status = data["status"]
    outcome.error = data.get("error")
    outcome.final_return_mean = data.get("final_return_mean")
    outcome.final_return_std = data.get("final_return_std")
    outcome.steps_per_second = data.get("steps_per_second")
    outcome.device = data.get("device")
    if spec.run_key in bars:
        info = "failed" if not outcome.ok else f"final {outcome.final_return_mean:9.1f}"
        progress.update(bars[spec.run_key], info=info)
    if outcome.ok:
        line = f"finished {spec.label}: final eval {outcome.final_return_mean:.1f}, {outcome.steps_per_second:,.0f} steps/s"
    else:
        line = f"[red]{outcome.status} {spec.label}[/]: {outcome.error}"
    progress.console.print(line, highlight=False)


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
