"""Uniform experience replay on preallocated tensors (ring buffer)."""

from __future__ import annotations

from typing import Any

import torch


class ReplayBuffer:
    """Stores (obs, action, reward, next_obs, terminated) transitions; oldest overwritten first.

    ``terminated`` (not truncated) is kept, so time-limit ends still bootstrap from next_obs.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        device: torch.device | str = "cpu",
        action_dtype: torch.dtype = torch.float32,
    ):
        self.capacity = capacity
        self.device = torch.device(device)
        self.obs = torch.zeros((capacity, *obs_shape), dtype=torch.float32, device=device)
        self.next_obs = torch.zeros((capacity, *obs_shape), dtype=torch.float32, device=device)
        self.actions = torch.zeros((capacity, *action_shape), dtype=action_dtype, device=device)
        self.rewards = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.terminated = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.position = 0  # next slot to write
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
    ) -> None:
        """Insert a batch of N transitions (leading dim N), wrapping around at capacity."""
        n = obs.shape[0]
        if n > self.capacity:
            raise ValueError(f"batch of {n} transitions exceeds capacity {self.capacity}")
        end = self.position + n
        # the common case is a contiguous slice; only a write across the end needs an index
        indices: slice | torch.Tensor = (
            slice(self.position, end) if end <= self.capacity else torch.arange(self.position, end, device=self.device) % self.capacity
        )
        self.obs[indices] = obs.to(self.device)
        self.actions[indices] = actions.to(self.device, self.actions.dtype)
        self.rewards[indices] = rewards.to(self.device, torch.float32)
        self.next_obs[indices] = next_obs.to(self.device)
        self.terminated[indices] = terminated.to(self.device, torch.float32)
        self.position = (self.position + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """A uniform batch (with replacement) of ``batch_size`` transitions."""
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        indices = torch.randint(0, self.size, (batch_size,), generator=generator).to(self.device)
        return {
            "obs": self.obs[indices],
            "actions": self.actions[indices],
            "rewards": self.rewards[indices],
            "next_obs": self.next_obs[indices],
            "terminated": self.terminated[indices],
        }

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        return {
            "obs": self.obs[:n].clone(),
            "next_obs": self.next_obs[:n].clone(),
            "actions": self.actions[:n].clone(),
            "rewards": self.rewards[:n].clone(),
            "terminated": self.terminated[:n].clone(),
            "position": self.position,
            "size": self.size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        n = state["size"]
        for key in ("obs", "next_obs", "actions", "rewards", "terminated"):
            getattr(self, key)[:n] = state[key].to(self.device)
        self.position, self.size = state["position"], n
