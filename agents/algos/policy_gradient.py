"""The policy-gradient estimator's pieces every on-policy learner shares (garage's VPG family:
center_adv, positive_adv, entropy_coef, use_softplus_entropy, stop_entropy_gradient,
entropy_method), each over a leading seed dimension: advantages processed over one seed's
samples, the entropy bonus, and a rollout batch from its fields.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from agents.batches import RolloutBatch
from agents.configs.onpolicy import PolicyGradientOptions


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
