"""Recurrent off-policy agents: stored hidden states, resets at episode ends, burn-in (R2D2)."""

import pytest
import torch

import agents
from agents.algos.seeds import seed_axis
from agents.api import ConfigError, Transitions
from agents.envs import env_spec, make_vector_env, true_next_obs

CONFIG = {
    "recurrent": "gru",
    "recurrent_size": 16,
    "sequence_length": 6,
    "burn_in": 4,
    "batch_size": 32,
    "hidden_sizes": [16],
    "learning_starts": 10_000,
    "buffer_size": 10_000,
}


def collect(name: str, env_id: str, steps: int, **overrides):
    """Run the agent's own policy (no updates) as the training loop does, resets included."""
    torch.manual_seed(0)
    algo = agents.make(name, env_spec(env_id), {**CONFIG, "num_envs": 2, **overrides}, total_steps=100_000, seed=0)
    envs = make_vector_env(env_id, 2)
    obs, _ = envs.reset(seed=0)
    state = None
    for _ in range(steps):
        obs_tensor = torch.as_tensor(obs, dtype=torch.float32)
        acted = algo.act(obs_tensor, state)
        next_obs, rewards, terminated, truncated, infos = envs.step(acted.env_actions)
        algo.observe(
            Transitions(
                obs_tensor,
                acted,
                torch.as_tensor(rewards, dtype=torch.float32),
                torch.as_tensor(true_next_obs(next_obs, infos), dtype=torch.float32),
                torch.as_tensor(terminated),
                torch.as_tensor(truncated),
            )
        )
        state = algo.reset_state(acted.state, torch.as_tensor(terminated | truncated))
        obs = next_obs
    return algo


@pytest.mark.parametrize("name,env_id,kind,steps", [("dqn", "CartPole-v1", "gru", 150), ("sac", "Pendulum-v1", "lstm", 420)])
def test_hidden_state_after_burn_in_equals_running_the_sequence_from_its_start(name, env_id, kind, steps):
    algo = collect(name, env_id, steps, recurrent=kind, start_steps=0)
    batch = algo.buffer.sample(64, torch.Generator().manual_seed(0))
    stored = algo.buffer.stored_hidden(batch)  # what the actor had at each step
    assert batch["resets"][1:].any()  # episodes end inside some sequences
    burn_in = algo.config.burn_in
    with torch.no_grad():
        _, states = algo.encoder.unroll(batch["obs"][:burn_in], batch["initial_hidden"], batch["resets"][:burn_in])
    # the state entering step burn_in (zeroed if a new episode starts there) is the one the actor had
    entering = torch.where(batch["resets"][burn_in][:, None], torch.zeros_like(states[-1]), states[-1])
    torch.testing.assert_close(entering, stored[burn_in])
    # and every stored state along the sequence is reproduced step by step
    with torch.no_grad():
        _, all_states = algo.encoder.unroll(batch["obs"], batch["initial_hidden"], batch["resets"])
    for t in range(1, batch["obs"].shape[0]):
        expected = torch.where(batch["resets"][t][:, None], torch.zeros_like(all_states[t - 1]), all_states[t - 1])
        torch.testing.assert_close(expected, stored[t])


def test_reset_state_zeroes_only_the_envs_whose_episode_ended():
    algo = agents.make("dqn", env_spec("CartPole-v1"), {**CONFIG, "num_envs": 3}, total_steps=1000)
    acted = algo.act(torch.randn(3, 4))
    assert acted.state.shape == (3, 16) and torch.equal(acted.extras["hidden"], torch.zeros(3, 16))
    state = algo.reset_state(acted.state, torch.tensor([False, True, False]))
    assert torch.equal(state[1], torch.zeros(16)) and torch.equal(state[[0, 2]], acted.state[[0, 2]])
    assert not torch.equal(algo.act(torch.randn(3, 4), state).extras["hidden"], torch.zeros(3, 16))


def test_encoded_batch_covers_the_steps_after_burn_in():
    algo = collect("dqn", "CartPole-v1", 60)
    batch = algo.buffer.sample(8, torch.Generator().manual_seed(0))
    encoded = algo.encode(*algo.seed_encoders(), seed_axis(batch))  # one seed
    steps = algo.config.sequence_length
    assert encoded.features.shape == (1, steps * 8, 16) and encoded.features.requires_grad
    torch.testing.assert_close(encoded.rewards[0], batch.rewards[algo.config.burn_in :].reshape(-1))
    assert not encoded.target_next_features.requires_grad


@pytest.mark.parametrize(
    "name,bad", [("ddpg", {"recurrent": "gru"}), ("dqn", {"recurrent": "gru", "prioritized": True}), ("sac", {"recurrent": "lstm", "n_step": 3})]
)
def test_unsupported_recurrent_combinations_are_refused(name, bad):
    env_id = "CartPole-v1" if name == "dqn" else "Pendulum-v1"
    with pytest.raises(ConfigError, match="recurrent"):
        agents.make(name, env_spec(env_id), {**bad}, total_steps=1000)
