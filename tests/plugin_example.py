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


def not_a_class() -> torch.Tensor:
    return torch.zeros(1)
