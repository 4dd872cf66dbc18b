"""Stacked networks: K copies of one architecture evaluated as one, for N seeds in one process.

A stacked layer holds the K copies' weights as one (K, out, in) tensor and computes
y_k = x_k W_k^T + b_k for every k in one batched matmul (``torch.baddbmm``): K small networks
cost about what one costs in kernel launches and Python. Inputs and outputs carry the copy
dimension first: (K, B, features).

Stacking rebinds each copy's own parameters to views of its slice (``stack_parameters``), so
the original modules stay live: they act, evaluate, save and load exactly as if they had
trained alone, and they see every update made through the stack.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from agents.nets.distributions import DiagGaussian
from agents.nets.mlp import _FUNCTIONS, MLP
from agents.nets.offpolicy import ContinuousQ, Critics, DiscreteQ, _ActorBase
from agents.nets.policies import ActorCritic, PolicyDistribution


def stack_parameters(copies: Sequence[Sequence[torch.Tensor]]) -> list[nn.Parameter]:
    """``copies[k][j]`` (the j-th parameter of copy k) -> stacked[j] of shape (K, *shape_j).

    Each copy's tensor becomes a view of its slice: writes through the stack (optimizer steps,
    target updates) show in the copy, and loading a state into the copy writes the stack."""
    stacked = []
    for tensors in zip(*copies, strict=True):
        shapes = {tuple(tensor.shape) for tensor in tensors}
        if len(shapes) != 1:
            raise ValueError(f"cannot stack parameters of different shapes {sorted(shapes)}")
        parameter = nn.Parameter(torch.stack([tensor.detach() for tensor in tensors]), requires_grad=tensors[0].requires_grad)
        for index, tensor in enumerate(tensors):
            tensor.data = parameter.data[index]
        stacked.append(parameter)
    return stacked


class StackedMLP(nn.Module):
    """K copies of an ``MLP`` (or of one ``nn.Linear``): (K, B, in) -> (K, B, out)."""

    def __init__(self, copies: Sequence[nn.Module]):
        super().__init__()
        layers = [list(copy.children()) if isinstance(copy, MLP) else [copy] for copy in copies]
        self.functions: list = []  # None where a stacked linear layer goes, else the activation
        linears = []
        for position, layer in enumerate(layers[0]):
            if isinstance(layer, nn.Linear):
                self.functions.append(None)
                linears.append([layers_k[position] for layers_k in layers])
            elif type(layer) in _FUNCTIONS:
                self.functions.append(_FUNCTIONS[type(layer)])
            else:
                raise TypeError(f"cannot stack a {type(layer).__name__}")
        weights = stack_parameters([[linear.weight for linear in column] for column in zip(*linears)])
        biases = stack_parameters([[linear.bias for linear in column] for column in zip(*linears)])
        self.weights, self.biases = nn.ParameterList(weights), nn.ParameterList(biases)

    def forward(self, inputs: torch.Tensor, every: int = 1) -> torch.Tensor:
        """With ``every`` = m, only copies 0, m, 2m, ... (inputs (K / m, B, in))."""
        outputs, linear = inputs, 0
        for function in self.functions:
            if function is None:
                weight, bias = self.weights[linear][::every], self.biases[linear][::every]
                outputs = torch.baddbmm(bias.unsqueeze(1), outputs, weight.transpose(1, 2))
                linear += 1
            else:
                outputs = function(outputs)
        return outputs


def stack_extractor(copies: Sequence[nn.Module]) -> StackedMLP | None:
    """Stacked feature extractors; None for identities."""
    return None if isinstance(copies[0], nn.Identity) else StackedMLP(copies)


def _extract(extractor: StackedMLP | None, inputs: torch.Tensor, every: int = 1) -> torch.Tensor:
    return inputs if extractor is None else extractor(inputs, every)


def _flat(obs: torch.Tensor) -> torch.Tensor:
    """(K, B, *obs_shape) -> (K, B, obs_dim)."""
    return obs.flatten(2)


class StackedContinuousQ(nn.Module):
    """K copies of ``ContinuousQ``: obs (K, B, *obs_shape), actions (K, B, d) -> (K, B)."""

    def __init__(self, copies: Sequence[ContinuousQ]):
        super().__init__()
        self.obs_extractor = stack_extractor([copy.obs_extractor for copy in copies])
        self.act_extractor = stack_extractor([copy.act_extractor for copy in copies])
        self.trunk = StackedMLP([copy.trunk for copy in copies])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, every: int = 1) -> torch.Tensor:
        """With ``every`` = m, only copies 0, m, 2m, ... (inputs (K / m, B, ...))."""
        features = torch.cat([_extract(self.obs_extractor, _flat(obs), every), _extract(self.act_extractor, actions, every)], dim=-1)
        return self.trunk(features, every).squeeze(-1)


class StackedDiscreteQ(nn.Module):
    """K copies of ``DiscreteQ`` (dueling or not): obs (K, B, *obs_shape) -> (K, B, num_actions)."""

    def __init__(self, copies: Sequence[DiscreteQ]):
        super().__init__()
        self.obs_extractor = stack_extractor([copy.obs_extractor for copy in copies])
        self.dueling = copies[0].dueling
        if self.dueling:
            self.trunk = stack_extractor([copy.trunk for copy in copies])
            self.value = StackedMLP([copy.value for copy in copies])
            self.advantage = StackedMLP([copy.advantage for copy in copies])
        else:
            self.trunk = StackedMLP([copy.trunk for copy in copies])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = _extract(self.trunk, _extract(self.obs_extractor, _flat(obs)))
        if not self.dueling:
            return features
        advantages = self.advantage(features)
        return self.value(features) + advantages - advantages.mean(dim=-1, keepdim=True)


class StackedCritics(nn.Module):
    """N seeds' ``Critics`` of n Q-functions each, as one stack of N * n (seed-major):
    obs (N, B, *obs_shape) [, actions (N, B, d)] -> (N, n, B) or (N, n, B, num_actions)."""

    def __init__(self, copies: Sequence[Critics]):
        super().__init__()
        self.num_critics = len(copies[0].qs)
        qs = [q for copy in copies for q in copy.qs]
        self.qs: StackedContinuousQ | StackedDiscreteQ = StackedDiscreteQ(qs) if isinstance(qs[0], DiscreteQ) else StackedContinuousQ(qs)

    def _repeat(self, inputs: torch.Tensor) -> torch.Tensor:
        """(N, B, ...) -> (N * n, B, ...): each seed's inputs once per critic."""
        n = self.num_critics
        return inputs.unsqueeze(1).expand(inputs.shape[0], n, *inputs.shape[1:]).reshape(inputs.shape[0] * n, *inputs.shape[1:])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        if actions is None:
            values = self.qs(self._repeat(obs))
        else:
            values = self.qs(self._repeat(obs), self._repeat(actions))
        return values.view(obs.shape[0], self.num_critics, *values.shape[1:])

    def first(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Each seed's first Q-function alone (N, B) (TD3's and DDPG's actor loss)."""
        assert isinstance(self.qs, StackedContinuousQ)
        return self.qs(obs, actions, every=self.num_critics)


class StackedActorTrunk(nn.Module):
    """K copies of an off-policy actor's extractor and trunk: obs (K, B, *obs_shape) -> (K, B, out);
    the algorithm applies its head (tanh, or the Gaussian's split) as the copies' forward does."""

    def __init__(self, copies: Sequence[_ActorBase]):
        super().__init__()
        self.obs_extractor = stack_extractor([copy.obs_extractor for copy in copies])
        self.trunk = StackedMLP([copy.trunk for copy in copies])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trunk(_extract(self.obs_extractor, _flat(obs)))


class StackedActorCritic(nn.Module):
    """K copies of a feed-forward ``ActorCritic`` (separate networks or a shared trunk).

    ``heads(obs)`` maps obs (K, B, *obs_shape) to the actor's outputs (K, B, outputs) (logits,
    or the Gaussian's mean) and V (K, B); ``log_std`` is (K, d) for Box actions."""

    def __init__(self, copies: Sequence[ActorCritic]):
        super().__init__()
        if copies[0].recurrent is not None:
            raise ValueError("recurrent actor-critics cannot be stacked")
        self.shared = copies[0].shared
        if self.shared:
            self.trunk = StackedMLP([copy.trunk for copy in copies])
            self.actor_head = StackedMLP([copy.actor_head for copy in copies])
            self.critic_head = StackedMLP([copy.critic_head for copy in copies])
        else:
            self.actor = StackedMLP([copy.actor for copy in copies])
            self.critic = StackedMLP([copy.critic for copy in copies])
        self.log_std = None if copies[0].log_std is None else stack_parameters([[copy.log_std] for copy in copies])[0]
        self.distribution = copies[0].distribution  # builds from parameters (K, B, P) as from (B, P)

    def seeded(self, obs: torch.Tensor) -> tuple[PolicyDistribution, torch.Tensor]:
        """Every copy's policy and values on its batch: obs (K, B, *obs_shape) -> distribution
        (K, B), values (K, B) (``ActorCritic.seeded`` for K = 1)."""
        outputs, values = self.heads(obs)
        if self.log_std is not None:
            return DiagGaussian(outputs, self.log_std.unsqueeze(1)), values
        return self.distribution(outputs), values

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = _flat(obs)
        if self.shared:
            hidden = self.trunk(flat)
            outputs, values = self.actor_head(hidden), self.critic_head(hidden)
        else:
            outputs, values = self.actor(flat), self.critic(flat)
        return outputs, values.squeeze(-1)

    def policy_outputs(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's outputs alone (K, B, outputs)."""
        if self.shared:
            return self.actor_head(self.trunk(_flat(obs)))
        return self.actor(_flat(obs))

    def dist_params(self, outputs: torch.Tensor) -> torch.Tensor:
        """The distribution parameters the copies store at acting time (K, B, P): the outputs,
        followed by the log-std for Box actions."""
        if self.log_std is None:
            return outputs
        return torch.cat([outputs, self.log_std.unsqueeze(1).expand_as(outputs)], dim=-1)
