"""A sum-tree over non-negative priorities, on torch tensors, with batched updates and queries.

Leaf i holds priority p_i; every inner node holds the sum of its two children, so the root is
the total mass. Sampling proportionally to p_i descends from the root comparing a target mass
with the left child (O(log n) per draw, vectorized over the batch); prefix sums walk up from
a leaf. Schaul, Quan, Antonoglou, Silver (2016), "Prioritized Experience Replay", Sec. 3.3.
"""

from __future__ import annotations

import torch


class SumTree:
    """``capacity`` leaves in a complete binary tree stored as an array (root at index 1)."""

    def __init__(self, capacity: int, device: torch.device | str = "cpu"):
        if capacity < 1:
            raise ValueError(f"sum-tree capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.depth = max(1, (capacity - 1).bit_length())
        self.num_leaves = 1 << self.depth
        self.device = torch.device(device)
        # float64: sums of a million float32 priorities lose the small ones to rounding
        self.nodes = torch.zeros(2 * self.num_leaves, dtype=torch.float64, device=self.device)
        self._shifts = torch.arange(1, self.depth + 1, device=self.device)
        self._writes_since_rebuild = 0

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def get(self, indices: torch.Tensor) -> torch.Tensor:
        """Priorities of leaves ``indices`` (B,) -> (B,) float64."""
        return self.nodes[indices.to(self.device) + self.num_leaves]

    def update(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        """Set leaves ``indices`` (B,) to ``priorities`` (B,); the last write wins for repeats.

        Every ancestor moves by the change of its leaves, in one scatter-add over all levels
        (a handful of tensor ops instead of a pass per level). The float64 sums drift by
        rounding, so the tree is rebuilt exactly from its leaves after every ``num_leaves``
        leaf writes.
        """
        indices = indices.to(self.device, torch.long)
        priorities = priorities.to(self.device, torch.float64)
        if priorities.numel() and bool((priorities < 0).any()):
            raise ValueError("priorities must be non-negative")
        if indices.numel() > 1:
            # keep the last write per index: torch leaves the winner of duplicate writes unspecified
            sorted_indices, order = torch.sort(indices, stable=True)
            last = torch.ones_like(sorted_indices, dtype=torch.bool)
            last[:-1] = sorted_indices[1:] != sorted_indices[:-1]
            indices, priorities = sorted_indices[last], priorities[order[last]]
        leaves = indices + self.num_leaves
        changes = priorities - self.nodes[leaves]
        self.nodes[leaves] = priorities
        ancestors = leaves[None, :] >> self._shifts[:, None]  # (depth, B): parent, grandparent, ..., root
        self.nodes.index_add_(0, ancestors.flatten(), changes.repeat(self.depth))
        self._writes_since_rebuild += indices.numel()
        if self._writes_since_rebuild >= self.num_leaves:
            self.rebuild()

    def rebuild(self) -> None:
        """Recompute every inner node exactly from the leaves."""
        for level in range(self.depth - 1, -1, -1):
            first, count = 1 << level, 1 << level
            children = self.nodes[2 * first : 2 * (first + count)].view(count, 2)
            self.nodes[first : first + count] = children.sum(dim=1)
        self._writes_since_rebuild = 0

    def prefix_sum(self, indices: torch.Tensor) -> torch.Tensor:
        """Sum of the leaves strictly before each of ``indices`` (B,), which may equal capacity."""
        indices = indices.to(self.device, torch.long)
        everything = indices >= self.num_leaves  # past the last leaf: the whole mass
        nodes = torch.where(everything, 0, indices) + self.num_leaves
        sums = torch.zeros(nodes.shape, dtype=torch.float64, device=self.device)
        for _ in range(self.depth):
            is_right_child = (nodes & 1).bool()
            sums += torch.where(is_right_child, self.nodes[nodes - 1], 0.0)
            nodes = nodes // 2
        return torch.where(everything, self.nodes[1], sums)

    def find(self, masses: torch.Tensor) -> torch.Tensor:
        """For each target mass m (B,) in [0, total): the leaf i with prefix(i) <= m < prefix(i+1)."""
        masses = masses.to(self.device, torch.float64).clone()
        nodes = torch.ones(masses.shape, dtype=torch.long, device=self.device)
        for _ in range(self.depth):
            left = self.nodes[2 * nodes]
            go_right = masses >= left
            masses -= torch.where(go_right, left, 0.0)
            nodes = 2 * nodes + go_right.long()
        leaves = nodes - self.num_leaves
        # rounding can land a draw on an empty leaf beyond the last filled one; step back
        return leaves.clamp_(max=self.capacity - 1)
