"""Hyperparameters of SAC (the algorithm: ``agents.algos.sac``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agents.configs.offpolicy import OffPolicyConfig
from agents.hyperparameters import hp


@dataclass
class SACConfig(OffPolicyConfig):
    """SAC hyperparameters; defaults from Haarnoja et al. (2018b) Table 1."""

    supports_recurrent: ClassVar[bool] = True

    start_steps: int = hp(5_000, ge=0)
    learning_starts: int = hp(5_000, ge=0)
    actor_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the actor."""
    critic_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the critics."""
    alpha_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of log(alpha) when tuned automatically."""
    tau: float = hp(0.005, gt=0.0, le=1.0)
    """Polyak coefficient of the target critics."""
    alpha: float | None = hp(None, gt=0.0)
    """Fixed entropy temperature; None tunes it automatically toward target_entropy."""
    initial_alpha: float = hp(1.0, gt=0.0)
    """Starting temperature when tuned automatically."""
    target_entropy: float | None = hp(None)
    """Entropy target; None means -dim(A) (Box) or 0.98 log |A| (Discrete, Christodoulou 2019)."""
    num_critics: int = hp(2, ge=1)
    """Q-functions; targets and the actor use their minimum (clipped double Q)."""
