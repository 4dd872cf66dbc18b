"""Recurrent memory: an observation extractor followed by a GRU or LSTM cell, and the unroll of
one or several such memories over a sequence.

Acting steps a cell once per environment step (``RecurrentEncoder.step``, a ``GRUCell`` /
``LSTMCell`` call). Training unrolls whole sequences, where the per-step cost is what counts on
a CPU: a sequence of 16 steps of two memories (PPO's actor and critic) is some 30 small
operations a step through ``nn.GRUCell``. ``unroll`` therefore computes every step's input
projection W_ih x + b_ih in one matrix product before the loop, and steps K memories that read
the same sequence as one stacked cell (one batched product for their K hidden-to-hidden
projections): half the operations, and the backward pass shrinks with them. (A hand-written
backward pass through time was tried too: at these sizes each tensor operation costs about
as much with autograd's bookkeeping as without, so it saved little.) The gate equations and
their order are those of ``torch.nn.GRUCell`` and ``torch.nn.LSTMCell``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from agents.nets.mlp import ACTIVATIONS, MLP


def feature_extractor(in_features: int, sizes: Sequence[int], activation: str) -> tuple[nn.Module, int]:
    """Linear -> activation per size (the identity for no sizes) and its output width."""
    if not sizes:
        return nn.Identity(), in_features
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip([in_features, *sizes[:-1]], sizes):
        layers += [nn.Linear(fan_in, fan_out), ACTIVATIONS[activation]()]
    return MLP(*layers), sizes[-1]


def extract(extractor: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """``extractor(inputs)``, skipping the call of an identity (a module call per network per
    batch adds up on the hot path)."""
    return inputs if isinstance(extractor, nn.Identity) else extractor(inputs)


class RecurrentEncoder(nn.Module):
    """Observation extractor followed by a GRU or LSTM cell: features of the history so far.

    The hidden state is one flat tensor (B, state_size): h for a GRU, cat(h, c) for an LSTM,
    so buffers store it as they store any other per-step tensor. Features are h (B, size).
    """

    def __init__(self, obs_dim: int, extractor_sizes: Sequence[int], activation: str, kind: str, size: int):
        super().__init__()
        if kind not in ("gru", "lstm"):
            raise ValueError(f"recurrent kind must be gru or lstm, got {kind!r}")
        self.obs_extractor, features = feature_extractor(obs_dim, extractor_sizes, activation)
        self.kind, self.size = kind, size
        self.cell: nn.GRUCell | nn.LSTMCell = nn.GRUCell(features, size) if kind == "gru" else nn.LSTMCell(features, size)
        self.state_size = size if kind == "gru" else 2 * size

    def initial_state(self, batch_size: int, device: torch.device | str) -> torch.Tensor:
        return torch.zeros(batch_size, self.state_size, device=device)

    def step(self, obs: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: obs (B, *obs_shape), hidden (B, state_size) -> features (B, size), next hidden."""
        inputs = extract(self.obs_extractor, obs.flatten(1))
        if self.kind == "gru":
            hidden = self.cell(inputs, hidden)
        else:
            h, c = self.cell(inputs, (hidden[:, : self.size], hidden[:, self.size :]))
            hidden = torch.cat([h, c], dim=-1)
        return hidden[:, : self.size], hidden

    def unroll(self, obs: torch.Tensor, hidden: torch.Tensor, resets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run a sequence: obs (L, B, *obs_shape) from hidden (B, state_size); where resets (L, B)
        is true the state is zeroed before that step (a new episode). Returns the features
        (L, B, size) and the hidden state after every step (L, B, state_size)."""
        states = unroll([self], obs, hidden[None], resets)[:, 0]
        return states[..., : self.size], states


class OneSeedEncoder:
    """A run's ``RecurrentEncoder`` seen with a seed dimension of 1, as the losses written over
    seeds call it (``StackedEncoder`` gives N): every input and output has a leading 1."""

    def __init__(self, encoder: RecurrentEncoder):
        self.encoder = encoder

    def unroll(self, obs: torch.Tensor, hidden: torch.Tensor, resets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs (1, L, B, *obs_shape), hidden (1, B, state_size), resets (1, L, B) -> features
        (1, L, B, size) and the states after every step (1, L, B, state_size)."""
        features, states = self.encoder.unroll(obs[0], hidden[0], resets[0])
        return features.unsqueeze(0), states.unsqueeze(0)

    def step(self, obs: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs (1, B, *obs_shape), hidden (1, B, state_size) -> features (1, B, size), next hidden."""
        features, next_hidden = self.encoder.step(obs[0], hidden[0])
        return features.unsqueeze(0), next_hidden.unsqueeze(0)


def unroll(memories: Sequence[RecurrentEncoder], obs: torch.Tensor, hidden: torch.Tensor, resets: torch.Tensor) -> torch.Tensor:
    """K memories of one kind and size over the same sequence, stepped as one stacked cell.

    obs (L, B, *obs_shape); hidden (K, B, state_size), memory k's state from ``hidden[k]``;
    where resets (L, B) is true every state is zeroed before that step. Returns the states after
    every step (L, K, B, state_size).
    """
    kind, size = memories[0].kind, memories[0].size
    if any(m.kind != kind or m.size != size for m in memories):
        raise ValueError("memories unrolled together must share their kind and size")
    flat = obs.flatten(2)
    # every step's input projection at once: (L, K, B, G), G = 3 * size (GRU) or 4 * size (LSTM)
    gates_in = torch.stack([F.linear(extract(m.obs_extractor, flat), m.cell.weight_ih, m.cell.bias_ih) for m in memories], dim=1)
    weight_hh = torch.stack([m.cell.weight_hh for m in memories]).transpose(1, 2)  # (K, size, G)
    bias_hh = torch.stack([m.cell.bias_hh for m in memories]).unsqueeze(1)  # (K, 1, G)
    return run_cells(kind, size, gates_in, weight_hh, bias_hh, hidden, resets[:, None])


def run_cells(
    kind: str, size: int, gates_in: torch.Tensor, weight_hh: torch.Tensor, bias_hh: torch.Tensor, hidden: torch.Tensor, resets: torch.Tensor
) -> torch.Tensor:
    """K cells (GRU or LSTM, hidden ``size``) stepped as one over L steps, from their input
    projections gates_in (L, K, B, G) = W_ih x + b_ih, their hidden-to-hidden weights
    weight_hh (K, size, G) and biases bias_hh (K, 1, G), and states hidden (K, B, state_size).
    Where resets (L, K or 1, B) is true a state is zeroed before that step. Returns the states
    after every step (L, K, B, state_size). The gate equations and their order are those of
    ``torch.nn.GRUCell`` and ``torch.nn.LSTMCell``."""
    # which steps start an episode somewhere, read once so that the other steps skip the mask
    keep = (~resets).to(hidden.dtype).unsqueeze(-1)  # (L, K or 1, B, 1)
    masked = tuple(resets.flatten(1).any(dim=1).tolist())
    states = []
    if kind == "gru":  # (each indexing of a small tensor costs about an operation: the gates are split once)
        input_r, input_z, input_n = gates_in.chunk(3, dim=-1)
        for t in range(gates_in.shape[0]):
            if masked[t]:
                hidden = hidden * keep[t]
            # h' = (1 - z) n + z h, r and z = sigmoid(W_i x + b_i + W_h h + b_h), n = tanh(W_in x + b_in + r (W_hn h + b_hn))
            hidden_r, hidden_z, hidden_n = torch.baddbmm(bias_hh, hidden, weight_hh).chunk(3, dim=-1)
            r, z = torch.sigmoid(input_r[t] + hidden_r), torch.sigmoid(input_z[t] + hidden_z)
            n = torch.tanh(input_n[t] + r * hidden_n)
            hidden = (hidden - n) * z + n
            states.append(hidden)
    else:
        for t in range(gates_in.shape[0]):
            if masked[t]:
                hidden = hidden * keep[t]
            # c' = f c + i g, h' = o tanh(c'); the state is cat(h, c)
            i, f, g, o = (gates_in[t] + torch.baddbmm(bias_hh, hidden[..., :size], weight_hh)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * hidden[..., size:] + torch.sigmoid(i) * torch.tanh(g)
            hidden = torch.cat([torch.sigmoid(o) * torch.tanh(c), c], dim=-1)
            states.append(hidden)
    return torch.stack(states)
