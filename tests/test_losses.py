"""Loss terms against hand-computed values."""

import math
from types import SimpleNamespace

import pytest
import torch

import agents
from agents.envs import env_spec
from agents.nets.distributions import Categorical


def ppo(**overrides):
    return agents.make("ppo", env_spec("CartPole-v1"), {"clip_range": 0.2, **overrides}, total_steps=100)


def ratio_batch(ratios: list[float]):
    """A uniform 2-action policy and stored log-probs that make pi / pi_old equal ``ratios``."""
    dist = Categorical(torch.zeros(len(ratios), 2))
    log_probs = torch.full((len(ratios),), math.log(0.5)) - torch.tensor(ratios).log()
    return dist, SimpleNamespace(actions=torch.zeros(len(ratios), dtype=torch.long), log_probs=log_probs)  # the fields the policy loss reads


def test_ppo_clipped_surrogate():
    algo = ppo()
    dist, batch = ratio_batch([1.5, 0.5, 1.1, 0.7])
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    # objective min(r A, clip(r, 0.8, 1.2) A) per sample:
    #   r=1.5, A=+1: min(1.5, 1.2) = 1.2      r=0.5, A=+1: min(0.5, 0.8) = 0.5
    #   r=1.1, A=-1: min(-1.1, -1.1) = -1.1   r=0.7, A=-1: min(-0.7, -0.8) = -0.8
    expected = -torch.tensor([1.2, 0.5, -1.1, -0.8]).mean()
    loss, info = algo._policy_loss(dist, batch, advantages)
    torch.testing.assert_close(loss, expected)
    assert info["clip_fraction"] == 0.75  # 1.5, 0.5 and 0.7 lie outside [0.8, 1.2]


def test_surrogate_pg_is_the_unclipped_ratio_objective():
    algo = agents.make("surrogate_pg", env_spec("CartPole-v1"), total_steps=100)
    dist, batch = ratio_batch([1.5, 0.5, 1.1, 0.7])
    loss, _ = algo._policy_loss(dist, batch, torch.tensor([1.0, 1.0, -1.0, -1.0]))
    torch.testing.assert_close(loss, -torch.tensor([1.5, 0.5, -1.1, -0.7]).mean())


def test_ppo_value_loss_with_and_without_clipping():
    values, old_values, returns = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.5]), torch.tensor([3.0, 0.0])
    # unclipped errors: (2-3)^2 = 1, (0-0)^2 = 0
    torch.testing.assert_close(ppo(value_clip_range=None).value_loss(values, old_values, returns), torch.tensor(0.25))
    # clipped values: 1 + clip(1, -.2, .2) = 1.2 -> (1.2-3)^2 = 3.24; 0.5 + clip(-.5) = 0.3 -> 0.09
    # max per element: 3.24, 0.09 -> 0.5 * mean = 0.8325
    torch.testing.assert_close(ppo(value_clip_range=0.2).value_loss(values, old_values, returns), torch.tensor(0.8325))


def test_sac_fixed_alpha_is_not_trained():
    algo = agents.make("sac", env_spec("Pendulum-v1"), {"alpha": 0.2, "learning_starts": 0, "batch_size": 4, "hidden_sizes": [8]}, total_steps=100)
    for _ in range(8):
        algo.buffer.add(torch.randn(1, 3), torch.rand(1, 1) * 2 - 1, torch.randn(1), torch.randn(1, 3), torch.zeros(1, dtype=torch.bool))
    gradients, info = algo.compute_gradients(algo.buffer.sample(4))
    groups = algo.parameter_groups()
    assert len(gradients) == len(groups["critic"][0]) + len(groups["actor"][0])
    assert all(name.startswith(("critic.", "actor.")) for name in gradients)  # no log_alpha: it is fixed
    algo.apply_gradients(gradients)
    assert abs(info["alpha"] - 0.2) < 1e-6 and abs(algo.log_alpha.exp().item() - 0.2) < 1e-6 and "alpha_loss" not in info


def test_sac_target_entropy_defaults_to_minus_action_dim_or_a_fraction_of_log_num_actions():
    algo = agents.make("sac", env_spec("Pendulum-v1"), {"hidden_sizes": [8]}, total_steps=100)
    assert algo.target_entropy == -1.0
    discrete = agents.make("sac", env_spec("CartPole-v1"), {"hidden_sizes": [8]}, total_steps=100)
    assert discrete.target_entropy == pytest.approx(0.98 * math.log(2))
