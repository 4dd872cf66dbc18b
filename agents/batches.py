"""Typed batches: the named tensors a loss reads, with a shared leading shape.

A batch is a dataclass of tensors; optional fields are None where a batch has no such data
(sequences' recurrent states, the features a recurrent encoder computed). Losses read fields
by name (``batch.advantages``); code that treats every field alike (stacking seeds, selecting
minibatch rows, moving devices) reads the batch as a mapping of its present fields and
rebuilds it with ``apply`` or ``stack``. No per-field Python runs on a hot path beyond what a
dict of tensors cost before: a batch is a handful of attributes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import torch


@dataclass(eq=False)
class TensorBatch:
    """Named tensors; read by name (``batch["obs"]``, ``keys``, ``items``, ``{**batch}``) it is
    the mapping of its present fields (not None). Not a ``Mapping``: a field may be called
    ``values``."""

    def __getitem__(self, name: str) -> torch.Tensor:
        value = getattr(self, name, None) if name in self.__dataclass_fields__ else None
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.__dataclass_fields__ and getattr(self, name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def keys(self) -> list[str]:
        return [name for name, value in self.__dict__.items() if value is not None]

    def items(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, value) for name, value in self.__dict__.items() if value is not None]

    def apply(self, function: Callable[[torch.Tensor], torch.Tensor]) -> Self:
        """The batch with ``function`` applied to every present tensor (updates call this per
        step: it builds the new batch directly, not through ``dataclasses.replace``)."""
        return type(self)(**{name: function(value) for name, value in self.__dict__.items() if value is not None})

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)

    @classmethod
    def stack(cls, batches: Sequence[Self], dim: int = 0) -> Self:
        """Batches with the same present fields -> one, each field stacked along ``dim`` (the seeds')."""
        return cls(**{name: torch.stack([batch[name] for batch in batches], dim) for name in batches[0]})


@dataclass(eq=False)
class RolloutBatch(TensorBatch):
    """On-policy samples: flat (M, ...) steps, or sequences (L, B, ...) for recurrent policies;
    a seed batch adds a leading seed dimension (S, ...)."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    """log pi_old(a|s) of the acting policy."""
    values: torch.Tensor
    """V(s) at collection."""
    advantages: torch.Tensor
    returns: torch.Tensor
    """The value function's regression targets (advantages + values)."""
    complete: torch.Tensor
    """bool: the step's episode ends within the rollout (REINFORCE counts only these)."""
    dist_params: torch.Tensor
    """The acting distribution's parameters (pi_old for KL terms)."""
    episode_starts: torch.Tensor | None = None
    """Sequences only (L, B): a step that starts an episode (the recurrent state resets)."""
    states: torch.Tensor | None = None
    """Sequences only (B, state_size): the recurrent state each sequence was acted from."""


@dataclass(eq=False)
class ReplayBatch(TensorBatch):
    """Off-policy transitions (B, ...), or sequences (L, B, ...) of a recurrent learner, as a
    replay buffer samples them; a leading seed dimension (S, ...) in a seed batch."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    """n-step discounted reward sums (the reward itself for n = 1)."""
    next_obs: torch.Tensor
    terminated: torch.Tensor
    """float: the last step used ended in a true terminal state (no bootstrap)."""
    discounts: torch.Tensor
    """gamma^m for the m steps summed in ``rewards``."""
    weights: torch.Tensor | None = None
    """Importance weights of prioritized replay (ones without)."""
    indices: torch.Tensor | None = None
    """Flat storage indices (``update_priorities``)."""
    hidden: torch.Tensor | None = None
    """A recurrent policy's state when it acted (stored with the step)."""
    resets: torch.Tensor | None = None
    """Sequences (L, B): the step starts an episode."""
    initial_hidden: torch.Tensor | None = None
    """Sequences (B, ...): the stored state before the first step."""
    envs: torch.Tensor | None = None
    """Sequences (B,): the env column each sequence lies in."""
    starts: torch.Tensor | None = None
    """Sequences (B,): the absolute step each sequence starts at."""


@dataclass(eq=False)
class EncodedBatch(TensorBatch):
    """What the off-policy losses read: a replay batch of S seeds as ``encode`` gives it,
    (S, M, ...) rows with the features the networks read (the observations themselves, or a
    recurrent encoder's features of M = T * B unrolled steps)."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor
    discounts: torch.Tensor
    weights: torch.Tensor
    """Importance weights (ones without prioritized replay)."""
    features: torch.Tensor
    next_features: torch.Tensor
    target_next_features: torch.Tensor
    """What the target networks read at the next step (the target encoder's features)."""


Batch = TensorBatch | Mapping[str, torch.Tensor]
"""What public entry points accept: a typed batch, or a mapping of its fields (from another process)."""
