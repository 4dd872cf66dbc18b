"""Maximum a posteriori Policy Optimisation (MPO) for continuous actions.

Abdolmaleki, Springenberg, Tassa, Munos, Heess, Riedmiller (2018), "Maximum a Posteriori
Policy Optimisation", arXiv:1806.06920, Algorithm 1, with the decoupled mean / covariance
constraints of Abdolmaleki et al. (2018b), "Relative Entropy Regularized Policy Iteration",
arXiv:1812.02256, Sec. 4.2. For a batch of states s and N actions a_j ~ pi_old(.|s):

    critic:  y = r + gamma (1 - terminated) mean_j Q'(s', a'_j),  a'_j ~ pi_old(.|s')
    E-step:  q(a_j|s) = softmax_j(Q'(s, a_j) / eta)      (non-parametric improved policy)
             eta minimizes eta epsilon + eta mean_s log mean_j exp(Q'(s, a_j) / eta)
             (the dual of: maximize E_q[Q] s.t. KL(q || pi_old) < epsilon)
    M-step:  maximize sum_j q(a_j|s) log pi(a_j|s)   (weighted maximum likelihood)
             s.t. KL_mu(pi_old || pi) < epsilon_mean, KL_Sigma(pi_old || pi) < epsilon_stddev,
             each enforced by a Lagrange multiplier alpha trained by gradient descent on
             alpha (epsilon - KL), while the policy minimizes -log-likelihood + alpha KL.
    decoupling: the mean is fitted with the old policy's std and the std with the old mean,
             so each KL bound limits one of them.

pi_old is a target policy copied every ``target_update_every`` gradient steps, as is the
target critic. The policy is a diagonal Gaussian whose mean is squashed into the action box
by a tanh (Acme leaves it unbounded); sampled actions are clipped to the box. All losses
come from one batch and are applied together, as in Acme.
Defaults are those of DeepMind's Acme MPO agent for continuous control (epsilon 0.1,
epsilon_mean 2.5e-3, epsilon_stddev 1e-6, per-dimension constraints, 20 sampled actions,
Adam 1e-4 for the policy and critic and 1e-2 for the dual variables, targets copied every
100 steps, batch 256), with 256-256 networks.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agents.algos.offpolicy import OffPolicyAlgorithm
from agents.algos.offpolicy_batch import OffPolicySeedBatch
from agents.algos.offpolicy_losses import SeedTools, one_seed, per_seed_weighted_mse, td_errors
from agents.api import Hyperparameters, batched_by, parameters_of
from agents.batches import EncodedBatch
from agents.configs.mpo import MPOConfig
from agents.nets.distributions import standard_normal
from agents.nets.offpolicy import GaussianActor, NetworkShape, make_critics
from agents.nets.stacked import StackedActorTrunk, StackedCritics, stack_parameters
from agents.optim import adam


def _inverse_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


def e_step(sampled_q: torch.Tensor, temperature: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-parametric improved policy and the temperature's dual loss (MPO eq. 9 and 10), per seed.

    sampled_q (S, N, B): Q of N actions sampled from the old policy in each of B states;
    temperature (S, 1). Returns weights q(a_j|s) = softmax_j(Q / eta) (S, N, B), detached, and
    g(eta) = eta epsilon + eta mean_s log mean_j exp(Q(s, a_j) / eta) (S,), whose minimum over
    eta makes the mean KL(q || pi_old) equal to epsilon.
    """
    scaled = sampled_q / temperature[:, :, None]
    log_mean_exp = torch.logsumexp(scaled, dim=1) - math.log(sampled_q.shape[1])  # (S, B)
    dual = (temperature * epsilon + temperature * log_mean_exp.mean(dim=-1, keepdim=True)).sum(dim=-1)
    return torch.softmax(scaled.detach(), dim=1), dual


def _gaussian_kl(mean_p: torch.Tensor, std_p: torch.Tensor, mean_q: torch.Tensor, std_q: torch.Tensor) -> torch.Tensor:
    """KL(N(mean_p, std_p) || N(mean_q, std_q)) per dimension: (..., B, d)."""
    return torch.log(std_q / std_p) + (std_p.pow(2) + (mean_p - mean_q).pow(2)) / (2 * std_q.pow(2)) - 0.5


def _gaussian_log_prob(actions: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(actions; mean, std) summed over dimensions: actions (S, N, B, d), mean/std (S, B, d) -> (S, N, B)."""
    return torch.distributions.Normal(mean.unsqueeze(1), std.unsqueeze(1), validate_args=False).log_prob(actions).sum(-1)


@dataclass
class MPONetworks:
    """MPO's networks and dual variables as its losses call them, over a leading seed dimension S."""

    actor: Callable[[torch.Tensor], torch.Tensor]
    """obs (S, B, ...) -> the actor trunk's outputs (S, B, 2d), before its head."""
    actor_target: Callable[[torch.Tensor], torch.Tensor]
    critic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """obs (S, B, ...), actions (S, B, d) -> (S, num_critics, B)."""
    critic_target: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    temperature_param: torch.Tensor
    """(S, 1), in softplus space, as the two multipliers below (S, d or 1)."""
    alpha_mean_param: torch.Tensor
    alpha_stddev_param: torch.Tensor


class MPO(OffPolicyAlgorithm):
    """MPO with decoupled KL constraints and a learned temperature, for Box actions."""

    seed_batch = batched_by("MPOSeedBatch")

    name = "mpo"
    critic_ensemble = True
    Config = MPOConfig
    config: MPOConfig
    tunable_parameters = ("actor_lr", "critic_lr", "dual_lr", "batch_size", "gradient_steps")
    learning_rates = {"actor_lr": "actor", "critic_lr": "critic", "dual_lr": "dual"}

    @classmethod
    def unsplittable_steps(cls, config: Hyperparameters, device: str = "cpu") -> str | None:
        return f"{cls.name}'s E-step optimizes its temperature over the whole batch; gradient workers cannot split it"

    def __init__(self, env_spec, config: MPOConfig, total_steps: int, device: torch.device | str = "cpu", seed: int = 0):
        super().__init__(env_spec, config, total_steps, device, seed)
        shape, action_dim = NetworkShape.of(config), env_spec.num_actions
        self.actor = GaussianActor(self.obs_dim, action_dim, shape).to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = make_critics(self.obs_dim, False, action_dim, shape, config.num_critics).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        multipliers = action_dim if config.per_dim_constraints else 1

        def dual(initial: float, size: int) -> torch.Tensor:
            # dual variables live in softplus space so they stay positive
            return torch.full((size,), _inverse_softplus(initial), device=self.device, requires_grad=True)

        self.temperature_param = dual(config.initial_temperature, 1)
        self.alpha_mean_param = dual(config.initial_alpha_mean, multipliers)
        self.alpha_stddev_param = dual(config.initial_alpha_stddev, multipliers)
        self.dual_parameters = [self.temperature_param, self.alpha_mean_param, self.alpha_stddev_param]
        self.actor_optimizer = adam(parameters_of(self.actor), lr=config.actor_lr)
        self.critic_optimizer = adam(parameters_of(self.critic), lr=config.critic_lr)
        self.dual_optimizer = adam(self.dual_parameters, lr=config.dual_lr)

    def parameter_groups(self):
        return {
            "critic": (parameters_of(self.critic), self.critic_optimizer),
            "actor": (parameters_of(self.actor), self.actor_optimizer),
            "dual": (self.dual_parameters, self.dual_optimizer),
        }

    def policy_actions(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        mean, std = self.actor(obs)
        if deterministic:
            return mean
        noise = torch.randn(mean.shape, generator=self.generator).to(self.device)
        return (mean + std * noise).clamp(-1.0, 1.0)

    # -- losses (over a leading seed dimension: one run is S = 1, a batch of seeds S = N) -----

    def networks(self) -> MPONetworks:
        return MPONetworks(
            actor=one_seed(self.actor.features),
            actor_target=one_seed(self.actor_target.features),
            critic=one_seed(self.critic),
            critic_target=one_seed(self.critic_target),
            temperature_param=self.temperature_param.unsqueeze(0),
            alpha_mean_param=self.alpha_mean_param.unsqueeze(0),
            alpha_stddev_param=self.alpha_stddev_param.unsqueeze(0),
        )

    def policy(self, trunk: Callable[[torch.Tensor], torch.Tensor], obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return GaussianActor.head(trunk(obs), self.spec.num_actions, self.actor.min_std)

    def _q_of_samples(self, critic: Callable[..., torch.Tensor], obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """min_i Q_i(s, a_j) for actions (S, N, B, d) -> (S, N, B); actions clipped to the box."""
        seeds, samples, batch = actions.shape[:3]
        repeated_obs = obs.flatten(2).unsqueeze(1).expand(-1, samples, -1, -1).reshape(seeds, samples * batch, -1)
        q_values = critic(repeated_obs, actions.clamp(-1.0, 1.0).reshape(seeds, samples * batch, -1))
        return q_values.min(dim=1).values.reshape(seeds, samples, batch)

    def seeds_gradients(self, networks: MPONetworks, batch: EncodedBatch, tools: SeedTools):
        """Critic, policy and dual-variable losses per seed, differentiated in that order."""
        obs, next_obs = batch.obs, batch.next_obs
        config = self.config
        samples = config.num_action_samples

        def sample(mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:  # N actions per state, unclipped: (S, N, B, d)
            return mean.unsqueeze(1) + std.unsqueeze(1) * tools.noise(standard_normal, (samples, *mean.shape[1:]))

        # critic: y = r + gamma (1 - d) mean_j Q'(s', a'_j), a'_j ~ pi_old(.|s')
        with torch.no_grad():
            next_mean, next_std = self.policy(networks.actor_target, next_obs)
            next_values = self._q_of_samples(networks.critic_target, next_obs, sample(next_mean, next_std)).mean(dim=1)
            targets = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_values
            old_mean, old_std = self.policy(networks.actor_target, obs)
            sampled_actions = sample(old_mean, old_std)  # (S, N, B, d)
            sampled_q = self._q_of_samples(networks.critic_target, obs, sampled_actions)  # (S, N, B)
        q_values = networks.critic(obs, batch.actions)  # (S, num_critics, B)
        critic_loss = per_seed_weighted_mse(q_values, targets, batch.weights)

        # E-step: q(a_j|s) = softmax_j(Q'(s, a_j) / eta), and eta's dual
        temperature = F.softplus(networks.temperature_param) + 1e-8  # (S, 1)
        weights, temperature_loss = e_step(sampled_q, temperature, config.epsilon)

        # M-step: weighted maximum likelihood with decoupled mean and std
        mean, std = self.policy(networks.actor, obs)
        log_prob_mean = _gaussian_log_prob(sampled_actions, mean, old_std)  # the old std: only the mean moves
        log_prob_std = _gaussian_log_prob(sampled_actions, old_mean, std)  # the old mean: only the std moves
        nll_mean = -(weights * log_prob_mean).sum(dim=1).mean(dim=-1)
        nll_std = -(weights * log_prob_std).sum(dim=1).mean(dim=-1)
        kl_mean = _gaussian_kl(old_mean, old_std, mean, old_std).mean(dim=1)  # (S, d)
        kl_std = _gaussian_kl(old_mean, old_std, old_mean, std).mean(dim=1)
        if not config.per_dim_constraints:
            kl_mean, kl_std = kl_mean.sum(-1, keepdim=True), kl_std.sum(-1, keepdim=True)
        alpha_mean = F.softplus(networks.alpha_mean_param) + 1e-8
        alpha_std = F.softplus(networks.alpha_stddev_param) + 1e-8
        actor_loss = nll_mean + nll_std + (alpha_mean.detach() * kl_mean).sum(-1) + (alpha_std.detach() * kl_std).sum(-1)
        multiplier_loss = (alpha_mean * (config.epsilon_mean - kl_mean.detach())).sum(-1) + (alpha_std * (config.epsilon_stddev - kl_std.detach())).sum(-1)

        gradients = {
            "critic": tools.gradients("critic", critic_loss),
            "actor": tools.gradients("actor", actor_loss),
            "dual": tools.gradients("dual", temperature_loss + multiplier_loss),
        }
        if config.max_grad_norm is not None:
            tools.clip(gradients["critic"], config.max_grad_norm)
            tools.clip(gradients["actor"], config.max_grad_norm)
        logs = {
            "critic_loss": critic_loss.detach(),
            "actor_loss": actor_loss.detach(),
            "q_mean": q_values.detach().mean(dim=(1, 2)),
            "temperature": temperature.detach()[:, 0],
            "kl_mean": kl_mean.detach().sum(-1),
            "kl_stddev": kl_std.detach().sum(-1),
            "alpha_mean": alpha_mean.detach().mean(-1),
            "alpha_stddev": alpha_std.detach().mean(-1),
            "policy_std": std.detach().mean(dim=(1, 2)),
        }
        return gradients, logs, td_errors(q_values, targets) if config.prioritized else None

    def update_targets(self) -> None:
        if self.num_updates % self.config.target_update_every == 0:
            self.actor_target.load_state_dict(self.actor.state_dict())
            self.critic_target.load_state_dict(self.critic.state_dict())

    # -- weights and state ------------------------------------------------------------------

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"actor": self.actor, "actor_target": self.actor_target, "critic": self.critic, "critic_target": self.critic_target}

    def extra_state(self) -> dict[str, Any]:
        return {"dual": [p.detach().clone() for p in self.dual_parameters]}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        with torch.no_grad():
            for parameter, value in zip(self.dual_parameters, state["dual"]):
                parameter.copy_(value)


class MPOSeedBatch(OffPolicySeedBatch):
    """N seeds of MPO as one batched model: the members' losses on stacked networks and dual
    variables, each seed's action samples and exploration noise its own."""

    members: list[MPO]  # type: ignore[assignment]
    config: MPOConfig

    def __init__(self, members: Sequence[MPO]):
        super().__init__(members)
        actor = StackedActorTrunk([member.actor for member in self.members])
        critic = StackedCritics([member.critic for member in self.members])
        duals = stack_parameters([member.dual_parameters for member in self.members])
        self.networks = MPONetworks(
            actor=actor,
            actor_target=StackedActorTrunk([member.actor_target for member in self.members]),
            critic=critic,
            critic_target=StackedCritics([member.critic_target for member in self.members]),
            temperature_param=duals[0],
            alpha_mean_param=duals[1],
            alpha_stddev_param=duals[2],
        )
        self.optimizers = self._stack_optimizers(
            {
                "critic": ([member.critic_optimizer for member in self.members], list(critic.parameters())),
                "actor": ([member.actor_optimizer for member in self.members], list(actor.parameters())),
                "dual": ([member.dual_optimizer for member in self.members], duals),
            }
        )

    def policy_actions(self, obs: torch.Tensor) -> torch.Tensor:
        mean, std = self.members[0].policy(self.networks.actor, obs)
        return (mean + std * self.tools.noise(standard_normal, mean.shape[1:])).clamp(-1.0, 1.0)

    def update_targets(self) -> None:
        if self.members[0].num_updates % self.config.target_update_every == 0:
            networks = self.networks
            with torch.no_grad():
                for target, online in ((networks.actor_target, networks.actor), (networks.critic_target, networks.critic)):
                    for target_parameter, parameter in zip(target.parameters(), online.parameters(), strict=True):
                        target_parameter.copy_(parameter)
