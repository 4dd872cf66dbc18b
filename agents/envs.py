"""Environments: spec from gymnasium spaces, seeded vector envs, normalization statistics.

Vector envs use gymnasium's SAME_STEP autoreset: when a sub-env's episode ends, ``step``
returns the first observation of its next episode and puts the final one in
``info["final_obs"]``. ``true_next_obs`` recovers the final observation for bootstrapping.
Normalization uses gymnasium's vector wrappers; their running statistics are exported with
``normalization_state`` (for checkpoints) and can be frozen for evaluation.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

import gymnasium as gym
import gymnasium.wrappers.vector as vector_wrappers
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers.utils import RunningMeanStd

from agents.classic_envs import register_classic_envs
from agents.env_setup import EnvSetup, as_setup
from agents.errors import ConfigError, suggest
from agents.goal_envs import register_goal_envs
from agents.tasks import is_task_family, register_task_envs

register_goal_envs()
register_classic_envs()
register_task_envs()


GOAL_KEYS = ("achieved_goal", "desired_goal", "observation")


@dataclass(frozen=True)
class GoalLayout:
    """Where the parts of a goal env's flattened observation sit: [start, stop) of each.

    Goal envs (gymnasium-robotics' GoalEnv interface) have Dict observations with keys
    observation, achieved_goal and desired_goal; they are flattened in gymnasium's sorted key
    order (achieved_goal, desired_goal, observation) so every network sees one vector.
    """

    achieved_goal: tuple[int, int]
    desired_goal: tuple[int, int]
    observation: tuple[int, int]

    @classmethod
    def from_space(cls, space: gym.spaces.Dict) -> GoalLayout:
        bounds, start = {}, 0
        for key in space.keys():  # gymnasium keeps Dict keys sorted
            size = int(np.prod(cast("tuple[int, ...]", space[key].shape)))  # a goal env's parts have shapes
            bounds[key] = (start, start + size)
            start += size
        return cls(**bounds)


def is_goal_space(space: gym.Space) -> TypeGuard[gym.spaces.Dict]:
    return isinstance(space, gym.spaces.Dict) and sorted(space.keys()) == list(GOAL_KEYS)


@dataclass(frozen=True)
class EnvSpec:
    """Shapes and bounds of an environment, read from its gymnasium spaces."""

    env_id: str
    observation_shape: tuple[int, ...]
    discrete: bool
    action_shape: tuple[int, ...]  # () for Discrete, (k,) for MultiDiscrete and Box
    num_actions: int  # Discrete: number of actions; MultiDiscrete: sum of nvec; Box: dimension
    action_low: tuple[float, ...] | None  # continuous only
    action_high: tuple[float, ...] | None
    max_episode_steps: int | None
    goal: GoalLayout | None = None  # set for goal envs, whose observations are flattened dicts
    action_nvec: tuple[int, ...] | None = None  # MultiDiscrete only: choices per action component
    task_family: bool = False  # a meta-RL task family (agents.tasks): sample_tasks, set_task, get_task
    setup: EnvSetup | None = None  # how the env is made, where more than its id (env_kwargs, wrappers)

    @property
    def multi_discrete(self) -> bool:
        """k independent discrete choices per step (``discrete`` is also true)."""
        return self.action_nvec is not None

    @property
    def action_space_name(self) -> str:
        """The action space in words, for messages."""
        if self.action_nvec is not None:  # multi_discrete
            return f"MultiDiscrete({list(self.action_nvec)})"
        return f"Discrete({self.num_actions})" if self.discrete else f"Box({self.num_actions},)"

    @classmethod
    def from_spaces(
        cls,
        env_id: str,
        observation_space: gym.Space,
        action_space: gym.Space,
        max_episode_steps: int | None = None,
    ) -> EnvSpec:
        goal = None
        if is_goal_space(observation_space):
            goal = GoalLayout.from_space(observation_space)
            observation_space = gym.spaces.flatten_space(observation_space)
        if not isinstance(observation_space, gym.spaces.Box):
            raise ConfigError(f"{env_id}: observation space {observation_space} is not a Box (nor a goal Dict)")
        if isinstance(action_space, gym.spaces.Discrete):
            return cls(env_id, tuple(observation_space.shape), True, (), int(action_space.n), None, None, max_episode_steps, goal)
        if isinstance(action_space, gym.spaces.MultiDiscrete) and len(action_space.shape) == 1:
            if np.any(action_space.start != 0):
                raise ConfigError(f"{env_id}: MultiDiscrete actions must start at 0, got start={action_space.start.tolist()}")
            nvec = tuple(int(n) for n in action_space.nvec)
            shape = (len(nvec),)
            return cls(env_id, tuple(observation_space.shape), True, shape, sum(nvec), None, None, max_episode_steps, goal, nvec)
        if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            return cls(
                env_id,
                tuple(observation_space.shape),
                False,
                tuple(action_space.shape),
                int(action_space.shape[0]),
                tuple(float(x) for x in action_space.low),
                tuple(float(x) for x in action_space.high),
                max_episode_steps,
                goal,
            )
        raise ConfigError(f"{env_id}: action space {action_space} is not Discrete, 1-D MultiDiscrete or a 1-D Box")


_HARMLESS_MUJOCO_WARNINGS = (
    # gymnasium's v5 XML files set an attribute MuJoCo 4 deprecates; the model compiles the same
    "compiler attribute 'settotalmass' is deprecated",
)


def registered_id(env_id: str) -> str:
    """The id gymnasium registered: ``package.module:Env-vN`` -> ``Env-vN`` (``gym.spec`` takes
    no module; ``gym.make`` and ``gym.make_vec`` take both)."""
    return env_id.rpartition(":")[2]


def route_mujoco_warnings(env_id: str) -> None:
    """Before ``env_id`` is made: send MuJoCo's warnings to Python's ``warnings`` (instead of
    stderr and MUJOCO_LOG.TXT in the working directory), dropping known-harmless ones. Only
    for an env that may load MuJoCo (its entry point names MuJoCo, or is a callable), so that
    the other envs' processes skip importing it (a quarter of a second)."""
    entry_point = gym.spec(registered_id(env_id)).entry_point
    if isinstance(entry_point, str) and "mujoco" not in entry_point.lower():
        return
    _route_mujoco_warnings()


@functools.lru_cache(maxsize=1)
def _route_mujoco_warnings() -> None:
    """Once per process."""
    try:
        import mujoco
    except ImportError:
        return

    def handler(message: str) -> None:
        if not any(text in message for text in _HARMLESS_MUJOCO_WARNINGS):
            warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)

    mujoco.set_mju_user_warning(handler)


def check_env_id(env_id: str) -> None:
    """Raise ConfigError naming close matches if gymnasium does not know ``env_id``.

    gymnasium-robotics (Fetch, HandManipulate, ...) registers its envs on import; it is
    imported on demand, when installed, for an id gymnasium does not know yet. An id of the form
    ``package.module:Env-vN`` (as ``gymnasium.make`` takes it) imports ``package.module`` first,
    whose import registers ``Env-vN``.
    """
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(f"environment {env_id!r}: cannot import {module} ({type(error).__name__}: {error})") from None
        if name not in gym.registry:
            raise ConfigError(f"environment {env_id!r}: importing {module} registered no {name!r}{suggest(name, gym.registry.keys())}")
        return
    if env_id not in gym.registry:
        _register_optional_suites()
    if env_id not in gym.registry:
        raise ConfigError(f"unknown environment {env_id!r}{suggest(env_id, gym.registry.keys())}")


@functools.lru_cache(maxsize=1)
def _register_optional_suites() -> None:
    try:
        import gymnasium_robotics

        gym.register_envs(gymnasium_robotics)
    except ImportError:
        pass


def env_spec(env: str | EnvSetup) -> EnvSpec:
    """The EnvSpec of a registered gymnasium environment, made as ``env`` says (built once per
    process). An env with kwargs or wrappers is also reset once, so that one that cannot be
    made or wrapped is refused here, in one line (ConfigError)."""
    return _env_spec(as_setup(env))


@functools.cache
def _env_spec(setup: EnvSetup) -> EnvSpec:
    check_env_id(setup.env_id)
    route_mujoco_warnings(setup.env_id)
    made = setup.make()
    if not setup.plain:
        try:
            made.reset(seed=0)
        except Exception as error:  # noqa: BLE001
            made.close()
            raise ConfigError(f"{setup.describe()}: the wrapped env fails to reset ({type(error).__name__}: {error})") from None
    try:
        assert made.spec is not None  # gym.make sets it
        spec = EnvSpec.from_spaces(setup.env_id, made.observation_space, made.action_space, made.spec.max_episode_steps)
        return dataclasses.replace(spec, task_family=is_task_family(made), setup=None if setup.plain else setup)
    finally:
        made.close()


def goal_functions(env: str | EnvSetup) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray] | None]:
    """A goal env's batched ``compute_reward(achieved, desired, info)`` and, where it has
    one, ``compute_terminated`` (from one instance kept for the process)."""
    return _goal_functions(as_setup(env))


@functools.cache
def _goal_functions(setup: EnvSetup) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray] | None]:
    if env_spec(setup).goal is None:
        raise ConfigError(f"{setup.env_id} is not a goal env (needs observation, achieved_goal and desired_goal)")
    made: Any = setup.make().unwrapped  # a GoalEnv, whose methods gymnasium's Env does not declare
    return made.compute_reward, getattr(made, "compute_terminated", None)


def make_vector_env(
    env: str | EnvSetup,
    num_envs: int,
    *,
    normalize_observations: bool = False,
    normalize_rewards: bool = False,
    gamma: float = 0.99,
    clip_observations: float = 10.0,
    clip_rewards: float = 10.0,
    autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP,
) -> gym.vector.VectorEnv:
    """A sync vector env of ``env`` (its kwargs and wrappers applied to each sub-env) with episode
    statistics on raw rewards, then optional normalization. Training and evaluation use
    SAME_STEP autoreset; NEXT_STEP keeps an ended episode's last state until the next step
    (for filming it).

    Seed it with ``envs.reset(seed=s)``: sub-env i gets seed s + i.
    """
    setup = as_setup(env)
    check_env_id(setup.env_id)
    route_mujoco_warnings(setup.env_id)
    wrappers = setup.wrapper_factories()
    if env_spec(setup).goal is not None:
        wrappers.append(gym.wrappers.FlattenObservation)
    envs = gym.make_vec(
        setup.env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": autoreset_mode},
        wrappers=wrappers,
        **setup.kwargs,
    )
    envs = vector_wrappers.RecordEpisodeStatistics(envs)  # innermost: returns are unscaled
    return add_normalization(
        envs,
        normalize_observations=normalize_observations,
        normalize_rewards=normalize_rewards,
        gamma=gamma,
        clip_observations=clip_observations,
        clip_rewards=clip_rewards,
    )


def add_normalization(
    envs: gym.vector.VectorEnv,
    *,
    normalize_observations: bool,
    normalize_rewards: bool,
    gamma: float = 0.99,
    clip_observations: float = 10.0,
    clip_rewards: float = 10.0,
) -> gym.vector.VectorEnv:
    """``envs`` wrapped in the running normalizations asked for (observations, then rewards
    scaled by the running std of their discounted return and clipped): the training envs' wrappers,
    and those a run over collectors applies to their steps joined."""
    if normalize_observations:
        envs = NormalizeObservation(envs, clip=clip_observations)
    if normalize_rewards:
        envs = vector_wrappers.NormalizeReward(envs, gamma=gamma)
        envs = vector_wrappers.ClipReward(envs, -clip_rewards, clip_rewards)
    return envs


class NormalizeObservation(gym.vector.VectorWrapper):
    """Running mean/std observation normalization, then clipping to [-clip, clip].

    gymnasium's own vector observation wrappers refuse SAME_STEP autoreset because they cannot
    transform ``info["final_obs"]``; this one normalizes those final observations too, with
    the same statistics (gymnasium's RunningMeanStd), so bootstrapping sees what the policy sees.
    """

    def __init__(self, env: gym.vector.VectorEnv, clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__(env)
        shape = env.single_observation_space.shape
        self.obs_rms = RunningMeanStd(shape=shape)
        self.clip, self.epsilon = clip, epsilon
        self.update_running_mean = True
        self.single_observation_space = gym.spaces.Box(-clip, clip, shape, np.float32)
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, infos = self.env.reset(**kwargs)
        if self.update_running_mean:
            self.obs_rms.update(obs)
        return self.normalize(obs), infos

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        if self.update_running_mean:
            self.obs_rms.update(obs)
        if "_final_obs" in infos and infos["_final_obs"].any():
            final_obs = infos["final_obs"].copy()
            for i in np.flatnonzero(infos["_final_obs"]):
                final_obs[i] = self.normalize(final_obs[i])
            infos = {**infos, "final_obs": final_obs}
        return self.normalize(obs), rewards, terminated, truncated, infos

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """Normalize with the current statistics, without updating them."""
        return normalize_observation(obs, self.obs_rms.mean, self.obs_rms.var, self.clip, self.epsilon)


def normalize_observation(obs: np.ndarray, mean: np.ndarray, var: np.ndarray, clip: float, epsilon: float = 1e-8) -> np.ndarray:
    """(obs - mean) / sqrt(var + epsilon), clipped to [-clip, clip], as float32."""
    return np.clip((obs - mean) / np.sqrt(var + epsilon), -clip, clip).astype(np.float32)


def find_wrapper(envs: gym.vector.VectorEnv, wrapper_type: type) -> Any | None:
    env = envs
    while isinstance(env, gym.vector.VectorWrapper):
        if isinstance(env, wrapper_type):
            return env
        env = env.env
    return None


def true_next_obs(obs: np.ndarray, infos: dict[str, Any]) -> np.ndarray:
    """``obs`` with each just-finished sub-env's reset observation replaced by its final one."""
    if "_final_obs" not in infos or not infos["_final_obs"].any():
        return obs
    done = np.flatnonzero(infos["_final_obs"])
    next_obs = obs.copy()
    next_obs[done] = np.stack([infos["final_obs"][i] for i in done])
    return next_obs


def finished_episodes(infos: dict[str, Any]) -> list[tuple[float, int]]:
    """(return, length) of each episode that ended this step, on unscaled rewards."""
    if "_episode" not in infos:
        return []
    done = np.flatnonzero(infos["_episode"])
    return [(float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])) for i in done]


def normalization_state(envs: gym.vector.VectorEnv) -> dict[str, Any]:
    """Running statistics of the normalization wrappers, as plain arrays (for checkpoints)."""
    state: dict[str, Any] = {}
    obs_norm = find_wrapper(envs, NormalizeObservation)
    if obs_norm is not None:
        rms = obs_norm.obs_rms
        state["obs_rms"] = {"mean": rms.mean.copy(), "var": rms.var.copy(), "count": float(rms.count)}
    reward_norm = find_wrapper(envs, vector_wrappers.NormalizeReward)
    if reward_norm is not None:
        rms = reward_norm.return_rms
        state["return_rms"] = {"mean": np.asarray(rms.mean).copy(), "var": np.asarray(rms.var).copy(), "count": float(rms.count)}
    return state


def load_normalization_state(envs: gym.vector.VectorEnv, state: dict[str, Any]) -> None:
    """Copy statistics from ``normalization_state`` into ``envs``' wrappers (where present)."""
    for key, wrapper_type, attr in (
        ("obs_rms", NormalizeObservation, "obs_rms"),
        ("return_rms", vector_wrappers.NormalizeReward, "return_rms"),
    ):
        wrapper = find_wrapper(envs, wrapper_type)
        if wrapper is None or key not in state:
            continue
        rms = getattr(wrapper, attr)
        rms.mean = np.array(state[key]["mean"], dtype=np.float64)
        rms.var = np.array(state[key]["var"], dtype=np.float64)
        rms.count = float(state[key]["count"])


def freeze_normalization(envs: gym.vector.VectorEnv, frozen: bool = True) -> None:
    """Stop (or resume) updating the running statistics, e.g. for evaluation."""
    for wrapper_type in (NormalizeObservation, vector_wrappers.NormalizeReward):
        wrapper = find_wrapper(envs, wrapper_type)
        if wrapper is not None:
            wrapper.update_running_mean = not frozen
