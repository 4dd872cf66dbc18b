"""Execute RunSpecs: a local process pool, one MLflow child run each, live progress.

A pool task trains one spec, or several that differ only by seed as one batched model (the
suite's ``seeds_in_process``): each of them still has its own MLflow child run and outcome.

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
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any

from rich.console import Console

from agents.api import ConfigError
from benchmark import stores, tracking
from benchmark.config import TRAIN_RETURN_METRIC, RunSpec
from benchmark.execution import claims, devices
from benchmark.execution.progress import Board


@dataclass
class RunOutcome:
    """One spec's result as seen by the main process."""

    spec: RunSpec
    run_id: str | None = None
    status: str = "FAILED"  # FINISHED | FAILED | KILLED | CLAIMED (another live launch trains it)
    final_return_mean: float | None = None
    final_return_std: float | None = None
    steps_per_second: float | None = None
    device: str | None = None
    error: str | None = None
    skipped: bool = False
    """Not trained by this invocation: another one finished this run key (earlier, or meanwhile)."""
    claimed_by: str | None = None
    """CLAIMED: who trains it (host, pid, since when)."""
    source: str = ""
    """A run a result bundle holds: the bundle's directory."""
    final_train_return: float | None = None
    """Mean return of the training episodes of the last evaluation interval."""

    @property
    def ok(self) -> bool:
        return self.status == "FINISHED"


@dataclass
class Execution:
    parent_run_id: str
    experiment_id: str
    outcomes: list[RunOutcome] = field(default_factory=list)
    finished_before: int = 0
    """Runs an earlier invocation had finished (not trained again)."""


def run_in_worker(
    specs_data: list[dict[str, Any]],
    tracking_uri: str,
    experiment_id: str,
    parent_run_id: str,
    checkpoint_dir: str | None,
    messages: Any,
    command: str = "",
    resume: bool = True,
    claims_dir: str | None = None,
    finished_since_ms: int = 0,
    device: str | None = None,
    where: str = "",
) -> list[dict[str, Any]]:
    """Train a process group inside a worker: one spec, or specs that differ only by seed
    trained as one batched model (``benchmark.training.train.run_seeds``); each spec logs to its own
    MLflow child run, exactly as if it had trained alone, and gets its own outcome.

    With ``claims_dir``, each run key is claimed first (``benchmark.execution.claims``) and held until its
    run is closed: a key another live process holds is not trained (outcome CLAIMED), and a key
    that got a FINISHED run meanwhile (with ``finished_since_ms``, as under ``--force``: a run that
    started at or after it, from scratch) is not trained again. Holding the claim, the worker knows that any RUNNING run of the key is an orphan of a
    process that died: it is closed as KILLED, linked to the run that replaces it.

    With ``resume``, a ``latest.pt`` checkpoint of a run key whose MLflow run is unfinished is
    continued in that same run (seeds of a group resumed at different steps train as one batch
    per step); otherwise (or with ``resume=False``) any such checkpoint is discarded and the run
    starts from scratch in a new child run.
    """
    import torch  # noqa: F401 - loaded before the tags are read, so that the GPU model is known

    from benchmark.training import (
        train,  # imported here: torch loads once per worker, not in the parent
    )

    context = _WorkerContext(
        tracking_uri, experiment_id, parent_run_id, checkpoint_dir, messages, command, resume, device, where,
        claims_dir=Path(claims_dir) if claims_dir else None, finished_since_ms=finished_since_ms,
    )
    children = [_ChildRun(RunSpec.from_dict(data), context) for data in specs_data]
    outcomes: dict[str, dict[str, Any]] = {}
    try:
        for child in children:
            settled = child.claim()
            if settled is None:
                child.open()
            else:
                outcomes[child.spec.run_key] = settled
        pending = [child for child in children if child.spec.run_key not in outcomes]
        while pending:
            restarted = []
            for batch in _batches_by_step(pending):
                for child, result in zip(batch, _train_batch(batch, context), strict=True):
                    if isinstance(result, train.ResumeError):  # the checkpoint does not fit this code: start over
                        child.start_over(result)
                        restarted.append(child)
                    else:
                        outcomes[child.spec.run_key] = child.close(result)
            pending = restarted
    except BaseException as error:  # Ctrl-C, or the worker itself failing: every run still open ends with it
        for child in children:
            if child.spec.run_key in outcomes:
                continue
            if child.tracker is not None:
                outcomes[child.spec.run_key] = child.close(error)
            else:
                outcomes[child.spec.run_key] = {"run_key": child.spec.run_key, "status": "FAILED", "error": f"{type(error).__name__}: {error}"}
        if isinstance(error, KeyboardInterrupt):
            raise
    finally:
        for child in children:
            child.release()
    return [outcomes[child.spec.run_key] for child in children]


@dataclass
class _WorkerContext:
    """What every run of one worker task shares."""

    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    checkpoint_dir: str | None
    messages: Any
    command: str
    resume: bool
    device: str | None
    where: str
    claims_dir: Path | None = None
    finished_since_ms: int = 0


class _ChildRun:
    """One spec inside a worker: its MLflow child run (new, or reopened to resume from its
    checkpoint), what training it needs, and its outcome."""

    def __init__(self, spec: RunSpec, context: _WorkerContext):
        from benchmark.training import checkpoint

        self.spec, self.context = spec, context
        # the device this process trains on (its slot's); config.json keeps the one the suite asked for
        self.training_spec = dataclasses.replace(spec, device=context.device) if context.device is not None else spec
        self.tags = {
            "run_key": spec.run_key, "suite": spec.suite, "algo": spec.algo, "env_id": spec.env_id, "seed": spec.seed,
            "command": context.command, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
            **tracking.source_tags(context.command),  # the launch's command, not this worker's (Ray's)
        }
        self.claims_id = claims.directory_id(context.claims_dir) if context.claims_dir is not None else ""
        if self.claims_id:
            self.tags[tracking.CLAIMS_TAG] = self.claims_id
        run_dir = checkpoint.run_directory(Path(context.checkpoint_dir), spec.run_key) if context.checkpoint_dir else None
        self.latest = run_dir / checkpoint.LATEST if run_dir is not None else None
        self.tracker: Any = None
        self.payload: dict[str, Any] | None = None
        self._claim: claims.Claim | None = None

    def claim(self) -> dict[str, Any] | None:
        """Take this run key's claim; the outcome when the run is not to be trained here (another
        live process holds the key, or it got a FINISHED run meanwhile), else None."""
        context, key = self.context, self.spec.run_key
        if context.claims_dir is None:
            return None
        self._claim = claims.take(context.claims_dir, key, claims.Holder.here(context.parent_run_id, self.spec.label, self.spec.suite))
        if self._claim is None:
            holder = claims.holder(context.claims_dir, key)
            return {"run_key": key, "status": "CLAIMED", "claimed_by": holder.describe() if holder else "another launch"}
        done = tracking.finished_child_runs(
            context.tracking_uri, None, {key}, experiment_id=context.experiment_id, started_since_ms=context.finished_since_ms
        ).get(key)
        if done is None:
            return None
        if self.latest is not None:  # left by a process killed between finishing the run and removing it
            self.latest.unlink(missing_ok=True)
        self.release()
        outcome = _outcome_of_finished(self.spec, done)
        return {"run_key": key, "status": "FINISHED", "skipped": True, "run_id": outcome.run_id,
                "final_return_mean": outcome.final_return_mean, "final_return_std": outcome.final_return_std,
                "steps_per_second": outcome.steps_per_second, "device": outcome.device,
                "final_train_return": outcome.final_train_return}

    def release(self) -> None:
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    @property
    def resumes_from(self) -> int:
        return int(self.payload["loop"]["step"]) if self.payload else 0

    def open(self) -> None:
        """Reopen the run of a resumable checkpoint, or start a new child run."""
        latest = self.latest
        if latest is not None and latest.exists():
            if self.context.resume:
                self.tracker, self.payload = _reopen(latest, self.context, self.tags, self.spec)
            if self.tracker is None:  # --force, or the run it belonged to is gone or finished
                latest.unlink(missing_ok=True)
        self._start()

    def _start(self) -> None:
        context, spec = self.context, self.spec
        if self.tracker is None:
            self.tracker = tracking.start_child_run(
                context.tracking_uri, context.experiment_id, context.parent_run_id, spec.label, self.tags, tracking.child_params(spec)
            )
        if self._claim is not None:  # nobody else trains this key: its earlier unfinished runs are over
            tracking.supersede_attempts(context.tracking_uri, context.experiment_id, spec.run_key, self.tracker.run_id, self.claims_id)
        self.tracker.log_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True), "config.json")
        if tracking.code_version()["git_dirty"] == "true":
            self.tracker.log_text(tracking.git_diff(), "git_diff.patch")

    def announce(self, batch_seeds: list[int]) -> None:
        """Tell the parent that training starts; a batched run records the seeds it trains with."""
        where = self.context.where
        if len(batch_seeds) > 1:
            self.tracker.set_tags({"batch_seeds": " ".join(map(str, batch_seeds)), "seeds_in_process": len(batch_seeds)})
            where = f"{where}, {len(batch_seeds)} seeds batched" if where else f"{len(batch_seeds)} seeds batched"
        _send(self.context.messages, ("started", self.spec.run_key, self.tracker.run_id, self.resumes_from, where))

    def job(self) -> Any:
        from benchmark.training import train

        messages, run_key = self.context.messages, self.spec.run_key

        def progress(step: int, total: int, last_eval: float | None) -> None:
            _send(messages, ("progress", run_key, step, total, last_eval))

        return train.SeedJob(self.training_spec, self.tracker, progress, self.payload, {"run_id": self.tracker.run_id})

    def start_over(self, error: BaseException) -> None:
        """Close the attempt whose checkpoint could not be restored, keep the file aside, start a new run."""
        assert self.latest is not None
        self.tracker.fail(error)  # (the new run links it as superseded)
        bad = self.latest.with_suffix(".pt.bad")
        self.latest.replace(bad)
        _send(self.context.messages, ("note", self.spec.run_key, f"{error}; kept as {bad}; {self.spec.label} starts over in a new MLflow run"))
        self.tracker, self.payload = None, None
        self._start()

    def close(self, result: Any) -> dict[str, Any]:
        """Record a finished run's results (or the exception that ended it) and close its MLflow run."""
        from benchmark.training import train

        if isinstance(result, BaseException):
            status = "KILLED" if isinstance(result, (KeyboardInterrupt, train.Preempted)) else "FAILED"
            self.tracker.fail(result, status)
            error = "the disk is full" if stores.is_disk_full(result) else f"{type(result).__name__}: {result}"
            return {"run_key": self.spec.run_key, "run_id": self.tracker.run_id, "status": status, "error": error}
        try:
            final = result.evaluations[-1]
            self.tracker.set_tags({"device": result.device})
            self.tracker.log_metrics(
                {
                    "final/eval_return_mean": final.mean,
                    "final/eval_return_std": final.std,
                    "final/steps_per_second": result.steps_per_second,
                    "final/wall_seconds": result.wall_seconds,
                },
                final.step,
            )
            self.tracker.log_text(json.dumps([dataclasses.asdict(evaluation) for evaluation in result.evaluations]), "evaluations.json")
            self.tracker.finish("FINISHED")
        except Exception as error:  # noqa: BLE001 - the store refused the results: the run failed
            return self.close(error)
        if self.latest is not None:  # only now: a kill before this point resumes the run
            self.latest.unlink(missing_ok=True)
        return {
            "run_key": self.spec.run_key,
            "run_id": self.tracker.run_id,
            "status": "FINISHED",
            "final_return_mean": final.mean,
            "final_return_std": final.std,
            "final_train_return": final.train_return_mean,
            "steps_per_second": result.steps_per_second,
            "device": result.device,
            "resumed_from": self.payload["loop"]["step"] if self.payload else None,
        }


def _batches_by_step(children: list[_ChildRun]) -> list[list[_ChildRun]]:
    """The seeds that train together: one batch per step they resume from (0: from scratch)."""
    steps: dict[int, list[_ChildRun]] = {}
    for child in children:
        steps.setdefault(child.resumes_from, []).append(child)
    return [steps[step] for step in sorted(steps)]


def _train_batch(batch: list[_ChildRun], context: _WorkerContext) -> list[Any]:
    """Train one run alone (``train.run``), or several as one batched model; each run's result
    or the exception that ended it."""
    from benchmark.training import train

    checkpoint_dir = Path(context.checkpoint_dir) if context.checkpoint_dir else None
    seeds = [child.spec.seed for child in batch]
    for child in batch:
        child.announce(seeds)
    jobs = [child.job() for child in batch]
    if len(jobs) > 1:
        return train.run_seeds(jobs, checkpoint_dir, remove_latest_on_finish=False)
    job = jobs[0]
    try:
        return [train.run(job.spec, job.tracker, job.progress, checkpoint_dir, job.resume, job.checkpoint_metadata, remove_latest_on_finish=False)]
    except Exception as error:  # noqa: BLE001 - the run's outcome
        return [error]


def _reopen(latest: Path, context: _WorkerContext, tags: dict[str, Any], spec: RunSpec) -> tuple[Any, dict[str, Any] | None]:
    """The reopened MLflow run and the checkpoint to resume from, or (None, None) when the
    checkpoint cannot be read (it is kept aside as ``latest.pt.bad``) or its run is gone."""
    from benchmark.training import checkpoint

    try:
        payload = checkpoint.load(latest)
        step, run_id, exact = int(payload["loop"]["step"]), payload["metadata"].get("run_id"), bool(payload.get("exact"))
    except Exception as error:  # noqa: BLE001 - any unreadable file: say so and start over
        bad = latest.with_suffix(".pt.bad")
        latest.replace(bad)
        _send(context.messages, ("note", spec.run_key, f"cannot read the checkpoint of {spec.label} ({type(error).__name__}: {error}); "
                                                      f"kept as {bad}; the run starts over"))
        return None, None
    tracker = tracking.resume_child_run(
        context.tracking_uri, run_id, context.parent_run_id, {**tags, "resumed_exactly": str(exact).lower()}, step,
        experiment_id=context.experiment_id,
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
    wait_for_others: bool = True,
    bundled: dict[str, Any] | None = None,
) -> Execution:
    """Run every spec under one MLflow parent run; the parent is FAILED if any child fails.

    A spec whose run key already has a FINISHED child run in the suite's experiment is not
    trained again (unless ``force``): its outcome is read from that run, so re-launching a
    half-done suite trains only what is missing, and a run with a checkpoint resumes from it.
    The parent run is tagged ``relaunch_of`` the suite's previous invocation, if there was one.
    A run key that a result bundle holds (``bundled``: run key -> ``bundles.BundledRun``) counts
    as finished too, unless ``force``: a grid split over machines goes on where a bundle ends.

    Launches that share the results directory share the work: a run key is trained by one live
    process at a time (``benchmark.execution.claims``). Keys another launch is training are left to it;
    with ``wait_for_others`` this launch waits for them and reports what that launch recorded
    (or trains them itself when that launch ends without finishing them); without, their
    outcome is CLAIMED. Suite invocations left RUNNING by a process that died are marked KILLED.

    ``executor``: 'local' (a process pool on this machine, one process per GPU run) or 'ray'
    (one Ray task per run, on the cluster at ``ray_address`` or a local Ray instance). Runs go
    to the GPU slots that the specs' device and ``runs_per_gpu`` give (see benchmark.execution.devices),
    at most ``workers`` CPU runs at once. Specs with ``seeds_in_process`` N > 1 that differ only
    by seed take one process (task, slot) per N of them: see ``plan_processes``.
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; use {' or '.join(EXECUTORS)}")
    console = console or Console(stderr=True)
    requested = _requested_device(specs)
    # (Ray plans its slots from the cluster's GPUs once it is connected)
    slots = local_slots(specs, workers, runs_per_gpu) if executor == "local" else []
    claims_dir = claims.directory(results_dir)
    experiment = tracking.experiment_id(tracking_uri, suite_name, results_dir / "mlartifacts")
    claims_id = claims.directory_id(claims_dir)
    with claims.Invocation(claims_dir, uuid.uuid4().hex) as invocation:
        for closed in close_dead_invocations(tracking_uri, experiment, claims_dir):
            console.print(f"an earlier invocation (parent run {closed}) ended without closing its run: marked KILLED")
        finished = {} if force else tracking.finished_child_runs(tracking_uri, suite_name, {spec.run_key for spec in specs})
        previous = tracking.latest_parent_run_id(tracking_uri, suite_name)
        tags = {"suite": suite_name, "kind": "suite", "invocation": invocation.id, tracking.CLAIMS_TAG: claims_id,
                **({"relaunch_of": previous} if previous else {})}
        parent = tracking.start_parent_run(tracking_uri, experiment, f"{suite_name}-{time.strftime('%Y%m%d-%H%M%S')}", tags)
        started_ms = int(time.time() * 1000)
        held = {} if force else {spec.run_key: bundled[spec.run_key] for spec in specs
                                 if spec.run_key in (bundled or {}) and spec.run_key not in finished}
        to_run = [spec for spec in specs if spec.run_key not in finished and spec.run_key not in held]
        execution = Execution(parent.run_id, experiment, finished_before=len(specs) - len(to_run))
        try:
            parent.log_params({
                "suite": suite_name, "num_runs": len(specs), "workers": workers, "runs_skipped": len(specs) - len(to_run),
                "force": force, "executor": executor, "device": requested, "runs_per_gpu": runs_per_gpu,
                "seeds_in_process": max((spec.seeds_in_process for spec in to_run), default=1),
            })
            if len(finished):
                console.print(
                    f"{len(finished)} of {len(specs)} runs already finished in the tracking store: not run again "
                    "(--force reruns them)"
                )
            if held:
                origins = sorted({run.origin for run in held.values()})
                console.print(
                    f"{len(held)} of {len(specs)} runs are held by result bundle(s) {', '.join(origins)}: not run again "
                    "(--force trains them here, --no-published ignores the published bundle)", highlight=False, soft_wrap=True,
                )
            groups, notices = plan_processes(to_run)
            for notice in notices:
                console.print(notice, highlight=False, soft_wrap=True)
            if len(groups) < len(to_run):
                console.print(f"{len(to_run)} runs to train in {len(groups)} processes (seeds of one configuration batched)")
            resumable = [spec for spec in to_run if _has_resumable_checkpoint(results_dir, spec)]
            if resumable and not force:
                console.print(f"{len(resumable)} of {len(to_run)} runs to train have a checkpoint: they resume from it in their MLflow run")

            def train(free: list[RunSpec], board: Board) -> list[RunOutcome]:
                groups, _ = plan_processes(free)
                job = _Job(
                    groups, tracking_uri, experiment, parent.run_id, str((results_dir / "checkpoints").resolve()), not force,
                    str(claims_dir.resolve()), started_ms if force else 0,
                )
                if executor == "ray":
                    return _execute_on_ray(job, requested, runs_per_gpu, workers, board, ray_address)
                return _execute_in_pool(job, slots[: len(groups)], board)

            trained = {}
            if to_run:
                board = Board(
                    {spec.run_key: spec.budget.total_steps for spec in to_run},
                    console,
                    groups={spec.run_key: f"{spec.algo}/{spec.env_id}" for spec in to_run},
                    live=live,
                )
                with board:
                    shared = _SharedWork(tracking_uri, experiment, claims_dir, started_ms if force else 0, board, console)
                    trained = shared.train_all(to_run, train, wait_for_others)
            outcomes = [
                trained.get(spec.run_key)
                or (_outcome_of_finished(spec, finished[spec.run_key]) if spec.run_key in finished else _outcome_of_bundled(spec, held[spec.run_key]))
                for spec in specs
            ]
            execution.outcomes = outcomes
            parent.log_metrics(
                {"runs_finished": sum(o.ok for o in outcomes), "runs_failed": sum(not o.ok and o.status != "CLAIMED" for o in outcomes),
                 "runs_elsewhere": sum(o.status == "CLAIMED" for o in outcomes)}, 0
            )
            parent.finish("FINISHED" if all(o.ok or o.status == "CLAIMED" for o in outcomes) else "FAILED")
        except BaseException as error:
            try:
                parent.fail(error)
            except Exception:  # noqa: BLE001 - the store itself failed (a full disk, say): the first error is the one to tell
                pass
            raise
    try:  # a launch that died while this one ran (best effort: this launch's own result is recorded)
        close_dead_invocations(tracking_uri, experiment, claims_dir)
    except Exception:  # noqa: BLE001
        pass
    return execution


class _SharedWork:
    """Training a list of specs when other launches may be training some of them.

    A run key that another live process holds is left to it; ``train_all`` then waits (with
    ``wait``) until its claim is released and takes the outcome that launch recorded: FINISHED
    or FAILED; a run it left unfinished (killed, or dead) is trained here, resuming from its
    checkpoint."""

    POLL_SECONDS = 2.0

    def __init__(self, tracking_uri: str, experiment: str, claims_dir: Path, finished_since_ms: int, board: Board, console: Console):
        self.tracking_uri, self.experiment, self.claims_dir = tracking_uri, experiment, claims_dir
        self.finished_since_ms, self.board, self.console = finished_since_ms, board, console

    def train_all(self, specs: list[RunSpec], train: Any, wait_for_others: bool) -> dict[str, RunOutcome]:
        outcomes: dict[str, RunOutcome] = {}
        elsewhere: dict[str, str] = {}
        for spec in specs:
            holder = claims.holder(self.claims_dir, spec.run_key)
            if holder is not None:
                elsewhere[spec.run_key] = holder.describe()
                self.board.elsewhere(spec.run_key, spec.label, elsewhere[spec.run_key])
        if elsewhere:
            holders = sorted(set(elsewhere.values()))
            self.console.print(
                f"{len(elsewhere)} of {len(specs)} runs are being trained by another launch ({'; '.join(holders[:3])}"
                + (f"; and {len(holders) - 3} more" if len(holders) > 3 else "") + "): "
                + ("this one trains the others, then waits for them" if wait_for_others else "left to it (--no-wait)"),
                highlight=False, soft_wrap=True, markup=False,
            )
        pending = list(specs)
        while pending:
            free = [spec for spec in pending if spec.run_key not in elsewhere]
            if free:
                for outcome in train(free, self.board):
                    if outcome.status == "CLAIMED":
                        elsewhere[outcome.spec.run_key] = outcome.claimed_by or "another launch"
                    else:
                        outcomes[outcome.spec.run_key] = outcome
            pending = [spec for spec in pending if spec.run_key in elsewhere]
            if not pending:
                break
            if not wait_for_others:
                for spec in pending:
                    outcomes[spec.run_key] = RunOutcome(spec, status="CLAIMED", claimed_by=elsewhere[spec.run_key],
                                                        error=f"being trained by another launch ({elsewhere[spec.run_key]})")
                break
            for spec in self._released(pending):
                del elsewhere[spec.run_key]
                outcome = self._recorded_outcome(spec)
                if outcome is not None:
                    outcomes[spec.run_key] = outcome
                    self.board.finished(spec.run_key, spec.label, outcome.ok, outcome_line(outcome))
            pending = [spec for spec in pending if spec.run_key not in outcomes]
        return outcomes

    def _released(self, pending: list[RunSpec]) -> list[RunSpec]:
        """Block until at least one of ``pending`` is no longer claimed; those specs."""
        while True:
            released = [spec for spec in pending if claims.holder(self.claims_dir, spec.run_key) is None]
            if released:
                return released
            deadline = time.monotonic() + self.POLL_SECONDS
            while time.monotonic() < deadline:
                self.board.refresh()
                time.sleep(0.5)

    def _recorded_outcome(self, spec: RunSpec) -> RunOutcome | None:
        """What the launch that held ``spec`` recorded: its FINISHED run, or its FAILED one; None
        when it left the run unfinished (then this launch trains it)."""
        finished = tracking.finished_child_runs(
            self.tracking_uri, None, {spec.run_key}, experiment_id=self.experiment, started_since_ms=self.finished_since_ms
        )
        if spec.run_key in finished:
            return _outcome_of_finished(spec, finished[spec.run_key])
        latest = tracking.latest_child_run(self.tracking_uri, self.experiment, spec.run_key)
        if latest is not None and latest.info.status == "FAILED" and (latest.info.end_time or 0) >= self.board.started_ms:
            error = latest.data.tags.get("error", "failed")
            return RunOutcome(spec, run_id=latest.info.run_id, status="FAILED", error=f"in another launch: {error}")
        return None


def close_dead_invocations(tracking_uri: str, experiment_id: str, claims_dir: Path) -> list[str]:
    """Mark KILLED every suite invocation (parent run) of the experiment still RUNNING whose launch
    has ended, with those of its child runs still RUNNING that nobody trains now (their key's
    claim is free): a launch killed as a whole (kill -9 of its process group, a lost machine)
    leaves them so. A launch of this claims directory is judged by its invocation lock, one of a
    version without claims by its host and pid, and one of another results directory sharing the
    store not at all. Returns the parent runs closed."""
    claims_id = claims.directory_id(claims_dir)
    closed = []
    for run in tracking.running_parent_runs(tracking_uri, experiment_id):
        tags = run.data.tags
        if tracking.CLAIMS_TAG in tags:
            if tags[tracking.CLAIMS_TAG] != claims_id or claims.invocation_alive(claims_dir, tags.get("invocation", "")):
                continue
        elif not tracking.process_gone(tags):
            continue
        # (read after the liveness test: a launch finishes its parent run before it gives up its lock)
        if tracking.run_status(tracking_uri, run.info.run_id) != "RUNNING":
            continue
        for child in tracking.running_children(tracking_uri, experiment_id, run.info.run_id):
            key = child.data.tags.get("run_key", "")
            if tracking.judged_by(child.data.tags, claims_id) and claims.holder(claims_dir, key) is None:
                tracking.close_run(tracking_uri, child.info.run_id, "KILLED", "its launch ended without closing it")
        tracking.close_run(tracking_uri, run.info.run_id, "KILLED", "its process ended without closing the run")
        closed.append(run.info.run_id)
    return closed


def local_slots(specs: list[RunSpec], workers: int, runs_per_gpu: int | None) -> list[devices.Slot]:
    """The local executor's device slots for ``specs``; ConfigError when their device cannot be had here."""
    requested = _requested_device(specs)
    return devices.plan_slots(
        requested, devices.visible_gpus(devices.gpu_count()) if requested != "cpu" else [], runs_per_gpu, workers
    )


def _requested_device(specs: list[RunSpec]) -> str:
    requested = {spec.device for spec in specs}
    if len(requested) > 1:
        raise ConfigError(f"the runs of one invocation must share a device; got {sorted(requested)} (use --device)")
    return requested.pop() if requested else "cpu"


def plan_processes(specs: list[RunSpec]) -> tuple[list[list[RunSpec]], list[str]]:
    """The specs in process groups, in suite order: specs that differ only by seed and ask for
    ``seeds_in_process`` N > 1 go N at a time (trained as one batched model); every other spec
    alone. Also one notice per configuration that asked for batching but cannot have it (its
    seeds then train one per process)."""
    from benchmark.training import train

    groups: list[list[RunSpec]] = []
    filling: dict[str, list[RunSpec]] = {}
    reasons: dict[str, str | None] = {}
    notices: list[str] = []
    for spec in specs:
        if spec.seeds_in_process > 1:
            key = train.batch_key(spec)
            if key not in reasons:
                reasons[key] = train.batchable(spec)
                if reasons[key]:
                    notices.append(f"{spec.algo} on {spec.env_id}: one seed per process ({reasons[key]})")
            if reasons[key] is None:
                group = filling.get(key)
                if group is None or len(group) >= spec.seeds_in_process:
                    group = filling[key] = []
                    groups.append(group)
                group.append(spec)
                continue
        groups.append([spec])
    return groups, notices


@dataclass
class _Job:
    """What every process group of one invocation shares."""

    groups: list[list[RunSpec]]
    tracking_uri: str
    experiment: str
    parent_run_id: str
    checkpoint_dir: str
    resume: bool
    claims_dir: str | None = None
    finished_since_ms: int = 0
    command: str = field(default_factory=tracking.command_line)

    @property
    def specs(self) -> list[RunSpec]:
        return [spec for group in self.groups for spec in group]

    def arguments(self, group: list[RunSpec], messages: Any) -> tuple[Any, ...]:
        return ([spec.to_dict() for spec in group], self.tracking_uri, self.experiment, self.parent_run_id, self.checkpoint_dir,
                messages, self.command, self.resume, self.claims_dir, self.finished_since_ms)


def _has_resumable_checkpoint(results_dir: Path, spec: RunSpec) -> bool:
    from benchmark.training import checkpoint

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
        final_train_return=metrics.get(TRAIN_RETURN_METRIC),
    )


def _outcome_of_bundled(spec: RunSpec, run: Any) -> RunOutcome:
    return RunOutcome(spec, run_id=run.mlflow_run_id, status="FINISHED", final_return_mean=run.final_return,
                      final_return_std=run.final_return_std, steps_per_second=run.steps_per_second, device=run.device,
                      skipped=True, source=run.origin, final_train_return=run.curve[-1].train_return_mean if run.curve else None)


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


def run_in_slot(slots: Any, stopping: Any, *arguments: Any) -> list[dict[str, Any]]:
    """A local-pool task: take a free device slot, make it the only visible device, train a
    process group, give the slot back. There are as many workers as slots, so one is always
    free. Once the invocation is stopping (Ctrl-C), a task that had not started yet does not start."""
    if stopping.is_set():
        return [{"status": "KILLED", "error": "not started: the invocation was interrupted"} for _ in arguments[0]]
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
        futures: dict[Future, list[RunSpec]] = {
            pool.submit(run_in_slot, free_slots, stopping, *job.arguments(group, messages)): group for group in job.groups
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(messages, outcomes, board)
            for future in done:
                _record_group(_result_of(future, len(futures[future])), futures[future], outcomes, board)
            board.refresh()
        pool.shutdown(wait=True)
    except KeyboardInterrupt:
        board.log("interrupted: stopping workers (each running run writes its checkpoint first)")
        stopping.set()
        _stop_workers(pool)
        close_unfinished_children(job.tracking_uri, job.parent_run_id, "KILLED", "interrupted by the user", job.claims_dir)
        raise
    finally:
        manager.shutdown()
    close_unfinished_children(job.tracking_uri, job.parent_run_id, "FAILED", "worker exited without reporting", job.claims_dir)
    return [outcomes[spec.run_key] for spec in job.specs]


def _result_of(future: Future, runs: int) -> list[dict[str, Any]]:
    try:
        return future.result()
    except Exception as error:  # the worker process died, or could not even start the runs
        return [{"status": "FAILED", "error": f"{type(error).__name__}: {error}"} for _ in range(runs)]


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
    """One Ray task per process group (a run, or seeds batched). Without ``address`` a local Ray instance is started with
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
        references = {task.remote(*job.arguments(group, messages), gpu_share > 0): group for group in job.groups}
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
                    group = references[reference]
                    try:
                        data = ray.get(reference)
                    except Exception as error:  # the task's process died
                        data = [{"status": "FAILED", "error": f"{type(error).__name__}: {error}"} for _ in group]
                    _record_group(data, group, outcomes, board)
                board.refresh()
        except KeyboardInterrupt:
            # a cancelled task stops where it is: it resumes later from its last periodic checkpoint
            board.log("interrupted: cancelling Ray tasks")
            for reference in references:
                ray.cancel(reference, force=False)
            ray.wait(list(references), num_returns=len(references), timeout=30)
            close_unfinished_children(job.tracking_uri, job.parent_run_id, "KILLED", "interrupted by the user", job.claims_dir)
            raise
        finally:
            messages.shutdown()
    finally:
        if started_here:
            ray.shutdown()
    close_unfinished_children(job.tracking_uri, job.parent_run_id, "FAILED", "Ray task exited without reporting", job.claims_dir)
    return [outcomes[spec.run_key] for spec in job.specs]


def _run_on_ray(*arguments: Any) -> list[dict[str, Any]]:
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


def _record_group(results: list[dict[str, Any]], group: list[RunSpec], outcomes: dict[str, RunOutcome], board: Board) -> None:
    for data, spec in zip(results, group, strict=True):
        _record(data, spec, outcomes, board)


def _record(data: dict[str, Any], spec: RunSpec, outcomes: dict[str, RunOutcome], board: Board) -> None:
    outcome = outcomes[spec.run_key]
    outcome.run_id = data.get("run_id", outcome.run_id)
    outcome.status = data["status"]
    outcome.error = data.get("error")
    outcome.final_return_mean = data.get("final_return_mean")
    outcome.final_return_std = data.get("final_return_std")
    outcome.final_train_return = data.get("final_train_return")
    outcome.steps_per_second = data.get("steps_per_second")
    outcome.device = data.get("device")
    outcome.skipped = bool(data.get("skipped"))
    outcome.claimed_by = data.get("claimed_by")
    if outcome.status == "CLAIMED":
        board.elsewhere(spec.run_key, spec.label, outcome.claimed_by or "another launch")
        return
    board.finished(spec.run_key, spec.label, outcome.ok, outcome_line(outcome))


def outcome_line(outcome: RunOutcome) -> str:
    """How the board reports a run's end."""
    label = outcome.spec.label
    if not outcome.ok:
        return f"{outcome.status} {label}: {outcome.error}"
    speed = f", {outcome.steps_per_second:,.0f} steps/s" if outcome.steps_per_second is not None else ""
    final = f"final eval {outcome.final_return_mean:.1f}" if outcome.final_return_mean is not None else "no final evaluation"
    return f"finished {label}{' by another launch' if outcome.skipped else ''}: {final}{speed}"


def close_unfinished_children(
    tracking_uri: str, parent_run_id: str, status: str, message: str, claims_dir: str | None = None
) -> list[str]:
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
