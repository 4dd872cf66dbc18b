"""GAE over a rollout at the on-policy algorithms' default shapes (PPO: 2048 steps x 1 env;
A2C: 5 steps x 16 envs; a wide vectorized rollout: 128 steps x 64 envs)."""

from __future__ import annotations

import pytest
import torch

from agents.buffers.rollout import compute_gae

SHAPES = [(2048, 1), (5, 16), (128, 64)]


@pytest.mark.parametrize("steps,envs", SHAPES, ids=[f"{t}x{n}" for t, n in SHAPES])
def test_gae(benchmark, steps, envs):
    generator = torch.Generator().manual_seed(0)
    rewards, values, next_values = (torch.randn(steps, envs, generator=generator) for _ in range(3))
    terminated = torch.rand(steps, envs, generator=generator) < 0.001
    dones = terminated | (torch.rand(steps, envs, generator=generator) < 0.001)
    benchmark.group = "GAE (steps x envs)"
    advantages, returns = benchmark(compute_gae, rewards, values, next_values, terminated, dones, 0.99, 0.95)
    assert advantages.shape == (steps, envs) and torch.isfinite(returns).all()
