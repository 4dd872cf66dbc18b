"""Gradient steps captured as CUDA graphs (``agents.algos.graphs``, the ``cuda_graphs`` option):
replays equal the eager steps (emulated on the CPU, real on a GPU), and what cannot be captured is
refused in one line before anything runs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

import agents
from agents.envs import env_spec
from agents.errors import ConfigError
from benchmark import config as suite_config

CAPTURED = {
    "sac": ("Pendulum-v1", {"hidden_sizes": [32, 32], "batch_size": 16, "start_steps": 20, "learning_starts": 20}),
    "sac-discrete": ("CartPole-v1", {"hidden_sizes": [32, 32], "batch_size": 16, "start_steps": 20, "learning_starts": 20, "num_critics": 3}),
    "sac-per": (
        "Pendulum-v1",
        {"hidden_sizes": [32], "batch_size": 16, "learning_starts": 20, "prioritized": True, "n_step": 3, "gradient_steps": 2},
    ),
    "td3": ("Pendulum-v1", {"hidden_sizes": [32, 32], "batch_size": 16, "start_steps": 20, "learning_starts": 20, "num_envs": 2}),
    "ddpg": ("Pendulum-v1", {"hidden_sizes": [32, 32], "batch_size": 16, "learning_starts": 20, "critic_weight_decay": 0.01}),
}


def _capturing(monkeypatch, algo: str, emulate: bool, batches: list) -> None:
    """Every seed batch of ``algo`` built from now on takes its steps captured."""
    cls = agents.algorithm_class(algo).seed_batch
    init = cls.__init__

    def captured(self, members):
        init(self, members)
        self.capture_steps(emulate=emulate)
        batches.append(self)

    monkeypatch.setattr(cls, "__init__", captured)


def _eager_and_captured(monkeypatch, case: str, emulate: bool):
    """``case`` trained by ``tests.test_seeds.train`` (three seeds batched, 60 steps) with eager
    steps, then with captured ones: each training's (history, members), and the captured batch."""
    from tests.test_seeds import train

    algo = case.split("-")[0]
    env_id, overrides = CAPTURED[case]
    eager = train(algo, env_id, overrides, 60, batched=True)
    batches: list = []
    _capturing(monkeypatch, algo, emulate, batches)
    captured = train(algo, env_id, overrides, 60, batched=True)
    (batch,) = batches
    return eager, captured, batch


@pytest.mark.parametrize("case", sorted(CAPTURED))
def test_captured_gradient_steps_replay_the_eager_ones_exactly(monkeypatch, case):
    """Emulated on the CPU: the batch, the noise drawn in the eager order and the Python state
    go through the static buffers and bookkeeping of a captured step; every update's logs and
    parameters equal the eager batch's bit for bit, three seeds apart as ever."""
    (eager, eager_members), (captured, members), batch = _eager_and_captured(monkeypatch, case, emulate=True)
    algo = batch.members[0].name
    assert batch.captured.replays >= 20  # most steps were replays, not warm-up
    assert len(batch.captured.graphs) == (2 if algo == "td3" else 1)  # TD3: the delayed steps are a phase of their own
    if algo == "sac":  # its exploring actions are captured too, once the warm-up's uniform ones end
        policy_acted = "start_steps" in CAPTURED[case][1]
        assert (batch.captured_acting.replays >= 30) == policy_acted and len(batch.captured_acting.graphs) == policy_acted
    else:  # DDPG's and TD3's noise is drawn member by member (an OU process may carry state)
        assert batch.captured_acting is None
    assert len(eager) == len(captured)
    for (eager_logs, eager_parameters), (captured_logs, captured_parameters) in zip(eager, captured, strict=True):
        assert eager_logs == captured_logs
        for seed_eager, seed_captured in zip(eager_parameters, captured_parameters, strict=True):
            for mine, theirs in zip(seed_captured, seed_eager, strict=True):
                assert torch.equal(mine, theirs)
    assert [member.num_updates for member in members] == [member.num_updates for member in eager_members]
    assert [float(optimizer.steps[0]) for optimizer in batch.optimizers.values()] == [
        float(next(iter(eager_members[0].groups[name][1].state.values()))["step"]) for name in batch.optimizers
    ]


def _filled_sac_batch(monkeypatch, batches: list, hidden: int = 32):
    from tests.test_seeds import build

    _capturing(monkeypatch, "sac", True, batches)
    env_id, overrides = CAPTURED["sac"]
    members = [build("sac", env_id, seed, {**overrides, "hidden_sizes": [hidden, hidden], "learning_starts": 1}, 1000)[0] for seed in (0, 1)]
    batch = agents.algorithm_class("sac").seed_batch(members)
    for member in members:
        for _ in range(20):
            member.observe(_transitions(torch.randn(1, *member.spec.observation_shape), member))
        member.steps_since_update = 0  # from here, one gradient step per update
    return members, batch


def _update(members, batch) -> list:
    for member in members:
        member.steps_since_update += 1
    return batch.update()


def test_a_new_learning_rate_captures_a_new_graph_and_old_graphs_are_let_go(monkeypatch):
    """Each rate held for 4 steps (3 eager, then a capture): 6 rates, the last MAX_GRAPHS kept."""
    from agents.algos import graphs

    batches: list = []
    members, batch = _filled_sac_batch(monkeypatch, batches)
    for step in range(24):
        if step % 4 == 0:
            for member in members:
                member.update_parameter("critic_lr", 1e-4 * (1 + step // 4))
        _update(members, batch)
    captured = batches[0].captured
    assert captured.replays == 6 and len(captured.graphs) == graphs.MAX_GRAPHS == 4
    for step in range(40):  # a rate moved at every step: never captured, and only the latest keys remembered
        for member in members:
            member.update_parameter("critic_lr", 1e-6 * (1 + step))
        _update(members, batch)
    assert captured.replays == 6 and len(captured.eager_steps) == graphs.KEYS_REMEMBERED and len(captured.tapes) <= graphs.KEYS_REMEMBERED
    assert [key[1][0] for key in captured.graphs] == [pytest.approx(1e-4 * rate) for rate in (3, 4, 5, 6)]  # the critic's rates


def test_an_emulated_replay_refuses_what_a_graph_cannot_capture(monkeypatch):
    """A step that reads a tensor on the host (here an ``.item()`` slipped into SAC's loss) runs
    eagerly, but its emulated replay fails as a real capture would."""
    from agents.algos.sac import SAC

    batches: list = []
    members, batch = _filled_sac_batch(monkeypatch, batches, hidden=256)  # the CPU's oneDNN layers pass
    for _ in range(5):
        _update(members, batch)
    assert batches[0].captured.replays == 2
    gradients = SAC.seeds_gradients

    def reads_the_host(self, networks, encoded, tools):
        found = gradients(self, networks, encoded, tools)
        found[1]["critic_loss"].sum().item()
        return found

    monkeypatch.setattr(SAC, "seeds_gradients", reads_the_host)
    with pytest.raises(RuntimeError, match="a CUDA graph cannot capture aten._local_scalar_dense"):
        _update(members, batch)


def test_captured_acting_gives_the_eager_actions_and_refuses_host_reads(monkeypatch):
    """SAC's exploring actions through the emulated graph equal the eager batch's bit for bit,
    each seed's generator drawn in the same order; a host read slipped into them fails."""
    from agents.algos.sac import SACSeedBatch
    from tests.test_seeds import build

    env_id, overrides = CAPTURED["sac"]

    def batch_of(capture: bool):
        members = [build("sac", env_id, seed, {**overrides, "start_steps": 0}, 1000)[0] for seed in (0, 1)]
        batch = agents.algorithm_class("sac").seed_batch(members)
        if capture:
            batch.capture_steps(emulate=True)
        return batch

    eager, captured = batch_of(False), batch_of(True)
    for obs in torch.randn(6, 2, 1, 3):
        for mine, theirs in zip(captured.act(list(obs)), eager.act(list(obs)), strict=True):
            assert torch.equal(mine.actions, theirs.actions)
    assert captured.captured_acting.replays == 3 and eager.captured_acting is None
    # captured outside inference mode: a later capture outside it can update what this one made
    (graph,) = captured.captured_acting.graphs.values()
    assert not any(tensor.is_inference() for tensor in (graph.inputs["obs"], graph.noise))
    for mine, theirs in zip(captured.generators, eager.generators, strict=True):
        assert torch.equal(mine.get_state(), theirs.get_state())
    policy_actions = SACSeedBatch.policy_actions

    def reads_the_host(self, obs):
        actions = policy_actions(self, obs)
        actions.sum().item()
        return actions

    monkeypatch.setattr(SACSeedBatch, "policy_actions", reads_the_host)
    with pytest.raises(RuntimeError, match="a CUDA graph cannot capture aten._local_scalar_dense"):
        captured.act(list(torch.randn(2, 1, 3)))


def _transitions(obs, member):
    from agents.api import Transitions

    acted = member.behavior_act(obs)
    return Transitions(
        obs=obs,
        acted=acted,
        rewards=torch.randn(1),
        next_obs=torch.randn_like(obs),
        terminated=torch.zeros(1, dtype=torch.bool),
        truncated=torch.zeros(1, dtype=torch.bool),
    )


def test_capture_refuses_what_it_cannot_capture():
    from tests.test_seeds import build

    members = [build("mpo", "Pendulum-v1", seed, {"hidden_sizes": [8]}, 100)[0] for seed in (0, 1)]
    with pytest.raises(ConfigError, match="cuda_graphs: mpo's gradient steps cannot be captured"):
        agents.algorithm_class("mpo").seed_batch(members).capture_steps(emulate=True)
    with pytest.raises(ConfigError, match="cuda_graphs: CUDA graphs need a GPU, and this run trains on cpu"):
        sac = [build("sac", "Pendulum-v1", seed, {"hidden_sizes": [8]}, 100)[0] for seed in (0, 1)]
        agents.algorithm_class("sac").seed_batch(sac).capture_steps()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", ["sac", "td3"])
def test_cuda_graph_steps_equal_the_eager_steps_on_a_gpu(monkeypatch, case):
    """Real capture and replay: the same kernels on the same numbers."""
    monkeypatch.setattr("tests.test_seeds.build", _on_cuda(monkeypatch))
    (eager, _), (captured, _), batch = _eager_and_captured(monkeypatch, case, emulate=False)
    assert batch.captured.replays >= 20
    assert case != "sac" or batch.captured_acting.replays >= 30
    for (eager_logs, eager_parameters), (captured_logs, captured_parameters) in zip(eager, captured, strict=True):
        for seed_eager_logs, seed_captured_logs in zip(eager_logs, captured_logs, strict=True):
            assert seed_eager_logs.keys() == seed_captured_logs.keys()
            np.testing.assert_allclose(list(seed_captured_logs.values()), list(seed_eager_logs.values()), rtol=1e-6)
        for seed_eager, seed_captured in zip(eager_parameters, captured_parameters, strict=True):
            for mine, theirs in zip(seed_captured, seed_eager, strict=True):
                torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)


def _on_cuda(monkeypatch):
    def build(algo, env_id, seed, overrides, total_steps):
        torch.manual_seed(seed)
        config = agents.resolve_config(algo, overrides)
        return agents.make(algo, env_spec(env_id), config, total_steps=total_steps, seed=seed, device="cuda"), config

    return build


def _suite(tmp_path, algo: str, extra: str = "", hyperparameters: str = "{hidden_sizes: [8]}") -> str:
    path = tmp_path / "graphs.yaml"
    lines = [
        "name: graphs",
        "seeds: [0]",
        "budget: {total_steps: 200, eval_every: 100, eval_episodes: 1}",
        *extra.splitlines(),
        "experiments:",
        f"  - {{algo: {algo}, envs: [Pendulum-v1], hyperparameters: {hyperparameters}}}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("algo", "extra", "hyperparameters", "message"),
    [
        (
            "ppo",
            "cuda_graphs: true",
            "{hidden_sizes: [8]}",
            "cuda_graphs: ppo's gradient steps cannot be captured (those of ddpg, ",
        ),  # (and installed plug-ins')
        ("sac", "cuda_graphs: true\ndevice: cpu", "{hidden_sizes: [8]}", "cuda_graphs: CUDA graphs need a GPU, and the device is cpu"),
        ("sac", "cuda_graphs: true", "{recurrent: gru}", "cuda_graphs: sac's recurrent encoder cannot be captured (set recurrent: none)"),
        ("sac", "cuda_graphs: yes please", "{hidden_sizes: [8]}", "cuda_graphs must be true or false, got 'yes please'"),
    ],
)
def test_a_suite_that_asks_for_what_cannot_be_captured_is_refused(tmp_path, algo, extra, hyperparameters, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        suite_config.load_suite(_suite(tmp_path, algo, extra, hyperparameters))


def test_cuda_graphs_are_not_part_of_the_run_key_and_travel_with_the_spec(tmp_path):
    plain = suite_config.load_suite(_suite(tmp_path, "sac")).specs[0]
    captured = suite_config.load_suite(_suite(tmp_path, "sac", "cuda_graphs: true")).specs[0]
    assert captured.cuda_graphs and not plain.cuda_graphs
    assert captured.run_key == plain.run_key
    assert suite_config.RunSpec.from_dict(captured.to_dict()) == captured
    assert suite_config.load_suite(_suite(tmp_path, "td3")).with_cuda_graphs(True).specs[0].cuda_graphs


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_run_with_cuda_graphs_on_a_machine_without_a_gpu_is_one_line_and_stores_nothing(tmp_path):
    suite = _suite(tmp_path, "sac")
    completed = subprocess.run(
        [sys.executable, "-m", "benchmark", "run", "--suite", suite, "--cuda-graphs", "--results-dir", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == ["error: cuda_graphs: this machine has no GPU that torch can use"]
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_run_with_cuda_graphs_trains_through_the_loop_as_its_stacked_run(monkeypatch, algo):
    """The loop's side: a run alone with ``cuda_graphs`` trains as a seed batch of one whose
    steps are captured (emulated here), and evaluates exactly as the same run with its critics
    stacked and its steps eager."""
    from agents.algos.offpolicy_batch import OffPolicySeedBatch
    from benchmark.config import Budget, RunSpec
    from benchmark.training import loop as training_loop

    env_id, overrides = CAPTURED[algo]
    spec = RunSpec("t", algo, env_id, 3, agents.resolve_config(algo, overrides).to_dict(), Budget(200, 100, 2), device="auto")
    if torch.cuda.is_available():
        pytest.skip("on a GPU the run would capture for real: test_cuda_graph_steps_equal_the_eager_steps_on_a_gpu covers it")
    monkeypatch.setenv("REPRORL_CRITICS", "stacked")
    eager = training_loop.run(spec)
    capture = OffPolicySeedBatch.capture_steps
    captured_batches: list = []

    def emulated(self, emulate=False):
        capture(self, emulate=True)
        captured_batches.append(self)

    monkeypatch.setattr(OffPolicySeedBatch, "capture_steps", emulated)
    monkeypatch.setenv("REPRORL_CRITICS", "separate")  # cuda_graphs stacks the critics whatever this says
    captured = training_loop.run(dataclasses.replace(spec, cuda_graphs=True))
    assert captured_batches and captured_batches[0].captured.replays > 100
    assert algo != "sac" or captured_batches[0].captured_acting.replays > 100
    assert [e.step for e in captured.evaluations] == [e.step for e in eager.evaluations] == [100, 200]
    for mine, theirs in zip(captured.evaluations, eager.evaluations, strict=True):
        assert mine.returns == theirs.returns
