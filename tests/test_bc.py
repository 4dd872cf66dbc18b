"""Behavioral cloning: from a policy checkpoint trained by this suite (acting through the
normal collector) and from a dataset on disk; loss and learner checks; bad experts."""

import numpy as np
import pytest
import torch
from test_cli import run_cli

import agents
from agents.api import ConfigError
from agents.envs import env_spec, make_vector_env
from benchmark.config import Budget, RunSpec
from benchmark.training import loop as training_loop
from benchmark.training.evaluate import EVAL_SEED_OFFSET
from benchmark.training.results import NullTracker


def pendulum_expert(obs: np.ndarray) -> np.ndarray:
    """Energy pumping until near the top, then a PD hold: about -145 per episode on Pendulum-v1.

    The dynamics are theta'' = 15 sin(theta) + 3 u (g = 10, l = 1, m = 1), so the energy
    0.5 theta'^2 + 15 cos(theta) changes at the rate 3 u theta' and equals 15 upright at rest.
    """
    cos, sin, velocity = obs[..., 0], obs[..., 1], obs[..., 2]
    angle = np.arctan2(sin, cos)
    energy = 0.5 * velocity**2 + 15.0 * cos
    pump = np.clip(0.5 * (15.0 - energy) * np.sign(velocity + 1e-6), -2.0, 2.0)
    hold = np.clip(-(12.0 * angle + 2.5 * velocity), -2.0, 2.0)
    return np.where(cos > 0.85, hold, pump)[..., None].astype(np.float32)


def scripted_dataset(path, episodes: int, seed: int = 0):
    """Pendulum transitions of the scripted expert, as an npz dataset."""
    envs = make_vector_env("Pendulum-v1", episodes)
    obs, _ = envs.reset(seed=seed)
    observations, actions = [], []
    for _ in range(200):
        action = pendulum_expert(obs)
        observations.append(obs)
        actions.append(action)
        obs, *_ = envs.step(action)
    np.savez(path, observations=np.concatenate(observations), actions=np.concatenate(actions))
    return path


def expert_return(env_id, act, seed, episodes=10) -> float:
    """The expert's mean return on the evaluation episodes a run of ``seed`` is scored on."""
    envs = make_vector_env(env_id, episodes)
    obs, _ = envs.reset(seed=seed + EVAL_SEED_OFFSET)
    returns, done = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    while not done.all():
        obs, rewards, terminated, truncated, _ = envs.step(act(obs))
        returns[~done] += rewards[~done]
        done |= terminated | truncated
    return float(returns.mean())


def spec(env_id, hyperparameters, total_steps, eval_every=None, seed=0):
    resolved = agents.resolve_config("bc", hyperparameters).to_dict()
    return RunSpec("t", "bc", env_id, seed, resolved, Budget(total_steps, eval_every or total_steps, 10), device="cpu")


def within_ten_percent(score: float, expert: float) -> bool:
    """At least 90% of the expert's return: for negative returns, at most 10% worse."""
    return score >= expert - 0.1 * abs(expert)


@pytest.mark.learning
def test_bc_clones_a_ppo_cartpole_expert_trained_by_this_suite(tmp_path):
    """The expert is a checkpoint of a PPO run (the classic suite's CartPole settings); BC's data
    comes from it acting in the training envs, and the cloned policy scores >= 90% of it."""
    ppo = agents.resolve_config(
        "ppo", {"num_envs": 8, "num_steps": 32, "num_minibatches": 1, "num_epochs": 10, "learning_rate": 1e-3, "gamma": 0.98, "gae_lambda": 0.8}
    )
    expert_spec = RunSpec("t", "ppo", "CartPole-v1", 0, ppo.to_dict(), Budget(60_000, 60_000, 10), device="cpu")
    expert_run = training_loop.run(expert_spec, checkpoint_dir=tmp_path)
    expert_score = expert_run.evaluations[-1].mean
    assert expert_score >= 400, f"the PPO expert only reached {expert_score}"

    cloning = spec("CartPole-v1", {"expert": expert_run.checkpoint, "num_envs": 4, "learning_rate": 5e-3}, total_steps=20_000, eval_every=5_000)
    result = training_loop.run(cloning)
    print(f"PPO expert {expert_score:.1f}; BC {[round(e.mean, 1) for e in result.evaluations]}")
    assert within_ten_percent(result.evaluations[-1].mean, expert_score)


@pytest.mark.learning
@pytest.mark.parametrize("policy,loss", [("stochastic", "log_prob"), ("deterministic", "mse")])
def test_bc_clones_a_scripted_pendulum_expert_from_a_dataset(tmp_path, policy, loss):
    dataset = scripted_dataset(tmp_path / "pendulum.npz", episodes=100)  # 20,000 transitions
    cloning = spec(
        "Pendulum-v1",
        {"expert": str(dataset), "policy": policy, "loss": loss, "batch_size": 1000, "minibatches_per_epoch": 8, "learning_rate": 3e-3},
        total_steps=1000 * 300,  # 300 epochs of 1000 samples drawn from the dataset
    )
    result = training_loop.run(cloning)
    expert = expert_return("Pendulum-v1", pendulum_expert, seed=0)
    print(f"scripted expert {expert:.1f}; BC ({policy}, {loss}) {result.evaluations[-1].mean:.1f}")
    assert within_ten_percent(result.evaluations[-1].mean, expert)


def test_a_dataset_learner_takes_no_env_steps_and_counts_samples(tmp_path):
    dataset = scripted_dataset(tmp_path / "d.npz", episodes=2)
    tracker = NullTracker()
    result = training_loop.run(spec("Pendulum-v1", {"expert": str(dataset), "batch_size": 100, "minibatches_per_epoch": 4}, 500, 200), tracker)
    assert [e.step for e in result.evaluations] == [200, 400, 500]
    assert not [m for m in tracker.metrics if m[0] == "train/episode_return"]  # no training episodes ran
    losses = [value for name, value, _ in tracker.metrics if name == "train/loss"]
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_a_minari_dataset_is_read_as_its_transitions(tmp_path, monkeypatch):
    """Observations without each episode's last one, paired with the actions taken there."""
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    from agents.experts import load_dataset

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    env, buffers = gym.make("Pendulum-v1"), []
    for episode in range(3):
        obs, _ = env.reset(seed=episode)
        observations, actions, rewards = [obs], [], []
        for _ in range(200):
            action = pendulum_expert(obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs), actions.append(action), rewards.append(reward)
        buffers.append(
            EpisodeBuffer(
                id=episode,
                observations=np.array(observations),
                actions=np.array(actions),
                rewards=np.array(rewards),
                terminations=np.zeros(200, bool),
                truncations=np.eye(200, dtype=bool)[-1],
                infos={},
            )
        )
    minari.create_dataset_from_buffers(
        "reprorl/pendulum-scripted-v0",
        buffers,
        env="Pendulum-v1",
        eval_env="Pendulum-v1",
        algorithm_name="scripted",
        author="reprorl",
        author_email="tests@reprorl",
        code_permalink="tests/test_bc.py",
        description="energy pumping + PD",
        data_format="arrow",
    )
    observations, actions = load_dataset("minari:reprorl/pendulum-scripted-v0", env_spec("Pendulum-v1"))
    assert observations.shape == (600, 3) and actions.shape == (600, 1)
    np.testing.assert_allclose(observations[200:400], buffers[1].observations[:-1], rtol=1e-6)
    np.testing.assert_allclose(actions, pendulum_expert(observations), rtol=1e-5, atol=1e-6)
    result = training_loop.run(spec("Pendulum-v1", {"expert": "minari:reprorl/pendulum-scripted-v0", "batch_size": 100}, 200, 200))
    assert np.isfinite(result.evaluations[-1].mean)


def test_mse_recovers_a_linear_expert(tmp_path):
    """A deterministic learner with no hidden layer regresses a linear expert exactly."""
    spec_ = env_spec("Pendulum-v1")
    generator = torch.Generator().manual_seed(0)
    observations = torch.randn(512, 3, generator=generator)
    weights = torch.tensor([[0.5], [-1.0], [0.25]])
    actions = observations @ weights + 0.1
    path = tmp_path / "linear.npz"
    np.savez(path, observations=observations.numpy(), actions=actions.numpy())
    torch.manual_seed(0)
    algo = agents.make(
        "bc",
        spec_,
        {"expert": str(path), "policy": "deterministic", "loss": "mse", "hidden_sizes": [], "batch_size": 512, "learning_rate": 0.05},
        total_steps=1,
    )
    for _ in range(300):
        algo.update()
    torch.testing.assert_close(algo.act(observations, deterministic=True).actions, actions, atol=2e-3, rtol=0)


def test_log_prob_learner_matches_the_expert_action_distribution(tmp_path):
    """A categorical learner fitted by log_prob on a state-independent expert recovers its frequencies."""
    path = tmp_path / "categorical.npz"
    rng = np.random.default_rng(0)
    np.savez(path, observations=np.zeros((4000, 4), np.float32), actions=(rng.random(4000) < 0.25).astype(np.int64))
    torch.manual_seed(0)
    algo = agents.make(
        "bc", env_spec("CartPole-v1"), {"expert": str(path), "batch_size": 4000, "learning_rate": 0.01, "minibatches_per_epoch": 1}, total_steps=1
    )
    for _ in range(300):  # full batches, each redrawn from the dataset with replacement (frequency +- 0.007)
        algo.update()
    probabilities = torch.softmax(algo.network(torch.zeros(1, 4)), dim=-1)
    assert probabilities[0, 1].item() == pytest.approx(0.25, abs=0.02)


@pytest.mark.parametrize(
    "env_id,overrides,message",
    [
        ("Pendulum-v1", {}, "bc needs an expert"),
        ("Pendulum-v1", {"expert": "/nonexistent/final.pt"}, "bc expert '/nonexistent/final.pt' does not exist"),
        ("Pendulum-v1", {"expert": "DATASET", "policy": "deterministic"}, "loss log_prob needs a stochastic learner"),
        ("CartPole-v1", {"expert": "DATASET", "loss": "mse"}, "CartPole-v1 has discrete actions"),
        ("Pendulum-v1", {"expert": "DATASET", "normalize_observations": True}, "bc learns on raw observations"),
        ("CartPole-v1", {"expert": "DATASET"}, "do not fit CartPole-v1"),
        ("Pendulum-v1", {"expert": "minari:no-such-dataset-v0"}, "Minari dataset 'no-such-dataset-v0' is not in the local Minari store"),
        ("Pendulum-v1", {"expert": "CORRUPT"}, "cannot read it as a checkpoint"),
    ],
)
def test_bad_experts_and_settings_are_named(tmp_path, env_id, overrides, message):
    dataset = scripted_dataset(tmp_path / "d.npz", episodes=1)
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
    files = {"DATASET": str(dataset), "CORRUPT": str(tmp_path / "corrupt.pt")}
    overrides = {k: files.get(v, v) if isinstance(v, str) else v for k, v in overrides.items()}
    with pytest.raises(ConfigError, match=message):
        agents.make("bc", env_spec(env_id), overrides, total_steps=1)


def test_an_expert_checkpoint_of_another_env_is_refused(tmp_path):
    ppo = agents.resolve_config("ppo", {"num_steps": 16, "num_minibatches": 1, "num_epochs": 1}).to_dict()
    run = training_loop.run(RunSpec("t", "ppo", "CartPole-v1", 0, ppo, Budget(16, 16, 1), device="cpu"), checkpoint_dir=tmp_path)
    with pytest.raises(ConfigError, match="the expert was trained on CartPole-v1, whose spaces differ from Acrobot-v1's"):
        agents.make("bc", env_spec("Acrobot-v1"), {"expert": run.checkpoint}, total_steps=1)


def test_a_dataset_of_other_shapes_is_refused_when_the_suite_loads(write_suite, tmp_path):
    """Checked from the npz headers before any run starts, not when each seed starts."""
    np.savez(tmp_path / "small.npz", observations=np.zeros((10, 3), np.float32), actions=np.zeros(10, np.int64))
    suite = write_suite(
        f"""
        name: cloning
        seeds: 2
        budget: {{total_steps: 1000, eval_every: 1000}}
        experiments:
          - algo: bc
            envs: [CartPole-v1]
            hyperparameters: {{expert: {tmp_path / "small.npz"}}}
        """
    )
    result = run_cli("run", "--suite", str(suite), "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert "do not fit CartPole-v1" in result.stderr


def test_the_cli_refuses_a_bc_suite_without_its_expert(write_suite, tmp_path):
    suite = write_suite(
        """
        name: cloning
        seeds: 1
        budget: {total_steps: 1000, eval_every: 1000}
        experiments:
          - algo: bc
            envs: [CartPole-v1]
            hyperparameters: {expert: results/checkpoints/missing/final.pt}
        """
    )
    result = run_cli("run", "--suite", str(suite), "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert "bc expert 'results/checkpoints/missing/final.pt' does not exist" in result.stderr
