"""Deterministic policy gradients: DDPG and TD3.

DDPG, Lillicrap, Hunt, Pritzel, Heess, Erez, Tassa, Silver, Wierstra (2016), "Continuous
control with deep reinforcement learning", Algorithm 1:

    a = mu(s) + exploration noise (Ornstein-Uhlenbeck in the paper, or Gaussian)
    for each gradient step, on a batch from D:
        y      = r + gamma (1 - terminated) Q'(s', mu'(s'))
        critic: minimize (Q(s, a) - y)^2
        actor:  maximize Q(s, mu(s))
        Q' <- tau Q + (1 - tau) Q';  mu' <- tau mu + (1 - tau) mu'

Defaults are the paper's (Sec. 7: Adam 1e-4 actor / 1e-3 critic, L2 weight decay 1e-2 on
the critic, gamma 0.99, tau 0.001, hidden layers 400 and 300, batch 64, buffer 1e6, OU noise
theta 0.15, sigma 0.2).

TD3, Fujimoto, van Hoof, Meger (2018), "Addressing Function Approximation Error in
Actor-Critic Methods", Algorithm 1, adds to DDPG:

    clipped double Q:         y = r + gamma (1 - terminated) min_{i=1,2} Q'_i(s', a~)
    target policy smoothing:  a~ = clip(mu'(s') + clip(N(0, sigma~), -c, c), -1, 1)
    delayed updates:          the actor and all targets move every d-th critic step

Both networks' gradients are computed on the same batch before either optimizer steps (the
compute_gradients / apply_gradients split lets workers compute them remotely), so the actor
follows the critic of the previous step; the reference implementations step the critic
first. TD3's defaults are those of the authors' reference implementation (github.com/sfujimoto/TD3,
main.py: 256-256 networks, Adam 3e-4, batch 256, tau 0.005, Gaussian exploration noise 0.1,
sigma~ 0.2, c 0.5, d 2, 25,000 initial random steps).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agents.algos.offpolicy import OffPolicyAlgorithm
from agents.algos.offpolicy_batch import OffPolicySeedBatch
from agents.algos.offpolicy_losses import SeedTools, one_seed, per_seed_weighted_mse, td_errors
from agents.api import Transitions, batched_by, parameters_of
from agents.batches import EncodedBatch
from agents.configs.ddpg import DDPGConfig, TD3Config
from agents.nets import polyak_update
from agents.nets.distributions import standard_normal
from agents.nets.offpolicy import DeterministicActor, NetworkShape, make_critics
from agents.nets.stacked import StackedActorTrunk, StackedCritics
from agents.optim import adam


class DDPG(OffPolicyAlgorithm):
    """DDPG for Box actions; TD3 is the same algorithm with its three changes switched on."""

    seed_batch = batched_by("DDPGSeedBatch")

    name = "ddpg"
    critic_ensemble = True
    Config = DDPGConfig
    config: DDPGConfig
    tunable_parameters = ("actor_lr", "critic_lr", "tau", "noise_sigma", "batch_size", "gradient_steps")
    learning_rates = {"actor_lr": "actor", "critic_lr": "critic"}

    def __init__(self, env_spec, config: DDPGConfig, total_steps: int, device: torch.device | str = "cpu", seed: int = 0):
        super().__init__(env_spec, config, total_steps, device, seed)
        shape = NetworkShape.of(config)
        self.actor = DeterministicActor(self.obs_dim, env_spec.num_actions, shape).to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = make_critics(self.obs_dim, False, env_spec.num_actions, shape, config.num_critics).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optimizer = adam(parameters_of(self.actor), lr=config.actor_lr)
        self.critic_optimizer = adam(parameters_of(self.critic), lr=config.critic_lr, weight_decay=config.critic_weight_decay)
        self.ou_state = torch.zeros(config.num_envs, env_spec.num_actions, device=self.device)

    def parameter_groups(self):
        return {
            "critic": (parameters_of(self.critic), self.critic_optimizer),
            "actor": (parameters_of(self.actor), self.actor_optimizer),
        }

    # -- acting: the deterministic policy plus exploration noise -----------------------------

    def policy_actions(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        actions = self.actor(obs)
        if deterministic:
            return actions
        return (actions + self.action_noise(actions.shape)).clamp(-1.0, 1.0)

    def action_noise(self, shape: torch.Size) -> torch.Tensor:
        sigma = self.config.noise_sigma
        gaussian = torch.randn(shape, generator=self.generator).to(self.device)
        if self.config.exploration_noise == "gaussian" or shape[0] != self.ou_state.shape[0]:
            return sigma * gaussian
        # Ornstein-Uhlenbeck with dt = 1: x <- x - theta x + sigma N(0, 1), one process per env
        self.ou_state += -self.config.ou_theta * self.ou_state + sigma * gaussian
        return self.ou_state

    def observe(self, transitions: Transitions) -> None:
        super().observe(transitions)
        ended = (transitions.terminated | transitions.truncated).to(self.device)
        self.ou_state[ended] = 0.0  # a new episode starts a new noise process

    def interrupt_episodes(self, final_obs: torch.Tensor, state: Any = None) -> None:
        super().interrupt_episodes(final_obs, state)
        self.ou_state.zero_()

    # -- losses -----------------------------------------------------------------------------

    def _actor_step_now(self) -> bool:
        return (self.num_updates + 1) % self.config.policy_delay == 0

    capturable_update = True

    def update_phase(self) -> bool:
        """Whether the next step is a delayed one: the actor steps and the targets move."""
        return self._actor_step_now()

    def networks(self) -> DDPGNetworks:
        return DDPGNetworks(
            actor=one_seed(self.actor.features),
            actor_target=one_seed(self.actor_target.features),
            critic=one_seed(self.critic),
            critic_target=one_seed(self.critic_target),
            first_critic=one_seed(self.critic.qs[0]),
        )

    def seeds_gradients(self, networks: DDPGNetworks, batch: EncodedBatch, tools: SeedTools):
        """Critic loss, then (every policy_delay updates) the actor's, per seed."""
        config, obs = self.config, batch.obs
        # y = r + gamma (1 - d) min_i Q'_i(s', clip(mu'(s') + clip(eps, -c, c), -1, 1))  (TD3; DDPG: one critic, no eps)
        with torch.no_grad():
            next_actions = DeterministicActor.head(networks.actor_target(batch.next_obs))
            if config.target_policy_noise > 0:
                noise = tools.noise(standard_normal, next_actions.shape[1:])
                noise = (noise * config.target_policy_noise).clamp(-config.target_noise_clip, config.target_noise_clip)
                next_actions = (next_actions + noise).clamp(-1.0, 1.0)
            next_q = networks.critic_target(batch.next_obs, next_actions).min(dim=1).values
            targets = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_q
        # critic: sum_i (Q_i(s, a) - y)^2
        q_values = networks.critic(obs, batch.actions)  # (S, num_critics, B)
        critic_loss = per_seed_weighted_mse(q_values, targets, batch.weights)
        gradients = {"critic": tools.gradients("critic", critic_loss)}
        logs = {"critic_loss": critic_loss.detach(), "q_mean": q_values.detach().mean(dim=(1, 2))}
        # actor: -Q_1(s, mu(s)), on the delayed steps only
        if self._actor_step_now():
            actor_loss = -networks.first_critic(obs, DeterministicActor.head(networks.actor(obs))).mean(dim=-1)
            gradients["actor"] = tools.gradients("actor", actor_loss)
            logs["actor_loss"] = actor_loss.detach()
        return gradients, logs, td_errors(q_values, targets) if config.prioritized else None

    def update_targets(self) -> None:
        if self.num_updates % self.config.policy_delay == 0:
            polyak_update(self.critic_target, self.critic, self.config.tau)
            polyak_update(self.actor_target, self.actor, self.config.tau)

    # -- weights and state ------------------------------------------------------------------

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"actor": self.actor, "actor_target": self.actor_target, "critic": self.critic, "critic_target": self.critic_target}

    def extra_state(self) -> dict[str, Any]:
        return {"ou_state": self.ou_state.clone()}

    def acting_state(self) -> dict[str, Any]:
        return {**super().acting_state(), "ou_state": self.ou_state.clone()}

    def load_acting_state(self, state: Mapping[str, Any]) -> None:
        super().load_acting_state(state)
        self.ou_state.copy_(state["ou_state"])

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.ou_state.copy_(state["ou_state"])


class TD3(DDPG):
    """Twin Delayed DDPG: DDPG with clipped double Q, target policy smoothing and delayed updates."""

    name = "td3"
    Config = TD3Config
    config: TD3Config


@dataclass
class DDPGNetworks:
    """DDPG's and TD3's networks as their losses call them, over a leading seed dimension S."""

    actor: Callable[[torch.Tensor], torch.Tensor]
    """obs (S, B, ...) -> the actor trunk's outputs (S, B, d), before its tanh."""
    actor_target: Callable[[torch.Tensor], torch.Tensor]
    critic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """obs (S, B, ...), actions (S, B, d) -> (S, num_critics, B)."""
    critic_target: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    first_critic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """Q_1 alone: (S, B)."""


class DDPGSeedBatch(OffPolicySeedBatch):
    """N seeds of DDPG or TD3 as one batched model: the members' losses on stacked networks,
    each seed's exploration noise (Gaussian or its own OU processes) and target noise its own."""

    members: list[DDPG]  # type: ignore[assignment]
    config: DDPGConfig

    def __init__(self, members: Sequence[DDPG]):
        super().__init__(members)
        actor = StackedActorTrunk([member.actor for member in self.members])
        critic = StackedCritics([member.critic for member in self.members])
        self.networks = DDPGNetworks(
            actor=actor,
            actor_target=StackedActorTrunk([member.actor_target for member in self.members]),
            critic=critic,
            critic_target=StackedCritics([member.critic_target for member in self.members]),
            first_critic=critic.first,
        )
        self.optimizers = self._stack_optimizers(
            {
                "critic": ([member.critic_optimizer for member in self.members], list(critic.parameters())),
                "actor": ([member.actor_optimizer for member in self.members], list(actor.parameters())),
            }
        )

    def policy_actions(self, obs: torch.Tensor) -> torch.Tensor:
        actions = DeterministicActor.head(self.networks.actor(obs))
        return torch.stack([(seed_actions + member.action_noise(seed_actions.shape)).clamp(-1.0, 1.0) for member, seed_actions in zip(self.members, actions)])

    def update_targets(self) -> None:
        if self.members[0].num_updates % self.config.policy_delay == 0:
            networks = self.networks
            polyak_update(networks.critic_target, networks.critic, self.config.tau)
            polyak_update(networks.actor_target, networks.actor, self.config.tau)
