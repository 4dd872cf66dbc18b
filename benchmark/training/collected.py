"""What a collector's rollout brings the learner, as it crosses processes (``collectors``):
a round's ``Collected`` steps, or one ``RawStep`` of a lock-step round (``normalized_collection``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated", "truncated")


@dataclass
class Collected:
    """A collector's rollout of T steps of its k envs, each field stacked (T, k, ...): what
    one process would observe in those envs' rows (``env_actions`` an array, ``extras`` by
    name); the episodes that ended (return, length, step index); the acting state it ended in.
    Stacked, a rollout crosses processes as a few tensors, not T * 8 small ones."""

    fields: dict[str, torch.Tensor]
    env_actions: np.ndarray
    extras: dict[str, torch.Tensor]
    episodes: list[tuple[float, int, int]] = field(default_factory=list)
    acting_state: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    """How long the collection took, in the collector."""
    priorities: torch.Tensor | None = None
    """Each transition's |TD error| (T, k) when the collector computed initial priorities."""
    collector: int = 0
    """The index of the collector it came from."""
    raw: dict[str, np.ndarray] = field(default_factory=dict)
    """Asynchronous and normalized: what the envs returned (``obs`` after each step, ``rewards``)
    (T, k, ...), for the learner's statistics; ``fields`` hold them normalized as acted on."""

    @property
    def num_steps(self) -> int:
        return int(self.fields["obs"].shape[0])

    def head(self, steps: int) -> Collected:
        """Its first ``steps`` steps (a run's last round needs no more)."""
        return Collected(
            {name: value[:steps] for name, value in self.fields.items()},
            self.env_actions[:steps],
            {name: value[:steps] for name, value in self.extras.items()},
            [episode for episode in self.episodes if episode[2] < steps],
            self.acting_state,
            self.seconds,
            None if self.priorities is None else self.priorities[:steps],
            self.collector,
            {name: value[:steps] for name, value in self.raw.items()},
        )


@dataclass
class RawStep:
    """One lock-step of a collector's k envs: the actions taken and what the envs returned,
    raw (the learner normalizes the run's C*k envs' steps joined)."""

    actions: torch.Tensor
    env_actions: np.ndarray
    extras: dict[str, torch.Tensor]
    next_obs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: tuple[np.ndarray, np.ndarray] | None
    """(``infos["final_obs"]``, ``infos["_final_obs"]``) where an episode ended."""
    episodes: list[tuple[float, int]]
    seconds: float
