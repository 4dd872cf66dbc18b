"""Small environments shipped with the project for tests of memory and of action spaces.

- ``reprorl/CartPoleNoVel-v1``: CartPole-v1 with the cart and pole velocities removed from the
  observation (only position x and angle theta remain), the memory task of the recurrent-policy
  literature (e.g. Stable-Baselines3-contrib's RecurrentPPO benchmark): a feed-forward policy
  cannot tell which way the pole is moving, a recurrent one can infer it from two frames.
- ``reprorl/MultiDiscreteMatch-v0``: a contextual task with a MultiDiscrete([2, 3, 4]) action.
  Each step shows one target per action component (one-hot); the reward is the fraction of
  components whose choice matches its target. 16 steps per episode, so the optimum return is
  16 and a uniformly random policy scores 16 * (1/2 + 1/3 + 1/4) / 3 = 5.8 on average.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

if TYPE_CHECKING:
    from gymnasium.envs.registration import EnvCreator

MATCH_NVEC = (2, 3, 4)
MATCH_EPISODE_STEPS = 16


class CartPoleNoVelocity(gym.ObservationWrapper):
    """CartPole observing (x, theta) only."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        high = cast(gym.spaces.Box, env.observation_space).high[[0, 2]]  # CartPole's
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[[0, 2]].astype(np.float32)


def make_cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    return CartPoleNoVelocity(CartPoleEnv(**kwargs))


class MultiDiscreteMatchEnv(gym.Env):
    """Match each shown target with the corresponding action component (see module docstring)."""

    metadata = {"render_modes": []}
    action_space: gym.spaces.MultiDiscrete
    observation_space: gym.spaces.Box

    def __init__(self, nvec: tuple[int, ...] = MATCH_NVEC):
        self.nvec = np.asarray(nvec, dtype=np.int64)
        self.action_space = gym.spaces.MultiDiscrete(self.nvec)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (int(self.nvec.sum()),), np.float32)
        self.offsets = np.concatenate([[0], np.cumsum(self.nvec)[:-1]])
        self.targets = np.zeros(len(self.nvec), dtype=np.int64)

    def _observation(self) -> np.ndarray:
        obs = np.zeros(self.observation_space.shape, np.float32)
        obs[self.offsets + self.targets] = 1.0
        return obs

    def _draw_targets(self) -> None:
        self.targets = self.np_random.integers(0, self.nvec)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._draw_targets()
        return self._observation(), {}

    def step(self, action: Any):
        matched = np.asarray(action, dtype=np.int64) == self.targets
        reward = float(matched.mean())
        self._draw_targets()
        return self._observation(), reward, False, False, {}


def register_classic_envs() -> None:
    """Register the environments above with gymnasium (idempotent)."""
    if "reprorl/CartPoleNoVel-v1" not in gym.registry:
        gym.register("reprorl/CartPoleNoVel-v1", entry_point=make_cartpole_no_velocity, max_episode_steps=500, reward_threshold=475.0)
    if "reprorl/MultiDiscreteMatch-v0" not in gym.registry:
        gym.register("reprorl/MultiDiscreteMatch-v0", entry_point=cast("EnvCreator", MultiDiscreteMatchEnv), max_episode_steps=MATCH_EPISODE_STEPS)
