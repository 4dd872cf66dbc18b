"""Randomized Ensembled Double Q-learning (REDQ), as a plug-in of reprorl.

Chen, Wang, Zhou, Ross (2021), "Randomized Ensembled Double Q-Learning: Learning Fast Without a
Model", ICLR, Algorithm 1: SAC with an ensemble of N critics, each target the minimum over a
random subset of M of them, and many critic updates per env step (the update-to-data ratio G):

    for each of G gradient steps, on a batch from D:
        draw a set M of M distinct indices from {1, ..., N}
        y      = r + gamma (1 - terminated) (min_{i in M} Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s')
        critics: minimize sum_i (Q_i(s, a) - y)^2                   (every one of the N)
        Q'_i <- tau Q_i + (1 - tau) Q'_i
    once per env step (every G gradient steps):
        actor:  minimize alpha log pi(a~|s) - (1/N) sum_i Q_i(s, a~), a~ ~ pi(.|s) reparameterized
        alpha:  minimize -log(alpha) (log pi(a~|s) + H_target)

Defaults are the paper's (Appendix A, Table 2): N = 10, M = 2, G = 20, Adam 3e-4, batch 256,
two hidden layers of 256 units, tau 0.005, gamma 0.99, 5,000 uniform-random steps first,
H_target = -dim(A); the actor is updated once per env step as in the authors' code
(``policy_update_delay = 20``, G): ``policy_delay`` follows ``gradient_steps`` unless set.

It reuses reprorl's SAC for everything but the loss: networks stacked over a seed dimension (so
seeds train batched), replay, acting, checkpoints. The subset is drawn from each seed's own
generator through the seed tools, so a batch of seeds draws exactly what each seed alone would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, cast

import torch

from agents.algos.offpolicy_losses import SeedTools, per_seed_weighted_mse, td_errors
from agents.algos.sac import SAC, SACNetworks
from agents.batches import EncodedBatch
from agents.configs.sac import SACConfig
from agents.errors import ConfigError
from agents.hyperparameters import hp
from agents.nets.distributions import TanhGaussian, standard_normal


@dataclass
class REDQConfig(SACConfig):
    """REDQ's hyperparameters: SAC's, with the paper's ensemble and update-to-data ratio."""

    supports_recurrent: ClassVar[bool] = False  # the paper's feed-forward networks only
    supports_discrete: ClassVar[bool] = False  # the paper's continuous control

    num_critics: int = hp(10, ge=2)
    """N: the Q-functions of the ensemble."""
    in_target_critics: int = hp(2, ge=1)
    """M: the critics a target takes its minimum over, drawn anew at every gradient step."""
    gradient_steps: int = hp(20, ge=1)
    """G: critic updates per env step (the update-to-data ratio)."""
    policy_delay: int | None = hp(None, ge=1)
    """Gradient steps between the actor's (and the temperature's) updates; None: G of them, once
    per env step as in the authors' code, whatever G is."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.in_target_critics > self.num_critics:
            raise ConfigError(f"in_target_critics ({self.in_target_critics}) cannot exceed num_critics ({self.num_critics})")


class REDQ(SAC):
    """REDQ for Box actions (the paper's setting)."""

    name = "redq"
    Config = REDQConfig
    config: REDQConfig
    tunable_parameters = ("actor_lr", "critic_lr", "tau", "batch_size", "gradient_steps", "in_target_critics")
    search_space = "redq_space.yaml"

    def __init__(self, env_spec, config: REDQConfig, total_steps: int, device: torch.device | str = "cpu", seed: int = 0):
        if env_spec.discrete:
            raise ConfigError("redq needs continuous (Box) actions")
        super().__init__(env_spec, config, total_steps, device, seed)

    def actor_step_now(self) -> bool:
        """Whether this gradient step updates the actor and the temperature (every policy_delay)."""
        delay = self.config.policy_delay or self.config.gradient_steps
        return (self.num_updates + 1) % delay == 0

    def update_phase(self) -> bool:
        return self.actor_step_now()

    def seeds_gradients(self, networks: SACNetworks, batch: EncodedBatch, tools: SeedTools):
        """Algorithm 1's losses per seed: every critic toward a target over M random critics;
        on the delayed steps, the actor against the ensemble's mean and the temperature."""
        obs, next_obs, target_next_obs = batch.features, batch.next_features, batch.target_next_features
        config = self.config
        alpha = networks.log_alpha.exp().detach()[:, None]  # (S, 1)
        # y = r + gamma (1 - d) (min_{i in M} Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s')
        with torch.no_grad():
            next_dist = cast(TanhGaussian, self.policy(networks, next_obs))
            next_actions, next_log_probs = next_dist.rsample_with_log_prob(tools.noise(next_dist.draw, next_dist.noise_shape[1:]))
            next_q = networks.critic_target(target_next_obs, next_actions)  # (S, N, B)
            chosen = random_subset(tools.noise(standard_normal, (config.num_critics,)), config.in_target_critics)  # (S, M)
            in_target = next_q.gather(1, chosen[:, :, None].expand(-1, -1, next_q.shape[-1]))  # (S, M, B)
            targets = batch.rewards + batch.discounts * (1.0 - batch.terminated) * (in_target.min(dim=1).values - alpha * next_log_probs)
        # critics: sum_i (Q_i(s, a) - y)^2, all N of them
        q_values = networks.critic(obs, batch.actions)  # (S, N, B)
        critic_loss = per_seed_weighted_mse(q_values, targets, batch.weights)
        gradients = {"critic": tools.gradients("critic", critic_loss)}
        logs = {"critic_loss": critic_loss.detach(), "q_mean": q_values.detach().mean(dim=(1, 2))}
        if self.actor_step_now():
            # actor: alpha log pi(a~|s) - (1/N) sum_i Q_i(s, a~), a~ ~ pi(.|s) reparameterized
            actor_obs = obs.detach()
            dist = cast(TanhGaussian, self.policy(networks, actor_obs))
            actions, log_probs = dist.rsample_with_log_prob(tools.noise(dist.draw, dist.noise_shape[1:]))
            actor_loss = (alpha * log_probs - networks.critic(actor_obs, actions).mean(dim=1)).mean(dim=-1)
            gradients["actor"] = tools.gradients("actor", actor_loss)
            logs.update(actor_loss=actor_loss.detach(), alpha=alpha[:, 0], entropy=-log_probs.detach().mean(dim=-1))
            # temperature: -log(alpha) (log pi(a~|s) + H_target), when it is learned (SAC's temperature)
            alpha_loss = self.temperature.loss(networks.log_alpha, log_probs.detach(), self.target_entropy)
            if alpha_loss is not None:
                gradients["alpha"] = tools.gradients("alpha", alpha_loss)
                logs["alpha_loss"] = alpha_loss.detach()
        return gradients, logs, td_errors(q_values, targets) if config.prioritized else None


def random_subset(noise: torch.Tensor, size: int) -> torch.Tensor:
    """Indices of ``size`` distinct critics per seed, uniformly at random: the positions of the
    ``size`` smallest of each seed's i.i.d. draws ``noise`` (S, N) -> (S, size)."""
    return noise.argsort(dim=1)[:, :size]
