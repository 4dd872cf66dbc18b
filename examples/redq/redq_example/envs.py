"""PointReach-v0: a point mass on a plane pushed toward a target, registered with gymnasium when
this module is imported (a suite names it ``redq_example.envs:PointReach-v0``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PointReach(gym.Env):
    """A point of unit mass at p in [-1, 1]^2 with velocity v; the action is a force in [-1, 1]^2.
    Each step (dt = 0.1): v <- damping v + dt a, p <- clip(p + dt v). The target t is drawn
    uniformly in [-0.8, 0.8]^2 at reset. Reward: -|p - t| - 0.01 |a|^2; the episode ends
    (terminated) once |p - t| < ``radius``, with a bonus of 10. Observation: (p, v, t - p)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, radius: float = 0.05, damping: float = 0.9, render_mode: str | None = None):
        self.radius, self.damping, self.render_mode = radius, damping, render_mode
        self.observation_space = gym.spaces.Box(-4.0, 4.0, (6,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.position = np.zeros(2)
        self.velocity = np.zeros(2)
        self.target = np.zeros(2)

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.position, self.velocity, self.target - self.position]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-0.8, 0.8, 2)
        self.velocity = np.zeros(2)
        self.target = self.np_random.uniform(-0.8, 0.8, 2)
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        force = np.clip(np.asarray(action, dtype=float), -1.0, 1.0)
        self.velocity = self.damping * self.velocity + 0.1 * force
        self.position = np.clip(self.position + 0.1 * self.velocity, -1.0, 1.0)
        distance = float(np.linalg.norm(self.target - self.position))
        reached = distance < self.radius
        reward = -distance - 0.01 * float(force @ force) + (10.0 if reached else 0.0)
        return self._obs(), reward, reached, False, {"distance": distance}

    def render(self) -> np.ndarray:
        """A 128 x 128 image: the target in red, the point in blue."""
        frame = np.full((128, 128, 3), 255, dtype=np.uint8)
        for center, colour in ((self.target, (220, 40, 40)), (self.position, (40, 40, 220))):
            column, row = ((center + 1.0) / 2.0 * 127).round().astype(int)
            frame[max(row - 3, 0) : row + 4, max(column - 3, 0) : column + 4] = colour
        return frame


if "PointReach-v0" not in gym.registry:
    gym.register("PointReach-v0", entry_point=PointReach, max_episode_steps=100)
