"""On-policy rollout storage and generalized advantage estimation (Schulman et al. 2016)."""

from __future__ import annotations

from typing import Iterator

import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) advantages and lambda-returns, all tensors (T, N).

    ``next_values[t]`` is V of the true next state of step t (for a truncated episode: of its
    final observation). ``terminated`` cuts the bootstrap; ``dones`` (terminated or truncated)
    cuts the advantage recursion at the episode boundary.

        delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}
    """
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - dones.float()
    deltas = rewards + gamma * not_terminated * next_values - values
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = deltas[t] + gamma * gae_lambda * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values


class RolloutStorage:
    """Fixed-size (T steps x N envs) storage, preallocated on ``device``."""

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        device: torch.device | str = "cpu",
        discrete: bool = False,
    ):
        self.num_steps, self.num_envs = num_steps, num_envs
        T, N = num_steps, num_envs

        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.obs = zeros(T, N, *obs_shape)
        self.actions = zeros(T, N, *action_shape, dtype=torch.long if discrete else torch.float32)
        self.log_probs = zeros(T, N)
        self.values = zeros(T, N)
        self.rewards = zeros(T, N)
        self.terminated = zeros(T, N, dtype=torch.bool)
        self.truncated = zeros(T, N, dtype=torch.bool)
        self.truncation_values = zeros(T, N)  # V(final obs) where an episode was truncated
        self.advantages = zeros(T, N)
        self.returns = zeros(T, N)
        self.step = 0

    @property
    def full(self) -> bool:
        return self.step >= self.num_steps

    def insert(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        log_probs: torch.Tensor,
        values: torch.Tensor,
        rewards: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        truncation_values: torch.Tensor | None = None,
    ) -> None:
        """Store one vector step; ``truncation_values`` (N,) is V(final obs), used where truncated."""
        if self.full:
            raise RuntimeError("rollout storage is full; call compute_returns and reset first")
        t = self.step
        self.obs[t] = obs
        self.actions[t] = actions
        self.log_probs[t] = log_probs
        self.values[t] = values
        self.rewards[t] = rewards
        self.terminated[t] = terminated
        self.truncated[t] = truncated
        if truncation_values is not None:
            self.truncation_values[t] = truncation_values
        self.step += 1

    def compute_returns(self, last_values: torch.Tensor, gamma: float, gae_lambda: float) -> None:
        """Fill ``advantages`` and ``returns``; ``last_values`` (N,) is V of the obs after the last step."""
        next_values = torch.cat([self.values[1:], last_values.unsqueeze(0)])
        next_values = torch.where(self.truncated, self.truncation_values, next_values)
        dones = self.terminated | self.truncated
        self.advantages, self.returns = compute_gae(
            self.rewards, self.values, next_values, self.terminated, dones, gamma, gae_lambda
        )

    def minibatches(self, num_minibatches: int, generator: torch.Generator | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """One epoch of shuffled minibatches over all T*N samples, flattened to (B, ...)."""
        size = self.num_steps * self.num_envs
        flat = {
            "obs": self.obs.flatten(0, 1),
            "actions": self.actions.flatten(0, 1),
            "log_probs": self.log_probs.flatten(),
            "values": self.values.flatten(),
            "advantages": self.advantages.flatten(),
            "returns": self.returns.flatten(),
        }
        order = torch.randperm(size, generator=generator).to(self.obs.device)
        for indices in order.chunk(num_minibatches):
            yield {key: tensor[indices] for key, tensor in flat.items()}

    def reset(self) -> None:
        self.step = 0
        self.truncation_values.zero_()
