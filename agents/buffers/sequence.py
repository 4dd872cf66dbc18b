"""Replay of fixed-length sequences for recurrent agents, with stored hidden states and burn-in.

Kapturowski, Ostrovski, Quan, Munos, Dabney (2019), "Recurrent Experience Replay in
Distributed Reinforcement Learning" (R2D2), Sec. 3: the recurrent state the actor had is
stored with each step; a sampled sequence starts from its stored state, and the first
``burn_in`` steps only recompute the state with the current network (no loss) before the
``sequence_length`` steps that are trained on. Consecutive sequence starts of an env are
``sequence_length * (1 - overlap)`` steps apart (R2D2: 80 steps overlapping by 40).

Sequences may cross episode boundaries: ``resets`` marks the first step of each new episode,
where the network restarts from a zero state, exactly as the actor did when collecting.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from agents.batches import ReplayBatch
from agents.buffers.replay import ReplayBuffer

HIDDEN = "hidden"


class SequenceReplayBuffer(ReplayBuffer):
    """A ``ReplayBuffer`` that also stores the actor's hidden state and samples sequences."""

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        hidden_shape: tuple[int, ...],
        device: torch.device | str = "cpu",
        *,
        action_dtype: torch.dtype = torch.float32,
        gamma: float = 0.99,
        sequence_length: int = 80,
        burn_in: int = 40,
        overlap: float = 0.5,
    ):
        if sequence_length < 1 or burn_in < 0 or not 0.0 <= overlap < 1.0:
            raise ValueError(f"need sequence_length >= 1, burn_in >= 0 and overlap in [0, 1); got {sequence_length}, {burn_in}, {overlap}")
        super().__init__(
            capacity,
            num_envs,
            obs_shape,
            action_shape,
            device,
            action_dtype=action_dtype,
            gamma=gamma,
            extras={HIDDEN: (hidden_shape, torch.float32)},
        )
        self.sequence_length, self.burn_in = sequence_length, burn_in
        self.total_length = burn_in + sequence_length
        self.stride = max(1, round(sequence_length * (1.0 - overlap)))
        if self.total_length > self.num_rows:
            raise ValueError(f"sequences of {self.total_length} steps do not fit in {self.num_rows} rows per env")

    def stored_hidden(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The hidden state the actor had at every step of a sampled batch: (L, B, *hidden_shape)."""
        steps = batch["starts"][None, :] + torch.arange(self.total_length, device=self.device)[:, None]
        return self.storage[HIDDEN][steps % self.num_rows, batch["envs"][None, :]]

    def num_sequences(self) -> int:
        """Sequence start points available per env (0 until a whole sequence is stored)."""
        first, last = self._start_range()
        return max(0, (last - first) // self.stride + 1) if last >= first else 0

    def _start_range(self) -> tuple[int, int]:
        """First and last absolute start step on the stride grid whose whole sequence is stored."""
        oldest = self.rows_written - self.rows_stored
        last_start = self.rows_written - self.total_length
        first = math.ceil(oldest / self.stride) * self.stride
        last = (last_start // self.stride) * self.stride if last_start >= 0 else -1
        return first, last

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> ReplayBatch:
        """``batch_size`` sequences, time-major: each value is (L, B, ...) with L = burn_in +
        sequence_length, plus ``initial_hidden`` (B, *hidden_shape), the stored state before
        the first step, and ``resets`` (L, B), true at the first step of an episode."""
        count = self.num_sequences()
        if count == 0:
            raise RuntimeError(f"no complete sequence of {self.total_length} steps stored yet")
        first, _ = self._start_range()
        grid = torch.randint(0, count, (batch_size,), generator=generator)
        starts = first + self.stride * grid  # absolute steps
        envs = torch.randint(0, self.num_envs, (batch_size,), generator=generator).to(self.device)
        steps = starts.to(self.device)[None, :] + torch.arange(self.total_length, device=self.device)[:, None]  # (L, B)
        rows = steps % self.num_rows
        columns = envs[None, :].expand_as(rows)
        batch = {name: tensor[rows, columns] for name, tensor in self.storage.items() if name not in (HIDDEN, "truncated")}
        batch["terminated"] = batch["terminated"].float()
        batch["discounts"] = torch.full(rows.shape, self.gamma, device=self.device)
        batch["resets"] = self.episode_start[rows, columns] == steps
        batch["initial_hidden"] = self.storage[HIDDEN][rows[0], envs]
        batch["envs"], batch["starts"] = envs, starts.to(self.device)  # where each sequence lies
        return ReplayBatch(**batch)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "sequence_length": self.sequence_length, "burn_in": self.burn_in}
