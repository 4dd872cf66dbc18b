"""Which stored transitions a replay batch draws: uniform, or prioritized by TD error (PER).

Both samplers draw flat indices from a window ``[start, start + count)`` taken modulo the
buffer's flat size, so emphasizing-recent-experience (a window over the newest data) works
with either of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agents.buffers.sumtree import SumTree


@dataclass(frozen=True)
class Window:
    """Flat indices ``(start + i) % modulus`` for i in [0, count)."""

    start: int
    count: int
    modulus: int


class UniformSampler:
    """Every transition in the window equally likely (with replacement)."""

    prioritized = False

    def sample(self, batch_size: int, window: Window, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B,) flat indices and no importance weights."""
        offsets = torch.randint(0, window.count, (batch_size,), generator=generator)
        if window.start == 0:  # count <= modulus: the offsets are the indices
            return offsets, None
        return (window.start + offsets) % window.modulus, None

    def on_insert(self, indices: torch.Tensor) -> None:
        """New data at flat ``indices``; nothing to do for uniform sampling."""

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """Uniform sampling keeps no priorities."""

    def set_progress(self, fraction: float) -> None:
        """Nothing is annealed."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class PrioritizedSampler:
    """Proportional prioritized replay, Schaul et al. (2016), Algorithm 1.

    P(i) = p_i^alpha / sum_k p_k^alpha with p_i = |delta_i| + eps; new transitions get the
    largest priority seen so far, so each is replayed at least once soon. Importance weights
    w_i = (N P(i))^-beta / max_j w_j (max over the batch) correct the bias; beta is annealed
    linearly from ``beta`` to 1 as training progresses (``set_progress``). Draws are
    stratified: one per equal-mass segment, as in the paper's rank-free variant.
    """

    prioritized = True

    def __init__(self, capacity: int, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6, device: torch.device | str = "cpu"):
        self.tree = SumTree(capacity, device)
        self.alpha, self.initial_beta, self.eps = alpha, beta, eps
        self.beta = beta
        self.max_priority = 1.0  # of |delta| + eps, before the alpha exponent

    def set_progress(self, fraction: float) -> None:
        """Anneal beta linearly to 1 over training; ``fraction`` in [0, 1]."""
        fraction = min(max(fraction, 0.0), 1.0)
        self.beta = self.initial_beta + (1.0 - self.initial_beta) * fraction

    def on_insert(self, indices: torch.Tensor) -> None:
        self.tree.update(indices, torch.full(indices.shape, self.max_priority**self.alpha, dtype=torch.float64))

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """Set p_i = |delta_i| + eps for the transitions of the last batch."""
        priorities = td_errors.detach().abs().double().to(self.tree.device) + self.eps
        if not bool(torch.isfinite(priorities).all()):
            raise ValueError("prioritized replay got non-finite TD errors; the losses diverged")
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(indices, priorities.pow(self.alpha))

    def sample(self, batch_size: int, window: Window, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) flat indices drawn with P(i) within the window, and their importance weights (B,)."""
        # the window is one range, or two when it wraps around the end of the storage
        first_end = min(window.start + window.count, window.modulus)
        ends = torch.tensor([window.start, first_end, 0, window.start + window.count - first_end])
        prefix = self.tree.prefix_sum(ends)
        first_mass = float(prefix[1] - prefix[0])
        mass = first_mass + float(prefix[3] - prefix[2])
        if mass <= 0:
            raise RuntimeError("prioritized replay: all priorities in the sampled window are zero")
        uniforms = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        targets = (torch.arange(batch_size, dtype=torch.float64) + uniforms) / batch_size * mass
        targets = targets.clamp_(max=mass * (1 - 1e-12)).to(self.tree.device)
        in_first = targets < first_mass
        cumulative = torch.where(in_first, prefix[0].to(self.tree.device) + targets, targets - first_mass)
        indices = self.tree.find(cumulative)
        # a draw that rounding put on an empty leaf must not get an infinite weight
        probabilities = (self.tree.get(indices) / mass).clamp(min=1e-12)
        weights = (window.count * probabilities).pow(-self.beta)
        weights = (weights / weights.max()).float()
        return indices, weights

    def state_dict(self) -> dict:
        return {"nodes": self.tree.nodes.clone(), "max_priority": self.max_priority, "beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        self.tree.nodes.copy_(state["nodes"])
        self.max_priority, self.beta = float(state["max_priority"]), float(state["beta"])
