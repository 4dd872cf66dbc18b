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

from typing import ClassVar

import torch

from agents.algos.onpolicy import OnPolicyAlgorithm
from agents.algos.policy_gradient import Seeds
from agents.configs.vpg import A2CConfig, REINFORCEConfig, VPGConfig
from agents.optim import adam


class VPG(OnPolicyAlgorithm):
    """Vanilla policy gradient with a learned baseline fitted by its own optimizer.

    With ``shared_network`` the value head shares the policy's trunk, so both are trained by
    one optimizer on the joint loss in a single step (value_coef weighs the value loss).
    """

    name = "vpg"
    Config: ClassVar[type[VPGConfig]] = VPGConfig
    tunable_parameters = (*OnPolicyAlgorithm.tunable_parameters, "value_lr")

    config: VPGConfig

    @property
    def learns_value(self) -> bool:
        return self.config.baseline

    @property
    def _split(self) -> bool:
        return self.learns_value and not self.config.shared_network

    def _make_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        if not self._split:
            return super()._make_optimizers()
        return {
            "policy": adam(self.actor_critic.policy_parameters(), lr=self.config.learning_rate),
            "value": adam(self.actor_critic.value_parameters(), lr=self.config.value_lr),
        }

    def _base_learning_rates(self) -> dict[str, float]:
        if not self._split:
            return super()._base_learning_rates()
        return {"policy": self.config.learning_rate, "value": self.config.value_lr}

    def optimize(self, seeds: Seeds) -> dict[str, torch.Tensor]:
        """With separate networks: one policy step on the whole rollout, then V fitted by its
        own optimizer; with a shared one, a single step on the joint loss."""
        if not self._split:
            return super().optimize(seeds)
        logs = seeds.gradient_step(seeds.full_batch(), parts=("policy",))
        logs.update(self.fit_value(seeds, self.config.value_epochs, self.config.value_num_minibatches))
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
        return {"joint": torch.optim.RMSprop(self.parameters, lr=config.learning_rate, alpha=config.rmsprop_alpha, eps=config.rmsprop_eps)}
