"""Hyperparameters of VPG, REINFORCE and A2C (the algorithms: ``agents.algos.vpg``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.configs.onpolicy import OnPolicyConfig
from agents.hyperparameters import hp


@dataclass
class VPGConfig(OnPolicyConfig):
    """Defaults of Spinning Up's VPG (Achiam 2018: 4000 steps per epoch, policy Adam 3e-4,
    value Adam 1e-3 for 80 iterations, gamma 0.99, lambda 0.97, 64x64 tanh)."""

    key_names: ClassVar[Mapping[str, str]] = {**OnPolicyConfig.key_names, "value_lr": "value_learning_rate"}

    num_steps: int = hp(4000, ge=1)
    """Steps per env per update (one policy-gradient step each)."""
    learning_rate: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the policy."""
    gae_lambda: float = hp(0.97, ge=0.0, le=1.0)
    """GAE lambda."""
    baseline: bool = hp(True)
    """Learn V(s) and use it as the baseline (False: REINFORCE on discounted returns-to-go)."""
    value_lr: float = hp(1e-3, gt=0.0, le=1.0)
    """Adam step size of the value function (separate networks)."""
    value_epochs: int = hp(80, ge=1)
    """Passes of value regression per update (separate networks)."""
    value_num_minibatches: int = hp(1, ge=1)
    """Minibatches per value pass (1: full-batch steps, as in Spinning Up)."""

    def check_settings(self, spec: Any, algorithm: str) -> None:
        super().check_settings(spec, algorithm)
        self.check_minibatches("value_num_minibatches", self.value_num_minibatches)


@dataclass
class REINFORCEConfig(VPGConfig):
    """VPG without a baseline (Williams 1992); otherwise Spinning Up's VPG defaults."""

    baseline: bool = hp(False)
    """Learn V(s) and use it as the baseline (False: REINFORCE on discounted returns-to-go)."""
    gae_lambda: float = hp(1.0, ge=0.0, le=1.0)
    """1: the advantages are the full discounted returns-to-go."""


@dataclass
class A2CConfig(OnPolicyConfig):
    """Mnih et al. (2016) with Stable-Baselines3's A2C defaults: 16 envs (the paper's 16
    actor-learners), 5-step rollouts, RMSprop 7e-4 (alpha 0.99, eps 1e-5), entropy 0.01 as in
    baselines' a2c, value coefficient 0.5, gradient clipping 0.5, no advantage normalization."""

    num_envs: int = hp(16, ge=1)
    """Parallel environments stepping in lockstep."""
    num_steps: int = hp(5, ge=1)
    """n of the n-step returns: steps per env per update."""
    learning_rate: float = hp(7e-4, gt=0.0, le=1.0)
    """Step size of the joint optimizer."""
    optimizer: str = hp("rmsprop", choices=("rmsprop", "adam"))
    """RMSprop as in the paper, or Adam."""
    rmsprop_alpha: float = hp(0.99, gt=0.0, lt=1.0)
    """RMSprop smoothing constant."""
    rmsprop_eps: float = hp(1e-5, gt=0.0)
    """RMSprop epsilon."""
    gae_lambda: float = hp(1.0, ge=0.0, le=1.0)
    """1: plain n-step returns, as in the paper."""
    center_adv: bool = hp(False)
    """A2C uses the raw advantages."""
    entropy_method: str = hp("regularized", choices=("no_entropy", "regularized", "max"))
    """Entropy regularization of the paper."""
    entropy_coef: float = hp(0.01, ge=0.0)
    """beta of the paper's entropy term."""
    max_grad_norm: float | None = hp(0.5, gt=0.0)
    """Global gradient-norm clip."""
    value_coef: float = hp(1.0, ge=0.0)
    """Weight of 0.5 (V - R)^2: 1.0 is SB3's and baselines' vf_coef 0.5 on the plain squared error."""
