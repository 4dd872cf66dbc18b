"""Deep Q-Networks with double Q-learning, dueling heads, Huber loss and target networks.

Mnih et al. (2015), "Human-level control through deep reinforcement learning", Algorithm 1,
with the double-DQN target of van Hasselt, Guez, Silver (2016), eq. 4:

    a = random with probability epsilon (annealed linearly), else argmax_a Q(s, a)
    for each gradient step, on a batch from D:
        a* = argmax_a Q(s', a)                    (double DQN; max_a Q'(s', a) without it)
        y  = r + gamma (1 - terminated) Q'(s', a*)
        minimize Huber(Q(s, a) - y)               (the paper's error clipping to [-1, 1])
        every target_update_every gradient steps: Q' <- tau Q + (1 - tau) Q' (tau = 1: copy)

Defaults follow Mnih et al. (2015) Extended Data Table 1 for replay (1e6), batch (32), the
update period (every 4 steps), the target period (10,000 gradient steps), replay start
(50,000) and gamma; Adam at 1e-4, gradient-norm clipping at 10, the epsilon schedule (1 to
0.05 over the first 10% of training) and 64-64 MLPs for vector observations are
Stable-Baselines3's DQN defaults. Dueling heads: Wang et al. (2016). With ``recurrent`` the
Q-network reads a GRU/LSTM encoder and trains on burned-in sequences (R2D2, Kapturowski et
al. 2019, without its value rescaling).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agents.algos.offpolicy import OffPolicyAlgorithm
from agents.algos.offpolicy_batch import OffPolicySeedBatch
from agents.algos.offpolicy_losses import SeedTools, one_seed, td_errors
from agents.api import batched_by, parameters_of
from agents.batches import EncodedBatch
from agents.configs.dqn import DQNConfig
from agents.nets import polyak_update
from agents.nets.offpolicy import DiscreteQ
from agents.nets.stacked import StackedDiscreteQ
from agents.optim import adam


class DQN(OffPolicyAlgorithm):
    """DQN for Discrete actions (double Q-learning on by default)."""

    seed_batch = batched_by("DQNSeedBatch")

    name = "dqn"
    Config = DQNConfig
    config: DQNConfig
    tunable_parameters = ("learning_rate", "batch_size", "gradient_steps", "epsilon_final", "target_update_every")
    learning_rates = {"learning_rate": "q"}

    def __init__(self, env_spec, config: DQNConfig, total_steps: int, device: torch.device | str = "cpu", seed: int = 0):
        super().__init__(env_spec, config, total_steps, device, seed)
        self.q_network = DiscreteQ(self.feature_dim, env_spec.num_actions, self.head_shape(), config.dueling).to(self.device)
        self.q_target = copy.deepcopy(self.q_network).requires_grad_(False)
        self.q_parameters = parameters_of(*([self.encoder] if self.encoder is not None else []), self.q_network)
        self.optimizer = adam(self.q_parameters, lr=config.learning_rate)

    def parameter_groups(self):
        return {"q": (self.q_parameters, self.optimizer)}

    @property
    def epsilon(self) -> float:
        """Linear decay from epsilon_start to epsilon_final over exploration_fraction of training."""
        config = self.config
        progress = min(1.0, self.env_steps / (config.exploration_fraction * self.total_steps))
        return config.epsilon_start + progress * (config.epsilon_final - config.epsilon_start)

    def policy_actions(self, features: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return self.q_network(features).argmax(dim=-1)
        # decided on the CPU first: no Q forward when every env explores, no random draw when none does
        explore = torch.rand(features.shape[0], generator=self.generator) < self.epsilon
        if explore.all():
            return self.random_actions(features.shape[0])
        greedy = self.q_network(features).argmax(dim=-1)
        if not explore.any():
            return greedy
        return torch.where(explore.to(self.device), self.random_actions(features.shape[0]), greedy)

    def networks(self) -> DQNNetworks:
        return DQNNetworks(q_network=one_seed(self.q_network), q_target=one_seed(self.q_target))

    def seeds_gradients(self, networks: DQNNetworks, batch: EncodedBatch, tools: SeedTools):
        """The TD loss per seed -> gradients of the Q-network, each seed's norm clipped on its own."""
        config = self.config
        # y = r + gamma (1 - d) Q'(s', argmax_a Q(s', a))  (max_a Q'(s', a) without double Q)
        with torch.no_grad():
            next_q_target = networks.q_target(batch.target_next_features)  # (S, B, A)
            if config.double_q:
                next_actions = networks.q_network(batch.next_features).argmax(dim=-1, keepdim=True)
                next_values = next_q_target.gather(2, next_actions).squeeze(2)
            else:
                next_values = next_q_target.max(dim=-1).values
            targets = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_values
        # minimize Huber(Q(s, a) - y)
        q_values = networks.q_network(batch.features).gather(2, batch.actions.long().unsqueeze(2)).squeeze(2)  # (S, B)
        elementwise = F.smooth_l1_loss(q_values, targets, reduction="none") if config.huber else (q_values - targets).pow(2)
        loss = (elementwise * batch.weights).mean(dim=-1)
        gradients = tools.gradients("q", loss)
        logs = {"loss": loss.detach(), "q_mean": q_values.detach().mean(dim=-1), "epsilon": self._epsilons(loss.shape[0])}
        if config.max_grad_norm is not None:
            logs["grad_norm"] = tools.clip(gradients, config.max_grad_norm)
        return {"q": gradients}, logs, td_errors(q_values, targets) if config.prioritized else None

    def _epsilons(self, num_seeds: int) -> torch.Tensor:
        """Epsilon now, for each of the seeds trained with this member (they share the schedule)."""
        return torch.full((num_seeds,), self.epsilon, device=self.device)

    def update_targets(self) -> None:
        if self.num_updates % self.config.target_update_every == 0:
            polyak_update(self.q_target, self.q_network, self.config.tau)
            self.update_encoder_target(self.config.tau)

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"q_network": self.q_network, "q_target": self.q_target, **self.encoder_modules()}


@dataclass
class DQNNetworks:
    """DQN's networks as its loss calls them: features (S, B, ...) -> Q-values (S, B, A)."""

    q_network: Callable[[torch.Tensor], torch.Tensor]
    q_target: Callable[[torch.Tensor], torch.Tensor]


class DQNSeedBatch(OffPolicySeedBatch):
    """N seeds of DQN as one batched model: one Q forward for every seed's acting and TD loss,
    each seed's epsilon-greedy draws and gradient-norm clip its own."""

    members: list[DQN]  # type: ignore[assignment]
    config: DQNConfig

    def __init__(self, members: Sequence[DQN]):
        super().__init__(members)
        q_network = StackedDiscreteQ([member.q_network for member in self.members])
        self.networks = DQNNetworks(q_network, StackedDiscreteQ([member.q_target for member in self.members]))
        self.optimizers = self._stack_optimizers({"q": ([member.optimizer for member in self.members], [*self.encoder_parameters, *q_network.parameters()])})

    def policy_actions(self, obs: torch.Tensor) -> torch.Tensor:
        greedy = self.networks.q_network(obs).argmax(dim=-1)  # (N, E)
        actions = []
        for member, seed_greedy in zip(self.members, greedy):
            # the draws of DQN.policy_actions, in its order: explore flags, then random actions unless none explores
            explore = torch.rand(seed_greedy.shape[0], generator=member.generator) < member.epsilon
            if explore.all():
                actions.append(member.random_actions(seed_greedy.shape[0]))
            elif not explore.any():
                actions.append(seed_greedy)
            else:
                actions.append(torch.where(explore.to(self.device), member.random_actions(seed_greedy.shape[0]), seed_greedy))
        return torch.stack(actions)

    def update_targets(self) -> None:
        if self.members[0].num_updates % self.config.target_update_every == 0:
            polyak_update(self.networks.q_target, self.networks.q_network, self.config.tau)
            self.update_encoder_target(self.config.tau)
