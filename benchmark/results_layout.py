"""What a results directory (``--results-dir``, default ``results/``) holds and where: the one
place that names its files and folders. Every command reads and writes them through
``ResultsDir``; ``results/perf/`` and ``results/baselines/`` belong to the checkout, not to a
results directory (``benchmark.execution.estimate``, ``benchmark.analysis.regress``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ResultsDir:
    """A results directory's layout under ``root``."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def mlflow_db(self) -> Path:
        """MLflow's SQLite store (the default tracking URI)."""
        return self.root / "mlflow.db"

    @property
    def optuna_db(self) -> Path:
        """Optuna's SQLite storage (the default study storage)."""
        return self.root / "optuna.db"

    @property
    def artifacts(self) -> Path:
        """MLflow's artifact root of the experiments created here."""
        return self.root / "mlartifacts"

    @property
    def checkpoints(self) -> Path:
        """Each run's checkpoints, by run key."""
        return self.root / "checkpoints"

    @property
    def claims(self) -> Path:
        """The locks of run keys being trained (``benchmark.execution.claims``)."""
        return self.root / "claims"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def report(self, name: str) -> Path:
        """Where ``report`` (of a suite) or ``compare`` writes by default."""
        return self.reports / name

    @property
    def published(self) -> Path:
        """The bundles (``benchmark.bundles``), one folder per suite."""
        return self.root / "published"

    def bundle(self, suite_name: str) -> Path:
        return self.published / suite_name

    @property
    def parity(self) -> Path:
        """The parity runs' records (``benchmark.perf.parity``)."""
        return self.root / "parity"

    @property
    def record(self) -> Path:
        """The record's tables and figures (``record``)."""
        return self.root / "record"

    def tune_plots(self, study_name: str) -> Path:
        return self.root / "tune" / study_name

    @property
    def kept_suites(self) -> Path:
        """The suite files ``train`` writes for what it launched."""
        return self.root / "suites"

    @property
    def ui_log(self) -> Path:
        """``make ui``'s server log."""
        return self.root / "mlflow-ui.log"
