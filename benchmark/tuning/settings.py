"""What every trial of a study shares (the algorithm, environment, budget, base setting, search
space and normalization), how it is made from the suites and the reference scores, and how a
resumed study keeps its own."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import agents
from agents.env_setup import EnvSetup, setup_of
from agents.envs import check_env_id, env_spec
from agents.errors import ConfigError
from benchmark import config, task_defaults
from benchmark.analysis import normalizers, reference
from benchmark.config import Budget
from benchmark.tuning.search_space import SearchSpace

TRIAL_SEED_BASE = 1000
SAMPLERS = ("tpe", "random", "cmaes")
PRUNERS = ("median", "hyperband", "none")
TUNED_DIR = config.SUITES_DIR / "tuned"
SETTINGS_ATTR = "reprorl"
"""The study user attribute that holds its StudySettings."""
OBJECTIVE_NAME = "normalized final return"


@dataclass(frozen=True)
class StudySettings:
    """What every trial of a study shares; stored in the study so that resumes and other
    machines score trials the same way."""

    algo: str
    env_id: str
    budget: Budget
    seeds_per_trial: int
    base_suite: str | None
    """The suite whose budget and fixed hyperparameters the trials start from (None: the
    algorithm's published defaults)."""
    base_hyperparameters: dict[str, Any]
    space: dict[str, Any]
    random_score: float
    reference_score: float
    reference_source: str
    seed: int = 0
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """How the base suite makes the env (its experiment's env_kwargs and wrappers): the trials make it so."""
    wrappers: list[dict[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def env(self) -> EnvSetup:
        return setup_of(self.env_id, self.env_kwargs, self.wrappers)

    def normalize(self, episode_return: float) -> float:
        """(return - random) / (reference - random): 0 is the random policy, 1 the reference."""
        return (episode_return - self.random_score) / (self.reference_score - self.random_score)

    def trial_seeds(self, trial_number: int) -> list[int]:
        first = TRIAL_SEED_BASE + self.seed + trial_number * self.seeds_per_trial
        return list(range(first, first + self.seeds_per_trial))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudySettings:
        """Settings as a study stored them, renamed fields under their new names."""
        base = config.stored_hyperparameters(data["algo"], dict(data["base_hyperparameters"]))
        return cls(**{**data, "budget": Budget(**data["budget"]), "base_hyperparameters": base})


def base_setting(algo: str, env_id: str, suite_name: str | None) -> tuple[str | None, Budget | None, dict[str, Any], dict[str, Any]]:
    """(suite, budget, fixed hyperparameters, env options) of the task's settings
    (``task_defaults.find``: the first suite that runs ``algo`` on ``env_id``, or ``suite_name``
    when given; 'none': no suite, the published defaults)."""
    if suite_name == "none":
        return None, None, {}, {}
    task = task_defaults.find(algo, env_id, suite_name)
    if task is None:
        if suite_name:
            raise ConfigError(f"suite {suite_name!r} has no run of {algo} on {env_id} (--suite none: start from the published defaults)")
        return None, None, {}, {}
    return task.suite, task.budget, task.hyperparameters, task.options


def make_settings(
    algo: str,
    env_id: str,
    space: SearchSpace,
    *,
    budget_steps: int | None = None,
    seeds_per_trial: int = 1,
    base_suite: str | None = None,
    reference_score: float | None = None,
    random_score: float | None = None,
    seed: int = 0,
) -> StudySettings:
    """The setting of a new study searching ``space`` (``load_search_space`` checked it),
    validated before anything is written; ConfigError naming the problem (unknown
    environment, a budget or seed out of range, no reference score)."""
    check_env_id(env_id)
    if seeds_per_trial < 1:
        raise ConfigError(f"--seeds-per-trial must be >= 1, got {seeds_per_trial}")
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    suite_name, budget, fixed, options = base_setting(algo, env_id, base_suite)
    made = setup_of(env_id, options.get("env_kwargs", {}), options.get("wrappers", []))
    agents.check_env_spec(algo, env_spec(made))
    if budget_steps is not None:
        if budget_steps < 1:
            raise ConfigError(f"--budget must be a positive number of env steps, got {budget_steps}")
        budget = Budget(budget_steps, max(budget_steps // 10, 1), budget.eval_episodes if budget else 10)
    if budget is None:
        raise ConfigError(f"no suite runs {algo} on {env_id} to take a budget from; pass --budget STEPS")
    agents.check_config(algo, agents.resolve_config(algo, {**fixed, **space.fixed}), env_spec(made))

    normalizer = normalizers.normalizer(env_id)
    if reference_score is None:
        if normalizer.reference is None:
            raise ConfigError(
                f"no published reference score for {env_id} in {reference.REFERENCE_DIR / 'scores.csv'}: add a row for it to "
                f"{reference.SHARED_SCORES} and run `python -m benchmark reference build`, or pass --reference SCORE"
            )
        reference_score, source = normalizer.reference.mean, normalizer.reference.citation
    else:
        source = "--reference (given on the command line)"
    if random_score is None:
        if normalizer.random is None:
            raise ConfigError(
                f"no random-policy score for {env_id}: measure it with `python -m benchmark reference random --env {env_id}`, or pass --random SCORE"
            )
        random_score = normalizer.random.mean
    if reference_score == random_score:
        raise ConfigError(f"the reference score equals the random score ({reference_score}): nothing to normalize by")
    return StudySettings(
        algo, env_id, budget, seeds_per_trial, suite_name, fixed, space.to_dict(), float(random_score), float(reference_score), source, seed, **options
    )


def resumed_settings(stored: StudySettings, algo: str, env_id: str, given: dict[str, Any]) -> StudySettings:
    """The stored setting of a study being resumed; ConfigError when the algorithm, the
    environment or an option given now (``given``: option -> value, None if not given)
    differs from the one the study was created with."""
    if (stored.algo, stored.env_id) != (algo, env_id):
        raise ConfigError(f"the study tunes {stored.algo} on {stored.env_id}, not {algo} on {env_id}; choose another --study name")
    recorded = {
        "budget": stored.budget.total_steps,
        "seeds_per_trial": stored.seeds_per_trial,
        "suite": stored.base_suite or "none",
        "reference": stored.reference_score,
        "random": stored.random_score,
        "seed": stored.seed,
    }
    for option, value in given.items():
        if value is not None and value != recorded[option]:
            flag = "--" + option.replace("_", "-")
            raise ConfigError(
                f"the study was created with {flag} {recorded[option]}, so its trials are scored that way; "
                f"leave out {flag} to resume it, or choose another --study name"
            )
    return stored
