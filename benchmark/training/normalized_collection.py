"""Observation and reward normalization of a run over collectors, exactly as one process with
all their envs normalizes (the synchronous scheme; ``distributed.DistributedRun`` drives it).

One process's running statistics at step t include every env's observation at t, and every
env acts on its observation normalized by them: the C collectors cannot step a round apart.
So a run that normalizes steps in lock-step:

    the learner holds the normalization: the training envs' own wrappers
        (``agents.envs.add_normalization``) around a feed of the C*k envs' raw steps joined
    every step of the round:
        each collector acts on the run's C*k normalized observations from the round's acting
            state (the same draws in every collector, as one process draws them), steps its k
            envs and returns their raw step
        the learner feeds the raw steps, joined in env order, through the wrappers: the
            statistics update as one process's do, and the next observations, the ended
            episodes' final observations and the rewards come out normalized exactly as there
    the round's transitions are those normalized steps; the collectors end in one acting state

A collector that dies is replaced: its envs start new episodes (their first observations
normalized with the statistics then, not counted in them), and it first acts on the round's
past observations so that its draws catch up with the others'.

The asynchronous scheme cannot step in lock-step: its rule (``snapshot``, ``absorb``) is that a
collector normalizes what it acts on with the learner's observation statistics as they were
when it was sent the weights, unchanged through its rollout or chunk, and stores transitions
so normalized (what the policy acted on); the learner updates its statistics with each
rollout's raw observations as it arrives, and normalizes its raw rewards then, by each env's
running discounted return (each env belongs to one collector), in arrival order.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from agents.api import Algorithm
from agents.envs import NormalizeObservation, add_normalization, env_spec, find_wrapper, load_normalization_state, normalization_state, true_next_obs
from benchmark.config import RunSpec
from benchmark.training.collected import Collected, RawStep
from benchmark.training.collectors import CollectorGroup, CollectorHandle, CollectorLost


class StepFeed(gym.vector.VectorEnv):
    """A vector env of the run's C*k envs that returns the steps it is fed (the collectors'
    raw steps joined): what the normalization wrappers wrap in a run over collectors."""

    def __init__(self, observation_shape: tuple[int, ...], num_envs: int):
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, observation_shape, np.float64)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)  # never read: the collectors act
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.fed: Any = None

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, self.fed = self.fed, None
        return obs, {}

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        fed, self.fed = self.fed, None
        return fed


class JoinedNormalization:
    """The learner's normalization of a run over collectors: the training envs' wrappers around
    a ``StepFeed``, and the C*k observations to act on next (normalized)."""

    def __init__(self, spec: RunSpec, config: Any):
        self.feed = StepFeed(tuple(env_spec(spec.env).observation_shape), int(config.num_envs))
        self.envs = add_normalization(
            self.feed,
            normalize_observations=config.normalize_observations,
            normalize_rewards=config.normalize_rewards,
            gamma=config.gamma,
            clip_observations=config.clip_observations,
            clip_rewards=config.clip_rewards,
        )
        self.obs: np.ndarray | None = None
        self.clip_rewards = float(config.clip_rewards)

    def start(self, raw_obs: np.ndarray) -> None:
        """The envs' first observations (C*k, ...), as one process's reset sees them."""
        self.feed.fed = raw_obs
        obs, _ = self.envs.reset()
        self.obs = np.asarray(obs, dtype=np.float32)

    def step(self, raw: list[RawStep]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The collectors' raw steps joined and normalized: the next observations to act on,
        the true next observations (final ones where episodes ended), the rewards."""
        next_obs = np.concatenate([part.next_obs for part in raw])
        infos: dict[str, Any] = {}
        if any(part.final_obs is not None for part in raw):
            infos["final_obs"] = np.concatenate([part.final_obs[0] if part.final_obs else np.full(len(part.next_obs), None) for part in raw])
            infos["_final_obs"] = np.concatenate([part.final_obs[1] if part.final_obs else np.zeros(len(part.next_obs), bool) for part in raw])
        self.feed.fed = (
            next_obs,
            np.concatenate([part.rewards for part in raw]),
            np.concatenate([part.terminated for part in raw]),
            np.concatenate([part.truncated for part in raw]),
            infos,
        )
        obs, rewards, _, _, infos = self.envs.step(None)
        self.obs = np.asarray(obs, dtype=np.float32)
        return self.obs, true_next_obs(obs, infos), np.asarray(rewards)

    def restart_rows(self, rows: slice, raw_obs: np.ndarray) -> None:
        """A replaced collector's envs start new episodes: their rows' observations, normalized
        with the statistics now (one process never saw them: they are not counted)."""
        assert self.obs is not None
        wrapper = find_wrapper(self.envs, NormalizeObservation)
        self.obs = self.obs.copy()  # the step's other rows were acted on as they are
        self.obs[rows] = wrapper.normalize(raw_obs) if wrapper is not None else raw_obs

    # -- the asynchronous scheme's rule -------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The observation statistics now, as an asynchronous collector normalizes with them
        (None: observations are not normalized)."""
        wrapper = find_wrapper(self.envs, NormalizeObservation)
        if wrapper is None:
            return {"mean": None}
        return {"mean": wrapper.obs_rms.mean.copy(), "var": wrapper.obs_rms.var.copy(), "clip": wrapper.clip, "epsilon": wrapper.epsilon}

    def absorb(self, part: Collected, rows: slice) -> Collected:
        """An asynchronous collector's rollout of envs ``rows``, on arrival: its raw observations
        update the statistics step by step (as its envs' wrapper would), and its raw rewards are
        normalized by each env's running discounted return, updated here in arrival order; its
        observations stay as the collector normalized them (what the policy acted on)."""
        observations, rewards = find_wrapper(self.envs, NormalizeObservation), find_wrapper(self.envs, gym.wrappers.vector.NormalizeReward)
        normalized = part.raw["rewards"].copy()
        for t in range(part.num_steps):
            if observations is not None and observations.update_running_mean:
                observations.obs_rms.update(part.raw["obs"][t])
            if rewards is not None:
                # gymnasium's NormalizeReward step (SAME_STEP autoreset) on these envs' rows only
                terminated, truncated = part.fields["terminated"][t].numpy(), part.fields["truncated"][t].numpy()
                returns = rewards.accumulated_reward[rows] * rewards.gamma * (1 - terminated) + part.raw["rewards"][t]
                if rewards.update_running_mean:
                    rewards.return_rms.update(returns)
                normalized[t] = part.raw["rewards"][t] / np.sqrt(rewards.return_rms.var + rewards.epsilon)
                returns[terminated | truncated] = 0.0
                rewards.accumulated_reward[rows] = returns
        if rewards is not None:
            normalized = np.clip(normalized, -self.clip_rewards, self.clip_rewards)
        part.fields["rewards"] = torch.as_tensor(normalized, dtype=torch.float32)
        return part

    def state(self) -> dict[str, Any]:
        """Everything it holds, as tensors for a checkpoint (the reward wrapper's running returns included)."""
        rewards = find_wrapper(self.envs, gym.wrappers.vector.NormalizeReward)
        # np.asarray: a float count stays float64 (a plain float would become a float32 tensor)
        statistics = {name: {key: torch.as_tensor(np.asarray(value)) for key, value in stats.items()} for name, stats in normalization_state(self.envs).items()}
        return {
            "statistics": statistics,
            "obs": None if self.obs is None else torch.as_tensor(self.obs),
            "accumulated_reward": None if rewards is None else torch.as_tensor(rewards.accumulated_reward.copy()),
            "prev_dones": None if rewards is None else torch.as_tensor(rewards._prev_dones.copy()),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a ``state``."""
        statistics = {name: {key: value.numpy() for key, value in stats.items()} for name, stats in state["statistics"].items()}
        load_normalization_state(self.envs, statistics)
        self.obs = None if state["obs"] is None else state["obs"].numpy()
        rewards = find_wrapper(self.envs, gym.wrappers.vector.NormalizeReward)
        if rewards is not None and state["accumulated_reward"] is not None:
            rewards.accumulated_reward[:] = state["accumulated_reward"].numpy()
            rewards._prev_dones[:] = state["prev_dones"].numpy()


def _each_step(group: CollectorGroup, obs: np.ndarray) -> list[RawStep | None]:
    """Every collector's step on ``obs``, sent to all first, then awaited; None for one whose process died."""
    if group.inline:
        return [handle.step(obs) for handle in group.handles]
    references = [handle.actor.step.remote(obs) for handle in group.handles]  # type: ignore[attr-defined]
    steps: list[RawStep | None] = []
    for index, reference in enumerate(references):
        try:
            steps.append(group.handles[index]._get(reference))  # type: ignore[attr-defined]
        except CollectorLost:
            steps.append(None)
    return steps


def collect_in_lockstep(group: CollectorGroup, algo: Algorithm, num_steps: int, normalization: JoinedNormalization) -> list[Collected]:
    """Every collector's next ``num_steps`` steps in lock-step with the learner's
    normalization: their ``Collected`` rollouts, normalized as one process's."""
    weights, acting_state = algo.get_weights(), algo.acting_state()
    k, count = group.per_collector, group.count
    rows = [slice(index * k, (index + 1) * k) for index in range(count)]
    past: list[np.ndarray] = []  # the observations acted on so far this round
    replaced: set[int] = set()

    def replace(index: int) -> CollectorHandle:
        """A new collector for a dead one: new episodes in its rows, its draws caught up with the round's."""
        handle = group.replace(index)
        normalization.restart_rows(rows[index], handle.raw_obs())
        handle.begin(weights, acting_state, tuple(past))
        replaced.add(index)
        return handle

    for index, handle in enumerate(group.handles):
        try:
            handle.begin(weights, acting_state)
        except CollectorLost:
            replace(index)
    columns: list[dict[str, list[Any]]] = [{} for _ in range(count)]
    episodes: list[list[tuple[float, int, int]]] = [[] for _ in range(count)]
    seconds = np.zeros(count)
    for step in range(num_steps):
        assert normalization.obs is not None
        parts = _each_step(group, normalization.obs)
        for index, part in enumerate(parts):
            if part is None:
                handle = replace(index)
                parts[index] = handle.step(normalization.obs)
        done = [part for part in parts if part is not None]
        obs = normalization.obs  # what every collector acted on (a replacement's rows included)
        _, true_next, rewards = normalization.step(done)
        past.append(obs)
        for index, part in enumerate(done):
            where = rows[index]
            for name, value in (
                ("obs", torch.as_tensor(obs[where], dtype=torch.float32)),
                ("actions", part.actions),
                ("rewards", torch.as_tensor(rewards[where], dtype=torch.float32)),
                ("next_obs", torch.as_tensor(true_next[where], dtype=torch.float32)),
                ("terminated", torch.tensor(part.terminated)),  # a copy: arrays from Ray are read-only
                ("truncated", torch.tensor(part.truncated)),
                ("env_actions", part.env_actions),
                *((f"extra:{name}", value) for name, value in part.extras.items()),
            ):
                columns[index].setdefault(name, []).append(value)
            episodes[index] += [(episode_return, length, step) for episode_return, length in part.episodes]
            seconds[index] += part.seconds
    ended: list[dict[str, Any] | None] = []
    for index, handle in enumerate(group.handles):
        try:
            ended.append(handle.acting_state())
        except CollectorLost:  # its round is in; the replacement's envs start new episodes next round
            group.replace(index)
            normalization.restart_rows(rows[index], group.handles[index].raw_obs())
            replaced.add(index)
            ended.append(None)
    # a replacement acted from the round's state and caught up: the survivors' end state is everyone's
    survivor = next((state for index, state in enumerate(ended) if index not in replaced and state is not None), None)
    if survivor is None:
        raise RuntimeError("every collector was replaced during one round: no acting state to go on from")
    collected = []
    for index in range(count):
        stacked = {name: torch.stack(values) for name, values in columns[index].items() if name != "env_actions"}
        collected.append(
            Collected(
                fields={name: stacked[name] for name in ("obs", "actions", "rewards", "next_obs", "terminated", "truncated")},
                env_actions=np.stack(columns[index]["env_actions"]),
                extras={name.removeprefix("extra:"): value for name, value in stacked.items() if name.startswith("extra:")},
                episodes=episodes[index],
                acting_state=survivor if replaced else ended[index] or survivor,
                seconds=float(seconds[index]),
                collector=index,
            )
        )
    return collected


def first_observations(group: CollectorGroup) -> np.ndarray:
    """The run's C*k envs' observations now, raw, in env order."""
    return np.concatenate([handle.raw_obs() for handle in group.handles])
