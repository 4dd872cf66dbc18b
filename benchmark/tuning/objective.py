"""One trial: sample hyperparameters from the search space, train the trial's seeds (batched
when asked), report the running normalized score to the pruner, and return the mean
normalized final score; plus the samplers and pruners that drive the trials."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import agents
from agents.envs import env_spec
from agents.errors import ConfigError
from benchmark import tracking
from benchmark.config import RunSpec
from benchmark.tuning.search_space import SearchSpace
from benchmark.tuning.settings import PRUNERS, SAMPLERS, StudySettings
from benchmark.tuning.storage import quiet_optuna


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
    announce: Callable[[int], None] | None = None
    """Called with the trial's number when it starts (the launch fails it if the worker dies)."""
    seeds_per_process: int = 1
    """The trial's seeds trained at once, as one batched model (1: one after another)."""

    def __call__(self, trial: Any) -> float:
        import optuna

        from benchmark.training.control import Preempted

        settings = self.settings
        if self.announce is not None:
            self.announce(trial.number)
        try:
            sampled = self.space.sample(trial)
        except ValueError as error:  # e.g. a distribution that contradicts earlier trials' (edited storage)
            trial.set_user_attr("error", f"cannot sample: {error}"[:2000])
            raise TrialFailed(f"cannot sample: {error}") from error
        tuned = {name: value for name, value in sampled.items() if name not in self.space.fixed}
        overrides = {**settings.base_hyperparameters, **sampled}
        seeds = settings.trial_seeds(trial.number)
        tags = {
            "kind": "trial",
            "study": self.study_name,
            "trial_number": trial.number,
            "algo": settings.algo,
            "env_id": settings.env_id,
            "seeds": " ".join(map(str, seeds)),
            "trial_state": "RUNNING",
            "seeds_per_process": self.seeds_per_process,
            "host": socket.gethostname(),
            "pid": os.getpid(),  # where it trains
        }
        params = {f"tuned.{name}": value for name, value in tuned.items()}
        params.update({f"budget.{key}": value for key, value in dataclasses.asdict(settings.budget).items()})
        infeasible: ConfigError | None
        try:
            hyperparameters = agents.resolve_config(settings.algo, overrides)
            agents.check_config(settings.algo, hyperparameters, env_spec(settings.env))
        except ConfigError as error:
            hyperparameters = None
            infeasible = error
        else:
            infeasible = None
            assert hyperparameters is not None  # resolved in the try
            params.update({f"hp.{key}": value for key, value in hyperparameters.to_dict().items()})
        run = tracking.start_child_run(self.tracking_uri, self.experiment_id, self.parent_run_id, f"trial-{trial.number}", tags, params)
        trial.set_user_attr("mlflow_run_id", run.run_id)
        trial.set_user_attr("overrides", overrides)
        trial.set_user_attr("tuned", tuned)
        for name, value in tuned.items():  # a layer stack ([width] * depth), one attribute each: optuna-dashboard lists them
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
            ignore_further_stop_signals()
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
        self,
        trial: Any,
        run: tracking.MlflowTracker,
        hyperparameters: dict[str, Any],
        overrides: dict[str, Any],
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
            return RunSpec(
                f"tune-{self.study_name}",
                settings.algo,
                settings.env_id,
                seed,
                hyperparameters,
                settings.budget,
                self.device,
                1,
                overrides,
                env_kwargs=settings.env_kwargs,
                wrappers=settings.wrappers,
            )

        per_process = min(self.seeds_per_process, len(seeds))
        unbatchable = training_loop.batchable(spec_of(seeds[0])) if per_process > 1 else None
        if unbatchable:  # (this trial's sampled setting, say a recurrent policy)
            run.set_tags({"not_batched": unbatchable})
            per_process = 1
        for first in range(0, len(seeds), per_process):
            group = seeds[first : first + per_process]
            report = _RoundReporter(trial, run, settings, finals, first, len(group), last=first + len(group) == len(seeds))
            jobs = [training_loop.SeedJob(spec_of(seed), _SeedTracker(run, seed), on_evaluation=report.callback(seed)) for seed in group]
            if len(jobs) == 1:
                outcomes = [training_loop.run(jobs[0].spec, jobs[0].tracker, on_evaluation=jobs[0].on_evaluation)]
            else:
                attempts = training_loop.run_seeds(jobs, stop_together=True)
                for attempt in attempts:
                    if isinstance(attempt, BaseException):
                        raise attempt
                outcomes = [attempt for attempt in attempts if not isinstance(attempt, BaseException)]  # all of them, by now
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

    def __init__(self, trial: Any, run: tracking.MlflowTracker, settings: StudySettings, finals: list[float], first: int, size: int, last: bool):
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
        return optuna.samplers.CmaEsSampler(seed=seed, independent_sampler=optuna.samplers.TPESampler(seed=seed), warn_independent_sampling=False)
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
        return optuna.pruners.HyperbandPruner(min_resource=settings.budget.eval_every, max_resource=settings.seeds_per_trial * settings.budget.total_steps)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ConfigError(f"unknown pruner {name!r}; use {', '.join(PRUNERS)}")


def sampler_seed(seed: int, trial_number: int, worker: int, host: str = "") -> int:
    """The sampler seed of the trial about to start: a function of the study seed, the number
    the trial will get, the worker and ``host``, so that the same command draws the same
    trials, a resumed study does not draw its first trials again, and workers that start
    trials at the same time draw different ones. ``host`` is the host name for storages that
    other machines can join (their worker 0 would otherwise draw what ours does), and empty
    for SQLite, so that a local study repeats exactly anywhere."""
    text = f"{seed}/{trial_number}/{worker}/{host}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


class Interrupted(KeyboardInterrupt):
    """SIGTERM in a worker: stop like Ctrl-C (the running trial is marked FAIL, its MLflow run KILLED)."""


def raise_interrupt(signum: int, frame: Any) -> None:
    ignore_further_stop_signals()
    raise Interrupted()


def ignore_further_stop_signals() -> None:
    """Once stopping, a second SIGTERM (the process group's and the parent's) or Ctrl-C must
    not interrupt the cleanup that marks the trial and its run (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
