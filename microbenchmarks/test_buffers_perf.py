"""Insert and sample for every replay variant at capacity 1M with HalfCheetah-sized transitions.

HalfCheetah-v5: 17-dim observations, 6-dim actions. Buffers are filled to capacity by
writing their storage directly (inserting a million steps one by one would dominate the
run), then one vector step is inserted (wrapping, as in a long run) or one batch sampled.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.buffers import (
    HindsightRelabeler,
    PrioritizedSampler,
    RecentExperience,
    ReplayBuffer,
    SequenceReplayBuffer,
)
from agents.envs import GoalLayout

CAPACITY, OBS_DIM, ACTION_DIM, BATCH = 1_000_000, 17, 6, 256
EPISODE = 1000  # HalfCheetah's episode length


def _goal_reward(achieved: np.ndarray, desired: np.ndarray, info) -> np.ndarray:
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)


def _make(variant: str) -> ReplayBuffer:
    shapes = dict(capacity=CAPACITY, num_envs=1, obs_shape=(OBS_DIM,), action_shape=(ACTION_DIM,))
    if variant == "replay":
        return ReplayBuffer(**shapes)
    if variant == "nstep":
        return ReplayBuffer(**shapes, n_step=3)
    if variant == "per":
        return ReplayBuffer(**shapes, sampler=PrioritizedSampler(CAPACITY))
    if variant == "ere":
        return ReplayBuffer(**shapes, recent=RecentExperience(anneal="none"))
    if variant == "per+ere+nstep":
        return ReplayBuffer(**shapes, n_step=3, sampler=PrioritizedSampler(CAPACITY), recent=RecentExperience(anneal="none"))
    if variant == "her":
        layout = GoalLayout(achieved_goal=(0, 3), desired_goal=(3, 6), observation=(6, OBS_DIM))
        return ReplayBuffer(**shapes, relabeler=HindsightRelabeler(layout, _goal_reward, strategy="future", k=4))
    if variant == "sequence":
        return SequenceReplayBuffer(**shapes, hidden_shape=(256,), sequence_length=40, burn_in=20, overlap=0.5)
    raise ValueError(variant)


def _fill(buffer: ReplayBuffer) -> ReplayBuffer:
    """Write a full buffer of random transitions in 1000-step episodes, as if collected."""
    generator = torch.Generator().manual_seed(0)
    for tensor in buffer.storage.values():
        if tensor.dtype == torch.bool:
            continue
        tensor.copy_(torch.randn(tensor.shape, generator=generator))
    steps = torch.arange(buffer.num_rows)
    buffer.storage["truncated"][:, 0] = (steps + 1) % EPISODE == 0
    buffer.episode_start[:, 0] = steps - steps % EPISODE
    buffer.episode_end[:, 0] = buffer.episode_start[:, 0] + EPISODE - 1
    buffer.rows_written = buffer.num_rows
    if isinstance(buffer.sampler, PrioritizedSampler):
        buffer.sampler.tree.update(torch.arange(buffer.capacity), torch.rand(buffer.capacity, generator=generator, dtype=torch.float64))
    return buffer


VARIANTS = ["replay", "nstep", "per", "ere", "per+ere+nstep", "her", "sequence"]


@pytest.fixture(scope="module", params=VARIANTS)
def full_buffer(request):
    return request.param, _fill(_make(request.param))


def test_insert(benchmark, full_buffer):
    name, buffer = full_buffer
    benchmark.group = "buffer insert (1 step, capacity 1M, HalfCheetah-sized)"
    benchmark.name = name
    step = {
        "obs": torch.randn(1, OBS_DIM),
        "actions": torch.randn(1, ACTION_DIM),
        "rewards": torch.randn(1),
        "next_obs": torch.randn(1, OBS_DIM),
        "terminated": torch.zeros(1, dtype=torch.bool),
        "truncated": torch.zeros(1, dtype=torch.bool),
    }
    extras = {"extras": {"hidden": torch.zeros(1, 256)}} if isinstance(buffer, SequenceReplayBuffer) else {}
    benchmark(buffer.add, **step, **extras)


def test_sample(benchmark, full_buffer):
    name, buffer = full_buffer
    benchmark.group = "buffer sample (batch 256, capacity 1M, HalfCheetah-sized)"
    benchmark.name = name
    generator = torch.Generator().manual_seed(1)
    batch = benchmark(buffer.sample, BATCH, generator)
    assert batch["obs"].shape[-1] == OBS_DIM
    transitions = batch["obs"].shape[0] * (batch["obs"].shape[1] if batch["obs"].dim() == 3 else 1)
    benchmark.extra_info["transitions_per_batch"] = transitions
