"""The on-policy actor-critic: policy and value function, separate or sharing a trunk,
feed-forward or recurrent (GRU/LSTM), for Discrete, MultiDiscrete and Box actions.

    features = obs                                   feed-forward
    features = memory(obs, h)                        recurrent: a GRU/LSTM cell per network
    params   = actor(features),  V = critic(features)     separate networks
    params   = actor_head(trunk(features)), V = critic_head(trunk(features))   shared trunk

``params`` are the distribution's parameters (logits, or mean and log-std), which is what the
algorithms store at acting time: the old policy of PPO's KL penalty and TRPO's trust region
is rebuilt from them exactly, without a second copy of the network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from agents.envs import EnvSpec
from agents.nets import gemm
from agents.nets.distributions import Categorical, DiagGaussian, MultiCategorical, PolicyDistribution
from agents.nets.mlp import hidden_layers, linear, mlp
from agents.nets.recurrent import RecurrentEncoder, unroll


def flat_dim(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


class ActorCritic(nn.Module):
    """pi(a | s) and V(s); Gaussian policies have a state-independent log-std (Schulman et al. 2015).

    The recurrent state is one flat tensor (B, state_size): the actor memory's state followed by
    the critic memory's (separate networks have one memory each; a shared trunk has one).
    """

    def __init__(
        self,
        spec: EnvSpec,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        initial_log_std: float = 0.0,
        shared: bool = False,
        recurrent: str | None = None,
        recurrent_size: int = 64,
    ):
        super().__init__()
        obs_dim = flat_dim(spec.observation_shape)
        self.discrete, self.nvec = spec.discrete, spec.action_nvec
        self.shared, self.recurrent = shared, recurrent
        outputs = spec.num_actions
        features = obs_dim
        self.actor_memory: RecurrentEncoder | None = None
        self.critic_memory: RecurrentEncoder | None = None
        if recurrent is not None:
            self.actor_memory = RecurrentEncoder(obs_dim, (), activation, recurrent, recurrent_size)
            if not shared:
                self.critic_memory = RecurrentEncoder(obs_dim, (), activation, recurrent, recurrent_size)
            features = recurrent_size
        if shared:
            self.trunk, width = hidden_layers(features, hidden_sizes, activation, orthogonal_init=True)
            self.actor_head = linear(width, outputs, orthogonal_init=True, gain=0.01)
            self.critic_head = linear(width, 1, orthogonal_init=True, gain=1.0)
        else:
            self.actor = mlp(features, hidden_sizes, outputs, activation, orthogonal_init=True, output_gain=0.01)
            self.critic = mlp(features, hidden_sizes, 1, activation, orthogonal_init=True, output_gain=1.0)
        self.log_std = None if spec.discrete else nn.Parameter(torch.full((spec.num_actions,), initial_log_std))
        memories = [m for m in (self.actor_memory, self.critic_memory) if m is not None]
        self._state_sizes = [m.state_size for m in memories]
        self.state_size = sum(self._state_sizes)

    # -- parameters by role ----------------------------------------------------------------

    def policy_parameters(self) -> list[nn.Parameter]:
        """Everything that shapes pi (with a shared trunk this includes the trunk)."""
        return [p for name, p in self.named_parameters() if not name.startswith(("critic", "critic_memory"))]

    def value_parameters(self) -> list[nn.Parameter]:
        """Everything V depends on but pi does not (empty trunk overlap only when separate)."""
        if self.shared:
            return list(self.critic_head.parameters())
        return [p for name, p in self.named_parameters() if name.startswith(("critic", "critic_memory"))]

    # -- forward passes ---------------------------------------------------------------------

    def initial_state(self, batch_size: int, device: torch.device | str) -> torch.Tensor | None:
        """Zero recurrent state (B, state_size), or None for a feed-forward network."""
        return torch.zeros(batch_size, self.state_size, device=device) if self.recurrent else None

    def forward(
        self, obs: torch.Tensor, state: torch.Tensor | None = None, episode_starts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Distribution parameters (M, P), values (M,) and the recurrent state after the input.

        One step: obs (B, *obs_shape), M = B. A sequence (when ``episode_starts`` (L, B) is
        given, true where a new episode begins and the state is zeroed): obs (L, B, *obs_shape)
        from initial state (B, state_size), M = L * B in time-major order.
        """
        outputs, values, next_state = self._heads(obs, state, episode_starts)
        if self.log_std is not None:
            outputs = torch.cat([outputs, self.log_std.expand_as(outputs)], dim=-1)
        return outputs, values, next_state

    def policy_and_value(
        self, obs: torch.Tensor, state: torch.Tensor | None = None, episode_starts: torch.Tensor | None = None
    ) -> tuple[PolicyDistribution, torch.Tensor, torch.Tensor | None]:
        """``forward``, returning the distribution itself: a Gaussian keeps its state-independent
        log-std (d,) broadcast instead of copied into every row, which spares the backward pass
        an expand, a concatenation and a split."""
        outputs, values, next_state = self._heads(obs, state, episode_starts)
        if self.log_std is not None:
            return DiagGaussian(outputs, self.log_std), values, next_state
        return self.distribution(outputs), values, next_state

    def seeded(
        self, obs: torch.Tensor, states: torch.Tensor | None = None, episode_starts: torch.Tensor | None = None
    ) -> tuple[PolicyDistribution, torch.Tensor]:
        """``policy_and_value`` of one seed's batch with a seed dimension of 1, as the losses take
        it (``StackedActorCritic.seeded`` gives N): obs (1, B, *obs_shape) [states (1, B,
        state_size), episode_starts (1, L, B) for sequences] -> distribution (1, M), values (1, M)."""
        outputs, values, _ = self._heads(obs[0], None if states is None else states[0], None if episode_starts is None else episode_starts[0])
        outputs, values = outputs.unsqueeze(0), values.unsqueeze(0)
        if self.log_std is not None:
            return DiagGaussian(outputs, self.log_std), values
        return self.distribution(outputs), values

    def _heads(
        self, obs: torch.Tensor, state: torch.Tensor | None, episode_starts: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The actor's outputs (M, outputs) (logits, or the Gaussian's mean), V (M,) and the next state."""
        actor_features, critic_features, next_state = self._encode(obs, state, episode_starts)
        if self.shared:
            hidden = self.trunk(actor_features)
            outputs = gemm.linear(hidden, self.actor_head.weight, self.actor_head.bias)  # (the kernel the stacked heads use)
            values = gemm.linear(hidden, self.critic_head.weight, self.critic_head.bias)
        else:
            outputs, values = self.actor(actor_features), self.critic(critic_features)
        return outputs, values.squeeze(-1), next_state

    @property
    def separate_feed_forward(self) -> bool:
        """Feed-forward with separate actor and critic: pi and V can be evaluated apart."""
        return not self.shared and self.actor_memory is None

    def policy_params(self, obs: torch.Tensor) -> torch.Tensor:
        """Distribution parameters (B, P) alone, without V (``separate_feed_forward`` only)."""
        params = self.actor(obs.flatten(1))
        if self.log_std is not None:
            params = torch.cat([params, self.log_std.expand_as(params)], dim=-1)
        return params

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) (B,) alone, without pi (``separate_feed_forward`` only)."""
        return self.critic(obs.flatten(1)).squeeze(-1)

    def distribution(self, params: torch.Tensor) -> PolicyDistribution:
        """The policy distribution with parameters ``params`` (M, P) from ``forward``."""
        if self.nvec is not None:
            return MultiCategorical(params, self.nvec)
        if self.discrete:
            return Categorical(params)
        mean, log_std = params.chunk(2, dim=-1)
        return DiagGaussian(mean, log_std)

    def _encode(
        self, obs: torch.Tensor, state: torch.Tensor | None, episode_starts: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        sequence = episode_starts is not None
        if self.actor_memory is None:
            flat = obs.flatten(2).flatten(0, 1) if sequence else obs.flatten(1)
            return flat, flat, None
        if state is None:
            state = self.initial_state(obs.shape[1] if sequence else obs.shape[0], obs.device)
            assert state is not None  # zeros: the network is recurrent
        memories = [m for m in (self.actor_memory, self.critic_memory) if m is not None]
        states = state.split(self._state_sizes, dim=-1)
        if sequence:
            # both memories read the same observations: one stacked cell (agents.nets.recurrent)
            assert episode_starts is not None
            unrolled = unroll(memories, obs, torch.stack(states), episode_starts)  # (L, K, B, S)
            features = [unrolled[:, k, :, : m.size].flatten(0, 1) for k, m in enumerate(memories)]
            next_states = list(unrolled[-1].unbind(0))
        else:
            stepped = [m.step(obs, s) for m, s in zip(memories, states)]
            features, next_states = [f for f, _ in stepped], [h for _, h in stepped]
        actor_features = features[0]
        critic_features = features[1] if len(features) > 1 else actor_features
        return actor_features, critic_features, torch.cat(next_states, dim=-1)
