"""Trust Region Policy Optimization.

Schulman, Levine, Moritz, Jordan, Abbeel (2015), "Trust Region Policy Optimization", Sec. 6
and App. C, with GAE advantages (Schulman et al. 2016):

    for iteration = 1, 2, ...:
        collect num_steps x num_envs steps; A_t by GAE
        g = grad of L(theta) = E[pi_theta(a|s) / pi_old(a|s) A]  at theta_old
        x = conjugate_gradient(F, g)        F v: Fisher-vector product of the mean KL, + damping v
        s = sqrt(2 max_kl / x^T F x) x     the step whose quadratic KL model equals max_kl
        theta = theta_old + shrink^j s     for the first j with KL[pi_old, pi] <= max_kl and L improved
                                           (no such j within line_search_max_steps: keep theta_old)
        fit V: value_epochs passes of value_num_minibatches Adam steps (its own optimizer)

Defaults: max_kl 0.01 (the paper's delta) and Stable-Baselines3-contrib's TRPO settings (2048
steps, 15 CG iterations, damping 0.1, line search 0.8^j for j < 10, value function: 10 epochs
of 128-sample minibatches with Adam 1e-3, gae_lambda 0.95, 64x64 tanh networks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from agents.algos.onpolicy import OneSeed, OnPolicyAlgorithm
from agents.algos.policy_gradient import PARTS, Seeds, entropy_bonus, process_advantages, rollout_batch
from agents.algos.seeds import per_seed_logs, seed_axis
from agents.api import set_gradients
from agents.batches import RolloutBatch
from agents.configs.trpo import TRPOConfig
from agents.optim import adam, assign_flat, backtracking_line_search, flatten_seeds, subtract_gradients, trust_region_step


class TRPO(OnPolicyAlgorithm):
    """TRPO; the policy and the value function are separate networks (no shared trunk)."""

    name = "trpo"
    Config: ClassVar[type[TRPOConfig]] = TRPOConfig
    tunable_parameters = (*OnPolicyAlgorithm.tunable_parameters, "max_kl")

    config: TRPOConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.policy_parameters = self.actor_critic.policy_parameters()
        policy_ids = {id(p) for p in self.policy_parameters}
        self._is_policy = [id(p) in policy_ids for p in self.parameters]

    def _make_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"value": adam(self.actor_critic.value_parameters(), lr=self.config.learning_rate)}

    def optimize(self, seeds: Seeds) -> dict[str, torch.Tensor]:
        """The trust-region step of every seed's policy (its own conjugate gradient and line
        search), then V fitted by its own optimizer."""
        step, logs = self.policy_step(seeds, seeds.full_batch())
        policy_parameters = seeds.policy_parameters()
        assign_flat(policy_parameters, flatten_seeds([p.detach() for p in policy_parameters], seeds.num_seeds) + step)
        logs.update(self.fit_value(seeds, self.config.value_epochs, self.config.value_num_minibatches))
        return logs

    # -- the natural-gradient step ----------------------------------------------------------

    def policy_objective(self, network: Any, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per seed (S,): the surrogate L = mean(r A) (+ the regularized entropy bonus) and the
        mean KL[pi_old, pi], at the current parameters; pi_old is rebuilt from the stored
        distribution parameters."""
        dist, _, flat = self.evaluate_seeds(network, batch)
        advantages = process_advantages(self.config, flat.advantages)
        ratio = (dist.log_prob(flat.actions) - flat.log_probs).exp()
        surrogate = (ratio * advantages).mean(dim=-1) + entropy_bonus(self.config, dist.entropy())
        mean_kl = self.actor_critic.distribution(flat.dist_params).kl(dist).mean(dim=-1)
        return surrogate, mean_kl

    def search_direction(self, seeds: Seeds, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Each seed's full step s (S, P) of the quadratic trust-region model, L at theta_old
        (S,), and the logs (S,)."""
        config = self.config
        surrogate, mean_kl = self.policy_objective(seeds.network, batch)
        full_step, gradient = trust_region_step(surrogate, mean_kl, seeds.policy_parameters(), config.max_kl, config.cg_iterations, config.cg_damping)
        return full_step, surrogate.detach(), {"surrogate": surrogate.detach(), "gradient_norm": gradient.norm(dim=-1)}

    @torch.no_grad()
    def line_search(
        self, seeds: Seeds, batch: RolloutBatch, full_step: torch.Tensor, surrogate_before: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Each seed backtracks from its ``full_step`` to the first step with KL <= max_kl and a
        better surrogate; returns those steps (S, P) (zeros where none) and the logs (S,); the
        parameters are left unchanged."""
        config = self.config
        return backtracking_line_search(
            seeds.policy_parameters(),
            lambda: self.policy_objective(seeds.network, batch),
            full_step,
            surrogate_before,
            config.max_kl,
            config.line_search_shrink,
            config.line_search_max_steps,
        )

    def policy_step(self, seeds: Seeds, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Each seed's accepted step (S, P) and the logs (S,); the parameters are left unchanged."""
        full_step, surrogate_before, logs = self.search_direction(seeds, batch)
        step, search_logs = self.line_search(seeds, batch, full_step, surrogate_before)
        return step, {**logs, **search_logs}

    def gradient_list(self, batch: Mapping[str, torch.Tensor], parts: tuple[str, ...] = PARTS) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Policy entries: minus the accepted trust-region step, so that ``apply_gradient_list``'
        theta <- theta - g takes it; value entries: gradients of the value loss."""
        gradients: list[torch.Tensor | None] = [None] * len(self.parameters)
        info: dict[str, float] = {}
        if "policy" in parts:
            step, logs = self.policy_step(OneSeed(self), seed_axis(rollout_batch(batch)))
            info.update(per_seed_logs(logs, 1)[0])
            steps = iter(step[0].split([p.numel() for p in self.policy_parameters]))
            for i, parameter in enumerate(self.parameters):
                if self._is_policy[i]:
                    gradients[i] = -next(steps).view_as(parameter)
        if "value" in parts:
            value_gradients, value_info = super().gradient_list(batch, parts=("value",))
            gradients = [v if not policy else g for g, v, policy in zip(gradients, value_gradients, self._is_policy)]
            info.update(value_info)
        return gradients, info

    def apply_gradient_list(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """theta_pi <- theta_pi - g (the trust-region step), then the value optimizer's step."""
        if gradients is not None:
            set_gradients(self.parameters, gradients)
        subtract_gradients(self.policy_parameters)
        super().apply_gradient_list()
