"""Synchronous collection by several workers (issue 29, in progress): C collectors of k envs
train exactly as one process with C*k envs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from test_seeds import parameters, transitions

import agents
from agents.api import ConfigError
from agents.envs import env_spec, make_vector_env
from benchmark.config import Budget, RunSpec
from benchmark.training.collectors import Collector, RayCollector, observe_rollout
from benchmark.training.control import seed_everything

SETTINGS = {
    "ppo": ("CartPole-v1", {"hidden_sizes": [32, 32], "num_steps": 16, "num_envs": 4, "num_minibatches": 2, "num_epochs": 2}),
    "a2c-box": ("Pendulum-v1", {"hidden_sizes": [32], "num_steps": 8, "num_envs": 4}),
    "trpo": ("CartPole-v1", {"hidden_sizes": [32], "num_steps": 16, "num_envs": 4, "value_epochs": 2, "value_num_minibatches": 2}),
}
ROLLOUTS = 4


def spec_of(case: str) -> RunSpec:
    env_id, overrides = SETTINGS[case]
    overrides = {**overrides, "normalize_observations": False, "normalize_rewards": False}  # normalized: test_normalized_collection
    algo = case.split("-")[0]
    return RunSpec("t", algo, env_id, 3, agents.resolve_config(algo, overrides).to_dict(), Budget(10_000, 10_000, 2), device="cpu")


def learner_of(spec: RunSpec):
    seed_everything(spec.seed)
    return agents.make(
        spec.algo, env_spec(spec.env_id), agents.resolve_config(spec.algo, spec.hyperparameters), total_steps=spec.budget.total_steps, seed=spec.seed
    )


def one_process(spec: RunSpec) -> list[list[torch.Tensor]]:
    """The run as one process steps it (C*k envs): parameters after each update."""
    algo = learner_of(spec)
    config = algo.config
    envs = make_vector_env(spec.env_id, config.num_envs)
    obs = torch.as_tensor(envs.reset(seed=spec.seed)[0], dtype=torch.float32)
    history = []
    while len(history) < ROLLOUTS:
        acted = algo.behavior_act(obs)
        step = envs.step(acted.env_actions)
        algo.observe(transitions(obs, acted, step))
        obs = torch.as_tensor(step[0], dtype=torch.float32)
        if algo.ready_to_update():
            algo.update()
            history.append(parameters(algo))
    envs.close()
    return history


def with_collectors(spec: RunSpec, collectors: list) -> list[list[torch.Tensor]]:
    algo = learner_of(spec)
    history = []
    for _ in range(ROLLOUTS):
        weights, state = algo.get_weights(), algo.acting_state()
        observe_rollout(algo, [collector.collect(weights, state, algo.config.num_steps) for collector in collectors])
        assert algo.ready_to_update()
        algo.update()
        history.append(parameters(algo))
    return history


@pytest.mark.parametrize("case", sorted(SETTINGS))
@pytest.mark.parametrize("count", [2, 4])
def test_c_collectors_of_k_envs_train_exactly_as_one_process_with_c_times_k(case, count):
    spec = spec_of(case)
    collectors = [Collector(spec, index, count) for index in range(count)]
    try:
        distributed = with_collectors(spec, collectors)
    finally:
        for collector in collectors:
            collector.close()
    for update, (theirs, ours) in enumerate(zip(one_process(spec), distributed, strict=True)):
        for mine, reference in zip(ours, theirs, strict=True):
            assert torch.equal(mine, reference), (case, count, update)


def test_collectors_as_ray_actors_give_the_same_updates():
    ray = pytest.importorskip("ray")
    spec = spec_of("ppo")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    try:
        distributed = with_collectors(spec, [RayCollector(spec, index, 2) for index in range(2)])
    finally:
        ray.shutdown()
    for theirs, ours in zip(one_process(spec), distributed, strict=True):
        assert all(torch.equal(mine, reference) for mine, reference in zip(ours, theirs, strict=True))


def test_what_collection_cannot_split_is_refused():
    spec = spec_of("ppo")
    with pytest.raises(ConfigError, match="num_envs 4 must split evenly over 3 collectors"):
        Collector(spec, 0, 3)
    with pytest.raises(ConfigError, match="at least one"):
        Collector(spec, 0, 0)
    recurrent = RunSpec(
        "t",
        "ppo",
        "CartPole-v1",
        0,
        agents.resolve_config("ppo", {"recurrent": "gru", "normalize_observations": False, "normalize_rewards": False}).to_dict(),
        Budget(100, 100, 1),
    )
    with pytest.raises(ConfigError, match="recurrent policy is not supported yet"):
        Collector(recurrent, 0, 1)


class Recorder:
    """A tracker that keeps what it is given."""

    def __init__(self):
        self.metrics: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, step):
        self.metrics.append((step, dict(metrics)))

    def flush(self):
        pass

    def logged(self, *names):
        return [(step, {k: v for k, v in metrics.items() if k in names}) for step, metrics in self.metrics if any(k in names for k in metrics)]


OFF_POLICY = {
    "sac": ("Pendulum-v1", {"hidden_sizes": [32, 32], "num_envs": 2, "batch_size": 16, "learning_starts": 40, "start_steps": 40}),
    "td3": ("Pendulum-v1", {"hidden_sizes": [32], "num_envs": 2, "batch_size": 16, "learning_starts": 40, "start_steps": 40}),
    "ddpg": ("Pendulum-v1", {"hidden_sizes": [32], "num_envs": 2, "batch_size": 16, "learning_starts": 40, "start_steps": 40, "exploration_noise": "ou"}),
    "dqn": ("CartPole-v1", {"hidden_sizes": [32], "num_envs": 2, "batch_size": 16, "learning_starts": 40, "exploration_fraction": 0.5}),
}


def loop_spec(algo: str, env_id: str, overrides: dict, budget: Budget, collectors: int | None) -> RunSpec:
    config = agents.resolve_config(algo, {**overrides, "normalize_observations": False, "normalize_rewards": False})
    distributed = {"collectors": collectors, "backend": "inline"} if collectors else None
    return RunSpec("t", algo, env_id, 3, config.to_dict(), budget, device="cpu", distributed=distributed)


@pytest.mark.parametrize("algo", ["ppo", *sorted(OFF_POLICY)])
def test_a_run_over_collectors_trains_and_logs_as_the_run_in_one_process(algo):
    """``loop.run`` of a spec with ``distributed: {collectors: 2}`` (inline): the same
    evaluations, the same training episodes logged at the same steps, the same losses as the
    spec in one process (on-policy: evaluations every two rollouts; off-policy: every step is
    a round, so anywhere)."""
    from benchmark import metric_names
    from benchmark.training import loop

    if algo == "ppo":
        env_id, overrides = SETTINGS["ppo"]
        rollout = overrides["num_steps"] * overrides["num_envs"]
        budget = Budget(6 * rollout + 3 * overrides["num_envs"], 2 * rollout, 3)  # the last round: 3 steps
    else:
        env_id, overrides = OFF_POLICY[algo]
        budget = Budget(600, 200, 2)
    runs = {}
    for collectors in (None, 2):
        tracker = Recorder()
        runs[collectors] = (loop.run(loop_spec(algo, env_id, overrides, budget, collectors), tracker=tracker), tracker)
    (alone, alone_log), (distributed, distributed_log) = runs[None], runs[2]
    assert [e.step for e in distributed.evaluations] == [e.step for e in alone.evaluations]
    assert len(alone.evaluations) == (4 if algo == "ppo" else 3)
    assert [e.returns for e in distributed.evaluations] == [e.returns for e in alone.evaluations]
    assert [(e.train_return_mean, e.train_episodes) for e in distributed.evaluations] == [(e.train_return_mean, e.train_episodes) for e in alone.evaluations]
    assert sum(e.train_episodes for e in distributed.evaluations) > 0
    episodes = (metric_names.TRAIN_EPISODE_RETURN, metric_names.TRAIN_EPISODE_LENGTH)
    assert distributed_log.logged(*episodes) == alone_log.logged(*episodes)
    losses = sorted({k for _, m in alone_log.metrics for k in m if k.startswith("train/")})
    assert losses and distributed_log.logged(*losses) == alone_log.logged(*losses)
    rates = distributed_log.logged("distributed/collector0/steps_per_second", "distributed/collector1/steps_per_second")
    assert len(rates) == len(alone.evaluations) and all(value > 0 for _, metrics in rates for value in metrics.values())


def test_distributed_settings_that_cannot_work_are_refused_in_one_line():
    from benchmark.config import check_distributed

    env_id, overrides = SETTINGS["ppo"]
    with pytest.raises(ConfigError, match="split evenly over 3 collectors"):
        loop_spec("ppo", env_id, overrides, Budget(100, 100, 1), 3)
    with pytest.raises(ConfigError, match=r"distributed.collectors must be an integer >= 1, got 0"):
        check_distributed({"collectors": 0}, "distributed")
    with pytest.raises(ConfigError, match="distributed.mode must be sync or async"):
        check_distributed({"mode": "fast"}, "distributed")
    with pytest.raises(ConfigError, match="unknown distributed key .colectors."):
        check_distributed({"colectors": 2}, "distributed")
    with pytest.raises(ConfigError, match="meta-learner"):
        RunSpec(
            "t",
            "maml_trpo",
            "reprorl/HalfCheetahVel-v5",
            0,
            agents.resolve_config("maml_trpo", {}).to_dict(),
            Budget(100, 100, 1),
            distributed={"collectors": 1},
        )
    with pytest.raises(ConfigError, match="learns from a dataset"):
        RunSpec("t", "bc", "CartPole-v1", 0, agents.resolve_config("bc", {}).to_dict(), Budget(100, 100, 1), distributed={"collectors": 1})
    with pytest.raises(ConfigError, match="trains one seed"):
        plain = agents.resolve_config("ppo", {"normalize_observations": False, "normalize_rewards": False}).to_dict()
        RunSpec("t", "ppo", env_id, 0, plain, Budget(100, 100, 1), seeds_per_process=2, distributed={})


class _Stop(Exception):
    pass


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_run_over_collectors_resumes_from_its_checkpoint_as_if_never_stopped(tmp_path, algo):
    """Stopped after 60% of its budget (the process 'dies') and resumed from ``latest.pt``,
    which holds every collector's envs: the evaluations and final weights of the run never
    stopped, which are those of the run in one process."""
    import dataclasses

    from benchmark.training import checkpoint, loop

    if algo == "ppo":
        env_id, overrides = SETTINGS["ppo"]
        rollout = overrides["num_steps"] * overrides["num_envs"]
        budget = Budget(6 * rollout, 2 * rollout, 2)
    else:
        env_id, overrides = OFF_POLICY[algo]
        budget = Budget(600, 200, 2)
    spec = dataclasses.replace(loop_spec(algo, env_id, overrides, budget, 2), checkpoint_every=budget.eval_every // 2, checkpoint_replay_buffer=True)

    def die(step, total, last_eval):
        if step >= total * 0.6:
            raise _Stop()

    with pytest.raises(_Stop):
        loop.run(spec, progress=die, checkpoint_dir=tmp_path / "b")
    payload = checkpoint.load(tmp_path / "b" / spec.run_key / checkpoint.LATEST)
    assert payload["exact"] and len(payload["collectors"]) == 2 and 0 < payload["loop"]["step"] < budget.total_steps
    resumed = loop.run(spec, checkpoint_dir=tmp_path / "b", resume=payload)
    uninterrupted = loop.run(spec, checkpoint_dir=tmp_path / "a")
    alone = loop.run(dataclasses.replace(spec, distributed=None), checkpoint_dir=tmp_path / "c")
    assert [(e.step, e.returns) for e in resumed.evaluations] == [(e.step, e.returns) for e in uninterrupted.evaluations]
    assert [(e.step, e.returns) for e in resumed.evaluations] == [(e.step, e.returns) for e in alone.evaluations]
    finals = [checkpoint.load(tmp_path / d / spec.run_key / checkpoint.FINAL)["algorithm"] for d in "abc"]
    assert all(equal(finals[0], final) for final in finals[1:])


def equal(a, b) -> bool:
    """Whether two states (nested dicts and lists of tensors and primitives) are identical."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


def test_a_one_process_checkpoint_does_not_resume_a_run_over_collectors(tmp_path):
    import dataclasses

    from benchmark.training import checkpoint, loop
    from benchmark.training.control import ResumeError

    env_id, overrides = SETTINGS["ppo"]
    rollout = overrides["num_steps"] * overrides["num_envs"]
    spec = loop_spec("ppo", env_id, overrides, Budget(4 * rollout, rollout, 2), 2)
    alone = dataclasses.replace(spec, distributed=None, checkpoint_every=rollout)

    def die(step, total, last_eval):
        if step >= total // 2:
            raise _Stop()

    with pytest.raises(_Stop):
        loop.run(alone, progress=die, checkpoint_dir=tmp_path)
    payload = checkpoint.load(tmp_path / spec.run_key / checkpoint.LATEST)
    with pytest.raises(ResumeError, match="written by a run in one process, not over collectors"):
        loop.run(spec, checkpoint_dir=tmp_path, resume=payload)


GRADIENT_CASES = {
    "ppo": ("CartPole-v1", {"hidden_sizes": [32, 32], "num_steps": 16, "num_envs": 4, "num_minibatches": 2, "num_epochs": 2}, PARTS_ALL := ("policy", "value")),
    "a2c": ("Pendulum-v1", {"hidden_sizes": [32], "num_steps": 8, "num_envs": 4}, PARTS_ALL),
    "trpo": ("CartPole-v1", {"hidden_sizes": [32], "num_steps": 16, "num_envs": 4, "value_epochs": 2, "value_num_minibatches": 2}, ("value",)),
}


@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
@pytest.mark.parametrize("count", [2, 3])
def test_gradients_averaged_over_g_workers_equal_one_gradient_on_the_whole_batch(monkeypatch, case, count):
    """A minibatch (the rollout for A2C, a value-fit minibatch for TRPO) split over G workers
    (3: shares of unequal size), their gradients weighted by share: the learner's gradient on
    the whole batch, advantages centered over the whole batch, up to float summation order
    (rtol 1e-5); the logs too."""
    from benchmark.training.gradient_workers import GradientWorkerGroup, WorkerSteps

    env_id, overrides, parts = GRADIENT_CASES[case]
    config = agents.resolve_config(case, {**overrides, "normalize_observations": False, "normalize_rewards": False})
    spec = RunSpec("t", case, env_id, 3, config.to_dict(), Budget(10_000, 10_000, 2), device="cpu")
    algo = learner_of(spec)
    envs = make_vector_env(env_id, config.num_envs)
    obs = torch.as_tensor(envs.reset(seed=3)[0], dtype=torch.float32)
    while not algo.ready_to_update():
        acted = algo.behavior_act(obs)
        step = envs.step(acted.env_actions)
        algo.observe(transitions(obs, acted, step))
        obs = torch.as_tensor(step[0], dtype=torch.float32)
    envs.close()
    algo.begin_update()
    from agents.algos.onpolicy import OneSeed

    one = OneSeed(algo)
    batch = next(iter(one.minibatches(2))) if case != "a2c" else one.full_batch()
    loss, info = algo.seeds_loss(algo.actor_critic, batch, parts)
    expected = dict(zip(algo.parameter_names(), torch.autograd.grad(loss.sum(), algo.parameters, allow_unused=True), strict=True))
    captured = {}
    monkeypatch.setattr(algo, "apply_gradients", lambda gradients: captured.update(gradients))
    algo.step_strategy = WorkerSteps(GradientWorkerGroup(spec, count, inline=True))
    logs = one.gradient_step(batch, parts)
    assert captured.keys() == expected.keys()
    for name, gradient in expected.items():
        if gradient is None:
            assert captured[name] is None, name
        else:
            torch.testing.assert_close(captured[name], gradient, rtol=1e-5, atol=1e-7, msg=name)
    assert logs.keys() == info.keys()
    for key in info:
        torch.testing.assert_close(logs[key], info[key], rtol=1e-5, atol=1e-7)


def test_a_run_with_gradient_workers_trains_as_the_run_in_one_process_up_to_float_order():
    """PPO over 2 collectors and 2 gradient workers (inline): the evaluations of the run in one
    process, and its final weights within 1e-4 (float sums in another order, 4 updates)."""
    from benchmark.training import loop

    env_id, overrides = SETTINGS["ppo"]
    rollout = overrides["num_steps"] * overrides["num_envs"]
    budget = Budget(4 * rollout, 2 * rollout, 3)
    alone = loop.run(loop_spec("ppo", env_id, overrides, budget, None))
    spec = loop_spec("ppo", env_id, overrides, budget, 2)
    spread = loop.run(
        RunSpec(
            spec.suite, spec.algo, spec.env_id, spec.seed, spec.hyperparameters, budget, device="cpu", distributed={**spec.distributed, "gradient_workers": 2}
        )
    )
    assert [(e.step, e.returns) for e in spread.evaluations] == [(e.step, e.returns) for e in alone.evaluations]


def test_the_example_plug_in_trains_over_collectors_and_gradient_workers_as_in_one_process():
    """REDQ (examples/redq, a plug-in deriving from SAC) over 2 collectors and 2 gradient
    workers (inline), through nothing but the learner interface: the evaluations of the run in
    one process up to float order (its gradients are summed in another order: 60 gradient steps)."""
    from benchmark.training import loop

    overrides = {"hidden_sizes": [16], "num_envs": 2, "num_critics": 4, "gradient_steps": 2, "learning_starts": 40, "start_steps": 40, "batch_size": 16}
    budget = Budget(100, 50, 2)
    alone = loop.run(loop_spec("redq", "Pendulum-v1", overrides, budget, None))
    spec = loop_spec("redq", "Pendulum-v1", overrides, budget, 2)
    spread = loop.run(replace(spec, distributed={**spec.distributed, "gradient_workers": 2}))
    assert [e.step for e in spread.evaluations] == [e.step for e in alone.evaluations] == [50, 100]
    for ours, theirs in zip(spread.evaluations, alone.evaluations, strict=True):
        assert ours.returns == pytest.approx(theirs.returns, rel=1e-5)


def test_gradient_workers_refuse_what_they_cannot_split():
    with pytest.raises(ConfigError, match="mpo's E-step optimizes its temperature over the whole batch"):
        RunSpec("t", "mpo", "Pendulum-v1", 0, agents.resolve_config("mpo", {}).to_dict(), Budget(100, 100, 1), distributed={"gradient_workers": 2})
    plain = agents.resolve_config("reinforce", {"normalize_observations": False, "normalize_rewards": False}).to_dict()
    with pytest.raises(ConfigError, match="counts whole episodes"):
        RunSpec("t", "reinforce", "CartPole-v1", 0, plain, Budget(100, 100, 1), distributed={"gradient_workers": 2})


OFF_POLICY_GRADIENTS = {
    "sac": ("Pendulum-v1", {"hidden_sizes": [32, 32], "num_envs": 2}),
    "td3": ("Pendulum-v1", {"hidden_sizes": [32], "num_envs": 2, "policy_delay": 1}),
    "ddpg": ("Pendulum-v1", {"hidden_sizes": [32], "num_envs": 2}),
    "dqn": ("CartPole-v1", {"hidden_sizes": [32], "num_envs": 2, "prioritized": True, "max_grad_norm": 0.01}),
    # the example plug-in (examples/redq): its random critic subset is a draw of num_critics per seed, not per row
    "redq": ("Pendulum-v1", {"hidden_sizes": [32], "num_envs": 2, "num_critics": 4, "gradient_steps": 2}),
}


def learner_with_replay(algo: str) -> tuple[RunSpec, Any]:
    """A learner of ``OFF_POLICY_GRADIENTS[algo]`` after 40 vector steps stored in its replay."""
    env_id, overrides = OFF_POLICY_GRADIENTS[algo]
    config = agents.resolve_config(algo, overrides)
    spec = RunSpec("t", algo, env_id, 3, config.to_dict(), Budget(10_000, 10_000, 2), device="cpu")
    learner = learner_of(spec)
    envs = make_vector_env(env_id, config.num_envs)
    obs = torch.as_tensor(envs.reset(seed=3)[0], dtype=torch.float32)
    for _ in range(40):
        acted = learner.behavior_act(obs)
        step = envs.step(acted.env_actions)
        learner.observe(transitions(obs, acted, step))
        obs = torch.as_tensor(step[0], dtype=torch.float32)
    envs.close()
    return spec, learner


@pytest.mark.parametrize("algo", sorted(OFF_POLICY_GRADIENTS))
@pytest.mark.parametrize("count", [2, 3])
def test_off_policy_gradients_over_g_workers_equal_one_gradient_step_on_the_whole_batch(algo, count):
    """A sampled batch of 32 split over G workers (3: unequal shares): the gradients of one
    process's step on the whole batch to 1e-5, its noise drawn for all rows (the generator ends
    in the same state), DQN's clipping (max norm 0.01: it binds) applied to the sum, and
    prioritized replay's TD errors in row order."""
    from benchmark.training.gradient_workers import GradientWorkerGroup, WorkerSteps

    spec, learner = learner_with_replay(algo)
    learner.num_updates = 4
    batch = learner.buffer.sample(32, learner.generator)
    start = learner.generator.get_state()
    expected, expected_logs = learner.gradient_list(batch)
    expected_errors, expected_end = learner.td_errors, learner.generator.get_state()
    learner.generator.set_state(start)
    applied = {}
    learner.apply_step = lambda gradients, indices, errors: applied.update(gradients=gradients, errors=errors)
    learner.step_strategy = WorkerSteps(GradientWorkerGroup(spec, count, inline=True))
    logs = learner.gradient_step(batch)
    gradients, errors = applied["gradients"], applied["errors"]
    assert torch.equal(learner.generator.get_state(), expected_end)
    assert len(gradients) == len(expected)
    for ours, theirs in zip(gradients, expected, strict=True):
        assert (ours is None) == (theirs is None)
        if theirs is not None:
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    if expected_errors is not None:
        torch.testing.assert_close(errors, expected_errors, rtol=1e-5, atol=1e-6)
    assert logs.keys() == expected_logs.keys()
    for key, value in expected_logs.items():
        assert logs[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("max_staleness,dropped", [(1, 0), (0, 2)])
def test_asynchronous_off_policy_gradient_workers_apply_each_gradient_with_the_priorities_of_its_own_batch(max_staleness, dropped):
    """DQN with prioritized replay, 2 asynchronous gradient workers (inline: they finish in the
    order they were given work), 5 gradient steps: the first waits for its own gradient, the
    next ones go out while older ones are in flight; each gradient is applied with the TD errors
    of the batch it came from, as computed at the weights it was sent with, and sets that
    batch's priorities. Staleness runs 0, 0, 1, 1, 1 (the last two applied by ``finish``);
    with max_staleness 0 the third is dropped, so the fourth (sent after the drop) is fresh
    and the fifth is dropped: two counted."""
    import copy

    from benchmark.training.gradient_workers import AsyncWorkerSteps, GradientWorkerGroup

    spec, learner = learner_with_replay("dqn")
    group = GradientWorkerGroup(spec, 2, inline=True)
    learner.step_strategy = AsyncWorkerSteps(group, max_staleness)
    applied: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = learner.apply_step

    def record(gradients, indices, td_errors):
        applied.append((indices.clone(), td_errors.clone()))
        original(gradients, indices, td_errors)

    learner.apply_step = record
    sent = []  # each batch's rows, and the TD errors one process computes on it at the weights sent with it
    checker = copy.deepcopy(learner)
    submit = group.submit

    def keep(index, call):
        weights, loss_state, batch = call[:3]
        checker.set_weights(weights)
        checker.load_loss_state(loss_state)
        checker.gradient_list(batch)
        sent.append((batch.indices, checker.td_errors))
        return submit(index, call)

    group.submit = keep
    for _ in range(5):
        learner.gradient_step(learner.buffer.sample(16, learner.generator))
    assert len(applied) == (3 if max_staleness else 2) and learner.num_updates == len(applied)
    learner.finish_steps()
    kept = [0, 1, 2, 3, 4] if max_staleness else [0, 1, 3]
    assert len(applied) == len(kept) and learner.num_updates == len(kept) and group.dropped == dropped
    for (indices, errors), k in zip(applied, kept, strict=True):
        assert torch.equal(indices, sent[k][0])
        torch.testing.assert_close(errors, sent[k][1], rtol=1e-5, atol=1e-6)
    assert group.report()["distributed/gradient_staleness_max"] == (1.0 if max_staleness else 0.0)


def test_off_policy_gradient_workers_refuse_a_cuda_learner_in_one_line():
    """Their noise is drawn on the CPU from the learner's generator: a CUDA learner is refused."""
    config = agents.resolve_config("sac", {"num_envs": 2})
    with pytest.raises(ConfigError, match="gradient workers draw the learner's noise on the CPU"):
        RunSpec("t", "sac", "Pendulum-v1", 0, config.to_dict(), Budget(100, 100, 1), device="cuda", distributed={"collectors": 1, "gradient_workers": 2})


@pytest.mark.parametrize("algo", ["sac", "dqn"])
def test_an_off_policy_run_with_gradient_workers_trains_as_the_run_in_one_process_up_to_float_order(algo):
    """Over 2 collectors and 2 gradient workers (inline), 600 steps with a gradient step each
    after the warm-up: the evaluation returns of the run in one process to 1e-3 (the gradients
    agree to float summation order, and 400 steps of updates compound it)."""
    from benchmark.training import loop

    env_id, overrides = OFF_POLICY[algo]
    budget = Budget(600, 200, 2)
    alone = loop.run(loop_spec(algo, env_id, overrides, budget, None))
    spec = loop_spec(algo, env_id, overrides, budget, 2)
    distributed = {**spec.distributed, "gradient_workers": 2}
    spread = loop.run(RunSpec(spec.suite, spec.algo, spec.env_id, spec.seed, spec.hyperparameters, budget, device="cpu", distributed=distributed))
    assert [e.step for e in spread.evaluations] == [e.step for e in alone.evaluations]
    for ours, theirs in zip(spread.evaluations, alone.evaluations, strict=True):
        assert ours.returns == pytest.approx(theirs.returns, rel=1e-3)
