"""Learners the plug-in tests load by import path (``tests.plugin_example:Name``) and through an
entry point: a real variant of SAC, and classes that miss part of the interface."""

from __future__ import annotations

import torch

from agents.algos.sac import SAC
from agents.api import Algorithm
from agents.configs.sac import SACConfig


class HalfTemperatureSAC(SAC):
    """SAC whose entropy target is half the usual -|A| (a variant a user might benchmark)."""

    name = "half_temperature_sac"
    Config = SACConfig
    search_space = "plugin_example_space.yaml"

    def __init__(self, env_spec, config, total_steps, device="cpu", seed=0):
        super().__init__(env_spec, config, total_steps=total_steps, device=device, seed=seed)
        if hasattr(self, "target_entropy") and isinstance(self.target_entropy, float):
            self.target_entropy = 0.5 * self.target_entropy


class WithoutUpdate(Algorithm):
    """Misses every abstract method of the interface."""

    name = "without_update"
    Config = SACConfig


class WithoutConfig(SAC):
    name = "without_config"
    Config = None  # type: ignore[assignment]


class UndecoratedConfig(SACConfig):  # no @dataclass: its default would be ignored
    actor_lr: float = 1e-4


class WithUndecoratedConfig(SAC):
    name = "with_undecorated_config"
    Config = UndecoratedConfig


def not_a_class() -> torch.Tensor:
    return torch.zeros(1)


# -- an environment of a package: registered when its module is imported ---------------------------

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402


class Corridor(gym.Env):
    """Walk right along a corridor of ``length`` cells (reward 1 at the end, -0.01 a step);
    observation: the position as a fraction of the length."""

    def __init__(self, length: int = 5):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.position / self.length], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return self._obs(), {}

    def step(self, action):
        self.position = max(0, self.position + (1 if int(action) == 1 else -1))
        arrived = self.position >= self.length
        return self._obs(), 1.0 if arrived else -0.01, arrived, False, {}


if "PluginCorridor-v0" not in gym.registry:
    gym.register("PluginCorridor-v0", entry_point=Corridor, max_episode_steps=50)
