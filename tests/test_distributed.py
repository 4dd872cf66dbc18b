"""A run over collectors as users launch it (issue 29): the suite key and ``--distributed``
through the real CLI, MLflow, bad settings refused, and a collector actor that dies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli_in_process as run_cli
from mlflow.tracking import MlflowClient

import agents
from benchmark.config import Budget, RunSpec

SUITE = """
name: spread
seeds: [0]
budget: {total_steps: 512, eval_every: 256, eval_episodes: 2}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 4, num_steps: 32, num_minibatches: 2, num_epochs: 2, hidden_sizes: [16, 16],
                      normalize_observations: false, normalize_rewards: false}
"""


def children(results: Path):
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return client, [run for run in runs if "mlflow.parentRunId" in run.data.tags]


def instances(monkeypatch, cls) -> list:
    """Every ``cls`` built from now on in this process, in order."""
    built = []
    original = cls.__init__

    def keep(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(cls, "__init__", keep)
    return built


class Recorder:
    """A tracker keeping every value logged, by metric."""

    def __init__(self):
        self.values: dict[str, list[float]] = {}

    def log_metrics(self, metrics, step):
        for key, value in metrics.items():
            self.values.setdefault(key, []).append(value)

    def flush(self):
        pass


def small_ppo(num_epochs: int = 1) -> dict:
    """A small PPO on CartPole that collectors can split (2 envs, no normalization)."""
    small = {"num_envs": 2, "num_steps": 32, "num_minibatches": 2, "num_epochs": num_epochs, "hidden_sizes": [16]}
    return agents.resolve_config("ppo", {**small, "normalize_observations": False, "normalize_rewards": False}).to_dict()


def test_a_suite_run_over_collectors_is_one_mlflow_run_that_equals_the_run_in_one_process(write_suite, tmp_path):
    suite = write_suite(SUITE)
    spread = write_suite(SUITE.replace("name: spread", "name: spread\ndistributed: {collectors: 2, backend: inline}"), "spread.yaml")
    finished = {}
    for name, path in (("alone", suite), ("spread", spread)):
        results = tmp_path / name
        completed = run_cli("run", "--suite", str(path), "--results-dir", str(results), cwd=tmp_path)
        assert completed.returncode == 0, completed.stderr
        client, runs = children(results)
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"
        finished[name] = (client, runs[0])
    (client, alone), (spread_client, run) = finished["alone"], finished["spread"]
    assert run.data.tags["run_key"] == alone.data.tags["run_key"]  # how it was spread is not what it is
    assert "distributed/collector0/steps_per_second" in run.data.metrics and "distributed/collector1/steps_per_second" in run.data.metrics

    def evaluations(store, child):
        return [(m.step, m.value) for m in store.get_metric_history(child.info.run_id, "eval/return_mean")]

    assert evaluations(client, alone) == evaluations(spread_client, run) and len(evaluations(client, alone)) == 2
    config = json.loads(Path(spread_client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))).read_text())
    assert config["distributed"]["collectors"] == 2 and config["distributed"]["backend"] == "inline"


@pytest.mark.parametrize(
    "flag,problem",
    [
        ("collectors=3", "num_envs 4 must split evenly over 3 collectors"),
        ("colectors=2", "unknown distributed key 'colectors'"),
        ("collectors=0", "collectors must be an integer >= 1, got 0"),
        ("collectors", "--distributed: 'collectors' is not KEY=VALUE"),
        ("backend=mpi", "distributed.backend must be ray or inline"),
        ("mode=async,gradient_workers=3", "max_staleness 1 would drop most gradients of 3 asynchronous gradient workers"),
    ],
)
def test_distributed_settings_that_cannot_work_are_refused_in_one_line_before_anything_is_stored(write_suite, tmp_path, flag, problem):
    suite = write_suite(SUITE)
    results = tmp_path / "results"
    completed = run_cli("run", "--suite", str(suite), "--distributed", flag, "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode != 0
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and problem in lines[0], completed.stderr
    assert not (results / "mlflow.db").exists()


@pytest.fixture
def own_ray():
    """Ray started by the test is shut down after it (other tests start it their own way)."""
    ray = pytest.importorskip("ray")
    started = ray.is_initialized()
    yield ray
    if not started and ray.is_initialized():
        ray.shutdown()


def test_a_collector_actor_that_dies_is_replaced_and_the_run_finishes(monkeypatch, own_ray):
    """Collector 0's actor is killed after the first evaluation: the group starts another (its
    envs start new episodes), it collects the round again, and the run reaches its budget;
    ``distributed/collector_restarts`` counts it."""
    ray = own_ray
    from benchmark.training import collectors, loop
    from benchmark.training.distributed import COLLECTOR_RESTARTS

    groups = instances(monkeypatch, collectors.CollectorGroup)
    spec = RunSpec("t", "ppo", "CartPole-v1", 0, small_ppo(), Budget(512, 128, 2), device="cpu", distributed={"collectors": 2})
    killed = []

    def kill_once(step, total, last_eval):
        if last_eval is not None and not killed:
            ray.kill(groups[0].handles[0].actor)
            killed.append(step)

    recorder = Recorder()
    result = loop.run(spec, tracker=recorder, progress=kill_once)
    assert killed and result.evaluations[-1].step == 512
    assert groups[0].restarts == 1 and recorder.values[COLLECTOR_RESTARTS] == [1.0]


def test_a_normalized_run_over_ray_collectors_equals_the_inline_one_and_outlives_a_dead_collector(monkeypatch, own_ray):
    """PPO normalizing observations and rewards over 2 Ray collectors, in lock-step with the
    learner's statistics: its first evaluation is the inline run's (which equals one process:
    test_normalized_collection); collector 1's actor is then killed, the group replaces it in
    the next round (its envs start new episodes, its draws catch up), and the run finishes."""
    ray = own_ray
    from benchmark.training import collectors, loop
    from benchmark.training.distributed import COLLECTOR_RESTARTS

    small = {"num_envs": 2, "num_steps": 32, "num_minibatches": 2, "num_epochs": 1, "hidden_sizes": [16]}
    config = agents.resolve_config("ppo", {**small, "normalize_observations": True, "normalize_rewards": True}).to_dict()
    budget = Budget(256, 128, 2)
    inline = loop.run(RunSpec("t", "ppo", "Pendulum-v1", 0, config, budget, device="cpu", distributed={"collectors": 2, "backend": "inline"}))
    groups = instances(monkeypatch, collectors.CollectorGroup)
    killed = []

    def kill_once(step, total, last_eval):
        if last_eval is not None and not killed:
            ray.kill(groups[0].handles[1].actor)
            killed.append(step)

    recorder = Recorder()
    result = loop.run(RunSpec("t", "ppo", "Pendulum-v1", 0, config, budget, device="cpu", distributed={"collectors": 2}), tracker=recorder, progress=kill_once)
    assert killed and result.evaluations[0].returns == inline.evaluations[0].returns
    assert result.evaluations[-1].step == 256 and groups[0].restarts == 1 and recorder.values[COLLECTOR_RESTARTS] == [1.0]


SLOW = """
name: spreadslow
seeds: [0]
budget: {total_steps: 6144, eval_every: 1024, eval_episodes: 2}
checkpoint: {every: 512}
distributed: {collectors: 2}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 4, num_steps: 64, num_minibatches: 2, num_epochs: 4, hidden_sizes: [32, 32],
                      normalize_observations: false, normalize_rewards: false}
"""


def launch_slow(write_suite, tmp_path):
    """``benchmark run`` of the SLOW suite in a session of its own: the suite file, the results
    directory, the run's spec, where its ``latest.pt`` goes, and the process."""
    from test_launches import launch

    from benchmark.config import load_suite
    from benchmark.training import checkpoint

    pytest.importorskip("ray")
    suite, results = write_suite(SLOW, "slow.yaml"), tmp_path / "results"
    spec = load_suite(str(suite)).specs[0]
    return suite, results, spec, results / "checkpoints" / spec.run_key / checkpoint.LATEST, launch(suite, results)


RAY_AGENTS = {"ray::DashboardA", "ray::RuntimeEnv"}
"""Ray's dashboard and runtime-env agents (command names as the kernel cuts them): after the
raylet dies they flush their logs through the GCS and exit, about a minute later."""


def session_processes(session: int, seconds: float) -> list[str]:
    """The processes still in ``session`` (the launch's, which its children share, Ray's
    included) after waiting up to ``seconds`` for them to end; their command names."""
    import os
    import time

    deadline = time.monotonic() + seconds
    while True:
        left = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getsid(int(entry.name)) == session and "Z" not in (entry / "stat").read_text().split(")")[-1][:3]:
                        left.append((entry / "comm").read_text().strip())
                except (OSError, ProcessLookupError):
                    pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_a_run_over_ray_collectors_is_preempted_by_a_sigterm_and_resumes_exactly_after_a_sigkill(write_suite, tmp_path):
    """A SIGTERM to the launch's whole process group (as a shell's timeout or a batch scheduler
    sends it) once a checkpoint exists: the pool's queue manager outlives it until the launch
    has stopped its workers, and Ray's GCS and raylet (a group of their own) outlive it, so the
    run writes its preemption checkpoint with every collector's envs, the command exits 143
    with the run KILLED in MLflow, and no Ray process outlives the launch. Then a SIGKILL of the
    relaunch (its workers, the Ray instance they started and the collector actors) once it has
    checkpointed past the preemption, after which no Ray process stays: the next relaunch resumes the run in its MLflow run from
    that checkpoint, with every collector's envs restored, and its evaluations are those of the
    run never stopped (trained inline in this process)."""
    import dataclasses
    import os
    import signal

    from test_launches import assert_each_key_finished_once, launch, wait_for

    from benchmark.cli.common import EXIT_TERMINATED
    from benchmark.training import checkpoint, loop

    suite, results, spec, latest, process = launch_slow(write_suite, tmp_path)
    try:
        wait_for(latest.exists, process, seconds=300)
        periodic = checkpoint.load(latest)["loop"]["step"]
        os.killpg(process.pid, signal.SIGTERM)
        code = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    stderr = process.stderr.read()
    assert code == EXIT_TERMINATED, stderr
    payload = checkpoint.load(latest)
    preempted = payload["loop"]["step"]
    assert periodic <= preempted < spec.budget.total_steps and payload["exact"], stderr
    _, runs = children(results)
    assert [run.info.status for run in runs] == ["KILLED"], stderr
    assert not session_processes(process.pid, seconds=30)

    process = launch(suite, results)
    try:
        wait_for(lambda: (checkpoint.step_of(latest) or 0) > preempted, process, seconds=300)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    # Ray's GCS, raylet and workers (another group) end with the launch's workers; its dashboard
    # and runtime-env agents exit on their own about a minute later (checked in test_executors)
    assert not set(session_processes(process.pid, seconds=30)) - RAY_AGENTS
    stopped_at = checkpoint.load(latest)["loop"]["step"]
    assert preempted < stopped_at < spec.budget.total_steps
    completed = run_cli("run", "--suite", str(suite), "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert f"from its checkpoint at env step {stopped_at:,}" in completed.stdout
    assert_each_key_finished_once(results, suite)
    client, runs = children(results)
    resumed = [(m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, "eval/return_mean")]
    never_stopped = loop.run(dataclasses.replace(spec, distributed={**spec.distributed, "backend": "inline"}))
    assert sorted(resumed) == [(e.step, e.mean) for e in never_stopped.evaluations]


def test_ray_gradient_workers_train_as_inline_ones_even_when_one_dies(monkeypatch, own_ray):
    """PPO over 2 Ray collectors and 2 Ray gradient workers, one worker killed after the first
    evaluation: a worker keeps nothing between steps, so its replacement differentiates the
    share again and the run equals the same run with inline workers."""
    ray = own_ray
    from benchmark.training import gradient_workers, loop

    groups = instances(monkeypatch, gradient_workers.GradientWorkerGroup)

    def spec(backend):
        return RunSpec(
            "t",
            "ppo",
            "CartPole-v1",
            0,
            small_ppo(2),
            Budget(384, 128, 2),
            device="cpu",
            distributed={"collectors": 2, "gradient_workers": 2, "backend": backend},
        )

    killed = []

    def kill_once(step, total, last_eval):
        if last_eval is not None and not killed:
            ray.kill(groups[-1].workers[1])
            killed.append(step)

    spread = loop.run(spec("ray"), progress=kill_once)
    assert killed and groups[-1].restarts == 1
    inline = loop.run(spec("inline"))
    assert [(e.step, e.returns) for e in spread.evaluations] == [(e.step, e.returns) for e in inline.evaluations]


# `make test` trains the row with asynchronous gradient workers, which runs every part the row
# without them does (asynchronous collectors, their staleness bound, a collector replaced) and
# more; the row whose gradients are computed in the driver is left to `make test-all` (that path
# trains in every other run of the suite).
@pytest.mark.learning
@pytest.mark.parametrize("gradient_workers", [pytest.param(0, marks=pytest.mark.extended), 2])
def test_asynchronous_ppo_over_ray_collectors_solves_cartpole_with_bounded_staleness(monkeypatch, own_ray, gradient_workers):
    """The smoke suite's PPO on CartPole over 2 asynchronous collectors (max_staleness 1), and
    2 asynchronous gradient workers: no rollout (gradient) used was more than one update (step)
    old, some were one old (nobody waited); a collector killed a quarter into the run is
    replaced and the run goes on to 475 (it stops at the first evaluation that reaches it after
    the kill: the claim is the score, and the rest of the 100k steps would only add evaluations)."""
    import dataclasses

    from conftest import Reached, stop_once

    ray = own_ray
    from benchmark.config import load_suite
    from benchmark.training import collectors, loop

    groups = instances(monkeypatch, collectors.CollectorGroup)
    spec = load_suite("smoke").select(["ppo"]).specs[0]
    spec = dataclasses.replace(spec, distributed={"collectors": 2, "mode": "async", "max_staleness": 1, "gradient_workers": gradient_workers})
    recorder = Recorder()
    killed = []

    def kill_once(step, total, last_eval):
        if step >= total // 4 and not killed:
            ray.kill(groups[0].handles[1].actor)
            killed.append(step)

    callback, seen = stop_once(lambda evaluation: bool(killed) and evaluation.step > killed[0] and evaluation.mean >= 475.0)
    with pytest.raises(Reached):
        loop.run(spec, tracker=recorder, progress=kill_once, on_evaluation=callback)
    logged = recorder.values
    assert killed and groups[0].restarts == 1 and seen[-1].step > killed[0] and seen[-1].mean >= 475.0
    assert max(logged["distributed/staleness_max"]) <= 1.0
    assert max(logged["distributed/staleness_mean"]) > 0.0  # rollouts acted with last update's weights were used
    if gradient_workers:
        assert max(logged["distributed/gradient_staleness_max"]) <= 1.0 and max(logged["distributed/gradient_staleness_mean"]) > 0.0


@pytest.mark.extended  # make test-all: the rule's arithmetic is tested inline (test_normalized_collection); ~20 s of Ray here
def test_asynchronous_normalized_collectors_act_on_the_learners_statistics_which_absorb_every_step_used(monkeypatch, own_ray):
    """PPO normalizing observations and rewards over 2 asynchronous Ray collectors (the stated
    rule: statistics sent with the weights, raw steps absorbed on arrival): the learner's
    observation statistics count the 2 envs' first observations and every step of every rollout
    it used, none of those it dropped; the run ends with finite returns."""
    from benchmark.training import loop, normalized_collection

    joined = instances(monkeypatch, normalized_collection.JoinedNormalization)
    small = {"num_envs": 2, "num_steps": 32, "num_minibatches": 2, "num_epochs": 1, "hidden_sizes": [16]}
    config = agents.resolve_config("ppo", {**small, "normalize_observations": True, "normalize_rewards": True}).to_dict()
    distributed = {"collectors": 2, "mode": "async", "max_staleness": 1}
    recorder = Recorder()
    result = loop.run(RunSpec("t", "ppo", "CartPole-v1", 0, config, Budget(512, 256, 2), device="cpu", distributed=distributed), tracker=recorder)
    assert result.evaluations[-1].step == 512 and all(abs(value) < 1e6 for value in result.evaluations[-1].returns)
    count = joined[0].state()["statistics"]["obs_rms"]["count"].item()
    assert count == pytest.approx(2 + 512 + 1e-4)
    assert recorder.values["distributed/staleness_max"][-1] <= 1.0


@pytest.mark.parametrize("gradient_workers", [0, 2])
def test_asynchronous_off_policy_collectors_feed_the_replay_buffer_with_their_priorities(monkeypatch, own_ray, gradient_workers):
    """DQN with prioritized replay over 2 asynchronous Ray collectors (Ape-X): chunks of 8
    vector steps, each transition's initial priority its one-step TD error computed by the
    collector (not the buffer's maximum); every chunk is at most one round old, none dropped;
    the run reaches its budget and evaluates. With 2 asynchronous gradient workers, every
    gradient step is applied (at most one step stale) or dropped and counted, each with the
    priorities of its own batch, none left in flight at the end."""
    from agents.algos.offpolicy import OffPolicyAlgorithm
    from benchmark.training import loop

    given, steps, applied = [], [], []
    original = OffPolicyAlgorithm.prioritize_newest
    original_step, original_apply = OffPolicyAlgorithm.gradient_step, OffPolicyAlgorithm.apply_step

    def record(self, td_errors):
        given.append(td_errors.clone())
        original(self, td_errors)

    def count_step(self, batch):
        steps.append(batch.indices.clone())
        return original_step(self, batch)

    def count_apply(self, gradients, indices, td_errors):
        applied.append((indices.clone(), td_errors is not None and td_errors.shape == indices.shape))
        original_apply(self, gradients, indices, td_errors)

    monkeypatch.setattr(OffPolicyAlgorithm, "prioritize_newest", record)
    monkeypatch.setattr(OffPolicyAlgorithm, "gradient_step", count_step)
    monkeypatch.setattr(OffPolicyAlgorithm, "apply_step", count_apply)
    overrides = {"hidden_sizes": [32], "num_envs": 4, "batch_size": 16, "learning_starts": 200, "prioritized": True}
    config = agents.resolve_config("dqn", overrides)
    settings = {"collectors": 2, "mode": "async", "chunk": 8, "max_staleness": 1, "gradient_workers": gradient_workers}
    spec = RunSpec("t", "dqn", "CartPole-v1", 0, config.to_dict(), Budget(1600, 800, 2), device="cpu", distributed=settings)
    recorder = Recorder()
    result = loop.run(spec, tracker=recorder)
    logged = recorder.values
    assert [e.step for e in result.evaluations] == [800, 1600]
    assert len(given) == 1600 // 4 and all(errors.shape == (4,) for errors in given)  # one vector step each
    assert len({round(float(value), 6) for errors in given for value in errors}) > 100  # TD errors, not one maximum
    assert max(logged["distributed/staleness_max"]) == 1.0 and logged["distributed/dropped_rollouts"][-1] == 0.0
    assert len(steps) > 100 and all(with_errors for _, with_errors in applied)
    if gradient_workers:
        dropped = logged["distributed/dropped_gradients"][-1]
        assert len(applied) + dropped == len(steps) and max(logged["distributed/gradient_staleness_max"]) <= 1.0
        sent = {tuple(indices.tolist()) for indices in steps}
        assert all(tuple(indices.tolist()) in sent for indices, _ in applied)
    else:
        assert [indices.tolist() for indices, _ in applied] == [indices.tolist() for indices in steps]


@pytest.mark.learning
@pytest.mark.extended  # some 200 s of two cores: make test-all
def test_asynchronous_sac_with_asynchronous_gradient_workers_solves_pendulum(own_ray):
    """The classic suite's SAC on Pendulum-v1 for 12k steps (the first 12k of its run, as in
    test_learning) over an asynchronous collector and 2 asynchronous gradient workers
    (max_staleness 1): the final evaluation is above -300 (random play: about -1200), no gradient
    applied was more than one step stale, and some were (the learner did not wait for them)."""
    import dataclasses

    from benchmark.config import load_suite
    from benchmark.training import loop

    (spec,) = [s for s in load_suite("classic", seeds=[0], device="cpu").specs if (s.algo, s.env_id) == ("sac", "Pendulum-v1")]
    budget = dataclasses.replace(spec.budget, total_steps=12_000)
    spec = dataclasses.replace(spec, budget=budget, distributed={"collectors": 1, "mode": "async", "gradient_workers": 2, "max_staleness": 1})
    recorder = Recorder()
    result = loop.run(spec, tracker=recorder)
    curve = [round(e.mean) for e in result.evaluations]
    assert result.evaluations[-1].step == 12_000 and curve[-1] >= -300, curve
    assert max(recorder.values["distributed/gradient_staleness_max"]) == 1.0
    assert 0.0 < max(recorder.values["distributed/gradient_staleness_mean"]) <= 1.0


def test_an_asynchronous_run_resumes_from_its_checkpoint_and_says_it_is_inexact(tmp_path, own_ray):
    """Stopped after 60% of its budget and resumed from ``latest.pt``: the checkpoint holds the
    collectors' envs but says it is inexact (rollouts in flight are lost, streams restart);
    the resumed run keeps the evaluations made before the stop and reaches its budget."""
    import dataclasses

    from benchmark.training import checkpoint, loop

    spec = RunSpec("t", "ppo", "CartPole-v1", 0, small_ppo(), Budget(640, 128, 2), device="cpu", distributed={"collectors": 2, "mode": "async"})
    spec = dataclasses.replace(spec, checkpoint_every=128)

    class Stop(Exception):
        pass

    def die(step, total, last_eval):
        if step >= total * 0.6:
            raise Stop()

    with pytest.raises(Stop):
        loop.run(spec, progress=die, checkpoint_dir=tmp_path)
    payload = checkpoint.load(tmp_path / spec.run_key / checkpoint.LATEST)
    assert payload["exact"] is False and len(payload["collectors"]) == 2
    before = [(e["step"], e["returns"]) for e in payload["evaluations"]]
    resumed = loop.run(spec, checkpoint_dir=tmp_path, resume=payload)
    assert [(e.step, e.returns) for e in resumed.evaluations][: len(before)] == before
    assert resumed.evaluations[-1].step == 640 and len(before) >= 2


# make test-all only: the measurement harness (make scaling), not training code; ~20 s of a CI core
@pytest.mark.extended
def test_the_scaling_measurement_writes_one_row_per_collector_count(monkeypatch, tmp_path, own_ray):
    """``python -m benchmark.perf.scaling`` on a small case: the run in one process, then over
    1 and 2 collectors (3 does not split 2 envs: skipped), each with its rate and ratio."""
    from benchmark.perf import scaling

    monkeypatch.setattr(scaling, "CASES", {"ppo": ("CartPole-v1", {**small_ppo(), "num_envs": 2}, Budget(256, 256, 1))})
    output = tmp_path / "scaling.json"
    scaling.main(["--cases", "ppo", "--collectors", "1", "2", "3", "--output", str(output)])
    rows = json.loads(output.read_text())["cases"]["ppo"]["rows"]
    assert [row["collectors"] for row in rows] == [None, 1, 2]
    assert all(row["steps_per_second"] > 0 for row in rows) and all(row["speedup"] > 0 for row in rows[1:])
    assert len(rows[2]["collector_steps_per_second"]) == 2


# make test-all only: its two halves run in make test (Ray's collectors train as inline ones: test_collectors; every
# executor gives the same evaluations: test_executors); together they cost ~55 s of a CI core
@pytest.mark.extended
def test_runs_over_collectors_train_under_the_ray_executor_as_under_the_local_one(write_suite, tmp_path):
    """``--executor ray --workers 2`` with two runs of two collectors each: the local Ray
    instance is sized for both runs and their collectors (a CPU each), and every evaluation
    equals the same suite's under the local executor (each run there starts its own Ray)."""
    pytest.importorskip("ray")
    suite = write_suite(SUITE.replace("seeds: [0]", "seeds: [0, 1]").replace("name: spread", "name: spread\ndistributed: {collectors: 2}"))
    histories = {}
    for executor in ("ray", "local"):
        results = tmp_path / executor
        completed = run_cli("run", "--suite", str(suite), "--executor", executor, "--workers", "2", "--results-dir", str(results), cwd=tmp_path)
        assert completed.returncode == 0, completed.stderr
        client, runs = children(results)
        assert len(runs) == 2 and all(run.info.status == "FINISHED" for run in runs)
        histories[executor] = {
            run.data.tags["run_key"]: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/return_mean")] for run in runs
        }
    assert histories["ray"] == histories["local"]
