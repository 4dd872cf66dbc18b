"""Policies and critics built from MLPs: actor-critic (on-policy), squashed actor and Q-ensemble (SAC)."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from agents.envs import EnvSpec
from agents.nets.distributions import Categorical, DiagGaussian, TanhGaussian
from agents.nets.mlp import mlp


def flat_dim(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


class ActorCritic(nn.Module):
    """Separate policy and value MLPs; Categorical or state-independent diagonal Gaussian policy."""

    def __init__(
        self,
        spec: EnvSpec,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        initial_log_std: float = 0.0,
    ):
        super().__init__()
        obs_dim = flat_dim(spec.observation_shape)
        self.discrete = spec.discrete
        self.critic = mlp(obs_dim, hidden_sizes, 1, activation, orthogonal_init=True, output_gain=1.0)
        self.actor = mlp(obs_dim, hidden_sizes, spec.num_actions, activation, orthogonal_init=True, output_gain=0.01)
        self.log_std = None if spec.discrete else nn.Parameter(torch.full((spec.num_actions,), initial_log_std))

    def distribution(self, obs: torch.Tensor) -> Categorical | DiagGaussian:
        """Policy over actions for observations (B, *obs_shape)."""
        out = self.actor(obs.flatten(1))
        return Categorical(out) if self.discrete else DiagGaussian(out, self.log_std)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values (B,)."""
        return self.critic(obs.flatten(1)).squeeze(-1)


class SquashedGaussianActor(nn.Module):
    """MLP -> (mean, log_std) of a tanh-Gaussian over actions in (-1, 1)^d (SAC)."""

    LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # as in the SAC authors' softlearning code

    def __init__(self, spec: EnvSpec, hidden_sizes: Sequence[int] = (256, 256), activation: str = "relu"):
        super().__init__()
        self.num_actions = spec.num_actions
        self.net = mlp(flat_dim(spec.observation_shape), hidden_sizes, 2 * spec.num_actions, activation)

    def forward(self, obs: torch.Tensor) -> TanhGaussian:
        mean, log_std = self.net(obs.flatten(1)).split(self.num_actions, dim=-1)
        return TanhGaussian(mean, log_std.clamp(self.LOG_STD_MIN, self.LOG_STD_MAX))


class QEnsemble(nn.Module):
    """``n`` independent Q(s, a) MLPs; forward returns (n, B)."""

    def __init__(self, spec: EnvSpec, n: int = 2, hidden_sizes: Sequence[int] = (256, 256), activation: str = "relu"):
        super().__init__()
        in_features = flat_dim(spec.observation_shape) + spec.num_actions
        self.qs = nn.ModuleList(mlp(in_features, hidden_sizes, 1, activation) for _ in range(n))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs.flatten(1), actions], dim=-1)
        return torch.stack([q(x).squeeze(-1) for q in self.qs])
