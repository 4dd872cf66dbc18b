"""What became of each run of a launch, as the launch sees it: one ``RunOutcome`` per spec,
made by the worker that trained it (or read from the store or a bundle when nothing trained)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmark import metric_names
from benchmark.config import RunSpec


@dataclass
class RunOutcome:
    """One spec's result as the launch sees it."""

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
    """One invocation: its MLflow parent run and every spec's outcome, in suite order."""

    parent_run_id: str
    experiment_id: str
    outcomes: list[RunOutcome] = field(default_factory=list)
    finished_before: int = 0
    """Runs an earlier invocation had finished (not trained again)."""


def failed(spec: RunSpec, error: BaseException | str, status: str = "FAILED") -> RunOutcome:
    """The outcome of a spec whose worker failed (or never started) before the run reported."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return RunOutcome(spec, status=status, error=text)


def of_finished(spec: RunSpec, run: Any) -> RunOutcome:
    """The outcome of a FINISHED MLflow run of ``spec`` (trained by an earlier or another launch)."""
    metrics = run.data.metrics
    return RunOutcome(
        spec,
        run_id=run.info.run_id,
        status="FINISHED",
        final_return_mean=metrics.get(metric_names.FINAL_RETURN_MEAN),
        final_return_std=metrics.get(metric_names.FINAL_RETURN_STD),
        steps_per_second=metrics.get(metric_names.FINAL_STEPS_PER_SECOND),
        device=run.data.tags.get("device"),
        skipped=True,
        final_train_return=metrics.get(metric_names.TRAIN_RETURN),
    )


def of_bundled(spec: RunSpec, run: Any) -> RunOutcome:
    """The outcome of a run a result bundle holds (``bundles.BundledRun``)."""
    return RunOutcome(spec, run_id=run.mlflow_run_id, status="FINISHED", final_return_mean=run.final_return,
                      final_return_std=run.final_return_std, steps_per_second=run.steps_per_second, device=run.device,
                      skipped=True, source=run.origin, final_train_return=run.curve[-1].train_return_mean if run.curve else None)


def line(outcome: RunOutcome) -> str:
    """How the board reports a run's end."""
    label = outcome.spec.label
    if not outcome.ok:
        return f"{outcome.status} {label}: {outcome.error}"
    speed = f", {outcome.steps_per_second:,.0f} steps/s" if outcome.steps_per_second is not None else ""
    final = f"final eval {outcome.final_return_mean:.1f}" if outcome.final_return_mean is not None else "no final evaluation"
    return f"finished {label}{' by another launch' if outcome.skipped else ''}: {final}{speed}"
