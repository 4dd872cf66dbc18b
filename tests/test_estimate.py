"""Cost before a suite starts: the estimate against hand computations, each run's state, and the
confirmation that guards invocations estimated above --max-hours."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli_in_process

from benchmark.config import Budget, RunSpec, load_suite
from benchmark.execution import claims, estimate, plan
from benchmark.execution.estimate import PastRun, Throughput
from benchmark.training import checkpoint

TABLE = {("ppo", "CartPole-v1"): Throughput("ppo", "CartPole-v1", 1000.0, 5000.0), ("ppo", "Acrobot-v1"): Throughput("ppo", "Acrobot-v1", 500.0, 2500.0)}


def spec(seed=0, algo="ppo", env_id="CartPole-v1", total=10_000, every=5_000, episodes=10, hp=None):
    return RunSpec("s", algo, env_id, seed, hp or {"learning_rate": 0.001}, Budget(total, every, episodes))


def test_a_run_from_the_throughput_table_by_hand():
    """10k steps at 1,000 steps/s = 10 s; evaluations at 0?, 5k, 10k: 10000 // 5000 + 1 = 3, of 10
    episodes of at most 500 steps (CartPole's cap) = 15,000 steps at 5,000 steps/s = 3 s: 13 s."""
    found = estimate.estimate_run(spec(), [], TABLE)
    assert found.seconds == pytest.approx(13.0) and found.basis.startswith("calibrated")


def test_finished_runs_come_before_the_table_and_the_same_configuration_first():
    past = [
        PastRun("ppo", "CartPole-v1", "other", 0.004),
        PastRun("ppo", "CartPole-v1", "this", 0.002),
        PastRun("ppo", "CartPole-v1", "this", 0.003),
        PastRun("ppo", "CartPole-v1", "this", 0.010),
    ]
    found = estimate.estimate_run(spec(), past, TABLE, key="this")
    assert found.seconds == pytest.approx(0.003 * 10_000) and "3 finished runs of this configuration" in found.basis
    pair = estimate.estimate_run(spec(), past[:1], TABLE, key="this")
    assert pair.seconds == pytest.approx(40.0) and "of ppo on CartPole-v1" in pair.basis


def test_other_environments_give_a_rough_figure_and_nothing_gives_unknown():
    rough = estimate.estimate_run(spec(env_id="Pendulum-v1"), [], TABLE)
    # median of 1000 and 500 = 750 training steps/s, of 5000 and 2500 = 3750; Pendulum's cap is 200
    assert rough.seconds == pytest.approx(10_000 / 750 + 3 * 10 * 200 / 3750) and rough.basis.startswith("rough")
    assert estimate.estimate_run(spec(algo="sac"), [], TABLE).seconds is None


def test_the_wall_time_deals_the_longest_jobs_first():
    """5, 4, 3, 3, 3 on 2 slots: 5 | 4; 3 -> the 4 (7); 3 -> the 5 (8); 3 -> the 7 (10)."""
    assert estimate.makespan([3, 5, 3, 4, 3], 2) == 10
    assert estimate.makespan([3, 5], 8) == 5 and estimate.makespan([], 4) == 0


def test_an_estimate_of_processes_with_resumed_runs_by_hand():
    a, b, c = spec(0), spec(1), spec(2, env_id="Acrobot-v1")
    # a: 13 s; b: 13 s, half left; c: 10,000 / 500 + 3 x 10 x 500 / 2500 = 26 s; with b and c batched in one process
    found = estimate.estimate([[a], [b, c]], 2, [], TABLE, remaining={b.run_key: 0.5})
    assert found.known_seconds == pytest.approx(13 + 6.5 + 26)
    assert found.wall_seconds == pytest.approx(32.5) and not found.unknown


def test_a_throughput_table_is_saved_sorted_and_read_back(tmp_path):
    path = tmp_path / "throughput.csv"
    estimate.save_throughput([TABLE[("ppo", "CartPole-v1")]], path)
    estimate.save_throughput([TABLE[("ppo", "Acrobot-v1")], Throughput("ppo", "CartPole-v1", 2000.0, 6000.0)], path)
    loaded = estimate.load_throughput(path)
    assert loaded[("ppo", "CartPole-v1")].train_steps_per_second == 2000.0 and len(loaded) == 2
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
