"""Hyperparameter studies with Optuna, scored against the published reference scores.

A study tunes one algorithm on one environment. Each trial draws hyperparameters from the
algorithm's search space (``benchmark.tuning.search_space``) on top of a base setting (the budget
and fixed hyperparameters of the suite that runs this pair, e.g. ``classic``), trains
``seeds_per_trial`` runs one after another, and scores the trial by the **normalized final
evaluation** ``(return - random) / (reference - random)`` averaged over its seeds.

- Seeds: trial ``n`` trains seeds ``TRIAL_SEED_BASE + seed + n * S + i`` (i < S): fixed per
  trial number, different across trials, and never the seeds a suite runs (0, 1, ...), so an
  exported setting is evaluated on seeds the tuner did not select it on.
- Pruning: after each evaluation the running objective (finished seeds' final scores and the
  current seed's latest evaluation, averaged) is reported at step ``k * total_steps + t``
  (seed k, nominal step t = the evaluation's index times ``eval_every``), so that every
  trial reports at the same steps whatever its number of envs.
- Storage: any Optuna storage (SQLite under ``results/`` by default, PostgreSQL/MySQL URLs,
  ``journal:PATH``); the study's setting is stored in its user attributes, so that re-running
  the same study name resumes it and other machines can join it with the same command.
- Parallelism: ``workers`` spawned processes take trials from one shared count until the
  invocation's ``trials`` are started. The sampler is seeded per trial (study seed, trial
  number, worker): one worker repeats a study exactly; a resumed study draws new trials.
- MLflow: experiment ``tune-<study>``, one parent run per study (reopened on resume), one
  child run per trial with its parameters, per-seed curves, intermediate values, objective
  and state (tag ``trial_state``; status FINISHED, KILLED when pruned, FAILED).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from filelock import FileLock
from rich.console import Console
from rich.markup import escape

import agents
from agents.api import ConfigError, suggest
from agents.envs import check_env_id, env_spec
from benchmark import config, stores, tracking
from benchmark.analysis import reference
from benchmark.config import Budget, RunSpec
from benchmark.execution import claims
from benchmark.tracking import redact
from benchmark.tuning.search_space import (
    SearchSpace,
    load_search_space,
    space_from_dict,
)

TRIAL_SEED_BASE = 1000
SAMPLERS = ("tpe", "random", "cmaes")
PRUNERS = ("median", "hyperband", "none")
BASE_SUITE_ORDER = ("classic", "mujoco")
"""Suites searched first for the base setting of an (algorithm, environment) pair."""
TUNED_DIR = config.SUITES_DIR / "tuned"
SETTINGS_ATTR = "reprorl"
"""The study user attribute that holds its StudySettings."""


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

    def normalize(self, episode_return: float) -> float:
        """(return - random) / (reference - random): 0 is the random policy, 1 the reference."""
        return (episode_return - self.random_score) / (self.reference_score - self.random_score)

    def trial_seeds(self, trial_number: int) -> list[int]:
        first = TRIAL_SEED_BASE + self.seed + trial_number * self.seeds_per_trial
        return list(range(first, first + self.seeds_per_trial))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StudySettings":
        return cls(**{**data, "budget": Budget(**data["budget"])})


# ------------------------------------------------------------------------------- the setting


def base_setting(algo: str, env_id: str, suite_name: str | None) -> tuple[str | None, Budget | None, dict[str, Any]]:
    """(suite, budget, fixed hyperparameters) of the first suite that runs ``algo`` on
    ``env_id``: ``suite_name`` if given ('none': no suite), else classic, mujoco, then the
    others (not the tuned ones: a study starts from the benchmark's setting)."""
    if suite_name == "none":
        return None, None, {}
    others = (name for name in config.available_suites() if name not in BASE_SUITE_ORDER and not name.startswith("tuned/"))
    names = [suite_name] if suite_name else [*BASE_SUITE_ORDER, *others]
    for name in names:
        suite = config.load_suite(name)
        for spec in suite.specs:
            if spec.algo == algo and spec.env_id == env_id:
                return suite.name, spec.budget, dict(spec.overrides)
    if suite_name:
        raise ConfigError(f"suite {suite_name!r} has no run of {algo} on {env_id} (--suite none: start from the published defaults)")
    return None, None, {}


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
    agents.algorithm_class(algo).check_env_spec(env_spec(env_id))
    if seeds_per_trial < 1:
        raise ConfigError(f"--seeds-per-trial must be >= 1, got {seeds_per_trial}")
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    suite_name, budget, fixed = base_setting(algo, env_id, base_suite)
    if budget_steps is not None:
        if budget_steps < 1:
            raise ConfigError(f"--budget must be a positive number of env steps, got {budget_steps}")
        budget = Budget(budget_steps, max(budget_steps // 10, 1), budget.eval_episodes if budget else 10)
    if budget is None:
        raise ConfigError(f"no suite runs {algo} on {env_id} to take a budget from; pass --budget STEPS")
    agents.algorithm_class(algo).check_config(agents.resolve_config(algo, {**fixed, **space.fixed}), env_spec(env_id))

    normalizer = reference.normalizer(env_id)
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
                f"no random-policy score for {env_id}: measure it with `python -m benchmark reference random --env {env_id}`, "
                "or pass --random SCORE"
            )
        random_score = normalizer.random.mean
    if reference_score == random_score:
        raise ConfigError(f"the reference score equals the random score ({reference_score}): nothing to normalize by")
    return StudySettings(
        algo, env_id, budget, seeds_per_trial, suite_name, fixed, space.to_dict(), float(random_score), float(reference_score), source, seed
    )


# ---------------------------------------------------------------------------------- storage


def quiet_optuna() -> None:
    """Only Optuna's errors reach the console (trials get one line each from us), and none of
    its warnings about experimental arguments (heartbeats, grouped TPE)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def default_storage_url(results_dir: Path) -> str:
    return f"sqlite:///{(results_dir / 'optuna.db').resolve()}"


def open_storage(url: str) -> Any:
    """An Optuna storage for ``url``: an RDB URL (sqlite:///PATH, postgresql://..., mysql://...)
    or ``journal:PATH`` (Optuna's journal file, for shared disks). SQLite waits up to a minute
    for a lock (several worker processes write to it); RDB trials send heartbeats, so that
    ``optuna.storages.fail_stale_trials`` can fail a trial whose process died (journal files
    have no heartbeat). ConfigError naming the URL if it cannot be opened."""
    import optuna
    import sqlalchemy.exc

    quiet_optuna()
    sqlite_file = stores.sqlite_path(url)
    if sqlite_file is not None:  # checked, or created whole under a lock (see benchmark.stores)
        stores.create_once(sqlite_file, "an Optuna study storage", OPTUNA_TABLES, _create_optuna_db)
    for attempt in range(4):
        try:
            if url.startswith("journal:"):
                path = _file_of(url)
                assert path is not None
                if not path.parent.is_dir():
                    raise ConfigError(f"directory {path.parent} does not exist")
                from optuna.storages.journal import JournalFileBackend

                return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
            engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=30, grace_period=120)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as error:
            # another process created the tables of a new database at the same moment: they exist
            # now (SQLite reports the race as "table ... already exists", other drivers as a
            # duplicate key); anything else is a real failure to open
            racing = isinstance(error, sqlalchemy.exc.IntegrityError) or "already exists" in str(error)
            if not racing or attempt == 3:
                raise _cannot_open(url, error) from None
            time.sleep(0.5)
        except Exception as error:  # noqa: BLE001 - sqlalchemy, drivers and optuna raise many types
            if stores.is_disk_full(error):
                raise
            raise _cannot_open(url, error) from None
    raise AssertionError("unreachable")


OPTUNA_TABLES = {"studies", "trials", "version_info"}
OBJECTIVE_NAME = "normalized final return"


def _create_optuna_db(path: Path) -> None:
    """Optuna's schema in a new SQLite file at ``path`` (its engine closed again afterwards)."""
    import optuna

    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    storage.engine.dispose()


def _cannot_open(url: str, error: Exception) -> ConfigError:
    return ConfigError(
        f"cannot open the Optuna storage {redact(url)!r}: {type(error).__name__}: {error}. "
        "Use sqlite:///PATH, postgresql://USER@HOST/DB, mysql://USER@HOST/DB or journal:PATH"
    )


def open_existing_storage(url: str | None, results_dir: Path) -> tuple[str, Any]:
    """(url, storage) for reading a study: the default SQLite file must already exist (reading
    never creates a store)."""
    url = url or default_storage_url(results_dir)
    path = _file_of(url)
    if path is not None and not path.exists():
        raise ConfigError(f"no study storage at {path}; run `python -m benchmark tune` first, or pass --storage URL")
    return url, open_storage(url)


def _file_of(url: str) -> Path | None:
    """The file of a SQLite or journal storage URL (None for a database server)."""
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:").removeprefix("//"))
    return None


def load_study(name: str, storage: Any) -> Any:
    """An existing study; ConfigError listing the study names in the storage otherwise."""
    import optuna

    names = optuna.get_all_study_names(storage)
    if name not in names:
        listed = ", ".join(sorted(names)) or "none"
        raise ConfigError(f"no study {name!r} in this storage{suggest(name, names)}; studies: {listed}")
    return optuna.load_study(study_name=name, storage=storage)


def study_settings(study: Any) -> StudySettings:
    data = study.user_attrs.get(SETTINGS_ATTR)
    if data is None:
        raise ConfigError(f"study {study.study_name!r} was not created by `python -m benchmark tune` (it has no settings)")
    return StudySettings.from_dict(data)


def study_exists(url: str, name: str, default_url: str) -> bool:
    """Whether ``name`` is a study in the storage at ``url``, without creating anything: a
    SQLite file that does not exist yet holds no study (its directory must exist, except for
    the default store under --results-dir, made when the study starts)."""
    import optuna

    path = _file_of(url)
    if path is not None:
        if not path.exists():
            if url != default_url and not path.parent.is_dir():
                raise ConfigError(f"cannot open the Optuna storage {redact(url)!r}: directory {path.parent} does not exist")
            return False
    return name in optuna.get_all_study_names(open_storage(url))


def resumed_settings(stored: StudySettings, algo: str, env_id: str, given: dict[str, Any]) -> StudySettings:
    """The stored setting of a study being resumed; ConfigError when the algorithm, the
    environment or an option given now (``given``: option -> value, None if not given)
    differs from the one the study was created with."""
    if (stored.algo, stored.env_id) != (algo, env_id):
        raise ConfigError(
            f"the study tunes {stored.algo} on {stored.env_id}, not {algo} on {env_id}; choose another --study name"
        )
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


def prepare(
    algo: str, env_id: str, study_name: str, storage_url: str, default_url: str, given: dict[str, Any],
    space_path: Path | None = None,
) -> tuple[StudySettings, SearchSpace]:
    """The setting and search space of study ``study_name``: the stored ones when it exists
    (checked against the options ``given`` and ``space_path``), else new ones from ``given``
    (option -> value or None). Every check runs before anything is written."""
    import optuna

    space = load_search_space(algo, space_path)  # (an unknown algorithm is named first)
    check_env_id(env_id)
    agents.algorithm_class(algo).check_env_spec(env_spec(env_id))
    if given.get("suite") not in (None, "none"):
        given = {**given, "suite": config.load_suite(given["suite"]).name}
    if study_exists(storage_url, study_name, default_url):
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
        settings = resumed_settings(study_settings(study), algo, env_id, given)
        if space_path is not None and space.to_dict() != settings.space:
            raise ConfigError(
                f"study {study_name!r} searches the space it was created with, not {space_path}; "
                "leave out --space to resume it, or choose another --study name"
            )
        return settings, space_from_dict(settings.space)
    seeds_per_trial, seed = given.get("seeds_per_trial"), given.get("seed")
    settings = make_settings(
        algo, env_id, space, budget_steps=given.get("budget"), seeds_per_trial=1 if seeds_per_trial is None else seeds_per_trial,
        base_suite=given.get("suite"), reference_score=given.get("reference"), random_score=given.get("random"),
        seed=0 if seed is None else seed,
    )
    return settings, space


# -------------------------------------------------------------------------------- the trials


class TrialFailed(Exception):
    """A trial's run failed (an error, a non-finite loss or score): the trial is FAIL, the study goes on."""


class _SeedTracker:
    """Logs one seed's training metrics into the trial's MLflow run, under ``seed<N>/``."""

    def __init__(self, tracker: tracking.MlflowTracker, seed: int):
        self.tracker, self.prefix = tracker, f"seed{seed}/"

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.tracker.log_metrics({self.prefix + key: value for key, value in metrics.items()}, step)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.tracker.log_artifact(path, artifact_path)

    def flush(self) -> None:
        self.tracker.flush()


@dataclass
class Objective:
    """Trains one trial's seeds and returns its mean normalized final score (an Optuna objective)."""

    study_name: str
    settings: StudySettings
    space: SearchSpace
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    device: str = "auto"
    current: Any = None
    """A shared integer (multiprocessing Value) where a worker publishes its running trial's number."""
    seeds_per_process: int = 1
    """The trial's seeds trained at once, as one batched model (1: one after another)."""

    def __call__(self, trial: Any) -> float:
        import optuna

        from benchmark.training.control import Preempted

        settings = self.settings
        if self.current is not None:
            self.current.value = trial.number  # the parent fails this trial if the process dies
        try:
            sampled = self.space.sample(trial)
        except ValueError as error:  # e.g. a distribution that contradicts earlier trials' (edited storage)
            trial.set_user_attr("error", f"cannot sample: {error}"[:2000])
            raise TrialFailed(f"cannot sample: {error}") from error
        tuned = {name: value for name, value in sampled.items() if name not in self.space.fixed}
        overrides = {**settings.base_hyperparameters, **sampled}
        seeds = settings.trial_seeds(trial.number)
        tags = {
            "kind": "trial", "study": self.study_name, "trial_number": trial.number, "algo": settings.algo,
            "env_id": settings.env_id, "seeds": " ".join(map(str, seeds)), "trial_state": "RUNNING",
            "seeds_per_process": self.seeds_per_process,
        }
        params = {f"tuned.{name}": value for name, value in tuned.items()}
        params.update({f"budget.{key}": value for key, value in dataclasses.asdict(settings.budget).items()})
        try:
            hyperparameters = agents.resolve_config(settings.algo, overrides)
            agents.algorithm_class(settings.algo).check_config(hyperparameters, env_spec(settings.env_id))
        except ConfigError as error:
            hyperparameters = None
            infeasible = error
        else:
            infeasible = None
            params.update({f"hp.{key}": value for key, value in hyperparameters.to_dict().items()})
        run = tracking.start_child_run(
            self.tracking_uri, self.experiment_id, self.parent_run_id, f"trial-{trial.number}", tags, params
        )
        trial.set_user_attr("mlflow_run_id", run.run_id)
        trial.set_user_attr("overrides", overrides)
        trial.set_user_attr("tuned", tuned)
        for name, value in tuned.items():  # decoded (num_steps, not num_steps_log2): optuna-dashboard lists user attributes
            if name not in trial.params:
                trial.set_user_attr(name, value)
        trial.set_user_attr("seeds", seeds)
        try:
            if infeasible is not None:
                raise TrialFailed(f"infeasible hyperparameters: {infeasible}")
            assert hyperparameters is not None
            value = self._train(trial, run, hyperparameters.to_dict(), overrides, seeds)
        except optuna.TrialPruned as pruned:
            run.set_tags({"trial_state": "PRUNED", "pruned": str(pruned)})
            run.finish("KILLED")
            raise
        except (Preempted, KeyboardInterrupt) as error:  # the invocation is stopping
            _ignore_further_stop_signals()
            run.set_tags({"trial_state": "FAIL"})
            run.flush()
            run.fail(error, "KILLED")
            raise
        except Exception as error:  # noqa: BLE001 - any failure of one trial must not end the study
            run.set_tags({"trial_state": "FAIL"})
            run.flush()
            run.fail(error)
            message = str(error) if isinstance(error, TrialFailed) else f"{type(error).__name__}: {error}"
            trial.set_user_attr("error", message[:2000])
            raise TrialFailed(message) from error
        run.set_tags({"trial_state": "COMPLETE"})
        run.finish("FINISHED")
        return value

    def _train(
        self, trial: Any, run: tracking.MlflowTracker, hyperparameters: dict[str, Any], overrides: dict[str, Any],
        seeds: list[int],
    ) -> float:
        """Train the trial's seeds, ``seeds_per_process`` at a time (one after another by
        default; more as one batched model), reporting the running objective after each
        evaluation round; the mean normalized final score."""
        from benchmark.training import loop as training_loop  # imported here: torch loads in the worker only

        settings = self.settings
        finals: list[float] = []
        returns: list[float] = []

        def spec_of(seed: int) -> RunSpec:
            return RunSpec(f"tune-{self.study_name}", settings.algo, settings.env_id, seed, hyperparameters, settings.budget, self.device, 1, overrides)

        per_process = min(self.seeds_per_process, len(seeds))
        unbatchable = training_loop.batchable(spec_of(seeds[0])) if per_process > 1 else None
        if unbatchable:  # (this trial's sampled setting, say PPO with target_kl)
            run.set_tags({"not_batched": unbatchable})
            per_process = 1
        for first in range(0, len(seeds), per_process):
            group = seeds[first : first + per_process]
            report = _RoundReporter(trial, run, settings, finals, first, len(group), last=first + len(group) == len(seeds))
            jobs = [training_loop.SeedJob(spec_of(seed), _SeedTracker(run, seed), on_evaluation=report.callback(seed)) for seed in group]
            if len(jobs) == 1:
                outcomes = [training_loop.run(jobs[0].spec, jobs[0].tracker, on_evaluation=jobs[0].on_evaluation)]
            else:
                outcomes = training_loop.run_seeds(jobs, stop_together=True)
                for outcome in outcomes:
                    if isinstance(outcome, BaseException):
                        raise outcome
            for seed, result in zip(group, outcomes):
                final_return = result.evaluations[-1].mean
                finals.append(settings.normalize(final_return))
                returns.append(final_return)
                run.log_metrics({f"final/seed{seed}_return_mean": final_return, f"final/seed{seed}_normalized": finals[-1]}, 0)
        objective = float(np.mean(finals))
        if not math.isfinite(objective):
            raise TrialFailed(f"non-finite objective from final returns {returns}")
        trial.set_user_attr("final_returns", returns)
        run.log_metrics({"objective": objective, "final/return_mean": float(np.mean(returns))}, 0)
        return objective


class _RoundReporter:
    """Reports a trial's running objective to Optuna once every seed of a group has evaluated:
    the mean over the finished seeds' final scores and the group's latest evaluations, at step
    ``k * total_steps + t`` where k is the group's last seed and t the evaluations' scheduled step
    (a multiple of ``eval_every``, or the budget), so that trials report at the same steps
    whatever their number of envs. One seed at a time, k is that seed; prunes when Optuna says so."""

    def __init__(
        self, trial: Any, run: tracking.MlflowTracker, settings: StudySettings, finals: list[float], first: int, size: int, last: bool
    ):
        self.trial, self.run, self.settings, self.finals = trial, run, settings, finals
        self.index, self.size, self.last = first + size - 1, size, last
        self.waiting: dict[int, Any] = {}

    def callback(self, seed: int) -> Any:
        return lambda evaluation: self.evaluated(seed, evaluation)

    def evaluated(self, seed: int, evaluation: Any) -> None:
        import optuna

        self.waiting[seed] = evaluation
        if len(self.waiting) < self.size:
            return
        evaluations, self.waiting = self.waiting, {}
        budget = self.settings.budget
        final_evaluation = evaluation.step >= budget.total_steps
        nominal = budget.total_steps if final_evaluation else evaluation.step // budget.eval_every * budget.eval_every
        step = self.index * budget.total_steps + nominal
        for seed_evaluated, seed_evaluation in evaluations.items():
            if not math.isfinite(seed_evaluation.mean):
                raise TrialFailed(f"non-finite evaluation return {seed_evaluation.mean} at step {seed_evaluation.step} of seed {seed_evaluated}")
        value = float(np.mean([*self.finals, *(self.settings.normalize(e.mean) for e in evaluations.values())]))
        self.trial.report(value, step)
        self.run.log_metrics({"objective/intermediate": value}, step)
        if not (self.last and final_evaluation) and self.trial.should_prune():  # (nothing to save at the very end)
            self.run.flush()
            raise optuna.TrialPruned(f"pruned at step {step:,} with intermediate value {value:.3f}")


# ----------------------------------------------------------------------------- the workers


def make_sampler(name: str, seed: int) -> Any:
    """TPE (multivariate, grouped for conditional parameters, constant liar for parallel
    workers), random, or CMA-ES (categorical parameters fall back to TPE)."""
    import optuna

    quiet_optuna()

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(
            seed=seed, independent_sampler=optuna.samplers.TPESampler(seed=seed), warn_independent_sampling=False
        )
    raise ConfigError(f"unknown sampler {name!r}; use {', '.join(SAMPLERS)}")


def make_pruner(name: str, settings: StudySettings, startup_trials: int = 5, warmup_steps: int | None = None) -> Any:
    """median: prune below the median of earlier trials at the same step, after
    ``startup_trials`` trials and ``warmup_steps`` (default: a third of the first seed's
    budget); hyperband: from one evaluation period up to all seeds' budgets; none."""
    import optuna

    if name == "median":
        warmup = settings.budget.total_steps // 3 if warmup_steps is None else warmup_steps
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=settings.budget.eval_every, max_resource=settings.seeds_per_trial * settings.budget.total_steps
        )
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ConfigError(f"unknown pruner {name!r}; use {', '.join(PRUNERS)}")


@dataclass(frozen=True)
class WorkerJob:
    """What every worker process of one invocation needs (picklable)."""

    study_name: str
    storage_url: str
    settings: dict[str, Any]
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    sampler: str
    pruner: str
    pruner_startup_trials: int
    pruner_warmup_steps: int | None
    deadline: float | None
    """time.time() after which no new trial starts (--timeout)."""
    seeds_per_process: int = 1


def sampler_seed(seed: int, trial_number: int, worker: int, host: str = "") -> int:
    """The sampler seed of the trial about to start: a function of the study seed, the number
    the trial will get, the worker and ``host``, so that the same command draws the same
    trials, a resumed study does not draw its first trials again, and workers that start
    trials at the same time draw different ones. ``host`` is the host name for storages that
    other machines can join (their worker 0 would otherwise draw what ours does), and empty
    for SQLite, so that a local study repeats exactly anywhere."""
    text = f"{seed}/{trial_number}/{worker}/{host}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def shared_storage(url: str) -> bool:
    """Whether other machines can join a study in this storage (not SQLite)."""
    return not url.startswith("sqlite")


def work(
    job: WorkerJob, worker: int, tickets: Any, current: Any, device_slot: tuple[str, str] | None, parent_pid: int
) -> None:
    """A worker process: take a ticket, run one trial, until the tickets or the time run out.
    ``current`` holds the number of the trial it runs (-1 between trials)."""
    from benchmark.execution import devices
    from benchmark.execution.local import init_child_process

    init_child_process(parent_pid)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    device = "auto"
    if device_slot is not None:
        slot = devices.Slot(*device_slot)
        devices.enter_slot(slot)
        device = slot.device
    import optuna

    quiet_optuna()
    settings = StudySettings.from_dict(job.settings)
    space = space_from_dict(settings.space)  # the study's own space, whatever the files say now
    study = optuna.load_study(
        study_name=job.study_name,
        storage=open_storage(job.storage_url),
        pruner=make_pruner(job.pruner, settings, job.pruner_startup_trials, job.pruner_warmup_steps),
    )
    objective = Objective(
        job.study_name, settings, space, job.tracking_uri, job.experiment_id, job.parent_run_id, device, current, job.seeds_per_process
    )
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    host = socket.gethostname() if shared_storage(job.storage_url) else ""
    from benchmark.training.control import Preempted

    try:
        while (job.deadline is None or time.time() < job.deadline) and _take_ticket(tickets):
            next_number = len(study.get_trials(deepcopy=False))  # (another worker may take it first: no matter)
            study.sampler = make_sampler(job.sampler, sampler_seed(settings.seed, next_number, worker, host))
            study.optimize(objective, n_trials=1, catch=(TrialFailed,), callbacks=[lambda s, t: _print_trial(console, t)])
            current.value = -1
    except (KeyboardInterrupt, Preempted):  # stopped by the invocation: the trial is FAIL, its run KILLED
        sys.exit(143)


class _Interrupted(KeyboardInterrupt):
    """SIGTERM in a worker: stop like Ctrl-C (the running trial is marked FAIL, its MLflow run KILLED)."""


def _raise_interrupt(signum: int, frame: Any) -> None:
    _ignore_further_stop_signals()
    raise _Interrupted()


def _ignore_further_stop_signals() -> None:
    """Once stopping, a second SIGTERM (the process group's and the parent's) or Ctrl-C must
    not interrupt the cleanup that marks the trial and its run (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _take_ticket(tickets: Any) -> bool:
    with tickets.get_lock():
        if tickets.value <= 0:
            return False
        tickets.value -= 1
        return True


def _print_trial(console: Console, trial: Any) -> None:
    state = trial.state.name
    seconds = trial.duration.total_seconds() if trial.duration else 0.0
    if state == "COMPLETE":
        outcome = f"normalized {trial.value:.3f} (final returns {', '.join(f'{r:.1f}' for r in trial.user_attrs.get('final_returns', []))})"
    elif state == "PRUNED":
        last = trial.last_step
        outcome = f"at step {last:,} (intermediate {trial.intermediate_values[last]:.3f})" if last is not None else ""
    else:
        outcome = trial.user_attrs.get("error", "")
    params = ", ".join(f"{name}={_short(value)}" for name, value in trial.user_attrs.get("tuned", trial.params).items())
    console.print(escape(f"trial {trial.number} {state} {outcome} in {seconds:.0f} s: {params}"))


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ------------------------------------------------------------------------------- a study run


@dataclass
class StudyRun:
    study_name: str
    parent_run_id: str
    trials_before: int
    trials_after: int
    counts: dict[str, int]
    best_trial: Any | None
    worker_errors: list[str]


def check_options(
    *, trials: int, workers: int, sampler: str, pruner: str, pruner_startup_trials: int,
    pruner_warmup_steps: int | None, timeout: float | None, device: str, runs_per_gpu: int | None, seeds_per_process: int = 1,
) -> list[Any]:
    """ConfigError for any option out of range (before anything is written); the device slots
    of the workers (see benchmark.execution.devices)."""
    from benchmark.execution import devices
    from benchmark.training.control import resolve_device

    if trials < 1 or workers < 1:
        raise ConfigError(f"--trials and --workers must be >= 1, got {trials} and {workers}")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {timeout}")
    if sampler not in SAMPLERS or pruner not in PRUNERS:
        raise ConfigError(f"--sampler must be one of {', '.join(SAMPLERS)} and --pruner one of {', '.join(PRUNERS)}")
    if pruner_startup_trials < 0 or (pruner_warmup_steps is not None and pruner_warmup_steps < 0):
        raise ConfigError("--pruner-startup-trials and --pruner-warmup-steps must be >= 0")
    if isinstance(seeds_per_process, bool) or not isinstance(seeds_per_process, int) or seeds_per_process < 1:
        raise ConfigError(f"--seeds-per-process must be >= 1, got {seeds_per_process}")
    resolve_device(device)
    slots = devices.plan_slots(device, devices.visible_gpus(devices.gpu_count()) if device != "cpu" else [], runs_per_gpu, workers)
    if len(slots) < workers:
        raise ConfigError(f"--workers {workers} is more than the GPUs times --runs-per-gpu ({len(slots)} slots)")
    return slots[:workers]


def run_study(
    settings: StudySettings,
    *,
    study_name: str,
    storage_url: str,
    trials: int,
    workers: int,
    tracking_uri: str,
    results_dir: Path,
    sampler: str = "tpe",
    pruner: str = "median",
    pruner_startup_trials: int = 5,
    pruner_warmup_steps: int | None = None,
    timeout: float | None = None,
    device: str = "auto",
    runs_per_gpu: int | None = None,
    seeds_per_process: int = 1,
    console: Console | None = None,
) -> StudyRun:
    """Create ``study_name`` with ``settings``, or resume it (``settings`` are then the stored
    ones: see ``prepare``), and run ``trials`` more trials in ``workers`` processes, each
    training a trial's seeds ``seeds_per_process`` at a time as one batched model."""
    import optuna

    console = console or Console(stderr=True, soft_wrap=True, highlight=False)
    quiet_optuna()
    slots = check_options(
        trials=trials, workers=workers, sampler=sampler, pruner=pruner,
        pruner_startup_trials=pruner_startup_trials, pruner_warmup_steps=pruner_warmup_steps, timeout=timeout,
        device=device, runs_per_gpu=runs_per_gpu, seeds_per_process=seeds_per_process,
    )
    if seeds_per_process > 1 and agents.algorithm_class(settings.algo).seed_batch is None:
        console.print(f"{settings.algo} has no batched training of seeds: each trial trains its seeds one after another")
    storage = open_storage(storage_url)
    # (another machine may create the same study at this moment: the first setting stored wins)
    study = optuna.create_study(study_name=study_name, storage=storage, direction="maximize", load_if_exists=True)
    if not study.metric_names:  # optuna-dashboard names the objective by it
        study.set_metric_names([OBJECTIVE_NAME])
    if SETTINGS_ATTR not in study.user_attrs:
        study.set_user_attr(SETTINGS_ATTR, settings.to_dict())
        study.set_user_attr("created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if study_settings(optuna.load_study(study_name=study_name, storage=storage)) != settings:
        raise ConfigError(f"study {study_name!r} was just created elsewhere with another setting; run the command again to join it")
    optuna.storages.fail_stale_trials(study)
    trials_before = len(study.trials)

    experiment_name = f"tune-{study_name}"
    experiment = tracking.experiment_id(tracking_uri, experiment_name, results_dir / "mlartifacts")
    claims.directory(results_dir).mkdir(parents=True, exist_ok=True)
    with FileLock(claims.directory(results_dir) / f"study-{study_name}.lock", timeout=120):  # one parent run per study
        parent = _parent_run(tracking_uri, experiment, study_name, settings, storage_url)
    _close_orphaned_trials(tracking_uri, experiment, study)
    parent.set_tags({"sampler": sampler, "pruner": pruner, "workers": workers})  # the latest invocation's
    console.print(
        f"study {study_name!r}: {settings.algo} on {settings.env_id}, {trials} more trial(s) after {trials_before}, "
        f"{workers} worker(s), {settings.seeds_per_trial} seed(s) x {settings.budget.total_steps:,} steps per trial "
        + (f"({min(seeds_per_process, settings.seeds_per_trial)} at a time, batched) " if seeds_per_process > 1 else "")
        + f"(base: {settings.base_suite or 'published defaults'}); normalized by random {settings.random_score:.1f} "
        f"and reference {settings.reference_score:.1f}; storage {redact(storage_url)}; MLflow experiment {experiment_name!r}"
    )
    job = WorkerJob(
        study_name, storage_url, settings.to_dict(), tracking_uri, experiment, parent.run_id, sampler, pruner,
        pruner_startup_trials, pruner_warmup_steps, time.time() + timeout if timeout else None, seeds_per_process,
    )
    context = multiprocessing.get_context("spawn")
    tickets = context.Value("i", trials)
    running = [context.Value("q", -1) for _ in range(workers)]
    processes = [
        context.Process(target=work, args=(job, index, tickets, running[index], dataclasses.astuple(slots[index]), os.getpid()))
        for index in range(workers)
    ]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join()
    except BaseException as error:
        _ignore_further_stop_signals()
        _stop(processes)
        _fail_abandoned_trials(storage, study_name, processes, running)
        _close_orphaned_trials(tracking_uri, experiment, optuna.load_study(study_name=study_name, storage=storage))
        parent.fail(error)
        raise
    errors = [f"worker {index} exited with code {p.exitcode}" for index, p in enumerate(processes) if p.exitcode != 0]
    _fail_abandoned_trials(storage, study_name, processes, running)
    study = optuna.load_study(study_name=study_name, storage=storage)
    _close_orphaned_trials(tracking_uri, experiment, study)
    counts = {state.name: 0 for state in optuna.trial.TrialState}
    for trial in study.trials:
        counts[trial.state.name] += 1
    best = _best_trial(study)
    metrics = {f"trials_{state.lower()}": count for state, count in counts.items() if count}
    if best is not None:
        metrics.update({"best_value": best.value, "best_trial": best.number})
        parent.set_tags({"best_trial": best.number, "best_mlflow_run_id": best.user_attrs.get("mlflow_run_id", "")})
    parent.log_metrics(metrics, len(study.trials))
    parent.finish("FAILED" if errors else "FINISHED")
    return StudyRun(study_name, parent.run_id, trials_before, len(study.trials), counts, best, errors)


def _fail_abandoned_trials(storage: Any, study_name: str, processes: list[Any], running: list[Any]) -> None:
    """A worker that died inside a trial (killed, out of memory) left it RUNNING: mark it FAIL
    now rather than after the storage's heartbeat grace period (journal files have none)."""
    import optuna

    study_id = storage.get_study_id_from_name(study_name)
    for process, number in zip(processes, running):
        if process.exitcode not in (0, None) and number.value >= 0:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number.value)
            if storage.get_trial(trial_id).state == optuna.trial.TrialState.RUNNING:
                storage.set_trial_user_attr(trial_id, "error", f"its worker process died (exit code {process.exitcode})")
                storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)


def _best_trial(study: Any) -> Any | None:
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return max(complete, key=lambda t: t.value) if complete else None


def _stop(processes: list[Any], grace_seconds: float = 30.0) -> None:
    """SIGTERM every worker (its running trial is marked FAIL, its MLflow run KILLED), then kill stragglers."""
    started = [process for process in processes if process.pid is not None]
    for process in started:
        if process.is_alive():
            process.terminate()
    deadline = time.time() + grace_seconds
    for process in started:
        process.join(max(deadline - time.time(), 0.1))
        if process.is_alive():
            process.kill()
            process.join()


def _parent_run(tracking_uri: str, experiment: str, study_name: str, settings: StudySettings, storage_url: str) -> tracking.MlflowTracker:
    """The study's parent run in this tracking store: reopened if an earlier invocation made it."""
    client = tracking.client(tracking_uri)
    query = f"tags.kind = 'study' and tags.study = '{study_name}'"
    found = tracking.search_all_runs(client, experiment, query, ["attributes.start_time ASC"])
    if found:
        run_id = found[0].info.run_id
        tracking.retry(lambda: client.update_run(run_id, status="RUNNING"))
        parent = tracking.MlflowTracker(tracking_uri, run_id)
        parent.set_tags({"command": tracking.command_line(), "host": socket.gethostname(), "pid": os.getpid()})
        return parent
    parent = tracking.start_parent_run(tracking_uri, experiment, study_name, {"kind": "study", "study": study_name})
    params = {
        "algo": settings.algo, "env_id": settings.env_id, "seeds_per_trial": settings.seeds_per_trial,
        "base_suite": settings.base_suite, "random_score": settings.random_score, "reference_score": settings.reference_score,
        "storage": redact(storage_url), "seed": settings.seed,
        **{f"budget.{key}": value for key, value in dataclasses.asdict(settings.budget).items()},
        **{f"base.{key}": value for key, value in settings.base_hyperparameters.items()},
    }
    parent.log_params(params)
    parent.log_text(yaml.safe_dump(settings.space, sort_keys=False), "search_space.yaml")
    parent.set_tags({"reference_source": settings.reference_source[:5000]})
    return parent


def _close_orphaned_trials(tracking_uri: str, experiment: str, study: Any) -> None:
    """Trial runs left RUNNING in MLflow whose trial is no longer running (its worker died):
    marked KILLED with the trial's state."""
    client = tracking.client(tracking_uri)
    states = {trial.number: trial.state.name for trial in study.trials}
    query = f"tags.kind = 'trial' and tags.study = '{study.study_name}' and attributes.status = 'RUNNING'"
    for run in tracking.search_all_runs(client, experiment, query):
        state = states.get(int(run.data.tags.get("trial_number", -1)))
        if state is not None and state != "RUNNING":
            tracker = tracking.MlflowTracker(tracking_uri, run.info.run_id)
            tracker.set_tags({"trial_state": state})
            tracker.finish("KILLED")


# ------------------------------------------------------------------------------- show, export


def export_suite(study: Any, seeds: int, output: Path | None, force: bool = False) -> tuple[Path, Any]:
    """Write the best trial's setting as a suite (``suites/tuned/<algo>-<env>.yaml``) that
    ``make bench SUITE=tuned/<algo>-<env>`` runs over ``seeds`` seeds (0..seeds-1: none of
    them was used while tuning). The file is validated as a suite before it replaces anything."""
    settings = study_settings(study)
    best = _best_trial(study)
    if best is None:
        raise ConfigError(f"study {study.study_name!r} has no completed trial to export yet")
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    stem = f"{settings.algo}-{settings.env_id.replace('/', '-')}"
    output = output or TUNED_DIR / f"{stem}.yaml"
    if output.exists() and not force:
        raise ConfigError(f"{output} exists; pass --force to replace it, or --output PATH")
    overrides = best.user_attrs["overrides"]
    suite = {
        "name": f"tuned-{stem}",
        "description": (
            f"{settings.algo} on {settings.env_id} tuned by Optuna study {study.study_name!r}: trial {best.number} "
            f"of {len(study.trials)}, normalized score {best.value:.3f} over {settings.seeds_per_trial} seed(s) "
            f"at {settings.budget.total_steps:,} steps"
        ),
        "seeds": seeds,
        "budget": dataclasses.asdict(settings.budget),
        "experiments": [{"algo": settings.algo, "envs": [settings.env_id], "hyperparameters": overrides}],
    }
    header = (
        f"# exported by `python -m benchmark tune export {study.study_name}` on "
        f"{datetime.date.today().isoformat()}\n# base setting: {settings.base_suite or 'published defaults'}; "
        f"tuned: {', '.join(best.user_attrs.get('tuned', best.params))}\n"
    )
    text = header + yaml.safe_dump(suite, sort_keys=False, default_flow_style=None, width=1000)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.stem}.tmp.yaml")
    temporary.write_text(text)
    try:
        config.load_suite(str(temporary))
    except ConfigError:
        temporary.unlink()
        raise
    temporary.replace(output)
    return output, best


def importances(study: Any) -> dict[str, float] | None:
    """fANOVA parameter importances over the completed trials, seeded (the plot shows the same
    numbers); None with fewer than two, or when every completed trial scored the same."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return optuna.importance.get_param_importances(study, evaluator=_importance_evaluator())
        except RuntimeError:  # "zero total variance": nothing to attribute
            return None


def _importance_evaluator() -> Any:
    import optuna

    return optuna.importance.FanovaImportanceEvaluator(seed=0)


def write_plots(study: Any, directory: Path, with_importances: bool = True) -> list[Path]:
    """Optimization history, intermediate values and (``with_importances``) parameter
    importances as PNG files in ``directory``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as plots

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    drawings: dict[str, Any] = {
        "optimization_history": plots.plot_optimization_history, "intermediate_values": plots.plot_intermediate_values
    }
    if with_importances:
        drawings["param_importances"] = lambda study: plots.plot_param_importances(study, evaluator=_importance_evaluator())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, draw in drawings.items():
            axes = draw(study)
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            figure.set_size_inches(9, 5)
            figure.tight_layout()
            path = directory / f"{name}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            written.append(path)
    return written


def summary(study: Any, top: int = 10) -> dict[str, Any]:
    """The numbers ``tune show`` prints: the setting, counts by state, the best trials."""
    import optuna

    settings = study_settings(study)
    counts: dict[str, int] = {}
    for trial in study.trials:
        counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    complete = sorted(
        (t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value, reverse=True
    )
    return {"settings": settings, "counts": counts, "best": complete[:top]}

