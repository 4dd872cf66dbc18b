"""The one record of a run's result (status, final evaluation, speed, device, run id, error),
from the worker that trains it to the end-of-run table, reports, regression checks and bundles."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmark.bundles import BundledRun
from benchmark.config import RunSpec


@dataclass
class RunRecord:
    """One run's result, wherever it was read: made by the worker that trained it, read back
    from the tracking store, or from a result bundle."""

    spec: RunSpec
    status: str = "MISSING"  # FINISHED | RUNNING | FAILED | KILLED | CLAIMED (another live launch trains it) | MISSING
    run_id: str | None = None
    final_return: float | None = None
    """Mean return of the final deterministic evaluation (finished runs only)."""
    final_return_std: float | None = None
    steps_per_second: float | None = None
    """Env steps per second of training (evaluation time excluded)."""
    device: str | None = None
    wall_seconds: float | None = None
    curve: list[tuple[int, float]] = field(default_factory=list)
    """(env steps, mean evaluation return) of every evaluation logged so far."""
    error: str | None = None
    git_sha: str | None = None
    attempts: int = 0
    """MLflow runs with this run key (re-launches included)."""
    latest_status: str | None = None
    """Status of the most recent attempt, when it is not the one reported (a newer re-launch
    that failed or is still going, say)."""
    pre_adaptation_return: float | None = None
    """Meta-RL runs: the final meta-test's return before adaptation (final_return is after)."""
    source: str = ""
    """Where the result comes from: '' for the tracking store, else the bundle's directory."""
    final_train_return: float | None = None
    """Mean return of the training episodes of the last evaluation interval (finished runs):
    compared with sources that report training returns."""

    train_last100: tuple[float, int] | None = None
    """(mean return, episodes) of the run's last 100 training episodes, where recorded (CleanRL's score)."""
    train_intervals: list[tuple[int, float | None, int]] = field(default_factory=list)
    """(step, mean return, episodes) of the training episodes of each evaluation interval, where
    known: what ``train_last100`` is approximated from for runs that did not record it."""
    fingerprint: str = ""
    """The behaviour fingerprint of the code that trained the run ('' unknown)."""

    video_strip: str | None = None
    """The artifact path of the strip of its filmed episode (``evaluate --video``), where filmed."""
    experiment_id: str | None = None
    """The MLflow experiment the run is in (read from a tracking store; None from a bundle)."""

    skipped: bool = False
    """Not trained by the launch that reports it: finished earlier, by another launch, or bundled."""
    claimed_by: str | None = None
    """CLAIMED: who trains it (host, pid, since when)."""
    cpu_seconds: float | None = None
    """CPU seconds of the process that trained it (a batch's seeds share one), where recorded."""

    @property
    def ok(self) -> bool:
        return self.status == "FINISHED"

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED" and self.final_return is not None


def mark_unusable(record: RunRecord) -> None:
    """A FINISHED run without a finite final return cannot be scored: it counts as FAILED."""
    if record.status != "FINISHED":
        return
    if record.final_return is None:
        record.status, record.error = "FAILED", "finished without a final evaluation"
    elif not math.isfinite(record.final_return):
        record.status, record.error = "FAILED", f"final evaluation return is {record.final_return}"
        record.final_return = None


def from_bundle(spec: RunSpec, run: BundledRun) -> RunRecord:
    """The record of a bundled run (FINISHED by construction)."""
    record = RunRecord(
        spec,
        "FINISHED",
        run.mlflow_run_id,
        run.final_return,
        run.final_return_std,
        run.steps_per_second,
        run.device or None,
        run.wall_seconds,
        [(e.step, e.mean) for e in run.curve],
        git_sha=run.provenance.get("git_sha") or None,
        attempts=1,
        pre_adaptation_return=run.pre_adaptation_return,
        source=run.origin,
        final_train_return=run.curve[-1].train_return_mean if run.curve else None,
        train_last100=run.train_last100,
        train_intervals=[(e.step, e.train_return_mean, e.train_episodes) for e in run.curve],
        fingerprint=run.fingerprint,
        skipped=True,
        cpu_seconds=run.cpu_seconds,
    )
    mark_unusable(record)
    return record
