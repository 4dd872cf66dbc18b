"""Hyperparameters of DQN (the algorithm: ``agents.algos.dqn``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agents.configs.offpolicy import OffPolicyConfig
from agents.hyperparameters import hp


@dataclass
class DQNConfig(OffPolicyConfig):
    """DQN hyperparameters; defaults from Mnih et al. (2015) and SB3 (see module docstring)."""

    supports_continuous: ClassVar[bool] = False
    supports_recurrent: ClassVar[bool] = True

    batch_size: int = hp(32, ge=1)
    learning_starts: int = hp(50_000, ge=0)
    update_every: int = hp(4, ge=1)
    hidden_sizes: tuple[int, ...] = hp((64, 64), ge=1)
    learning_rate: float = hp(1e-4, gt=0.0, le=1.0)
    """Adam step size."""
    double_q: bool = hp(True)
    """Double DQN: the online network picks the next action, the target network values it."""
    dueling: bool = hp(False)
    """Dueling value/advantage head."""
    huber: bool = hp(True)
    """Huber (smooth L1) loss instead of squared error."""
    max_grad_norm: float | None = hp(10.0, gt=0.0)
    """Clip the global gradient norm (None: no clipping)."""
    target_update_every: int = hp(10_000, ge=1)
    """Gradient steps between target network updates."""
    tau: float = hp(1.0, gt=0.0, le=1.0)
    """Target update coefficient: 1 copies the online network (hard update), < 1 is Polyak averaging."""
    epsilon_start: float = hp(1.0, ge=0.0, le=1.0)
    """Exploration rate at the start of training."""
    epsilon_final: float = hp(0.05, ge=0.0, le=1.0)
    """Exploration rate after the decay."""
    exploration_fraction: float = hp(0.1, gt=0.0, le=1.0)
    """Fraction of the training budget over which epsilon decays linearly."""

    def budget_schedules(self) -> list[str]:
        """Epsilon decays over exploration_fraction of the budget, always."""
        return [*super().budget_schedules(), "exploration_fraction"]
