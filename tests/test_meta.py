"""Meta-RL: task families and their split, episode collection, MAML's inner step and
meta-gradient, learning on point navigation, and meta runs through train.run and the CLI."""

import io

import gymnasium as gym
import numpy as np
import pytest
import torch

import agents
from agents.algos.maml import (
    Batch,
    TaskBatch,
    discounted_returns,
    episode_advantages,
    linear_baseline,
)
from agents.algos.seeds import seed_axis
from agents.api import ConfigError
from agents.envs import env_spec
from agents.meta import Episodes, MetaAlgorithm, TaskEnvs, meta_test
from agents.registry import REGISTRY
from agents.tasks import TASK_FAMILIES, TaskSampler
from benchmark.config import Budget, RunSpec
from benchmark.training import loop as training_loop
from benchmark.training.results import NullTracker

POINT = "reprorl/PointNav-v0"
META = {name: agents.algorithm_class(name) for name in REGISTRY if issubclass(agents.algorithm_class(name), MetaAlgorithm)}  # ours
#: small settings for the contract tests
SMALL = {
    "maml_vpg": {"meta_batch_size": 2, "episodes_per_task": 3, "num_envs": 3, "hidden_sizes": [8]},
    "maml_ppo": {"meta_batch_size": 2, "episodes_per_task": 3, "num_envs": 3, "hidden_sizes": [8], "outer_iterations": 2},
    "maml_trpo": {"meta_batch_size": 2, "episodes_per_task": 3, "num_envs": 3, "hidden_sizes": [8]},
    "pearl": {
        "num_train_tasks": 3,
        "latent_dim": 2,
        "encoder_hidden_sizes": [8],
        "hidden_sizes": [8],
        "meta_batch_size": 2,
        "num_steps_per_epoch": 5,
        "num_initial_steps": 100,
        "num_tasks_sample": 2,
        "num_steps_prior": 50,
        "num_extra_rl_steps_posterior": 150,
        "batch_size": 16,
        "embedding_batch_size": 16,
        "buffer_size": 1000,
    },
}


def test_every_meta_algorithm_is_covered():
    assert set(META) == set(SMALL) and META


# -- task families -------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", TASK_FAMILIES)
def test_test_tasks_are_fixed_and_held_out(env_id):
    first, second = TaskSampler(env_id), TaskSampler(env_id)
    assert first.test_tasks(4) == second.test_tasks(4)
    assert first.train_tasks(4) == second.train_tasks(4)
    drawn = first.sample(4, np.random.default_rng(0))
    assert drawn == first.sample(4, np.random.default_rng(0))
    if env_id.endswith("Dir-v5"):  # two tasks only: both are the test tasks (at most), the training set cycles
        assert first.test_tasks(3) == [{"direction": -1.0}, {"direction": 1.0}]
        assert first.train_tasks(3) == [{"direction": -1.0}, {"direction": 1.0}, {"direction": -1.0}]
    else:
        assert not set(map(str, first.test_tasks(4))) & (set(map(str, first.train_tasks(4))) | set(map(str, drawn)))


def test_set_task_changes_the_reward():
    env = gym.make("reprorl/HalfCheetahVel-v5")
    rewards = []
    for velocity in (0.0, 2.0):
        env.unwrapped.set_task({"velocity": velocity})
        assert env.unwrapped.get_task() == {"velocity": velocity}
        env.reset(seed=0)
        _, reward, _, _, info = env.step(np.zeros(6, np.float32))
        assert reward == pytest.approx(-abs(info["x_velocity"] - velocity))
        rewards.append(reward)
    assert rewards[0] != rewards[1]
    env = gym.make("reprorl/HalfCheetahDir-v5")
    env.unwrapped.set_task({"direction": -1.0})
    env.reset(seed=0)
    action = np.full(6, 0.5, np.float32)
    _, reward, _, _, info = env.step(action)
    assert reward == pytest.approx(-info["x_velocity"] - 0.05 * float(np.sum(action**2)))


def test_point_navigation_dynamics():
    env = gym.make(POINT)
    env.unwrapped.set_task({"goal": [0.3, 0.0]})
    obs, _ = env.reset(seed=0)
    np.testing.assert_allclose(obs, [0.0, 0.0])
    obs, reward, terminated, _, _ = env.step(np.array([1.0, 0.0], np.float32))
    np.testing.assert_allclose(obs, [0.1, 0.0], atol=1e-6)
    assert reward == pytest.approx(-0.2, abs=1e-6) and not terminated
    obs, _, _, _, _ = env.step(np.array([5.0, 0.0], np.float32))  # clipped to one 0.1 step
    np.testing.assert_allclose(obs, [0.2, 0.0], atol=1e-6)
    _, reward, terminated, _, _ = env.step(np.array([1.0, 0.0], np.float32))
    assert terminated and reward == pytest.approx(0.0, abs=1e-6)


def test_a_meta_algorithm_needs_a_task_family_and_a_task_family_needs_tasks():
    with pytest.raises(ConfigError, match="maml_trpo is a meta-RL algorithm and needs a task family; CartPole-v1 has no tasks"):
        agents.algorithm_class("maml_trpo").check_env_spec(env_spec("CartPole-v1"))
    with pytest.raises(ConfigError, match="Pendulum-v1 is not a task family"):
        TaskSampler("Pendulum-v1")
    with pytest.raises(ConfigError, match="does not normalize"):
        agents.make("maml_vpg", env_spec(POINT), {"normalize_observations": True}, total_steps=1)
    with pytest.raises(ConfigError, match="pearl refills no encoder buffer"):
        agents.make("pearl", env_spec(POINT), {**SMALL["pearl"], "num_steps_prior": 0}, total_steps=1)
    with pytest.raises(ConfigError, match="num_envs must be 1"):
        agents.make("pearl", env_spec(POINT), {**SMALL["pearl"], "num_envs": 4}, total_steps=1)
    with pytest.raises(ConfigError, match="pearl needs continuous"):
        agents.algorithm_class("pearl").check_env_spec(env_spec("CartPole-v1"))


# -- collection ----------------------------------------------------------------------------


class _Fixed:
    """Always the same action: moves the point right."""

    def act(self, obs, deterministic=False):
        from agents.meta import PolicyOutput

        actions = torch.tensor([[1.0, 0.0]]).expand(obs.shape[0], 2)
        return PolicyOutput(actions, actions.numpy(), torch.zeros(obs.shape[0]))


def test_collect_pads_ended_episodes_and_counts_steps():
    envs = TaskEnvs(POINT, 2, seed=0)
    episodes = envs.collect({"goal": [0.35, 0.0]}, _Fixed(), 3)  # two rounds: 2 + 1 episodes
    assert episodes.observations.shape == (3, 100, 2) and episodes.actions.shape == (3, 100, 2)
    # the point steps over the goal (0.3, 0.4: 0.05 away each) and never ends within 0.01 of it
    assert episodes.lengths.tolist() == [100, 100, 100] and envs.steps == 300
    episodes = envs.collect({"goal": [0.3, 0.0]}, _Fixed(), 2)
    assert episodes.lengths.tolist() == [3, 3]  # 0.1, 0.2, 0.3: terminated at the goal
    assert episodes.terminated[:, 2].all() and not episodes.mask[:, 3:].any()
    np.testing.assert_allclose(episodes.returns.numpy(), [-(0.2 + 0.1 + 0.0)] * 2, atol=1e-5)
    np.testing.assert_allclose(episodes.next_observations[0, 2].numpy(), [0.3, 0.0], atol=1e-6)
    assert envs.steps == 306


def test_collect_is_reproducible_from_the_seed_and_round_counter():
    """The same env seeds and the same draws of the run's generator give the same episodes."""
    algo = agents.make("maml_vpg", env_spec(POINT), SMALL["maml_vpg"], total_steps=1, seed=0)
    algo.generator.manual_seed(3)
    first = TaskEnvs(POINT, 3, seed=5).collect({"goal": [0.1, 0.2]}, algo.get_exploration_policy(), 4)
    algo.generator.manual_seed(3)
    second = TaskEnvs(POINT, 3, seed=5).collect({"goal": [0.1, 0.2]}, algo.get_exploration_policy(), 4)
    torch.testing.assert_close(first.actions, second.actions)
    torch.testing.assert_close(first.rewards, second.rewards)
    third = TaskEnvs(POINT, 3, seed=5).collect({"goal": [0.1, 0.2]}, algo.get_exploration_policy(), 4)
    assert not torch.equal(first.actions, third.actions)  # the generator moved on: new draws


# -- baseline and advantages ---------------------------------------------------------------


def _episodes(observations, rewards, mask=None, actions=None):
    mask = torch.ones(rewards.shape, dtype=torch.bool) if mask is None else mask
    actions = torch.zeros(*rewards.shape, 2) if actions is None else actions
    return Episodes({}, observations, actions, rewards, observations, torch.zeros_like(mask), mask)


def test_returns_and_gae_on_a_hand_computed_case():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    returns = discounted_returns(rewards, mask, 0.5)
    torch.testing.assert_close(returns, torch.tensor([[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0], [4 + 0.5 * 5, 5.0, 0.0]]))
    values = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 9.0]])
    advantages = episode_advantages(rewards, values, mask.float(), 0.5, 1.0)
    torch.testing.assert_close(advantages, (returns - values) * mask)  # lambda 1: returns minus baseline
    one_step = episode_advantages(rewards, values, mask.float(), 0.5, 0.0)
    torch.testing.assert_close(one_step[1], torch.tensor([4 + 0.5 * 2 - 2, 5 - 2, 0.0]))  # the last step bootstraps nothing


def test_linear_baseline_fits_returns_that_are_linear_in_its_features():
    generator = torch.Generator().manual_seed(0)
    observations = torch.randn(6, 20, 2, generator=generator)
    time = torch.arange(20.0) / 100.0
    returns = 1.0 + 2.0 * observations[..., 0] - observations[..., 1] ** 2 + 3.0 * time
    rewards = returns.clone()
    rewards[:, :-1] -= returns[:, 1:]  # gamma 1: rewards whose returns-to-go are ``returns``
    values = linear_baseline(_episodes(observations, rewards), rewards, gamma=1.0, reg_coeff=1e-8)
    torch.testing.assert_close(values, returns, atol=1e-3, rtol=1e-3)


# -- the meta-gradient ---------------------------------------------------------------------


def _tiny_problem(name="maml_vpg", first_order=False):
    """A one-hidden-layer policy in float64 and fixed random inner and validation batches."""
    torch.manual_seed(0)
    algo = agents.make(name, env_spec(POINT), {"hidden_sizes": [3], "inner_lr": 0.5, "first_order": first_order, "activation": "tanh"}, total_steps=1)
    algo.network.double()
    algo.parameters = list(algo.network.parameters())
    generator = torch.Generator().manual_seed(1)

    def batch():
        """20 steps of one seed, the last 3 padding (which no loss may read)."""
        mask = torch.ones(1, 20, dtype=torch.bool)
        mask[0, -3:] = False
        return Batch(
            observations=torch.randn(1, 20, 2, generator=generator, dtype=torch.float64),
            actions=torch.randn(1, 20, 2, generator=generator, dtype=torch.float64),
            mask=mask,
            advantages=torch.randn(1, 20, generator=generator, dtype=torch.float64) * mask,
            log_probs=torch.zeros(1, 20, dtype=torch.float64),
            dist_params=torch.zeros(1, 20, 4, dtype=torch.float64),
            returns=torch.zeros(1, dtype=torch.float64),
        )

    return algo, [TaskBatch([batch()], batch())]


def _vpg_loss(algo, theta, batch):
    """-mean(log pi(a|s) A) over the valid steps, written out with one run's network."""
    valid = batch.mask[0]
    params = torch.func.functional_call(algo.network, theta, (batch.observations[0][valid],))
    log_probs = algo.network.distribution(params).log_prob(batch.actions[0][valid])
    return -(log_probs * batch.advantages[0][valid]).mean()


def _outer_loss_at(algo, task_batch, vector):
    """L_out(theta - alpha grad L_in(theta)) at theta = ``vector``, recomputed from scratch
    (both losses VPG's, on the valid steps only)."""
    shapes = [p.shape for p in algo.parameters]
    pieces = vector.split([int(np.prod(s)) for s in shapes])
    theta = {name: piece.view(shape).clone().requires_grad_() for name, piece, shape in zip(algo.names, pieces, shapes)}
    gradients = torch.autograd.grad(_vpg_loss(algo, theta, task_batch.inner[0]), list(theta.values()))
    adapted = {k: v - algo.config.inner_lr * g for (k, v), g in zip(theta.items(), gradients)}
    return _vpg_loss(algo, adapted, task_batch.validation).item()


def test_the_meta_gradient_differentiates_through_the_inner_step():
    """Second order: the meta-gradient equals central finite differences of the outer loss as
    a function of theta (through the inner step); the first-order gradient does not."""
    algo, batch = _tiny_problem()
    gradients, _ = algo.compute_gradients(batch)
    meta_gradient = torch.cat([g.reshape(-1) for g in gradients.values()])
    theta = torch.cat([p.detach().reshape(-1) for p in algo.parameters])
    numeric = torch.zeros_like(theta)
    for i in range(theta.numel()):
        step = torch.zeros_like(theta)
        step[i] = 1e-6
        numeric[i] = (_outer_loss_at(algo, batch[0], theta + step) - _outer_loss_at(algo, batch[0], theta - step)) / 2e-6
    torch.testing.assert_close(meta_gradient, numeric, atol=1e-7, rtol=1e-5)

    first_order, _ = _tiny_problem(first_order=True)
    approximate = torch.cat([g.reshape(-1) for g in first_order.compute_gradients(batch)[0].values()])
    second_order_term = (meta_gradient - approximate).norm() / meta_gradient.norm()
    assert second_order_term > 0.05, f"the second-order term is only {second_order_term:.3g} of the gradient"
    # first order: exactly the outer gradient at the adapted parameters, as if they were theta
    theta = {k: v.unsqueeze(0) for k, v in first_order.meta_parameters().items()}
    adapted = {k: v.detach().requires_grad_() for k, v in first_order.adapted_parameters(theta, batch[0], second_order=False).items()}
    loss, _ = first_order.outer_loss(adapted, batch[0].validation)
    direct = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss.sum(), list(adapted.values()))])
    torch.testing.assert_close(approximate, direct)


def test_adapt_policy_takes_one_inner_step_from_the_exploration_policy():
    algo = agents.make("maml_vpg", env_spec(POINT), SMALL["maml_vpg"], total_steps=1, seed=0)
    envs = TaskEnvs(POINT, 3, seed=0)
    policy = algo.get_exploration_policy()
    episodes = envs.collect({"goal": [0.4, -0.2]}, policy, 3)
    adapted = algo.adapt_policy(policy, episodes)
    batch = seed_axis(algo.make_batch(episodes))
    theta = {k: v.detach().requires_grad_() for k, v in policy.parameters.items()}
    gradients = torch.autograd.grad(_vpg_loss(algo, theta, batch), list(theta.values()))
    for (name, value), gradient in zip(theta.items(), gradients):
        torch.testing.assert_close(adapted.parameters[name], value.detach() - algo.config.inner_lr * gradient)
    for name, value in algo.meta_parameters().items():  # theta itself is untouched
        torch.testing.assert_close(policy.parameters[name], value.detach())


@pytest.mark.parametrize("name", ["maml_vpg", "pearl"])
def test_a_meta_test_repeats_itself_and_leaves_the_training_streams_alone(name):
    torch.manual_seed(0)
    algo = agents.make(name, env_spec(POINT), SMALL[name], total_steps=1, seed=0)
    envs = TaskEnvs(POINT, algo.collection_envs, seed=9)
    tasks = envs.sampler.test_tasks(2)
    torch_state, generator_state = torch.get_rng_state(), getattr(algo, "generator", torch.Generator()).get_state()
    results = []
    for _ in range(2):
        envs.rounds = 0
        results.append([(r.pre_adaptation_return, r.post_adaptation_return) for r in meta_test(algo, envs, tasks, seed=3)])
    assert results[0] == results[1]
    assert torch.equal(torch.get_rng_state(), torch_state)
    if hasattr(algo, "generator"):
        assert torch.equal(algo.generator.get_state(), generator_state)


def test_neighbouring_run_seeds_share_no_episode_seeds():
    first, second = TaskEnvs(POINT, 2, seed=0), TaskEnvs(POINT, 2, seed=1)
    policy = agents.make("maml_vpg", env_spec(POINT), SMALL["maml_vpg"], total_steps=1).get_exploration_policy()
    seeds = []
    for envs in (first, second):
        for _ in range(3):
            envs.collect({"goal": [0.0, 0.1]}, policy, 2)
        seeds.append({int(s) for r in range(3) for s in np.random.SeedSequence([envs.seed, r]).generate_state(2)})
    assert not seeds[0] & seeds[1]


# -- the interface contract -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SMALL))
def test_meta_interface_contract(name):
    """act, compute/apply gradients, get/set weights, update_parameter, state_dict round trip."""
    spec = env_spec(POINT)
    torch.manual_seed(0)
    algo = agents.make(name, spec, SMALL[name], total_steps=1, seed=0)
    obs = torch.randn(5, 2)
    acted = algo.act(obs, deterministic=True)
    assert acted.actions.shape == (5, 2) and np.all(np.abs(acted.env_actions) <= 1.0)
    before = algo.get_weights()
    logs = algo.train_epoch(TaskEnvs(POINT, algo.collection_envs, seed=0))
    assert logs and all(np.isfinite(v) for v in logs.values())
    assert {"pre_adaptation_return", "post_adaptation_return"} <= set(logs)
    after = algo.get_weights()
    assert any(not torch.equal(before["policy"][k], after["policy"][k]) for k in before["policy"])

    buffer = io.BytesIO()
    torch.save(algo.state_dict(), buffer)
    buffer.seek(0)
    restored = agents.make(name, spec, SMALL[name], total_steps=1, seed=1)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    torch.testing.assert_close(restored.act(obs, deterministic=True).actions, algo.act(obs, deterministic=True).actions)
    assert restored.rng.random() == algo.rng.random()  # the task-sampling stream continues

    other = agents.make(name, spec, SMALL[name], total_steps=1, seed=2)
    other.set_weights(algo.get_weights())
    torch.testing.assert_close(other.act(obs, deterministic=True).actions, algo.act(obs, deterministic=True).actions)

    parameter = "inner_lr" if name.startswith("maml") else "kl_lambda"
    algo.update_parameter(parameter, 0.05)
    assert getattr(algo.config, parameter) == 0.05
    with pytest.raises(ConfigError, match="cannot update 'hidden_sizes'"):
        algo.update_parameter("hidden_sizes", [4])
    # gradients computed on one learner apply on another (the distributed path)
    gradients, _ = algo.compute_gradients(algo.last_batch if name.startswith("maml") else algo.sample_batch())
    assert len(gradients) == len(algo.parameters)
    other.apply_gradients(gradients)
    assert any(not torch.equal(a, b) for a, b in zip(other.parameters, algo.parameters))


# -- learning ------------------------------------------------------------------------------

LEARN = {"meta_batch_size": 10, "episodes_per_task": 10, "num_envs": 10, "hidden_sizes": [32, 32]}


@pytest.mark.learning
@pytest.mark.parametrize(
    "name,epochs,overrides",
    [
        ("maml_vpg", 20, {"outer_lr": 1e-2}),
        # make test-all only (~50 s of a CI core): the meta-loop and adaptation are MAML-VPG's row's;
        # the PPO and TRPO outer steps keep their contract tests, and MAML-TRPO trains in the run tests
        pytest.param("maml_ppo", 12, {"outer_lr": 1e-2, "outer_iterations": 3}, marks=pytest.mark.extended),
        pytest.param("maml_trpo", 5, {}, marks=pytest.mark.extended),
    ],
)
def test_maml_adapts_on_held_out_point_navigation_tasks(name, epochs, overrides):
    """After a short meta-training, one inner step on held-out goals raises the return
    (averaged over the test tasks), and the adapted return beats the untrained one."""
    torch.manual_seed(0)
    algo = agents.make(name, env_spec(POINT), {**LEARN, **overrides}, total_steps=1, seed=0)
    train_envs, test_envs = TaskEnvs(POINT, 10, seed=0), TaskEnvs(POINT, 10, seed=10**6)
    tasks = train_envs.sampler.test_tasks(8)
    untrained = meta_test(algo, test_envs, tasks)
    for _ in range(epochs):
        algo.train_epoch(train_envs)
    trained = meta_test(algo, test_envs, tasks)
    pre = np.mean([r.pre_adaptation_return for r in trained])
    post = np.mean([r.post_adaptation_return for r in trained])
    before = np.mean([r.post_adaptation_return for r in untrained])
    print(f"{name}: untrained post {before:.1f}; trained pre {pre:.1f} -> post {post:.1f}")
    assert post > pre + 2.0
    assert post > before + 5.0


# -- runs ----------------------------------------------------------------------------------


def _meta_spec(total_steps=3 * 1200, eval_every=2 * 1200, **overrides):
    """maml_trpo on point navigation; an epoch is at most 2 tasks x 3 episodes x 100 steps x 2."""
    hyperparameters = agents.resolve_config("maml_trpo", {**SMALL["maml_trpo"], **overrides}).to_dict()
    return RunSpec("t", "maml_trpo", POINT, 0, hyperparameters, Budget(total_steps, eval_every, 2), device="cpu")


def test_a_meta_run_logs_pre_and_post_adaptation_returns_per_test_task():
    tracker = NullTracker()
    result = training_loop.run(_meta_spec(), tracker)
    names = {name for name, _, _ in tracker.metrics}
    assert {"meta_test/pre_adaptation_return", "meta_test/post_adaptation_return", "meta_test/adaptation_gain", "eval/return_mean"} <= names
    assert {"meta_test/task0/pre_adaptation_return", "meta_test/task1/post_adaptation_return"} <= names
    assert "train/post_adaptation_return" in names and "train/kl" in names
    assert len(result.evaluations) == 2 and all(len(e.returns) == 2 for e in result.evaluations)  # 2 test tasks
    assert result.evaluations[-1].step >= 3 * 1200
    posts = [value for name, value, _ in tracker.metrics if name == "meta_test/post_adaptation_return"]
    assert posts == pytest.approx([e.mean for e in result.evaluations])


def test_a_meta_run_is_deterministic_and_resumes_exactly(tmp_path):
    spec = _meta_spec(total_steps=5 * 1200, eval_every=1)  # a meta-test and a checkpoint after every epoch
    whole = training_loop.run(spec)
    assert len(whole.evaluations) >= 5
    assert [e.returns for e in whole.evaluations] == [e.returns for e in training_loop.run(spec).evaluations]

    class Stop(Exception):
        pass

    def stop_at_third(evaluation):
        if len(evaluations) == 2:
            raise Stop
        evaluations.append(evaluation)

    evaluations = []
    with pytest.raises(Stop):
        training_loop.run(spec, checkpoint_dir=tmp_path, on_evaluation=stop_at_third)
    from benchmark.training import checkpoint

    payload = checkpoint.load(tmp_path / spec.run_key / checkpoint.LATEST)
    assert payload["loop"]["epoch"] == 2
    resumed = training_loop.run(spec, checkpoint_dir=tmp_path, resume=payload)
    assert [(e.step, e.returns) for e in resumed.evaluations] == [(e.step, e.returns) for e in whole.evaluations]
    assert (tmp_path / spec.run_key / checkpoint.FINAL).exists()


# -- PEARL ---------------------------------------------------------------------------------

PEARL_POINT = {
    "num_train_tasks": 10,
    "latent_dim": 2,
    "encoder_hidden_sizes": [64, 64],
    "hidden_sizes": [64, 64],
    "meta_batch_size": 5,
    "num_steps_per_epoch": 100,
    "num_initial_steps": 200,
    "num_tasks_sample": 5,
    "num_steps_prior": 100,
    "num_extra_rl_steps_posterior": 100,
    "batch_size": 64,
    "embedding_batch_size": 64,
    "buffer_size": 10_000,
}


def test_product_of_gaussians_and_its_kl():
    mu = torch.tensor([[[1.0], [3.0]]])  # one task, two factors N(1, 1) and N(3, 1/3)
    var = torch.tensor([[[1.0], [1.0 / 3.0]]])
    mean, variance = __import__("agents.algos.pearl", fromlist=["x"]).product_of_gaussians(mu, var)
    torch.testing.assert_close(variance, torch.tensor([[0.25]]))  # precisions 1 + 3
    torch.testing.assert_close(mean, torch.tensor([[0.25 * (1.0 + 9.0)]]))
    from agents.algos.pearl import gaussian_kl_to_unit

    direct = torch.distributions.kl_divergence(torch.distributions.Normal(mean, variance.sqrt()), torch.distributions.Normal(0.0, 1.0)).sum(-1)
    torch.testing.assert_close(gaussian_kl_to_unit(mean, variance), direct)


def test_pearl_encoder_learns_from_the_q_loss_and_the_kl_term():
    """The encoder's gradient is that of kl_lambda * KL + L_Q; no other loss reaches it, and the
    KL term changes only the encoder's gradient."""
    torch.manual_seed(0)
    algo = agents.make("pearl", env_spec(POINT), SMALL["pearl"], total_steps=1, seed=0)
    algo.train_epoch(TaskEnvs(POINT, 1, seed=0))
    batch = algo.sample_batch()
    gradients = {}
    for kl_lambda in (0.0, 1.0):
        algo.update_parameter("kl_lambda", kl_lambda)
        algo.generator.manual_seed(6)  # the same z samples and actions for both
        torch.manual_seed(7)
        named, logs = algo.compute_gradients(batch)
        gradients[kl_lambda] = list(named.values())
        assert logs["kl"] > 0
    encoder = len(list(algo.encoder.parameters()))  # the encoder's parameters come first
    assert all(g is not None and g.abs().sum() > 0 for g in gradients[1.0][:encoder])
    assert any(not torch.allclose(a, b) for a, b in zip(gradients[0.0][:encoder], gradients[1.0][:encoder]))
    for a, b in zip(gradients[0.0][encoder:], gradients[1.0][encoder:]):
        torch.testing.assert_close(a, b)
    # the KL term alone: its gradient reaches the encoder
    mean, var = algo.posterior(algo.networks().encoder, batch["context"].unsqueeze(0))
    kl = __import__("agents.algos.pearl", fromlist=["x"]).gaussian_kl_to_unit(mean, var).sum()
    kl_gradients = torch.autograd.grad(kl, list(algo.encoder.parameters()))
    assert all(g.abs().sum() > 0 for g in kl_gradients)


def test_pearl_adapts_the_policy_by_posterior_sampling_from_its_context():
    torch.manual_seed(0)
    algo = agents.make("pearl", env_spec(POINT), SMALL["pearl"], total_steps=1, seed=0)
    envs = TaskEnvs(POINT, 1, seed=0)
    policy = algo.get_exploration_policy()
    assert policy.context is None
    first = envs.collect({"goal": [0.2, 0.2]}, policy, 1)
    adapted = algo.adapt_policy(policy, first)
    assert adapted.context.shape == (first.num_steps, 2 + 2 + 1)
    again = algo.adapt_policy(adapted, envs.collect({"goal": [0.2, 0.2]}, adapted, 1))
    assert len(again.context) > len(adapted.context)  # context accumulates over rounds
    mean, var = algo.posterior(algo.networks().encoder, again.context[None, None])
    assert var.max() < 1.0  # more context, a narrower posterior than the unit prior


@pytest.mark.learning
def test_pearl_meta_test_return_improves_with_meta_training():
    torch.manual_seed(0)
    algo = agents.make("pearl", env_spec(POINT), PEARL_POINT, total_steps=1, seed=0)
    train_envs, test_envs = TaskEnvs(POINT, 1, seed=0), TaskEnvs(POINT, 1, seed=10**6)
    tasks = train_envs.sampler.test_tasks(8)

    def score():
        test_envs.rounds = 0
        results = meta_test(algo, test_envs, tasks)
        return np.mean([r.pre_adaptation_return for r in results]), np.mean([r.post_adaptation_return for r in results])

    _, untrained = score()
    for _ in range(15):
        logs = algo.train_epoch(train_envs)
    pre, post = score()
    print(f"pearl: untrained post {untrained:.1f}; trained pre {pre:.1f} -> post {post:.1f}; last kl {logs['kl']:.2f}")
    assert post > untrained + 30
    assert post > pre


def test_a_pearl_run_with_its_buffers_in_the_checkpoint_resumes_exactly(tmp_path):
    hyperparameters = agents.resolve_config("pearl", SMALL["pearl"]).to_dict()
    spec = RunSpec("t", "pearl", POINT, 0, hyperparameters, Budget(3000, 1, 2), device="cpu", checkpoint_replay_buffer=True)
    whole = training_loop.run(spec)

    class Stop(Exception):
        pass

    seen = []

    def stop_at_third(evaluation):
        if len(seen) == 2:
            raise Stop
        seen.append(evaluation)

    with pytest.raises(Stop):
        training_loop.run(spec, checkpoint_dir=tmp_path, on_evaluation=stop_at_third)
    from benchmark.training import checkpoint

    payload = checkpoint.load(tmp_path / spec.run_key / checkpoint.LATEST)
    assert payload["replay"] is not None
    resumed = training_loop.run(spec, checkpoint_dir=tmp_path, resume=payload)
    assert [(e.step, e.returns) for e in resumed.evaluations] == [(e.step, e.returns) for e in whole.evaluations]


def test_a_meta_suite_through_the_cli_logs_meta_metrics_and_reports_adaptation(write_suite, tmp_path):
    from test_cli import all_runs, run_cli

    suite = write_suite(
        """
        name: tiny_meta
        seeds: 1
        budget: {total_steps: 1200, eval_every: 1200, eval_episodes: 2}
        experiments:
          - algo: maml_vpg
            envs: [reprorl/PointNav-v0]
            seeds: [0, 1]
            seeds_per_process: 2
            hyperparameters: {meta_batch_size: 2, episodes_per_task: 3, num_envs: 3, hidden_sizes: [8]}
          - algo: pearl
            envs: [reprorl/PointNav-v0]
            hyperparameters: {num_train_tasks: 3, latent_dim: 2, encoder_hidden_sizes: [8], hidden_sizes: [8], meta_batch_size: 2,
                              num_steps_per_epoch: 5, num_initial_steps: 100, num_tasks_sample: 2, num_steps_prior: 50,
                              num_extra_rl_steps_posterior: 50, batch_size: 16, embedding_batch_size: 16, buffer_size: 1000}
        """
    )
    results = tmp_path / "results"
    completed = run_cli("run", "--suite", str(suite), "--workers", "1", "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    client, runs = all_runs(f"sqlite:///{results / 'mlflow.db'}")
    children = [run for run in runs if run.data.tags.get("run_key")]
    assert len(children) == 3 and all(run.info.status == "FINISHED" for run in children)
    assert sorted(run.data.tags.get("batch_seeds", "") for run in children) == ["", "0 1", "0 1"]  # MAML's two seeds in one batch
    for run in children:
        metrics = run.data.metrics
        assert {"meta_test/pre_adaptation_return", "meta_test/post_adaptation_return", "meta_test/task1/post_adaptation_return"} <= set(metrics)
        assert metrics["final/eval_return_mean"] == pytest.approx(metrics["meta_test/post_adaptation_return"])
    completed = run_cli("report", "--suite", str(suite), "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    report = (results / "reports" / "tiny_meta" / "report.md").read_text()
    assert "| algorithm | seeds | pre-adaptation [95% CI] | post-adaptation [95% CI] | gain [95% CI] |" in report
    assert "| maml_vpg | 2 |" in report and "| pearl | 1 |" in report
