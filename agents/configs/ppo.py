"""Hyperparameters of PPO-clip, PPO with the adaptive KL penalty and the plain surrogate
(the algorithms: ``agents.algos.ppo``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.configs.onpolicy import OnPolicyConfig
from agents.hyperparameters import hp


@dataclass
class SurrogateConfig(OnPolicyConfig):
    """Hyperparameters of the minibatch surrogate family; Schulman et al. (2017) Table 3 and ppo2."""

    normalize_observations: bool = hp(True)
    """Running mean/std observation normalization (ppo2's VecNormalize)."""
    normalize_rewards: bool = hp(True)
    """Scale rewards by the running std of the discounted return (ppo2's VecNormalize)."""
    num_steps: int = hp(2048, ge=1)
    """Steps collected per env between updates (the horizon T)."""
    learning_rate: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size (initial value when annealed)."""
    anneal_lr: bool = hp(True)
    """Decay the learning rate linearly to 0 over the run."""
    num_epochs: int = hp(10, ge=1)
    """Passes over each rollout (K)."""
    num_minibatches: int = hp(32, ge=1)
    """Minibatches per epoch; 2048 / 32 = 64 samples each (sequences, for recurrent policies)."""
    gae_lambda: float = hp(0.95, ge=0.0, le=1.0)
    """GAE lambda."""
    entropy_method: str = hp("regularized", choices=("no_entropy", "regularized", "max"))
    """ppo2 adds an entropy bonus c2 H to the objective (with c2 = 0 on MuJoCo)."""
    max_grad_norm: float | None = hp(0.5, gt=0.0)
    """Global gradient-norm clip."""
    target_kl: float | None = hp(None, gt=0.0)
    """Stop the epochs early once the mean approximate KL of an epoch exceeds this (None: never)."""

    def check_settings(self, spec: Any, algorithm: str) -> None:
        super().check_settings(spec, algorithm)
        self.check_minibatches("num_minibatches", self.num_minibatches)


@dataclass
class PPOConfig(SurrogateConfig):
    """PPO-clip: Table 3 of Schulman et al. (2017) and baselines ppo2."""

    clip_range: float = hp(0.2, gt=0.0)
    """Clipping epsilon of the probability ratio."""
    anneal_clip_range: bool = hp(False)
    """Decay the clip range (and the value clip range) linearly to 0 over the run (ppo2's cliprange schedule)."""
    value_clip_range: float | None = hp(0.2, gt=0.0)
    """ppo2 clips the value update with the same epsilon."""


@dataclass
class PPOAdaptiveKLConfig(SurrogateConfig):
    """PPO with the adaptive KL penalty: Sec. 4 of Schulman et al. (2017) (d_targ 0.01, beta_0 1)."""

    kl_target: float = hp(0.01, gt=0.0)
    """d_targ: the KL per update the penalty steers towards."""
    kl_penalty: float = hp(1.0, gt=0.0)
    """Initial penalty coefficient beta (halved or doubled after each update)."""
