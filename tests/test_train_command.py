"""``python -m benchmark train``: one algorithm on one environment without a suite file, tracked,
skipped when finished and reported like a suite's runs."""

from __future__ import annotations

import yaml
from conftest import run_cli_in_process

from benchmark.cli.train import adhoc_suite, parse_overrides


def test_overrides_are_read_as_yaml_and_name_the_suite():
    assert parse_overrides(["learning_rate=1e-3", "hidden_sizes=[64, 64]", "double_q=false"]) == {
        "learning_rate": 1e-3,
        "hidden_sizes": [64, 64],
        "double_q": False,
    }
    plain = adhoc_suite("tests.plugin_example:HalfTemperatureSAC", "Pendulum-v1", {}, [0], 1000, None, 5)
    assert plain["name"] == "train-tests.plugin_example_HalfTemperatureSAC-Pendulum-v1"
    assert plain["budget"] == {"total_steps": 1000, "eval_every": 100, "eval_episodes": 5}
    tuned, other = (adhoc_suite("dqn", "CartPole-v1", {"learning_rate": rate}, [0], 1000, None, 5)["name"] for rate in (1e-3, 2e-3))
    assert tuned.startswith("train-dqn-CartPole-v1-") and tuned != other


def test_train_runs_once_skips_when_finished_and_reports(tmp_path):
    arguments = ("train", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "600", "--seeds", "0", "1", "--published-defaults")
    arguments += ("--set", "hidden_sizes=[8]", "learning_starts=100", "--eval-episodes", "2", "--results-dir", str(tmp_path / "results"))
    first = run_cli_in_process(*arguments, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "2/2 runs finished" in first.stdout
    (suite,) = (tmp_path / "results" / "suites").glob("train-dqn-CartPole-v1-*.yaml")
    data = yaml.safe_load(suite.read_text())
    assert data["seeds"] == [0, 1]
    assert data["experiments"] == [{"algo": "dqn", "envs": ["CartPole-v1"], "hyperparameters": {"hidden_sizes": [8], "learning_starts": 100}}]
    again = run_cli_in_process(*arguments, cwd=tmp_path)  # the same command again: nothing left to train
    assert again.returncode == 0 and "2/2 runs finished (2 of them in an earlier invocation)" in again.stdout, again.stdout[-2000:]
    report = ("--output", str(tmp_path / "report"))
    reported = run_cli_in_process("report", "--suite", str(suite), "--results-dir", str(tmp_path / "results"), *report, cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert "CartPole-v1" in (tmp_path / "report" / "report.md").read_text()


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    for arguments, message in (
        (("--set", "learnin_rate=1"), "unknown hyperparameter 'learnin_rate' for DQNConfig (did you mean 'learning_rate'?)"),
        (("--set", "=1"), "--set '=1': expected KEY=VALUE"),
        (("--set", "gamma=2"), "gamma"),
        (("--steps", "0"), "total_steps"),
        (("--workers", "0"), "--workers must be >= 1"),
        (("--seeds", "1", "1"), "--seeds must be distinct"),
    ):
        completed = run_cli_in_process("train", "--algo", "dqn", "--env", "CartPole-v1", *arguments, "--results-dir", str(tmp_path / "results"), cwd=tmp_path)
        assert completed.returncode == 2 and len(completed.stderr.strip().splitlines()) == 1, completed.stderr
        assert message in completed.stderr, completed.stderr
        assert not (tmp_path / "results").exists()


def test_a_run_that_would_train_nothing_is_refused_with_the_setting_that_fixes_it(tmp_path):
    """SAC's published warm-up is 5,000 steps, PPO's rollout 2,048 (on a task without settings of
    its own, MountainCar): a shorter budget would end before the first gradient step, silently. ``train`` refuses it in one line; ``run`` warns
    once per configuration of a suite and trains it."""
    results = tmp_path / "results"
    for arguments, expected in (
        (
            ("--algo", "sac", "--env", "Pendulum-v1", "--published-defaults", "--set", "actor_lr=1e-3", "critic_lr=1e-3", "--steps", "5000"),
            "error: sac on Pendulum-v1: 5,000 env steps end before the first gradient step, at env step 5,001 "
            "(learning_starts 5,000 + update_every 1): give --steps 5001 or more, or lower those settings with --set",
        ),
        (
            ("--algo", "ppo", "--env", "MountainCar-v0", "--steps", "2000"),
            "error: ppo on MountainCar-v0: 2,000 env steps end before the first gradient step, at env step 2,048 "
            "(one rollout: num_envs 1 x num_steps 2,048): give --steps 2048 or more, or lower those settings with --set",
        ),
    ):
        completed = run_cli_in_process("train", *arguments, "--results-dir", str(results), cwd=tmp_path)
        assert completed.returncode == 2 and completed.stderr.strip().splitlines() == [expected], completed.stderr
        assert not results.exists()
    # one more step than the warm-up is one gradient step: accepted (as a dry run here)
    enough = run_cli_in_process(
        "train",
        "--algo",
        "dqn",
        "--env",
        "CartPole-v1",
        "--set",
        "learning_starts=100",
        "update_every=4",
        "--steps",
        "104",
        "--dry-run",
        "--results-dir",
        str(results),
        cwd=tmp_path,
    )
    assert enough.returncode == 0 and "warning" not in enough.stdout, enough.stderr[-2000:]
    suite = tmp_path / "short.yaml"
    suite.write_text(
        "name: short\nseeds: [0, 1]\nbudget: {total_steps: 256, eval_every: 128, eval_episodes: 2}\n"
        "experiments:\n  - algo: ppo\n    envs: [CartPole-v1]\n    hyperparameters: {num_steps: 512, hidden_sizes: [8]}\n"
    )
    warned = run_cli_in_process("run", "--suite", str(suite), "--dry-run", "--results-dir", str(results), cwd=tmp_path)
    assert warned.returncode == 0, warned.stderr[-2000:]
    lines = [line for line in warned.stdout.splitlines() if line.startswith("warning:")]
    assert lines == [
        "warning: ppo on CartPole-v1: 256 env steps end before the first gradient step, at env step 512 "
        "(one rollout: num_envs 1 x num_steps 512): raise its budget's total_steps to 512 or lower those settings"
    ]


def test_train_takes_the_tasks_settings_from_the_suites_and_says_so(tmp_path):
    """As RL Zoo's train.py reads its tuned settings per env: SAC on Pendulum takes the classic
    suite's (RL Zoo's learning rates and gamma, a 1,000-step warm-up), so the issue's 5,000-step
    run updates; --set replaces one of them; a task no suite trains keeps the published defaults;
    --published-defaults asks for them."""
    from benchmark import task_defaults

    results = tmp_path / "results"
    task = task_defaults.find("sac", "Pendulum-v1")
    assert task is not None and task.hyperparameters["learning_starts"] == 1000 and task.suite == "classic"
    assert (task.budget.total_steps, task.budget.eval_every) == (20000, 2000) and "RL Zoo" in task.source
    mujoco = task_defaults.find("sac", "HalfCheetah-v5")
    assert mujoco.hyperparameters == {} and mujoco.source == "Haarnoja et al. 2018b, Table 1"  # SAC's published defaults
    assert task_defaults.find("sac", "MountainCarContinuous-v0") is None

    dry = ("--dry-run", "--results-dir", str(results))
    tuned = run_cli_in_process("train", "--algo", "sac", "--env", "Pendulum-v1", "--set", "gamma=0.99", "--steps", "5000", *dry, cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    first = tuned.stdout.splitlines()[0]
    assert first.startswith("settings of suite classic for sac on Pendulum-v1: start_steps=1000, learning_starts=1000,") and "(--set replaces gamma)" in first
    assert not results.exists(), "--dry-run wrote under the results directory"
    from benchmark.cli.train import adhoc_suite
    from benchmark.config import load_suite

    planned = tmp_path / "planned.yaml"  # the suite train plans: the task's settings with gamma replaced, 5,000 steps
    planned.write_text(yaml.safe_dump(adhoc_suite("sac", "Pendulum-v1", {**task.hyperparameters, "gamma": 0.99}, [0], 5000, None, 10)))
    (spec,) = load_suite(str(planned)).specs
    assert spec.run_key in tuned.stdout and "(not written: --dry-run)" in tuned.stdout
    whole = run_cli_in_process("train", "--algo", "ppo", "--env", "CartPole-v1", *dry, cwd=tmp_path)  # no --steps: the task's budget
    assert whole.returncode == 0 and "100,000" in whole.stdout, whole.stdout[-2000:]
    plain = run_cli_in_process("train", "--algo", "sac", "--env", "MountainCarContinuous-v0", "--steps", "6000", *dry, cwd=tmp_path)
    assert plain.returncode == 0 and plain.stdout.splitlines()[0].startswith("settings: sac's published defaults"), plain.stdout[-2000:]
