"""The meta-RL interface: episodes collected per task, the meta-algorithm contract, meta-test.

A meta-algorithm learns across tasks of a family (``agents.tasks``) so that it adapts quickly
to a new one. Its meta-interface is garage's:

    policy  = algo.get_exploration_policy()           acts before adaptation
    episodes = task_envs.collect(task, policy, k)     explore the task
    adapted = algo.adapt_policy(policy, episodes)     MAML: gradient steps; PEARL: posterior over z

``meta_test`` runs that protocol on held-out tasks and reports the return before adaptation
(the exploration episodes) and after it (episodes of the adapted policy), per task.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from agents.api import Learner
from agents.env_setup import EnvSetup, as_setup
from agents.envs import check_env_id, route_mujoco_warnings
from agents.tasks import Task, TaskSampler


class Policy(Protocol):
    """Something that acts on a batch of observations (B, *obs_shape)."""

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> PolicyOutput: ...


PolicyT = TypeVar("PolicyT", bound=Policy)


@dataclass
class PolicyOutput:
    """Actions (B, *action_shape) as the policy produced them, what the env receives, and the
    log-probabilities (B,) and distribution parameters (B, P) of stochastic policies."""

    actions: torch.Tensor
    env_actions: np.ndarray
    log_probs: torch.Tensor | None = None
    dist_params: torch.Tensor | None = None


@dataclass
class Episodes:
    """E episodes of one task, padded to the horizon T; step t of episode e is valid where
    ``mask[e, t]``. Tensors live on the collecting device."""

    task: Task
    observations: torch.Tensor  # (E, T, *obs_shape)
    actions: torch.Tensor  # (E, T, *action_shape)
    rewards: torch.Tensor  # (E, T)
    next_observations: torch.Tensor  # (E, T, *obs_shape)
    terminated: torch.Tensor  # (E, T) bool: a true terminal state (no bootstrap)
    mask: torch.Tensor  # (E, T) bool
    log_probs: torch.Tensor | None = None  # (E, T) of the collecting policy
    dist_params: torch.Tensor | None = None  # (E, T, P) of the collecting policy

    @property
    def num_episodes(self) -> int:
        return int(self.mask.shape[0])

    @property
    def lengths(self) -> torch.Tensor:
        """(E,) valid steps per episode."""
        return self.mask.sum(dim=1)

    @property
    def returns(self) -> torch.Tensor:
        """(E,) undiscounted episode returns."""
        return (self.rewards * self.mask).sum(dim=1)

    @property
    def num_steps(self) -> int:
        return int(self.mask.sum())

    def valid(self, tensor: torch.Tensor) -> torch.Tensor:
        """The valid steps of an (E, T, ...) tensor, flattened to (N, ...)."""
        return tensor[self.mask]

    def cat(self, other: Episodes) -> Episodes:
        """These episodes and ``other``'s (same task and horizon) as one batch."""

        def join(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
            return None if a is None or b is None else torch.cat([a, b])

        return Episodes(
            self.task,
            **{name: torch.cat([getattr(self, name), getattr(other, name)]) for name in _TENSORS},
            log_probs=join(self.log_probs, other.log_probs),
            dist_params=join(self.dist_params, other.dist_params),
        )


_TENSORS = ("observations", "actions", "rewards", "next_observations", "terminated", "mask")


class TaskEnvs:
    """A sync vector env of one task family that collects whole episodes on a chosen task.

    Every collection round resets the sub-envs with seeds drawn from (``seed``, round counter)
    by a SeedSequence, so runs of neighbouring seeds share no episodes, a run is reproducible
    and a resumed run (``state_dict``) continues the same sequence. ``steps`` counts the env
    steps of the collected episodes (the budget of a meta-training run); sub-envs beyond a
    round's episode count step along unrecorded and uncounted.
    """

    def __init__(self, env: str | EnvSetup, num_envs: int, seed: int, device: torch.device | str = "cpu"):
        setup = as_setup(env)
        check_env_id(setup.env_id)
        route_mujoco_warnings(setup.env_id)
        self.sampler = TaskSampler(setup)
        self.env_id, self.num_envs, self.seed, self.device = setup.env_id, num_envs, seed, torch.device(device)
        self.envs = cast(
            SyncVectorEnv,
            gym.make_vec(
                setup.env_id,
                num_envs=num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                wrappers=setup.wrapper_factories(),
                **setup.kwargs,
            ),
        )
        spec = self.envs.envs[0].spec
        assert spec is not None and spec.max_episode_steps is not None  # gym.make sets the spec; task families have a time limit
        self.horizon = int(spec.max_episode_steps)
        space = self.envs.single_action_space
        self._discrete = isinstance(space, gym.spaces.Discrete)
        self._low = None if self._discrete else cast(gym.spaces.Box, space).low
        self._high = None if self._discrete else cast(gym.spaces.Box, space).high
        self.rounds = 0
        self.steps = 0

    def close(self) -> None:
        self.envs.close()

    def state_dict(self) -> dict[str, int]:
        return {"rounds": self.rounds, "steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.rounds, self.steps = int(state["rounds"]), int(state["steps"])

    def set_task(self, task: Task) -> None:
        self.envs.call("set_task", task)

    @torch.no_grad()  # not inference_mode: the episodes are training data, used later under autograd
    def collect(self, task: Task, policy: Policy, num_episodes: int, deterministic: bool = False) -> Episodes:
        """``num_episodes`` episodes of ``task`` acted by ``policy``, in rounds of num_envs."""
        self.set_task(task)
        parts = []
        remaining = num_episodes
        while remaining > 0:
            count = min(remaining, self.num_envs)
            parts.append(self._round(task, policy, count, deterministic))
            remaining -= count
        episodes = parts[0]
        for part in parts[1:]:
            episodes = episodes.cat(part)
        return episodes

    def _round(self, task: Task, policy: Policy, count: int, deterministic: bool) -> Episodes:
        seeds = np.random.SeedSequence([self.seed, self.rounds]).generate_state(self.num_envs)
        obs, _ = self.envs.reset(seed=[int(s) for s in seeds])
        self.rounds += 1
        n, horizon = self.num_envs, self.horizon
        observations: list[torch.Tensor] = []
        next_observations: list[np.ndarray] = []
        actions, rewards, terminated, alive, log_probs, dist_params = [], [], [], [], [], []
        running = np.ones(n, dtype=bool)
        running[count:] = False  # sub-envs beyond ``count`` step along but are not recorded
        for _ in range(horizon):
            obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
            out = policy.act(obs_tensor, deterministic=deterministic)
            next_obs, reward, term, trunc, infos = self.envs.step(out.env_actions)
            final = next_obs
            if "_final_obs" in infos and infos["_final_obs"].any():
                final = next_obs.copy()
                for i in np.flatnonzero(infos["_final_obs"]):
                    final[i] = infos["final_obs"][i]
            observations.append(obs_tensor)
            next_observations.append(np.asarray(final, dtype=np.float32))
            actions.append(out.actions)
            rewards.append(reward)
            terminated.append(term)
            alive.append(running.copy())
            if out.log_probs is not None:
                log_probs.append(out.log_probs)
            if out.dist_params is not None:
                dist_params.append(out.dist_params)
            self.steps += int(running.sum())
            running &= ~(term | trunc)
            obs = next_obs
            if not running.any():
                break

        def stack(items: list[Any], dtype: torch.dtype | None = None) -> torch.Tensor:
            tensors = [torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x, device=self.device) for x in items]
            stacked = torch.stack(tensors, dim=1)[:count]  # (E, T', ...)
            if dtype is not None:
                stacked = stacked.to(dtype)
            pad = horizon - stacked.shape[1]
            if pad:
                stacked = torch.cat([stacked, stacked.new_zeros((count, pad, *stacked.shape[2:]))], dim=1)
            return stacked

        return Episodes(
            task,
            observations=stack(observations, torch.float32),
            actions=stack(actions),
            rewards=stack(rewards, torch.float32),
            next_observations=stack(next_observations, torch.float32),
            terminated=stack(terminated, torch.bool),
            mask=stack(alive, torch.bool),
            log_probs=stack(log_probs, torch.float32) if log_probs else None,
            dist_params=stack(dist_params, torch.float32) if dist_params else None,
        )


class BatchedMetaSeeds(abc.ABC):
    """N seeds of one meta-learner's configuration trained in one process as one batched
    model, as the meta loop drives it (``agents.algos.seeds.MetaSeedBatch`` implements it)."""

    def __init__(self, members: Sequence[MetaAlgorithm[Any]]):
        self.num_seeds = len(members)

    #: whether a seed whose envs fail gets its exception in its place in ``train_epoch``'s
    #: result while the others finish their epoch as alone (otherwise the exception
    #: propagates and the caller redoes the epoch without that seed)
    isolates_failures: bool = False

    @abc.abstractmethod
    def train_epoch(self, task_envs: Sequence[TaskEnvs]) -> list[dict[str, float]] | list[dict[str, float] | Exception]:
        """One ``train_epoch`` of every seed, seed s collecting through ``task_envs[s]``; each seed's logs."""

    @abc.abstractmethod
    def sync_members(self) -> None:
        """Make each member's ``state_dict()`` its seed's complete state (before a save)."""


class MetaAlgorithm(Learner, Generic[PolicyT]):
    """A meta-learner, trained by the benchmark's meta loop: one ``train_epoch`` per
    iteration (it samples its tasks, collects through ``task_envs`` and updates), and
    meta-tested by ``meta_test`` through ``get_exploration_policy``/``adapt_policy``, which
    act with policies of its own kind (``PolicyT``)."""

    seed_batch: ClassVar[type[BatchedMetaSeeds] | None] = None

    #: exploration episodes collected on each held-out task before adapting (and adaptation
    #: rounds: MAML takes one gradient step per round, PEARL adds each round to its context)
    meta_test_exploration_episodes: int = 1
    meta_test_adaptation_rounds: int = 1
    #: episodes of the adapted policy scored on each held-out task
    meta_test_episodes: int = 1
    #: whether the meta-test acts deterministically (exploration and adapted episodes alike)
    meta_test_deterministic: bool = False
    #: sub-envs a collection uses (more would step unrecorded)
    collection_envs: int = 1
    #: the generator its acting-time draws come from (a meta-test lends it a fresh one)
    generator: torch.Generator

    @abc.abstractmethod
    def train_epoch(self, task_envs: TaskEnvs) -> dict[str, float]:
        """One meta-training iteration: sample tasks, collect, adapt, update; mean logs."""

    @abc.abstractmethod
    def get_exploration_policy(self) -> PolicyT:
        """A policy to explore one task with before adaptation (use it on that task only)."""

    @abc.abstractmethod
    def adapt_policy(self, exploration_policy: PolicyT, episodes: Episodes) -> PolicyT:
        """The policy adapted to the task that ``episodes`` (acted by ``exploration_policy``) came from."""


@dataclass
class TaskResult:
    """One held-out task's meta-test: mean episode returns before and after adaptation."""

    task: Task
    pre_adaptation_return: float
    post_adaptation_return: float
    post_adaptation_length: float
    round_returns: list[float] = field(default_factory=list)  # exploration return of each adaptation round


def meta_test(algo: MetaAlgorithm[PolicyT], task_envs: TaskEnvs, tasks: list[Task], seed: int = 0) -> list[TaskResult]:
    """Adapt to each task from ``meta_test_exploration_episodes`` per round for
    ``meta_test_adaptation_rounds`` rounds, then score ``meta_test_episodes`` episodes of the
    adapted policy (deterministic actions if ``meta_test_deterministic``). The pre-adaptation
    return is that of the first round's exploration.

    The torch RNG is forked and seeded with ``seed``, and the algorithm's generator is replaced
    by one seeded with ``seed`` meanwhile: a meta-test draws the same action noise and latent
    samples each time and leaves the training streams untouched.
    """
    devices = list(range(torch.cuda.device_count())) if task_envs.device.type == "cuda" else []
    own = algo.generator
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        algo.generator = torch.Generator().manual_seed(seed)
        try:
            return _meta_test(algo, task_envs, tasks)
        finally:
            algo.generator = own


def _meta_test(algo: MetaAlgorithm[PolicyT], task_envs: TaskEnvs, tasks: list[Task]) -> list[TaskResult]:
    results = []
    deterministic = algo.meta_test_deterministic
    for task in tasks:
        policy = algo.get_exploration_policy()
        round_returns = []
        for _ in range(algo.meta_test_adaptation_rounds):
            episodes = task_envs.collect(task, policy, algo.meta_test_exploration_episodes, deterministic=deterministic)
            round_returns.append(float(episodes.returns.mean()))
            policy = algo.adapt_policy(policy, episodes)
        adapted = task_envs.collect(task, policy, algo.meta_test_episodes, deterministic=deterministic)
        results.append(
            TaskResult(
                task,
                pre_adaptation_return=round_returns[0],
                post_adaptation_return=float(adapted.returns.mean()),
                post_adaptation_length=float(adapted.lengths.float().mean()),
                round_returns=round_returns,
            )
        )
    return results
