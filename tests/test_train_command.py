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
    arguments = ("train", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "600", "--seeds", "0", "1")
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
