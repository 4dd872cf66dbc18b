"""Hyperparameters of TRPO (the algorithm: ``agents.algos.trpo``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.configs.onpolicy import OnPolicyConfig
from agents.errors import ConfigError
from agents.hyperparameters import hp


@dataclass
class TRPOConfig(OnPolicyConfig):
    """TRPO hyperparameters; Schulman et al. (2015) and SB3-contrib's TRPO defaults."""

    num_steps: int = hp(2048, ge=1)
    """Steps per env per update."""
    learning_rate: float = hp(1e-3, gt=0.0, le=1.0)
    """Adam step size of the value function (the policy's step size is set by max_kl)."""
    max_kl: float = hp(0.01, gt=0.0)
    """delta: the largest mean KL[pi_old, pi] an accepted step may have."""
    cg_iterations: int = hp(15, ge=1)
    """Conjugate-gradient iterations for the search direction."""
    cg_damping: float = hp(0.1, ge=0.0)
    """Added to the Fisher matrix's diagonal (F + damping I) for a well-posed solve."""
    line_search_shrink: float = hp(0.8, gt=0.0, lt=1.0)
    """Backtracking factor of the step."""
    line_search_max_steps: int = hp(10, ge=1)
    """Step sizes tried before the update is rejected."""
    value_epochs: int = hp(10, ge=1)
    """Passes of value regression per update."""
    value_num_minibatches: int = hp(16, ge=1)
    """Minibatches per value pass (2048 / 16 = 128 samples)."""

    def check_settings(self, spec: Any, algorithm: str) -> None:
        super().check_settings(spec, algorithm)
        if self.shared_network:
            raise ConfigError(
                "trpo needs separate policy and value networks (shared_network: false): value steps would move the policy outside its trust region"
            )
        self.check_minibatches("value_num_minibatches", self.value_num_minibatches)
