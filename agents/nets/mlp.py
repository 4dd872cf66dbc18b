"""Multi-layer perceptrons with the initializations the published implementations use."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU}


def mlp(
    in_features: int,
    hidden_sizes: Sequence[int],
    out_features: int,
    activation: str = "relu",
    orthogonal_init: bool = False,
    output_gain: float = 1.0,
) -> nn.Sequential:
    """Linear -> activation for each hidden size, then a linear output layer.

    With ``orthogonal_init`` hidden layers get orthogonal weights with gain sqrt(2) and the
    output layer ``output_gain`` (biases zero), as in the PPO implementations (Engstrom et
    al. 2020, "Implementation Matters"); otherwise PyTorch's default initialization.
    """
    body, width = hidden_layers(in_features, hidden_sizes, activation, orthogonal_init)
    return nn.Sequential(*body, linear(width, out_features, orthogonal_init, output_gain))


def hidden_layers(
    in_features: int, hidden_sizes: Sequence[int], activation: str = "relu", orthogonal_init: bool = False
) -> tuple[nn.Sequential, int]:
    """The hidden part of ``mlp`` alone (no output layer) and its output width."""
    layers: list[nn.Module] = []
    sizes = [in_features, *hidden_sizes]
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [linear(fan_in, fan_out, orthogonal_init, math.sqrt(2)), ACTIVATIONS[activation]()]
    return nn.Sequential(*layers), sizes[-1]


def linear(fan_in: int, fan_out: int, orthogonal_init: bool, gain: float) -> nn.Linear:
    layer = nn.Linear(fan_in, fan_out)
    if orthogonal_init:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, in place."""
    with torch.no_grad():
        target_params = list(target.parameters())
        source_params = list(source.parameters())
        torch._foreach_lerp_(target_params, source_params, tau)
