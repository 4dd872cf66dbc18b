"""Regression checks: the verdict logic on synthetic scores, and the real CLI catching a broken
variant against a stored baseline while passing the unbroken code on new seeds."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli_in_process as run_cli

from benchmark.analysis import regress
from benchmark.analysis.records import RunRecord
from benchmark.config import load_suite

ROOT = Path(__file__).resolve().parent.parent

SUITE = """
name: {name}
seeds: 5
budget: {{total_steps: 16384, eval_every: 16384, eval_episodes: 5}}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters:
      num_envs: 8
      num_steps: 32
      num_minibatches: 1
      num_epochs: 10
      learning_rate: {learning_rate}
      gamma: 0.98
      gae_lambda: 0.8
      hidden_sizes: [32, 32]
      normalize_observations: false
      normalize_rewards: false
"""


def _payload(write_suite, scores: list[float], hyperparameters: dict | None = None) -> tuple[dict, list]:
    suite = load_suite(str(write_suite(SUITE.format(name="synthetic", learning_rate=1e-3))))
    records = [RunRecord(spec, status="FINISHED", final_return=score) for spec, score in zip(suite.specs, scores)]
    payload = regress.baseline_payload("synthetic", records)
    if hyperparameters:
        payload["groups"][0]["hyperparameters"] = {**payload["groups"][0]["hyperparameters"], **hyperparameters}
    return payload, suite.specs


def _current(specs, scores, statuses=None):
    statuses = statuses or ["FINISHED"] * len(scores)
    return [RunRecord(spec, status=status, final_return=score if status == "FINISHED" else None) for spec, score, status in zip(specs, scores, statuses)]


def test_a_large_significant_drop_is_a_regression(write_suite):
    payload, specs = _payload(write_suite, [480.0, 500.0, 470.0, 500.0, 495.0])
    (verdict,) = regress.compare(payload, _current(specs, [25.0, 30.0, 22.0, 28.0, 40.0]))
    assert verdict.regressed and verdict.key == "ppo @ CartPole-v1"
    assert verdict.normalized_difference == pytest.approx((29.0 - 489.0) / (500.0 - 23.68), rel=1e-3)
    assert "489.0 -> 29.0" in verdict.describe() and "95% CI of the difference" in verdict.describe()


def test_seed_noise_is_not_a_regression(write_suite):
    payload, specs = _payload(write_suite, [500.0, 301.0, 500.0, 500.0, 480.0])
    (verdict,) = regress.compare(payload, _current(specs, [500.0, 500.0, 260.0, 500.0, 450.0]))
    assert not verdict.regressed and not verdict.improved


def test_a_significant_but_tiny_drop_is_not_a_regression(write_suite):
    payload, specs = _payload(write_suite, [500.0] * 5)
    (verdict,) = regress.compare(payload, _current(specs, [490.0, 491.0, 489.0, 490.0, 490.0]))
    assert verdict.welch.p_value < 0.01 and not verdict.regressed  # 10 points is 0.02 normalized < 0.1


def test_identical_constant_scores_are_fine(write_suite):
    payload, specs = _payload(write_suite, [500.0] * 5)
    (verdict,) = regress.compare(payload, _current(specs, [500.0] * 5))
    assert not verdict.regressed and verdict.welch.difference == 0


def test_failed_runs_are_a_regression(write_suite):
    payload, specs = _payload(write_suite, [500.0] * 5)
    (verdict,) = regress.compare(payload, _current(specs, [500.0] * 5, ["FINISHED", "FAILED", "FINISHED", "FINISHED", "FINISHED"]))
    assert verdict.regressed and "did not finish" in verdict.describe()


def test_changed_hyperparameters_are_named(write_suite):
    payload, specs = _payload(write_suite, [500.0] * 5, {"learning_rate": 3e-4})
    (verdict,) = regress.compare(payload, _current(specs, [500.0] * 5))
    assert "learning_rate 0.0003 -> 0.001" in verdict.describe()


GRID_SUITE = """
name: grid
seeds: 5
budget: {total_steps: 16384, eval_every: 16384}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    grid: {learning_rate: [1.0e-3, 2.0e-3, 3.0e-3, 4.0e-3]}
"""


def test_null_false_alarm_rate_of_a_four_row_check_is_controlled(write_suite):
    """Four rows whose current and baseline scores come from the same distribution (a
    half-solved task's noise): the whole check alarms in at most ~alpha of trials."""
    specs = load_suite(str(write_suite(GRID_SUITE))).specs
    rng = np.random.default_rng(0)
    trials, alarms = 200, 0
    for _ in range(trials):
        baseline = [RunRecord(spec, status="FINISHED", final_return=float(rng.normal(350, 120))) for spec in specs]
        payload = regress.baseline_payload("grid", baseline)
        current = [RunRecord(spec, status="FINISHED", final_return=float(rng.normal(350, 120))) for spec in specs]
        verdicts = regress.compare(payload, current)
        assert len(verdicts) == 4
        alarms += any(v.regressed for v in verdicts)
    assert alarms / trials <= 0.06


def test_holm_keeps_a_clear_regression_among_several_rows(write_suite):
    specs = load_suite(str(write_suite(GRID_SUITE))).specs
    baseline = [RunRecord(spec, status="FINISHED", final_return=480.0 + spec.seed) for spec in specs]
    payload = regress.baseline_payload("grid", baseline)
    broken_rate = specs[0].hyperparameters["learning_rate"]
    current = [
        RunRecord(spec, status="FINISHED", final_return=(30.0 if spec.hyperparameters["learning_rate"] == broken_rate else 480.0) + spec.seed) for spec in specs
    ]
    verdicts = regress.compare(payload, current)
    assert [v.regressed for v in verdicts] == [True, False, False, False]


def test_a_baseline_row_that_was_not_run_is_a_regression(write_suite):
    specs = load_suite(str(write_suite(GRID_SUITE))).specs
    payload = regress.baseline_payload("grid", [RunRecord(spec, status="FINISHED", final_return=480.0) for spec in specs])
    current = [RunRecord(spec, status="FINISHED", final_return=480.0) for spec in specs[5:]]  # the first row is gone
    verdicts = regress.compare(payload, current)
    missing = [v for v in verdicts if v.regressed]
    assert len(missing) == 1 and "not run now" in missing[0].describe()
    assert not any(v.regressed for v in regress.compare(payload, current, algos=["dqn"]))  # outside the selection


def test_a_nan_final_return_counts_as_a_failed_run(write_suite):
    from benchmark.analysis.records import mark_unusable

    payload, specs = _payload(write_suite, [500.0] * 5)
    current = _current(specs, [500.0, float("nan"), 500.0, 500.0, 500.0])
    for record in current:
        mark_unusable(record)
    assert current[1].status == "FAILED" and "nan" in current[1].error
    (verdict,) = regress.compare(payload, current)
    assert verdict.regressed and "did not finish" in verdict.describe()


def test_a_changed_budget_is_named(write_suite):
    payload, specs = _payload(write_suite, [500.0] * 5)
    payload["groups"][0]["budget"] = {**payload["groups"][0]["budget"], "total_steps": 50000}
    (verdict,) = regress.compare(payload, _current(specs, [500.0] * 5))
    assert "budget.total_steps 50000 -> 16384" in verdict.describe()


def test_bad_arguments(write_suite):
    payload, _ = _payload(write_suite, [500.0] * 5)
    with pytest.raises(Exception, match="--alpha"):
        regress.compare(payload, [], alpha=1.5)
    with pytest.raises(Exception, match="--min-effect"):
        regress.compare(payload, [], min_effect=-1)


# A2C on InvertedPendulum as in the classic suite: every seed balances (1000) by 30k steps;
# with its learning rate at 1e-9 the policy stays at its initialization and drops in ~25 steps.
A2C_SUITE = """
name: regsuite
seeds: 3
budget: {{total_steps: 30000, eval_every: 30000, eval_episodes: 5}}
experiments:
  - algo: a2c
    envs: [InvertedPendulum-v5]
    hyperparameters:
      num_envs: 8
      entropy_coef: 0.0
      anneal_lr: true
      normalize_observations: true
      normalize_rewards: true
      learning_rate: {learning_rate}
"""


def test_missing_baseline_is_a_clear_error(tmp_path, write_suite):
    suite = write_suite(SUITE.format(name="nobase", learning_rate=1e-3))
    completed = run_cli("regress", "--suite", str(suite), "--baseline", str(tmp_path / "none.json"), "--results-dir", str(tmp_path / "results"), cwd=tmp_path)
    assert completed.returncode == 2 and "no baseline at" in completed.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.learning
def test_broken_variant_is_flagged_by_name(write_suite, tmp_path):
    """Baseline: A2C on InvertedPendulum, 3 seeds. The same configuration with its learning
    rate set to effectively zero (1e-9) fails on 2 new seeds, named (healthy seeds score about
    1,000, broken ones about 5: a handful of seeds tells them apart). (That unbroken code on new
    seeds passes is what ``make regress`` checks in CI, against the committed ci baseline.)"""
    healthy = write_suite(A2C_SUITE.format(learning_rate=7e-4), "healthy.yaml")
    broken = write_suite(A2C_SUITE.format(learning_rate=1e-9), "broken.yaml")
    baseline = tmp_path / "baseline.json"
    common = ["--workers", "2", "--results-dir", str(tmp_path / "results")]

    completed = run_cli("baseline", "--suite", str(healthy), "--output", str(baseline), *common, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr + completed.stdout
    stored = json.loads(baseline.read_text())
    (group,) = stored["groups"]
    assert group["seeds"] == [0, 1, 2] and stored["code"]["git_sha"] and np.mean(group["scores"]) > 900  # random: ~5

    completed = run_cli("regress", "--suite", str(broken), "--baseline", str(baseline), "--seeds", "100", "101", *common, cwd=tmp_path)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "REGRESSION a2c @ InvertedPendulum-v5" in completed.stdout
    assert "learning_rate 0.0007 -> 1e-09" in completed.stdout
