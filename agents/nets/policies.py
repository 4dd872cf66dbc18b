"""The on-policy actor-critic built from MLPs."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from agents.envs import EnvSpec
from agents.nets.distributions import Categorical, DiagGaussian
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
