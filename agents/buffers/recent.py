"""Emphasizing Recent Experience (ERE): sample from a window over the newest data that shrinks
across a cycle of updates.

Wang and Ross (2019), "Boosting Soft Actor-Critic: Emphasizing Recent Experience without
Forgetting the Past", arXiv:1906.04009. For the k-th of K consecutive updates the batch is
drawn from the c_k most recent of N stored transitions,

    c_k = max(N * eta^(k * 1000 / K), c_min),

so early updates of a cycle see (almost) everything and late ones emphasize recent data. The
paper runs K updates after each episode of K steps; with updates every few env steps the
cycle is ``updates_per_cycle`` consecutive updates (1000, the paper's MuJoCo episode length).
eta = 1 is uniform replay. The paper anneals eta toward 1 over training; ``anneal`` chooses:

- ``"performance"``: eta = 1 + (eta0 - 1) * clip(I / I_max, 0, 1), where I is the gain in best
  episode return between the last ``window_episodes`` episodes and the ones before, and I_max
  the largest gain seen so far: emphasis stays strong while the agent improves and fades to
  uniform when it stops (the paper's adaptive scheme);
- ``"linear"``: eta from eta0 to 1 linearly in the fraction of training done;
- ``"none"``: eta stays eta0.
"""

from __future__ import annotations

import math
from collections import deque
from typing import cast

from agents.configs.offpolicy import ANNEAL_SCHEDULES


class RecentExperience:
    """Computes the ERE window size c_k for each successive update."""

    def __init__(
        self,
        eta: float = 0.996,
        c_min: int = 5_000,
        updates_per_cycle: int = 1_000,
        anneal: str = "performance",
        window_episodes: int = 10,
    ):
        if not 0.0 < eta <= 1.0:
            raise ValueError(f"ERE eta must be in (0, 1], got {eta}")
        if window_episodes < 1:
            raise ValueError(f"ERE window_episodes must be >= 1, got {window_episodes}")
        if anneal not in ANNEAL_SCHEDULES:
            raise ValueError(f"ERE anneal must be one of {ANNEAL_SCHEDULES}, got {anneal!r}")
        self.initial_eta, self.eta = eta, eta
        self.c_min, self.updates_per_cycle, self.anneal = c_min, updates_per_cycle, anneal
        self.returns: deque[float] = deque(maxlen=2 * window_episodes)
        self.window_episodes = window_episodes
        self.max_improvement = 0.0
        self.update_index = 0

    def window_size(self, size: int) -> int:
        """c_k for the current update, in transitions, given ``size`` stored; advances k."""
        k = self.update_index % self.updates_per_cycle + 1
        self.update_index += 1
        emphasized = math.ceil(size * self.eta ** (k * 1000 / self.updates_per_cycle))
        return max(1, min(size, max(emphasized, self.c_min)))

    def set_progress(self, fraction: float) -> None:
        if self.anneal == "linear":
            self.eta = self.initial_eta + (1.0 - self.initial_eta) * min(max(fraction, 0.0), 1.0)

    def record_episode(self, episode_return: float) -> None:
        """Feed a finished episode's return (for the performance schedule)."""
        if self.anneal != "performance":
            return
        self.returns.append(episode_return)
        if len(self.returns) < cast(int, self.returns.maxlen):  # bounded: 2 * window_episodes
            return
        returns = list(self.returns)
        improvement = max(returns[self.window_episodes :]) - max(returns[: self.window_episodes])
        self.max_improvement = max(self.max_improvement, improvement)
        progress = min(max(improvement / self.max_improvement, 0.0), 1.0) if self.max_improvement > 0 else 0.0
        self.eta = 1.0 + (self.initial_eta - 1.0) * progress

    def state_dict(self) -> dict:
        return {
            "eta": self.eta,
            "returns": list(self.returns),
            "max_improvement": self.max_improvement,
            "update_index": self.update_index,
        }

    def load_state_dict(self, state: dict) -> None:
        self.eta, self.max_improvement = float(state["eta"]), float(state["max_improvement"])
        self.returns.clear()
        self.returns.extend(state["returns"])
        self.update_index = int(state["update_index"])
