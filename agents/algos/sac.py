"""Soft Actor-Critic with N Q-functions and automatic entropy tuning, for Box or Discrete actions.

Haarnoja, Zhou, Hartikainen, Tucker, Ha, Tan, Kumar, Zhu, Gupta, Abbeel, Levine (2018),
"Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905, Algorithm 1:

    for each gradient step, on a batch from D:
        y      = r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s')
        critic: minimize sum_i (Q_i(s, a) - y)^2
        actor:  minimize alpha log pi(a~|s) - min_i Q_i(s, a~), a~ ~ pi(.|s) reparameterized
        alpha:  minimize -log(alpha) (log pi(a~|s) + H_target), H_target = -dim(A)
        Q'_i <- tau Q_i + (1 - tau) Q'_i

Discrete actions follow Christodoulou (2019), "Soft Actor-Critic for Discrete Action
Settings", arXiv:1910.07207: the critics output Q(s, .) for every action and the expectations
over pi are computed exactly instead of sampled (V(s') = sum_a pi(a|s') (min_i Q'_i(s', a) -
alpha log pi(a|s'))); the entropy target is 0.98 log |A|.

Defaults are the paper's (Table 1: Adam 3e-4 for all losses, batch 256, buffer 1e6, two
hidden layers of 256 ReLU units, tau 0.005, gamma 0.99, one gradient step per env step,
target entropy -dim(A)); uniform-random warm-up for the first 5,000 steps as in CleanRL's
``sac_continuous_action.py``. With n-step or prioritized replay, targets use the batch's
discounts gamma^m and the losses its importance weights. With ``recurrent`` a GRU/LSTM
encoder, trained by the critic loss, feeds the actor and critics (sequences with burn-in).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from agents.algos.offpolicy import OffPolicyAlgorithm, OffPolicySeedBatch, per_seed_weighted_mse, weighted_mse
from agents.algos.seeds import stacked_noise
from agents.api import parameters_of
from agents.configs.sac import SACConfig
from agents.nets import polyak_update
from agents.nets.distributions import Categorical, TanhGaussian
from agents.nets.offpolicy import CategoricalActor, SquashedGaussianActor, make_critics
from agents.nets.stacked import StackedActorTrunk, StackedCritics, stack_parameters
from agents.optim import adam


class SAC(OffPolicyAlgorithm):
    """SAC: tanh-squashed Gaussian policy for Box actions, categorical policy for Discrete."""

    name = "sac"
    Config = SACConfig
    config: SACConfig
    tunable_parameters = ("actor_lr", "critic_lr", "alpha_lr", "tau", "batch_size", "gradient_steps")

    def __init__(self, env_spec, config: SACConfig, total_steps: int, device: torch.device | str = "cpu", seed: int = 0):
        super().__init__(env_spec, config, total_steps, device, seed)
        shape, spec = self.head_shape(), env_spec
        actor_class = CategoricalActor if spec.discrete else SquashedGaussianActor
        self.actor = actor_class(self.feature_dim, spec.num_actions, shape).to(self.device)
        self.critic = make_critics(self.feature_dim, spec.discrete, spec.num_actions, shape, config.num_critics).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.auto_alpha = config.alpha is None
        initial = config.initial_alpha if self.auto_alpha else config.alpha
        self.log_alpha = torch.tensor(float(np.log(initial)), device=self.device, requires_grad=self.auto_alpha)
        if config.target_entropy is not None:
            self.target_entropy = config.target_entropy
        else:
            self.target_entropy = 0.98 * math.log(spec.num_actions) if spec.discrete else -float(spec.num_actions)
        # a recurrent encoder learns from the critic loss; the actor reads its features detached
        self.critic_parameters = parameters_of(*([self.encoder] if self.encoder is not None else []), self.critic)
        self.critic_optimizer = adam(self.critic_parameters, lr=config.critic_lr)
        self.actor_optimizer = adam(parameters_of(self.actor), lr=config.actor_lr)
        self.alpha_optimizer = adam([self.log_alpha], lr=config.alpha_lr) if self.auto_alpha else None

    def parameter_groups(self):
        return {
            "critic": (self.critic_parameters, self.critic_optimizer),
            "actor": (parameters_of(self.actor), self.actor_optimizer),
            "alpha": ([self.log_alpha] if self.auto_alpha else [], self.alpha_optimizer),
        }

    def policy_actions(self, features: torch.Tensor, deterministic: bool) -> torch.Tensor:
        dist = self.actor(features)
        return dist.mode() if deterministic else dist.sample(dist.draw_noise(self.generator))

    # -- losses -----------------------------------------------------------------------------

    def compute_gradients(self, batch: Mapping[str, torch.Tensor]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Critic, actor and temperature losses on one batch -> their gradients, in that order."""
        batch = self.encode(batch)
        alpha = self.log_alpha.exp().detach()
        critic_loss, q_mean = self._critic_loss(batch, alpha)
        actor_loss, log_probs = self._actor_loss(batch["features"].detach(), alpha)
        groups = self.groups
        gradients = list(torch.autograd.grad(critic_loss, groups["critic"][0]))
        gradients += torch.autograd.grad(actor_loss, groups["actor"][0])
        info = {
            "critic_loss": critic_loss.item(),
            "actor_loss": actor_loss.item(),
            "q_mean": q_mean,
            "alpha": alpha.item(),
            "entropy": -log_probs.mean().item(),
        }
        if self.auto_alpha:
            alpha_loss = -(self.log_alpha * (log_probs + self.target_entropy)).mean()
            gradients += torch.autograd.grad(alpha_loss, [self.log_alpha])
            info["alpha_loss"] = alpha_loss.item()
        return gradients, info

    def _critic_loss(self, batch: Mapping[str, torch.Tensor], alpha: torch.Tensor) -> tuple[torch.Tensor, float]:
        obs, next_obs, target_next_obs = batch["features"], batch["next_features"], batch["target_next_features"]
        with torch.no_grad():
            if self.spec.discrete:
                next_dist = self.actor(next_obs)
                next_probs = next_dist.logits.softmax(-1)
                next_log_probs = next_dist.logits.log_softmax(-1)
                next_q = self.critic_target(target_next_obs).min(dim=0).values  # (B, A)
                soft_next_value = (next_probs * (next_q - alpha * next_log_probs)).sum(-1)
            else:
                next_dist = self.actor(next_obs)
                next_actions, next_log_probs = next_dist.rsample_with_log_prob(next_dist.draw_noise(self.generator))
                soft_next_value = self.critic_target(target_next_obs, next_actions).min(dim=0).values - alpha * next_log_probs
            targets = batch["rewards"] + batch["discounts"] * (1.0 - batch["terminated"]) * soft_next_value
        if self.spec.discrete:
            q_values = self.critic(obs).gather(2, batch["actions"].long()[None, :, None].expand(self.config.num_critics, -1, 1)).squeeze(-1)
        else:
            q_values = self.critic(obs, batch["actions"])  # (num_critics, B)
        self.record_td_errors(q_values, targets)
        return weighted_mse(q_values, targets, batch["weights"]), q_values.mean().item()

    def _actor_loss(self, obs: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor loss and log pi (B,) for the temperature loss (an expectation over actions when discrete).

        ``obs`` are observations, or detached encoder features when recurrent."""
        if self.spec.discrete:
            dist = self.actor(obs)
            probs, log_probs = dist.logits.softmax(-1), dist.logits.log_softmax(-1)
            with torch.no_grad():
                q_values = self.critic(obs).min(dim=0).values
            loss = (probs * (alpha * log_probs - q_values)).sum(-1).mean()
            return loss, (probs * log_probs).sum(-1).detach()
        dist = self.actor(obs)
        actions, log_probs = dist.rsample_with_log_prob(dist.draw_noise(self.generator))
        q_values = self.critic(obs, actions).min(dim=0).values
        return (alpha * log_probs - q_values).mean(), log_probs.detach()

    def update_targets(self) -> None:
        polyak_update(self.critic_target, self.critic, self.config.tau)
        self.update_encoder_target(self.config.tau)

    # -- weights and state ------------------------------------------------------------------

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target, **self.encoder_modules()}

    def extra_state(self) -> dict[str, Any]:
        return {"log_alpha": self.log_alpha.detach().clone()}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])


class SACSeedBatch(OffPolicySeedBatch):
    """N seeds of SAC as one batched model: ``SAC.compute_gradients`` per seed, with each
    seed's temperature, noise and optimizer moments its own (see ``agents.algos.seeds``)."""

    members: list[SAC]  # type: ignore[assignment]

    def __init__(self, members: Sequence[SAC]):
        super().__init__(members)
        first = self.members[0]
        self.discrete, self.action_dim = first.spec.discrete, first.spec.num_actions
        self.actor = StackedActorTrunk([member.actor for member in self.members])
        self.critic = StackedCritics([member.critic for member in self.members])
        self.critic_target = StackedCritics([member.critic_target for member in self.members])
        self.log_alpha = stack_parameters([[member.log_alpha] for member in self.members])[0]
        self.auto_alpha, self.target_entropy = first.auto_alpha, first.target_entropy
        groups = {
            "critic": ([member.critic_optimizer for member in self.members], list(self.critic.parameters())),
            "actor": ([member.actor_optimizer for member in self.members], list(self.actor.parameters())),
        }
        if self.auto_alpha:
            groups["alpha"] = ([member.alpha_optimizer for member in self.members], [self.log_alpha])
        self.optimizers = self._stack_optimizers(groups)

    def _policy(self, obs: torch.Tensor) -> TanhGaussian | Categorical:
        """Every seed's policy at obs (N, B, ...), as ``SquashedGaussianActor`` or ``CategoricalActor`` gives it."""
        features = self.actor(obs)
        if self.discrete:
            return Categorical(features)
        mean, log_std = features.split(self.action_dim, dim=-1)
        return TanhGaussian(mean, log_std.clamp(SquashedGaussianActor.LOG_STD_MIN, SquashedGaussianActor.LOG_STD_MAX))

    def _noise(self, dist: TanhGaussian | Categorical) -> torch.Tensor:
        return stacked_noise(dist.draw, dist.noise_shape[1:], self.generators, self.device)

    def policy_actions(self, obs: torch.Tensor) -> torch.Tensor:
        dist = self._policy(obs)
        return dist.sample(self._noise(dist))

    def compute_gradients(self, batch):
        alpha = self.log_alpha.exp().detach()  # (N,)
        critic_loss, q_mean = self._critic_loss(batch, alpha)
        actor_loss, log_probs = self._actor_loss(batch["obs"], alpha)
        gradients = {
            "critic": list(torch.autograd.grad(critic_loss.sum(), self.optimizers["critic"].parameters)),
            "actor": list(torch.autograd.grad(actor_loss.sum(), self.optimizers["actor"].parameters)),
        }
        info = {"critic_loss": critic_loss, "actor_loss": actor_loss, "q_mean": q_mean, "alpha": alpha, "entropy": -log_probs.mean(dim=-1)}
        if self.auto_alpha:
            alpha_loss = -(self.log_alpha.unsqueeze(1) * (log_probs + self.target_entropy)).mean(dim=-1)
            gradients["alpha"] = list(torch.autograd.grad(alpha_loss.sum(), [self.log_alpha]))
            info["alpha_loss"] = alpha_loss
        return gradients, {key: value.detach() for key, value in info.items()}

    def _critic_loss(self, batch: Mapping[str, torch.Tensor], alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-seed critic losses (N,) and mean Q (N,)."""
        obs, next_obs = batch["obs"], batch["next_obs"]
        with torch.no_grad():
            next_dist = self._policy(next_obs)
            if self.discrete:
                assert isinstance(next_dist, Categorical)
                next_probs, next_log_probs = next_dist.logits.softmax(-1), next_dist.logits.log_softmax(-1)
                next_q = self.critic_target(next_obs).min(dim=1).values  # (N, B, A)
                soft_next_value = (next_probs * (next_q - alpha[:, None, None] * next_log_probs)).sum(-1)
            else:
                assert isinstance(next_dist, TanhGaussian)
                next_actions, next_log_probs = next_dist.rsample_with_log_prob(self._noise(next_dist))
                soft_next_value = self.critic_target(next_obs, next_actions).min(dim=1).values - alpha[:, None] * next_log_probs
            targets = batch["rewards"] + batch["discounts"] * (1.0 - batch["terminated"]) * soft_next_value
        if self.discrete:
            q_all = self.critic(obs)  # (N, num_critics, B, A)
            q_values = q_all.gather(3, batch["actions"].long()[:, None, :, None].expand(*q_all.shape[:3], 1)).squeeze(-1)
        else:
            q_values = self.critic(obs, batch["actions"])  # (N, num_critics, B)
        self.record_td_errors(q_values, targets)
        return per_seed_weighted_mse(q_values, targets, batch["weights"]), q_values.detach().mean(dim=(1, 2))

    def _actor_loss(self, obs: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-seed actor losses (N,) and log pi (N, B) for the temperature loss."""
        dist = self._policy(obs)
        if self.discrete:
            assert isinstance(dist, Categorical)
            probs, log_probs = dist.logits.softmax(-1), dist.logits.log_softmax(-1)
            with torch.no_grad():
                q_values = self.critic(obs).min(dim=1).values
            loss = (probs * (alpha[:, None, None] * log_probs - q_values)).sum(-1).mean(dim=-1)
            return loss, (probs * log_probs).sum(-1).detach()
        assert isinstance(dist, TanhGaussian)
        actions, log_probs = dist.rsample_with_log_prob(self._noise(dist))
        q_values = self.critic(obs, actions).min(dim=1).values
        return (alpha[:, None] * log_probs - q_values).mean(dim=-1), log_probs.detach()

    def update_targets(self) -> None:
        polyak_update(self.critic_target, self.critic, self.config.tau)


SAC.seed_batch = SACSeedBatch
