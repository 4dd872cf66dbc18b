"""Optuna studies: search spaces, the objective's bookkeeping, and the real `tune` CLI on tiny budgets."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from conftest import run_cli_in_process as run_cli
from mlflow.tracking import MlflowClient

import agents
from agents.api import ConfigError
from benchmark import tracking
from benchmark.config import Budget, load_suite
from benchmark.tuning import objective as tuning_objective
from benchmark.tuning import settings as tuning_settings
from benchmark.tuning import storage as tuning_storage
from benchmark.tuning.search_space import available_search_spaces, load_search_space


def write_space(tmp_path: Path, parameters: str, algo: str = "ppo") -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(f"algo: {algo}\nparameters:\n" + textwrap.indent(textwrap.dedent(parameters), "  "))
    return path


# ------------------------------------------------------------------------------ search spaces


def test_every_algorithm_has_a_search_space():
    from agents.registry import REGISTRY

    assert set(available_search_spaces()) == set(REGISTRY)  # ours; a plug-in ships its own


@pytest.mark.parametrize("algo", available_search_spaces())
def test_shipped_search_spaces_load_and_sample_valid_configs(algo):
    space = load_search_space(algo)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        values = space.sample(trial)
        agents.resolve_config(algo, values)  # every draw is a config the algorithm accepts
        study.tell(trial, 0.0)


def test_powers_of_two_layer_stacks_and_conditions(tmp_path):
    space = load_search_space(
        "ppo",
        write_space(
            tmp_path,
            """
        num_steps: {low: 64, high: 1024, power_of_two: true}
        learning_rate: {low: 1.0e-5, high: 1.0e-2, log: true}
        entropy_method: {choices: [no_entropy, regularized]}
        entropy_coef: {low: 1.0e-6, high: 0.1, log: true, when: {entropy_method: regularized}}
        hidden_sizes: {width: {choices: [16, 32]}, depth: {low: 1, high: 3}}
    """,
        ),
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_methods = set()
    for _ in range(60):
        trial = study.ask()
        values = space.sample(trial)
        study.tell(trial, 0.0)
        assert values["num_steps"] in (64, 128, 256, 512, 1024)
        assert 1e-5 <= values["learning_rate"] <= 1e-2
        width, depth = values["hidden_sizes"][0], len(values["hidden_sizes"])
        assert values["hidden_sizes"] == [width] * depth and width in (16, 32) and 1 <= depth <= 3
        assert ("entropy_coef" in values) == (values["entropy_method"] == "regularized")
        seen_methods.add(values["entropy_method"])
    assert seen_methods == {"no_entropy", "regularized"}


def test_extends_and_exclude_inherit_a_space():
    ppo, ppo_kl = load_search_space("ppo"), load_search_space("ppo_kl")
    names = [p.name for p in ppo_kl.parameters]
    assert "clip_range" not in names and "kl_target" in names
    assert set(names) - {"kl_target"} == {p.name for p in ppo.parameters} - {"clip_range"}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("learning_rat: {low: 1.0e-5, high: 1.0e-2, log: true}", "unknown hyperparameter 'learning_rat'"),
        ("learning_rate: {low: 1.0e-5, high: 2.0, log: true}", "'learning_rate' = 2.0"),
        ("gamma: {choices: [0.99, 1.5]}", "'gamma' = 1.5"),
        ("num_steps: {low: 60, high: 1024, power_of_two: true}", "powers of two"),
        ("learning_rate: {low: 0.0, high: 0.1, log: true}", "needs low > 0"),
        ("learning_rate: {low: 0.1, high: 0.01}", "low must be below high"),
        ("learning_rate: {lo: 0.1, high: 0.01}", "unknown parameter 'learning_rate' key 'lo'"),
        ("entropy_coef: {low: 0.001, high: 0.1, when: {entropy_method: regularized}}", "not a fixed value or a parameter declared before"),
    ],
)
def test_bad_search_space_is_a_clear_error(tmp_path, parameters, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.").replace("[", r"\[")):
        load_search_space("ppo", write_space(tmp_path, parameters))


def test_unknown_algorithm_and_missing_space():
    with pytest.raises(ConfigError, match="unknown algorithm 'ppp'.*did you mean 'ppo'"):
        load_search_space("ppp")
    with pytest.raises(ConfigError, match="does not exist"):
        load_search_space("ppo", Path("/nonexistent/space.yaml"))


# ------------------------------------------------------------------------------ the setting


def settings(**changes) -> tuning_settings.StudySettings:
    values = dict(
        algo="ppo",
        env_id="CartPole-v1",
        budget=Budget(1000, 100, 2),
        seeds_per_trial=3,
        base_suite=None,
        base_hyperparameters={},
        space={},
        random_score=20.0,
        reference_score=500.0,
        reference_source="test",
    )
    return tuning_settings.StudySettings(**{**values, **changes})


def test_normalized_score_and_trial_seeds():
    setting = settings()
    assert setting.normalize(20.0) == 0.0 and setting.normalize(500.0) == 1.0 and setting.normalize(260.0) == 0.5
    seeds = [setting.trial_seeds(number) for number in range(4)]
    assert seeds[2] == setting.trial_seeds(2) and len(seeds[2]) == 3  # fixed per trial number
    flat = [seed for trial in seeds for seed in trial]
    assert len(set(flat)) == len(flat)  # different across trials
    assert min(flat) >= tuning_settings.TRIAL_SEED_BASE  # never the seeds a suite runs (0, 1, ...)
    assert settings(seed=5).trial_seeds(0) != setting.trial_seeds(0)


def test_settings_round_trip_and_resume_checks():
    setting = settings()
    assert tuning_settings.StudySettings.from_dict(setting.to_dict()) == setting
    assert tuning_settings.resumed_settings(setting, "ppo", "CartPole-v1", {"budget": None, "seed": 0}) == setting
    with pytest.raises(ConfigError, match="tunes ppo on CartPole-v1, not sac on Pendulum-v1"):
        tuning_settings.resumed_settings(setting, "sac", "Pendulum-v1", {})
    with pytest.raises(ConfigError, match="created with --budget 1000"):
        tuning_settings.resumed_settings(setting, "ppo", "CartPole-v1", {"budget": 2000})


def test_base_setting_comes_from_the_suite_that_runs_the_pair():
    name, budget, fixed, options = tuning_settings.base_setting("ppo", "CartPole-v1", None)
    classic = next(s for s in load_suite("classic").specs if s.algo == "ppo" and s.env_id == "CartPole-v1")
    assert name == "classic" and budget == classic.budget and fixed == classic.overrides and options == {}
    assert tuning_settings.base_setting("ppo", "CartPole-v1", "none") == (None, None, {}, {})
    with pytest.raises(ConfigError, match="suite 'her' has no run of ppo on CartPole-v1"):
        tuning_settings.base_setting("ppo", "CartPole-v1", "her")


@pytest.mark.parametrize("sampler", tuning_settings.SAMPLERS)
def test_every_sampler_draws_from_a_space_and_repeats_itself_when_seeded(sampler):
    space = load_search_space("ppo")

    def draws() -> list[dict]:
        study = optuna.create_study(direction="maximize")
        values = []
        for number in range(12):  # past TPE's and CMA-ES's random start
            study.sampler = tuning_objective.make_sampler(sampler, tuning_objective.sampler_seed(0, number, 0))
            trial = study.ask()
            values.append(space.sample(trial))
            study.tell(trial, float(values[-1]["learning_rate"]))
        return values

    first = draws()
    assert first == draws() and len({repr(v) for v in first}) == 12


def test_pruners_are_built_from_the_setting():
    setting = settings()
    assert isinstance(tuning_objective.make_pruner("median", setting), optuna.pruners.MedianPruner)
    assert isinstance(tuning_objective.make_pruner("hyperband", setting), optuna.pruners.HyperbandPruner)
    assert isinstance(tuning_objective.make_pruner("none", setting), optuna.pruners.NopPruner)
    with pytest.raises(ConfigError, match="unknown pruner"):
        tuning_objective.make_pruner("asha", setting)


def test_sampler_seeds_differ_by_trial_and_worker():
    seeds = {tuning_objective.sampler_seed(0, number, worker) for number in range(10) for worker in range(3)}
    assert len(seeds) == 30 and tuning_objective.sampler_seed(0, 4, 1) == tuning_objective.sampler_seed(0, 4, 1)


def test_redact_hides_passwords():
    assert tracking.redact("postgresql://user:secret@db:5432/optuna") == "postgresql://user:***@db:5432/optuna"
    assert tracking.redact("sqlite:////tmp/optuna.db") == "sqlite:////tmp/optuna.db"


# ---------------------------------------------------------------------------- the CLI, for real

# The classic suite's PPO CartPole setting (8 envs) with the shipped PPO space, 2,048 steps a
# trial. The median pruner may prune after two finished trials, from the first evaluation on
# (with seeds 0, 1 and 3 alike, 2-4 of 6 trials complete and the others are pruned).
STUDY = ("--algo", "ppo", "--env", "CartPole-v1", "--budget", "2048", "--pruner-startup-trials", "2", "--pruner-warmup-steps", "0")


def trial_runs(results: Path, study: str) -> list:
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"tune-{study}")
    return client.search_runs([experiment.experiment_id], max_results=1000)


def test_study_prunes_logs_every_trial_exports_a_suite_and_resumes(tmp_path):
    results = tmp_path / "results"
    first = run_cli("tune", *STUDY, "--trials", "6", "--seed", "3", "--results-dir", str(results), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    storage = tuning_storage.open_storage(tuning_storage.default_storage_url(results))
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=storage)
    states = [trial.state.name for trial in study.trials]
    assert len(states) == 6 and set(states) <= {"COMPLETE", "PRUNED"}, first.stderr
    assert "PRUNED" in states and "COMPLETE" in states, first.stderr
    assert "trial 0 " in first.stderr and "best: trial" in first.stdout
    assert "already reported" not in first.stderr  # one report per step, the final evaluation's included
    assert study.metric_names == [tuning_settings.OBJECTIVE_NAME]  # optuna-dashboard names the objective
    for trial in study.trials:  # and shows each parameter as the run used it (a power of two as drawn, not its exponent)
        assert trial.params["num_steps"] in [2**e for e in range(6, 12)] and trial.user_attrs["overrides"]["num_steps"] == trial.params["num_steps"]

    runs = trial_runs(results, "ppo-CartPole-v1")
    parents = [r for r in runs if r.data.tags.get("kind") == "study"]
    children = [r for r in runs if r.data.tags.get("kind") == "trial"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(int(r.data.tags["trial_number"]) for r in children) == list(range(6))
    for child in children:
        trial = study.trials[int(child.data.tags["trial_number"])]
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert child.data.tags["trial_state"] == trial.state.name
        assert child.info.status == {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}[trial.state.name]
        assert child.data.params["hp.num_envs"] == "8"  # the classic suite's setting under the tuned values
        assert any(key.startswith("tuned.") for key in child.data.params)
        assert "objective/intermediate" in child.data.metrics
        if trial.state.name == "COMPLETE":
            assert child.data.metrics["objective"] == pytest.approx(trial.value)

    shown = run_cli("tune", "show", "ppo-CartPole-v1", "--results-dir", str(results), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "best trials" in shown.stdout and "parameter importances" in shown.stdout
    for plot in ("optimization_history", "param_importances", "intermediate_values"):
        assert (results / "tune" / "ppo-CartPole-v1" / f"{plot}.png").stat().st_size > 1000

    exported = tmp_path / "tuned.yaml"
    export = run_cli("tune", "export", "ppo-CartPole-v1", "--seeds", "3", "--output", str(exported), "--results-dir", str(results), cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    suite = load_suite(str(exported))
    best = max((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert [spec.seed for spec in suite.specs] == [0, 1, 2]
    assert suite.specs[0].overrides == best.user_attrs["overrides"] and suite.specs[0].budget.total_steps == 2048
    dry = run_cli("run", "--suite", str(exported), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "3 runs" in dry.stdout, dry.stderr
    again = run_cli("tune", "export", "ppo-CartPole-v1", "--output", str(exported), "--results-dir", str(results), cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr

    # resuming adds trials with new numbers and new seeds, under the same parent run
    second = run_cli("tune", "--algo", "ppo", "--env", "CartPole-v1", "--trials", "2", "--results-dir", str(results), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=storage)
    assert [trial.number for trial in study.trials] == list(range(8))
    seeds = [seed for trial in study.trials for seed in trial.user_attrs["seeds"]]
    assert len(set(seeds)) == 8
    runs = trial_runs(results, "ppo-CartPole-v1")
    assert len([r for r in runs if r.data.tags.get("kind") == "study"]) == 1
    assert len([r for r in runs if r.data.tags.get("kind") == "trial"]) == 8


def test_two_workers_share_one_sqlite_study(tmp_path):
    results = tmp_path / "results"
    completed = run_cli("tune", *STUDY, "--trials", "4", "--workers", "2", "--pruner", "none", "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "locked" not in completed.stderr.lower() and "Traceback" not in completed.stderr
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=tuning_storage.open_storage(tuning_storage.default_storage_url(results)))
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == 4  # the workers drew different trials


def test_a_failing_trial_is_recorded_and_the_study_goes_on(tmp_path):
    # an infeasible draw (more minibatches than a rollout has samples) fails before training
    space = write_space(
        tmp_path,
        """
        num_minibatches: {choices: [1, 4096]}
    """,
    )
    results = tmp_path / "results"
    completed = run_cli(
        "tune",
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--budget",
        "512",
        "--suite",
        "none",
        "--space",
        str(space),
        "--trials",
        "4",
        "--pruner",
        "none",
        "--sampler",
        "random",
        "--results-dir",
        str(results),
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=tuning_storage.open_storage(tuning_storage.default_storage_url(results)))
    by_choice = {t.params["num_minibatches"]: t.state.name for t in study.trials}
    assert by_choice == {1: "COMPLETE", 4096: "FAIL"}, completed.stderr
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert "infeasible" in failed[0].user_attrs["error"] and "FAIL infeasible" in completed.stderr
    runs = {int(r.data.tags["trial_number"]): r for r in trial_runs(results, "ppo-CartPole-v1") if r.data.tags.get("kind") == "trial"}
    assert all(runs[t.number].info.status == "FAILED" and runs[t.number].data.tags["trial_state"] == "FAIL" for t in failed)


def test_a_non_finite_loss_fails_the_trial_and_its_mlflow_run(tmp_path, monkeypatch):
    from benchmark import tracking
    from benchmark.training import loop as training_loop
    from benchmark.training.control import NonFiniteLoss

    def diverge(spec, tracker, on_evaluation=None):
        raise NonFiniteLoss("non-finite update values at env step 64: policy_loss=nan")

    monkeypatch.setattr(training_loop, "run", diverge)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = tracking.experiment_id(uri, "tune-x", tmp_path / "artifacts")
    parent = tracking.start_parent_run(uri, experiment, "x", {"kind": "study"})
    objective = tuning_objective.Objective("x", settings(), load_search_space("ppo"), uri, experiment, parent.run_id, "cpu")
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=2, catch=(tuning_objective.TrialFailed,))
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    assert "NonFiniteLoss" in study.trials[0].user_attrs["error"]
    child = MlflowClient(uri).get_run(study.trials[0].user_attrs["mlflow_run_id"])
    assert child.info.status == "FAILED" and child.data.tags["trial_state"] == "FAIL" and "policy_loss=nan" in child.data.tags["error"]


def test_pruner_steps_are_the_scheduled_ones_for_every_seed(tmp_path, monkeypatch):
    """8 envs and eval_every 204: evaluations land at 208, 408, 616, ... 2040 and 2048; the
    pruner sees 204, 408, 612, ... 2040, 2048, then the same plus 2048 for the second seed."""
    from benchmark import tracking
    from benchmark.training import loop as training_loop
    from benchmark.training.results import Evaluation, RunResult

    def fake_run(spec, tracker, on_evaluation=None):
        result = RunResult(spec)
        steps = [next(s for s in range(8, 2049, 8) if s >= k * 204) for k in range(1, 11)] + [2048]
        for step in steps:
            result.evaluations.append(Evaluation(step, [100.0 + step / 100], [10]))
            on_evaluation(result.evaluations[-1])
        return result

    monkeypatch.setattr(training_loop, "run", fake_run)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = tracking.experiment_id(uri, "tune-x", tmp_path / "artifacts")
    parent = tracking.start_parent_run(uri, experiment, "x", {"kind": "study"})
    setting = settings(budget=Budget(2048, 204, 2), seeds_per_trial=2)
    study = optuna.create_study(direction="maximize")
    study.optimize(tuning_objective.Objective("x", setting, load_search_space("ppo"), uri, experiment, parent.run_id, "cpu"), n_trials=1)
    scheduled = [204 * k for k in range(1, 11)] + [2048]
    assert sorted(study.trials[0].intermediate_values) == scheduled + [2048 + step for step in scheduled]
    final = setting.normalize(100.0 + 2048 / 100)
    assert study.trials[0].intermediate_values[2048] == pytest.approx(final)  # seed 0's final score
    assert study.trials[0].intermediate_values[2048 + 204] == pytest.approx((final + setting.normalize(102.08)) / 2)
    assert study.trials[0].value == pytest.approx(final)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("--algo", "ppp", "--env", "CartPole-v1"), "unknown algorithm 'ppp'"),
        (("--algo", "ppo", "--env", "CartPol-v1"), "unknown environment 'CartPol-v1'"),
        (("--algo", "ppo", "--env", "reprorl/CartPoleNoVel-v1", "--budget", "512"), "no published reference score for reprorl/CartPoleNoVel-v1"),
        (("--algo", "ppo", "--env", "CartPole-v1", "--storage", "nosuchdb://x/y"), "cannot open the Optuna storage 'nosuchdb://x/y'"),
        (("--algo", "ppo", "--env", "CartPole-v1", "--storage", "sqlite:////nonexistent/dir/optuna.db"), "directory /nonexistent/dir does not exist"),
        (("--algo", "ppo", "--env", "CartPole-v1", "--trials", "0"), "--trials and --workers must be >= 1"),
        (("--algo", "ppo", "--env", "CartPole-v1", "--pruner-warmup-steps", "-1"), "--pruner-warmup-steps must be >= 0"),
        (("--algo", "ppo", "--env", "CartPole-v1", "--timeout", "0"), "--timeout must be a positive number"),
        (("--algo", "ppo", "--env", "CartPole-v1", "--seeds-per-trial", "0"), "--seeds-per-trial must be >= 1"),
        (("--algo", "ppo", "--env", "CartPole-v1", "--seeds-per-process", "0"), "--seeds-per-process must be >= 1"),
        (("--algo", "ppo", "--env", "CartPole-v1", "--budget", "-5"), "--budget must be a positive number"),
        (("--algo", "ppo", "--env", "Pendulum-v1", "--suite", "her", "--budget", "512"), "suite 'her' has no run of ppo on Pendulum-v1"),
        (("--env", "CartPole-v1"), "tune needs --algo and --env"),
        (("--algo", "ppo", "--env", "CartPole-v1", "--study", "it's"), 'study name "it\'s": use letters'),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, monkeypatch, capsys, arguments, message):
    from benchmark.cli import app as cli

    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    assert cli.main(["tune", *arguments, "--results-dir", str(results)]) == 2
    assert message in capsys.readouterr().err.replace("\n", " ")
    assert not results.exists() and not list(tmp_path.glob("*.db"))


def test_unknown_parameter_in_a_space_file_is_an_error_before_anything_is_written(tmp_path):
    space = write_space(tmp_path, "learning_rat: {low: 1.0e-5, high: 1.0e-2, log: true}")
    results = tmp_path / "results"
    completed = run_cli("tune", "--algo", "ppo", "--env", "CartPole-v1", "--space", str(space), "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 2 and "unknown hyperparameter 'learning_rat'" in completed.stderr
    assert not results.exists()


def test_reference_flag_tunes_an_env_without_a_published_score_and_show_needs_a_study(tmp_path):
    results = tmp_path / "results"
    completed = run_cli(
        "tune",
        "--algo",
        "ppo",
        "--env",
        "reprorl/CartPoleNoVel-v1",
        "--budget",
        "512",
        "--reference",
        "200",
        "--suite",
        "none",
        "--trials",
        "1",
        "--pruner",
        "none",
        "--results-dir",
        str(results),
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    study = optuna.load_study(study_name="ppo-reprorl-CartPoleNoVel-v1", storage=tuning_storage.open_storage(tuning_storage.default_storage_url(results)))
    setting = tuning_storage.study_settings(study)
    assert setting.reference_score == 200.0 and setting.random_score == pytest.approx(23.68)
    trial = study.trials[0]
    assert trial.value == pytest.approx(setting.normalize(trial.user_attrs["final_returns"][0]))
    missing = run_cli("tune", "show", "ppo-CartPole-v1", "--results-dir", str(results), cwd=tmp_path)
    assert missing.returncode == 2 and "no study 'ppo-CartPole-v1'" in missing.stderr and "ppo-reprorl-CartPoleNoVel-v1" in missing.stderr
    nothing = run_cli("tune", "show", "x", "--results-dir", str(tmp_path / "empty"), cwd=tmp_path)
    assert nothing.returncode == 2 and "no study storage" in nothing.stderr and not (tmp_path / "empty").exists()


def test_a_resumed_study_keeps_the_search_space_it_was_created_with(tmp_path):
    results = tmp_path / "results"
    space = write_space(tmp_path, "num_epochs: {choices: [1, 2]}")
    common = ("tune", "--algo", "ppo", "--env", "CartPole-v1", "--budget", "256", "--suite", "none", "--pruner", "none", "--results-dir", str(results))
    assert run_cli(*common, "--trials", "1", "--space", str(space), cwd=tmp_path).returncode == 0
    resumed = run_cli(*common, "--trials", "1", cwd=tmp_path)  # no --space: the study's own
    assert resumed.returncode == 0, resumed.stderr
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=tuning_storage.open_storage(tuning_storage.default_storage_url(results)))
    assert [set(t.params) for t in study.trials] == [{"num_epochs"}, {"num_epochs"}]
    space.write_text("algo: ppo\nparameters:\n  num_epochs: {choices: [1, 3]}\n")
    other = run_cli(*common, "--trials", "1", "--space", str(space), cwd=tmp_path)
    assert other.returncode == 2 and "searches the space it was created with" in other.stderr


def test_storage_opens_in_optuna_dashboard(tmp_path):
    from optuna_dashboard import wsgi

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="shown", storage=tuning_storage.open_storage(url), direction="maximize")
    study.set_user_attr(tuning_settings.SETTINGS_ATTR, settings().to_dict())
    study.add_trial(optuna.trial.create_trial(params={"x": 1.0}, distributions={"x": optuna.distributions.FloatDistribution(0, 2)}, value=0.5))
    from wsgiref.util import setup_testing_defaults

    environ = {"PATH_INFO": "/api/studies"}
    setup_testing_defaults(environ)
    statuses = []
    body = wsgi(url)(environ, lambda status, headers, exc_info=None: statuses.append(status))
    text = b"".join(body).decode()
    assert statuses[0].startswith("200") and '"shown"' in text


def test_journal_storage_url(tmp_path):
    storage = tuning_storage.open_storage(f"journal:{tmp_path / 'optuna.log'}")
    optuna.create_study(study_name="j", storage=storage)
    assert optuna.get_all_study_names(tuning_storage.open_storage(f"journal:{tmp_path / 'optuna.log'}")) == ["j"]


def test_opening_a_database_server_another_process_is_creating_retries(tmp_path, monkeypatch):
    """Two processes opening a new database on a server race to create its tables; the loser
    sees "table ... already exists" and must open the tables the winner made, while any other
    database error is reported at once. (A SQLite file is created under a lock instead: see
    test_stores; the server path is imitated here by a SQLite URL that skips that lock.)"""
    import sqlalchemy.exc

    real, calls = optuna.storages.RDBStorage, []

    class Raced(real):
        def __init__(self, url, **kwargs):
            calls.append(url)
            if len(calls) == 1:
                raise sqlalchemy.exc.OperationalError("CREATE TABLE alembic_version", {}, Exception("table alembic_version already exists"))
            super().__init__(url, **kwargs)

    class Broken(real):
        def __init__(self, url, **kwargs):
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("disk I/O error"))

    monkeypatch.setattr(tuning_storage.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(tuning_storage.stores, "sqlite_path", lambda url: None)  # as for postgresql://...
    monkeypatch.setattr(optuna.storages, "RDBStorage", Raced)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.create_study(study_name="raced", storage=tuning_storage.open_storage(url))
    assert len(calls) == 2 and optuna.get_all_study_names(real(url)) == ["raced"]

    monkeypatch.setattr(optuna.storages, "RDBStorage", Broken)
    with pytest.raises(ConfigError, match="cannot open the Optuna storage .*disk I/O error"):
        tuning_storage.open_storage(url)


def start_study(tmp_path: Path, *arguments: str) -> tuple[subprocess.Popen, Path]:
    """A `tune` invocation of PPO on CartPole with budgets too long to finish during a test."""
    results = tmp_path / "results"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmark",
            "tune",
            "--algo",
            "ppo",
            "--env",
            "CartPole-v1",
            "--budget",
            "1000000",
            "--pruner",
            "none",
            "--results-dir",
            str(results),
            *arguments,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, results


def wait_for_running_trials(process: subprocess.Popen, results: Path, count: int, seconds: float = 300) -> list:
    """The study's RUNNING trials once ``count`` of them have started training."""
    import time

    deadline, running = time.time() + seconds, []
    while time.time() < deadline and len(running) < count:
        time.sleep(0.5)
        if process.poll() is not None:
            pytest.fail(f"the invocation ended early ({process.returncode}): {process.communicate()[1]}")
        if (results / "optuna.db").exists():
            try:
                study = optuna.load_study(study_name="ppo-CartPole-v1", storage=tuning_storage.open_storage(tuning_storage.default_storage_url(results)))
                running = [t for t in study.trials if t.state.name == "RUNNING" and "mlflow_run_id" in t.user_attrs]
            except (KeyError, optuna.exceptions.OptunaError):
                pass  # the study is being created
    assert len(running) == count, f"{count} trial(s) should be running"
    return running


def worker_pids(process: subprocess.Popen) -> list[int]:
    """The invocation's worker processes and queue manager (not multiprocessing's resource
    tracker, nor the fork server the workers are forked from, which ends after the invocation)."""

    def children(pid: int) -> list[int]:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    found = []
    for child in children(process.pid):
        command = Path(f"/proc/{child}/cmdline").read_text()
        if "spawn_main" in command:
            found.append(child)
        elif "forkserver" in command:
            found += children(child)
    return found


def test_sigterm_stops_the_workers_and_marks_the_trials(tmp_path):
    import signal

    process, results = start_study(tmp_path, "--trials", "3", "--workers", "2")
    wait_for_running_trials(process, results, 2)
    workers = worker_pids(process)
    assert len(workers) >= 3  # two workers and the pool's queue manager
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr

    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=tuning_storage.open_storage(tuning_storage.default_storage_url(results)))
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]  # the third trial never started
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    for trial in study.trials:
        run = client.get_run(trial.user_attrs["mlflow_run_id"])
        assert run.info.status == "KILLED" and run.data.tags["trial_state"] == "FAIL"
    parent = client.get_run(client.get_run(study.trials[0].user_attrs["mlflow_run_id"]).data.tags["mlflow.parentRunId"])
    assert parent.info.status == "KILLED"
    for pid in workers:  # no worker outlives the invocation (the parent joined them: gone, or at most a zombie)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z"


def test_a_killed_worker_fails_its_trial_at_once(tmp_path):
    import signal

    process, results = start_study(tmp_path, "--trials", "1")
    (running,) = wait_for_running_trials(process, results, 1)
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    worker = int(client.get_run(running.user_attrs["mlflow_run_id"]).data.tags["pid"])
    assert worker in worker_pids(process)
    os.kill(worker, signal.SIGKILL)  # no chance to clean up: the invocation must notice
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1 and "trial task 0: BrokenProcessPool" in stderr + stdout, stderr

    trial = optuna.load_study(study_name="ppo-CartPole-v1", storage=tuning_storage.open_storage(tuning_storage.default_storage_url(results))).trials[0]
    assert trial.state.name == "FAIL" and "its worker ended" in trial.user_attrs["error"]
    run = MlflowClient(f"sqlite:///{results / 'mlflow.db'}").get_run(trial.user_attrs["mlflow_run_id"])
    assert run.info.status == "KILLED" and run.data.tags["trial_state"] == "FAIL"


def test_store_options_count_before_and_after_the_subcommand():
    from benchmark.cli.app import build_parser

    parser = build_parser()
    assert parser.parse_args(["tune", "--results-dir", "x", "show", "s"]).results_dir == Path("x")
    assert parser.parse_args(["tune", "show", "s", "--results-dir", "y"]).results_dir == Path("y")
    assert parser.parse_args(["tune", "export", "s"]).results_dir == Path("results")
    assert parser.parse_args(["tune", "--storage", "journal:a", "export", "s"]).storage == "journal:a"


TINY_PPO = {"num_envs": 2, "num_steps": 64, "num_minibatches": 2, "num_epochs": 2, "hidden_sizes": [16, 16]}


def _batched_study(tmp_path, seeds_per_process: int, pruner=None):
    from benchmark import tracking

    uri = f"sqlite:///{tmp_path / f'mlflow-{seeds_per_process}.db'}"
    experiment = tracking.experiment_id(uri, "tune-x", tmp_path / "artifacts")
    parent = tracking.start_parent_run(uri, experiment, "x", {"kind": "study"})
    setting = settings(budget=Budget(512, 256, 2), seeds_per_trial=3, base_hyperparameters=TINY_PPO)
    space = load_search_space("ppo", write_space(tmp_path, "learning_rate: {low: 1.0e-4, high: 1.0e-2, log: true}\n"))
    objective = tuning_objective.Objective("x", setting, space, uri, experiment, parent.run_id, "cpu", seeds_per_process=seeds_per_process)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0), pruner=pruner)
    study.optimize(objective, n_trials=1)
    return study.trials[0], MlflowClient(uri), MlflowClient(uri).get_run(study.trials[0].user_attrs["mlflow_run_id"])


def test_a_trials_seeds_batched_score_as_one_after_another(tmp_path):
    """--seeds-per-process 3: the trial's three seeds train as one batched model, with the final
    returns and objective of the seeds trained one after another (to float tolerance); the
    running objective is reported once per evaluation round, at the last seed's steps."""
    alone, _, _ = _batched_study(tmp_path, 1)
    batched, _, run = _batched_study(tmp_path, 3)
    assert batched.params == alone.params and batched.state.name == "COMPLETE"
    assert batched.user_attrs["final_returns"] == pytest.approx(alone.user_attrs["final_returns"], rel=1e-5)
    assert batched.value == pytest.approx(alone.value, rel=1e-5)
    assert sorted(alone.intermediate_values) == [256, 512, 768, 1024, 1280, 1536]
    assert sorted(batched.intermediate_values) == [1024 + 256, 1536]  # seed index 2's steps: all three seeds evaluated
    assert batched.intermediate_values[1536] == pytest.approx(alone.intermediate_values[1536], rel=1e-5)
    assert run.data.tags["seeds_per_process"] == "3" and "not_batched" not in run.data.tags


def test_a_pruned_batch_stops_every_seed(tmp_path):
    """A pruner that prunes at the first report: the batched trial is PRUNED there, and none of
    its seeds trains on to a second evaluation."""
    trial, client, run = _batched_study(tmp_path, 3, optuna.pruners.ThresholdPruner(lower=10.0))
    assert trial.state.name == "PRUNED" and sorted(trial.intermediate_values) == [1024 + 256]
    for seed in settings(seeds_per_trial=3).trial_seeds(0):
        history = client.get_metric_history(run.info.run_id, f"seed{seed}/eval/return_mean")
        assert [m.step for m in history] == [256], seed


def test_a_study_stored_before_a_field_was_renamed_reads_it_under_its_new_name():
    """A study keeps the space it was created with: VPG's former value_learning_rate reads as
    value_lr (in its parameters, its fixed settings and its base setting)."""
    from benchmark.tuning.search_space import space_from_dict
    from benchmark.tuning.settings import StudySettings

    space = space_from_dict(
        {"algo": "vpg", "fixed": {"value_learning_rate": 1e-3}, "parameters": {"value_learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}}}
    )
    assert [parameter.name for parameter in space.parameters] == ["value_lr"] and space.fixed == {"value_lr": 1e-3}
    stored = {
        "algo": "vpg",
        "env_id": "CartPole-v1",
        "budget": {"total_steps": 1000, "eval_every": 500, "eval_episodes": 2},
        "seeds_per_trial": 1,
        "base_suite": None,
        "base_hyperparameters": {"value_learning_rate": 1e-3},
        "space": {},
        "random_score": 0.0,
        "reference_score": 1.0,
        "reference_source": "test",
    }
    assert StudySettings.from_dict(stored).base_hyperparameters == {"value_lr": 1e-3}
