"""Env spec, seeded vector envs, final observations, normalization statistics."""

import gymnasium as gym
import numpy as np
import pytest

from agents.api import ConfigError
from agents.envs import (
    env_spec,
    finished_episodes,
    freeze_normalization,
    load_normalization_state,
    make_vector_env,
    normalization_state,
    true_next_obs,
)


def test_env_spec_reads_spaces():
    cartpole = env_spec("CartPole-v1")
    assert cartpole.discrete and cartpole.num_actions == 2 and cartpole.observation_shape == (4,)
    pendulum = env_spec("Pendulum-v1")
    assert not pendulum.discrete and pendulum.action_low == (-2.0,) and pendulum.max_episode_steps == 200


def test_unknown_env_names_a_close_match():
    with pytest.raises(ConfigError, match="unknown environment 'Pendulum-v9'.*Pendulum-v1"):
        env_spec("Pendulum-v9")


def test_same_seed_same_observations():
    first, second = make_vector_env("CartPole-v1", 3), make_vector_env("CartPole-v1", 3)
    np.testing.assert_array_equal(first.reset(seed=7)[0], second.reset(seed=7)[0])
    assert not np.array_equal(first.reset(seed=7)[0], first.reset(seed=8)[0])


def test_truncated_episode_exposes_final_observation_and_unscaled_return():
    envs = make_vector_env("Pendulum-v1", 2, normalize_rewards=True)
    plain = gym.make_vec("Pendulum-v1", 2, vectorization_mode="sync")  # same seed and actions, no wrappers
    obs, _ = envs.reset(seed=0)
    plain.reset(seed=0)
    raw_total = np.zeros(2)
    actions = np.zeros((2, 1), dtype=np.float32)
    for step in range(200):
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        raw_total += plain.step(actions)[1]
        if step < 199:
            assert not truncated.any()
    assert truncated.all() and not terminated.any()
    next_obs = true_next_obs(obs, infos)
    assert not np.allclose(next_obs, obs)  # final observations, not the reset ones
    np.testing.assert_allclose(next_obs, np.stack(infos["final_obs"]))
    episodes = finished_episodes(infos)
    np.testing.assert_allclose([r for r, _ in episodes], raw_total, rtol=1e-5)
    assert [length for _, length in episodes] == [200, 200]


def test_normalization_state_round_trip_and_freeze():
    envs = make_vector_env("Pendulum-v1", 2, normalize_observations=True, normalize_rewards=True)
    envs.reset(seed=0)
    for _ in range(50):
        envs.step(envs.action_space.sample())
    state = normalization_state(envs)
    assert set(state) == {"obs_rms", "return_rms"} and state["obs_rms"]["count"] > 50

    other = make_vector_env("Pendulum-v1", 2, normalize_observations=True)
    load_normalization_state(other, state)
    freeze_normalization(other)
    obs, _ = other.reset(seed=1)
    for _ in range(10):
        other.step(other.action_space.sample())
    frozen = normalization_state(other)["obs_rms"]
    np.testing.assert_array_equal(frozen["mean"], state["obs_rms"]["mean"])
    assert frozen["count"] == state["obs_rms"]["count"]


def test_final_observations_are_normalized_like_the_others():
    envs = make_vector_env("Pendulum-v1", 1, normalize_observations=True, clip_observations=5.0)
    envs.reset(seed=0)
    for _ in range(200):
        obs, _, _, truncated, infos = envs.step(np.zeros((1, 1), dtype=np.float32))
    final = true_next_obs(obs, infos)
    assert truncated.all() and np.abs(final).max() <= 5.0
    assert final.dtype == np.float32


def test_cartpole_without_velocities_observes_only_position_and_angle():
    """The memory task: same dynamics as CartPole-v1, the two velocities hidden from the agent."""
    import agents.classic_envs  # noqa: F401 - registers the reprorl/ environments

    hidden, full = gym.make("reprorl/CartPoleNoVel-v1"), gym.make("CartPole-v1")
    assert hidden.observation_space.shape == (2,) and hidden.spec.max_episode_steps == full.spec.max_episode_steps
    observed, _ = hidden.reset(seed=3)
    state, _ = full.reset(seed=3)
    for action in [0, 1, 1, 0, 1, 1, 1]:
        np.testing.assert_array_equal(observed, state[[0, 2]].astype(np.float32))
        observed, *_ = hidden.step(action)
        state, *_ = full.step(action)
    assert abs(state[1]) > 0 and abs(state[3]) > 0  # the velocities it hides are not trivially zero


def test_mujoco_warnings_are_routed_for_mujoco_envs_only(tmp_path):
    """A classic-control env's process never imports MuJoCo; a MuJoCo env's warnings reach
    Python's ``warnings`` (the known-harmless ones dropped: HalfCheetah's XML sets a deprecated attribute), not stderr or a MUJOCO_LOG.TXT in
    the working directory."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    probe = (
        "import sys; from agents.envs import env_spec, make_vector_env; env_spec('CartPole-v1'); make_vector_env('Pendulum-v1', 1); "
        "print('mujoco' in sys.modules); make_vector_env('HalfCheetah-v5', 1).reset(seed=0); print('mujoco' in sys.modules)"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.stdout.split() == ["False", "True"], done.stderr
    assert "settotalmass" not in done.stderr and not (tmp_path / "MUJOCO_LOG.TXT").exists()
