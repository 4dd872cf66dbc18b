"""Hyperparameters of MPO (the algorithm: ``agents.algos.mpo``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agents.configs.offpolicy import OffPolicyConfig
from agents.hyperparameters import hp


@dataclass
class MPOConfig(OffPolicyConfig):
    """MPO hyperparameters; defaults from Acme's MPO agent (see module docstring)."""

    supports_discrete: ClassVar[bool] = False

    learning_starts: int = hp(1_000, ge=0)
    actor_lr: float = hp(1e-4, gt=0.0, le=1.0)
    """Adam step size of the policy."""
    critic_lr: float = hp(1e-4, gt=0.0, le=1.0)
    """Adam step size of the critic."""
    dual_lr: float = hp(1e-2, gt=0.0, le=1.0)
    """Adam step size of the temperature and the Lagrange multipliers."""
    epsilon: float = hp(0.1, gt=0.0)
    """E-step KL bound between the improved non-parametric policy and the old policy."""
    epsilon_mean: float = hp(2.5e-3, gt=0.0)
    """M-step KL bound on the change of the mean."""
    epsilon_stddev: float = hp(1e-6, gt=0.0)
    """M-step KL bound on the change of the standard deviation."""
    num_action_samples: int = hp(20, ge=1)
    """Actions sampled per state for the E-step and the critic target."""
    initial_temperature: float = hp(1.3133, gt=0.0)
    """Starting eta (Acme: softplus(1))."""
    initial_alpha_mean: float = hp(1.3133, gt=0.0)
    """Starting Lagrange multiplier of the mean constraint (Acme: softplus(1))."""
    initial_alpha_stddev: float = hp(10.0, gt=0.0)
    """Starting Lagrange multiplier of the std constraint."""
    per_dim_constraints: bool = hp(True)
    """One multiplier (and KL bound) per action dimension instead of one for the sum."""
    target_update_every: int = hp(100, ge=1)
    """Gradient steps between copies into the target policy and critic."""
    num_critics: int = hp(1, ge=1)
    """Q-functions; targets use their minimum."""
    max_grad_norm: float | None = hp(40.0, gt=0.0)
    """Clip each network's gradient norm (None: no clipping)."""
