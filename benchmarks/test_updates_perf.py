"""One update of every algorithm at its published default network and batch sizes.

Continuous-action algorithms on HalfCheetah-v5 (17-dim observations, 6-dim actions); DQN on
CartPole-v1. Off-policy: one gradient step on a batch from a replay buffer holding 10k
random transitions. PPO: one full update (its default epochs and minibatches over a 2048-step
rollout).
"""

from __future__ import annotations

import pytest
import torch

import agents
from agents.api import Transitions
from agents.envs import env_spec

CASES = [("ppo", "HalfCheetah-v5"), ("ddpg", "HalfCheetah-v5"), ("td3", "HalfCheetah-v5"), ("sac", "HalfCheetah-v5"),
         ("mpo", "HalfCheetah-v5"), ("dqn", "CartPole-v1")]


def _ready(name: str, env_id: str):
    spec = env_spec(env_id)
    overrides = {} if name == "ppo" else {"start_steps": 0, "learning_starts": 0, "update_every": 1, "gradient_steps": 1}
    algo = agents.make(name, spec, overrides, total_steps=1_000_000, seed=0)
    generator = torch.Generator().manual_seed(0)
    steps = 2048 if name == "ppo" else 10_000
    for _ in range(steps):
        obs = torch.randn(1, *spec.observation_shape, generator=generator)
        algo.observe(
            Transitions(obs, algo.act(obs), torch.randn(1, generator=generator), torch.randn(1, *spec.observation_shape, generator=generator),
                        torch.zeros(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool))
        )
        if name == "ppo" and algo.ready_to_update():
            break
    return algo


@pytest.mark.parametrize("name,env_id", CASES, ids=[c[0] for c in CASES])
def test_update(benchmark, name, env_id):
    algo = _ready(name, env_id)
    benchmark.group = "one update (published default sizes)"
    if name == "ppo":
        state = algo.state_dict()

        def setup():
            algo.load_state_dict(state)  # rerun the same update on the same rollout
            algo.storage.step = algo.storage.num_steps

        benchmark.pedantic(algo.update, setup=setup, rounds=3, iterations=1)
    else:
        def one_step():
            algo._steps_since_update = 1
            return algo.update()

        benchmark(one_step)
