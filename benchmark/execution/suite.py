"""A suite's launch: which runs to train, then training them on an executor with live progress.

    close launches that died while RUNNING; read which run keys are finished (store, bundles)
    start the MLflow parent run of this invocation
    plan the runs left into process groups (seeds of one configuration batched)
    train them on the executor (local, ray, slurm), leaving keys another live launch holds
    to it (and waiting for them, or training them once it lets go)
    record the outcomes on the parent run; FAILED if any run failed

Launches that share a results directory share the work through claims
(``benchmark.execution.claims``): a run key is trained by one live process at a time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from agents.errors import ConfigError
from benchmark import run_record, tracking
from benchmark.config import RunSpec
from benchmark.execution import claims, devices, estimate, outcomes
from benchmark.execution.base import Executor, drive
from benchmark.execution.outcomes import Execution
from benchmark.execution.plan import plan_processes
from benchmark.execution.progress import Board
from benchmark.execution.worker import Launch
from benchmark.results_layout import ResultsDir
from benchmark.run_record import RunRecord
from benchmark.tables import plural
from benchmark.training import checkpoint_paths

EXECUTORS = ("local", "ray", "slurm")


def make_executor(
    name: str,
    specs: list[RunSpec],
    workers: int,
    results_dir: Path,
    runs_per_gpu: int | None = None,
    ray_address: str | None = None,
    slurm: Any = None,
    slurm_cluster: str = "slurm",
) -> Executor:
    """The executor called ``name`` for ``specs``; ConfigError when it cannot serve them here
    (a device this machine lacks, Ray or submitit not installed, bad Slurm options)."""
    if name == "local":
        from benchmark.execution.local import LocalExecutor

        return LocalExecutor(local_slots(specs, workers, runs_per_gpu))
    if name == "ray":
        from benchmark.execution.ray import RayExecutor

        return RayExecutor(requested_device(specs), workers, runs_per_gpu, ray_address)
    if name == "slurm":
        from benchmark.execution.slurm import SlurmExecutor, SlurmOptions

        return SlurmExecutor(
            results_dir.resolve() / "slurm",
            slurm or SlurmOptions(),
            requested_device(specs),
            slurm_cluster,
            max_jobs=workers if slurm_cluster == "local" else None,
        )
    raise ConfigError(f"unknown executor {name!r}; use {', '.join(EXECUTORS)}")


def execute(
    specs: list[RunSpec],
    *,
    suite_name: str,
    workers: int,
    tracking_uri: str,
    results_dir: Path,
    console: Console | None = None,
    force: bool = False,
    executor: Executor | None = None,
    live: bool | None = None,
    wait_for_others: bool = True,
    bundled: dict[str, Any] | None = None,
    estimated: dict[str, float] | None = None,
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

    ``executor`` (``make_executor``; default: the local pool with ``workers`` processes) trains
    the process groups. Specs with ``seeds_per_process`` N > 1 that differ only by seed take
    one process (task, slot, job) per N of them: see ``plan_processes``. ``estimated``: run key
    -> the plan's wall seconds for it (its process's), the live ETA's figure until runs of its
    work are measured.
    """
    console = console or Console(stderr=True)
    requested = requested_device(specs)
    executor = executor or make_executor("local", specs, workers, results_dir)
    claims_dir = claims.directory(results_dir)
    experiment = tracking.experiment_id(tracking_uri, suite_name, ResultsDir(results_dir).artifacts)
    claims_id = claims.directory_id(claims_dir)
    with claims.Invocation(claims_dir, uuid.uuid4().hex) as invocation:
        for closed in close_dead_invocations(tracking_uri, experiment, claims_dir):
            console.print(f"an earlier invocation (parent run {closed}) ended without closing its run: marked KILLED")
        finished = {} if force else tracking.finished_child_runs(tracking_uri, suite_name, {spec.run_key for spec in specs})
        previous = tracking.latest_parent_run_id(tracking_uri, suite_name)
        tags = {
            "suite": suite_name,
            "kind": "suite",
            "invocation": invocation.id,
            tracking.CLAIMS_TAG: claims_id,
            **({"relaunch_of": previous} if previous else {}),
        }
        held = (
            {} if force or not bundled else {spec.run_key: bundled[spec.run_key] for spec in specs if spec.run_key in bundled and spec.run_key not in finished}
        )
        to_run = [spec for spec in specs if spec.run_key not in finished and spec.run_key not in held]
        if not to_run:  # nothing to train: no parent run (an empty one would only clutter the MLflow UI)
            _say_skipped(console, finished, held, specs)
            console.print("nothing to train: no parent run started")
            records = [
                outcomes.of_finished(spec, finished[spec.run_key]) if spec.run_key in finished else run_record.from_bundle(spec, held[spec.run_key])
                for spec in specs
            ]
            return Execution("", experiment, records, finished_before=len(specs))
        parent = tracking.start_parent_run(tracking_uri, experiment, f"{suite_name}-{time.strftime('%Y%m%d-%H%M%S')}", tags)
        started_ms = int(time.time() * 1000)
        execution = Execution(parent.run_id, experiment, finished_before=len(specs) - len(to_run))
        try:
            parent.log_params(
                {
                    "suite": suite_name,
                    "num_runs": len(specs),
                    "workers": workers,
                    "runs_skipped": len(specs) - len(to_run),
                    "force": force,
                    "executor": executor.name,
                    "device": requested,
                    "seeds_per_process": max((spec.seeds_per_process for spec in to_run), default=1),
                }
            )
            _say_skipped(console, finished, held, specs)
            groups, notices = plan_processes(to_run)
            for notice in notices:
                console.print(notice, highlight=False, soft_wrap=True)
            if len(groups) < len(to_run):
                console.print(f"{len(to_run)} runs to train in {len(groups)} process{'es' if len(groups) != 1 else ''} (seeds of one configuration batched)")
            resumable = [spec for spec in to_run if _has_resumable_checkpoint(results_dir, spec)]
            if resumable and not force:
                console.print(f"{len(resumable)} of {len(to_run)} runs to train have a checkpoint: they resume from it in their MLflow run")

            launch = Launch(
                tracking_uri,
                experiment,
                parent.run_id,
                str(ResultsDir(results_dir).checkpoints.resolve()),
                resume=not force,
                claims_dir=str(claims_dir.resolve()),
                finished_since_ms=started_ms if force else 0,
            )

            def train(free: list[RunSpec], board: Board) -> list[RunRecord]:
                return drive(executor, plan_processes(free)[0], launch, board)

            trained = {}
            if to_run:
                board = Board(
                    {spec.run_key: spec.budget.total_steps for spec in to_run},
                    console,
                    groups={spec.run_key: estimate.keys_of(spec, spec.seeds_per_process, "").work for spec in to_run},
                    live=live,
                    estimated=estimated,
                    parallel=workers * max(spec.seeds_per_process for spec in to_run),
                )
                with board:
                    shared = _SharedWork(tracking_uri, experiment, claims_dir, started_ms if force else 0, board, console)
                    trained = shared.train_all(to_run, train, wait_for_others)
            records = [
                trained.get(spec.run_key)
                or (outcomes.of_finished(spec, finished[spec.run_key]) if spec.run_key in finished else run_record.from_bundle(spec, held[spec.run_key]))
                for spec in specs
            ]
            execution.records = records
            parent.log_metrics(  # launch/: the launch's own counts, apart from the runs' metrics in the UI's charts
                {
                    "launch/runs_finished": sum(o.ok for o in records),
                    "launch/runs_failed": sum(not o.ok and o.status != "CLAIMED" for o in records),
                    "launch/runs_elsewhere": sum(o.status == "CLAIMED" for o in records),
                },
                0,
            )
            parent.finish("FINISHED" if all(o.ok or o.status == "CLAIMED" for o in records) else "FAILED")
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


def _say_skipped(console: Any, finished: dict[str, Any], held: dict[str, Any], specs: list[RunSpec]) -> None:
    """The lines that say which runs a launch does not train, and why."""
    if finished:
        console.print(f"{len(finished)} of {len(specs)} runs already finished in the tracking store: not run again (--force reruns them)")
    if held:
        origins = sorted({run.origin for run in held.values()})
        console.print(
            f"{len(held)} of {len(specs)} runs are held by result {plural(len(origins), 'bundle')} {', '.join(origins)}: not run again "
            "(--force trains them here, --no-published ignores the published bundle)",
            highlight=False,
            soft_wrap=True,
        )


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

    def train_all(self, specs: list[RunSpec], train: Callable[[list[RunSpec], Board], list[RunRecord]], wait_for_others: bool) -> dict[str, RunRecord]:
        done: dict[str, RunRecord] = {}
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
                + (f"; and {len(holders) - 3} more" if len(holders) > 3 else "")
                + "): "
                + ("this one trains the others, then waits for them" if wait_for_others else "left to it (--no-wait)"),
                highlight=False,
                soft_wrap=True,
                markup=False,
            )
        pending = list(specs)
        while pending:
            free = [spec for spec in pending if spec.run_key not in elsewhere]
            if free:
                for outcome in train(free, self.board):
                    if outcome.status == "CLAIMED":
                        elsewhere[outcome.spec.run_key] = outcome.claimed_by or "another launch"
                    else:
                        done[outcome.spec.run_key] = outcome
            pending = [spec for spec in pending if spec.run_key in elsewhere]
            if not pending:
                break
            if not wait_for_others:
                for spec in pending:
                    done[spec.run_key] = RunRecord(
                        spec, status="CLAIMED", claimed_by=elsewhere[spec.run_key], error=f"being trained by another launch ({elsewhere[spec.run_key]})"
                    )
                break
            for spec in self._released(pending):
                del elsewhere[spec.run_key]
                recorded = self._recorded_outcome(spec)
                if recorded is not None:
                    done[spec.run_key] = recorded
                    self.board.finished(spec.run_key, spec.label, recorded.ok, outcomes.line(recorded))
            pending = [spec for spec in pending if spec.run_key not in done]
        return done

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

    def _recorded_outcome(self, spec: RunSpec) -> RunRecord | None:
        """What the launch that held ``spec`` recorded: its FINISHED run, or its FAILED one; None
        when it left the run unfinished (then this launch trains it)."""
        finished = tracking.finished_child_runs(self.tracking_uri, None, {spec.run_key}, experiment_id=self.experiment, started_since_ms=self.finished_since_ms)
        if spec.run_key in finished:
            return outcomes.of_finished(spec, finished[spec.run_key])
        latest = tracking.latest_child_run(self.tracking_uri, self.experiment, spec.run_key)
        if latest is not None and latest.info.status == "FAILED" and (latest.info.end_time or 0) >= self.board.started_ms:
            error = latest.data.tags.get("error", "failed")
            return RunRecord(spec, run_id=latest.info.run_id, status="FAILED", error=f"in another launch: {error}")
        return None


DYING_WORKERS_SECONDS = 3.0
"""How long the closing of a dead launch's runs waits, in all, for its workers' claims to be let go."""


def _claim_freed(claims_dir: Path, key: str, deadline: float) -> bool:
    """Whether nobody holds ``key``'s claim, waiting until ``deadline`` (a monotonic time) for
    a holder that is still exiting."""
    while claims.holder(claims_dir, key) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def close_dead_invocations(tracking_uri: str, experiment_id: str, claims_dir: Path) -> list[str]:
    """Mark KILLED every suite invocation (parent run) of the experiment still RUNNING whose launch
    has ended, with those of its child runs still RUNNING that nobody trains now (their key's
    claim is free): a launch killed as a whole (kill -9 of its process group, a lost machine)
    leaves them so. A launch of this claims directory is judged by its invocation lock, one of a
    version without claims by its host and pid, and one of another results directory sharing the
    store not at all. Returns the parent runs closed."""
    claims_id = claims.directory_id(claims_dir)
    closed = []
    # a launch killed as a whole a moment ago may still have workers exiting, their claims not
    # yet released: wait for them a little (the whole call), not for a live launch's
    grace = time.monotonic() + DYING_WORKERS_SECONDS
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
            if tracking.judged_by(child.data.tags, claims_id) and _claim_freed(claims_dir, key, grace):
                tracking.close_run(tracking_uri, child.info.run_id, "KILLED", "its launch ended without closing it")
        tracking.close_run(tracking_uri, run.info.run_id, "KILLED", "its process ended without closing the run")
        closed.append(run.info.run_id)
    return closed


def local_slots(specs: list[RunSpec], workers: int, runs_per_gpu: int | None) -> list[devices.Slot]:
    """The local executor's device slots for ``specs``; ConfigError when their device cannot be had here."""
    requested = requested_device(specs)
    return devices.plan_slots(requested, devices.visible_gpus(devices.gpu_count()) if requested != "cpu" else [], runs_per_gpu, workers)


def requested_device(specs: list[RunSpec]) -> str:
    """The one device the specs of an invocation ask for."""
    requested = {spec.device for spec in specs}
    if len(requested) > 1:
        raise ConfigError(f"the runs of one invocation must share a device; got {sorted(requested)} (use --device)")
    return requested.pop() if requested else "cpu"


def _has_resumable_checkpoint(results_dir: Path, spec: RunSpec) -> bool:
    return checkpoint_paths.latest(ResultsDir(results_dir).checkpoints, spec.run_key).exists()
