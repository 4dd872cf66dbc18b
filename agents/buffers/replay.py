"""Experience replay on preallocated tensors, laid out (time, env) for vectorized envs.

One vector-env step writes one row: ``obs[t, e]`` is env e's observation at row t. The rows
form a ring over time, so consecutive rows of a column are consecutive steps of one env;
that makes n-step returns, hindsight goals and sequences plain index arithmetic. A flat index
``t * num_envs + e`` names one transition; samplers (uniform, prioritized) draw flat indices
from a window (everything, or the newest data for ERE).

Every batch carries ``discounts``: gamma^m for an m-step return (m = 1 without n-step), so
algorithms form targets as ``rewards + discounts * (1 - terminated) * V(next_obs)``.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import torch

from agents.batches import ReplayBatch
from agents.buffers.prioritized import PrioritizedSampler, UniformSampler, Window
from agents.buffers.recent import RecentExperience


class Relabeler(Protocol):
    """What rewrites part of a sampled batch in place (``agents.buffers.hindsight``'s goals)."""

    def relabel(self, buffer: ReplayBuffer, batch: ReplayBatch, rows: torch.Tensor, envs: torch.Tensor, generator: torch.Generator | None) -> None: ...


FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated", "truncated")


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros whose memory, on the CPU, is committed only where written: NumPy allocates them
    with calloc, which maps untouched pages to the zero page, while ``torch.zeros`` writes every
    byte. A 1M-transition buffer in a run shorter than its capacity then holds only what the
    run stored (SAC on HalfCheetah: 170 MiB at construction otherwise)."""
    if device.type == "cpu":
        try:
            numpy_dtype = torch.empty((), dtype=dtype).numpy().dtype
        except TypeError:  # no NumPy equivalent (bfloat16, ...)
            pass
        else:
            return torch.from_numpy(np.zeros(shape, dtype=numpy_dtype))
    return torch.zeros(shape, dtype=dtype, device=device)


class ReplayBuffer:
    """Ring buffer of transitions from ``num_envs`` parallel envs; oldest rows overwritten first.

    Args:
        capacity: transitions in all (rounded up to whole rows of ``num_envs``).
        n_step: length of the multi-step returns in sampled batches. The return is cut at
            the first episode end: no bootstrap after a termination, a bootstrap from the
            true final observation after a truncation; at the newest data it is shortened
            to the steps stored so far.
        sampler: uniform (default) or ``PrioritizedSampler`` of the same flat capacity.
        recent: an ERE window schedule; None samples from everything stored.
        relabeler: hindsight goal relabeling (one-step returns only).
        extras: per-step tensors to store besides the transition, name -> (shape, dtype),
            e.g. recurrent hidden states.
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        device: torch.device | str = "cpu",
        *,
        action_dtype: torch.dtype = torch.float32,
        gamma: float = 0.99,
        n_step: int = 1,
        sampler: UniformSampler | PrioritizedSampler | None = None,
        recent: RecentExperience | None = None,
        relabeler: Relabeler | None = None,
        extras: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None,
    ):
        if capacity < 1 or num_envs < 1 or n_step < 1:
            raise ValueError(f"capacity, num_envs and n_step must be >= 1, got {capacity}, {num_envs}, {n_step}")
        if relabeler is not None and n_step > 1:
            raise ValueError("hindsight relabeling recomputes one-step rewards; it cannot be combined with n_step > 1")
        self.num_envs = num_envs
        self.capacity = self.rounded_capacity(capacity, num_envs)
        self.num_rows = self.capacity // num_envs
        if isinstance(sampler, PrioritizedSampler) and sampler.tree.capacity != self.capacity:
            raise ValueError(f"the prioritized sampler holds {sampler.tree.capacity} priorities for {self.capacity} transitions")
        self.device = torch.device(device)
        self.gamma, self.n_step = gamma, n_step
        self.sampler = sampler or UniformSampler()
        self.recent, self.relabeler = recent, relabeler

        rows, envs = self.num_rows, num_envs

        def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return lazy_zeros((rows, envs, *shape), dtype, self.device)

        self.storage: dict[str, torch.Tensor] = {
            "obs": zeros(obs_shape, torch.float32),
            "actions": zeros(action_shape, action_dtype),
            "rewards": zeros((), torch.float32),
            "next_obs": zeros(obs_shape, torch.float32),
            "terminated": zeros((), torch.bool),
            "truncated": zeros((), torch.bool),
        }
        for name, (shape, dtype) in (extras or {}).items():
            self.storage[name] = zeros(shape, dtype)
        # episode bookkeeping, in absolute step counts (rows ever written), for HER and sequences
        self.episode_start = zeros((), torch.long)
        self.episode_end = zeros((), torch.long)  # -1 while the episode is still running
        self._current_start = torch.zeros(envs, dtype=torch.long, device=self.device)
        self._running_returns = torch.zeros(envs, dtype=torch.float64)
        self.rows_written = 0  # absolute count; the next row goes to rows_written % num_rows
        # CPU storage is written through NumPy views of the same memory: a row of a few small
        # fields is copied several times faster by NumPy indexing than by torch's
        self._numpy = None
        if self.device.type == "cpu":
            self._numpy = {name: tensor.numpy() for name, tensor in self.storage.items()}
            self._numpy.update(episode_start=self.episode_start.numpy(), episode_end=self.episode_end.numpy())
        self._flat = {name: tensor.flatten(0, 1) for name, tensor in self.storage.items()}  # views: (capacity, ...)
        self._constants: dict[tuple[str, int], torch.Tensor] = {}

    @staticmethod
    def rounded_capacity(capacity: int, num_envs: int) -> int:
        """Capacity rounded up to whole rows of ``num_envs`` transitions."""
        return math.ceil(capacity / num_envs) * num_envs

    # -- inserting ----------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Ring row the next insert writes."""
        return self.rows_written % self.num_rows

    @property
    def rows_stored(self) -> int:
        return min(self.rows_written, self.num_rows)

    def __len__(self) -> int:
        return self.rows_stored * self.num_envs

    def add(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor | None = None,
        extras: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Store one vector step: every argument has leading dim num_envs.

        ``next_obs`` is the true next observation (the final one where an episode ended).
        """
        if obs.shape[0] != self.num_envs:
            raise ValueError(f"expected a step of {self.num_envs} envs, got {obs.shape[0]}")
        row, now = self.position, self.rows_written
        if truncated is None:
            truncated = torch.zeros_like(terminated, dtype=torch.bool)
        values = {
            "obs": obs,
            "actions": actions,
            "rewards": rewards,
            "next_obs": next_obs,
            "terminated": terminated,
            "truncated": truncated,
            **(extras or {}),
        }
        if self._numpy is not None:
            arrays = {name: value.detach().cpu().numpy() for name, value in values.items()}
            for name, array in arrays.items():
                self._numpy[name][row] = array
            self._numpy["episode_start"][row] = self._current_start.numpy()
            self._numpy["episode_end"][row] = -1
            ended = arrays["terminated"].astype(bool) | arrays["truncated"].astype(bool)
            done = torch.from_numpy(ended) if ended.any() else None
        else:
            for name, value in values.items():
                target = self.storage[name]
                target[row] = value.to(self.device, target.dtype)
            self.episode_start[row] = self._current_start
            self.episode_end[row] = -1
            # decided where the flags are: the loop's host flags are not read back from the device
            # (their copy into the storage above still waits for the stream, as a pageable copy does)
            ended_tensor = terminated.to(torch.bool) | truncated.to(terminated.device, torch.bool)
            done = ended_tensor if bool(ended_tensor.any()) else None
        self.rows_written += 1
        if self.sampler.prioritized:
            self.sampler.on_insert(torch.arange(row * self.num_envs, (row + 1) * self.num_envs))
        if self.recent is not None:
            self._running_returns += rewards.detach().double().cpu()
        if done is not None:
            self._close_episodes(done, now)

    def truncate_newest(self) -> None:
        """End every env's episode in progress as truncated at the newest stored row."""
        if self.rows_written == 0:
            return
        row, now = (self.rows_written - 1) % self.num_rows, self.rows_written - 1
        running = self.episode_end[row] == -1
        self.storage["truncated"][row] |= running
        if bool(running.any()):
            self._close_episodes(running, now)

    def _close_episodes(self, done: torch.Tensor, now: int) -> None:
        """Mark the end (absolute step ``now``) on every stored row of the episodes that ended."""
        for env in torch.nonzero(done).flatten().tolist():
            start = max(int(self._current_start[env]), self.rows_written - self.num_rows)
            rows = torch.arange(start, now + 1, device=self.device) % self.num_rows
            self.episode_end[rows, env] = now
            if self.recent is not None:
                self.recent.record_episode(float(self._running_returns[env]))
            self._running_returns[env] = 0.0
        self._current_start[done.to(self._current_start.device)] = now + 1

    # -- sampling -----------------------------------------------------------------------------

    def set_progress(self, fraction: float) -> None:
        """Fraction of training done, in [0, 1], for annealed quantities (PER beta, ERE eta)."""
        self.sampler.set_progress(fraction)
        if self.recent is not None:
            self.recent.set_progress(fraction)

    def sample_window(self) -> Window:
        """The flat range a batch is drawn from: all stored data, or ERE's newest c_k."""
        stored = len(self)
        if stored == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        if self.recent is None:
            return Window(0, stored, self.capacity)
        rows = math.ceil(self.recent.window_size(stored) / self.num_envs)
        start_row = (self.position - rows) % self.num_rows
        return Window(start_row * self.num_envs, rows * self.num_envs, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> ReplayBatch:
        """A batch of ``batch_size`` transitions (with replacement).

        Keys: obs, actions, rewards (n-step discounted sums), next_obs, terminated (of the last
        step used), discounts (gamma^m), indices (flat, for ``update_priorities``), weights
        (importance weights; ones without prioritization), and any extras at the first step.
        """
        indices, weights = self.sampler.sample(batch_size, self.sample_window(), generator)
        indices = indices.to(self.device)
        batch_weights = self._constant("ones", batch_size, 1.0) if weights is None else weights.to(self.device)
        if self.n_step == 1 and self.relabeler is None:
            # a flat index t * num_envs + e is the row of the (time * env)-flattened storage: one gather per field
            batch = {name: self._flat[name][indices] for name in self.storage if name != "truncated"}
            batch["terminated"] = batch["terminated"].float()
            return ReplayBatch(**batch, discounts=self._constant("gamma", batch_size, self.gamma), indices=indices, weights=batch_weights)
        rows, envs = indices // self.num_envs, indices % self.num_envs
        batch = {name: tensor[rows, envs] for name, tensor in self.storage.items() if name not in ("rewards", "next_obs", "terminated", "truncated")}
        if self.n_step == 1:
            last_rows = rows
            batch["rewards"] = self.storage["rewards"][rows, envs]
            batch["discounts"] = torch.full((batch_size,), self.gamma, device=self.device)
        else:
            batch["rewards"], batch["discounts"], last_rows = self._n_step_returns(rows, envs)
        batch["next_obs"] = self.storage["next_obs"][last_rows, envs]
        batch["terminated"] = self.storage["terminated"][last_rows, envs].float()
        batch["indices"] = indices
        batch["weights"] = batch_weights
        sampled = ReplayBatch(**batch)
        if self.relabeler is not None:
            self.relabeler.relabel(self, sampled, rows, envs, generator)
        return sampled

    def _constant(self, name: str, size: int, value: float) -> torch.Tensor:
        """A (size,) tensor filled with ``value``, made once: batches share it, so it must never
        be written to."""
        key = (name, size)
        if key not in self._constants:
            self._constants[key] = torch.full((size,), value, device=self.device)
        return self._constants[key]

    def _n_step_returns(self, rows: torch.Tensor, envs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """sum_{k<m} gamma^k r_{t+k}, gamma^m and the row t+m-1, with m <= n cut at episode ends."""
        offsets = torch.arange(self.n_step, device=self.device)
        # how many newer rows exist after each sampled row (never read past the write head)
        newer = (self.position - 1 - rows) % self.num_rows
        step_rows = (rows[:, None] + offsets) % self.num_rows  # (B, n)
        rewards = self.storage["rewards"][step_rows, envs[:, None]]
        ended = self.storage["terminated"][step_rows, envs[:, None]] | self.storage["truncated"][step_rows, envs[:, None]]
        # step k is used if it exists and no episode ended at an earlier step
        ended_before = torch.cumsum(ended.long(), dim=1) - ended.long()
        used = (offsets[None, :] <= newer[:, None]) & (ended_before == 0)
        discount_powers = self.gamma ** offsets.double()
        returns = (rewards.double() * discount_powers * used).sum(dim=1).float()
        steps = used.long().sum(dim=1)  # m >= 1: step 0 is always used
        last_rows = (rows + steps - 1) % self.num_rows
        discounts = (self.gamma ** steps.double()).float()
        return returns, discounts, last_rows

    def newest_indices(self) -> torch.Tensor:
        """The flat indices (num_envs,) of the vector step stored last."""
        row = (self.rows_written - 1) % self.num_rows
        return torch.arange(row * self.num_envs, (row + 1) * self.num_envs)

    def rewritten_since(self, indices: torch.Tensor, rows_written: int) -> torch.Tensor:
        """Which flat ``indices`` (B,) hold a transition stored after the buffer had written
        ``rows_written`` rows (a bool mask, B): their rows were written again since."""
        count = self.rows_written - rows_written
        if count >= self.num_rows:
            return torch.ones_like(indices, dtype=torch.bool)
        rows = torch.div(indices, self.num_envs, rounding_mode="floor")
        return (rows - rows_written) % self.num_rows < count

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """New priorities from the TD errors of the batch drawn at flat ``indices`` (PER only)."""
        self.sampler.update_priorities(indices, td_errors)

    # -- checkpointing ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        rows = self.rows_stored
        return {
            "storage": {name: tensor[:rows].clone() for name, tensor in self.storage.items()},
            "episode_start": self.episode_start[:rows].clone(),
            "episode_end": self.episode_end[:rows].clone(),
            "current_start": self._current_start.clone(),
            "running_returns": self._running_returns.clone(),
            "rows_written": self.rows_written,
            "sampler": self.sampler.state_dict(),
            "recent": self.recent.state_dict() if self.recent is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rows = min(state["rows_written"], self.num_rows)
        for name, tensor in state["storage"].items():
            self.storage[name][:rows] = tensor.to(self.device)
        self.episode_start[:rows] = state["episode_start"].to(self.device)
        self.episode_end[:rows] = state["episode_end"].to(self.device)
        self._current_start.copy_(state["current_start"])
        self._running_returns.copy_(state["running_returns"])
        self.rows_written = int(state["rows_written"])
        self.sampler.load_state_dict(state["sampler"])
        if self.recent is not None and state["recent"] is not None:
            self.recent.load_state_dict(state["recent"])
