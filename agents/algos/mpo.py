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
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from agents.algos.offpolicy import OffPolicyAlgorithm, weighted_mse
from agents.api import parameters_of
from agents.configs.mpo import MPOConfig
from agents.nets.offpolicy import GaussianActor, NetworkShape, make_critics
from agents.optim import adam, clip_gradients


def _inverse_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


def e_step(sampled_q: torch.Tensor, temperature: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-parametric improved policy and the temperature's dual loss (MPO eq. 9 and 10).

    sampled_q (N, B): Q of N actions sampled from the old policy in each of B states.
    Returns weights q(a_j|s) = softmax_j(Q / eta) (N, B), detached, and
    g(eta) = eta epsilon + eta mean_s log mean_j exp(Q(s, a_j) / eta), whose minimum over eta
    makes the mean KL(q || pi_old) equal to epsilon.
    """
    scaled = sampled_q / temperature
    log_mean_exp = torch.logsumexp(scaled, dim=0) - math.log(sampled_q.shape[0])
    dual = (temperature * epsilon + temperature * log_mean_exp.mean()).sum()
    return torch.softmax(scaled.detach(), dim=0), dual


def _gaussian_kl(mean_p: torch.Tensor, std_p: torch.Tensor, mean_q: torch.Tensor, std_q: torch.Tensor) -> torch.Tensor:
    """KL(N(mean_p, std_p) || N(mean_q, std_q)) per dimension: (B, d)."""
    return torch.log(std_q / std_p) + (std_p.pow(2) + (mean_p - mean_q).pow(2)) / (2 * std_q.pow(2)) - 0.5


def _gaussian_log_prob(actions: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(actions; mean, std) summed over dimensions: actions (N, B, d), mean/std (B, d) -> (N, B)."""
    return torch.distributions.Normal(mean, std, validate_args=False).log_prob(actions).sum(-1)


class MPO(OffPolicyAlgorithm):
    """MPO with decoupled KL constraints and a learned temperature, for Box actions."""

    name = "mpo"
    Config = MPOConfig
    config: MPOConfig
    tunable_parameters = ("actor_lr", "critic_lr", "dual_lr", "batch_size", "gradient_steps")

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

    # -- losses -----------------------------------------------------------------------------

    def _sample_actions(self, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """N actions per state from N(mean, std): (N, B, d), unclipped."""
        noise = torch.randn((self.config.num_action_samples, *mean.shape), generator=self.generator).to(self.device)
        return mean + std * noise

    def _q_of_samples(self, critic: torch.nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """min_i Q_i(s, a_j) for actions (N, B, d) -> (N, B); actions clipped to the box."""
        samples, batch = actions.shape[:2]
        repeated_obs = obs.flatten(1).expand(samples, -1, -1).reshape(samples * batch, -1)
        q_values = critic(repeated_obs, actions.clamp(-1.0, 1.0).reshape(samples * batch, -1))
        return q_values.min(dim=0).values.reshape(samples, batch)

    def compute_gradients(self, batch: Mapping[str, torch.Tensor]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Critic, policy and dual-variable losses -> gradients in that order."""
        obs, next_obs = batch["obs"], batch["next_obs"]
        config = self.config
        with torch.no_grad():
            next_mean, next_std = self.actor_target(next_obs)
            next_values = self._q_of_samples(self.critic_target, next_obs, self._sample_actions(next_mean, next_std)).mean(0)
            targets = batch["rewards"] + batch["discounts"] * (1.0 - batch["terminated"]) * next_values
            old_mean, old_std = self.actor_target(obs)
            sampled_actions = self._sample_actions(old_mean, old_std)  # (N, B, d)
            sampled_q = self._q_of_samples(self.critic_target, obs, sampled_actions)  # (N, B)
        q_values = self.critic(obs, batch["actions"])
        self.record_td_errors(q_values, targets)
        critic_loss = weighted_mse(q_values, targets, batch["weights"])

        temperature = F.softplus(self.temperature_param) + 1e-8
        weights, temperature_loss = e_step(sampled_q, temperature, config.epsilon)

        # M-step: weighted maximum likelihood with decoupled mean and std
        mean, std = self.actor(obs)
        log_prob_mean = _gaussian_log_prob(sampled_actions, mean, old_std)  # the old std: only the mean moves
        log_prob_std = _gaussian_log_prob(sampled_actions, old_mean, std)  # the old mean: only the std moves
        nll_mean = -(weights * log_prob_mean).sum(0).mean()
        nll_std = -(weights * log_prob_std).sum(0).mean()
        kl_mean = _gaussian_kl(old_mean, old_std, mean, old_std).mean(0)  # (d,)
        kl_std = _gaussian_kl(old_mean, old_std, old_mean, std).mean(0)
        if not config.per_dim_constraints:
            kl_mean, kl_std = kl_mean.sum(0, keepdim=True), kl_std.sum(0, keepdim=True)
        alpha_mean = F.softplus(self.alpha_mean_param) + 1e-8
        alpha_std = F.softplus(self.alpha_stddev_param) + 1e-8
        actor_loss = nll_mean + nll_std + (alpha_mean.detach() * kl_mean).sum() + (alpha_std.detach() * kl_std).sum()
        multiplier_loss = (alpha_mean * (config.epsilon_mean - kl_mean.detach())).sum() + (
            alpha_std * (config.epsilon_stddev - kl_std.detach())
        ).sum()

        groups = self.groups
        critic_gradients = list(torch.autograd.grad(critic_loss, groups["critic"][0]))
        actor_gradients = list(torch.autograd.grad(actor_loss, groups["actor"][0]))
        dual_gradients = list(torch.autograd.grad(temperature_loss + multiplier_loss, self.dual_parameters))
        if config.max_grad_norm is not None:
            clip_gradients(critic_gradients, config.max_grad_norm)
            clip_gradients(actor_gradients, config.max_grad_norm)
        info = {
            "critic_loss": critic_loss.item(),
            "actor_loss": actor_loss.item(),
            "q_mean": q_values.mean().item(),
            "temperature": temperature.item(),
            "kl_mean": kl_mean.sum().item(),
            "kl_stddev": kl_std.sum().item(),
            "alpha_mean": alpha_mean.mean().item(),
            "alpha_stddev": alpha_std.mean().item(),
            "policy_std": std.mean().item(),
        }
        return critic_gradients + actor_gradients + dual_gradients, info

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
