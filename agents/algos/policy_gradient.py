"""The policy-gradient estimator's pieces every on-policy learner shares (garage's VPG family:
center_adv, positive_adv, entropy_coef, use_softplus_entropy, stop_entropy_gradient,
entropy_method), each over a leading seed dimension: advantages processed over one seed's
samples, the entropy bonus, a rollout batch from its fields; and the ``Seeds`` an optimization
works on (a run's ``OneSeed``, or a seed batch) with the gradient step taken in this process.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from agents.batches import RolloutBatch
from agents.configs.onpolicy import PolicyGradientOptions

PARTS = ("policy", "value")


def rollout_batch(batch: RolloutBatch | Mapping[str, torch.Tensor]) -> RolloutBatch:
    """A batch given as a mapping of its fields (from another process, say) as a ``RolloutBatch``."""
    return batch if isinstance(batch, RolloutBatch) else RolloutBatch(**batch)


def process_advantages(options: PolicyGradientOptions, advantages: torch.Tensor, counted: torch.Tensor | None = None) -> torch.Tensor:
    """center_adv, then positive_adv, over the last dimension (one seed's samples): (..., M).

    With ``counted`` (bool, same shape) only those samples enter the statistics, and the others
    get advantage 0."""
    if counted is None:
        if options.center_adv and advantages.shape[-1] > 1:
            advantages = (advantages - advantages.mean(dim=-1, keepdim=True)) / (advantages.std(dim=-1, keepdim=True) + 1e-8)
        if options.positive_adv:
            advantages = advantages - advantages.min(dim=-1, keepdim=True).values + 1e-8
        return advantages
    weights = counted.to(advantages.dtype)
    count = weights.sum(dim=-1, keepdim=True)
    if options.center_adv:
        mean = (advantages * weights).sum(dim=-1, keepdim=True) / count.clamp_min(1)
        std = (((advantages - mean).pow(2) * weights).sum(dim=-1, keepdim=True) / (count - 1).clamp_min(1)).sqrt()
        advantages = torch.where(count > 1, (advantages - mean) / (std + 1e-8), advantages)
    if options.positive_adv:
        lowest = torch.where(counted, advantages, torch.full_like(advantages, torch.inf)).min(dim=-1, keepdim=True).values
        advantages = advantages - lowest + 1e-8
    return torch.where(counted, advantages, torch.zeros_like(advantages))


def entropy_transform(options: PolicyGradientOptions, entropy: torch.Tensor) -> torch.Tensor:
    """softplus(H) under use_softplus_entropy, else H."""
    return F.softplus(entropy) if options.use_softplus_entropy else entropy


def entropy_bonus(options: PolicyGradientOptions, entropy: torch.Tensor, counted: torch.Tensor | None = None) -> torch.Tensor:
    """The objective's entropy term, per seed: H (..., M) -> entropy_coef * mean H (...,)
    under 'regularized', else 0; with ``counted`` (bool, same shape) the mean is over those
    samples only."""
    if options.entropy_method != "regularized":
        return entropy.new_zeros(entropy.shape[:-1])
    entropy = entropy_transform(options, entropy)
    if options.stop_entropy_gradient:
        entropy = entropy.detach()
    if counted is None:
        return options.entropy_coef * entropy.mean(dim=-1)
    weights = counted.to(entropy.dtype)
    return options.entropy_coef * (entropy * weights).sum(dim=-1) / weights.sum(dim=-1).clamp_min(1.0)


class Seeds(Protocol):
    """What an on-policy optimization works on: the seeds it updates, one (a run, ``OneSeed``)
    or N (``OnPolicySeedBatch``), with their network, data and optimizer steps. Batches carry
    a leading seed dimension (S, M, ...); losses and logs are per seed (S,)."""

    num_seeds: int

    @property
    def members(self) -> Sequence[Any]:
        """The algorithms whose seeds these are (``OnPolicyAlgorithm``s of one class; one for a run)."""

    @property
    def network(self) -> Any:
        """``seeded(obs, states=None, episode_starts=None) -> (distribution (S, M), values (S, M))``."""

    def full_batch(self) -> RolloutBatch:
        """Every seed's whole rollout (S, T * E, ...) (sequences (S, L, B, ...) when recurrent)."""

    def minibatches(self, num_minibatches: int, active: torch.Tensor | None = None) -> Iterator[RolloutBatch]:
        """One shuffled epoch of every seed's rollout, each seed in its own order; a seed not
        ``active`` (S,) draws no order (its run stopped its epochs) and gets filler rows."""

    def step(self, loss: torch.Tensor, active: torch.Tensor | None = None) -> None:
        """Differentiate the per-seed losses (S,) and step every optimizer that got gradients,
        each seed's gradient norm clipped on its own; only the ``active`` seeds step."""

    def gradient_step(self, batch: RolloutBatch, parts: tuple[str, ...] = PARTS, active: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """One optimizer step on the loss ``parts`` of ``batch`` (S, M, ...); its logs (S,).
        Here (``gradient_step``) the loss is computed in this process; a run's ``step_strategy``
        (gradient workers) may compute it on shares of the batch instead."""

    def policy_parameters(self) -> Sequence[torch.Tensor]:
        """The parameters that shape pi (stacked (S, ...) for a batch), in the members' order."""

    def finish(self) -> None:
        """Apply what is still in flight when the optimization ends (asynchronous gradient
        workers' steps: ``Algorithm.finish_steps``); nothing for steps taken here."""


def gradient_step(seeds: Seeds, batch: RolloutBatch, parts: tuple[str, ...] = PARTS, active: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``Seeds.gradient_step`` in this process: the loss of every seed, differentiated and stepped."""
    loss, info = seeds.members[0].seeds_loss(seeds.network, batch, parts)
    seeds.step(loss, active)
    return info
