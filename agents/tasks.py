"""Task distributions for meta-RL: environments whose reward depends on a task, and a sampler
with a fixed train/test split.

A task family is a gymnasium env with three methods (the interface garage's meta-RL envs use):

    sample_tasks(n, rng) -> list[dict]     n tasks drawn from the family's distribution
    set_task(task)                          the task the following episodes are scored on
    get_task() -> dict                      the task set now

The families shipped here, registered with gymnasium:

``reprorl/PointNav-v0``
    2-D point navigation (Finn, Abbeel, Levine 2017, "Model-Agnostic Meta-Learning", Sec. 5.3):
    the point starts at the origin, the goal is uniform in the square [-0.5, 0.5]^2; the
    observation is the position, an action in [-1, 1]^2 moves it by 0.1 * action; the reward
    is minus the distance to the goal; an episode ends within 0.01 of the goal or after 100
    steps. Pure NumPy, thousands of steps per millisecond: the family for tests.
``reprorl/HalfCheetahVel-v5``
    gymnasium's HalfCheetah-v5 with a target forward velocity uniform in [0, 2] m/s (Finn et
    al. 2017, Sec. 5.3): reward -|v_x - v_target| - 0.05 |a|^2; 200-step episodes.
``reprorl/HalfCheetahDir-v5``
    the same cheetah told to run forward or backward (direction +1 or -1, each with
    probability 1/2): reward direction * v_x - 0.05 |a|^2; 200-step episodes. With two tasks
    only, its held-out test tasks are necessarily the training tasks (as in the paper).

``TaskSampler`` draws training tasks from a run's RNG and fixes the held-out test tasks by a
seed shared by every run, so all algorithms and seeds are evaluated on the same tasks.
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Any, Protocol, cast

import gymnasium as gym
import numpy as np

from agents.env_setup import EnvSetup, as_setup
from agents.errors import ConfigError

if TYPE_CHECKING:
    from gymnasium.envs.registration import EnvCreator

Task = dict[str, Any]

#: the held-out test tasks of every family are drawn from this seed (train tasks never are)
TEST_TASKS_SEED = 7_919
#: a fixed set of training tasks (PEARL's per-task buffers need one) is drawn from this seed
TRAIN_TASKS_SEED = 104_729


class PointNavEnv(gym.Env):
    """Move a point in the plane to a goal; the goal is the task."""

    metadata = {"render_modes": []}
    max_step = 0.1
    goal_radius = 0.01

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._goal = np.zeros(2, np.float32)
        self._position = np.zeros(2, np.float32)

    def sample_tasks(self, n: int, rng: np.random.Generator) -> list[Task]:
        goals = rng.uniform(-0.5, 0.5, size=(n, 2))
        return [{"goal": [float(x), float(y)]} for x, y in goals]

    def set_task(self, task: Task) -> None:
        self._goal = np.asarray(task["goal"], np.float32)

    def get_task(self) -> Task:
        return {"goal": [float(x) for x in self._goal]}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._position = np.zeros(2, np.float32)
        return self._position.copy(), {}

    def step(self, action: np.ndarray):
        action = np.clip(np.asarray(action, np.float32), -1.0, 1.0)
        self._position = (self._position + self.max_step * action).astype(np.float32)
        distance = float(np.linalg.norm(self._position - self._goal))
        return self._position.copy(), -distance, distance < self.goal_radius, False, {"distance": distance}


def _half_cheetah_class() -> type:
    """gymnasium's HalfCheetahEnv (imported late: it needs mujoco)."""
    from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv

    return HalfCheetahEnv


class _HalfCheetahTaskBase:
    """Shared by the cheetah families: v5 physics and observations, the task's reward (through
    HalfCheetahEnv's own reward hook, so info keeps its x_velocity and reward terms)."""

    task_control_weight = 0.05  # 0.5 * 0.1 |a|^2, as in Finn et al. (2017)'s cheetah tasks

    def _task_reward(self, x_velocity: float) -> float:
        raise NotImplementedError

    def _get_rew(self, x_velocity: float, action: np.ndarray) -> tuple[float, dict[str, float]]:
        task_reward = self._task_reward(float(x_velocity))
        control = self.task_control_weight * float(np.sum(np.square(action)))
        return task_reward - control, {"reward_task": task_reward, "reward_ctrl": -control}


@functools.cache
def _cheetah_family(kind: str) -> type:
    base = _half_cheetah_class()

    class HalfCheetahVelEnv(_HalfCheetahTaskBase, base):  # type: ignore[misc, valid-type]
        """HalfCheetah-v5 rewarded for running at a target velocity (the task)."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._velocity = 1.0

        def sample_tasks(self, n: int, rng: np.random.Generator) -> list[Task]:
            return [{"velocity": float(v)} for v in rng.uniform(0.0, 2.0, size=n)]

        def set_task(self, task: Task) -> None:
            self._velocity = float(task["velocity"])

        def get_task(self) -> Task:
            return {"velocity": self._velocity}

        def _task_reward(self, x_velocity: float) -> float:
            return -abs(x_velocity - self._velocity)

    class HalfCheetahDirEnv(_HalfCheetahTaskBase, base):  # type: ignore[misc, valid-type]
        """HalfCheetah-v5 rewarded for running forward (+1) or backward (-1) (the task)."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._direction = 1.0

        def sample_tasks(self, n: int, rng: np.random.Generator) -> list[Task]:
            return [{"direction": float(d)} for d in rng.choice([-1.0, 1.0], size=n)]

        def all_tasks(self) -> list[Task]:
            return [{"direction": -1.0}, {"direction": 1.0}]

        def set_task(self, task: Task) -> None:
            self._direction = float(task["direction"])

        def get_task(self) -> Task:
            return {"direction": self._direction}

        def _task_reward(self, x_velocity: float) -> float:
            return self._direction * x_velocity

    return {"vel": HalfCheetahVelEnv, "dir": HalfCheetahDirEnv}[kind]


def make_half_cheetah_vel(**kwargs: Any) -> gym.Env:
    return _cheetah_family("vel")(**kwargs)


def make_half_cheetah_dir(**kwargs: Any) -> gym.Env:
    return _cheetah_family("dir")(**kwargs)


TASK_FAMILIES = ("reprorl/PointNav-v0", "reprorl/HalfCheetahVel-v5", "reprorl/HalfCheetahDir-v5")


def register_task_envs() -> None:
    """Register the task families with gymnasium (idempotent)."""
    entries = (
        ("reprorl/PointNav-v0", PointNavEnv, 100),
        ("reprorl/HalfCheetahVel-v5", make_half_cheetah_vel, 200),
        ("reprorl/HalfCheetahDir-v5", make_half_cheetah_dir, 200),
    )
    for env_id, entry_point, horizon in entries:
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=cast("EnvCreator", entry_point), max_episode_steps=horizon)


class TaskFamily(Protocol):
    """The interface of a task family (see the module docstring)."""

    def sample_tasks(self, n: int, rng: np.random.Generator) -> list[Task]: ...

    def set_task(self, task: Task) -> None: ...

    def get_task(self) -> Task: ...


def is_task_family(env: gym.Env) -> bool:
    """Whether ``env`` (or what it wraps) has sample_tasks, set_task and get_task."""
    unwrapped = env.unwrapped
    return all(callable(getattr(unwrapped, name, None)) for name in ("sample_tasks", "set_task", "get_task"))


class TaskSampler:
    """Tasks of one family: random training tasks, a fixed training set, held-out test tasks.

    ``sample(n, rng)`` draws from the run's own RNG (MAML's fresh tasks every meta-batch);
    ``train_tasks(n)`` and ``test_tasks(n)`` are fixed by seeds every run shares (PEARL's
    training set; the meta-test). A family with finitely many tasks (``all_tasks()``) cycles
    through that list for its training set and tests on (at most) all of them.
    """

    def __init__(self, family: str | EnvSetup):
        setup = as_setup(family)
        env_id = setup.env_id
        env = setup.make()
        try:
            if not is_task_family(env):
                raise ConfigError(f"{env_id} is not a task family (it needs sample_tasks, set_task and get_task); task families: {', '.join(TASK_FAMILIES)}")
            self._family = cast(TaskFamily, env.unwrapped)
            finite = getattr(self._family, "all_tasks", None)
            self._finite = finite if callable(finite) else None
        finally:
            env.close()
        self.env_id = env_id

    def sample(self, n: int, rng: np.random.Generator) -> list[Task]:
        """``n`` tasks drawn from the family's distribution with ``rng``."""
        return self._family.sample_tasks(n, rng)

    def train_tasks(self, n: int) -> list[Task]:
        """The fixed training set of ``n`` tasks (the same in every run)."""
        if self._finite is not None:
            return list(itertools.islice(itertools.cycle(self._finite()), n))
        return self.sample(n, np.random.default_rng(TRAIN_TASKS_SEED))

    def test_tasks(self, n: int) -> list[Task]:
        """The ``n`` held-out test tasks (the same in every run); a finite family has at most
        all of its tasks."""
        if self._finite is not None:
            return self._finite()[:n]
        return self.sample(n, np.random.default_rng(TEST_TASKS_SEED))
