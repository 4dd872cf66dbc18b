"""Vanilla policy gradient (REINFORCE with or without a learned baseline) and A2C.

Williams (1992), "Simple statistical gradient-following algorithms", with the baseline and GAE
of Schulman et al. (2016), "High-Dimensional Continuous Control Using GAE":

    for iteration = 1, 2, ...:
        collect num_steps x num_envs steps with pi_theta
        A_t = GAE(gamma, lambda) with V as baseline      (no baseline: A_t = discounted return-to-go)
        one step of  grad_theta  -mean_t log pi_theta(a_t|s_t) A_t   [- c_H H]
        fit V to the returns: value_epochs passes of value_num_minibatches Adam steps

A2C, Mnih et al. (2016), "Asynchronous Methods for Deep Reinforcement Learning", Algorithm S3
in its synchronous form (OpenAI baselines' a2c): num_envs envs step together for n = num_steps
steps, then ONE optimizer step on the joint loss  -log pi A - c_H H + c_V (V - R)^2 / 2
with n-step bootstrapped returns (gae_lambda = 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from agents.algos.onpolicy import OnPolicyAlgorithm, OnPolicyConfig
from agents.api import hp
from agents.optim import adam


@dataclass
class VPGConfig(OnPolicyConfig):
    """Defaults of Spinning Up's VPG (Achiam 2018: 4000 steps per epoch, policy Adam 3e-4,
    value Adam 1e-3 for 80 iterations, gamma 0.99, lambda 0.97, 64x64 tanh)."""

    num_steps: int = hp(4000, ge=1)
    """Steps per env per update (one policy-gradient step each)."""
    learning_rate: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the policy."""
    gae_lambda: float = hp(0.97, ge=0.0, le=1.0)
    """GAE lambda."""
    baseline: bool = hp(True)
    """Learn V(s) and use it as the baseline (False: REINFORCE on discounted returns-to-go)."""
    value_learning_rate: float = hp(1e-3, gt=0.0, le=1.0)
    """Adam step size of the value function (separate networks)."""
    value_epochs: int = hp(80, ge=1)
    """Passes of value regression per update (separate networks)."""
    value_num_minibatches: int = hp(1, ge=1)
    """Minibatches per value pass (1: full-batch steps, as in Spinning Up)."""


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
    policy_ent_coeff: float = hp(0.01, ge=0.0)
    """beta of the paper's entropy term."""
    max_grad_norm: float | None = hp(0.5, gt=0.0)
    """Global gradient-norm clip."""
    value_coef: float = hp(1.0, ge=0.0)
    """Weight of 0.5 (V - R)^2: 1.0 is SB3's and baselines' vf_coef 0.5 on the plain squared error."""


class VPG(OnPolicyAlgorithm):
    """Vanilla policy gradient with a learned baseline fitted by its own optimizer.

    With ``shared_network`` the value head shares the policy's trunk, so both are trained by
    one optimizer on the joint loss in a single step (value_coef weighs the value loss).
    """

    name = "vpg"
    Config: ClassVar[type[VPGConfig]] = VPGConfig
    tunable_parameters = (*OnPolicyAlgorithm.tunable_parameters, "value_learning_rate")

    config: VPGConfig

    @property
    def learns_value(self) -> bool:
        return self.config.baseline

    @classmethod
    def check_config(cls, config: Any, spec: Any) -> None:
        super().check_config(config, spec)
        config.check_minibatches("value_num_minibatches", config.value_num_minibatches)

    @property
    def _split(self) -> bool:
        return self.learns_value and not self.config.shared_network

    def _make_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        if not self._split:
            return super()._make_optimizers()
        return {
            "policy": adam(self.actor_critic.policy_parameters(), lr=self.config.learning_rate),
            "value": adam(self.actor_critic.value_parameters(), lr=self.config.value_learning_rate),
        }

    def _base_learning_rates(self) -> dict[str, float]:
        if not self._split:
            return super()._base_learning_rates()
        return {"policy": self.config.learning_rate, "value": self.config.value_learning_rate}

    def _optimize(self) -> dict[str, float]:
        if not self._split:
            return super()._optimize()
        batch = self.storage.full_batch(self._sequence_length_or_none())
        gradients, logs = self.compute_gradients(batch, parts=("policy",))
        self.apply_gradients(gradients)
        logs.update(self.fit_value(self.config.value_epochs, self.config.value_num_minibatches))
        return logs


class REINFORCE(VPG):
    """VPG with no baseline: the policy gradient weighted by discounted returns-to-go.

    Rollouts are cut every num_steps, and an episode still running at the cut has no value to
    bootstrap from: those steps are left out of the loss (see ``_policy_advantages``), so the
    gradient is REINFORCE's over whole episodes, as when garage samples whole episodes. Choose
    num_steps long compared with an episode.
    """

    name = "reinforce"
    Config = REINFORCEConfig


class A2C(OnPolicyAlgorithm):
    """Synchronous advantage actor-critic: one joint optimizer step per n-step rollout."""

    name = "a2c"
    Config: ClassVar[type[A2CConfig]] = A2CConfig

    config: A2CConfig

    def _make_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        config = self.config
        if config.optimizer == "adam":
            return super()._make_optimizers()
        return {
            "joint": torch.optim.RMSprop(
                self.parameters, lr=config.learning_rate, alpha=config.rmsprop_alpha, eps=config.rmsprop_eps
            )
        }
