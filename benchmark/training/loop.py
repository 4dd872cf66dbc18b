"""One training run, or a batch of runs that differ only by seed, in this process:
seed everything, build envs and the algorithm, collect -> update -> evaluate -> checkpoint.

    for each env step (every seed of a batch at once):
        act with the behavior policy; step each seed's envs; observe the transitions
        when the algorithm is ready: update (one batched update for a batch of seeds)
        every eval_every env steps and at the end: evaluate deterministically
        every checkpoint_interval env steps and on SIGTERM: write latest.pt

The loop talks to the algorithm only through its interface (act, observe, ready_to_update,
update, state_dict), so every algorithm in the registry trains here unchanged; meta-learners
train in ``benchmark.training.meta_loop``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import agents
from agents.api import Acted, Algorithm, ConfigError, Transitions
from agents.env_state import load_vector_env_state, vector_env_state
from agents.envs import (
    env_spec,
    finished_episodes,
    freeze_normalization,
    load_normalization_state,
    make_vector_env,
    true_next_obs,
)
from benchmark import metric_names
from benchmark.config import RunSpec
from benchmark.training import checkpoint
from benchmark.training.control import (
    Counters,
    Preempted,
    ResumeError,
    SeedOutcome,
    StopSignal,
    check_finite,
    finish,
    resolve_device,
    seed_everything,
    share_first_error,
    train_runs,
)
from benchmark.training.evaluate import EVAL_SEED_OFFSET, evaluate
from benchmark.training.hooks import NO_HOOKS, LoopHooks
from benchmark.training.meta_loop import run_meta, run_meta_seeds
from benchmark.training.results import EvaluationCallback, NullTracker, ProgressCallback, RunResult, SeedJob, Tracker


def run(
    spec: RunSpec,
    tracker: Tracker | None = None,
    progress: ProgressCallback | None = None,
    checkpoint_dir: Path | None = None,
    resume: dict[str, Any] | None = None,
    checkpoint_metadata: dict[str, Any] | None = None,
    remove_latest_on_finish: bool = True,
    on_evaluation: EvaluationCallback | None = None,
    hooks: LoopHooks = NO_HOOKS,
) -> RunResult:
    """Train ``spec`` to its budget, evaluating every ``eval_every`` steps and at the end.

    With ``checkpoint_dir``, ``<dir>/<run_key>/latest.pt`` is rewritten every
    ``spec.checkpoint_interval`` env steps and when SIGTERM arrives (the run then raises
    ``Preempted``); ``final.pt`` is written at the end. ``resume`` is such a checkpoint's
    payload: training continues from its step with every state restored (networks, optimizers,
    normalization, counters, RNGs, the envs' episodes where ``agents.env_state`` can capture
    them, the replay buffer when it was saved). ``checkpoint_metadata`` is stored in each
    checkpoint (the runner keeps the MLflow run id there). ``remove_latest_on_finish=False``
    leaves ``latest.pt`` for the caller to remove once it has recorded the finished run.
    ``on_evaluation`` sees each evaluation once it is logged (a tuner reports it to its pruner
    and may raise to stop the run there). ``hooks`` instrument the loop's parts (the perf
    harness). A meta-learner trains in ``benchmark.training.meta_loop`` instead, with the same
    arguments and result.
    """
    if agents.is_meta(spec.algo):
        return run_meta(spec, tracker or NullTracker(), progress, checkpoint_dir, resume, checkpoint_metadata, remove_latest_on_finish, on_evaluation, hooks)
    outcome = run_seeds(
        [SeedJob(spec, tracker, progress, resume, checkpoint_metadata, on_evaluation)], checkpoint_dir, remove_latest_on_finish, batched=False, hooks=hooks
    )[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def batch_key(spec: RunSpec) -> str:
    """What the runs of one batch share: the spec without its seed (two specs with equal keys
    differ only by seed)."""
    data = spec.to_dict()
    for name in ("seed", "run_key"):
        data.pop(name)
    return json.dumps(data, sort_keys=True, default=str)


def batchable(spec: RunSpec) -> str | None:
    """Why ``spec`` cannot train in a batch of seeds, or None when it can."""
    cls = agents.algorithm_class(spec.algo)
    if cls.seed_batch is None:
        return f"{spec.algo} has no batched training of seeds (it has: {', '.join(sorted(n for n, c in agents.ALGORITHMS.items() if c.seed_batch))})"
    return None


def run_seeds(
    jobs: list[SeedJob],
    checkpoint_dir: Path | None = None,
    remove_latest_on_finish: bool = True,
    batched: bool = True,
    stop_together: bool = False,
    hooks: LoopHooks = NO_HOOKS,
) -> list[RunResult | BaseException]:
    """Train runs that differ only by seed in this process, as ``run`` trains each: with
    ``batched``, as one batched model (``agents.algos.seeds.SeedBatch``), each seed with its own
    envs, evaluations, checkpoints and tracker. Returns each run's result, or the exception
    that ended it: a run that diverges (non-finite losses), whose evaluation callback raises,
    or whose envs fail ends alone, and the others go on; with ``stop_together`` (a tuning
    trial, which one failed or pruned seed ends) the others end there with the same exception.
    Resumed runs must be at one step. Meta-learners train in ``meta_loop.run_meta_seeds``.
    """
    if batched:
        keys = {batch_key(job.spec) for job in jobs}
        if len(keys) != 1:
            raise ConfigError("the runs of a batch must differ only by seed")
        reason = batchable(jobs[0].spec)
        if reason:
            raise ConfigError(f"cannot train seeds of {jobs[0].spec.algo} batched: {reason}")
    elif len(jobs) != 1:
        raise ValueError("unbatched, run_seeds trains one run")
    spec = jobs[0].spec
    if agents.is_meta(spec.algo):
        return run_meta_seeds(jobs, checkpoint_dir, remove_latest_on_finish, batched, stop_together, hooks)
    torch.set_num_threads(spec.torch_threads)
    device = resolve_device(spec.device)
    return train_runs(
        jobs,
        lambda job: _SeedRun(job, device, checkpoint_dir, hooks),
        lambda seed: seed.counters.step,
        "steps",
        lambda seeds: _train(seeds, batched, stop_together),
        remove_latest_on_finish,
    )


class _Alone:
    """One algorithm (any: recurrent, offline) behind the interface of a seed batch."""

    def __init__(self, seed: _SeedRun):
        self.seed, self.algo = seed, seed.algo

    def act(self, obs: list[torch.Tensor], states: list[Any]) -> list[Acted]:
        return [self.algo.behavior_act(obs[0], states[0])]

    def ready_to_update(self) -> bool:
        return self.algo.ready_to_update()

    def update(self) -> list[dict[str, float]]:
        return [self.algo.update()]

    def sync_members(self) -> None:
        pass


def _learner(seeds: list[_SeedRun], batched: bool) -> Any:
    if not batched:
        return _Alone(seeds[0])
    members = [seed.algo for seed in seeds]
    return type(members[0]).seed_batch(members)


def _train(seeds: list[_SeedRun], batched: bool, stop_together: bool = False) -> None:
    """The loop: act for every running seed at once, step each seed's envs, update all at once;
    then each seed's evaluations, progress, checkpoints. A seed that fails leaves the batch
    (with ``stop_together``, every seed leaves with it)."""
    running = [seed for seed in seeds if seed.error is None]
    if not running:
        return
    learner = _learner(running, batched)
    collects = running[0].algo.collects_experience
    for seed in running:
        seed.start_clock()
    with StopSignal() as stop:
        while running:
            if collects:
                for seed, acted in zip(running, learner.act([seed.obs_tensor for seed in running], [seed.state for seed in running]), strict=True):
                    seed.guard(seed.collect, acted)
            else:
                for seed in running:
                    seed.counters.step += seed.algo.samples_per_update
            if learner.ready_to_update():
                for seed, logs in zip(running, learner.update(), strict=True):
                    if seed.error is None:
                        seed.guard(seed.record_update, logs)
            evaluating = [seed for seed in running if seed.error is None and seed.evaluation_due()]
            if evaluating:  # members act with views of the batch's parameters: nothing to copy first
                eval_seconds = sum(seed.evaluate_now() for seed in evaluating)
                for seed in running:  # time spent on any seed's evaluation is time none trained
                    seed.counters.eval_seconds += eval_seconds
                for seed in evaluating:
                    seed.guard(seed.after_evaluation)
            for seed in running:
                if seed.error is None:
                    seed.guard(seed.report_progress)
            if stop_together:
                share_first_error(running)
            if any(seed.error is None and seed.counters.step >= seed.spec.budget.total_steps for seed in running):
                break
            due = [seed for seed in running if seed.error is None and seed.checkpoint_due()]
            if due:
                learner.sync_members()
                for seed in due:
                    seed.guard(seed.save)
            if stop.received:
                learner.sync_members()
                for seed in running:
                    if seed.error is None:
                        seed.guard(seed.preempt)
            if stop_together:
                share_first_error(running)
            still = [seed for seed in running if seed.error is None]
            if len(still) < len(running):
                learner.sync_members()
                running = still
                if running:
                    learner = _learner(running, batched)
    if running:
        learner.sync_members()


class _SeedRun(SeedOutcome):
    """One run's part of the loop: its envs, algorithm, counters, evaluations and checkpoints."""

    def __init__(self, job: SeedJob, device: torch.device, checkpoint_dir: Path | None, hooks: LoopHooks):
        spec = self.spec = job.spec
        self.job, self.device = job, device
        self.tracker: Tracker = job.tracker or NullTracker()
        self.error: BaseException | None = None
        self.result = RunResult(spec, device=str(device))
        self.counters = Counters(next_eval=spec.budget.eval_every, next_checkpoint=spec.checkpoint_interval)
        self.hooks = hooks
        self.log_episodes = hooks.logging(self._log_episodes)
        self.check_finite = hooks.logging(check_finite)
        self.state: Any = None
        self.started = 0.0
        seed_everything(spec.seed)
        config = self.config = agents.resolve_config(spec.algo, spec.hyperparameters)
        self.run_dir = checkpoint.run_directory(checkpoint_dir, spec.run_key) if checkpoint_dir is not None else None
        if self.run_dir is not None:
            checkpoint.remove_partial_writes(self.run_dir)
        self.train_envs = hooks.train_envs(
            make_vector_env(
                spec.env_id,
                config.num_envs,
                normalize_observations=config.normalize_observations,
                normalize_rewards=config.normalize_rewards,
                gamma=config.gamma,
                clip_observations=config.clip_observations,
                clip_rewards=config.clip_rewards,
            )
        )
        self.eval_envs = make_vector_env(
            spec.env_id,
            spec.budget.eval_episodes,
            normalize_observations=config.normalize_observations,
            clip_observations=config.clip_observations,
        )
        freeze_normalization(self.eval_envs)
        self.algo = hooks.algorithm(agents.make(spec.algo, env_spec(spec.env_id), config, total_steps=spec.budget.total_steps, device=device, seed=spec.seed))
        if job.resume is None:
            self.obs, _ = self.train_envs.reset(seed=spec.seed)
        else:
            try:
                self.obs, self.state = _restore(job.resume, self.algo, self.train_envs, self.counters, self.result, spec, device)
            except (KeyError, ValueError, RuntimeError, TypeError) as error:
                self.error = ResumeError(f"cannot resume {spec.label} from its checkpoint: {type(error).__name__}: {error}")
                self.error.__cause__ = error
                return
        self.obs_tensor = torch.as_tensor(self.obs, dtype=torch.float32, device=device)

    def start_clock(self) -> None:
        """Wall time before a resume counts."""
        self.started = time.perf_counter() - self.counters.train_seconds - self.counters.eval_seconds

    def collect(self, acted: Acted) -> None:
        """Step this seed's envs with ``acted``, store the transitions, log ended episodes."""
        algo, device = self.algo, self.device
        next_obs, rewards, terminated, truncated, infos = self.train_envs.step(acted.env_actions)
        next_obs_tensor = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
        if acted.state is not None:
            self.state = algo.reset_state(acted.state, torch.as_tensor(terminated | truncated, device=device))
        else:
            self.state = None
        # where an episode ended, the stored next observation is its final one, not the reset one
        final_obs = true_next_obs(next_obs, infos)
        algo.observe(
            Transitions(
                obs=self.obs_tensor,
                acted=acted,
                rewards=torch.as_tensor(rewards, dtype=torch.float32, device=device),
                next_obs=next_obs_tensor if final_obs is next_obs else torch.as_tensor(final_obs, dtype=torch.float32, device=device),
                terminated=torch.as_tensor(terminated, device=device),
                truncated=torch.as_tensor(truncated, device=device),
            )
        )
        self.obs, self.obs_tensor = next_obs, next_obs_tensor
        self.counters.step += self.config.num_envs
        self.log_episodes(infos)

    def _log_episodes(self, infos: dict[str, Any]) -> None:
        for episode_return, episode_length in finished_episodes(infos):
            self.tracker.log_metrics({metric_names.TRAIN_EPISODE_RETURN: episode_return, metric_names.TRAIN_EPISODE_LENGTH: episode_length}, self.counters.step)
            self.counters.train_return_sum += episode_return
            self.counters.train_episodes += 1

    def record_update(self, logs: dict[str, float]) -> None:
        self.check_finite(logs, self.counters.step)
        for key, value in logs.items():
            self.counters.update_logs.setdefault(key, []).append(value)

    def evaluation_due(self) -> bool:
        return self.counters.step >= self.counters.next_eval or self.counters.step >= self.spec.budget.total_steps

    def evaluate_now(self) -> float:
        """Log the losses and evaluate; the seconds the evaluation took."""
        counters, step = self.counters, self.counters.step
        counters.train_seconds = time.perf_counter() - self.started - counters.eval_seconds
        losses = {f"train/{key}": float(np.mean(values)) for key, values in counters.update_logs.items()}
        self.tracker.log_metrics({**losses, metric_names.STEPS_PER_SECOND: step / max(counters.train_seconds, 1e-9)}, step)
        counters.update_logs.clear()
        eval_started = time.perf_counter()
        with self.hooks.evaluating():
            evaluation = evaluate(self.algo, self.eval_envs, self.train_envs, self.spec.seed + EVAL_SEED_OFFSET, self.device, step)
        if counters.train_episodes:
            evaluation.train_return_mean = counters.train_return_sum / counters.train_episodes
            evaluation.train_episodes = counters.train_episodes
        counters.train_return_sum, counters.train_episodes = 0.0, 0
        self.result.evaluations.append(evaluation)
        self.tracker.log_metrics(
            {
                metric_names.EVAL_RETURN_MEAN: evaluation.mean,
                metric_names.EVAL_RETURN_STD: evaluation.std,
                metric_names.EVAL_LENGTH_MEAN: float(np.mean(evaluation.lengths)),
                **({metric_names.TRAIN_RETURN: evaluation.train_return_mean} if evaluation.train_return_mean is not None else {}),  # set with train_episodes
            },
            step,
        )
        counters.next_eval += self.spec.budget.eval_every
        self.tracker.flush()
        return time.perf_counter() - eval_started

    def after_evaluation(self) -> None:
        if self.job.on_evaluation is not None:
            self.job.on_evaluation(self.result.evaluations[-1])

    def report_progress(self) -> None:
        counters, total = self.counters, self.spec.budget.total_steps
        if self.job.progress is not None and (counters.step >= counters.next_progress or counters.step >= total):
            self.job.progress(counters.step, total, self.result.evaluations[-1].mean if self.result.evaluations else None)
            counters.next_progress = counters.step + max(total // 100, 1)

    def checkpoint_due(self) -> bool:
        interval = self.spec.checkpoint_interval
        if self.run_dir is not None and interval and self.counters.step >= self.counters.next_checkpoint:
            self.counters.next_checkpoint = self.counters.step + interval
            return True
        return False

    def save(self) -> Path:
        """Flush the metrics first: everything logged up to this step is stored before the
        checkpoint that a resume starts from exists."""
        assert self.run_dir is not None
        spec, algo, counters = self.spec, self.algo, self.counters
        self.tracker.flush()
        counters.train_seconds = time.perf_counter() - self.started - counters.eval_seconds
        env_state = vector_env_state(self.train_envs)
        payload = {
            "format": checkpoint.FORMAT,
            "spec": spec.to_dict(),
            "metadata": dict(self.job.checkpoint_metadata or {}),
            "loop": dataclasses.asdict(counters),
            "evaluations": [dataclasses.asdict(evaluation) for evaluation in self.result.evaluations],
            "obs": torch.as_tensor(self.obs),
            "recurrent_state": checkpoint.to_cpu(self.state),
            "algorithm": checkpoint.own_storage(algo.state_dict()),
            "replay": algo.replay_state_dict() if spec.checkpoint_replay_buffer else None,
            "envs": env_state,
            # whether resuming from here continues exactly as if never stopped
            "exact": env_state is not None and (spec.checkpoint_replay_buffer or not algo.has_replay_buffer),
            "normalization": checkpoint.normalization_tensors(self.train_envs),
            "rng": checkpoint.rng_state(),
        }
        return checkpoint.write_atomic(payload, self.run_dir / checkpoint.LATEST)

    def preempt(self) -> None:
        where = f"; checkpoint {self.save()}" if self.run_dir is not None else ""
        raise Preempted(f"stopped by SIGTERM at env step {self.counters.step}{where}")

    def finish(self, remove_latest_on_finish: bool) -> None:
        final = checkpoint.policy_payload(self.algo, self.train_envs, self.spec)
        final["algorithm"] = checkpoint.own_storage(final["algorithm"])
        finish(self.result, self.counters, self.started, self.tracker, self.run_dir, final, remove_latest_on_finish)

    def close(self) -> None:
        for envs in ("train_envs", "eval_envs"):
            if hasattr(self, envs):
                getattr(self, envs).close()


def _restore(
    payload: dict[str, Any],
    algo: Algorithm,
    train_envs: gym.vector.VectorEnv,
    counters: Counters,
    result: RunResult,
    spec: RunSpec,
    device: torch.device,
) -> tuple[np.ndarray, Any]:
    """Load a ``latest.pt`` payload into a freshly built run; the observation and recurrent
    state to act from next."""
    checkpoint.restore_learner(payload, algo, counters, result, spec)
    obs, state = payload["obs"].numpy(), checkpoint.to_device(payload["recurrent_state"], device)
    if payload["envs"] is not None:
        load_vector_env_state(train_envs, payload["envs"])
    else:
        # the envs' state could not be saved: restart their episodes, the old ones end as truncated
        statistics = {name: {key: value.numpy() for key, value in stats.items()} for name, stats in payload["normalization"].items()}
        load_normalization_state(train_envs, statistics)
        algo.interrupt_episodes(torch.as_tensor(obs, dtype=torch.float32, device=device), state)
        obs, _ = train_envs.reset(seed=spec.seed + counters.step)
        state = None
    checkpoint.set_rng_state(payload["rng"])
    return obs, state
