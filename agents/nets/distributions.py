"""Action distributions with one interface: sample, log_prob, entropy, mode.

Log-probabilities and entropies are summed over action dimensions, so each returns shape (B,).
Leading dimensions beyond the batch are allowed (a seed dimension: (N, B, ...) gives (N, B)).

Every sampling method takes the standard draws it transforms as ``noise`` (``noise_shape``
gives their shape): standard normals for the Gaussians, uniforms in [0, 1) for the
categoricals. An algorithm draws them from its own generator (``standard_normal``,
``standard_uniform``), so N seeds trained in one process each keep the stream of their own
run; without ``noise`` the global RNG is used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch.distributions import Categorical as _TorchCategorical
from torch.distributions import kl_divergence

HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)


def standard_normal(shape: tuple[int, ...] | torch.Size, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """N(0, 1) draws of ``shape`` from ``generator`` (a CPU generator), on ``device``."""
    return torch.randn(shape, generator=generator).to(device)


def standard_uniform(shape: tuple[int, ...] | torch.Size, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """U[0, 1) draws of ``shape`` from ``generator`` (a CPU generator), on ``device``."""
    return torch.rand(shape, generator=generator).to(device)


class _Sampled:
    """What the distributions share: their noise comes from ``draw_noise``."""

    #: the standard draws ``sample`` transforms
    draw: Callable[[tuple[int, ...] | torch.Size, torch.Generator, torch.device], torch.Tensor] = staticmethod(standard_normal)

    @property
    def noise_shape(self) -> torch.Size:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def draw_noise(self, generator: torch.Generator) -> torch.Tensor:
        """The noise of one ``sample`` (``noise_shape``), from ``generator``."""
        return self.draw(self.noise_shape, generator, self.device)


class Categorical(_Sampled):
    """Distribution over ``n`` discrete actions from logits (B, n)."""

    draw = staticmethod(standard_uniform)

    def __init__(self, logits: torch.Tensor):
        self._dist = _TorchCategorical(logits=logits, validate_args=False)
        self.logits = logits

    @property
    def device(self) -> torch.device:
        return self.logits.device

    @property
    def noise_shape(self) -> torch.Size:
        """One uniform per sample: the batch shape."""
        return self.logits.shape[:-1]

    def sample(self, noise: torch.Tensor | None = None) -> torch.Tensor:
        """Actions (B,): the inverse CDF at uniforms ``noise`` (B,)."""
        if noise is None:
            return self._dist.sample()
        cumulative = self.logits.softmax(-1).cumsum(-1)
        return (cumulative < noise.unsqueeze(-1)).sum(-1).clamp(max=self.logits.shape[-1] - 1)

    def sample_with_log_prob(self, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        actions = self.sample(noise)
        return actions, self.log_prob(actions)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self._dist.log_prob(actions.long())

    def entropy(self) -> torch.Tensor:
        return self._dist.entropy()

    def mode(self) -> torch.Tensor:
        return self.logits.argmax(dim=-1)

    def kl(self, other: PolicyDistribution) -> torch.Tensor:
        """KL(self || other) per sample (B,); ``other`` is a Categorical too."""
        return kl_divergence(self._dist, cast(Categorical, other)._dist)


class MultiCategorical(_Sampled):
    """Independent categoricals, one per MultiDiscrete component: logits (B, sum(nvec)).

    Actions are (B, k) integers; log-probabilities and entropies sum over the k components.
    """

    draw = staticmethod(standard_uniform)

    def __init__(self, logits: torch.Tensor, nvec: tuple[int, ...]):
        self.parts = [Categorical(part) for part in logits.split(list(nvec), dim=-1)]

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    @property
    def noise_shape(self) -> torch.Size:
        """One uniform per component: (B, k)."""
        return torch.Size((*self.parts[0].noise_shape, len(self.parts)))

    def sample(self, noise: torch.Tensor | None = None) -> torch.Tensor:
        return torch.stack([part.sample(None if noise is None else noise[..., i]) for i, part in enumerate(self.parts)], dim=-1)

    def sample_with_log_prob(self, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        actions = self.sample(noise)
        return actions, self.log_prob(actions)

    # sum() of tensors is typed Tensor | Literal[0]; with one part or more it is a tensor

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, sum(part.log_prob(actions[..., i]) for i, part in enumerate(self.parts)))

    def entropy(self) -> torch.Tensor:
        return cast(torch.Tensor, sum(part.entropy() for part in self.parts))

    def mode(self) -> torch.Tensor:
        return torch.stack([part.mode() for part in self.parts], dim=-1)

    def kl(self, other: PolicyDistribution) -> torch.Tensor:
        """KL(self || other) per sample (B,), summed over components; ``other`` is a
        MultiCategorical too."""
        return cast(torch.Tensor, sum(mine.kl(theirs) for mine, theirs in zip(self.parts, cast(MultiCategorical, other).parts)))


class _Gaussian(_Sampled):
    """What both Gaussians share: standard-normal noise of the mean's shape."""

    mean: torch.Tensor

    @property
    def noise_shape(self) -> torch.Size:
        return self.mean.shape

    @property
    def device(self) -> torch.device:
        return self.mean.device


class DiagGaussian(_Gaussian):
    """Gaussian with diagonal covariance: mean (B, d), log_std (B, d) or (d,).

    Closed forms written out rather than through ``torch.distributions.Normal``: acting on one
    observation is a few small tensors, where each avoided op is a measurable share."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean, self.log_std = mean, log_std  # a (d,) log_std stays broadcast: fewer ops, lighter backward
        self.std = log_std.exp()

    def sample(self, noise: torch.Tensor | None = None) -> torch.Tensor:
        if noise is None:
            return torch.normal(self.mean, self.std.expand_as(self.mean))
        return self.mean + self.std * noise

    def sample_with_log_prob(self, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions (B, d) and their log-probabilities (B,), the latter from the standard-normal
        draw itself (fewer ops than ``log_prob`` of the actions; what acting needs)."""
        if noise is None:
            noise = torch.randn_like(self.mean)
        actions = self.mean + self.std * noise
        return actions, (-0.5 * noise.pow(2) - self.log_std).sum(-1) - HALF_LOG_TWO_PI * self.mean.shape[-1]

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) / self.std
        return (-0.5 * z.pow(2) - self.log_std).sum(-1) - HALF_LOG_TWO_PI * self.mean.shape[-1]

    def entropy(self) -> torch.Tensor:
        """(B,)"""
        return (self.log_std.sum(-1) + (0.5 + HALF_LOG_TWO_PI) * self.mean.shape[-1]).expand(self.mean.shape[:-1])

    def mode(self) -> torch.Tensor:
        return self.mean

    def kl(self, other: PolicyDistribution) -> torch.Tensor:
        """KL(self || other) per sample (B,), summed over action dimensions; ``other`` is a
        DiagGaussian too."""
        other = cast(DiagGaussian, other)
        variance_ratio = (self.std / other.std).pow(2)
        mean_term = ((self.mean - other.mean) / other.std).pow(2)
        return 0.5 * (variance_ratio + mean_term - 1 - variance_ratio.log()).sum(-1)


class TanhGaussian(_Gaussian):
    """tanh(u), u ~ N(mean, std): actions in (-1, 1), as in SAC (Haarnoja et al. 2018, App. C).

    ``log_prob`` corrects for the tanh with log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)),
    which stays finite where tanh saturates. Its entropy has no closed form, so there is no
    ``entropy()``: SAC estimates it as -log_prob of a sample.
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean, self.log_std = mean, log_std
        self.std = log_std.exp()

    def rsample_with_log_prob(self, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized actions (B, d) and their log-probabilities (B,)."""
        actions, log_prob, _ = self.rsample_with_pre_tanh(noise)
        return actions, log_prob

    def rsample_with_pre_tanh(self, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Reparameterized actions (B, d), their log-probabilities (B,) and the Gaussian
        sample u (B, d) they are tanh(u) of."""
        if noise is None:
            noise = torch.randn_like(self.mean)
        pre_tanh = self.mean + self.std * noise
        gaussian_log_prob = (-0.5 * noise.pow(2) - self.log_std).sum(-1)
        return torch.tanh(pre_tanh), gaussian_log_prob - self._log_det(pre_tanh) - HALF_LOG_TWO_PI * self.mean.shape[-1], pre_tanh

    def sample(self, noise: torch.Tensor | None = None) -> torch.Tensor:
        if noise is None:
            return torch.tanh(torch.normal(self.mean, self.std))
        return torch.tanh(self.mean + self.std * noise)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(actions.dtype).eps
        pre_tanh = torch.atanh(actions.clamp(-1 + eps, 1 - eps))
        z = (pre_tanh - self.mean) / self.std
        gaussian_log_prob = (-0.5 * z.pow(2) - self.log_std).sum(-1)
        return gaussian_log_prob - self._log_det(pre_tanh) - HALF_LOG_TWO_PI * self.mean.shape[-1]

    @staticmethod
    def _log_det(pre_tanh: torch.Tensor) -> torch.Tensor:
        """sum log(1 - tanh(u)^2) over dimensions (B,)."""
        return (2.0 * (math.log(2.0) - pre_tanh - F.softplus(-2.0 * pre_tanh))).sum(-1)

    def mode(self) -> torch.Tensor:
        return torch.tanh(self.mean)


#: the distribution of an on-policy actor-critic (``agents.nets.policies.ActorCritic``); the
#: ``kl`` of each takes another of its own kind (an old policy and the current one)
PolicyDistribution = Categorical | MultiCategorical | DiagGaussian
