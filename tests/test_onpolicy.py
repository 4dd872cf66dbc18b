"""The on-policy family's math and options on fixed batches: trust region, adaptive KL, entropy
methods, advantages, recurrent sequence replay, MultiDiscrete distributions."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import agents
from agents.algos import PPOAdaptiveKL
from agents.algos.onpolicy import OneSeed
from agents.algos.policy_gradient import process_advantages
from agents.algos.seeds import per_seed_logs, seed_axis
from agents.api import Transitions
from agents.envs import env_spec, make_vector_env, true_next_obs
from agents.nets.distributions import MultiCategorical
from agents.optim import assign_flat

SMALL = {"num_steps": 32, "hidden_sizes": [16, 16], "normalize_observations": False, "normalize_rewards": False}


def build(name: str, env_id: str = "CartPole-v1", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return agents.make(name, env_spec(env_id), {**SMALL, **overrides}, total_steps=10_000, seed=seed)


def collect(algo, env_id: str = "CartPole-v1", seed: int = 0) -> None:
    """Fill the algorithm's rollout from real episodes, as the training loop does."""
    envs = make_vector_env(env_id, algo.config.num_envs)
    obs, _ = envs.reset(seed=seed)
    state = None
    try:
        while not algo.ready_to_update():
            obs_tensor = torch.as_tensor(obs, dtype=torch.float32)
            acted = algo.act(obs_tensor, state)
            next_obs, rewards, terminated, truncated, infos = envs.step(acted.env_actions)
            state = algo.reset_state(acted.state, torch.as_tensor(terminated | truncated))
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
            obs = next_obs
    finally:
        envs.close()


def rollout_batch(algo):
    """Returns and advantages computed, and the whole rollout as one batch."""
    algo._finish_rollout()
    return algo.storage.full_batch(algo.rollout_sequence_length())


# -- TRPO ------------------------------------------------------------------------------------


def measured_kl(algo, batch) -> float:
    with torch.no_grad():
        dist, _, flat = algo.evaluate(batch)
        return algo.actor_critic.distribution(flat["dist_params"]).kl(dist).mean().item()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_trpo_accepted_step_stays_inside_the_trust_region(env_id):
    algo = build("trpo", env_id, max_kl=0.01, num_envs=2)
    collect(algo, env_id)
    batch = rollout_batch(algo)
    seeds, seeded = OneSeed(algo), seed_axis(batch)
    full_step, surrogate_before, _ = algo.search_direction(seeds, seeded)
    step, info = algo.line_search(seeds, seeded, full_step, surrogate_before)
    assert info["line_search_fraction"][0] > 0, "no step accepted on a fresh rollout"
    assert measured_kl(algo, batch) < 1e-6  # the search leaves the parameters where they were
    assign_flat(algo.policy_parameters, torch.cat([p.detach().flatten() for p in algo.policy_parameters]) + step[0])
    kl = measured_kl(algo, batch)
    assert 0 < kl <= 0.01 and kl == pytest.approx(float(info["kl"][0]), rel=1e-4)
    surrogate_after, _ = algo.policy_objective(algo.actor_critic, seeded)
    assert surrogate_after[0] > surrogate_before[0]


def test_trpo_line_search_shrinks_a_step_that_breaks_the_kl_limit():
    algo = build("trpo", max_kl=0.01, num_envs=2, line_search_max_steps=30)
    collect(algo)
    batch = rollout_batch(algo)
    seeds, seeded = OneSeed(algo), seed_axis(batch)
    full_step, surrogate_before, _ = algo.search_direction(seeds, seeded)
    too_long = 20 * full_step
    start = torch.cat([p.detach().flatten() for p in algo.policy_parameters])
    assign_flat(algo.policy_parameters, start + too_long[0])
    assert measured_kl(algo, batch) > 0.01  # the unshrunk step would leave the trust region
    assign_flat(algo.policy_parameters, start)

    step, info = algo.line_search(seeds, seeded, too_long, surrogate_before)
    assert 0 < info["line_search_fraction"][0] < 1 and info["kl"][0] <= 0.01
    torch.testing.assert_close(step, info["line_search_fraction"][0] * too_long)


def test_trpo_update_reports_kl_within_max_kl_and_moves_the_policy():
    algo = build("trpo", max_kl=0.005, num_envs=2)
    collect(algo)
    logs = algo.update()
    assert 0 < logs["kl"] <= 0.005 and logs["line_search_fraction"] > 0 and np.isfinite(logs["value_loss"])


def test_trpo_rejects_a_step_when_no_fraction_improves_the_surrogate():
    algo = build("trpo", num_envs=2)
    collect(algo)
    batch = rollout_batch(algo)
    seeds, seeded = OneSeed(algo), seed_axis(batch)
    full_step, surrogate_before, _ = algo.search_direction(seeds, seeded)
    step, info = algo.line_search(seeds, seeded, -full_step, surrogate_before)  # uphill the other way
    assert info["line_search_fraction"][0] == 0.0 and torch.count_nonzero(step) == 0


# -- adaptive KL -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "measured,expected",
    [(0.001, 0.5), (0.0066, 0.5), (0.0067, 1.0), (0.01, 1.0), (0.0149, 1.0), (0.0151, 2.0), (0.5, 2.0)],
)
def test_adaptive_kl_coefficient_halves_below_and_doubles_above_the_band(measured, expected):
    # band: [d_targ / 1.5, d_targ * 1.5] = [0.00667, 0.015] for d_targ = 0.01
    assert PPOAdaptiveKL.adapt_kl_coef(1.0, measured, 0.01) == expected


def test_adaptive_kl_update_adapts_the_penalty_from_the_measured_kl():
    tight = build("ppo_kl", kl_target=1e-9, kl_penalty=1.0, num_envs=2, num_minibatches=2, num_epochs=2)
    collect(tight)
    logs = tight.update()
    assert logs["measured_kl"] > 1.5e-9 and tight.kl_coef == 2.0 and logs["kl_coef"] == 2.0

    loose = build("ppo_kl", kl_target=10.0, kl_penalty=1.0, num_envs=2, num_minibatches=2, num_epochs=2)
    collect(loose)
    loose.update()
    assert loose.kl_coef == 0.5
    assert loose.state_dict()["kl_coef"] == 0.5


def test_adaptive_kl_penalty_term_is_beta_times_the_kl_to_the_stored_policy():
    algo = build("ppo_kl", kl_penalty=3.0, num_envs=2)
    collect(algo)
    batch = rollout_batch(algo)
    with torch.no_grad():
        for parameter in algo.actor_critic.actor.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
        dist, _, flat = algo.evaluate(batch)
        advantages = torch.randn(flat["actions"].shape[0])
        loss, info = algo._policy_loss(dist, flat, advantages)
        ratio = (dist.log_prob(flat["actions"]) - flat["log_probs"]).exp()
        kl = algo.actor_critic.distribution(flat["dist_params"]).kl(dist).mean()
    assert kl > 0
    torch.testing.assert_close(loss, -(ratio * advantages).mean() + 3.0 * kl)


# -- entropy methods -------------------------------------------------------------------------


def fixed_batch_losses(**options):
    """Loss and policy gradients of the same rollout under different entropy options."""
    algo = build("vpg", "Pendulum-v1", num_envs=2, initial_log_std=-1.5, **options)
    collect(algo, "Pendulum-v1")
    raw_rewards = algo.storage.rewards.clone()
    batch = rollout_batch(algo)
    loss, info = algo.loss(batch, parts=("policy",))
    gradients = torch.autograd.grad(loss, algo.actor_critic.policy_parameters(), allow_unused=True)
    return algo, raw_rewards, loss, info, gradients


def test_regularized_entropy_subtracts_coeff_times_mean_entropy_from_the_loss():
    _, _, plain, info, plain_gradients = fixed_batch_losses()
    _, _, regularized, _, gradients = fixed_batch_losses(entropy_method="regularized", entropy_coef=0.1)
    # a Gaussian with state-independent log-std: H = sum_i (0.5 log(2 pi e) + log_std_i) = 1.419 - 1.5 < 0
    entropy = 0.5 * math.log(2 * math.pi * math.e) - 1.5
    assert info["entropy"] == pytest.approx(entropy, abs=1e-5)
    torch.testing.assert_close(regularized, plain - 0.1 * torch.tensor(entropy), atol=1e-5, rtol=0)
    log_std_gradient = gradients[0] - plain_gradients[0]  # the module's own parameter log_std comes first
    torch.testing.assert_close(log_std_gradient, torch.tensor([-0.1]))  # d(-0.1 H)/d log_std


def test_softplus_entropy_keeps_the_bonus_positive():
    _, _, plain, _, _ = fixed_batch_losses()
    _, _, softplus, _, _ = fixed_batch_losses(entropy_method="regularized", entropy_coef=0.1, use_softplus_entropy=True)
    entropy = torch.tensor(0.5 * math.log(2 * math.pi * math.e) - 1.5)
    torch.testing.assert_close(softplus, plain - 0.1 * F.softplus(entropy), atol=1e-5, rtol=0)


def test_stopped_entropy_gradient_changes_the_loss_but_not_the_gradients():
    _, _, plain, _, plain_gradients = fixed_batch_losses()
    _, _, stopped, _, gradients = fixed_batch_losses(entropy_method="regularized", entropy_coef=0.1, stop_entropy_gradient=True)
    assert not torch.isclose(stopped, plain)
    for gradient, plain_gradient in zip(gradients, plain_gradients):
        torch.testing.assert_close(gradient, plain_gradient)


def test_max_entropy_adds_the_entropy_to_every_reward_and_not_to_the_loss():
    algo, raw_rewards, loss, info, _ = fixed_batch_losses(entropy_method="max", entropy_coef=0.1)
    entropy = 0.5 * math.log(2 * math.pi * math.e) - 1.5
    torch.testing.assert_close(algo.storage.rewards, raw_rewards + 0.1 * entropy)
    _, plain_rewards, plain_loss, _, _ = fixed_batch_losses()
    torch.testing.assert_close(raw_rewards, plain_rewards)  # same seed, same rollout
    softplus_algo, raw, _, _, _ = fixed_batch_losses(entropy_method="max", entropy_coef=0.1, use_softplus_entropy=True)
    torch.testing.assert_close(softplus_algo.storage.rewards, raw + 0.1 * F.softplus(torch.tensor(entropy)))


def test_max_entropy_on_a_categorical_policy_uses_each_states_entropy():
    algo = build("ppo", entropy_method="max", entropy_coef=0.5, num_envs=2)
    collect(algo)
    raw_rewards = algo.storage.rewards.clone()
    with torch.no_grad():
        params, _, _ = algo.actor_critic(algo.storage.obs.flatten(0, 1))
        entropies = algo.actor_critic.distribution(params).entropy().view_as(raw_rewards)
    algo._finish_rollout()
    torch.testing.assert_close(algo.storage.rewards, raw_rewards + 0.5 * entropies)


# -- advantages and baselines ----------------------------------------------------------------


@pytest.mark.parametrize("overrides", [{}, {"shared_network": True}, {"recurrent": "gru", "num_minibatches": 1}])
def test_rollout_values_are_the_critic_at_each_stored_observation(overrides):
    """A feed-forward actor and critic act without V and fill the rollout's V in one batched
    pass at its end; shared and recurrent networks store V while acting. Either way the stored
    V(s_t) is the critic's value of the observation stored at t."""
    algo = build("ppo", **overrides)
    collect(algo)
    algo._finish_rollout()
    storage = algo.storage
    with torch.no_grad():
        if overrides.get("recurrent"):
            _, expected, _ = algo.actor_critic(storage.obs, storage.states[0], storage.episode_starts)
        else:
            expected = torch.stack([algo.actor_critic(storage.obs[t])[1] for t in range(storage.obs.shape[0])])
    torch.testing.assert_close(storage.values, expected.view_as(storage.values), rtol=1e-5, atol=1e-5)
    assert storage.values.abs().sum() > 0


def test_reinforce_advantages_are_discounted_returns_to_go():
    algo = build("reinforce", num_steps=3, gamma=0.9, center_adv=False)
    obs = torch.zeros(1, 4)
    for t in range(3):
        acted = algo.act(obs)
        done = torch.tensor([t == 2])
        algo.observe(Transitions(obs, acted, torch.ones(1), obs, done, torch.tensor([False])))
    algo._finish_rollout()
    assert not algo.storage.values.any()  # no baseline
    torch.testing.assert_close(algo.storage.advantages.flatten(), torch.tensor([1 + 0.9 + 0.81, 1 + 0.9, 1.0]))


def test_center_and_positive_advantages():
    options = build("vpg", center_adv=True, positive_adv=True).config
    advantages = process_advantages(options, torch.tensor([1.0, 2.0, 3.0, 6.0]))
    centered = (torch.tensor([1.0, 2.0, 3.0, 6.0]) - 3.0) / torch.tensor([1.0, 2.0, 3.0, 6.0]).std()
    torch.testing.assert_close(advantages, centered - centered.min() + 1e-8)
    assert advantages.min() > 0
    raw = process_advantages(build("vpg", center_adv=False).config, torch.tensor([1.0, -2.0]))
    torch.testing.assert_close(raw, torch.tensor([1.0, -2.0]))


def test_advantages_are_processed_per_seed_and_over_the_counted_steps_only():
    """Each seed's row on its own; with a mask, the statistics of the counted steps alone and
    0 elsewhere (REINFORCE's unfinished episodes), as if the counted steps were all there were."""
    options = build("vpg", center_adv=True, positive_adv=True).config
    rows = torch.tensor([[1.0, 2.0, 3.0, 6.0], [4.0, -1.0, 0.5, 2.0]])
    together = process_advantages(options, rows)
    for row, processed in zip(rows, together):
        torch.testing.assert_close(processed, process_advantages(options, row))
    counted = torch.tensor([[True, False, True, True], [False, False, True, False]])
    masked = process_advantages(options, rows, counted)
    torch.testing.assert_close(masked[0, [0, 2, 3]], process_advantages(options, rows[0, [0, 2, 3]]))
    assert masked[0, 1] == 0 and masked[1, [0, 1, 3]].eq(0).all()
    torch.testing.assert_close(masked[1, 2], torch.tensor(1e-8))  # one counted step: nothing to center, then made positive


def test_vpg_takes_one_policy_step_and_fits_the_value_function_with_its_own_optimizer():
    algo = build("vpg", num_envs=2, value_epochs=30, value_lr=1e-2)
    collect(algo)
    policy_before = [p.detach().clone() for p in algo.actor_critic.policy_parameters()]
    batch = rollout_batch(algo)
    _, values_before, flat = algo.evaluate(batch)
    error_before = (values_before - flat["returns"]).pow(2).mean()
    logs = per_seed_logs(algo.optimize(OneSeed(algo)), 1)[0]
    _, values_after, _ = algo.evaluate(batch)
    assert (values_after - flat["returns"]).pow(2).mean() < 0.5 * error_before
    assert algo.optimizers["policy"].state[algo.actor_critic.policy_parameters()[0]]["step"] == 1
    assert any(not torch.equal(a, b) for a, b in zip(policy_before, algo.actor_critic.policy_parameters()))
    assert np.isfinite(logs["policy_loss"])


def test_parameter_roles_partition_the_network():
    for shared in (False, True):
        algo = build("ppo", "Pendulum-v1", shared_network=shared, recurrent="gru", num_minibatches=1)
        policy = {id(p) for p in algo.actor_critic.policy_parameters()}
        value = {id(p) for p in algo.actor_critic.value_parameters()}
        assert not policy & value and policy | value == {id(p) for p in algo.actor_critic.parameters()}


# -- recurrent policies ----------------------------------------------------------------------


@pytest.mark.parametrize("kind,sequence_length,shared", [("gru", 32, False), ("lstm", 8, False), ("lstm", 4, True)])
def test_replayed_sequences_reproduce_the_log_probs_and_values_of_acting(kind, sequence_length, shared):
    """Unrolling stored sequences from their stored states, zeroed at episode starts, gives
    exactly what the policy computed while acting, in shuffled minibatches too."""
    algo = build("ppo", recurrent=kind, recurrent_size=8, sequence_length=sequence_length, shared_network=shared, num_envs=3, num_minibatches=3)
    collect(algo)
    assert algo.storage.episode_starts[1:].any(), "the rollout should cross an episode boundary"
    algo._finish_rollout()
    for batch in algo.minibatches(3):
        assert batch["obs"].shape[0] == sequence_length and batch["states"].shape[-1] == algo.actor_critic.state_size
        with torch.no_grad():
            dist, values, flat = algo.evaluate(batch)
        torch.testing.assert_close(dist.log_prob(flat["actions"]), flat["log_probs"], atol=1e-5, rtol=0)
        torch.testing.assert_close(values, flat["values"], atol=1e-5, rtol=0)


def test_episode_starts_follow_episode_ends_and_reset_state_zeroes_ended_envs():
    algo = build("a2c", recurrent="gru", recurrent_size=4, num_envs=2, num_steps=4)
    state = algo.act(torch.randn(2, 4)).state
    assert state.shape == (2, 8) and state.abs().sum() > 0  # a 4-wide GRU state for the actor and one for the critic
    reset = algo.reset_state(state, torch.tensor([True, False]))
    assert reset[0].abs().sum() == 0 and torch.equal(reset[1], state[1])
    obs = torch.zeros(2, 4)
    dones = [[False, False], [True, False], [False, True], [False, False]]
    for done in dones:
        acted = algo.act(obs)
        algo.observe(Transitions(obs, acted, torch.zeros(2), obs, torch.tensor(done), torch.tensor([False, False])))
    expected = torch.tensor([[True, True], [False, False], [True, False], [False, True]])
    assert torch.equal(algo.storage.episode_starts, expected)


def test_feed_forward_and_recurrent_policies_differ_only_in_memory():
    feed_forward = build("ppo", "reprorl/CartPoleNoVel-v1")
    recurrent = build("ppo", "reprorl/CartPoleNoVel-v1", recurrent="lstm", num_minibatches=1)
    assert feed_forward.act(torch.zeros(1, 2)).state is None
    assert recurrent.act(torch.zeros(1, 2)).state.shape == (1, 2 * 2 * 64)  # (h, c) for actor and critic


# -- MultiDiscrete ---------------------------------------------------------------------------


def test_multi_categorical_sums_independent_components():
    logits = torch.log(torch.tensor([[0.25, 0.75, 0.2, 0.3, 0.5]]))
    dist = MultiCategorical(logits, (2, 3))
    actions = torch.tensor([[1, 2]])
    torch.testing.assert_close(dist.log_prob(actions), torch.log(torch.tensor([0.75 * 0.5])))
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)) - sum(p * math.log(p) for p in (0.2, 0.3, 0.5))
    torch.testing.assert_close(dist.entropy(), torch.tensor([entropy]))
    assert torch.equal(dist.mode(), torch.tensor([[1, 2]]))
    samples = MultiCategorical(logits.expand(4000, 5), (2, 3)).sample()
    assert samples.shape == (4000, 2) and samples[:, 1].max() == 2
    assert (samples[:, 0] == 1).float().mean() == pytest.approx(0.75, abs=0.03)


def test_multi_discrete_spec_and_actions():
    spec = env_spec("reprorl/MultiDiscreteMatch-v0")
    assert spec.multi_discrete and spec.action_nvec == (2, 3, 4) and spec.action_shape == (3,) and spec.num_actions == 9
    algo = build("a2c", "reprorl/MultiDiscreteMatch-v0", num_envs=2)
    acted = algo.act(torch.zeros(5, 9))
    assert acted.env_actions.shape == (5, 3) and np.all(acted.env_actions < np.array([2, 3, 4]))


def test_an_epoch_has_exactly_the_requested_number_of_minibatches():
    """6 sequences in 4 minibatches are 2+2+1+1, not torch.chunk's 2+2+2."""
    algo = build("ppo", recurrent="gru", recurrent_size=4, num_envs=3, num_steps=8, sequence_length=4, num_minibatches=4)
    collect(algo)
    algo._finish_rollout()
    sizes = [batch["obs"].shape[1] for batch in algo.minibatches(4)]
    assert sizes == [2, 2, 1, 1]
    flat = build("ppo", num_envs=1, num_steps=6, num_minibatches=4)
    collect(flat)
    flat._finish_rollout()
    assert [batch["obs"].shape[0] for batch in flat.minibatches(4)] == [2, 2, 1, 1]


def test_annealed_clip_range_also_anneals_value_clipping():
    algo = build("ppo", anneal_clip_range=True, value_clip_range=0.4, num_minibatches=1, num_epochs=1)
    assert algo.value_clip_range == pytest.approx(0.4)
    algo.num_updates = algo.num_updates_total // 2
    assert algo.value_clip_range == pytest.approx(0.2) and algo.clip_range == pytest.approx(0.1)


def test_reinforce_counts_only_episodes_that_ended_within_the_rollout():
    """Steps after an env's last episode end have no exact return-to-go: weight 0; the loss is
    the mean over the counted steps."""
    algo = build("reinforce", num_envs=2, num_steps=4, center_adv=False)
    obs = torch.zeros(2, 4)
    ends = [[False, False], [True, False], [False, False], [False, False]]  # env 1 never ends
    for done in ends:
        acted = algo.act(obs)
        algo.observe(Transitions(obs, acted, torch.ones(2), obs, torch.tensor(done), torch.tensor([False, False])))
    algo._finish_rollout()
    assert torch.equal(algo.storage.complete, torch.tensor([[True, False], [True, False], [False, False], [False, False]]))
    batch = algo.storage.full_batch()
    loss, _ = algo.loss(batch, parts=("policy",))
    dist, _, flat = algo.evaluate(batch)
    counted = flat["complete"]
    expected = -(dist.log_prob(flat["actions"])[counted] * flat["advantages"][counted]).mean()
    torch.testing.assert_close(loss, expected)
