"""The example package's own tests: REDQ's losses against hand-computed cases, its place in
reprorl's registry (entry point, defaults, checks), the PointReach task, and training through
reprorl's command line, alone and with seeds batched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from redq_example import redq as redq_module
from redq_example.envs import PointReach
from redq_example.redq import REDQ, random_subset

import agents
from agents import registry
from agents.envs import env_spec
from agents.errors import ConfigError

POINT_REACH = "redq_example.envs:PointReach-v0"
EXAMPLE = Path(__file__).resolve().parent.parent


def small_redq(**overrides) -> REDQ:
    settings = {"hidden_sizes": [8], "batch_size": 4, "learning_starts": 8, "start_steps": 8, **overrides}
    algo = agents.make("redq", env_spec("Pendulum-v1"), agents.resolve_config("redq", settings), total_steps=100, seed=0)
    assert isinstance(algo, REDQ)
    return algo


def constant_critics(critic: torch.nn.Module, values: list[float]) -> None:
    """Every Q_i(s, a) = values[i]: zero weights, the last layer's bias set."""
    with torch.no_grad():
        for parameter in critic.parameters():
            parameter.zero_()
        for index, q in enumerate(critic.qs):
            list(q.parameters())[-1].fill_(values[index])


def targets_of(algo: REDQ, monkeypatch, steps: int) -> list[torch.Tensor]:
    """The targets y of ``steps`` gradient steps on one batch (spied from the critic loss)."""
    seen: list[torch.Tensor] = []

    def spy(predictions, targets, weights):
        seen.append(targets.detach().clone())
        return ((predictions - targets.unsqueeze(1)) ** 2).mean(dim=-1).sum(dim=-1)

    monkeypatch.setattr(redq_module, "per_seed_weighted_mse", spy)
    for _ in range(steps):
        algo.gradient_step(algo.buffer.sample(algo.config.batch_size, algo.generator))
    return seen


def fill(algo: REDQ, rewards: float = 1.0) -> None:
    """Transitions with reward ``rewards``, none terminal, in the replay."""
    from agents.api import Acted, Transitions

    for _ in range(8):
        obs = torch.zeros(1, 3)
        acted = Acted(actions=torch.zeros(1, 1), env_actions=np.zeros((1, 1), dtype=np.float32))
        algo.observe(Transitions(obs, acted, torch.full((1,), rewards), obs, torch.zeros(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool)))


def test_the_defaults_are_the_papers_and_an_impossible_subset_is_refused():
    config = agents.resolve_config("redq")
    assert (config.num_critics, config.in_target_critics, config.gradient_steps, config.policy_delay) == (10, 2, 20, None)
    assert (config.actor_lr, config.critic_lr, config.batch_size, config.tau, config.gamma) == (3e-4, 3e-4, 256, 0.005, 0.99)
    assert tuple(config.hidden_sizes) == (256, 256) and config.start_steps == 5000
    with pytest.raises(ConfigError, match=r"in_target_critics \(11\) cannot exceed num_critics \(10\)"):
        agents.resolve_config("redq", {"in_target_critics": 11})
    with pytest.raises(ConfigError, match="redq needs continuous"):
        agents.make("redq", env_spec("CartPole-v1"), agents.resolve_config("redq"), total_steps=10)


def test_a_random_subset_is_distinct_and_uniform():
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(10)
    for _ in range(5000):
        chosen = random_subset(torch.randn(3, 10, generator=generator), 2)
        assert chosen.shape == (3, 2) and all(len(set(row.tolist())) == 2 for row in chosen)
        counts += torch.bincount(chosen.flatten(), minlength=10)
    assert torch.allclose(counts / counts.sum(), torch.full((10,), 0.1), atol=0.01)


def test_targets_take_the_minimum_over_m_random_critics(monkeypatch):
    """Target critics at constants c_i and a temperature of ~0: y = r + gamma min_{i in M} c_i;
    with M = N the minimum of all, with M = 1 each c_i in turn."""
    values = [float(v) for v in range(3, 13)]  # c_i = 3, ..., 12
    everything = small_redq(in_target_critics=10, alpha=1e-12)
    constant_critics(everything.critic_target, values)
    fill(everything)
    (target,) = targets_of(everything, monkeypatch, 1)
    assert torch.allclose(target, torch.full_like(target, 1.0 + 0.99 * 3.0))
    one = small_redq(in_target_critics=1, alpha=1e-12, tau=1e-12)
    constant_critics(one.critic_target, values)
    fill(one)
    seen = {round(float(t.flatten()[0]), 4) for t in targets_of(one, monkeypatch, 200)}
    assert seen == {round(1.0 + 0.99 * c, 4) for c in values}  # every critic is drawn


@pytest.mark.parametrize("settings", [{"gradient_steps": 3}, {"gradient_steps": 5, "policy_delay": 3}])
def test_the_actor_and_temperature_step_once_every_policy_delay_steps(settings):
    """By default once every G gradient steps (once per env step); policy_delay sets another rate."""
    algo = small_redq(**settings)
    fill(algo)
    actor_before = [p.clone() for p in algo.actor.parameters()]
    steps = []
    for _ in range(6):
        logs = algo.gradient_step(algo.buffer.sample(4, algo.generator))
        steps.append("actor_loss" in logs)
    assert steps == [False, False, True, False, False, True]
    assert any(not torch.equal(a, b) for a, b in zip(actor_before, algo.actor.parameters()))


def test_the_actor_loss_is_against_the_ensemble_mean():
    """With critics at constants c_i the actor's loss is alpha log pi - mean_i c_i (not the min)."""
    algo = small_redq(alpha=1e-12, policy_delay=1)
    values = [float(v) for v in range(10)]
    constant_critics(algo.critic, values)
    fill(algo)
    logs = algo.gradient_step(algo.buffer.sample(4, algo.generator))
    assert logs["actor_loss"] == pytest.approx(-np.mean(values), abs=1e-6)


def test_the_entry_point_names_it_and_its_search_space_ships():
    registry.plugins.cache_clear()
    assert registry.plugins().get("redq") == "redq_example.redq:REDQ"
    assert agents.algorithm_class("redq") is REDQ
    assert (Path(redq_module.__file__).parent / REDQ.search_space).is_file()


def test_point_reach_follows_its_dynamics_and_gymnasiums_checks():
    check_env(PointReach(), skip_render_check=True)
    env = gym.make(POINT_REACH)
    obs, _ = env.reset(seed=0)
    position, target = obs[:2].astype(float), obs[:2] + obs[4:]
    _, reward, terminated, _, _ = env.step(np.zeros(2, dtype=np.float32))
    assert reward == pytest.approx(-np.linalg.norm(target - position), abs=1e-5) and not terminated
    inner = env.unwrapped
    inner.position, inner.velocity = inner.target.copy(), np.zeros(2)
    _, reward, terminated, _, _ = env.step(np.zeros(2, dtype=np.float32))
    assert terminated and reward == pytest.approx(10.0)
    assert env.spec is not None and env.spec.max_episode_steps == 100
    frame = PointReach(render_mode="rgb_array").render()
    assert frame.shape == (128, 128, 3)


def benchmark(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmark", *arguments], cwd=cwd, capture_output=True, text=True, timeout=900)


def test_reprorl_trains_it_on_the_packages_task_with_seeds_batched(tmp_path):
    """Through reprorl's command line: the entry point's name and the env's import path; two
    seeds batched in one process, each its own run; evaluated afterwards."""
    results = str(tmp_path / "results")
    completed = benchmark(
        "train",
        "--algo",
        "redq",
        "--env",
        POINT_REACH,
        "--steps",
        "400",
        "--seeds",
        "0",
        "1",
        "--seeds-per-process",
        "2",
        "--eval-episodes",
        "2",
        "--set",
        "hidden_sizes=[16]",
        "learning_starts=100",
        "start_steps=100",
        "gradient_steps=2",
        "policy_delay=2",
        "--results-dir",
        results,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "2/2 runs finished" in completed.stdout and "2 seeds batched" in completed.stdout, completed.stdout[-2000:]
    listed = benchmark("list", cwd=tmp_path)
    assert listed.returncode == 0 and "redq" in listed.stdout
