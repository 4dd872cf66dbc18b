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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from agents.algos.offpolicy import OffPolicyAlgorithm
from agents.algos.offpolicy_batch import OffPolicySeedBatch
from agents.algos.offpolicy_losses import SeedTools, one_seed, per_seed_weighted_mse, td_errors
from agents.api import batched_by, parameters_of
from agents.batches import EncodedBatch
from agents.configs.sac import SACConfig
from agents.nets import polyak_update
from agents.nets.distributions import Categorical, TanhGaussian
from agents.nets.offpolicy import CategoricalActor, SquashedGaussianActor, make_critics
from agents.nets.stacked import StackedActorTrunk, StackedCritics, stack_parameters
from agents.optim import adam


class FixedTemperature:
    """alpha held at its configured value: no parameter, no optimizer, no loss."""

    learned = False

    def __init__(self, alpha: float, device: torch.device):
        self.log_alpha = torch.tensor(float(np.log(alpha)), device=device)
        self.optimizer: torch.optim.Optimizer | None = None

    def parameters(self) -> list[torch.Tensor]:
        return []

    def loss(self, log_alpha: torch.Tensor, log_probs: torch.Tensor, target_entropy: float) -> torch.Tensor | None:
        """The temperature's loss per seed (S,) from its log alpha (S,) and the batch's log pi (S, B); none here."""
        return None


class LearnedTemperature(FixedTemperature):
    """alpha learned toward the entropy target (Algorithm 1's last loss), from ``initial_alpha``."""

    learned = True

    def __init__(self, initial_alpha: float, device: torch.device, learning_rate: float):
        super().__init__(initial_alpha, device)
        self.log_alpha.requires_grad_(True)
        self.optimizer = adam([self.log_alpha], lr=learning_rate)

    def parameters(self) -> list[torch.Tensor]:
        return [self.log_alpha]

    def loss(self, log_alpha: torch.Tensor, log_probs: torch.Tensor, target_entropy: float) -> torch.Tensor | None:
        """-log(alpha) (log pi(a~|s) + H_target), averaged over the batch."""
        return -(log_alpha[:, None] * (log_probs + target_entropy)).mean(dim=-1)


class SAC(OffPolicyAlgorithm):
    """SAC with a tanh-squashed Gaussian policy, for Box actions (``DiscreteSAC`` for Discrete
    ones: ``SAC(...)`` of a Discrete env builds one)."""

    seed_batch = batched_by("SACSeedBatch")

    def __new__(cls, *args: Any, **kwargs: Any) -> SAC:
        env_spec = args[0] if args else kwargs.get("env_spec")  # none when unpickled or copied: the class is known
        if cls is SAC and env_spec is not None and env_spec.discrete:
            return super().__new__(DiscreteSAC)
        return super().__new__(cls)

    name = "sac"
    critic_ensemble = True
    Config = SACConfig
    config: SACConfig
    tunable_parameters = ("actor_lr", "critic_lr", "alpha_lr", "tau", "batch_size", "gradient_steps")
    learning_rates = {"actor_lr": "actor", "critic_lr": "critic", "alpha_lr": "alpha"}
    capturable_update = True
    capturable_acting = True

    def __init__(self, env_spec, config: SACConfig, total_steps: int, device: torch.device | str = "cpu", seed: int = 0):
        super().__init__(env_spec, config, total_steps, device, seed)
        shape, spec = self.head_shape(), env_spec
        actor_class = CategoricalActor if spec.discrete else SquashedGaussianActor
        self.actor = actor_class(self.feature_dim, spec.num_actions, shape).to(self.device)
        self.critic = make_critics(self.feature_dim, spec.discrete, spec.num_actions, shape, config.num_critics).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.temperature = (
            LearnedTemperature(config.initial_alpha, self.device, config.alpha_lr) if config.alpha is None else FixedTemperature(config.alpha, self.device)
        )
        self.log_alpha = self.temperature.log_alpha
        self.target_entropy = config.target_entropy if config.target_entropy is not None else self.default_target_entropy()
        # a recurrent encoder learns from the critic loss; the actor reads its features detached
        self.critic_parameters = parameters_of(*([self.encoder] if self.encoder is not None else []), self.critic)
        self.critic_optimizer = adam(self.critic_parameters, lr=config.critic_lr)
        self.actor_optimizer = adam(parameters_of(self.actor), lr=config.actor_lr)

    def default_target_entropy(self) -> float:
        """-dim(A) (the paper's)."""
        return -float(self.spec.num_actions)

    @property
    def auto_alpha(self) -> bool:
        """Whether the temperature is learned (``LearnedTemperature``)."""
        return self.temperature.learned

    @property
    def alpha_optimizer(self) -> torch.optim.Optimizer | None:
        return self.temperature.optimizer

    def parameter_groups(self):
        return {
            "critic": (self.critic_parameters, self.critic_optimizer),
            "actor": (parameters_of(self.actor), self.actor_optimizer),
            "alpha": (self.temperature.parameters(), self.temperature.optimizer),
        }

    def policy_actions(self, features: torch.Tensor, deterministic: bool) -> torch.Tensor:
        dist = self.actor(features)
        return dist.mode() if deterministic else dist.sample(dist.draw_noise(self.generator))

    # -- losses (over a leading seed dimension: one run is S = 1, a batch of seeds S = N) -----

    def networks(self) -> SACNetworks:
        return SACNetworks(
            actor=one_seed(self.actor.features),
            critic=one_seed(self.critic),
            critic_target=one_seed(self.critic_target),
            log_alpha=self.log_alpha.view(1),
        )

    def policy(self, networks: SACNetworks, obs: torch.Tensor) -> TanhGaussian | Categorical:
        """Every seed's policy at obs (S, B, ...), as the actor's head gives it."""
        return SquashedGaussianActor.head(networks.actor(obs), self.spec.num_actions)

    def seeds_gradients(self, networks: SACNetworks, batch: EncodedBatch, tools: SeedTools):
        """Algorithm 1's critic, actor and temperature losses per seed, differentiated in that order.

        ``batch`` holds observations or, when recurrent, the encoder's features (``encode``);
        the actor reads them detached, so the encoder learns from the critic loss alone."""
        obs, next_obs, target_next_obs = batch.features, batch.next_features, batch.target_next_features
        alpha = networks.log_alpha.exp().detach()[:, None]  # (S, 1)
        # y = r + gamma (1 - d) (min_i Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s')
        with torch.no_grad():
            targets = batch.rewards + batch.discounts * (1.0 - batch.terminated) * self.soft_next_value(networks, next_obs, target_next_obs, alpha, tools)
        # critic: sum_i (Q_i(s, a) - y)^2
        q_values = self.q_values(networks, obs, batch.actions)  # (S, num_critics, B)
        critic_loss = per_seed_weighted_mse(q_values, targets, batch.weights)
        # actor: alpha log pi(a~|s) - min_i Q_i(s, a~), a~ ~ pi(.|s) reparameterized
        actor_loss, log_probs = self.actor_loss(networks, obs.detach(), alpha, tools)
        gradients = {"critic": tools.gradients("critic", critic_loss), "actor": tools.gradients("actor", actor_loss)}
        logs = {
            "critic_loss": critic_loss.detach(),
            "actor_loss": actor_loss.detach(),
            "q_mean": q_values.detach().mean(dim=(1, 2)),
            "alpha": alpha[:, 0],
            "entropy": -log_probs.mean(dim=-1),
        }
        # temperature: -log(alpha) (log pi(a~|s) + H_target), when it is learned
        alpha_loss = self.temperature.loss(networks.log_alpha, log_probs, self.target_entropy)
        if alpha_loss is not None:
            gradients["alpha"] = tools.gradients("alpha", alpha_loss)
            logs["alpha_loss"] = alpha_loss.detach()
        return gradients, logs, td_errors(q_values, targets) if self.config.prioritized else None

    def soft_next_value(
        self, networks: SACNetworks, next_obs: torch.Tensor, target_next_obs: torch.Tensor, alpha: torch.Tensor, tools: SeedTools
    ) -> torch.Tensor:
        """min_i Q'_i(s', a') - alpha log pi(a'|s'), a' ~ pi(.|s'): (S, B)."""
        next_dist = cast(TanhGaussian, self.policy(networks, next_obs))
        next_actions, next_log_probs = next_dist.rsample_with_log_prob(tools.noise(next_dist.draw, next_dist.noise_shape[1:]))
        return networks.critic_target(target_next_obs, next_actions).min(dim=1).values - alpha * next_log_probs

    def q_values(self, networks: SACNetworks, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q_i(s, a) of every critic: (S, num_critics, B)."""
        return networks.critic(obs, actions)

    def actor_loss(self, networks: SACNetworks, obs: torch.Tensor, alpha: torch.Tensor, tools: SeedTools) -> tuple[torch.Tensor, torch.Tensor]:
        """alpha log pi(a~|s) - min_i Q_i(s, a~), a~ reparameterized: the loss per seed (S,) and
        log pi (S, B), detached (the temperature's loss reads it)."""
        dist = cast(TanhGaussian, self.policy(networks, obs))
        actions, log_probs = dist.rsample_with_log_prob(tools.noise(dist.draw, dist.noise_shape[1:]))
        actor_loss = (alpha * log_probs - networks.critic(obs, actions).min(dim=1).values).mean(dim=-1)
        return actor_loss, log_probs.detach()

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


class DiscreteSAC(SAC):
    """SAC for Discrete actions (Christodoulou 2019): the critics give Q(s, .) for every action,
    and the expectations over pi are computed exactly instead of sampled; the entropy target is
    0.98 log |A|. Its name is SAC's: ``SAC(...)`` of a Discrete env builds one."""

    def default_target_entropy(self) -> float:
        """0.98 log |A| (the paper's)."""
        return 0.98 * math.log(self.spec.num_actions)

    def policy(self, networks: SACNetworks, obs: torch.Tensor) -> Categorical:
        return CategoricalActor.head(networks.actor(obs))

    def soft_next_value(
        self, networks: SACNetworks, next_obs: torch.Tensor, target_next_obs: torch.Tensor, alpha: torch.Tensor, tools: SeedTools
    ) -> torch.Tensor:
        """V(s') = sum_a pi(a|s') (min_i Q'_i(s', a) - alpha log pi(a|s')), exactly: (S, B)."""
        next_q = networks.critic_target(target_next_obs).min(dim=1).values  # (S, B, A)
        next_logits = self.policy(networks, next_obs).logits
        next_log_probs = next_logits.log_softmax(-1)
        return (next_logits.softmax(-1) * (next_q - alpha[..., None] * next_log_probs)).sum(-1)

    def q_values(self, networks: SACNetworks, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        q_all = networks.critic(obs)  # (S, num_critics, B, A)
        return q_all.gather(3, actions.long()[:, None, :, None].expand(*q_all.shape[:3], 1)).squeeze(-1)

    def actor_loss(self, networks: SACNetworks, obs: torch.Tensor, alpha: torch.Tensor, tools: SeedTools) -> tuple[torch.Tensor, torch.Tensor]:
        """sum_a pi(a|s) (alpha log pi(a|s) - min_i Q_i(s, a)), exactly; log pi as its expectation."""
        logits = self.policy(networks, obs).logits
        probs, all_log_probs = logits.softmax(-1), logits.log_softmax(-1)
        with torch.no_grad():
            q_pi = networks.critic(obs).min(dim=1).values
        actor_loss = (probs * (alpha[..., None] * all_log_probs - q_pi)).sum(-1).mean(dim=-1)
        return actor_loss, (probs * all_log_probs).sum(-1).detach()


@dataclass
class SACNetworks:
    """SAC's networks as its losses call them, over a leading seed dimension S."""

    actor: Callable[[torch.Tensor], torch.Tensor]
    """obs (S, B, ...) -> the actor trunk's outputs (S, B, out), before its head."""
    critic: Callable[..., torch.Tensor]
    """obs (S, B, ...)[, actions (S, B, d)] -> (S, num_critics, B) (or (S, num_critics, B, A) for Discrete)."""
    critic_target: Callable[..., torch.Tensor]
    log_alpha: torch.Tensor
    """(S,): each seed's log temperature."""


class SACSeedBatch(OffPolicySeedBatch):
    """N seeds of SAC as one batched model: the members' losses on stacked networks, with each
    seed's temperature, noise and optimizer moments its own (see ``agents.algos.seeds``)."""

    members: list[SAC]  # type: ignore[assignment]
    config: SACConfig

    def __init__(self, members: Sequence[SAC]):
        super().__init__(members)
        first = self.members[0]
        actor = StackedActorTrunk([member.actor for member in self.members])
        critic = StackedCritics([member.critic for member in self.members])
        log_alpha = stack_parameters([[member.log_alpha] for member in self.members])[0]
        self.networks = SACNetworks(actor, critic, StackedCritics([member.critic_target for member in self.members]), log_alpha)
        groups: dict[str, tuple[list[torch.optim.Optimizer], list[torch.Tensor]]] = {
            "critic": ([member.critic_optimizer for member in self.members], [*self.encoder_parameters, *critic.parameters()]),
            "actor": ([member.actor_optimizer for member in self.members], list(actor.parameters())),
        }
        if first.temperature.learned:  # then every member's is (one configuration)
            groups["alpha"] = (cast("list[torch.optim.Optimizer]", [member.temperature.optimizer for member in self.members]), [log_alpha])
        self.optimizers = self._stack_optimizers(groups)

    def policy_actions(self, obs: torch.Tensor) -> torch.Tensor:
        dist = self.members[0].policy(self.networks, obs)
        return dist.sample(self.tools.noise(dist.draw, dist.noise_shape[1:]))

    def update_targets(self) -> None:
        polyak_update(self.networks.critic_target, self.networks.critic, self.config.tau)
        self.update_encoder_target(self.config.tau)
