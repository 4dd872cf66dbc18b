"""One task's transitions for a meta-learner that samples per task (PEARL's context and
replay buffers: Rakelly et al. 2019, one buffer per training task)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class TaskBuffer:
    """One task's transitions; grows by doubling up to ``capacity``, then overwrites the oldest."""

    def __init__(self, obs_dim: int, action_dim: int, capacity: int, device: torch.device):
        self.obs_dim, self.action_dim, self.capacity, self.device = obs_dim, action_dim, capacity, device
        self.data = self._allocate(min(capacity, 1024))
        self.size = self.position = 0

    def _allocate(self, rows: int) -> dict[str, torch.Tensor]:
        return {
            "obs": torch.zeros(rows, self.obs_dim, device=self.device),
            "actions": torch.zeros(rows, self.action_dim, device=self.device),
            "rewards": torch.zeros(rows, device=self.device),
            "next_obs": torch.zeros(rows, self.obs_dim, device=self.device),
            "terminated": torch.zeros(rows, device=self.device),
        }

    def clear(self) -> None:
        self.size = self.position = 0

    def add(self, transitions: Mapping[str, torch.Tensor]) -> None:
        count = len(transitions["obs"])
        rows = len(self.data["obs"])
        if self.size + count > rows and rows < self.capacity:
            new_rows = min(self.capacity, max(2 * rows, self.size + count))
            grown = self._allocate(new_rows)
            for key, value in self.data.items():
                grown[key][: self.size] = value[: self.size]
            self.data = grown
            rows = new_rows
        indices = (self.position + torch.arange(count, device=self.device)) % rows
        for key, value in transitions.items():
            self.data[key][indices] = value.to(self.data[key].dtype)
        self.position = int((self.position + count) % rows)
        self.size = min(self.size + count, rows)

    def sample(self, count: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        indices = torch.randint(self.size, (count,), generator=generator).to(self.device)
        return {key: value[indices] for key, value in self.data.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size, "position": self.position, **{k: v[: max(self.size, self.position)].cpu() for k, v in self.data.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        rows = max(len(state["obs"]), 1)
        self.data = self._allocate(max(rows, min(self.capacity, 1024)))
        for key in self.data:
            self.data[key][: len(state[key])] = state[key].to(self.device)
        self.size, self.position = int(state["size"]), int(state["position"])
