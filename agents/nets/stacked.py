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
from typing import cast

import torch
from torch import nn

from agents.nets import gemm
from agents.nets.distributions import DiagGaussian
from agents.nets.mlp import _FUNCTIONS, MLP
from agents.nets.offpolicy import ContinuousQ, Critics, DiscreteQ, _ActorBase
from agents.nets.policies import ActorCritic, PolicyDistribution
from agents.nets.recurrent import RecurrentEncoder, run_cells


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

    def forward(self, inputs: torch.Tensor, every: int = 1, frozen: bool = False) -> torch.Tensor:
        """With ``every`` = m, only copies 0, m, 2m, ... (inputs (K / m, B, in)); ``frozen``:
        with the parameters detached (differentiable in the inputs only)."""
        outputs, linear = inputs, 0
        for function in self.functions:
            if function is None:
                weight, bias = self.weights[linear][::every], self.biases[linear][::every]
                if frozen:
                    weight, bias = weight.detach(), bias.detach()
                outputs = gemm.stacked_linear(outputs, weight, bias)
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
        qs = [q for copy in copies for q in copy.qs]  # one kind of Q-function (make_critics)
        self.qs: StackedContinuousQ | StackedDiscreteQ = (
            StackedDiscreteQ(cast("list[DiscreteQ]", qs)) if isinstance(qs[0], DiscreteQ) else StackedContinuousQ(cast("list[ContinuousQ]", qs))
        )

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


class StackedMemories(nn.Module):
    """K copies of an actor-critic's M recurrent memories (M = 1 with a shared trunk, else the
    actor's and the critic's), stepped together as K * M stacked cells (``run_cells``), each
    copy on its own observations. States are (K, B, state_size) with each copy's memories'
    states side by side, as ``ActorCritic`` keeps them."""

    def __init__(self, copies: Sequence[Sequence[RecurrentEncoder]]):
        super().__init__()
        first = copies[0][0]
        if any(not isinstance(memory.obs_extractor, nn.Identity) for memories in copies for memory in memories):
            raise ValueError("stacked memories read raw observations (no extractor)")
        self.kind, self.size, self.state_size = first.kind, first.size, first.state_size
        self.num_memories = len(copies[0])
        # one stack per role (the actor's memory, the critic's): (K, ...) each, so that an
        # optimizer of the policy's parameters and one of the value's never share a tensor
        roles = [[memories[m].cell for memories in copies] for m in range(self.num_memories)]

        def stacked(name: str) -> nn.ParameterList:
            return nn.ParameterList([stack_parameters([[getattr(cell, name)] for cell in cells])[0] for cells in roles])

        self.weight_ih, self.bias_ih = stacked("weight_ih"), stacked("bias_ih")
        self.weight_hh, self.bias_hh = stacked("weight_hh"), stacked("bias_hh")

    def _cells(self, stacks: nn.ParameterList) -> torch.Tensor:
        """The roles' stacks as one (K * M, ...), copy-major."""
        if self.num_memories == 1:
            return stacks[0]
        return torch.stack(list(stacks), dim=1).flatten(0, 1)

    def forward(self, obs: torch.Tensor, states: torch.Tensor, resets: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
        """obs (K, L, B, *obs_shape), states (K, B, M * state_size), resets (K, L, B) or None ->
        each memory's features (K, L * B, size) (time-major) and the states after every step
        (L, K, B, M * state_size)."""
        copies, length, batch = obs.shape[:3]
        memories = self.num_memories
        flat = obs.flatten(3).reshape(copies, 1, length * batch, -1).expand(-1, memories, -1, -1).reshape(copies * memories, length * batch, -1)
        gates_in = torch.baddbmm(self._cells(self.bias_ih).unsqueeze(1), flat, self._cells(self.weight_ih).transpose(1, 2))  # (K * M, L * B, G)
        gates_in = gates_in.reshape(copies * memories, length, batch, -1).transpose(0, 1)  # (L, K * M, B, G)
        hidden = states.reshape(copies, batch, memories, self.state_size).transpose(1, 2).reshape(copies * memories, batch, self.state_size)
        if resets is None:
            resets = torch.zeros(length, 1, batch, dtype=torch.bool, device=obs.device)
        else:
            resets = resets.transpose(0, 1).repeat_interleave(memories, dim=1)  # (L, K * M, B)
        weight_hh, bias_hh = self._cells(self.weight_hh).transpose(1, 2), self._cells(self.bias_hh).unsqueeze(1)
        unrolled = run_cells(self.kind, self.size, gates_in, weight_hh, bias_hh, hidden, resets)
        per_memory = unrolled.reshape(length, copies, memories, batch, self.state_size)
        features = [per_memory[:, :, m, :, : self.size].transpose(0, 1).reshape(copies, length * batch, self.size) for m in range(memories)]
        return features, per_memory.transpose(2, 3).reshape(length, copies, batch, memories * self.state_size)


class StackedEncoder(nn.Module):
    """K copies of an off-policy ``RecurrentEncoder`` (extractor and cell), each on its own
    observations: the calls of ``agents.nets.recurrent.OneSeedEncoder`` with K seeds."""

    def __init__(self, copies: Sequence[RecurrentEncoder]):
        super().__init__()
        self.kind, self.size = copies[0].kind, copies[0].size
        self.obs_extractor = stack_extractor([copy.obs_extractor for copy in copies])
        cells = [copy.cell for copy in copies]
        self.weight_ih, self.bias_ih, self.weight_hh, self.bias_hh = stack_parameters(
            [[cell.weight_ih, cell.bias_ih, cell.weight_hh, cell.bias_hh] for cell in cells]
        )

    def unroll(self, obs: torch.Tensor, hidden: torch.Tensor, resets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs (K, L, B, *obs_shape), hidden (K, B, state_size), resets (K, L, B) -> features
        (K, L, B, size) and the states after every step (K, L, B, state_size)."""
        copies, length, batch = obs.shape[:3]
        inputs = _extract(self.obs_extractor, obs.flatten(3).reshape(copies, length * batch, -1))
        gates_in = torch.baddbmm(self.bias_ih.unsqueeze(1), inputs, self.weight_ih.transpose(1, 2)).reshape(copies, length, batch, -1)
        states = run_cells(
            self.kind, self.size, gates_in.transpose(0, 1), self.weight_hh.transpose(1, 2), self.bias_hh.unsqueeze(1), hidden, resets.transpose(0, 1)
        ).transpose(0, 1)
        return states[..., : self.size], states

    def step(self, obs: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs (K, B, *obs_shape), hidden (K, B, state_size) -> features (K, B, size), next hidden."""
        no_reset = torch.zeros(obs.shape[0], 1, obs.shape[1], dtype=torch.bool, device=obs.device)
        features, states = self.unroll(obs.unsqueeze(1), hidden, no_reset)
        return features[:, 0], states[:, 0]


class StackedActorCritic(nn.Module):
    """K copies of an ``ActorCritic`` (separate networks or a shared trunk, feed-forward or
    recurrent).

    ``heads(obs)`` maps obs (K, B, *obs_shape) to the actor's outputs (K, B, outputs) (logits,
    or the Gaussian's mean) and V (K, B); ``log_std`` is (K, d) for Box actions. Recurrent
    copies take their states (and, for sequences, where episodes start)."""

    def __init__(self, copies: Sequence[ActorCritic]):
        super().__init__()
        self.recurrent = copies[0].recurrent
        self.memories = None
        if self.recurrent is not None:
            self.memories = StackedMemories([[m for m in (copy.actor_memory, copy.critic_memory) if m is not None] for copy in copies])
        self.shared = copies[0].shared
        if self.shared:
            self.trunk = StackedMLP([copy.trunk for copy in copies])
            self.actor_head = StackedMLP([copy.actor_head for copy in copies])
            self.critic_head = StackedMLP([copy.critic_head for copy in copies])
        else:
            self.actor = StackedMLP([copy.actor for copy in copies])
            self.critic = StackedMLP([copy.critic for copy in copies])
        # the copies share one architecture: all have a log-std or none has
        self.log_std = None if copies[0].log_std is None else stack_parameters([[cast(nn.Parameter, copy.log_std)] for copy in copies])[0]
        self.distribution = copies[0].distribution  # builds from parameters (K, B, P) as from (B, P)

    def seeded(
        self, obs: torch.Tensor, states: torch.Tensor | None = None, episode_starts: torch.Tensor | None = None
    ) -> tuple[PolicyDistribution, torch.Tensor]:
        """Every copy's policy and values on its batch: obs (K, B, *obs_shape) -> distribution
        (K, B), values (K, B); recurrent sequences: obs (K, L, B, *obs_shape) from states
        (K, B, state_size), episode_starts (K, L, B) -> (K, L * B) (``ActorCritic.seeded`` for K = 1)."""
        if self.memories is not None:
            assert states is not None and episode_starts is not None
            features, _ = self.memories(obs, states, episode_starts)
            outputs, values = self._heads_of(features)
        else:
            outputs, values = self.heads(obs)
        if self.log_std is not None:
            return DiagGaussian(outputs, self.log_std.unsqueeze(1)), values
        return self.distribution(outputs), values

    def step(self, obs: torch.Tensor, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One recurrent step of every copy: obs (K, B, *obs_shape), states (K, B, state_size) ->
        outputs (K, B, outputs), V (K, B) and the next states (K, B, state_size)."""
        assert self.memories is not None
        features, unrolled = self.memories(obs.unsqueeze(1), states)
        outputs, values = self._heads_of(features)
        return outputs, values, unrolled[0]

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = _flat(obs)
        return self._heads_of([flat, flat])

    def _heads_of(self, features: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's outputs and V from the actor's features and the critic's (features[-1])."""
        if self.shared:
            hidden = self.trunk(features[0])
            outputs, values = self.actor_head(hidden), self.critic_head(hidden)
        else:
            outputs, values = self.actor(features[0]), self.critic(features[-1])
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
