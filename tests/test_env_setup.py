"""Environments beyond an id: per-experiment ``env_kwargs`` and a list of gymnasium wrappers,
through a suite, ``train --set``, every place a run makes envs, the run key, bundles and verdicts."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from conftest import run_cli_in_process

from agents.env_setup import EnvSetup, parse_env_kwargs, parse_wrappers
from agents.envs import env_spec, make_vector_env
from agents.errors import ConfigError
from agents.meta import TaskEnvs
from benchmark import bundles
from benchmark.analysis import verdicts
from benchmark.analysis.reference import ReferenceScore
from benchmark.config import load_suite
from benchmark.run_record import RunRecord
from benchmark.training import loop

SUITE = """
name: envopts
seeds: [0]
budget: {{total_steps: 256, eval_every: 128, eval_episodes: 3}}
experiments:
  - algo: {algo}
    envs: [{env}]
    hyperparameters: {hyperparameters}
{options}
"""
WRAPPED = """\
    env_kwargs: {length: 3, max_episode_steps: 7}
    wrappers:
      - gymnasium.wrappers:TimeAwareObservation
      - gymnasium.wrappers.ClipReward: {min_reward: -0.005, max_reward: 0.5}
"""
CORRIDOR = "tests.plugin_example:PluginCorridor-v0"


def corridor_suite(
    write_suite, options: str = WRAPPED, algo: str = "ppo", hyperparameters: str = "{num_envs: 2, num_steps: 32, hidden_sizes: [8]}", name: str = "suite.yaml"
):
    return write_suite(SUITE.format(algo=algo, env=CORRIDOR, hyperparameters=hyperparameters, options=options), name)


def test_wrapper_forms_are_one_canonical_list_and_bad_ones_are_named():
    assert parse_wrappers(["a.b:C", {"a.b.D": {"x": 1}}, {"a.b:E": None}]) == [{"a.b:C": {}}, {"a.b.D": {"x": 1}}, {"a.b:E": {}}]
    for value, message in (
        ("a.b:C", "wrappers must be a list"),
        (["gymnasium"], "'gymnasium' is not an import path"),
        ([{"a.b:C": {}, "a.b:D": {}}], "wrappers[0]: give an import path, or one mapping"),
        ([{"a.b:C": [1]}], "wrappers[0] a.b:C must be a mapping"),
        ([{"a.b:C": {"f": object()}}], "values must be numbers, strings"),
    ):
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_wrappers(value)
    with pytest.raises(ConfigError, match="'1x' is not a keyword argument name"):
        parse_env_kwargs({"1x": 0})


def test_kwargs_and_wrappers_shape_the_env_spec():
    plain = env_spec(CORRIDOR)
    setup = EnvSetup(CORRIDOR, {"max_episode_steps": 7}, (("gymnasium.wrappers:TimeAwareObservation", {}),))
    wrapped = env_spec(setup)
    assert plain.observation_shape == (1,) and plain.max_episode_steps == 50 and plain.setup is None
    assert wrapped.observation_shape == (2,) and wrapped.max_episode_steps == 7 and wrapped.setup == setup
    assert env_spec(EnvSetup(CORRIDOR)) is plain  # an id alone and its plain setup are one env


def test_the_run_key_changes_only_when_env_options_are_set(write_suite):
    options = corridor_suite(write_suite, WRAPPED)
    plain = corridor_suite(write_suite, "", name="plain.yaml")
    (with_options,), (without,) = load_suite(str(options)).specs, load_suite(str(plain)).specs
    assert with_options.run_key != without.run_key
    assert dataclasses.replace(with_options, env_kwargs={}, wrappers=[]).run_key == without.run_key
    assert with_options.env_kwargs == {"length": 3, "max_episode_steps": 7}
    assert with_options.wrappers == [
        {"gymnasium.wrappers:TimeAwareObservation": {}},
        {"gymnasium.wrappers.ClipReward": {"min_reward": -0.005, "max_reward": 0.5}},
    ]
    # a published record written before env options existed still reads: its run keys are unchanged
    assert all(run.spec.run_key == key and run.spec.env.plain for key, run in bundles.read("results/published/mujoco").runs.items())


def test_training_and_evaluation_envs_are_made_with_the_options(write_suite):
    """The TimeAwareObservation wrapper makes the observation 2-D: an env made without it would
    not fit the networks; the cap of 7 steps and the clipped rewards show in the evaluations."""
    (spec,) = load_suite(str(corridor_suite(write_suite))).specs
    result = loop.run(spec)
    lengths = [length for evaluation in result.evaluations for length in evaluation.lengths]
    assert lengths and max(lengths) <= 7
    returns = [value for evaluation in result.evaluations for value in evaluation.returns]
    assert all(value >= -0.005 * 7 - 1e-9 for value in returns)  # each step's -0.01 clipped to -0.005


def test_distributed_collectors_make_the_same_envs(write_suite):
    hyperparameters = "{num_envs: 2, num_steps: 32, hidden_sizes: [8], normalize_observations: false, normalize_rewards: false}"
    (spec,) = load_suite(str(corridor_suite(write_suite, hyperparameters=hyperparameters))).specs
    inline = dataclasses.replace(spec, distributed={"collectors": 2, "backend": "inline"})
    assert [e.returns for e in loop.run(inline).evaluations] == [e.returns for e in loop.run(spec).evaluations]


def test_off_policy_and_vector_envs_take_the_options(write_suite):
    (spec,) = load_suite(str(corridor_suite(write_suite, algo="dqn", hyperparameters="{learning_starts: 64, hidden_sizes: [8]}"))).specs
    assert loop.run(spec).evaluations[-1].lengths
    envs = make_vector_env(spec.env, 2)
    observations, _ = envs.reset(seed=0)
    assert observations.shape == (2, 2)
    envs.close()


def test_a_task_family_takes_env_kwargs():
    envs = TaskEnvs(EnvSetup("reprorl/PointNav-v0", {"max_episode_steps": 20}), 2, seed=0)
    assert envs.horizon == 20
    envs.close()


def test_bad_options_are_refused_at_load_in_one_line_and_nothing_runs(write_suite, tmp_path):
    for options, message in (
        ("    wrappers: [gymnasium.wrappers:TimeAwareObs]", "cannot import 'gymnasium.wrappers:TimeAwareObs' (AttributeError"),
        ("    wrappers: [nowhere.at_all:Wrapper]", "No module named 'nowhere'"),
        ("    wrappers: [{gymnasium.wrappers:ClipReward: {bogus: 1}}]", "wrappers[0] gymnasium.wrappers:ClipReward refused (TypeError"),
        ("    wrappers: [gymnasium.wrappers:ClipAction]", "ClipAction requires a Box action space"),
        ("    env_kwargs: {width: 3}", "env_kwargs {'width': 3} refused (TypeError"),
        ("    env_kwargs: [1]", "env_kwargs must be a mapping"),
    ):
        suite = corridor_suite(write_suite, options)
        completed = run_cli_in_process("run", "--suite", str(suite), "--results-dir", str(tmp_path / "results"), cwd=tmp_path)
        assert completed.returncode == 2 and len(completed.stderr.strip().splitlines()) == 1, completed.stderr
        assert message in completed.stderr, completed.stderr
        assert not (tmp_path / "results").exists()


def test_train_sets_env_options_bundles_carry_them_and_verdicts_say_not_comparable(tmp_path):
    arguments = ("train", "--algo", "ppo", "--env", CORRIDOR, "--steps", "128", "--eval-episodes", "2", "--results-dir", str(tmp_path / "results"))
    arguments += (
        "--set",
        "num_envs=2",
        "num_steps=32",
        "env_kwargs.length=3",
        "env_kwargs.max_episode_steps=7",
        "wrappers=[gymnasium.wrappers:TimeAwareObservation]",
    )
    completed = run_cli_in_process(*arguments, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    (suite_file,) = (tmp_path / "results" / "suites").glob("train-ppo-*.yaml")
    (experiment,) = yaml.safe_load(suite_file.read_text())["experiments"]
    assert experiment["env_kwargs"] == {"length": 3, "max_episode_steps": 7}
    assert experiment["wrappers"] == ["gymnasium.wrappers:TimeAwareObservation"]
    exported = run_cli_in_process(
        "export", "--suite", str(suite_file), "--results-dir", str(tmp_path / "results"), "--output", str(tmp_path / "bundle"), cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    (run,) = bundles.read(tmp_path / "bundle").runs.values()
    assert run.spec.env_kwargs == {"length": 3, "max_episode_steps": 7} and run.spec.run_key == load_suite(str(suite_file)).specs[0].run_key
    assert json.loads((tmp_path / "bundle" / "manifest.json").read_text())["schema_version"] == bundles.SCHEMA_VERSION
    published = ReferenceScore("a paper", "", "ppo", "PluginCorridor-v0", 128, "final eval", 1.0, 0.1, 5, "PluginCorridor", "v0", "ppo", "final_eval", False)
    records = tuple(
        RunRecord(dataclasses.replace(run.spec, env_kwargs={}, wrappers=[], seed=seed), "FINISHED", f"r{seed}", value) for seed, value in enumerate([1.0, 1.1])
    )
    [plain] = verdicts.judge_cases([verdicts.Case("ppo", "ppo", "PluginCorridor-v0", 128, records)], (published,), per_seed={})
    assert plain.verdict == "inconclusive"  # the 90% interval, about +0.05 ± 0.19, is not inside ±0.2 of the source's mean
    [changed] = verdicts.judge_cases(
        [verdicts.Case("ppo", "ppo", "PluginCorridor-v0", 128, records, env_changed=run.spec.env.describe())], (published,), per_seed={}
    )
    assert changed.verdict == "not comparable" and "max_episode_steps=7" in changed.reason


def test_a_study_makes_the_env_as_its_base_suite_does_and_exports_it(write_suite, tmp_path):
    """The trials train on the wrapped env (the TimeAwareObservation wrapper makes observations
    2-D: a plain env would not fit the networks), and the exported tuned suite keeps the options."""
    from benchmark.config import name_from

    suite = corridor_suite(write_suite, name="options.yaml")
    results = ("--results-dir", str(tmp_path / "results"))
    study = ("--algo", "ppo", "--env", CORRIDOR, "--suite", str(suite), "--budget", "256", "--trials", "1", "--reference", "1", "--random", "-1")
    tuned = run_cli_in_process("tune", *study, *results, cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    assert "(1 complete)" in tuned.stdout, tuned.stdout[-2000:]
    exported = tmp_path / "tuned.yaml"
    name = name_from(f"ppo-{CORRIDOR}")
    done = run_cli_in_process("tune", "export", name, "--output", str(exported), *results, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (experiment,) = yaml.safe_load(exported.read_text())["experiments"]
    assert experiment["env_kwargs"] == {"length": 3, "max_episode_steps": 7}
    assert experiment["wrappers"][0] == {"gymnasium.wrappers:TimeAwareObservation": {}}
    assert load_suite(str(exported)).specs[0].env.describe().startswith(f"{CORRIDOR} (length=3, max_episode_steps=7; ")
    suite.write_text(suite.read_text().replace("length: 3", "length: 4"))  # the suite changed since: no silent resume
    again = run_cli_in_process("tune", *study, *results, cwd=tmp_path)
    assert again.returncode == 2 and "started from suite 'envopts' with other fixed hyperparameters or env settings" in again.stderr, again.stderr
