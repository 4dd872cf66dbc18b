"""Synchronous collection by several workers (issue 29, in progress): C collectors of k envs
train exactly as one process with C*k envs."""

from __future__ import annotations

import pytest
import torch
from test_seeds import parameters, transitions

import agents
from agents.api import ConfigError
from agents.envs import env_spec, make_vector_env
from benchmark.config import Budget, RunSpec
from benchmark.training.collectors import Collector, RayCollector, observe_rollout
from benchmark.training.control import seed_everything

SETTINGS = {
    "ppo": ("CartPole-v1", {"hidden_sizes": [32, 32], "num_steps": 16, "num_envs": 4, "num_minibatches": 2, "num_epochs": 2}),
    "a2c-box": ("Pendulum-v1", {"hidden_sizes": [32], "num_steps": 8, "num_envs": 4}),
    "trpo": ("CartPole-v1", {"hidden_sizes": [32], "num_steps": 16, "num_envs": 4, "value_epochs": 2, "value_num_minibatches": 2}),
}
ROLLOUTS = 4


def spec_of(case: str) -> RunSpec:
    env_id, overrides = SETTINGS[case]
    overrides = {**overrides, "normalize_observations": False, "normalize_rewards": False}  # not distributed yet
    algo = case.split("-")[0]
    return RunSpec("t", algo, env_id, 3, agents.resolve_config(algo, overrides).to_dict(), Budget(10_000, 10_000, 2), device="cpu")


def learner_of(spec: RunSpec):
    seed_everything(spec.seed)
    return agents.make(
        spec.algo, env_spec(spec.env_id), agents.resolve_config(spec.algo, spec.hyperparameters), total_steps=spec.budget.total_steps, seed=spec.seed
    )


def one_process(spec: RunSpec) -> list[list[torch.Tensor]]:
    """The run as one process steps it (C*k envs): parameters after each update."""
    algo = learner_of(spec)
    config = algo.config
    envs = make_vector_env(spec.env_id, config.num_envs)
    obs = torch.as_tensor(envs.reset(seed=spec.seed)[0], dtype=torch.float32)
    history = []
    while len(history) < ROLLOUTS:
        acted = algo.behavior_act(obs)
        step = envs.step(acted.env_actions)
        algo.observe(transitions(obs, acted, step))
        obs = torch.as_tensor(step[0], dtype=torch.float32)
        if algo.ready_to_update():
            algo.update()
            history.append(parameters(algo))
    envs.close()
    return history


def with_collectors(spec: RunSpec, collectors: list) -> list[list[torch.Tensor]]:
    algo = learner_of(spec)
    history = []
    for _ in range(ROLLOUTS):
        weights, state = algo.get_weights(), algo.generator.get_state()
        observe_rollout(algo, [collector.collect(weights, state, algo.config.num_steps) for collector in collectors])
        assert algo.ready_to_update()
        algo.update()
        history.append(parameters(algo))
    return history


@pytest.mark.parametrize("case", sorted(SETTINGS))
@pytest.mark.parametrize("count", [2, 4])
def test_c_collectors_of_k_envs_train_exactly_as_one_process_with_c_times_k(case, count):
    spec = spec_of(case)
    collectors = [Collector(spec, index, count) for index in range(count)]
    try:
        distributed = with_collectors(spec, collectors)
    finally:
        for collector in collectors:
            collector.close()
    for update, (theirs, ours) in enumerate(zip(one_process(spec), distributed, strict=True)):
        for mine, reference in zip(ours, theirs, strict=True):
            assert torch.equal(mine, reference), (case, count, update)


def test_collectors_as_ray_actors_give_the_same_updates():
    ray = pytest.importorskip("ray")
    spec = spec_of("ppo")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    try:
        distributed = with_collectors(spec, [RayCollector(spec, index, 2) for index in range(2)])
    finally:
        ray.shutdown()
    for theirs, ours in zip(one_process(spec), distributed, strict=True):
        assert all(torch.equal(mine, reference) for mine, reference in zip(ours, theirs, strict=True))


def test_what_collection_cannot_split_is_refused():
    spec = spec_of("ppo")
    with pytest.raises(ConfigError, match="num_envs 4 must split evenly over 3 collectors"):
        Collector(spec, 0, 3)
    with pytest.raises(ConfigError, match="at least one"):
        Collector(spec, 0, 0)
    recurrent = RunSpec(
        "t",
        "ppo",
        "CartPole-v1",
        0,
        agents.resolve_config("ppo", {"recurrent": "gru", "normalize_observations": False, "normalize_rewards": False}).to_dict(),
        Budget(100, 100, 1),
    )
    with pytest.raises(ConfigError, match="recurrent policies"):
        Collector(recurrent, 0, 1)
    normalized = RunSpec("t", "ppo", "CartPole-v1", 0, agents.resolve_config("ppo", {"normalize_observations": True}).to_dict(), Budget(100, 100, 1))
    with pytest.raises(ConfigError, match="does not normalize observations or rewards yet"):
        Collector(normalized, 0, 1)


def test_a_run_trained_by_collectors_evaluates_as_the_run_in_one_process():
    """The learner's loop over two collectors: evaluations (every two rollouts) and the final
    one equal ``loop.run`` of the same spec with its four envs in one process."""
    from benchmark.training import loop
    from benchmark.training.collectors import train_with_collectors

    spec = spec_of("ppo")
    rollout = spec.hyperparameters["num_steps"] * spec.hyperparameters["num_envs"]
    spec = RunSpec(spec.suite, spec.algo, spec.env_id, spec.seed, spec.hyperparameters, Budget(6 * rollout, 2 * rollout, 3), device="cpu")
    collectors = [Collector(spec, index, 2) for index in range(2)]
    try:
        distributed = train_with_collectors(spec, collectors)
    finally:
        for collector in collectors:
            collector.close()
    alone = loop.run(spec)
    assert [e.step for e in distributed.evaluations] == [e.step for e in alone.evaluations] == [2 * rollout, 4 * rollout, 6 * rollout]
    assert [e.returns for e in distributed.evaluations] == [e.returns for e in alone.evaluations]
    # the training episodes that ended between evaluations, as one process counts them
    assert [(e.train_return_mean, e.train_episodes) for e in distributed.evaluations] == [(e.train_return_mean, e.train_episodes) for e in alone.evaluations]
    assert distributed.evaluations[-1].train_episodes > 0
