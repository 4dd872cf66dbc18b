"""One update of every algorithm at its published default network and batch sizes.

Continuous-action algorithms on HalfCheetah-v5 (17-dim observations, 6-dim actions); DQN on
CartPole-v1. Off-policy: one gradient step on a batch from a replay buffer holding 10k
random transitions. On-policy algorithms: one full update over their default rollout (PPO and
PPO-KL: 10 epochs of 32 minibatches over 2048 steps; TRPO: CG and line search, then 10 epochs of
16 value minibatches; VPG: one policy step and 80 value steps over 4000; A2C: one step over
16 envs x 5 steps).
"""

from __future__ import annotations

import pytest
import torch

import agents
from agents.algos import OnPolicyAlgorithm
from agents.api import Transitions
from agents.envs import env_spec

CASES = [
    ("ppo", "HalfCheetah-v5"),
    ("ppo_kl", "HalfCheetah-v5"),
    ("trpo", "HalfCheetah-v5"),
    ("vpg", "HalfCheetah-v5"),
    ("a2c", "HalfCheetah-v5"),
    ("ddpg", "HalfCheetah-v5"),
    ("td3", "HalfCheetah-v5"),
    ("sac", "HalfCheetah-v5"),
    ("mpo", "HalfCheetah-v5"),
    ("dqn", "CartPole-v1"),
]


def _ready(name: str, env_id: str):
    spec = env_spec(env_id)
    on_policy = issubclass(agents.algorithm_class(name), OnPolicyAlgorithm)
    overrides = {} if on_policy else {"start_steps": 0, "learning_starts": 0, "update_every": 1, "gradient_steps": 1}
    algo = agents.make(name, spec, overrides, total_steps=1_000_000, seed=0)
    generator = torch.Generator().manual_seed(0)
    n = algo.config.num_envs
    for _ in range(10_000):
        obs = torch.randn(n, *spec.observation_shape, generator=generator)
        algo.observe(
            Transitions(
                obs,
                algo.act(obs),
                torch.randn(n, generator=generator),
                torch.randn(n, *spec.observation_shape, generator=generator),
                torch.zeros(n, dtype=torch.bool),
                torch.zeros(n, dtype=torch.bool),
            )
        )
        if on_policy and algo.ready_to_update():
            break
    return algo


@pytest.mark.parametrize("name,env_id", CASES, ids=[c[0] for c in CASES])
def test_update(benchmark, name, env_id):
    algo = _ready(name, env_id)
    benchmark.group = "one update (published default sizes)"
    if isinstance(algo, OnPolicyAlgorithm):
        state = algo.state_dict()

        def setup():
            algo.load_state_dict(state)  # rerun the same update on the same rollout
            algo.storage.step = algo.storage.num_steps

        benchmark.pedantic(algo.update, setup=setup, rounds=3, iterations=1)
    else:

        def one_step():
            algo.steps_since_update = 1
            return algo.update()

        benchmark(one_step)
