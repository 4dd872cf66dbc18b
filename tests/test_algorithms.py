"""The interface contract, for every registered algorithm on every action space it supports."""

import dataclasses
import io
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import agents
from agents.algos.offpolicy import OffPolicyAlgorithm
from agents.api import ConfigError, Transitions
from agents.envs import env_spec
from agents.registry import REGISTRY

ON_POLICY = {"num_steps": 16, "hidden_sizes": [16, 16]}
SMALL = {
    "ppo": {**ON_POLICY, "num_minibatches": 2, "num_epochs": 2},
    "ppo_kl": {**ON_POLICY, "num_minibatches": 2, "num_epochs": 2},
    "surrogate_pg": {**ON_POLICY, "num_minibatches": 2, "num_epochs": 2},
    "vpg": {**ON_POLICY, "value_epochs": 2, "value_num_minibatches": 2},
    "reinforce": ON_POLICY,
    "a2c": {**ON_POLICY, "num_envs": 1},
    "trpo": {**ON_POLICY, "value_epochs": 2, "value_num_minibatches": 2},
    "sac": {"start_steps": 4, "learning_starts": 8, "batch_size": 8, "hidden_sizes": [16, 16], "buffer_size": 1000},
    "ddpg": {"learning_starts": 8, "batch_size": 8, "hidden_sizes": [16, 16], "buffer_size": 1000},
    "td3": {"start_steps": 4, "learning_starts": 8, "batch_size": 8, "hidden_sizes": [16, 16], "buffer_size": 1000},
    "dqn": {"learning_starts": 8, "batch_size": 8, "hidden_sizes": [16, 16], "buffer_size": 1000, "update_every": 1},
    "mpo": {"learning_starts": 8, "batch_size": 8, "hidden_sizes": [16, 16], "buffer_size": 1000, "num_action_samples": 4},
    "bc": {"batch_size": 16, "minibatches_per_epoch": 2, "hidden_sizes": [16, 16]},
}
_EXPERTS = Path(tempfile.mkdtemp(prefix="bc-experts-"))


def bc_expert(env_id: str) -> str:
    """A small random dataset of ``env_id``'s observations and actions for bc to clone."""
    path = _EXPERTS / f"{env_id.replace('/', '_')}.npz"
    if not path.exists():
        spec, rng = env_spec(env_id), np.random.default_rng(0)
        actions = rng.integers(0, spec.num_actions, 64) if spec.discrete else rng.uniform(-1, 1, (64, *spec.action_shape))
        np.savez(path, observations=rng.normal(size=(64, *spec.observation_shape)).astype(np.float32), actions=actions)
    return str(path)


SEQUENCES = {"batch_size": 4, "sequence_length": 4, "burn_in": 2, "recurrent_size": 8}
#: replay and network variants, each checked against the whole contract
VARIANTS = {
    "dqn-dueling-per-nstep": ("dqn", "CartPole-v1", {"dueling": True, "prioritized": True, "n_step": 3}),
    "dqn-gru": ("dqn", "CartPole-v1", {"recurrent": "gru", **SEQUENCES}),
    "dqn-her": ("dqn", "reprorl/BitFlipping5-v0", {"her_strategy": "future"}),
    "sac-discrete-her-final": ("sac", "reprorl/BitFlipping5-v0", {"her_strategy": "final", "her_k": 2}),
    "sac-lstm": ("sac", "Pendulum-v1", {"recurrent": "lstm", **SEQUENCES}),
    "sac-per-ere": ("sac", "Pendulum-v1", {"prioritized": True, "emphasize_recent": True, "ere_c_min": 4}),
    "sac-3-critics-extractors": ("sac", "Pendulum-v1", {"num_critics": 3, "obs_extractor_sizes": [8], "act_extractor_sizes": [4]}),
    "ddpg-ou-nstep": ("ddpg", "Pendulum-v1", {"exploration_noise": "ou", "n_step": 2}),
    "td3-per": ("td3", "Pendulum-v1", {"prioritized": True}),
    "mpo-shared-constraint": ("mpo", "Pendulum-v1", {"per_dim_constraints": False}),
    "ppo-gru-sequences": ("ppo", "CartPole-v1", {"recurrent": "gru", "recurrent_size": 8, "sequence_length": 4}),
    "ppo-lstm-shared-pendulum": ("ppo", "Pendulum-v1", {"recurrent": "lstm", "recurrent_size": 8, "shared_network": True, "num_minibatches": 1}),
    "ppo-multidiscrete": ("ppo", "reprorl/MultiDiscreteMatch-v0", {"anneal_clip_range": True}),
    "ppo_kl-lstm-multidiscrete": ("ppo_kl", "reprorl/MultiDiscreteMatch-v0", {"recurrent": "lstm", "recurrent_size": 8, "sequence_length": 8}),
    "trpo-gru-pendulum": ("trpo", "Pendulum-v1", {"recurrent": "gru", "recurrent_size": 8, "sequence_length": 8}),
    "trpo-multidiscrete-max-entropy": (
        "trpo",
        "reprorl/MultiDiscreteMatch-v0",
        {"entropy_method": "max", "entropy_coef": 0.1, "use_softplus_entropy": True},
    ),
    "vpg-shared-regularized": ("vpg", "CartPole-v1", {"shared_network": True, "entropy_method": "regularized", "entropy_coef": 0.01}),
    "a2c-adam-lstm-pendulum": ("a2c", "Pendulum-v1", {"optimizer": "adam", "recurrent": "lstm", "recurrent_size": 8}),
    "reinforce-positive-adv": ("reinforce", "CartPole-v1", {"center_adv": True, "positive_adv": True}),
}
#: our online learners (the meta-learners' contract is in test_meta.py; an installed plug-in's,
#: such as the example's redq, in its own tests)
ONLINE = {name: agents.algorithm_class(name) for name in REGISTRY if issubclass(agents.algorithm_class(name), agents.Algorithm)}
CASES = [
    pytest.param(name, env_id, {}, id=f"{name}-{env_id}")
    for name, cls in sorted(ONLINE.items())
    for env_id in ("CartPole-v1", "Pendulum-v1")
    if (cls.Config.supports_discrete if env_spec(env_id).discrete else cls.Config.supports_continuous)
] + [pytest.param(*variant, id=label) for label, variant in VARIANTS.items()]


def test_every_algorithm_is_covered():
    assert {case.values[0] for case in CASES} == set(ONLINE)


def build(name: str, env_id: str, variant: dict | None = None, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    expert = {"expert": bc_expert(env_id)} if name == "bc" else {}
    return agents.make(name, env_spec(env_id), {**SMALL[name], **expert, **(variant or {}), **overrides}, total_steps=1000, seed=seed)


def feed(algo, env_id: str, steps: int, seed: int = 0) -> None:
    """Random-observation transitions until the algorithm is ready to update."""
    spec = env_spec(env_id)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        obs = torch.randn(1, *spec.observation_shape, generator=generator)
        acted = algo.act(obs)
        algo.observe(
            Transitions(
                obs,
                acted,
                torch.randn(1, generator=generator),
                torch.randn(1, *spec.observation_shape, generator=generator),
                torch.zeros(1, dtype=torch.bool),
                torch.rand(1, generator=generator) < 0.1,
            )
        )


def one_batch(algo):
    """A training batch as the algorithm's own update would draw it."""
    if hasattr(algo, "storage"):
        algo.storage.compute_returns(torch.zeros(algo.config.num_envs), algo.config.gamma, algo.config.gae_lambda)
        return next(algo.minibatches(1))
    if algo.name == "bc":
        return algo.epoch_batch()
    return algo.buffer.sample(algo.config.batch_size, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name,env_id,variant", CASES)
def test_act_shapes_and_bounds(name, env_id, variant):
    algo, spec = build(name, env_id, variant), env_spec(env_id)
    obs = torch.randn(5, *spec.observation_shape)
    for deterministic in (False, True):
        acted = algo.act(obs, deterministic=deterministic)
        assert acted.actions.shape[0] == 5 and len(acted.env_actions) == 5
        if not spec.discrete:
            assert np.all(acted.env_actions >= np.array(spec.action_low)) and np.all(acted.env_actions <= np.array(spec.action_high))
    torch.testing.assert_close(algo.act(obs, deterministic=True).actions, algo.act(obs, deterministic=True).actions)


@pytest.mark.parametrize("name,env_id,variant", CASES)
def test_update_changes_weights_and_reports_finite_losses(name, env_id, variant):
    algo = build(name, env_id, variant)
    before = algo.get_weights()
    step = 0
    while not algo.ready_to_update():
        feed(algo, env_id, 1, seed=step)  # fresh draws each step, so some episodes end
        step += 1
    logs = algo.update()
    assert logs and all(np.isfinite(value) for value in logs.values())
    after = algo.get_weights()
    assert any(not torch.equal(before[net][key], after[net][key]) for net in before for key in before[net])


@pytest.mark.parametrize("name,env_id,variant", CASES)
def test_state_dict_round_trip_through_plain_tensors(name, env_id, variant):
    trained = build(name, env_id, variant, seed=0)
    feed(trained, env_id, 16)
    trained.update()
    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # tensors and primitives only, no pickled objects

    restored = build(name, env_id, variant, seed=1)
    restored.load_state_dict(state)
    obs = torch.randn(7, *env_spec(env_id).observation_shape)
    torch.testing.assert_close(restored.act(obs, deterministic=True).actions, trained.act(obs, deterministic=True).actions)


@pytest.mark.parametrize("name,env_id,variant", CASES)
def test_get_set_weights(name, env_id, variant):
    source, target = build(name, env_id, variant, seed=0), build(name, env_id, variant, seed=1)
    target.set_weights(source.get_weights())
    obs = torch.randn(4, *env_spec(env_id).observation_shape)
    torch.testing.assert_close(target.act(obs, deterministic=True).actions, source.act(obs, deterministic=True).actions)
    with pytest.raises(KeyError, match="no network"):
        target.set_weights({"nonexistent": {}})


@pytest.mark.parametrize("name,env_id,variant", CASES)
def test_gradients_computed_on_one_learner_apply_on_another(name, env_id, variant):
    """The distributed path: a worker computes gradients, the learner applies them."""
    learner, worker = build(name, env_id, variant, seed=0), build(name, env_id, variant, seed=1)
    feed(learner, env_id, 16)
    worker.load_state_dict(learner.state_dict())
    batch = one_batch(learner)
    torch.manual_seed(3)  # SAC's losses draw reparameterized actions
    gradients, info = worker.compute_gradients(batch)
    assert info and all(np.isfinite(v) for v in info.values())
    torch.manual_seed(3)
    local_gradients, _ = learner.compute_gradients(batch)
    assert list(gradients) == learner.parameter_names() and len(set(gradients)) == len(gradients)  # by name, every parameter once
    for name, remote in gradients.items():
        torch.testing.assert_close(remote, local_gradients[name])
    # what travels is keyed by name: its order does not matter, an unknown name is refused
    learner.apply_gradients(dict(reversed(list(gradients.items()))))
    worker.apply_gradients(local_gradients)
    for net, weights in learner.get_weights().items():
        for key, value in weights.items():
            torch.testing.assert_close(worker.get_weights()[net][key], value)
    with pytest.raises(ValueError, match="gradients of unknown parameters nope"):
        learner.apply_gradients({"nope": None})


@pytest.mark.parametrize("name,env_id,variant", CASES)
def test_update_parameter(name, env_id, variant):
    algo = build(name, env_id, variant)
    parameter = algo.tunable_parameters[0]
    algo.update_parameter(parameter, 1e-5)
    assert getattr(algo.config, parameter) == 1e-5
    with pytest.raises(ConfigError, match="cannot update 'no_such_parameter'"):
        algo.update_parameter("no_such_parameter", 1.0)
    with pytest.raises(ConfigError, match=parameter):
        algo.update_parameter(parameter, -1.0)


def test_learning_rate_update_reaches_the_optimizer():
    algo = build("ppo", "CartPole-v1")
    algo.update_parameter("learning_rate", 1e-5)
    assert algo.optimizers["joint"].param_groups[0]["lr"] == 1e-5
    vpg = build("vpg", "CartPole-v1")
    vpg.update_parameter("value_lr", 2e-5)
    assert vpg.optimizers["value"].param_groups[0]["lr"] == 2e-5 and vpg.optimizers["policy"].param_groups[0]["lr"] == 3e-4


@pytest.mark.parametrize("name", sorted(n for n, cls in ONLINE.items() if issubclass(cls, OffPolicyAlgorithm)))
def test_each_declared_learning_rate_reaches_its_optimizer_and_no_other(name):
    """Off-policy learning rates reach optimizers by declaration (``learning_rates``), not by
    the hyperparameter's name: each declared one changes its group's optimizer alone."""
    env_id = "CartPole-v1" if name == "dqn" else "Pendulum-v1"
    cls = ONLINE[name]
    assert cls.learning_rates and set(cls.learning_rates) <= set(cls.tunable_parameters)
    for parameter, group in cls.learning_rates.items():
        algo = build(name, env_id)
        assert group in algo.groups and parameter in {f.name for f in dataclasses.fields(cls.Config)}
        before = {g: opt.param_groups[0]["lr"] for g, (_, opt) in algo.groups.items() if opt is not None}
        algo.update_parameter(parameter, 1.234e-5)
        after = {g: opt.param_groups[0]["lr"] for g, (_, opt) in algo.groups.items() if opt is not None}
        assert after == {**before, group: 1.234e-5}, (parameter, before, after)


def test_learning_rate_and_clip_range_schedules_anneal_linearly():
    """anneal_lr / anneal_clip_range scale the configured value by the fraction of updates left,
    and a value set through update_parameter is annealed from then on."""
    algo = agents.make("ppo", env_spec("CartPole-v1"), {**SMALL["ppo"], "anneal_lr": True, "anneal_clip_range": True}, total_steps=64)  # 4 updates of 16 steps
    learning_rates, clip_ranges = [], []
    for _ in range(3):
        feed(algo, "CartPole-v1", 16)
        clip_ranges.append(algo.clip_range)
        learning_rates.append(algo.update()["learning_rate"])
    assert learning_rates == pytest.approx([3e-4, 2.25e-4, 1.5e-4])
    assert clip_ranges == pytest.approx([0.2, 0.15, 0.1])
    algo.update_parameter("learning_rate", 1e-3)
    algo.update_parameter("clip_range", 0.4)
    assert algo.optimizers["joint"].param_groups[0]["lr"] == pytest.approx(0.25e-3) and algo.clip_range == pytest.approx(0.1)


@pytest.mark.parametrize(
    "name,bad,message",
    [
        ("ppo", {"learning_rate": 0}, "must be > 0"),
        ("ppo", {"clip_range": -0.1}, "must be > 0"),
        ("ppo", {"gamma": 1.5}, "must be <= 1"),
        ("ppo", {"num_epochs": 0}, "must be >= 1"),
        ("ppo", {"activation": "swish"}, "must be one of"),
        ("ppo", {"learnin_rate": 1e-3}, "unknown hyperparameter 'learnin_rate'.*did you mean 'learning_rate'"),
        ("sac", {"tau": 2.0}, "must be <= 1"),
        ("sac", {"batch_size": 1.5}, "must be an integer"),
        ("sac", {"hidden_sizes": 256}, "must be a list"),
        ("sac", {"alpha": -0.2}, "must be > 0"),
        ("vpg", {"entropy_coef": 0.1}, "entropy_coef is 0.1 but entropy_method is 'no_entropy'"),
        ("ppo", {"entropy_method": "maximum"}, "'entropy_method' must be one of"),
        ("trpo", {"max_kl": 0}, "'max_kl' must be > 0"),
        ("ppo", {"recurrent": "rnn"}, "'recurrent' must be one of"),
        ("ppo", {"recurrent": "gru", "num_steps": 100, "sequence_length": 30}, "sequence_length 30 must divide num_steps 100"),
        ("a2c", {"optimizer": "sgd"}, "'optimizer' must be one of"),
    ],
)
def test_bad_hyperparameters_rejected(name, bad, message):
    with pytest.raises(ConfigError, match=message):
        agents.resolve_config(name, bad)


@pytest.mark.parametrize("name", ["ddpg", "td3", "mpo"])
def test_continuous_only_algorithms_refuse_discrete_actions(name):
    with pytest.raises(ConfigError, match=f"{name} needs continuous"):
        agents.make(name, env_spec("CartPole-v1"), total_steps=10)


def test_dqn_refuses_continuous_actions():
    with pytest.raises(ConfigError, match="dqn needs discrete actions"):
        agents.make("dqn", env_spec("Pendulum-v1"), total_steps=10)


def test_the_registry_names_each_learner_with_its_own_config():
    """The torch-free table (name -> Config, ``module:Class``) agrees with the learner classes it
    points to, and a Config's capabilities are what its learner refuses by."""
    assert len(REGISTRY) == 17 and set(REGISTRY) <= set(agents.ALGORITHMS)  # (and installed plug-ins: the example's redq)
    for name, (config_class, _) in REGISTRY.items():
        cls = agents.algorithm_class(name)
        assert cls.name == name and cls.Config is config_class is agents.config_class(name), name
        assert agents.is_meta(name) == issubclass(cls, agents.MetaAlgorithm), name


def test_unknown_algorithm_lists_choices():
    with pytest.raises(
        ConfigError, match="unknown algorithm 'ppo2'.*available: a2c, bc, ddpg, dqn, maml_ppo, maml_trpo, maml_vpg, mpo, pearl, ppo, ppo_kl, .*reinforce"
    ):
        agents.algorithm_class("ppo2")
    with pytest.raises(ConfigError, match="unknown algorithm 'ppo2'.*did you mean"):
        agents.config_class("ppo2")


@pytest.mark.parametrize(
    "name,overrides,message",
    [
        ("trpo", {"shared_network": True}, "trpo needs separate policy and value networks"),
        ("ppo", {"num_minibatches": 64}, "num_minibatches is 64 but a rollout has only 16 samples"),
        ("ppo", {"recurrent": "gru", "sequence_length": 8, "num_minibatches": 4}, "only 2 sequences"),
        ("ppo", {"sequence_length": 8}, "sequence_length applies only to recurrent policies"),
        ("vpg", {"value_num_minibatches": 17}, "value_num_minibatches is 17"),
    ],
)
def test_inconsistent_on_policy_settings_rejected(name, overrides, message):
    with pytest.raises(ConfigError, match=message):
        build(name, "CartPole-v1", overrides)


@pytest.mark.parametrize("name", ["dqn", "sac", "ddpg"])
def test_off_policy_algorithms_refuse_multi_discrete_actions(name):
    with pytest.raises(ConfigError, match=rf"{name} cannot act in .*MultiDiscrete\(\[2, 3, 4\]\)"):
        agents.make(name, env_spec("reprorl/MultiDiscreteMatch-v0"), total_steps=10)
