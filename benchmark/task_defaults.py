"""Per-task settings, as RL Baselines3 Zoo keeps them per algorithm and env: the settings with which
the project's own suites train an algorithm on a task, each with the source its suite names.

The suites are the table (no second copy to drift from them): the first suite that trains the
algorithm on that env id, in the order classic, mujoco, then the others (not the tuned ones),
gives its overrides of the algorithm's published defaults, its budget, its env options and its
``source``; where a suite trains it on the env made from its id alone and also with other
options, the plain one. A task no suite trains has none: the published defaults apply. ``train``
starts from them, and ``tune`` from them as its base setting, unless told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmark.config import Budget

SUITE_ORDER = ("classic", "mujoco")
"""Searched first: classic control (and InvertedPendulum) with RL Zoo's tuned settings, then MuJoCo
locomotion with the papers'."""


@dataclass(frozen=True)
class TaskDefaults:
    """The settings a suite trains ``algo`` on ``env_id`` with."""

    algo: str
    env_id: str
    suite: str
    """The suite's name."""
    budget: Budget
    hyperparameters: dict[str, Any]
    """Over the algorithm's published defaults (empty: those defaults are the task's)."""
    options: dict[str, Any]
    """The experiment's ``env_kwargs`` and ``wrappers``, where it sets them."""
    source: str
    """Where the settings come from, as the suite names it."""

    def describe(self) -> str:
        """One line: what was taken from where."""
        settings = {**self.hyperparameters, **self.options}
        listed = ", ".join(f"{key}={value}" for key, value in settings.items()) or "the published defaults"
        return f"settings of suite {self.suite} for {self.algo} on {self.env_id}: {listed}; source: {self.source}"


def find(algo: str, env_id: str, suite_name: str | None = None) -> TaskDefaults | None:
    """The settings of the first suite (``suite_name`` alone, when given) that trains ``algo`` on
    ``env_id``, or None where none does."""
    from benchmark import config

    others = (name for name in config.available_suites() if name not in SUITE_ORDER and not name.startswith("tuned/"))
    for name in [suite_name] if suite_name else [*SUITE_ORDER, *others]:
        suite = config.load_suite(name)
        matching = [spec for spec in suite.specs if spec.algo == algo and spec.env_id == env_id]
        if matching:
            spec = next((spec for spec in matching if spec.env.plain), matching[0])
            options = {key: value for key, value in (("env_kwargs", spec.env_kwargs), ("wrappers", spec.wrappers)) if value}
            return TaskDefaults(algo, env_id, suite.name, spec.budget, dict(spec.overrides), options, _source(suite.path, algo, env_id, bool(options)))
    return None


def _source(path: Any, algo: str, env_id: str, with_options: bool) -> str:
    """The ``source`` the suite file gives the experiment that trains ``algo`` on ``env_id``."""
    from benchmark.yaml_input import read_yaml

    for experiment in read_yaml(path).get("experiments") or []:
        made = bool(experiment.get("env_kwargs") or experiment.get("wrappers"))
        if experiment.get("algo") == algo and env_id in (experiment.get("envs") or []) and made == with_options:
            return str(experiment.get("source") or "the suite names none")
    return "the suite names none"
