"""The off-policy actor's networks: feature extractors, N critics, actors, recurrent memory.

Every network is ``extractors -> common trunk -> head``, as in pytorchrl's OffPolicyActor:

    Q(s, a) = head(trunk(cat(obs_extractor(s), act_extractor(a))))   continuous actions
    Q(s, .) = head(trunk(obs_extractor(s)))                           discrete: one value per action
    pi(s)   = head(trunk(obs_extractor(s)))

An extractor with no sizes is the identity. Each network owns its extractors (none are
shared), so critics and actors learn their own features. ``Critics`` stacks N independent
Q-functions and returns (N, B) or (N, B, num_actions).

Recurrent agents put a ``RecurrentEncoder`` (``agents.nets.recurrent``: observation extractor,
then a GRU or LSTM cell) in front of the heads; its hidden state is what the actor stores with
each step and what replayed sequences burn in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agents.nets.distributions import Categorical, TanhGaussian
from agents.nets.mlp import mlp
from agents.nets.recurrent import extract, feature_extractor


@dataclass(frozen=True)
class NetworkShape:
    """Layer sizes shared by an algorithm's networks."""

    hidden_sizes: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    obs_extractor_sizes: tuple[int, ...] = ()
    act_extractor_sizes: tuple[int, ...] = ()

    @classmethod
    def of(cls, config: Any) -> NetworkShape:
        """The shape an off-policy config sets (``agents.configs.offpolicy.OffPolicyConfig``)."""
        return cls(config.hidden_sizes, config.activation, config.obs_extractor_sizes, config.act_extractor_sizes)


class ContinuousQ(nn.Module):
    """Q(s, a) for Box actions -> (B,)."""

    def __init__(self, obs_dim: int, action_dim: int, shape: NetworkShape):
        super().__init__()
        self.obs_extractor, obs_features = feature_extractor(obs_dim, shape.obs_extractor_sizes, shape.activation)
        self.act_extractor, act_features = feature_extractor(action_dim, shape.act_extractor_sizes, shape.activation)
        self.trunk = mlp(obs_features + act_features, shape.hidden_sizes, 1, shape.activation)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        features = torch.cat([extract(self.obs_extractor, obs.flatten(1)), extract(self.act_extractor, actions)], dim=-1)
        return self.trunk(features).squeeze(-1)


class DiscreteQ(nn.Module):
    """Q(s, .) for Discrete actions -> (B, num_actions).

    With ``dueling`` the trunk feeds a value and an advantage stream combined as
    V(s) + A(s, a) - mean_a A(s, a) (Wang et al. 2016, "Dueling Network Architectures", eq. 9).
    """

    def __init__(self, obs_dim: int, num_actions: int, shape: NetworkShape, dueling: bool = False):
        super().__init__()
        self.obs_extractor, features = feature_extractor(obs_dim, shape.obs_extractor_sizes, shape.activation)
        self.dueling = dueling
        if dueling:
            *body, last = shape.hidden_sizes or (features,)
            self.trunk, width = feature_extractor(features, tuple(body), shape.activation)
            self.value = mlp(width, (last,), 1, shape.activation)
            self.advantage = mlp(width, (last,), num_actions, shape.activation)
        else:
            self.trunk = mlp(features, shape.hidden_sizes, num_actions, shape.activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.trunk(extract(self.obs_extractor, obs.flatten(1)))
        if not self.dueling:
            return features
        advantages = self.advantage(features)
        return self.value(features) + advantages - advantages.mean(dim=-1, keepdim=True)


class Critics(nn.Module):
    """``n`` independent Q-functions; forward stacks them: (n, B) or (n, B, num_actions)."""

    def __init__(self, critics: Sequence[nn.Module]):
        super().__init__()
        self.qs = nn.ModuleList(critics)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        if actions is None:
            return torch.stack([q(obs) for q in self.qs])
        return torch.stack([q(obs, actions) for q in self.qs])


def make_critics(obs_dim: int, discrete: bool, num_actions: int, shape: NetworkShape, n: int, dueling: bool = False) -> Critics:
    if discrete:
        return Critics([DiscreteQ(obs_dim, num_actions, shape, dueling) for _ in range(n)])
    return Critics([ContinuousQ(obs_dim, num_actions, shape) for _ in range(n)])


class _ActorBase(nn.Module):
    def __init__(self, obs_dim: int, out_features: int, shape: NetworkShape):
        super().__init__()
        self.obs_extractor, features = feature_extractor(obs_dim, shape.obs_extractor_sizes, shape.activation)
        self.trunk = mlp(features, shape.hidden_sizes, out_features, shape.activation)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trunk(extract(self.obs_extractor, obs.flatten(1)))


class DeterministicActor(_ActorBase):
    """mu(s) in (-1, 1)^d through a tanh (DDPG, TD3)."""

    def __init__(self, obs_dim: int, action_dim: int, shape: NetworkShape):
        super().__init__(obs_dim, action_dim, shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(obs))

    @staticmethod
    def head(features: torch.Tensor) -> torch.Tensor:
        """The trunk's outputs squashed into the action box."""
        return torch.tanh(features)


class SquashedGaussianActor(_ActorBase):
    """(mean, log_std) of a tanh-Gaussian over actions in (-1, 1)^d (SAC)."""

    LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # as in the SAC authors' softlearning code

    def __init__(self, obs_dim: int, action_dim: int, shape: NetworkShape):
        super().__init__(obs_dim, 2 * action_dim, shape)
        self.action_dim = action_dim

    def forward(self, obs: torch.Tensor) -> TanhGaussian:
        return self.head(self.features(obs), self.action_dim)

    @classmethod
    def head(cls, features: torch.Tensor, action_dim: int) -> TanhGaussian:
        """The trunk's outputs (..., 2d) -> the tanh-Gaussian (mean, clamped log-std)."""
        mean, log_std = features.split(action_dim, dim=-1)
        return TanhGaussian(mean, log_std.clamp(cls.LOG_STD_MIN, cls.LOG_STD_MAX))


class CategoricalActor(_ActorBase):
    """Logits over discrete actions (discrete SAC)."""

    def forward(self, obs: torch.Tensor) -> Categorical:
        return self.head(self.features(obs))

    @staticmethod
    def head(features: torch.Tensor) -> Categorical:
        """The trunk's outputs (..., num_actions) are the logits."""
        return Categorical(features)


class GaussianActor(_ActorBase):
    """Diagonal Gaussian (mean, std) in the (-1, 1) action box (MPO); std = softplus(.) + min_std."""

    def __init__(self, obs_dim: int, action_dim: int, shape: NetworkShape, min_std: float = 1e-6):
        super().__init__(obs_dim, 2 * action_dim, shape)
        self.action_dim, self.min_std = action_dim, min_std

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(self.features(obs), self.action_dim, self.min_std)

    @staticmethod
    def head(features: torch.Tensor, action_dim: int, min_std: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The trunk's outputs (..., 2d) -> (tanh mean, softplus std + min_std)."""
        mean, pre_std = features.split(action_dim, dim=-1)
        return torch.tanh(mean), F.softplus(pre_std) + min_std
