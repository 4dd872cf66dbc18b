"""One run's part of the training loop (``benchmark.training.loop``): its envs, algorithm,
counters, evaluations and checkpoints; the loop acts for it (alone or with the other seeds of
a batch) and hands it what its envs must step."""

from __future__ import annotations

import dataclasses
import pickle
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import agents
from agents.api import Acted, Algorithm, Transitions
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
from benchmark.training.control import Counters, Preempted, ResumeError, SeedOutcome, check_finite, finish, seed_everything
from benchmark.training.evaluate import EVAL_SEED_OFFSET, evaluate
from benchmark.training.hooks import LoopHooks
from benchmark.training.results import NullTracker, RunResult, SeedJob, Tracker


class SeedRun(SeedOutcome):
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
        self.cpu_started = 0.0
        seed_everything(spec.seed)
        config = self.config = agents.resolve_config(spec.algo, spec.hyperparameters)
        self.run_dir = checkpoint.run_directory(checkpoint_dir, spec.run_key) if checkpoint_dir is not None else None
        if self.run_dir is not None:
            checkpoint.remove_partial_writes(self.run_dir)
        self.train_envs = self.open_train_envs()
        self.eval_envs = make_vector_env(
            spec.env,
            spec.budget.eval_episodes,
            normalize_observations=config.normalize_observations,
            clip_observations=config.clip_observations,
        )
        freeze_normalization(self.eval_envs)
        self.algo = hooks.algorithm(agents.make(spec.algo, env_spec(spec.env), config, total_steps=spec.budget.total_steps, device=device, seed=spec.seed))
        if job.resume is not None:
            try:
                self.restore(job.resume)
            except (KeyError, ValueError, RuntimeError, TypeError) as error:
                self.error = ResumeError(f"cannot resume {spec.label} from its checkpoint: {type(error).__name__}: {error}")
                self.error.__cause__ = error
        elif spec.continued_from is not None:
            try:
                self.continue_run(checkpoint_dir)
            except (OSError, EOFError, KeyError, ValueError, RuntimeError, TypeError, pickle.UnpicklingError) as error:
                self.error = ResumeError(f"cannot continue run {spec.continued_from} as {spec.label}: {type(error).__name__}: {error}")
                self.error.__cause__ = error
        else:
            self.start()

    #: whether the loop acts for this run and hands it the actions (``collect``); a run whose
    #: workers act (``DistributedRun``) collects a round itself (``collect_round``)
    acts_here = True

    def open_train_envs(self) -> gym.vector.VectorEnv | None:
        config, spec = self.config, self.spec
        return self.hooks.train_envs(
            make_vector_env(
                spec.env,
                config.num_envs,
                normalize_observations=config.normalize_observations,
                normalize_rewards=config.normalize_rewards,
                gamma=config.gamma,
                clip_observations=config.clip_observations,
                clip_rewards=config.clip_rewards,
            )
        )

    def start(self, reset_seed: int | None = None) -> None:
        """A new run: its envs' first observations (reset with the run's seed unless given)."""
        assert self.train_envs is not None
        self.obs, _ = self.train_envs.reset(seed=self.spec.seed if reset_seed is None else reset_seed)
        self.obs_tensor = torch.as_tensor(self.obs, dtype=torch.float32, device=self.device)

    def continue_run(self, checkpoint_dir: Path | None) -> None:
        """Start where the finished run ``spec.continued_from`` ended (its ``final.pt``): its
        algorithm, its normalization statistics and its last env step; new episodes (the
        episodes it was in end there as truncated), its replay buffer refilled before updating."""
        if checkpoint_dir is None:
            raise ValueError("continuing a run needs the checkpoint directory that holds its final.pt")
        path = checkpoint.run_directory(checkpoint_dir, str(self.spec.continued_from)) / checkpoint.FINAL
        if not path.is_file():
            raise FileNotFoundError(f"no final checkpoint {path}: the run did not finish here, or its checkpoints were removed")
        payload = checkpoint.load(path)
        step = checkpoint.continue_learner(payload, self.algo, self.counters, self.spec)
        self.load_final_envs(payload, step)

    def load_final_envs(self, payload: dict[str, Any], step: int) -> None:
        """A continued run's envs: the normalization statistics as the run ended, new episodes."""
        assert self.train_envs is not None
        statistics = {name: {key: value.numpy() for key, value in stats.items()} for name, stats in payload["normalization"].items()}
        load_normalization_state(self.train_envs, statistics)
        self.start(reset_seed=self.spec.seed + step)
        # the episodes it was in end at its last observations (final checkpoints before continuation
        # held none: the first new ones stand in, bootstrapping one truncated step from them)
        last = payload.get("obs")
        last_obs = self.obs_tensor if last is None else torch.as_tensor(last, dtype=torch.float32, device=self.device)
        self.algo.interrupt_episodes(last_obs, checkpoint.to_device(payload.get("recurrent_state"), self.device))

    def restore(self, payload: dict[str, Any]) -> None:
        """Continue from a ``latest.pt`` payload."""
        assert self.train_envs is not None
        self.obs, self.state = _restore(payload, self.algo, self.train_envs, self.counters, self.result, self.spec, self.device)
        self.obs_tensor = torch.as_tensor(self.obs, dtype=torch.float32, device=self.device)

    def start_clock(self) -> None:
        """Wall time before a resume counts."""
        self.started = time.perf_counter() - self.counters.train_seconds - self.counters.eval_seconds
        self.cpu_started = time.process_time() - self.counters.cpu_seconds

    def collect(self, acted: Acted) -> None:
        """Step this seed's envs with ``acted``, store the transitions, log ended episodes."""
        algo, device = self.algo, self.device
        assert self.train_envs is not None
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
                terminated=torch.as_tensor(terminated),  # flags stay on the host: reading them syncs nothing
                truncated=torch.as_tensor(truncated),
            )
        )
        self.obs, self.obs_tensor = next_obs, next_obs_tensor
        self.counters.step += self.config.num_envs
        self.log_episodes(infos)

    def collect_round(self) -> None:
        """Where workers act (``DistributedRun``): their next round of steps, observed."""
        raise NotImplementedError(f"the loop acts for {self.spec.label}")

    def _log_episodes(self, infos: dict[str, Any]) -> None:
        for episode_return, episode_length in finished_episodes(infos):
            self.tracker.log_metrics({metric_names.TRAIN_EPISODE_RETURN: episode_return, metric_names.TRAIN_EPISODE_LENGTH: episode_length}, self.counters.step)
            self.counters.record_episode(episode_return)

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
        speed = (step - counters.first_step) / max(counters.train_seconds, 1e-9)
        self.tracker.log_metrics({**losses, metric_names.STEPS_PER_SECOND: speed}, step)
        counters.update_logs.clear()
        eval_started = time.perf_counter()
        with self.hooks.evaluating():
            evaluation = evaluate(self.algo, self.eval_envs, self.train_envs or self.eval_envs, self.spec.seed + EVAL_SEED_OFFSET, self.device, step)
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
        counters.cpu_seconds = time.process_time() - self.cpu_started
        payload = {
            "format": checkpoint.FORMAT,
            "spec": spec.to_dict(),
            "metadata": dict(self.job.checkpoint_metadata or {}),
            "loop": dataclasses.asdict(counters),
            "evaluations": [dataclasses.asdict(evaluation) for evaluation in self.result.evaluations],
            "recurrent_state": checkpoint.to_cpu(self.state),
            "algorithm": checkpoint.own_storage(algo.state_dict()),
            "replay": algo.replay_state_dict() if spec.checkpoint_replay_buffer else None,
            **self.envs_payload(),
            "rng": checkpoint.rng_state(),
        }
        # whether resuming from here continues exactly as if never stopped
        payload["exact"] = payload["exact_envs"] and (spec.checkpoint_replay_buffer or not algo.has_replay_buffer)
        return checkpoint.write_atomic(payload, self.run_dir / checkpoint.LATEST)

    def envs_payload(self) -> dict[str, Any]:
        """What a checkpoint holds of the training envs; ``exact_envs``: whether their state was captured."""
        assert self.train_envs is not None
        env_state = vector_env_state(self.train_envs)
        return {
            "obs": torch.as_tensor(self.obs),
            "envs": env_state,
            "exact_envs": env_state is not None,
            "normalization": checkpoint.normalization_tensors(self.train_envs),
        }

    def preempt(self) -> None:
        where = f"; checkpoint {self.save()}" if self.run_dir is not None else ""
        raise Preempted(f"stopped by SIGTERM at env step {self.counters.step}{where}")

    def finish(self, remove_latest_on_finish: bool) -> None:
        final = checkpoint.policy_payload(self.algo, self.train_envs, self.spec)
        final["algorithm"] = checkpoint.own_storage(final["algorithm"])
        final["step"] = self.counters.step
        if self.acts_here:  # the last observations, where a continued run ends these episodes
            final.update(obs=torch.as_tensor(self.obs), recurrent_state=checkpoint.to_cpu(self.state))
        finish(self.result, self.counters, self.started, self.tracker, self.run_dir, final, remove_latest_on_finish, self.cpu_started)

    def close(self) -> None:
        for envs in ("train_envs", "eval_envs"):
            if getattr(self, envs, None) is not None:
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
