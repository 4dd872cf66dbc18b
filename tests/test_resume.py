"""Checkpoint and resume: env snapshots, bit-identical continuation, atomic files, kill -9 via the CLI.

Which runs continue bit-for-bit after a resume: every algorithm here, on every env whose
state ``agents.env_state`` captures (classic control, MuJoCo, this project's envs), as long
as the checkpoint holds everything the next step reads: networks, optimizers, counters, all
RNG streams, the partial on-policy rollout, the envs' episodes, and (off-policy) the replay
buffer. Without the replay buffer (the default, since it can be GBs) an off-policy run refills
it from scratch and so differs; an env whose state cannot be captured restarts its episodes,
which also changes the numbers.
"""

import io
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from test_cli import ROOT, all_runs, run_cli

import agents
from agents.env_state import load_vector_env_state, vector_env_state
from agents.envs import make_vector_env
from benchmark.config import Budget, RunSpec, load_suite
from benchmark.training import checkpoint, seed_run
from benchmark.training import loop as training_loop
from benchmark.training.control import Preempted


def _roundtrip(payload):
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _random_actions(envs, count, seed=0):
    rng, space = np.random.default_rng(seed), envs.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        return [rng.integers(0, space.n, envs.num_envs) for _ in range(count)]
    return [rng.uniform(space.low, space.high, (envs.num_envs, *space.shape)).astype(np.float32) for _ in range(count)]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "Ant-v5", "reprorl/CartPoleNoVel-v1"])
def test_env_snapshot_continues_the_same_episodes(env_id):
    """Ant reads body positions (derived MuJoCo quantities) before it steps: those come back too."""
    envs = make_vector_env(env_id, 3, normalize_observations=True, normalize_rewards=True)
    envs.reset(seed=1)
    actions = _random_actions(envs, 150)
    for action in actions[:97]:
        envs.step(action)
    snapshot = _roundtrip(vector_env_state(envs))
    expected = [envs.step(action) for action in actions[97:]]

    fresh = make_vector_env(env_id, 3, normalize_observations=True, normalize_rewards=True)
    fresh.reset(seed=12345)
    load_vector_env_state(fresh, snapshot)
    for (obs, rewards, terminated, truncated, _), action in zip(expected, actions[97:]):
        got = fresh.step(action)
        for want, have in zip((obs, rewards, terminated, truncated), got[:4]):
            np.testing.assert_array_equal(have, want)


class _OpaqueStateEnv(gym.Env):
    """An env holding an object this module cannot serialize (like a Box2D world)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.world = object.__new__(type("World", (), {}))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_env_with_opaque_state_is_not_captured():
    envs = gym.vector.SyncVectorEnv([_OpaqueStateEnv, _OpaqueStateEnv])
    envs.reset(seed=0)
    assert vector_env_state(envs) is None


def test_rng_states_roundtrip():
    torch.manual_seed(3)
    np.random.seed(3)
    saved = _roundtrip(checkpoint.rng_state())
    expected = (torch.rand(3), np.random.rand(3), __import__("random").random())
    torch.manual_seed(99)
    np.random.seed(99)
    checkpoint.set_rng_state(saved)
    got = (torch.rand(3), np.random.rand(3), __import__("random").random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "run" / checkpoint.LATEST
    checkpoint.write_atomic({"step": 1}, path)

    def broken_save(payload, file):
        file.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.write_atomic({"step": 2}, path)
    assert checkpoint.load(path) == {"step": 1}
    assert [p.name for p in path.parent.iterdir()] == [checkpoint.LATEST]  # no temporary file left


class _StopAt(Exception):
    pass


def _spec(algo, env_id, total_steps, eval_every, replay_buffer=False, **hyperparameters):
    config = agents.resolve_config(algo, hyperparameters).to_dict()
    return RunSpec(
        "resume",
        algo,
        env_id,
        0,
        config,
        Budget(total_steps, eval_every, 2),
        "cpu",
        1,
        hyperparameters,
        checkpoint_every=eval_every // 2,
        checkpoint_replay_buffer=replay_buffer,
    )


def _interrupted_then_resumed(spec, directory, stop_fraction=0.6):
    """Train until ``stop_fraction`` of the budget (the process 'dies'), then resume from the
    last checkpoint; returns the resumed result and the step it resumed from."""

    def die(step, total, last_eval):
        if step >= total * stop_fraction:
            raise _StopAt()

    with pytest.raises(_StopAt):
        training_loop.run(spec, progress=die, checkpoint_dir=directory)
    payload = checkpoint.load(directory / spec.run_key / checkpoint.LATEST)
    return training_loop.run(spec, checkpoint_dir=directory, resume=payload), payload["loop"]["step"]


RESUMABLE = [
    # rollouts of 100 x 2 steps: the checkpoint at 3072 falls 36 steps into one, saved with it
    ("ppo", "CartPole-v1", 6144, 2048, {"num_envs": 2, "num_steps": 100, "num_minibatches": 4, "num_epochs": 2}),
    ("sac", "Pendulum-v1", 1200, 400, {"learning_starts": 200, "batch_size": 64, "hidden_sizes": [32, 32]}),
    ("dqn", "CartPole-v1", 3000, 1000, {"learning_starts": 300, "batch_size": 32, "hidden_sizes": [32]}),
]


@pytest.mark.parametrize("algo,env_id,total_steps,eval_every,hyperparameters", RESUMABLE, ids=[r[0] for r in RESUMABLE])
def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(tmp_path, algo, env_id, total_steps, eval_every, hyperparameters):
    spec = _spec(algo, env_id, total_steps, eval_every, replay_buffer=True, **hyperparameters)
    uninterrupted = training_loop.run(spec, checkpoint_dir=tmp_path / "a")
    resumed, resumed_from = _interrupted_then_resumed(spec, tmp_path / "b")
    assert 0 < resumed_from < total_steps
    assert [(e.step, e.returns) for e in resumed.evaluations] == [(e.step, e.returns) for e in uninterrupted.evaluations]
    final_a = checkpoint.load(tmp_path / "a" / spec.run_key / checkpoint.FINAL)["algorithm"]
    final_b = checkpoint.load(tmp_path / "b" / spec.run_key / checkpoint.FINAL)["algorithm"]
    for name, module_state in (final_a.get("modules") or {"actor_critic": final_a["actor_critic"]}).items():
        other = (final_b.get("modules") or {"actor_critic": final_b["actor_critic"]})[name]
        assert all(torch.equal(module_state[key], other[key]) for key in module_state), name
    assert not (tmp_path / "b" / spec.run_key / checkpoint.LATEST).exists()  # the final checkpoint replaces it


def test_resume_without_replay_buffer_refills_it_and_trains_to_the_budget(tmp_path):
    spec = _spec("sac", "Pendulum-v1", 1200, 400, learning_starts=200, batch_size=64, hidden_sizes=[32, 32])
    payload_dir = tmp_path / "run"
    resumed, resumed_from = _interrupted_then_resumed(spec, payload_dir)
    assert resumed_from == 600
    assert [e.step for e in resumed.evaluations] == [400, 800, 1200]
    final = checkpoint.load(payload_dir / spec.run_key / checkpoint.FINAL)["algorithm"]
    # one update per step after learning_starts (200), none while the empty buffer refills to 200
    assert final["env_steps"] == 1200 and final["num_updates"] == (1200 - 200) - 200


def test_resume_restarts_episodes_when_the_env_state_cannot_be_captured(tmp_path, monkeypatch):
    """The episodes in progress end as truncated at the checkpoint, bootstrapped from the value
    of their last observation; training reaches the budget."""
    monkeypatch.setattr(seed_run, "vector_env_state", lambda envs: None)
    seen = []
    original = agents.algos.onpolicy.OnPolicyAlgorithm.interrupt_episodes

    def spy(self, final_obs, state=None):
        t = self.storage.step - 1
        before = (self.storage.terminated[t] | self.storage.truncated[t]).clone()
        original(self, final_obs, state)
        expected_values = self._values(final_obs, state)
        seen.append((self.storage.step, before, self.storage.truncated[t].clone(), self.storage.truncation_values[t].clone(), expected_values))

    monkeypatch.setattr(agents.algos.onpolicy.OnPolicyAlgorithm, "interrupt_episodes", spy)
    spec = _spec("ppo", "CartPole-v1", 6144, 2048, num_envs=2, num_steps=100, num_minibatches=4, num_epochs=2)
    resumed, resumed_from = _interrupted_then_resumed(spec, tmp_path)
    assert resumed_from == 3072
    ((stored, ended_before, truncated, values, expected),) = seen
    assert stored == (3072 // 2) % 100 == 36
    assert bool(truncated.all())  # every episode ends at the restart
    running = ~ended_before
    assert bool(running.any()) and torch.equal(values[running], expected[running])
    assert [e.step for e in resumed.evaluations] == [2048, 4096, 6144]


def test_sigterm_writes_a_checkpoint_and_stops_the_run(tmp_path):
    """What a scheduler's pre-emption (or the runner stopping its workers) does: the loop
    finishes its step, writes latest.pt and raises Preempted; the old handler is restored."""
    spec = _spec("ppo", "CartPole-v1", 100_000, 100_000, num_envs=1, num_steps=64, num_minibatches=1, num_epochs=1)

    sent_at = []

    def terminate(step, total, last_eval):  # called about every 1,000 steps
        if step >= 1000 and not sent_at:
            sent_at.append(step)
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted, match="stopped by SIGTERM at env step") as stopped:
        training_loop.run(spec, progress=terminate, checkpoint_dir=tmp_path)
    assert f"env step {sent_at[0]};" in str(stopped.value)  # the step it was in, not later
    assert signal.getsignal(signal.SIGTERM) is previous
    assert checkpoint.load(tmp_path / spec.run_key / checkpoint.LATEST)["loop"]["step"] == sent_at[0]


# -- through the CLI: kill -9 mid-run, then re-launch ------------------------------------------

RESUME_SUITE = """\
seeds: [0]
budget: {total_steps: 10000, eval_every: 2000, eval_episodes: 2}
checkpoint: {every: 3000}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 1, num_steps: 256, num_minibatches: 4, num_epochs: 4}
"""


def test_a_run_killed_with_sigkill_resumes_in_its_mlflow_run(write_suite, tmp_path):
    """SIGKILL to the whole process group mid-training; the re-launch continues from the last
    checkpoint in the same MLflow run, logs no metric step twice, trains exactly the budget,
    and ends with the evaluations of an uninterrupted run."""
    suite = write_suite(RESUME_SUITE)
    spec = load_suite(str(suite)).specs[0]
    results = tmp_path / "results"
    argv = ["run", "--suite", str(suite), "--results-dir", str(results)]
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmark", *argv],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latest = results / "checkpoints" / spec.run_key / checkpoint.LATEST
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if latest.exists() and checkpoint.load(latest)["loop"]["step"] >= 3000:
                break
            assert process.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoint past step 3000")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    killed_at = checkpoint.load(latest)["loop"]["step"]
    uri = f"sqlite:///{results / 'mlflow.db'}"
    _, runs = all_runs(uri)
    (child,) = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert child.info.status == "RUNNING"  # nobody was left to close it

    completed = run_cli(*argv, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr
    assert f"from its checkpoint at env step {killed_at:,}" in completed.stdout
    client, runs = all_runs(uri)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert [r.info.run_id for r in children] == [child.info.run_id]  # the same MLflow run
    parents = sorted((r for r in runs if "mlflow.parentRunId" not in r.data.tags), key=lambda r: r.info.start_time)
    assert [p.info.status for p in parents] == ["KILLED", "FINISHED"]  # the dead invocation is closed
    assert "marked KILLED" in completed.stdout
    resumed = children[0]
    assert resumed.info.status == "FINISHED"
    assert resumed.data.tags["resume_count"] == "1" and resumed.data.tags["resumed_from_step"] == str(killed_at)
    for key in resumed.data.metrics:
        steps = [m.step for m in client.get_metric_history(resumed.info.run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged a step twice"  # one env: at most one value per step
    evaluations = client.get_metric_history(resumed.info.run_id, "eval/return_mean")
    assert sorted(m.step for m in evaluations) == list(range(2000, 10001, 2000))

    uninterrupted = training_loop.run(spec)
    by_step = {m.step: m.value for m in evaluations}
    assert [by_step[e.step] for e in uninterrupted.evaluations] == [e.mean for e in uninterrupted.evaluations]


TINY_PPO = """\
name: tinyppo
seeds: [0, 1]
budget: {total_steps: 2048, eval_every: 1024, eval_episodes: 2}
checkpoint: {every: 512}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 2, num_steps: 64, num_minibatches: 2, num_epochs: 2, hidden_sizes: [16, 16]}
"""


def _interrupted_checkpoint(spec, checkpoint_dir, run_id):
    """An interrupted run's latest.pt in ``checkpoint_dir``, owned by MLflow run ``run_id``."""

    def die(step, total, last_eval):
        if step >= 1200:
            raise _StopAt()

    with pytest.raises(_StopAt):
        training_loop.run(spec, progress=die, checkpoint_dir=checkpoint_dir, checkpoint_metadata={"run_id": run_id})
    return checkpoint_dir / spec.run_key / checkpoint.LATEST


def test_a_checkpoint_that_cannot_be_used_is_kept_aside_and_the_run_starts_over(write_suite, tmp_path):
    """An unreadable file (a disk error, say: seed 0) or one this code cannot restore (another
    format: seed 1) never blocks the suite: each run starts over, its file kept as latest.pt.bad."""
    from benchmark import tracking

    suite, results = write_suite(TINY_PPO), tmp_path / "results"
    results.mkdir()
    uri = f"sqlite:///{results / 'mlflow.db'}"
    experiment = tracking.experiment_id(uri, "tinyppo", results / "mlartifacts")
    specs = load_suite(str(suite)).specs
    stale, latest = {}, {}
    for spec in specs:
        stale[spec.seed] = MlflowClient(uri).create_run(experiment, tags={"run_key": spec.run_key}).info.run_id
        latest[spec.seed] = _interrupted_checkpoint(spec, results / "checkpoints", stale[spec.seed])
    latest[0].write_bytes(b"not a checkpoint")
    payload = checkpoint.load(latest[1])
    payload["format"] = 99
    checkpoint.write_atomic(payload, latest[1])

    completed = run_cli("run", "--suite", str(suite), "--workers", "2", "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "cannot read the checkpoint of ppo/CartPole-v1/seed0" in completed.stdout
    assert "cannot resume ppo/CartPole-v1/seed1 from its checkpoint" in completed.stdout
    _, runs = all_runs(uri)
    for spec in specs:
        assert latest[spec.seed].with_suffix(".pt.bad").exists() and not latest[spec.seed].exists()
        finished = [r for r in runs if r.data.tags.get("run_key") == spec.run_key and r.info.status == "FINISHED"]
        assert len(finished) == 1 and finished[0].info.run_id != stale[spec.seed]
