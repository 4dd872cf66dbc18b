"""Experience collected by several workers for one learner: the collection part of the seeds'
distributed scheme, synchronous (issue 29 in progress: gradient workers, the asynchronous mode,
the suite key and the runner's integration come next).

    learner: the algorithm (observe, update) and its evaluations
    collector c = 0 .. C-1: a copy of the policy and k envs, the sub-envs c*k .. c*k+k-1 of
        the run's C*k (seeded as those sub-envs of one process's run: seed + c*k + j)

    every rollout (synchronous):
        the learner sends its weights and its generator's state to every collector
        each collector steps its envs for the rollout: it acts on a batch of C*k observations
            (its own rows, zeros elsewhere) from that state, so every step draws the noise of
            all C*k envs, as one process would, and its rows get exactly that process's actions
        the learner observes the collectors' steps joined along the env axis, takes on the
        generator state the collectors ended in (all the same) and updates

So C collectors of k envs train exactly as one process with C*k envs (tested): acting on the
whole batch costs each collector C times one process's share of forward passes, small next to
stepping its envs. Observation and reward normalization are not distributed yet (each
collector's running statistics would be its own): refused.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

import agents
from agents.api import Acted, Algorithm, ConfigError, Transitions
from agents.envs import env_spec, finished_episodes, make_vector_env, true_next_obs
from benchmark import metric_names
from benchmark.config import RunSpec
from benchmark.training.control import Counters, check_finite, finish, seed_everything
from benchmark.training.evaluate import EVAL_SEED_OFFSET, evaluate
from benchmark.training.results import NullTracker, RunResult, Tracker


@dataclass
class Collected:
    """A collector's rollout: per step, its rows of what one process would observe; the
    episodes that ended (return, length, step index); the generator state it ended in."""

    steps: list[Transitions]
    episodes: list[tuple[float, int, int]] = field(default_factory=list)
    generator_state: torch.Tensor | None = None


class Collector:
    """One collection worker of a run: its envs and a policy copy (run it in-process, or as a
    Ray actor: ``ray.remote(Collector)``)."""

    def __init__(self, spec: RunSpec, index: int, collectors: int):
        config = agents.resolve_config(spec.algo, spec.hyperparameters)
        if getattr(config, "normalize_observations", False) or getattr(config, "normalize_rewards", False):
            raise ConfigError(f"{spec.algo}: distributed collection does not normalize observations or rewards yet (set both to false)")
        if getattr(config, "recurrent", "none") != "none":
            raise ConfigError(f"{spec.algo}: distributed collection of recurrent policies is not supported yet")
        total = int(config.num_envs)
        if collectors < 1 or not 0 <= index < collectors:
            raise ConfigError(f"collector {index} of {collectors}: there must be at least one, indexed from 0")
        if total % collectors:
            raise ConfigError(f"num_envs {total} must split evenly over {collectors} collectors")
        self.index, self.collectors, self.total = index, collectors, total
        self.per_collector = total // collectors
        self.rows = slice(index * self.per_collector, (index + 1) * self.per_collector)
        seed_everything(spec.seed)
        algo = agents.make(spec.algo, env_spec(spec.env_id), config, total_steps=spec.budget.total_steps, seed=spec.seed)
        if not isinstance(algo, Algorithm):
            raise ConfigError(f"{spec.algo} is a meta-learner: it collects through its task envs, not collectors")
        self.algo = algo
        self.envs = make_vector_env(spec.env_id, self.per_collector, gamma=getattr(config, "gamma", 0.99))
        self.obs, _ = self.envs.reset(seed=spec.seed + index * self.per_collector)

    def collect(self, weights: dict[str, dict[str, torch.Tensor]], generator_state: torch.Tensor, num_steps: int) -> Collected:
        """``num_steps`` steps of this collector's envs with the learner's ``weights``, drawing
        from its generator state ``generator_state``."""
        algo = self.algo
        algo.set_weights(weights)
        algo.generator.set_state(generator_state)
        collected = Collected([])
        for step in range(num_steps):
            padded = np.zeros((self.total, *self.obs.shape[1:]), dtype=np.float32)
            padded[self.rows] = self.obs
            acted = algo.behavior_act(torch.as_tensor(padded))
            mine = Acted(
                acted.actions[self.rows],
                acted.env_actions[self.rows],
                None,
                {name: value[self.rows] for name, value in acted.extras.items()},
            )
            next_obs, rewards, terminated, truncated, infos = self.envs.step(mine.env_actions)
            collected.steps.append(
                Transitions(
                    obs=torch.as_tensor(self.obs, dtype=torch.float32),
                    acted=mine,
                    rewards=torch.as_tensor(rewards, dtype=torch.float32),
                    next_obs=torch.as_tensor(true_next_obs(next_obs, infos), dtype=torch.float32),
                    terminated=torch.as_tensor(terminated),
                    truncated=torch.as_tensor(truncated),
                )
            )
            collected.episodes += [(episode_return, length, step) for episode_return, length in finished_episodes(infos)]
            self.obs = next_obs
        collected.generator_state = algo.generator.get_state()
        return collected

    def close(self) -> None:
        self.envs.close()


def join(parts: list[Transitions]) -> Transitions:
    """The collectors' rows of one step, in collector order, as one step of all C*k envs."""
    acted = [part.acted for part in parts]
    return Transitions(
        obs=torch.cat([part.obs for part in parts]),
        acted=Acted(
            torch.cat([a.actions for a in acted]),
            np.concatenate([a.env_actions for a in acted]),
            None,
            {name: torch.cat([a.extras[name] for a in acted]) for name in acted[0].extras},
        ),
        rewards=torch.cat([part.rewards for part in parts]),
        next_obs=torch.cat([part.next_obs for part in parts]),
        terminated=torch.cat([part.terminated for part in parts]),
        truncated=torch.cat([part.truncated for part in parts]),
    )


def observe_rollout(algo: Algorithm, collected: list[Collected]) -> None:
    """Feed the learner the collectors' rollouts step by step, joined; its generator takes on
    the state they ended in (the draws of the whole rollout are made)."""
    states = [part.generator_state for part in collected if part.generator_state is not None]
    if len(states) != len(collected) or any(not torch.equal(state, states[0]) for state in states):
        raise RuntimeError("the collectors' generators diverged: they did not act from one state")
    for step in zip(*(part.steps for part in collected), strict=True):
        algo.observe(join(list(step)))
    algo.generator.set_state(states[0])


class CollectorHandle(Protocol):
    """A collector as the learner calls it: in this process, or a Ray actor behind ``remote``."""

    def collect(self, weights: dict[str, dict[str, torch.Tensor]], generator_state: torch.Tensor, num_steps: int) -> Collected: ...


class RayCollector:
    """A ``Collector`` running as a Ray actor (its own process, on any node of the cluster)."""

    def __init__(self, spec: RunSpec, index: int, collectors: int):
        import ray

        self._ray = ray
        self.actor: Any = ray.remote(Collector).remote(spec, index, collectors)

    def collect(self, weights: dict[str, dict[str, torch.Tensor]], generator_state: torch.Tensor, num_steps: int) -> Collected:
        collected: Collected = self._ray.get(self.actor.collect.remote(weights, generator_state, num_steps))
        return collected


def train_with_collectors(spec: RunSpec, collectors: Sequence[CollectorHandle], tracker: Tracker | None = None) -> RunResult:
    """Train on-policy ``spec`` with its experience collected by ``collectors`` synchronously:
    the same run as ``benchmark.training.loop.run`` with ``num_envs`` envs in one process
    (evaluations, training episodes and losses logged alike) when ``eval_every`` is a multiple
    of the rollout (``num_steps * num_envs``): an evaluation here waits for the end of a
    rollout, where one process evaluates at the step it falls due. No checkpoints yet."""
    tracker = tracker or NullTracker()
    seed_everything(spec.seed)
    config = agents.resolve_config(spec.algo, spec.hyperparameters)
    algo = agents.make(spec.algo, env_spec(spec.env_id), config, total_steps=spec.budget.total_steps, seed=spec.seed)
    if not isinstance(algo, Algorithm) or not hasattr(config, "num_steps") or not hasattr(algo, "storage"):
        raise ConfigError(f"{spec.algo}: synchronous collectors serve the on-policy algorithms so far")
    num_envs, num_steps, budget = int(config.num_envs), int(config.num_steps), spec.budget
    eval_envs = make_vector_env(spec.env_id, budget.eval_episodes)
    result, counters = RunResult(spec, device="cpu"), Counters(next_eval=budget.eval_every)
    started = time.perf_counter()
    try:
        while counters.step < budget.total_steps:
            weights, state = algo.get_weights(), algo.generator.get_state()
            collected = [collector.collect(weights, state, num_steps) for collector in collectors]
            observe_rollout(algo, collected)
            ended = sorted((step, index, episode_return, length) for index, part in enumerate(collected) for episode_return, length, step in part.episodes)
            for step, _, episode_return, length in ended:  # in the order one process logs them: by step, then env
                tracker.log_metrics(
                    {metric_names.TRAIN_EPISODE_RETURN: episode_return, metric_names.TRAIN_EPISODE_LENGTH: length}, counters.step + (step + 1) * num_envs
                )
                counters.train_return_sum += episode_return
                counters.train_episodes += 1
            counters.step += num_steps * num_envs
            logs = algo.update()
            check_finite(logs, counters.step)
            for key, value in logs.items():
                counters.update_logs.setdefault(key, []).append(value)
            if counters.step >= counters.next_eval or counters.step >= budget.total_steps:
                counters.train_seconds = time.perf_counter() - started - counters.eval_seconds
                eval_started = time.perf_counter()
                losses = {f"train/{key}": float(np.mean(values)) for key, values in counters.update_logs.items()}
                counters.update_logs.clear()
                evaluation = evaluate(algo, eval_envs, eval_envs, spec.seed + EVAL_SEED_OFFSET, torch.device("cpu"), counters.step)
                if counters.train_episodes:
                    evaluation.train_return_mean = counters.train_return_sum / counters.train_episodes
                    evaluation.train_episodes = counters.train_episodes
                counters.train_return_sum, counters.train_episodes = 0.0, 0
                result.evaluations.append(evaluation)
                tracker.log_metrics(
                    {
                        **losses,
                        metric_names.STEPS_PER_SECOND: counters.step / max(counters.train_seconds, 1e-9),
                        metric_names.EVAL_RETURN_MEAN: evaluation.mean,
                        metric_names.EVAL_RETURN_STD: evaluation.std,
                        metric_names.EVAL_LENGTH_MEAN: float(np.mean(evaluation.lengths)),
                        **({metric_names.TRAIN_RETURN: evaluation.train_return_mean} if evaluation.train_return_mean is not None else {}),
                    },
                    counters.step,
                )
                while counters.next_eval <= counters.step:
                    counters.next_eval += budget.eval_every
                counters.eval_seconds += time.perf_counter() - eval_started
        return finish(result, counters, started, tracker, None, {}, remove_latest_on_finish=False)
    finally:
        eval_envs.close()
