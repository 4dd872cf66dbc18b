"""Off-policy mechanics: update schedule, warm-up, exploration, targets, MPO's E-step and KLs."""

import math

import numpy as np
import pytest
import torch
from torch import nn

import agents
from agents.algos.mpo import _gaussian_kl, e_step
from agents.api import Transitions
from agents.envs import env_spec


def step(algo, n: int, dims: int, done: bool = False) -> None:
    obs = torch.randn(n, dims)
    acted = algo.act(obs)
    algo.observe(Transitions(obs, acted, torch.zeros(n), torch.randn(n, dims), torch.zeros(n, dtype=torch.bool), torch.full((n,), done)))


@pytest.mark.parametrize("num_envs", [1, 4])
def test_gradient_steps_per_env_step_do_not_depend_on_num_envs_and_start_after_warm_up(num_envs):
    config = {"learning_starts": 8, "update_every": 2, "gradient_steps": 3, "batch_size": 4, "hidden_sizes": [8], "num_envs": num_envs, "start_steps": 0}
    algo = agents.make("sac", env_spec("Pendulum-v1"), config, total_steps=1000)
    while algo.env_steps < 8:
        step(algo, num_envs, 3)
        assert not algo.ready_to_update()  # no updates during warm-up, and no burst when it ends
    while algo.env_steps < 24:
        step(algo, num_envs, 3)
        if algo.ready_to_update():
            algo.update()
    assert algo.num_updates == (24 - 8) // 2 * 3


def test_start_steps_act_uniformly_at_random_then_follow_the_policy():
    algo = agents.make("td3", env_spec("Pendulum-v1"), {"start_steps": 100, "hidden_sizes": [8], "noise_sigma": 0.0}, total_steps=1000)
    obs = torch.zeros(500, 3)
    random_actions = algo.act(obs).actions
    assert random_actions.std() > 0.5  # uniform on (-1, 1): std 0.58
    algo.env_steps = 100
    policy_actions = algo.act(obs).actions
    assert torch.allclose(policy_actions, policy_actions[0].expand_as(policy_actions))  # same obs, no noise


def test_dqn_epsilon_decays_linearly_then_stays():
    algo = agents.make("dqn", env_spec("CartPole-v1"), {"exploration_fraction": 0.5, "epsilon_final": 0.1}, total_steps=1000)
    for steps, epsilon in ((0, 1.0), (250, 0.55), (500, 0.1), (900, 0.1)):
        algo.env_steps = steps
        assert algo.epsilon == pytest.approx(epsilon)


class Constant(nn.Module):
    def __init__(self, values):
        super().__init__()
        self.values = torch.tensor(values)
        self.weight = nn.Parameter(torch.zeros(()))

    def forward(self, obs):
        return self.values.expand(obs.shape[0], -1) + self.weight


@pytest.mark.parametrize("double_q,expected_next", [(True, 5.0), (False, 10.0)])
def test_double_dqn_evaluates_the_online_argmax_with_the_target_network(double_q, expected_next):
    algo = agents.make("dqn", env_spec("CartPole-v1"), {"double_q": double_q, "huber": False, "max_grad_norm": None}, total_steps=100)
    algo.q_network, algo.q_target = Constant([1.0, 2.0]), Constant([10.0, 5.0])  # online prefers 1, target values 0 higher
    algo.q_parameters = list(algo.q_network.parameters())
    batch = {
        "obs": torch.zeros(1, 4),
        "next_obs": torch.zeros(1, 4),
        "actions": torch.tensor([0]),
        "rewards": torch.tensor([1.0]),
        "discounts": torch.tensor([0.5]),
        "terminated": torch.tensor([0.0]),
        "weights": torch.ones(1),
    }
    _, info = algo.compute_gradients(batch)
    # loss = (Q(s, 0) - (r + gamma Q'(s', a*)))^2 = (1 - (1 + 0.5 * next))^2
    assert info["loss"] == pytest.approx((0.5 * expected_next) ** 2)


def test_td3_delays_actor_and_target_updates():
    algo = agents.make("td3", env_spec("Pendulum-v1"), {"start_steps": 0, "learning_starts": 0, "batch_size": 4, "hidden_sizes": [8]}, total_steps=1000)
    for _ in range(8):
        step(algo, 1, 3)
    actor_target = [p.clone() for p in algo.actor_target.parameters()]
    batch = algo.buffer.sample(4)
    gradients, info = algo.compute_gradients(batch)  # update 1 of policy_delay 2: critic only
    assert all(g is None for name, g in gradients.items() if name.startswith("actor.")) and "actor_loss" not in info
    algo.apply_gradients(gradients)
    assert all(torch.equal(a, b) for a, b in zip(actor_target, algo.actor_target.parameters()))
    gradients, info = algo.compute_gradients(batch)  # update 2: actor too, then the targets move
    assert all(g is not None for g in gradients.values()) and "actor_loss" in info
    algo.apply_gradients(gradients)
    assert not all(torch.equal(a, b) for a, b in zip(actor_target, algo.actor_target.parameters()))


def test_ddpg_ou_noise_is_correlated_and_restarts_with_each_episode():
    algo = agents.make("ddpg", env_spec("Pendulum-v1"), {"hidden_sizes": [8], "noise_sigma": 0.2}, total_steps=1000)
    noises = []
    for _ in range(200):
        algo.action_noise(torch.Size([1, 1]))
        noises.append(algo.ou_state.item())
    lag_one = np.corrcoef(noises[:-1], noises[1:])[0, 1]
    assert lag_one > 0.7  # x_{t+1} = 0.85 x_t + noise: autocorrelation 0.85
    step(algo, 1, 3, done=True)
    assert algo.ou_state.abs().sum() == 0


def test_mpo_gaussian_kl_matches_torch():
    mean_p, std_p, mean_q, std_q = torch.randn(5, 2), torch.rand(5, 2) + 0.1, torch.randn(5, 2), torch.rand(5, 2) + 0.1
    expected = torch.distributions.kl_divergence(torch.distributions.Normal(mean_p, std_p), torch.distributions.Normal(mean_q, std_q))
    torch.testing.assert_close(_gaussian_kl(mean_p, std_p, mean_q, std_q), expected)


@pytest.mark.parametrize("epsilon", [1.0, 0.0, 0.4])
def test_dqn_epsilon_greedy_takes_the_greedy_action_as_often_as_epsilon_says(epsilon):
    """Over 16 envs x 250 steps on a 2-action task: a share 1 - epsilon greedy, and epsilon
    uniform (half of which is the greedy action again)."""
    algo = agents.make("dqn", env_spec("CartPole-v1"), {"epsilon_start": epsilon, "epsilon_final": epsilon}, total_steps=1000, seed=3)
    obs = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        greedy = algo.q_network(obs).argmax(dim=-1)
    shares = [(algo.policy_actions(obs, deterministic=False) == greedy).float().mean().item() for _ in range(250)]
    assert sum(shares) / len(shares) == pytest.approx((1 - epsilon) + epsilon / 2, abs=0.03)
    assert torch.equal(algo.policy_actions(obs, deterministic=True), greedy)


def test_mpo_e_step_temperature_makes_the_kl_to_the_old_policy_equal_epsilon():
    torch.manual_seed(0)
    sampled_q = torch.randn(20, 64) * 5  # 20 actions in each of 64 states
    epsilon = 0.1
    log_temperature = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.Adam([log_temperature], lr=0.05)
    for _ in range(2000):
        weights, dual = e_step(sampled_q[None], log_temperature.exp().reshape(1, 1), epsilon)  # one seed
        optimizer.zero_grad()
        dual.sum().backward()
        optimizer.step()
    weights = e_step(sampled_q[None], log_temperature.exp().reshape(1, 1), epsilon)[0][0]
    # KL(q || uniform old-policy samples) per state, averaged: the E-step's constraint is active
    kl = (weights * torch.log(weights * sampled_q.shape[0])).sum(0).mean().item()
    assert kl == pytest.approx(epsilon, rel=0.1)
    assert math.isclose(weights.sum(0).mean().item(), 1.0, rel_tol=1e-5)


def test_a_checkpoint_written_before_the_counter_was_renamed_still_loads():
    """Off-policy states once stored their env-step counter as ``num_steps`` (the name of the
    on-policy horizon); it is ``env_steps`` now, and the older key still restores it."""
    algo = agents.make("sac", env_spec("Pendulum-v1"), {"hidden_sizes": [8]}, total_steps=1000)
    algo.env_steps = 321
    state = algo.state_dict()
    state["num_steps"] = state.pop("env_steps")
    other = agents.make("sac", env_spec("Pendulum-v1"), {"hidden_sizes": [8]}, total_steps=1000)
    other.load_state_dict(state)
    assert other.env_steps == 321
