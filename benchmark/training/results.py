"""What one run reports: where its numbers go (Tracker), its evaluations and its result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from benchmark.config import RunSpec


class Tracker(Protocol):
    """Where a run's numbers go (MLflow in the runner; anything with these methods in tests)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def flush(self) -> None: ...


class NullTracker:
    """Keeps metrics in memory; used when no tracking store is wanted."""

    def __init__(self) -> None:
        self.metrics: list[tuple[str, float, int]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.metrics += [(key, float(value), step) for key, value in metrics.items()]

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def flush(self) -> None:
        pass


@dataclass
class Evaluation:
    """One evaluation at env step ``step``: each episode's unscaled return and length."""

    step: int
    returns: list[float]
    lengths: list[int]
    train_return_mean: float | None = None
    """Mean return of the training episodes that ended since the previous evaluation (None: none
    ended): what sources that report training returns (CleanRL, openrlbenchmark) measure."""
    train_episodes: int = 0
    """How many training episodes that is."""

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


@dataclass
class RunResult:
    """What a finished run reports back to its caller."""

    spec: RunSpec
    evaluations: list[Evaluation] = field(default_factory=list)
    steps_per_second: float = 0.0
    """Env steps per second of training (evaluation time excluded)."""
    wall_seconds: float = 0.0
    cpu_seconds: float = float("nan")
    """CPU seconds of the process that trained it (all the seeds of a batch), every attempt;
    NaN where not known (a resume from an older checkpoint, workers in other processes)."""
    device: str = "cpu"
    checkpoint: str | None = None
    train_last100: tuple[float, int] | None = None
    """(mean, episodes) of the last 100 training episodes' returns (None: none ended)."""


ProgressCallback = Callable[[int, int, float | None], None]  # (step, total_steps, last eval mean)
EvaluationCallback = Callable[[Evaluation], None]  # called after each evaluation; may raise to stop the run


@dataclass
class SeedJob:
    """One run of ``benchmark.training.loop.run_seeds``: its spec and what ``run`` takes for it."""

    spec: RunSpec
    tracker: Tracker | None = None
    progress: ProgressCallback | None = None
    resume: dict[str, Any] | None = None
    checkpoint_metadata: dict[str, Any] | None = None
    on_evaluation: EvaluationCallback | None = None
