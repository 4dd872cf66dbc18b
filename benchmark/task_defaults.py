"""Per-task settings, as RL Baselines3 Zoo keeps them per algorithm and env: the settings with which
the project's own suites train an algorithm on a task, each with the source its suite names.

The suites are the table (no second copy to drift from them): ``TASK_SUITES`` in order, the first
experiment that trains the algorithm on that env id (a grid's experiments excluded) gives its
``hyperparameters`` over the algorithm's published defaults, its budget, and its ``source``. A
task no suite trains has none: the published defaults apply. ``train`` and ``tune`` start from
them unless told otherwise; a suite states its own settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TASK_SUITES = ("classic", "mujoco")
"""The suites whose settings are the per-task defaults, the first match winning: classic control
(and InvertedPendulum) with RL Zoo's tuned settings, then MuJoCo locomotion with the papers'."""


@dataclass(frozen=True)
class TaskDefaults:
    """The settings a suite trains ``algo`` on ``env_id`` with."""

    algo: str
    env_id: str
    hyperparameters: dict[str, Any]
    """Over the algorithm's published defaults (empty: those defaults are the task's)."""
    total_steps: int
    eval_every: int
    source: str
    """Where the settings come from, as the suite names it."""
    suite: str
    """The suite file, relative to the project (``suites/classic.yaml``)."""

    def describe(self) -> str:
        """One line: what was taken from where."""
        settings = ", ".join(f"{key}={value}" for key, value in self.hyperparameters.items()) or "the published defaults"
        return f"settings of {self.suite} for {self.algo} on {self.env_id}: {settings}; source: {self.source}"


def lookup(algo: str, env_id: str) -> TaskDefaults | None:
    """The per-task settings of ``algo`` on ``env_id``, or None where no suite trains it."""
    from benchmark import config
    from benchmark.yaml_input import read_yaml

    for name in TASK_SUITES:
        path = config.SUITES_DIR / f"{name}.yaml"
        data = read_yaml(path)
        budget = dict(data.get("budget") or {})
        for experiment in data.get("experiments") or []:
            if experiment.get("algo") != algo or env_id not in (experiment.get("envs") or []) or experiment.get("grid"):
                continue
            steps = {**budget, **(experiment.get("budget") or {})}
            return TaskDefaults(
                algo,
                env_id,
                dict(experiment.get("hyperparameters") or {}),
                int(steps["total_steps"]),
                int(steps["eval_every"]),
                str(experiment.get("source") or "no source named"),
                str(path.relative_to(config.PROJECT_ROOT)),
            )
    return None
