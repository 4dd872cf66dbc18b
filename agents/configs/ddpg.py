"""Hyperparameters of DDPG and TD3 (the algorithms: ``agents.algos.ddpg``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agents.configs.offpolicy import OffPolicyConfig
from agents.hyperparameters import defaults, hp


@dataclass
class DDPGConfig(OffPolicyConfig):
    """DDPG hyperparameters; defaults from Lillicrap et al. (2016) Sec. 7."""

    supports_discrete: ClassVar[bool] = False

    batch_size: int = hp(64, ge=1)
    learning_starts: int = hp(64, ge=0)
    hidden_sizes: tuple[int, ...] = hp((400, 300), ge=1)
    actor_lr: float = hp(1e-4, gt=0.0, le=1.0)
    """Adam step size of the actor."""
    critic_lr: float = hp(1e-3, gt=0.0, le=1.0)
    """Adam step size of the critics."""
    critic_weight_decay: float = hp(1e-2, ge=0.0)
    """L2 penalty on the critic weights (Adam weight_decay)."""
    tau: float = hp(0.001, gt=0.0, le=1.0)
    """Polyak coefficient of the target networks."""
    exploration_noise: str = hp("ou", choices=("ou", "gaussian"))
    """Ornstein-Uhlenbeck (temporally correlated) or independent Gaussian action noise."""
    noise_sigma: float = hp(0.2, ge=0.0)
    """Noise scale, in units of half the action range."""
    ou_theta: float = hp(0.15, ge=0.0)
    """Mean reversion rate of the OU process."""
    num_critics: int = hp(1, ge=1)
    """Q-functions; targets use their minimum."""
    policy_delay: int = hp(1, ge=1)
    """Critic steps per actor (and target) step."""
    target_policy_noise: float = hp(0.0, ge=0.0)
    """Std of the Gaussian noise on target actions (TD3's smoothing; 0 disables it)."""
    target_noise_clip: float = hp(0.5, ge=0.0)
    """Clip of the target action noise."""


@dataclass
@defaults(
    batch_size=256,
    start_steps=25_000,
    learning_starts=25_000,
    hidden_sizes=(256, 256),
    actor_lr=3e-4,
    critic_lr=3e-4,
    critic_weight_decay=0.0,
    tau=0.005,
    exploration_noise="gaussian",
    noise_sigma=0.1,
    num_critics=2,
    policy_delay=2,
    target_policy_noise=0.2,
)
class TD3Config(DDPGConfig):
    """TD3 hyperparameters: DDPG's, with the defaults of Fujimoto et al.'s reference implementation."""
