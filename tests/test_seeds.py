"""N seeds trained as one batched model: exactly the N runs they stand for."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from test_meta import SMALL as SMALL_META

import agents
from agents.algos.seeds import StackedOptimizer, clip_per_seed
from agents.api import Acted, ConfigError, Transitions
from agents.envs import env_spec, make_vector_env, true_next_obs
from agents.nets import mlp
from agents.nets.stacked import StackedMLP
from agents.optim import adam, clip_gradients

ROOT = Path(__file__).resolve().parent.parent
SEEDS = (0, 1, 2)


def build(algo: str, env_id: str, seed: int, overrides: dict, total_steps: int):
    """An algorithm as ``benchmark.training.loop.run`` builds it for ``seed``."""
    torch.manual_seed(seed)
    config = agents.resolve_config(algo, overrides)
    return agents.make(algo, env_spec(env_id), config, total_steps=total_steps, seed=seed), config


def transitions(obs, acted: Acted, step) -> Transitions:
    next_obs, rewards, terminated, truncated, infos = step
    final = true_next_obs(next_obs, infos)
    return Transitions(
        obs=obs,
        acted=acted,
        rewards=torch.as_tensor(rewards, dtype=torch.float32),
        next_obs=torch.as_tensor(final, dtype=torch.float32),
        terminated=torch.as_tensor(terminated),
        truncated=torch.as_tensor(truncated),
    )


def parameters(algo) -> list[torch.Tensor]:
    return [tensor.detach().clone() for module in algo.modules().values() for tensor in module.state_dict().values()]


def train(algo: str, env_id: str, overrides: dict, steps: int, batched: bool):
    """Collect and update for ``steps`` vector-env steps; per update, each seed's logs and
    parameters."""
    total = steps * overrides.get("num_envs", 1)
    members, configs = zip(*(build(algo, env_id, seed, overrides, total) for seed in SEEDS))
    config = configs[0]
    envs = [
        make_vector_env(
            env_id, config.num_envs, normalize_observations=config.normalize_observations, normalize_rewards=config.normalize_rewards, gamma=config.gamma
        )
        for _ in SEEDS
    ]
    obs = [torch.as_tensor(env.reset(seed=seed)[0], dtype=torch.float32) for env, seed in zip(envs, SEEDS)]
    batch = type(members[0]).seed_batch(members) if batched else None
    history: list[tuple[list[dict], list[list[torch.Tensor]]]] = []
    states: list = [None] * len(SEEDS)
    for _ in range(steps):
        if not members[0].collects_experience:  # cloning from a dataset: updates only
            logs = batch.update() if batch else [member.update() for member in members]
            history.append((logs, [parameters(member) for member in members]))
            continue
        acted = batch.act(obs, states) if batch else [member.behavior_act(o, state) for member, o, state in zip(members, obs, states)]
        stepped = [env.step(seed_acted.env_actions) for env, seed_acted in zip(envs, acted)]
        states = [  # a recurrent policy's next state, fresh where an episode ended
            None if a.state is None else member.reset_state(a.state, torch.as_tensor(s[2] | s[3])) for member, a, s in zip(members, acted, stepped)
        ]
        seed_transitions = [transitions(o, a, s) for o, a, s in zip(obs, acted, stepped)]
        if batch:
            batch.observe(seed_transitions)
        else:
            for member, member_transitions in zip(members, seed_transitions):
                member.observe(member_transitions)
        obs = [torch.as_tensor(s[0], dtype=torch.float32) for s in stepped]
        ready = batch.ready_to_update() if batch else members[0].ready_to_update()
        if ready:
            logs = batch.update() if batch else [member.update() for member in members]
            history.append((logs, [parameters(member) for member in members]))
    for env in envs:
        env.close()
    if batch:
        batch.sync_members()
    return history, members


CASES = {
    "sac": ("Pendulum-v1", {"hidden_sizes": [32, 32], "batch_size": 16, "start_steps": 20, "learning_starts": 20}),
    "sac-discrete": ("CartPole-v1", {"hidden_sizes": [32, 32], "batch_size": 16, "start_steps": 20, "learning_starts": 20, "num_critics": 3}),
    "td3": ("Pendulum-v1", {"hidden_sizes": [32, 32], "batch_size": 16, "start_steps": 20, "learning_starts": 20, "num_envs": 2}),
    "ddpg": ("Pendulum-v1", {"hidden_sizes": [32, 32], "batch_size": 16, "learning_starts": 20, "critic_weight_decay": 0.01}),
    "mpo": (
        "Pendulum-v1",
        {"hidden_sizes": [32, 32], "batch_size": 16, "learning_starts": 20, "target_update_every": 5, "num_action_samples": 4, "max_grad_norm": 1.0},
    ),
    "mpo-one-constraint": (
        "Pendulum-v1",
        {"hidden_sizes": [32, 32], "batch_size": 16, "learning_starts": 20, "num_action_samples": 3, "per_dim_constraints": False, "num_envs": 2},
    ),
    "dqn": (
        "CartPole-v1",
        {
            "hidden_sizes": [32, 32],
            "batch_size": 16,
            "learning_starts": 20,
            "target_update_every": 5,
            "update_every": 2,
            "exploration_fraction": 0.5,
            "max_grad_norm": 0.5,
            "prioritized": True,
            "n_step": 3,
        },
    ),
    "ppo": ("CartPole-v1", {"hidden_sizes": [32, 32], "num_steps": 32, "num_envs": 2, "num_minibatches": 4, "num_epochs": 2}),
    "ppo-box": (
        "Pendulum-v1",
        {"hidden_sizes": [32, 32], "num_steps": 32, "num_envs": 2, "num_minibatches": 4, "num_epochs": 2, "shared_network": True, "anneal_clip_range": True},
    ),
    # newly batched by the one on-policy loss: RMSprop, split optimizers and the value fit,
    # REINFORCE's per-seed counted steps, PPO-KL's per-seed penalty coefficient
    "a2c": ("CartPole-v1", {"hidden_sizes": [32, 32], "num_steps": 8, "num_envs": 2}),
    "a2c-box": ("Pendulum-v1", {"hidden_sizes": [32, 32], "num_steps": 8, "num_envs": 2, "normalize_observations": True}),
    "vpg": ("Pendulum-v1", {"hidden_sizes": [32, 32], "num_steps": 32, "num_envs": 2, "value_epochs": 2, "value_num_minibatches": 2}),
    "reinforce": ("CartPole-v1", {"hidden_sizes": [32, 32], "num_steps": 32, "num_envs": 2}),
    "ppo_kl": ("Pendulum-v1", {"hidden_sizes": [32, 32], "num_steps": 32, "num_envs": 2, "num_minibatches": 4, "num_epochs": 2, "kl_target": 0.001}),
    "surrogate_pg": ("CartPole-v1", {"hidden_sizes": [32, 32], "num_steps": 32, "num_envs": 2, "num_minibatches": 2, "num_epochs": 2}),
    # each seed its own conjugate gradient and line search (Discrete and Box, observations normalized)
    "trpo": ("CartPole-v1", {"hidden_sizes": [32, 32], "num_steps": 32, "num_envs": 2, "value_epochs": 2, "value_num_minibatches": 2}),
    "trpo-box": (
        "Pendulum-v1",
        {
            "hidden_sizes": [32, 32],
            "num_steps": 32,
            "num_envs": 2,
            "value_epochs": 2,
            "value_num_minibatches": 2,
            "normalize_observations": True,
            "max_kl": 0.02,
        },
    ),
    # each seed stops its epochs at its own point (a KL target small enough to part them)
    "ppo-target-kl": (
        "CartPole-v1",
        {"hidden_sizes": [32, 32], "num_steps": 32, "num_envs": 2, "num_minibatches": 4, "num_epochs": 6, "target_kl": 0.004, "learning_rate": 3e-3},
    ),
}
EXPERTS = Path(tempfile.gettempdir()) / "reprorl-test-experts"


def expert_dataset(env_id: str) -> str:
    """A random dataset of ``env_id``'s observations and actions for bc to clone (a file, made once)."""
    path = EXPERTS / f"{env_id}.npz"
    if not path.exists():
        EXPERTS.mkdir(exist_ok=True)
        spec, rng = env_spec(env_id), np.random.default_rng(0)
        actions = rng.integers(0, spec.num_actions, 256) if spec.discrete else rng.uniform(-1, 1, (256, *spec.action_shape))
        partial = path.with_name(f"{path.stem}.{os.getpid()}.npz")  # another test process may be writing it too
        np.savez(partial, observations=rng.normal(size=(256, *spec.observation_shape)).astype(np.float32), actions=actions)
        partial.replace(path)
    return str(path)


def expert_checkpoint(env_id: str) -> str:
    """An (untrained) PPO policy of ``env_id`` saved as this suite's checkpoints are: bc's expert."""
    path = EXPERTS / f"ppo-{env_id}.pt"
    if not path.exists():
        EXPERTS.mkdir(exist_ok=True)
        hyperparameters = {"hidden_sizes": [16]}
        policy = agents.make("ppo", env_spec(env_id), hyperparameters, total_steps=1000, seed=7)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
        torch.save({"spec": {"algo": "ppo", "env_id": env_id, "hyperparameters": hyperparameters}, "algorithm": policy.state_dict()}, partial)
        partial.replace(path)
    return str(path)


# behavioral cloning: from a dataset (updates only) or from an expert acting in each seed's envs;
# each optimizer BC offers, both losses, Gaussian and categorical policies
CASES["bc-dataset"] = ("Pendulum-v1", {"hidden_sizes": [32, 32], "batch_size": 64, "minibatches_per_epoch": 4, "expert": "dataset"})
CASES["bc-dataset-mse-rmsprop"] = (
    "Pendulum-v1",
    {"hidden_sizes": [32], "batch_size": 64, "minibatches_per_epoch": 3, "loss": "mse", "policy": "deterministic", "optimizer": "rmsprop", "expert": "dataset"},
)
CASES["bc-expert-sgd"] = (
    "CartPole-v1",
    {"hidden_sizes": [32], "batch_size": 16, "minibatches_per_epoch": 4, "num_envs": 2, "optimizer": "sgd", "learning_rate": 0.05, "expert": "checkpoint"},
)


def resolve(case: str) -> tuple[str, str, dict]:
    """A case's algorithm, env and settings, with bc's expert made."""
    algo = case.split("-")[0]
    env_id, overrides = CASES[case]
    if algo == "bc":
        overrides = {**overrides, "expert": (expert_dataset if overrides["expert"] == "dataset" else expert_checkpoint)(env_id)}
    return algo, env_id, overrides


# recurrent policies: each seed's sequences unrolled from its own states by stacked cells
CASES["ppo-gru"] = (
    "CartPole-v1",
    {
        "hidden_sizes": [32],
        "num_steps": 32,
        "num_envs": 2,
        "num_minibatches": 2,
        "num_epochs": 2,
        "recurrent": "gru",
        "recurrent_size": 16,
        "sequence_length": 8,
    },
)
CASES["ppo-lstm-shared-box"] = (
    "Pendulum-v1",
    {
        "hidden_sizes": [32],
        "num_steps": 32,
        "num_envs": 2,
        "num_minibatches": 2,
        "recurrent": "lstm",
        "recurrent_size": 16,
        "sequence_length": 8,
        "shared_network": True,
    },
)
CASES["dqn-gru"] = (
    "CartPole-v1",
    {
        "hidden_sizes": [32],
        "batch_size": 4,
        "learning_starts": 20,
        "target_update_every": 5,
        "recurrent": "gru",
        "recurrent_size": 8,
        "sequence_length": 4,
        "burn_in": 2,
        "obs_extractor_sizes": [8],
    },
)
CASES["sac-lstm"] = (
    "Pendulum-v1",
    {
        "hidden_sizes": [32],
        "batch_size": 4,
        "start_steps": 20,
        "learning_starts": 20,
        "recurrent": "lstm",
        "recurrent_size": 8,
        "sequence_length": 4,
        "burn_in": 2,
    },
)
GRU_WITH_VALUE_FIT = {
    "hidden_sizes": [32],
    "num_steps": 32,
    "num_envs": 2,
    "value_epochs": 2,
    "value_num_minibatches": 2,
    "recurrent": "gru",
    "recurrent_size": 16,
    "sequence_length": 8,
}
CASES["vpg-gru-box"] = ("Pendulum-v1", GRU_WITH_VALUE_FIT)
CASES["a2c-lstm"] = ("CartPole-v1", {"hidden_sizes": [32], "num_steps": 8, "num_envs": 2, "recurrent": "lstm", "recurrent_size": 16})
CASES["trpo-gru-box"] = ("Pendulum-v1", GRU_WITH_VALUE_FIT)

ON_POLICY = ("ppo", "ppo_kl", "surrogate_pg", "a2c", "vpg", "reinforce", "trpo")


@pytest.mark.parametrize("case", sorted(CASES))
def test_first_updates_of_a_batch_match_separate_runs(case):
    """Same data, same losses, same parameters after each update, for three seeds."""
    algo, env_id, overrides = resolve(case)
    steps = 6 * 64 if algo in ON_POLICY else 60
    separate, _ = train(algo, env_id, overrides, steps, batched=False)
    batched, members = train(algo, env_id, overrides, steps, batched=True)
    assert len(separate) == len(batched) >= 5
    for update, ((separate_logs, separate_parameters), (batched_logs, batched_parameters)) in enumerate(zip(separate, batched)):
        if algo == "trpo" and update >= 3:
            break
        # TRPO's conjugate gradient amplifies the last-bit differences of batched matrix products
        # by the Fisher's condition number: exact to 1e-4 at the first update, then to 1e-3
        rtol, atol = (1e-3, 1e-4) if algo == "trpo" and update > 0 else (1e-4, 1e-5)
        for seed in range(len(SEEDS)):
            assert separate_logs[seed].keys() == batched_logs[seed].keys()
            for key, value in separate_logs[seed].items():
                assert math.isclose(batched_logs[seed][key], value, rel_tol=rtol, abs_tol=atol), (seed, key)
            if algo == "trpo":  # every seed's line search took the step its run alone took
                assert batched_logs[seed]["line_search_fraction"] == separate_logs[seed]["line_search_fraction"]
            for mine, theirs in zip(batched_parameters[seed], separate_parameters[seed], strict=True):
                torch.testing.assert_close(mine, theirs, rtol=rtol, atol=atol)
    # the seeds really differ: batching did not make them one run
    final = [torch.cat([p.flatten() for p in parameters]) for parameters in batched[-1][1]]
    assert not torch.allclose(final[0], final[1])
    if "target_kl" in overrides:  # and they stopped their epochs at different points
        assert len({float(next(iter(member.optimizers["joint"].state.values()))["step"]) for member in members}) > 1


def test_stacked_mlp_computes_each_copy_and_its_parameters_are_the_copies():
    torch.manual_seed(0)
    copies = [mlp(3, [8, 8], 2) for _ in range(4)]
    inputs = torch.randn(4, 5, 3)
    expected = torch.stack([copy(inputs[k]) for k, copy in enumerate(copies)])
    stacked = StackedMLP(copies)
    torch.testing.assert_close(stacked(inputs), expected)
    with torch.no_grad():  # a write through the stack shows in the copy, and a load into the copy in the stack
        stacked.weights[0][2].add_(1.0)
        copies[3].load_state_dict(copies[0].state_dict())
    torch.testing.assert_close(copies[2](inputs[2]), stacked(inputs)[2])
    torch.testing.assert_close(stacked(inputs)[3], copies[0](inputs[3]))
    torch.testing.assert_close(stacked(inputs[::2], every=2), stacked(inputs)[::2])


def test_per_seed_clipping_clips_each_seed_as_alone():
    torch.manual_seed(0)
    scales = torch.tensor([0.01, 1.0, 10.0])
    gradients = [torch.randn(3, 4, 5) * scales[:, None, None], torch.randn(3, 5) * scales[:, None]]
    alone = [[gradient[seed].clone() for gradient in gradients] for seed in range(3)]
    norms = clip_per_seed(gradients, 3, max_norm=1.0)
    for seed in range(3):
        norm = clip_gradients(alone[seed], 1.0)
        torch.testing.assert_close(norms[seed], norm)
        for mine, theirs in zip((gradient[seed] for gradient in gradients), alone[seed]):
            torch.testing.assert_close(mine, theirs)
    assert norms[0] < 1 and norms[2] > 1  # one seed under the limit, one far over: neither touched the other


def _step_stacked_and_alone(masks: list, weight_decay: float = 0.0) -> tuple[StackedOptimizer, list]:
    """Three MLPs stacked under one StackedOptimizer and three copies under their own Adams, both
    stepped on the same inputs (a copy sits out the steps its mask excludes); after export, each
    member's parameters and optimizer state are asserted equal to its copy's. Returns the stacked
    optimizer and the members' optimizers."""
    torch.manual_seed(0)
    copies = [mlp(2, [4], 1) for _ in range(3)]
    optimizers = [adam(copy.parameters(), lr=1e-2, weight_decay=weight_decay) for copy in copies]
    alone = [mlp(2, [4], 1) for _ in range(3)]
    for mine, theirs in zip(alone, copies):
        mine.load_state_dict(theirs.state_dict())
    alone_optimizers = [torch.optim.Adam(copy.parameters(), lr=1e-2, weight_decay=weight_decay) for copy in alone]
    stacked = StackedMLP(copies)
    stacked_optimizer = StackedOptimizer(optimizers, list(stacked.parameters()))
    inputs = torch.randn(3, 6, 2)
    for mask in masks:
        for parameter, gradient in zip(stacked.parameters(), torch.autograd.grad(stacked(inputs).pow(2).sum(), list(stacked.parameters()))):
            parameter.grad = gradient
        stacked_optimizer.step(mask)
        for k, (copy, optimizer) in enumerate(zip(alone, alone_optimizers)):
            if mask is None or mask[k]:
                optimizer.zero_grad()
                copy(inputs[k]).pow(2).sum().backward()
                optimizer.step()
    stacked_optimizer.export()
    for k in range(3):
        for mine, theirs in zip(copies[k].parameters(), alone[k].parameters()):
            torch.testing.assert_close(mine, theirs)
        exported, expected = optimizers[k].state_dict(), alone_optimizers[k].state_dict()
        for index, state in expected["state"].items():
            for key in ("step", "exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(exported["state"][index][key], state[key])
    return stacked_optimizer, [copies, optimizers]


def test_stacked_adam_exports_each_members_state_and_imports_it_back():
    _, (copies, optimizers) = _step_stacked_and_alone([None] * 3)
    # a new stack over the members continues from their moments
    again = StackedOptimizer(optimizers, list(StackedMLP(copies).parameters()))
    for home in again.parameters:
        assert float(again.optimizer.state[home]["step"]) == 3


def test_batching_refuses_what_it_cannot_batch():
    mixed = [build("dqn", "CartPole-v1", 0, {}, 1000)[0], build("dqn", "CartPole-v1", 1, {"learning_rate": 1e-3}, 1000)[0]]
    with pytest.raises(ValueError, match="one configuration"):
        type(mixed[0]).seed_batch(mixed)


def test_a_stacked_adam_steps_only_the_active_seeds_each_with_its_own_count():
    """Seed 1 sits out two steps (a seed whose epochs stopped early): every seed's parameters
    and moments equal those of its own Adam that took only its steps, bias corrections by its
    own count; exported, each member's step count is its own, and a new stack resumes them."""
    parted = torch.tensor([True, False, True])
    stacked_optimizer, (copies, optimizers) = _step_stacked_and_alone([None, parted, parted, None], weight_decay=0.1)
    assert stacked_optimizer.steps.tolist() == [4.0, 2.0, 4.0]
    assert StackedOptimizer(optimizers, list(StackedMLP(copies).parameters())).steps.tolist() == [4.0, 2.0, 4.0]


def _specs(algo: str, env_id: str, overrides: dict, total: int, every: int):
    from benchmark.config import Budget, RunSpec

    config = agents.resolve_config(algo, overrides).to_dict()
    return [RunSpec("t", algo, env_id, seed, config, Budget(total, every, 2), device="cpu") for seed in SEEDS]


@pytest.mark.parametrize("case", ["dqn", "ppo", "a2c", "bc-dataset", "bc-expert-sgd", "dqn-gru", "ppo-gru"])
def test_run_seeds_batched_evaluates_as_the_separate_runs(case):
    """The whole loop (envs, updates, evaluations): a batch of three seeds gives each seed's
    evaluations of its run alone."""
    from benchmark.training import loop as training_loop
    from benchmark.training.results import RunResult

    algo, env_id, overrides = resolve(case)
    specs = _specs(algo, env_id, overrides, 512, 256)
    batched = training_loop.run_seeds([training_loop.SeedJob(spec) for spec in specs])
    for spec, outcome in zip(specs, batched):
        alone = training_loop.run(spec)
        assert isinstance(outcome, RunResult)
        assert [e.step for e in outcome.evaluations] == [e.step for e in alone.evaluations] == [256, 512]
        for mine, theirs in zip(outcome.evaluations, alone.evaluations):
            np.testing.assert_allclose(mine.returns, theirs.returns, rtol=1e-5)


def poison_critic(monkeypatch, seed: int) -> None:
    """From now on, the algorithm built for ``seed`` starts with NaN in its critic's first weight."""
    make = agents.make

    def poisoned(name, spec, config, **kwargs):
        algo = make(name, spec, config, **kwargs)
        if kwargs["seed"] == seed:
            with torch.no_grad():
                next(algo.critic.parameters()).fill_(float("nan"))
        return algo

    monkeypatch.setattr(agents, "make", poisoned)


def test_a_divergent_seed_fails_alone(monkeypatch):
    """NaN injected into seed 1's critic: its run ends with non-finite losses, seeds 0 and 2
    finish with the evaluations of their runs alone."""
    from benchmark.training import loop as training_loop
    from benchmark.training.control import NonFiniteLoss
    from benchmark.training.results import RunResult

    specs = _specs("sac", *CASES["sac"], 200, 100)
    poison_critic(monkeypatch, seed=1)
    outcomes = training_loop.run_seeds([training_loop.SeedJob(spec) for spec in specs])
    monkeypatch.undo()
    assert isinstance(outcomes[1], NonFiniteLoss)
    for seed in (0, 2):
        assert isinstance(outcomes[seed], RunResult)
        alone = training_loop.run(specs[seed])
        np.testing.assert_allclose([e.returns for e in outcomes[seed].evaluations], [e.returns for e in alone.evaluations], rtol=1e-5)
        assert all(math.isfinite(r) for e in outcomes[seed].evaluations for r in e.returns)


def test_run_seeds_refuses_runs_that_differ_beyond_the_seed(monkeypatch):
    from benchmark.config import Budget, RunSpec
    from benchmark.training import loop as training_loop

    specs = _specs("dqn", *CASES["dqn"], 100, 100)
    other = _specs("dqn", "CartPole-v1", {**CASES["dqn"][1], "learning_rate": 1e-3}, 100, 100)
    with pytest.raises(ConfigError, match="differ only by seed"):
        training_loop.run_seeds([training_loop.SeedJob(specs[0]), training_loop.SeedJob(other[1])])
    spec = RunSpec("t", "bc", "CartPole-v1", 0, {"expert": "expert.npz"}, Budget(100, 100, 2))
    assert training_loop.batchable(spec) is None  # every online algorithm batches its seeds
    # an algorithm without a batch (a plug-in may have none) is refused, naming those that have one
    monkeypatch.setattr(agents.algorithm_class("pearl"), "seed_batch", None)
    with pytest.raises(ConfigError, match="cannot train seeds of pearl batched: pearl has no batched training of seeds .it has: a2c, bc, "):
        training_loop.run_seeds([training_loop.SeedJob(spec) for spec in _specs("pearl", "reprorl/HalfCheetahVel-v5", {}, 100, 100)])


# ---------------------------------------------------------------- through the runner, the CLI, tune

TINY_PPO = {"num_envs": 2, "num_steps": 64, "num_minibatches": 2, "num_epochs": 2, "hidden_sizes": [16, 16]}
BATCHED_SUITE = f"""
name: batched
seeds: [0, 1, 2, 3]
seeds_per_process: 3
budget: {{total_steps: 512, eval_every: 256, eval_episodes: 2}}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {TINY_PPO}
"""


def test_the_runner_batches_seeds_of_one_configuration_n_at_a_time(write_suite, monkeypatch):
    from benchmark.config import load_suite
    from benchmark.execution.plan import plan_processes

    monkeypatch.setattr(agents.algorithm_class("pearl"), "seed_batch", None)  # as a plug-in without a batch

    path = write_suite(
        BATCHED_SUITE
        + f"""
  - algo: ppo
    envs: [CartPole-v1, Acrobot-v1]
    seeds: [0, 1]
    grid: {{learning_rate: [1.0e-3, 2.0e-3]}}
    hyperparameters: {TINY_PPO}
  - algo: maml_vpg
    envs: [reprorl/HalfCheetahVel-v5]
    seeds: [0, 1]
  - algo: pearl
    envs: [reprorl/HalfCheetahVel-v5]
    seeds: [0, 1]
  - algo: dqn
    envs: [CartPole-v1]
    seeds: [0, 1]
    seeds_per_process: 1
"""
    )
    groups, notices = plan_processes(load_suite(str(path)).specs)
    described = [[(spec.algo, spec.env_id, spec.hyperparameters.get("learning_rate"), spec.seed) for spec in group] for group in groups]
    ppo = [("ppo", env, rate) for env in ("CartPole-v1", "Acrobot-v1") for rate in (1e-3, 2e-3)]
    assert described == [
        [("ppo", "CartPole-v1", 3e-4, 0), ("ppo", "CartPole-v1", 3e-4, 1), ("ppo", "CartPole-v1", 3e-4, 2)],
        [("ppo", "CartPole-v1", 3e-4, 3)],  # N at a time: the fourth seed alone
        *([(*setting, 0), (*setting, 1)] for setting in ppo),  # each grid point and env its own batch
        [("maml_vpg", "reprorl/HalfCheetahVel-v5", None, 0), ("maml_vpg", "reprorl/HalfCheetahVel-v5", None, 1)],  # meta-learners batch too
        [("pearl", "reprorl/HalfCheetahVel-v5", None, 0)],  # no batch: one seed per process, with a notice
        [("pearl", "reprorl/HalfCheetahVel-v5", None, 1)],
        [("dqn", "CartPole-v1", 1e-4, 0)],  # the experiment's own seeds_per_process: 1
        [("dqn", "CartPole-v1", 1e-4, 1)],
    ]
    assert len(notices) == 1 and notices[0].startswith("pearl on reprorl/HalfCheetahVel-v5: one seed per process (pearl has no batched training of seeds")


def test_a_batched_suite_logs_each_seed_as_its_own_mlflow_run_and_reproduces_it(write_suite, tmp_path):
    """Seeds 0-2 train in one process, seed 3 alone; each seed is a child run with its own run
    key, the evaluations of its run alone (to float tolerance), and reproduces bit for bit."""
    import subprocess

    from conftest import run_cli_in_process
    from mlflow.tracking import MlflowClient

    from benchmark.config import load_suite
    from benchmark.training import loop as training_loop

    path = write_suite(BATCHED_SUITE)
    specs = {spec.seed: spec for spec in load_suite(str(path)).specs}
    results = tmp_path / "results"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return run_cli_in_process(*args, cwd=tmp_path)

    completed = cli("run", "--suite", str(path), "--workers", "2", "--results-dir", str(results))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "4 runs to train in 2 processes" in completed.stdout and "4/4 runs finished" in completed.stdout
    assert completed.stdout.count("3 seeds batched") == 3
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("batched")
    children = {int(r.data.tags["seed"]): r for r in client.search_runs([experiment.experiment_id]) if "run_key" in r.data.tags}
    assert sorted(children) == [0, 1, 2, 3]
    for seed, child in children.items():
        assert child.info.status == "FINISHED" and child.data.tags["run_key"] == specs[seed].run_key
        assert child.data.tags.get("batch_seeds") == ("0 1 2" if seed < 3 else None)
        logged = [m.value for m in sorted(client.get_metric_history(child.info.run_id, "eval/return_mean"), key=lambda m: m.step)]
        alone = training_loop.run(specs[seed])
        np.testing.assert_allclose(logged, [e.mean for e in alone.evaluations], rtol=1e-5)
    reproduced = cli("reproduce", children[1].info.run_id, "--results-dir", str(results))
    assert reproduced.returncode == 0, reproduced.stdout + reproduced.stderr
    assert "trained again in its batch of seeds 0 1 2" in reproduced.stdout and "bit-identical" in reproduced.stdout


def test_a_divergent_seed_fails_alone_in_the_tracking_store(tmp_path, monkeypatch):
    """The runner's worker with three SAC seeds batched, NaN injected into seed 1's critic:
    seed 1's MLflow run is FAILED with its non-finite losses, seeds 0 and 2 are FINISHED."""
    import queue

    from mlflow.tracking import MlflowClient

    from benchmark import tracking
    from benchmark.execution import worker

    poison_critic(monkeypatch, seed=1)
    specs = _specs("sac", *CASES["sac"], 200, 100)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = tracking.experiment_id(uri, "t", tmp_path / "artifacts")
    parent = tracking.start_parent_run(uri, experiment, "parent", {})
    messages = queue.Queue()
    outcomes = worker.train_group(specs, worker.Launch(uri, experiment, parent.run_id, str(tmp_path / "checkpoints")), messages)
    assert [outcome.status for outcome in outcomes] == ["FINISHED", "FAILED", "FINISHED"]
    assert outcomes[1].error.startswith("NonFiniteLoss: non-finite update values")
    client = MlflowClient(uri)
    runs = [client.get_run(outcome.run_id) for outcome in outcomes]
    assert [run.info.status for run in runs] == ["FINISHED", "FAILED", "FINISHED"]
    assert "NonFiniteLoss" in runs[1].data.tags["error"] and all(run.data.tags["batch_seeds"] == "0 1 2" for run in runs)
    for seed in (0, 2):
        assert math.isfinite(runs[seed].data.metrics["final/eval_return_mean"])
        assert (tmp_path / "checkpoints" / specs[seed].run_key / "final.pt").exists()


@pytest.mark.learning
@pytest.mark.extended
def test_ten_batched_seeds_are_not_distinguishable_from_the_separate_runs_of_the_baseline(tmp_path):
    """Ten batched runs (seeds 100-109, five to a process) of the ci suite's PPO on CartPole-v1
    (RL Zoo's tuned setting, 100k steps) checked by `regress` against the committed baseline,
    whose five seeds trained as separate processes: neither a regression nor an improvement,
    the check's verdict both ways. (The baseline was trained on this repository's VM; `make
    regress` compares separate runs on CI's CPU against the same file.)

    `make test-all` runs it (about 3 CPU-minutes): on every change, `make test` checks the same
    path number by number instead, each seed of a batch against its run alone
    (``test_first_updates_of_a_batch_match_separate_runs``,
    ``test_run_seeds_batched_evaluates_as_the_separate_runs``); this test adds that what drift
    a float's last bits bring over 100k steps leaves the results' distribution as it was."""
    import subprocess
    import sys

    baseline = ROOT / "results" / "baselines" / "ci.json"
    (tmp_path / "results").mkdir()
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmark",
            "regress",
            "--suite",
            "ci",
            "--baseline",
            str(baseline),
            "--algos",
            "ppo",
            "--envs",
            "CartPole-v1",
            "--seeds",
            *map(str, range(100, 110)),
            "--workers",
            "2",
            "--seeds-per-process",
            "5",
            "--results-dir",
            str(tmp_path / "results"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "10 runs to train in 2 processes" in checked.stdout
    assert "no regression in 1 configurations" in checked.stdout
    row = next(line for line in checked.stdout.splitlines() if "ppo @ CartPole-v1" in line)
    assert row.rstrip(" │").endswith("ok"), row  # not "improved" either


RESUMED_BATCH = """\
name: resumedbatch
seeds: [0, 1, 2]
seeds_per_process: 3
budget: {total_steps: 6000, eval_every: 1000, eval_episodes: 2}
checkpoint: {every: 1500}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 1, num_steps: 256, num_minibatches: 4, num_epochs: 4}
"""


def test_a_killed_batch_resumes_each_seed_in_its_mlflow_run(write_suite, tmp_path):
    """SIGKILL to a batch of three seeds mid-training; the re-launch resumes the three together
    from their checkpoints, each in its own MLflow run, and every seed ends with the
    evaluations of an uninterrupted batch."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import run_cli_in_process
    from mlflow.tracking import MlflowClient

    from benchmark.config import load_suite
    from benchmark.training import checkpoint
    from benchmark.training import loop as training_loop

    suite = write_suite(RESUMED_BATCH)
    specs = load_suite(str(suite)).specs
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "benchmark", "run", "--suite", str(suite), "--results-dir", str(results)]
    process = subprocess.Popen(argv, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = [results / "checkpoints" / spec.run_key / checkpoint.LATEST for spec in specs]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if all(path.exists() for path in latest) and min(checkpoint.load(path)["loop"]["step"] for path in latest) >= 3000:
                break
            assert process.poll() is None, "the suite ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoints past step 3000")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    steps = {checkpoint.load(path)["loop"]["step"] for path in latest}
    assert len(steps) == 1  # the seeds of a batch checkpoint together
    completed = run_cli_in_process(*argv[3:], cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "3 of 3 runs to train have a checkpoint" in completed.stdout
    assert completed.stdout.count(f"from its checkpoint at env step {steps.pop():,}") == 3
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = [r for r in client.search_runs([client.get_experiment_by_name("resumedbatch").experiment_id]) if "run_key" in r.data.tags]
    assert len(runs) == 3 and all(r.info.status == "FINISHED" and r.data.tags["resume_count"] == "1" for r in runs)
    uninterrupted = training_loop.run_seeds([training_loop.SeedJob(spec) for spec in specs])
    for spec, result in zip(specs, uninterrupted):
        (run,) = [r for r in runs if r.data.tags["run_key"] == spec.run_key]
        logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval/return_mean")}
        assert [logged[e.step] for e in result.evaluations] == [e.mean for e in result.evaluations], spec.seed


def test_a_learning_rate_set_on_the_members_reaches_the_stacked_optimizer():
    """A schedule or ``update_parameter`` changes the members' optimizers; the batch's next
    update steps with that rate (SAC's critic, by its declared ``critic_lr``)."""
    env_id, overrides = CASES["sac"]
    members = [build("sac", env_id, seed, overrides, 1000)[0] for seed in SEEDS]
    batch = type(members[0]).seed_batch(members)
    for member in members:
        member.update_parameter("critic_lr", 1e-6)
        member.steps_since_update = 0
    batch.update()  # no gradient step is due: only the rates are read
    assert batch.optimizers["critic"].lr == 1e-6 and batch.optimizers["actor"].lr == 3e-4


def test_a_hyperparameter_set_on_the_members_reaches_the_batch():
    """``update_parameter`` replaces each member's configuration; the batch reads the members'
    (it kept the one it was built with, so a new tau or batch size did not reach it)."""
    env_id, overrides = CASES["sac"]
    members = [build("sac", env_id, seed, overrides, 1000)[0] for seed in SEEDS]
    batch = type(members[0]).seed_batch(members)
    with torch.no_grad():  # the critics move away from their targets (copies at the start)
        for parameter in batch.networks.critic.parameters():
            parameter.add_(1.0)
    before = [p.detach().clone() for p in batch.networks.critic_target.parameters()]
    for member in members:
        member.update_parameter("tau", 1.0)
    batch.update_targets()  # tau 1: the targets become the critics
    assert batch.config.tau == 1.0
    for target, critic, old in zip(batch.networks.critic_target.parameters(), batch.networks.critic.parameters(), before, strict=True):
        assert torch.equal(target, critic) and not torch.equal(target, old)


# ---------------------------------------------------------------- meta-learners

POINT = "reprorl/PointNav-v0"
META_CASES = {  # test_meta's small settings; PEARL's with a posterior phase, MAML's variants as named
    "pearl": {**SMALL_META["pearl"], "num_steps_posterior": 50, "num_extra_rl_steps_posterior": 50},
    "maml_vpg": SMALL_META["maml_vpg"],
    "maml_ppo": {
        "meta_batch_size": 2,
        "episodes_per_task": 3,
        "num_envs": 3,
        "hidden_sizes": [8],
        "outer_iterations": 2,
        "entropy_method": "regularized",
        "entropy_coef": 0.01,
    },
    "maml_trpo": {"meta_batch_size": 2, "episodes_per_task": 3, "num_envs": 3, "hidden_sizes": [8], "num_grad_updates": 2},
}


def test_every_registered_algorithm_batches_and_has_a_checked_case():
    """The first-updates checks above cover the whole registry: every algorithm has a seed
    batch and at least one case (online: ``CASES``, meta-learners: ``META_CASES``)."""
    from agents.registry import REGISTRY

    assert all(agents.algorithm_class(name).seed_batch is not None for name in REGISTRY)
    online = {case.split("-")[0] for case in CASES}
    assert online | set(META_CASES) == set(REGISTRY), set(REGISTRY) - online - set(META_CASES)


@pytest.mark.parametrize("algo", sorted(META_CASES))
def test_first_epochs_of_a_meta_batch_match_separate_runs(algo):
    """Each seed samples its own tasks, collects through its own task envs with its own draws;
    batched, its logs and parameters after each epoch are those of its run alone."""
    from agents.meta import TaskEnvs

    def members():
        return [build(algo, POINT, seed, META_CASES[algo], 1)[0] for seed in SEEDS]

    alone = members()
    separate = []
    for member, seed in zip(alone, SEEDS):
        envs = TaskEnvs(POINT, member.collection_envs, seed=seed)
        separate.append([(member.train_epoch(envs), parameters(member)) for _ in range(3)])
    batched_members = members()
    batch = type(batched_members[0]).seed_batch(batched_members)
    envs = [TaskEnvs(POINT, batched_members[0].collection_envs, seed=seed) for seed in SEEDS]
    batched = []
    for _ in range(3):
        logs = batch.train_epoch(envs)
        batched.append((logs, [parameters(member) for member in batched_members]))
    for epoch, (logs, seed_parameters) in enumerate(batched):
        for seed in range(len(SEEDS)):
            their_logs, their_parameters = separate[seed][epoch]
            assert logs[seed].keys() == their_logs.keys()
            for key, value in their_logs.items():
                assert math.isclose(logs[seed][key], value, rel_tol=1e-4, abs_tol=1e-5), (epoch, seed, key)
            for mine, theirs in zip(seed_parameters[seed], their_parameters, strict=True):
                torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    final = [torch.cat([p.flatten() for p in seed_parameters]) for seed_parameters in batched[-1][1]]
    assert not torch.allclose(final[0], final[1])  # the seeds really differ


def _meta_specs(algo: str, total: int, every: int):
    from benchmark.config import Budget, RunSpec

    config = agents.resolve_config(algo, META_CASES[algo]).to_dict()
    return [RunSpec("t", algo, POINT, seed, config, Budget(total, every, 2), device="cpu", checkpoint_every=1) for seed in SEEDS]


@pytest.mark.parametrize("algo", ["maml_vpg", "pearl"])
def test_a_batched_meta_run_meta_tests_each_seed_as_its_run_alone(monkeypatch, algo):
    """The whole meta loop: each seed meta-tests at its own env steps (its episodes are its own)
    with the results of its run alone, and leaves the batch at its own budget (seed 1's
    collections count 500 more steps here, as if its episodes were longer)."""
    from agents.meta import TaskEnvs
    from benchmark.training import loop as training_loop
    from benchmark.training.results import RunResult

    collect = TaskEnvs.collect

    def longer(self, *arguments, **options):
        episodes = collect(self, *arguments, **options)
        self.steps += 500 * (self.seed == 1)
        return episodes

    monkeypatch.setattr(TaskEnvs, "collect", longer)
    specs = _meta_specs(algo, 3000, 1200)
    batched = training_loop.run_seeds([training_loop.SeedJob(spec) for spec in specs])
    steps = []
    for spec, outcome in zip(specs, batched):
        alone = training_loop.run(spec)
        assert isinstance(outcome, RunResult)
        assert [e.step for e in outcome.evaluations] == [e.step for e in alone.evaluations]
        for mine, theirs in zip(outcome.evaluations, alone.evaluations):
            np.testing.assert_allclose(mine.returns, theirs.returns, rtol=1e-4)
        steps.append([e.step for e in outcome.evaluations])
    assert len({tuple(s) for s in steps}) > 1  # the seeds' steps differ: each left at its own budget


def test_a_batched_meta_run_resumes_from_its_checkpoints_as_if_never_stopped(tmp_path):
    from benchmark.training import checkpoint
    from benchmark.training import loop as training_loop

    specs = _meta_specs("maml_trpo", 3000, 600)
    whole = training_loop.run_seeds([training_loop.SeedJob(spec) for spec in specs])

    class Stop(Exception):
        pass

    def stop_after_two(evaluation):
        seen.append(evaluation)
        if len(seen) == 2:
            raise Stop

    seen: list = []
    jobs = [training_loop.SeedJob(spec, on_evaluation=stop_after_two if spec.seed == 0 else None) for spec in specs]
    first = training_loop.run_seeds(jobs, checkpoint_dir=tmp_path, stop_together=True)
    assert all(isinstance(outcome, Stop) for outcome in first)
    payloads = [checkpoint.load(tmp_path / spec.run_key / checkpoint.LATEST) for spec in specs]
    assert len({payload["loop"]["epoch"] for payload in payloads}) == 1  # saved together, at one epoch
    resumed = training_loop.run_seeds([training_loop.SeedJob(spec, resume=payload) for spec, payload in zip(specs, payloads)], checkpoint_dir=tmp_path)
    for mine, theirs in zip(resumed, whole):
        assert [e.step for e in mine.evaluations] == [e.step for e in theirs.evaluations]
        np.testing.assert_allclose([e.returns for e in mine.evaluations], [e.returns for e in theirs.evaluations], rtol=1e-5)


@pytest.mark.parametrize("algo", ["maml_ppo", "pearl"])
def test_a_meta_seed_whose_envs_fail_ends_alone(monkeypatch, algo):
    """Seed 1's envs raise in its second epoch: its run ends with that error; seeds 0 and 2
    finish as their runs alone (MAML's redo the epoch without it; PEARL's collect apart from it)."""
    from agents.meta import TaskEnvs
    from benchmark.training import loop as training_loop
    from benchmark.training.results import RunResult

    specs = _meta_specs(algo, 2400, 1200)
    collect = TaskEnvs.collect

    def failing(self, *arguments, **options):
        if self.seed == 1 and self.rounds >= 5:  # MAML: in its second epoch (4 one-round collections an epoch); PEARL: in its first
            raise OSError("simulator crashed")
        return collect(self, *arguments, **options)

    monkeypatch.setattr(TaskEnvs, "collect", failing)
    outcomes = training_loop.run_seeds([training_loop.SeedJob(spec) for spec in specs])
    monkeypatch.undo()
    assert isinstance(outcomes[1], OSError)
    for seed in (0, 2):
        alone = training_loop.run(specs[seed])
        assert isinstance(outcomes[seed], RunResult)
        assert [e.step for e in outcomes[seed].evaluations] == [e.step for e in alone.evaluations]
        np.testing.assert_allclose([e.returns for e in outcomes[seed].evaluations], [e.returns for e in alone.evaluations], rtol=1e-4)


KILLED_META_BATCH = """
name: killedmeta
seeds: [0, 1]
seeds_per_process: 2
budget: {total_steps: 36000, eval_every: 6000, eval_episodes: 2}
checkpoint: {every: 1}
experiments:
  - algo: maml_trpo
    envs: [reprorl/PointNav-v0]
    hyperparameters: {meta_batch_size: 4, episodes_per_task: 5, num_envs: 5, hidden_sizes: [16]}
"""


def test_a_killed_meta_batch_resumes_as_one_batch_from_one_epoch(write_suite, tmp_path):
    """SIGKILL to two batched MAML seeds mid-training: their checkpoints share an epoch (not an
    env step: each seed's episodes are its own), the re-launch resumes them as one batch, and
    each seed ends with the meta-test results of an uninterrupted batch."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import run_cli_in_process
    from mlflow.tracking import MlflowClient

    from benchmark.config import load_suite
    from benchmark.training import checkpoint
    from benchmark.training import loop as training_loop

    suite = write_suite(KILLED_META_BATCH)
    specs = load_suite(str(suite)).specs
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "benchmark", "run", "--suite", str(suite), "--results-dir", str(results)]
    process = subprocess.Popen(argv, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = [results / "checkpoints" / spec.run_key / checkpoint.LATEST for spec in specs]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if all(path.exists() for path in latest) and min(checkpoint.load(path)["loop"]["epoch"] for path in latest) >= 3:
                break
            assert process.poll() is None, "the suite ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoints past epoch 3")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    loops = [checkpoint.load(path)["loop"] for path in latest]
    assert len({loop["epoch"] for loop in loops}) == 1  # saved together
    completed = run_cli_in_process(*argv[3:], cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "2 of 2 runs to train have a checkpoint" in completed.stdout
    assert completed.stdout.count("2 seeds batched") == 2
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = [r for r in client.search_runs([client.get_experiment_by_name("killedmeta").experiment_id]) if "run_key" in r.data.tags]
    assert len(runs) == 2 and all(r.info.status == "FINISHED" and r.data.tags["resume_count"] == "1" for r in runs)
    uninterrupted = training_loop.run_seeds([training_loop.SeedJob(spec) for spec in specs])
    for spec, result in zip(specs, uninterrupted):
        (run,) = [r for r in runs if r.data.tags["run_key"] == spec.run_key]
        logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval/return_mean")}
        assert [logged[e.step] for e in result.evaluations] == pytest.approx([e.mean for e in result.evaluations], rel=1e-6), spec.seed
