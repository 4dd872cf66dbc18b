"""Deterministic evaluation on frozen observation normalization."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from agents.api import Algorithm
from agents.envs import load_normalization_state, normalization_state
from benchmark.training.results import Evaluation

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation envs are seeded ``seed + EVAL_SEED_OFFSET``: they never share seeds with training envs."""


def evaluate(
    algo: Algorithm,
    eval_envs: gym.vector.VectorEnv,
    train_envs: gym.vector.VectorEnv,
    seed: int,
    device: torch.device,
    step: int = 0,
) -> Evaluation:
    """One episode in each eval sub-env with the deterministic policy; unscaled returns.

    Observation normalization uses the training envs' current statistics, frozen.
    """
    load_normalization_state(eval_envs, normalization_state(train_envs))
    obs, _ = eval_envs.reset(seed=seed)
    num_envs = eval_envs.num_envs
    returns = np.zeros(num_envs)
    lengths = np.zeros(num_envs, dtype=np.int64)
    finished = np.zeros(num_envs, dtype=bool)
    state: Any = None
    while not finished.all():
        acted = algo.act(torch.as_tensor(obs, dtype=torch.float32, device=device), state, deterministic=True)
        obs, rewards, terminated, truncated, _ = eval_envs.step(acted.env_actions)
        state = algo.reset_state(acted.state, torch.as_tensor(terminated | truncated, device=device))
        running = ~finished
        returns[running] += rewards[running]
        lengths[running] += 1
        finished |= terminated | truncated
    return Evaluation(step=step, returns=returns.tolist(), lengths=lengths.tolist())
