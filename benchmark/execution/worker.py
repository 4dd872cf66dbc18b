"""What runs inside a worker process, whatever the executor: train one process group (a run,
or seeds batched) with one MLflow child run per spec, and return one ``RunRecord`` per spec.

    for each spec of the group:
        claim its run key (one live process per key); skip it when another process holds it
        or it finished meanwhile
        reopen its MLflow run and checkpoint to resume, or start a new child run
    train the group (seeds resumed at different steps: one batch per step)
    record each run's final evaluation in its MLflow run, close it, release the claim

Executors call ``train_group`` in their workers (a pool process, a Ray task, a Slurm job);
progress goes to the launch as ``messages`` (``benchmark.execution.messages``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmark import metric_names, provenance, tracking
from benchmark.config import RunSpec
from benchmark.execution import claims, outcomes
from benchmark.execution.messages import Note, Progress, Sink, Started, send
from benchmark.run_record import RunRecord


@dataclass(frozen=True)
class Launch:
    """What every process group of one invocation shares (picklable: it travels to workers)."""

    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    checkpoint_dir: str | None
    resume: bool = True
    """Continue a run key's unfinished MLflow run from its ``latest.pt``; else start over."""
    claims_dir: str | None = None
    finished_since_ms: int = 0
    """With claims: a run key with a FINISHED run started at or after this time is not trained again."""
    command: str = field(default_factory=provenance.command_line)


def train_group(specs: list[RunSpec], launch: Launch, messages: Sink | None = None, device: str | None = None, where: str = "") -> list[RunRecord]:
    """Train a process group inside a worker: one spec, or specs that differ only by seed
    trained as one batched model (``benchmark.training.loop.run_seeds``); each spec logs to its own
    MLflow child run, exactly as if it had trained alone, and gets its own outcome. ``device``
    is the one this process trains on (its slot's), ``where`` how the board names it.

    With ``launch.claims_dir``, each run key is claimed first (``benchmark.execution.claims``) and held until its
    run is closed: a key another live process holds is not trained (outcome CLAIMED), and a key
    that got a FINISHED run meanwhile (with ``finished_since_ms``, as under ``--force``: a run that
    started at or after it, from scratch) is not trained again. Holding the claim, the worker knows that any RUNNING run of the key is an orphan of a
    process that died: it is closed as KILLED, linked to the run that replaces it.

    With ``launch.resume``, a ``latest.pt`` checkpoint of a run key whose MLflow run is unfinished is
    continued in that same run (seeds of a group resumed at different steps train as one batch
    per step); otherwise any such checkpoint is discarded and the run starts from scratch in a
    new child run.
    """
    import torch  # noqa: F401 - loaded before the tags are read, so that the GPU model is known

    from benchmark.training.control import deferred_stop

    with deferred_stop():  # a SIGTERM while runs are set up stops them at their first step, with a checkpoint
        return _train_group(specs, launch, messages, device, where)


def _train_group(specs: list[RunSpec], launch: Launch, messages: Sink | None, device: str | None, where: str) -> list[RunRecord]:
    from benchmark.training.control import ResumeError

    context = _WorkerContext(launch, messages, device, where)
    children = [_ChildRun(spec, context) for spec in specs]
    done: dict[str, RunRecord] = {}
    try:
        for child in children:
            settled = child.claim()
            if settled is None:
                child.open()
            else:
                done[child.spec.run_key] = settled
        pending = [child for child in children if child.spec.run_key not in done]
        while pending:
            restarted = []
            for batch in _batches_by_step(pending):
                for child, result in zip(batch, _train_batch(batch, context), strict=True):
                    if isinstance(result, ResumeError):  # the checkpoint does not fit this code: start over
                        child.start_over(result)
                        restarted.append(child)
                    else:
                        done[child.spec.run_key] = child.close(result)
            pending = restarted
    except BaseException as error:  # Ctrl-C, or the worker itself failing: every run still open ends with it
        for child in children:
            if child.spec.run_key in done:
                continue
            done[child.spec.run_key] = child.close(error) if child.tracker is not None else outcomes.failed(child.spec, error)
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
    finally:
        for child in children:
            child.release()
    return [done[child.spec.run_key] for child in children]


@dataclass
class _WorkerContext:
    """What every run of one worker task shares."""

    launch: Launch
    messages: Sink | None
    device: str | None
    where: str

    @property
    def claims_dir(self) -> Path | None:
        return Path(self.launch.claims_dir) if self.launch.claims_dir else None


class _ChildRun:
    """One spec inside a worker: its MLflow child run (new, or reopened to resume from its
    checkpoint), what training it needs, and its outcome."""

    def __init__(self, spec: RunSpec, context: _WorkerContext):
        from benchmark.training import checkpoint

        self.spec, self.context = spec, context
        # the device this process trains on (its slot's); config.json keeps the one the suite asked for
        self.training_spec = dataclasses.replace(spec, device=context.device) if context.device is not None else spec
        self.tags = {
            "run_key": spec.run_key,
            "suite": spec.suite,
            "algo": spec.algo,
            "env_id": spec.env_id,
            "seed": spec.seed,
            "command": context.launch.command,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
            **provenance.source_tags(context.launch.command),  # the launch's command, not this worker's (Ray's)
        }
        if spec.continued_from is not None:  # the run this one trains further (tags.run_key of its MLflow run)
            self.tags["continued_from"] = spec.continued_from
        self.claims_id = claims.directory_id(context.claims_dir) if context.claims_dir is not None else ""
        if self.claims_id:
            self.tags[tracking.CLAIMS_TAG] = self.claims_id
        run_dir = checkpoint.run_directory(Path(context.launch.checkpoint_dir), spec.run_key) if context.launch.checkpoint_dir else None
        self.latest = run_dir / checkpoint.LATEST if run_dir is not None else None
        self.tracker: Any = None
        self.payload: dict[str, Any] | None = None
        self._claim: claims.Claim | None = None

    def claim(self) -> RunRecord | None:
        """Take this run key's claim; the outcome when the run is not to be trained here (another
        live process holds the key, or it got a FINISHED run meanwhile), else None."""
        launch, claims_dir, key = self.context.launch, self.context.claims_dir, self.spec.run_key
        if claims_dir is None:
            return None
        self._claim = claims.take(claims_dir, key, claims.Holder.here(launch.parent_run_id, self.spec.label, self.spec.suite))
        if self._claim is None:
            holder = claims.holder(claims_dir, key)
            return RunRecord(self.spec, status="CLAIMED", claimed_by=holder.describe() if holder else "another launch")
        done = tracking.finished_child_runs(
            launch.tracking_uri, None, {key}, experiment_id=launch.experiment_id, started_since_ms=launch.finished_since_ms
        ).get(key)
        if done is None:
            return None
        if self.latest is not None:  # left by a process killed between finishing the run and removing it
            self.latest.unlink(missing_ok=True)
        self.release()
        return outcomes.of_finished(self.spec, done)

    def release(self) -> None:
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    @property
    def resumes_from(self) -> int:
        return int(self.payload["loop"]["step"]) if self.payload else 0

    @property
    def batch_position(self) -> tuple[str, int]:
        """Where it resumes, as the seeds of one batch share it: the step, or a meta-learner's
        epoch (its seeds' env steps differ within an epoch)."""
        if self.payload and self.payload.get("kind") == "meta":
            return ("epoch", int(self.payload["loop"]["epoch"]))
        return ("step", self.resumes_from)

    def open(self) -> None:
        """Reopen the run of a resumable checkpoint, or start a new child run."""
        from benchmark.training import fingerprint

        # the behaviour of the code that trains it, once per process and algorithm; unknown ('') leaves the tag out
        behaviour = fingerprint.recorded(self.spec.algo)
        if behaviour:
            self.tags[metric_names.FINGERPRINT_TAG] = behaviour
        latest = self.latest
        if latest is not None and latest.exists():
            if self.context.launch.resume:
                self.tracker, self.payload = _reopen(latest, self.context, self.tags, self.spec)
            if self.tracker is None:  # --force, or the run it belonged to is gone or finished
                latest.unlink(missing_ok=True)
        self._start()

    def _start(self) -> None:
        launch, spec = self.context.launch, self.spec
        if self.tracker is None:
            self.tracker = tracking.start_child_run(
                launch.tracking_uri, launch.experiment_id, launch.parent_run_id, spec.label, self.tags, tracking.child_params(spec)
            )
        if self._claim is not None:  # nobody else trains this key: its earlier unfinished runs are over
            tracking.supersede_attempts(launch.tracking_uri, launch.experiment_id, spec.run_key, self.tracker.run_id, self.claims_id)
        self.tracker.log_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True), "config.json")
        if provenance.code_version()["git_dirty"] == "true":
            self.tracker.log_text(provenance.git_diff(), "git_diff.patch")

    def announce(self, batch_seeds: list[int]) -> None:
        """Tell the parent that training starts; a batched run records the seeds it trains with."""
        where = self.context.where
        if len(batch_seeds) > 1:
            self.tracker.set_tags({"batch_seeds": " ".join(map(str, batch_seeds)), "seeds_per_process": len(batch_seeds)})
            where = f"{where}, {len(batch_seeds)} seeds batched" if where else f"{len(batch_seeds)} seeds batched"
        send(self.context.messages, Started(self.spec.run_key, self.tracker.run_id, self.resumes_from, where))

    def job(self) -> Any:
        from benchmark.training import loop as training_loop

        messages, run_key = self.context.messages, self.spec.run_key

        def progress(step: int, total: int, last_eval: float | None) -> None:
            send(messages, Progress(run_key, step, total, last_eval))

        return training_loop.SeedJob(self.training_spec, self.tracker, progress, self.payload, {"run_id": self.tracker.run_id})

    def start_over(self, error: BaseException) -> None:
        """Close the attempt whose checkpoint could not be restored, keep the file aside, start a new run."""
        assert self.latest is not None
        self.tracker.fail(error)  # (the new run links it as superseded)
        bad = self.latest.with_suffix(".pt.bad")
        self.latest.replace(bad)
        send(self.context.messages, Note(self.spec.run_key, f"{error}; kept as {bad}; {self.spec.label} starts over in a new MLflow run"))
        self.tracker, self.payload = None, None
        self._start()

    def close(self, result: Any) -> RunRecord:
        """Record a finished run's results (or the exception that ended it) and close its MLflow run."""
        from benchmark.training.control import Preempted

        if isinstance(result, BaseException):
            status = "KILLED" if isinstance(result, (KeyboardInterrupt, SystemExit, Preempted)) else "FAILED"
            self.tracker.fail(result, status)
            return RunRecord(self.spec, status, self.tracker.run_id, error=outcomes.error_text(result))
        try:
            final = result.evaluations[-1]
            self.tracker.set_tags({"device": result.device})
            self.tracker.log_metrics(
                {
                    metric_names.FINAL_RETURN_MEAN: final.mean,
                    metric_names.FINAL_RETURN_STD: final.std,
                    metric_names.FINAL_STEPS_PER_SECOND: result.steps_per_second,
                    metric_names.FINAL_WALL_SECONDS: result.wall_seconds,
                    **({metric_names.FINAL_CPU_SECONDS: result.cpu_seconds} if outcomes.process_cpu_known(self.spec, result.cpu_seconds) else {}),
                    **(
                        {metric_names.FINAL_TRAIN_RETURN_LAST100: result.train_last100[0], metric_names.FINAL_TRAIN_EPISODES_LAST100: result.train_last100[1]}
                        if result.train_last100
                        else {}
                    ),
                },
                final.step,
            )
            self.tracker.log_text(json.dumps([dataclasses.asdict(evaluation) for evaluation in result.evaluations]), "evaluations.json")
            self.tracker.finish("FINISHED")
        except Exception as error:  # noqa: BLE001 - the store refused the results: the run failed
            return self.close(error)
        if self.latest is not None:  # only now: a kill before this point resumes the run
            self.latest.unlink(missing_ok=True)
        return outcomes.trained(self.spec, self.tracker.run_id, result)


def _batches_by_step(children: list[_ChildRun]) -> list[list[_ChildRun]]:
    """The seeds that train together: one batch per step (a meta-learner's: epoch) they
    resume from (0: from scratch)."""
    positions: dict[tuple[str, int], list[_ChildRun]] = {}
    for child in children:
        positions.setdefault(child.batch_position, []).append(child)
    return [positions[position] for position in sorted(positions)]


def _train_batch(batch: list[_ChildRun], context: _WorkerContext) -> list[Any]:
    """Train one run alone (``loop.run``), or several as one batched model; each run's result
    or the exception that ended it."""
    from benchmark.training import loop as training_loop

    checkpoint_dir = Path(context.launch.checkpoint_dir) if context.launch.checkpoint_dir else None
    seeds = [child.spec.seed for child in batch]
    for child in batch:
        child.announce(seeds)
    jobs = [child.job() for child in batch]
    if len(jobs) > 1:
        return training_loop.run_seeds(jobs, checkpoint_dir, remove_latest_on_finish=False)
    job = jobs[0]
    try:
        return [training_loop.run(job.spec, job.tracker, job.progress, checkpoint_dir, job.resume, job.checkpoint_metadata, remove_latest_on_finish=False)]
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
        send(
            context.messages,
            Note(spec.run_key, f"cannot read the checkpoint of {spec.label} ({type(error).__name__}: {error}); kept as {bad}; the run starts over"),
        )
        return None, None
    launch = context.launch
    tracker = tracking.resume_child_run(
        launch.tracking_uri,
        run_id,
        launch.parent_run_id,
        {**tags, "resumed_exactly": str(exact).lower()},
        step,
        experiment_id=launch.experiment_id,
    )
    return (tracker, payload) if tracker is not None else (None, None)
