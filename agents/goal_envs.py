"""Goal-conditioned environments shipped with the project (fast, for tests of HER).

Bit flipping, Andrychowicz et al. (2017), "Hindsight Experience Replay", Sec. 3.1: the state
and the goal are n-bit vectors; an action flips one bit; the reward is 0 when the state equals
the goal and -1 otherwise, so for large n random exploration almost never sees a reward.
Episodes last at most n steps (the goal is always reachable in n flips) and terminate on success.
Registered as ``reprorl/BitFlipping{n}-v0`` for the sizes in ``BIT_FLIPPING_SIZES``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    from gymnasium.envs.registration import EnvCreator

BIT_FLIPPING_SIZES = (5, 10, 15, 20, 30, 40, 50)


class BitFlippingEnv(gym.Env):
    """GoalEnv interface: Dict(observation, achieved_goal, desired_goal), compute_reward and
    compute_terminated over batches of goals."""

    metadata = {"render_modes": []}

    def __init__(self, n_bits: int = 10):
        if n_bits < 1:
            raise ValueError(f"n_bits must be >= 1, got {n_bits}")
        self.n_bits = n_bits
        bits = gym.spaces.Box(0.0, 1.0, (n_bits,), np.float32)
        self.observation_space = gym.spaces.Dict({"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = gym.spaces.Discrete(n_bits)
        self.state = np.zeros(n_bits, np.float32)
        self.goal = np.zeros(n_bits, np.float32)

    def _observation(self) -> dict[str, np.ndarray]:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        while np.array_equal(self.state, self.goal):
            self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        return self._observation(), {}

    def step(self, action: int):
        self.state[int(action)] = 1.0 - self.state[int(action)]
        reward = float(self.compute_reward(self.state, self.goal, {}))
        success = reward == 0.0
        return self._observation(), reward, success, False, {"is_success": success}

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """0 where the goals match exactly, else -1; batched over leading dims."""
        matches = np.all(np.asarray(achieved_goal) == np.asarray(desired_goal), axis=-1)
        return matches.astype(np.float32) - 1.0

    def compute_terminated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        return np.all(np.asarray(achieved_goal) == np.asarray(desired_goal), axis=-1)

    def compute_truncated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        return np.zeros(np.shape(achieved_goal)[:-1], dtype=bool)


def register_goal_envs() -> None:
    """Register the bit-flipping sizes with gymnasium (idempotent)."""
    for n_bits in BIT_FLIPPING_SIZES:
        env_id = f"reprorl/BitFlipping{n_bits}-v0"
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=cast("EnvCreator", BitFlippingEnv), kwargs={"n_bits": n_bits}, max_episode_steps=n_bits)
