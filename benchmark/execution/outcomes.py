"""What became of each run of a launch: one ``RunRecord`` per spec (``benchmark.run_record``),
made by the worker that trained it, or read from the store or a bundle when nothing trained."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from benchmark import metric_names, provenance, stores
from benchmark.config import RunSpec
from benchmark.run_record import RunRecord, mark_unusable


@dataclass
class Execution:
    """One invocation: its MLflow parent run and every spec's record, in suite order."""

    parent_run_id: str
    experiment_id: str
    records: list[RunRecord] = field(default_factory=list)
    finished_before: int = 0
    """Runs an earlier invocation had finished (not trained again)."""


def failed(spec: RunSpec, error: BaseException | str, status: str = "FAILED") -> RunRecord:
    """The record of a spec whose worker failed (or never started: its MLflow run could not be
    created) before the run reported."""
    return RunRecord(spec, status=status, error=error if isinstance(error, str) else error_text(error))


def error_text(error: BaseException) -> str:
    """Why a run ended, in one line: 'the disk is full' whatever layer raised it (SQLite, torch,
    a write), else the exception's type and the end of its message (a worker's traceback text
    can be long)."""
    if stores.is_disk_full(error):
        return "the disk is full"
    return f"{type(error).__name__}: {str(error).strip()[-500:]}"


def process_cpu_known(spec: RunSpec, cpu_seconds: float) -> bool:
    """Whether a run's process CPU time is its cost: measured (finite) and not shared with
    worker processes elsewhere (a distributed run's collectors and gradient workers)."""
    return math.isfinite(cpu_seconds) and spec.distributed is None


def trained(spec: RunSpec, run_id: str, result: Any) -> RunRecord:
    """The record of a run this launch trained to the end (``result``: the loop's RunResult)."""
    final = result.evaluations[-1]
    record = RunRecord(
        spec,
        "FINISHED",
        run_id,
        final.mean,
        final.std,
        result.steps_per_second,
        result.device,
        result.wall_seconds,
        [(evaluation.step, evaluation.mean) for evaluation in result.evaluations],
        cpu_seconds=result.cpu_seconds if process_cpu_known(spec, result.cpu_seconds) else None,
        git_sha=provenance.code_version()["git_sha"],
        attempts=1,
        final_train_return=final.train_return_mean,
        train_last100=result.train_last100,
    )
    mark_unusable(record)
    return record


def of_finished(spec: RunSpec, run: Any) -> RunRecord:
    """The record of a FINISHED MLflow run of ``spec`` (trained by an earlier or another launch)."""
    metrics = run.data.metrics
    record = RunRecord(
        spec,
        run_id=run.info.run_id,
        status="FINISHED",
        final_return=metrics.get(metric_names.FINAL_RETURN_MEAN),
        final_return_std=metrics.get(metric_names.FINAL_RETURN_STD),
        steps_per_second=metrics.get(metric_names.FINAL_STEPS_PER_SECOND),
        wall_seconds=metrics.get(metric_names.FINAL_WALL_SECONDS),
        cpu_seconds=metrics.get(metric_names.FINAL_CPU_SECONDS),
        device=run.data.tags.get("device"),
        git_sha=run.data.tags.get("git_sha"),
        pre_adaptation_return=metrics.get(metric_names.PRE_ADAPTATION_RETURN),
        skipped=True,
        final_train_return=metrics.get(metric_names.TRAIN_RETURN),
        train_last100=train_last100(metrics),
        fingerprint=run.data.tags.get(metric_names.FINGERPRINT_TAG, ""),
    )
    mark_unusable(record)
    return record


def train_last100(metrics: dict[str, float]) -> tuple[float, int] | None:
    """(mean, episodes) of a finished run's last 100 training episodes, where it logged them."""
    mean, episodes = metrics.get(metric_names.FINAL_TRAIN_RETURN_LAST100), metrics.get(metric_names.FINAL_TRAIN_EPISODES_LAST100)
    return (float(mean), int(episodes)) if mean is not None and episodes else None


def line(record: RunRecord) -> str:
    """How the board reports a run's end."""
    label = record.spec.label
    if not record.ok:
        return f"{record.status} {label}: {record.error}"
    speed = f", {record.steps_per_second:,.0f} steps/s" if record.steps_per_second is not None else ""
    final = f"final eval {record.final_return:.1f}" if record.final_return is not None else "no final evaluation"
    return f"finished {label}{' by another launch' if record.skipped else ''}: {final}{speed}"
