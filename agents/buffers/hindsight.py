"""Hindsight experience replay: relabel sampled transitions with goals that were achieved.

Andrychowicz et al. (2017), "Hindsight Experience Replay", Sec. 3.3 and 4.5. Goal envs follow
gymnasium-robotics' GoalEnv interface (observation / achieved_goal / desired_goal and
``compute_reward``, ``compute_terminated``); the buffer stores their flattened observations,
and ``GoalLayout`` says where each part sits. A fraction k / (k + 1) of every batch gets a new
desired goal, the achieved goal of a state from the same episode:

- ``future``: a state at or after the transition's next state (the paper's best strategy);
- ``final``: the episode's last state;
- ``episode``: any state of the episode.

Rewards and terminations of relabeled transitions are recomputed with the env's functions
(an env without ``compute_terminated`` keeps the stored flag: its episodes must not end on
success).
Relabeling happens at sampling time, so the stored data stays as collected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from agents.envs import GoalLayout

if TYPE_CHECKING:
    from agents.batches import ReplayBatch
    from agents.buffers.replay import ReplayBuffer

STRATEGIES = ("future", "final", "episode")

GoalFunction = Callable[[np.ndarray, np.ndarray, dict], np.ndarray]


class HindsightRelabeler:
    """Relabels part of each batch drawn from a ``ReplayBuffer`` (in place)."""

    def __init__(
        self,
        layout: GoalLayout,
        compute_reward: GoalFunction,
        compute_terminated: GoalFunction | None = None,
        strategy: str = "future",
        k: int = 4,
        reward_scale: float = 1.0,
    ):
        if strategy not in STRATEGIES:
            raise ValueError(f"HER strategy must be one of {STRATEGIES}, got {strategy!r}")
        if k < 0:
            raise ValueError(f"HER relabel ratio k must be >= 0, got {k}")
        self.layout, self.strategy, self.k = layout, strategy, k
        self.compute_reward, self.compute_terminated = compute_reward, compute_terminated
        self.reward_scale = reward_scale

    @property
    def relabel_fraction(self) -> float:
        return self.k / (self.k + 1)

    def relabel(
        self,
        buffer: ReplayBuffer,
        batch: ReplayBatch,
        rows: torch.Tensor,
        envs: torch.Tensor,
        generator: torch.Generator | None,
    ) -> None:
        """Replace desired goals, rewards and terminations of a random k/(k+1) of ``batch``."""
        size = rows.shape[0]
        chosen = torch.nonzero(torch.rand(size, generator=generator) < self.relabel_fraction).flatten().to(buffer.device)
        if chosen.numel() == 0:
            return
        rows, envs = rows[chosen], envs[chosen]
        goal_steps = self._goal_steps(buffer, rows, envs, generator)
        goal_rows = goal_steps % buffer.num_rows
        achieved, desired = self.layout.achieved_goal, self.layout.desired_goal
        goals = buffer.storage["next_obs"][goal_rows, envs, achieved[0] : achieved[1]]

        obs, next_obs = batch.obs[chosen], batch.next_obs[chosen]
        obs[:, desired[0] : desired[1]] = goals
        next_obs[:, desired[0] : desired[1]] = goals
        batch.obs[chosen], batch.next_obs[chosen] = obs, next_obs

        next_achieved = next_obs[:, achieved[0] : achieved[1]].cpu().numpy()
        goals_np = goals.cpu().numpy()
        rewards = np.asarray(self.compute_reward(next_achieved, goals_np, {}), dtype=np.float32)
        batch.rewards[chosen] = torch.as_tensor(rewards * self.reward_scale, device=buffer.device)
        if self.compute_terminated is not None:
            terminated = np.asarray(self.compute_terminated(next_achieved, goals_np, {}), dtype=np.float32)
            batch.terminated[chosen] = torch.as_tensor(np.broadcast_to(terminated, rewards.shape).copy(), device=buffer.device)

    def _goal_steps(self, buffer: ReplayBuffer, rows: torch.Tensor, envs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Absolute step of the state whose achieved goal becomes the new desired goal."""
        oldest = buffer.rows_written - buffer.rows_stored
        newest = buffer.rows_written - 1
        # absolute step of each sampled row: rows ahead of the write head are one lap older
        steps = buffer.rows_written - 1 - (buffer.position - 1 - rows) % buffer.num_rows
        ends = buffer.episode_end[rows, envs]
        ends = torch.where(ends < 0, newest, ends)  # a running episode: up to the newest step
        if self.strategy == "final":
            return ends
        first = steps if self.strategy == "future" else buffer.episode_start[rows, envs].clamp(min=oldest)
        spans = (ends - first + 1).clamp(min=1)
        offsets = (torch.rand(rows.shape[0], generator=generator).to(buffer.device) * spans).long()
        return first + torch.minimum(offsets, spans - 1)
