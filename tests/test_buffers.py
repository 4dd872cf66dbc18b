"""Rollout storage with GAE."""

import pytest
import torch

from agents.buffers import RolloutStorage, compute_gae

GAMMA, LAMBDA = 0.9, 0.8


def _rollout_with_truncation_and_termination() -> RolloutStorage:
    """Two envs, three steps. Env 0 is truncated at t=1 (V(final obs) = 2.0); env 1 terminates at t=1."""
    storage = RolloutStorage(num_steps=3, num_envs=2, obs_shape=(1,), action_shape=())
    rewards = [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]
    values = [[0.5, 0.5], [1.0, 0.5], [1.5, 0.5]]
    terminated = [[False, False], [False, True], [False, False]]
    truncated = [[False, False], [True, False], [False, False]]
    for t in range(3):
        truncation_values = torch.tensor([2.0, 99.0]) if any(truncated[t]) else None  # 99 must be ignored
        storage.insert(
            obs=torch.zeros(2, 1),
            actions=torch.zeros(2),
            log_probs=torch.zeros(2),
            values=torch.tensor(values[t]),
            rewards=torch.tensor(rewards[t]),
            terminated=torch.tensor(terminated[t]),
            truncated=torch.tensor(truncated[t]),
            truncation_values=truncation_values,
        )
    storage.compute_returns(last_values=torch.tensor([4.0, 1.0]), gamma=GAMMA, gae_lambda=LAMBDA)
    return storage


def test_gae_matches_hand_computed_case_with_truncation_and_termination():
    storage = _rollout_with_truncation_and_termination()
    # env 0: deltas 1 + .9*1 - .5 = 1.4; 2 + .9*2.0 (truncated: V(final obs)) - 1 = 2.8; 3 + .9*4 - 1.5 = 5.1
    #        A2 = 5.1; A1 = 2.8 (episode ended, recursion cut); A0 = 1.4 + .72 * 2.8 = 3.416
    # env 1: deltas 1 + .9*.5 - .5 = .95; 1 + 0 (terminated: no bootstrap) - .5 = .5; 1 + .9*1 - .5 = 1.4
    #        A2 = 1.4; A1 = .5; A0 = .95 + .72 * .5 = 1.31
    expected_advantages = torch.tensor([[3.416, 1.31], [2.8, 0.5], [5.1, 1.4]])
    torch.testing.assert_close(storage.advantages, expected_advantages)
    torch.testing.assert_close(storage.returns, expected_advantages + storage.values)


def _naive_gae(rewards, values, next_values, terminated, dones, gamma, lam):
    """Per-env, per-step reference: sum over l of (gamma lam)^l delta_{t+l}, stopping at the episode end."""
    T, N = rewards.shape
    advantages = torch.zeros(T, N)
    for n in range(N):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                delta = rewards[k, n] + gamma * (1 - float(terminated[k, n])) * next_values[k, n] - values[k, n]
                total += discount * delta
                if dones[k, n]:
                    break
                discount *= gamma * lam
            advantages[t, n] = total
    return advantages


def test_gae_matches_naive_reference_on_random_episodes():
    generator = torch.Generator().manual_seed(0)
    T, N = 17, 3
    rewards, values, next_values = (torch.randn(T, N, generator=generator) for _ in range(3))
    terminated = torch.rand(T, N, generator=generator) < 0.1
    truncated = (torch.rand(T, N, generator=generator) < 0.1) & ~terminated
    dones = terminated | truncated
    advantages, returns = compute_gae(rewards, values, next_values, terminated, dones, 0.97, 0.9)
    torch.testing.assert_close(advantages, _naive_gae(rewards, values, next_values, terminated, dones, 0.97, 0.9))
    torch.testing.assert_close(returns, advantages + values)


def test_rollout_minibatches_cover_every_sample_once():
    storage = _rollout_with_truncation_and_termination()
    seen = torch.cat([batch["advantages"] for batch in storage.minibatches(3, torch.Generator().manual_seed(1))])
    assert sorted(seen.tolist()) == sorted(storage.advantages.flatten().tolist())
    with pytest.raises(RuntimeError, match="full"):
        storage.insert(
            *(torch.zeros(2, 1), torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2)),
            terminated=torch.zeros(2, dtype=torch.bool),
            truncated=torch.zeros(2, dtype=torch.bool),
        )
