"""What an off-policy loss written over a leading seed dimension uses, whoever evaluates it
(a run: S = 1; a batch of seeds: S = N; a gradient worker's share of a batch): its seed tools
(noise, clipping, parameters), a run's networks seen with a seed dimension of 1, and the
per-seed critic error and TD errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


def per_seed_weighted_mse(predictions: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """mean_i w_i (prediction_i - target_i)^2 per seed, summed over critics: predictions
    (S, num_critics, B), targets and weights (S, B) -> (S,)."""
    return ((predictions - targets.unsqueeze(1)).pow(2) * weights.unsqueeze(1)).mean(dim=-1).sum(dim=-1)


def td_errors(q_values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """|Q - y| per sample (S, B) for PER's new priorities, averaged over critics when
    ``q_values`` is (S, num_critics, B)."""
    errors = (q_values.detach() - (targets.unsqueeze(1) if q_values.dim() > 2 else targets)).abs()
    return errors.mean(dim=1) if errors.dim() > 2 else errors


def one_seed(network: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A run's network seen with a seed dimension of 1: inputs (1, B, ...) -> outputs (1, ...)."""

    def call(*inputs: torch.Tensor) -> torch.Tensor:
        return network(*(tensor[0] for tensor in inputs)).unsqueeze(0)

    return call


@dataclass
class SeedTools:
    """What a loss written over a seed dimension needs from whoever evaluates it: a run
    (``OffPolicyAlgorithm.seed_tools``, S = 1) or a batch of seeds (``OffPolicySeedBatch``)."""

    noise: Callable[[Any, Sequence[int]], torch.Tensor]
    """``noise(draw, shape)``: each seed's draws of ``shape`` from its own generator, (S, *shape)."""
    clip: Callable[[list[torch.Tensor], float], torch.Tensor]
    """Scale gradients in place so each seed's global norm is at most ``max_norm``; norms before (S,)."""
    parameters: Callable[[str], Sequence[torch.Tensor]]
    """An optimizer group's parameters (stacked (N, ...) for a batch)."""

    def gradients(self, group: str, loss: torch.Tensor) -> list[torch.Tensor]:
        """Gradients of the per-seed losses (S,) for ``group``'s parameters (each seed's its own:
        they share no parameter)."""
        return list(torch.autograd.grad(loss.sum(), self.parameters(group)))
