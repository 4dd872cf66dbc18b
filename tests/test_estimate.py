"""Cost before a suite starts: the estimate against hand computations, each run's state, and the
confirmation that guards invocations estimated above --max-hours."""

import dataclasses
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli_in_process

from benchmark.config import Budget, RunSpec, load_suite
from benchmark.execution import claims, estimate, plan
from benchmark.execution.estimate import PastRun, Throughput
from benchmark.training import checkpoint

CPU = "Test CPU"


def spec(seed=0, algo="ppo", env_id="CartPole-v1", total=10_000, every=5_000, episodes=10, hp=None):
    return RunSpec("s", algo, env_id, seed, hp or {"learning_rate": 0.001}, Budget(total, every, episodes))


def keys(run, batch=1, cpu=CPU):
    return estimate.keys_of(run, batch, cpu)


def row(run, train, evaluation, batch=1, cpu=CPU):
    """A calibrated row for ``run``'s work key with ``batch`` seeds a process on ``cpu``."""
    return Throughput(run.algo, run.env_id, train, evaluation, cpu, work_key=keys(run, batch, cpu).work, seeds_per_process=batch)


def table(*rows):
    return {r.row_key: r for r in rows}


TABLE = table(row(spec(), 1000.0, 5000.0), row(spec(env_id="Acrobot-v1"), 500.0, 2500.0))


def test_a_run_from_the_throughput_table_by_hand():
    """10k steps at 1,000 steps/s = 10 s; evaluations at 0?, 5k, 10k: 10000 // 5000 + 1 = 3, of 10
    episodes of at most 500 steps (CartPole's cap) = 15,000 steps at 5,000 steps/s = 3 s: 13 s."""
    found = estimate.estimate_run(spec(), [], TABLE, keys(spec()))
    assert found.seconds == pytest.approx(13.0) and found.basis.startswith("calibrated")


def test_warm_up_steps_are_priced_at_the_evaluation_rate():
    """DQN with 4,000 random steps before its first update: 6,000 updating steps at 1,000/s = 6 s;
    (4,000 warm-up + 15,000 evaluation steps) at 5,000/s = 3.8 s."""
    run = spec(algo="dqn", hp={"learning_starts": 4000, "learning_rate": 0.001})
    found = estimate.estimate_run(run, [], table(row(run, 1000.0, 5000.0)), keys(run))
    assert found.seconds == pytest.approx(6.0 + 3.8)


def test_the_work_key_follows_the_work_per_step_not_what_is_learned():
    base = spec(hp={"learning_rate": 0.001, "batch_size": 64})
    same = [spec(hp={"learning_rate": 0.1, "batch_size": 64, "gamma": 0.9}), spec(seed=7, hp={"learning_rate": 0.001, "batch_size": 64})]
    assert all(keys(other).work == keys(base).work for other in same)
    assert keys(base, cpu="Other CPU").work == keys(base).work  # the CPU model is matched apart
    different = [
        keys(spec(hp={"learning_rate": 0.001, "batch_size": 256})),
        keys(spec(hp={"learning_rate": 0.001, "batch_size": 64, "hidden_sizes": [256, 256]})),
        keys(spec(hp={"learning_rate": 0.001, "batch_size": 64, "some_plugin_setting": 3})),  # unknown settings count as work
        keys(base, batch=3),
        keys(dataclasses.replace(base, device="cuda")),
        keys(spec(env_id="Acrobot-v1", hp={"learning_rate": 0.001, "batch_size": 64})),
    ]
    assert len({k.work for k in different} | {keys(base).work}) == len(different) + 1


def test_finished_runs_come_before_the_table_and_the_same_configuration_first():
    this = keys(spec())
    past = [
        PastRun("ppo", "CartPole-v1", "other", 0.001, this.work, CPU),
        PastRun("ppo", "CartPole-v1", this.config, 0.002, this.work, CPU, "cpu"),
        PastRun("ppo", "CartPole-v1", this.config, 0.003, this.work, CPU, "cpu"),
        PastRun("ppo", "CartPole-v1", this.config, 0.010, this.work, CPU, "cpu"),
    ]
    found = estimate.estimate_run(spec(), past, TABLE, this)
    assert found.seconds == pytest.approx(0.003 * 10_000) and found.basis == "3 finished runs of this configuration (CPU time)"
    work = estimate.estimate_run(spec(), past[:1], TABLE, this)
    assert work.seconds == pytest.approx(10.0) and work.basis == "1 finished run with this work per step (least wall time)"


def test_cpu_timed_runs_set_the_figure_else_the_least_wall_time():
    """A wall time counts waiting for a core: of three wall-timed runs of one configuration (one
    trained alone, two beside other work, 18x and 3x as long) the least sets the figure; a run
    timed by its process's CPU takes precedence over any wall time, and several give their median."""
    this = keys(spec())
    walls = [PastRun("ppo", "CartPole-v1", this.config, per_step, this.work, CPU) for per_step in (0.001, 0.018, 0.003)]
    found = estimate.estimate_run(spec(), walls, TABLE, this)
    assert found.seconds == pytest.approx(10.0) and found.basis == "3 finished runs of this configuration (least wall time)"
    timed = [PastRun("ppo", "CartPole-v1", this.config, per_step, this.work, CPU, "cpu") for per_step in (0.002, 0.004, 0.009)]
    found = estimate.estimate_run(spec(), walls + timed, TABLE, this)
    assert found.seconds == pytest.approx(40.0) and found.basis == "6 finished runs of this configuration (CPU time)"
    # a calibration of this work key on this CPU below the least wall time is the figure (13 s:
    # 10,000 / 1,000 + 3 evaluations x 10 episodes x 500 steps / 5,000); above it, not
    slow = [PastRun("ppo", "CartPole-v1", this.config, 0.005, this.work, CPU)]
    found = estimate.estimate_run(spec(), slow, TABLE, this)
    assert found.seconds == pytest.approx(13.0) and found.basis.startswith("calibrated") and "below the least wall time of 1 finished run" in found.basis
    assert estimate.estimate_run(spec(), walls, TABLE, this).seconds == pytest.approx(10.0)
    assert estimate.estimate_run(spec(), [dataclasses.replace(slow[0], timed_by="cpu")], TABLE, this).seconds == pytest.approx(50.0)


def test_runs_with_other_work_per_step_or_on_another_cpu_do_not_set_the_figure():
    """The case of the issue: a finished run of the same algorithm and env with other settings
    (here 40x cheaper per step) is not borrowed; a run on another CPU model only when nothing
    of this one is known, and named."""
    this = keys(spec())
    cheap = PastRun("ppo", "CartPole-v1", "other", 0.0001, keys(spec(hp={"num_envs": 64})).work, CPU)
    assert estimate.estimate_run(spec(), [cheap], TABLE, this).seconds == pytest.approx(13.0)
    elsewhere = PastRun("ppo", "CartPole-v1", this.config, 0.002, this.work, "Other CPU")
    assert estimate.estimate_run(spec(), [elsewhere], TABLE, this).basis.startswith("calibrated")
    alone = estimate.estimate_run(spec(), [elsewhere], {}, this)
    assert alone.seconds == pytest.approx(20.0) and alone.basis == "1 finished run on Other CPU (least wall time)"
    other_cpu = table(row(spec(), 2000.0, 5000.0, cpu="Other CPU"))
    found = estimate.estimate_run(spec(), [], other_cpu, this)
    assert found.seconds == pytest.approx(8.0) and found.basis.startswith("calibrated on Other CPU")


def test_a_finished_run_is_priced_by_its_process_s_cpu_time_where_recorded():
    """A run of a batch of 3 seeds, 1,000 steps, 100 s of wall time: 60 s of its process's CPU
    give 60 / 3 / 1,000 = 0.02 core-seconds per step; without them, wall time: 0.0333."""
    from test_bundles import fake_run

    timed = dataclasses.replace(fake_run(0, steps=1000), wall_seconds=100.0, cpu_seconds=60.0, batch_seeds=(0, 1, 2), mlflow_run_id="timed")
    untimed = dataclasses.replace(timed, cpu_seconds=None, mlflow_run_id="untimed")
    found = sorted((p.timed_by, p.seconds_per_step) for p in plan.past_runs(None, {"a": timed, "b": untimed}) if p.cpu_model == "Test CPU, 2 cores")
    assert found == [("cpu", pytest.approx(0.02)), ("wall", pytest.approx(100 / 3 / 1000))]
    assert {p.work_key for p in plan.past_runs(None, {"a": timed})} >= {keys(timed.spec, batch=3).work}


def test_evaluations_are_priced_at_the_episode_lengths_finished_runs_evaluated():
    """CartPole's cap is 500: 3 evaluations x 10 episodes x 500 steps at 5,000 steps/s = 3 s; runs
    of PPO on CartPole that evaluated 100 and 300-step episodes on average (median 200, whatever
    their settings or CPU) make it 1.2 s; other pairs' lengths, and lengths above the cap, do not."""
    this = keys(spec())
    table = {k: v for k, v in TABLE.items() if v.env_id == "CartPole-v1"}
    runs = [PastRun("ppo", "CartPole-v1", "other", 1.0, "other", "Other CPU", eval_length=length) for length in (100.0, 300.0)]
    assert estimate.estimate_run(spec(), [], table, this).seconds == pytest.approx(10.0 + 3.0)
    assert estimate.estimate_run(spec(), runs, table, this).seconds == pytest.approx(10.0 + 1.2)
    elsewhere = [PastRun("sac", "CartPole-v1", "x", 1.0, "x", CPU, eval_length=10.0), PastRun("ppo", "Acrobot-v1", "x", 1.0, "x", CPU, eval_length=10.0)]
    assert estimate.estimate_run(spec(), elsewhere, table, this).seconds == pytest.approx(13.0)
    assert estimate.evaluation_steps(spec(), 800.0) == 3 * 10 * 500


def test_a_bundled_run_tells_its_mean_evaluation_length():
    from test_bundles import fake_run

    run = dataclasses.replace(fake_run(0, steps=1000), wall_seconds=10.0, mlflow_run_id="timed")
    (past,) = [p for p in plan.past_runs(None, {"a": run}) if p.config_key == estimate.config_key(tracking_params(run.spec))]
    expected = statistics.mean(statistics.mean(point.lengths) for point in run.curve if point.lengths)
    assert past.eval_length == pytest.approx(expected)


def tracking_params(spec):
    from benchmark import tracking

    return tracking.child_params(spec)


def test_other_settings_or_environments_give_a_rough_figure_and_nothing_gives_unknown():
    other = estimate.estimate_run(spec(hp={"num_envs": 4}), [], TABLE, keys(spec(hp={"num_envs": 4})))
    assert other.seconds == pytest.approx(13.0) and other.basis == "rough: ppo on CartPole-v1 calibrated with other settings"
    pendulum = spec(env_id="Pendulum-v1")
    rough = estimate.estimate_run(pendulum, [], TABLE, keys(pendulum))
    # median of 1000 and 500 = 750 training steps/s, of 5000 and 2500 = 3750; Pendulum's cap is 200
    assert rough.seconds == pytest.approx(10_000 / 750 + 3 * 10 * 200 / 3750) and rough.basis.startswith("rough")
    assert estimate.estimate_run(spec(algo="sac"), [], TABLE, keys(spec(algo="sac"))).seconds is None


def test_the_wall_time_deals_the_longest_jobs_first():
    """5, 4, 3, 3, 3 on 2 slots: 5 | 4; 3 -> the 4 (7); 3 -> the 5 (8); 3 -> the 7 (10)."""
    assert estimate.makespan([3, 5, 3, 4, 3], 2) == 10
    assert estimate.makespan([3, 5], 8) == 5 and estimate.makespan([], 4) == 0


def test_an_estimate_of_processes_with_resumed_runs_by_hand():
    """a alone: 13 s; b and c batched two to a process, priced at the 2-seed rates: b 10,000 /
    2,000 + 15,000 / 5,000 = 8 s, half left: 4 s; c: 10,000 / 1,000 + 3 x 10 x 500 / 2,500 = 16 s."""
    a, b, c = spec(0), spec(1), spec(2, env_id="Acrobot-v1")
    rates = table(*TABLE.values(), row(spec(), 2000.0, 5000.0, batch=2), row(c, 1000.0, 2500.0, batch=2))
    found = estimate.estimate([[a], [b, c]], 2, [], rates, remaining={b.run_key: 0.5}, cpu_model=CPU)
    assert found.known_seconds == pytest.approx(13 + 4 + 16)
    assert found.wall_seconds == pytest.approx(20.0) and not found.unknown


def test_a_throughput_table_is_saved_sorted_and_read_back(tmp_path):
    path = tmp_path / "throughput.csv"
    cartpole, acrobot = TABLE.values()
    estimate.save_throughput([cartpole], path)
    estimate.save_throughput([acrobot, dataclasses.replace(cartpole, train_steps_per_second=2000.0)], path)
    loaded = estimate.load_throughput(path)
    assert loaded[cartpole.row_key].train_steps_per_second == 2000.0 and len(loaded) == 2
    assert path.read_text().splitlines()[1].startswith("ppo,Acrobot-v1,")
    path.write_text("algo,env_id\nppo,CartPole-v1\n")
    with pytest.raises(Exception, match="lacks the column"):
        estimate.load_throughput(path)


def test_the_state_of_each_run(tmp_path):
    """A claimed run, a run with a checkpoint at step 300, and runs to train; nothing is created."""
    suite = load_suite("smoke", seeds=[0, 1, 2])
    specs = [s for s in suite.specs if s.algo == "ppo"]
    results = tmp_path / "results"
    checkpoint.write_atomic({"loop": {"step": 30_000}}, checkpoint.run_directory(results / "checkpoints", specs[1].run_key) / checkpoint.LATEST)
    with claims.take(claims.directory(results), specs[2].run_key, claims.Holder.here("test-invocation", "ppo")):
        states = plan.run_states(specs, None, suite.name, {}, results)
    assert [s.status for s in states] == ["to train", "resumes", "claimed"]
    assert states[1].detail == "from step 30,000" and states[1].resume_step == 30_000
    assert "pid" in states[2].detail
    forced = plan.run_states(specs, None, suite.name, {}, results, force=True)
    assert [s.status for s in forced] == ["to train", "to train", "to train"]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmark", *args], cwd=cwd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


def test_an_invocation_above_max_hours_is_refused_without_a_terminal_and_yes(tiny_suite, tmp_path):
    results = tmp_path / "results"
    first = run_cli_in_process("run", "--suite", str(tiny_suite), "--seeds", "0", "--algos", "ppo", "--results-dir", str(results), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    before = sorted(p.name for p in results.rglob("*"))
    args = ["run", "--suite", str(tiny_suite), "--seeds", "0", "1", "--algos", "ppo", "--results-dir", str(results)]
    dry = run_cli_in_process(*args, "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "1 finished (store)" not in dry.stdout and "2 runs: 1 finished, 1 to train" in dry.stdout
    assert "1 finished run of this configuration" in dry.stdout
    refused = run_cli(*args, "--max-hours", "0.0000001", cwd=tmp_path)  # a real process with no terminal: its whole stderr
    assert refused.returncode == 2
    lines = refused.stderr.splitlines()
    assert len(lines) == 1 and re.match(r"error: suite 'tiny' is estimated at \d+ s of wall time with 1 worker, above --max-hours 1e-07: pass --yes", lines[0])
    assert sorted(p.name for p in results.rglob("*")) == before, "a refused invocation changed the results"
    started = run_cli_in_process(*args, "--max-hours", "0.0000001", "--yes", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert re.findall(r"^started (\S+)", started.stdout, re.M) == ["ppo/CartPole-v1/seed1"]


def test_the_mujoco_dry_run_prints_the_estimate_and_the_state_of_every_run():
    completed = run_cli_in_process(
        "run",
        "--suite",
        "mujoco",
        "--dry-run",
        "--workers",
        "2",
        "--no-published",
        "--results-dir",
        "/nonexistent-results",
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "400 runs: 400 to train; 400,000,000 env steps left" in out and "of wall time with 2 workers" in out
    assert "suite mujoco: per experiment" in out and "core-hours" in out
    if estimate.load_throughput():  # the committed table covers the suite: every run is estimated
        assert "not estimated" not in out
    assert not Path("/nonexistent-results").exists()  # a dry run creates nothing


def committed_cells(suites):
    """The committed bundles' cells as trained: (config key, seeds a process, CPU model) -> (one
    run's spec, the core-seconds each run took: its process's CPU time where recorded, else its
    wall time, over the seeds of the process: their median if every run recorded CPU time, else
    the least; whether every run recorded CPU time)."""
    from benchmark import bundles, tracking
    from benchmark.config import PROJECT_ROOT

    cells: dict[tuple, tuple] = {}
    for name in suites:
        for run in bundles.read(bundles.published_directory(PROJECT_ROOT / "results", name)).runs.values():
            batch = max(len(run.batch_seeds), 1)
            key = (estimate.config_key(tracking.child_params(run.spec)), batch, run.provenance["cpu_model"])
            cells.setdefault(key, (run.spec, [], []))
            cells[key][1].append((run.cpu_seconds or run.wall_seconds) / batch)
            cells[key][2].append(run.cpu_seconds is not None)
    return {key: (spec, statistics.median(times) if all(timed) else min(times), all(timed)) for key, (spec, times, timed) in cells.items()}


def test_a_plan_prices_each_record_cell_from_its_committed_runs_whatever_the_results_directory(tmp_path):
    """The record's configurations planned from their suite files, as ``run --suite mujoco
    --results-dir elsewhere`` plans them, each with the seeds a process its cell was trained
    with: priced from the committed bundles' runs of that configuration on that CPU model (the
    keys of a planned run and of a bundled one agree): within 1.5x of what those runs took where
    their CPU time was recorded; where only their wall time was, at most the least of them (the
    others waited for a core beside other work), and below it only by a calibration of that work
    on that CPU."""
    from benchmark.analysis import record

    assert not plan.default_bundles(tmp_path, "mujoco", None, published=False)
    past = plan.past_runs(None, {})  # no store, no bundle given: the checkout's committed runs still count
    checked = 0
    for name in record.RECORD_SUITES:
        suite = load_suite(name)
        for (_, batch, cpu), (run, measured, timed) in committed_cells([name]).items():
            (planned,) = [s for s in suite.specs if s.run_key == run.run_key]
            found = estimate.estimate_run(planned, past, estimate.load_throughput(), estimate.keys_of(planned, batch, cpu))
            endings = ("of this configuration (least wall time)", "of this configuration (CPU time)", "of this configuration")
            assert found.basis.endswith(endings), (run.label, found.basis)
            if timed:  # timed by their CPU: the figure is theirs
                assert 1 / 1.5 <= found.seconds / measured <= 1.5, (run.label, batch, found.seconds, measured)
            else:  # wall times bound the work from above; a calibration of it on this CPU may be lower
                calibrated = found.basis.startswith("calibrated")
                assert found.seconds <= measured * 1.0001 and (calibrated or found.seconds / measured > 0.9999), (run.label, found.basis)
            checked += 1
    assert checked >= 20


def test_calibrate_measures_a_suite_configuration_as_its_runs_will_be_keyed(tiny_suite, tmp_path):
    """The CLI on the tiny suite's PPO with two seeds a process: one row, keyed as a planned run
    of that configuration trained two to a process, with the settings it changes shown."""
    output = tmp_path / "throughput.csv"
    done = run_cli_in_process(
        "calibrate", "--suite", str(tiny_suite), "--algos", "ppo", "--seeds-per-process", "2", "--steps", "256", "--output", str(output), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    (row,) = estimate.load_throughput(output).values()
    planned = load_suite(str(tiny_suite)).select(["ppo"], None).specs[0]
    # two runs, the second at least twice the first and in whole rollouts (64 steps here)
    assert row.work_key == estimate.keys_of(planned, 2).work and row.seeds_per_process == 2 and row.steps >= 512 and row.steps % 64 == 0
    assert '"num_steps":"64"' in row.settings and row.train_steps_per_second > 0 and row.eval_steps_per_second > 0
    found = estimate.estimate_run(planned, [], estimate.load_throughput(output), estimate.keys_of(planned, 2))
    assert found.basis.startswith("calibrated")
