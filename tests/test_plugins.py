"""Algorithms of other packages: named by import path or declared as an entry point, checked
against the interface when first named, and run, batched and reported like ours."""

from __future__ import annotations

import warnings

import pytest
from conftest import run_cli_in_process

import agents
from agents import registry
from agents.configs.sac import SACConfig
from agents.envs import env_spec
from agents.errors import ConfigError

PATH = "tests.plugin_example:HalfTemperatureSAC"


@pytest.fixture
def fresh_registry():
    """The registry's caches emptied before and after (entry points are read once per process)."""
    registry.plugins.cache_clear()
    registry._plugin.cache_clear()
    yield
    registry.plugins.cache_clear()
    registry._plugin.cache_clear()


def _install(tmp_path, monkeypatch, entry_points: str) -> None:
    """A distribution on sys.path declaring ``entry_points`` (what ``pip install`` of a package
    with ``[project.entry-points."reprorl.algorithms"]`` leaves)."""
    info = tmp_path / "plugin_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[reprorl.algorithms]\n{entry_points}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_learner_named_by_import_path_is_checked_and_made(fresh_registry):
    assert registry.known(PATH) and not registry.known("tests.plugin_example")
    assert agents.config_class(PATH) is SACConfig
    spec = env_spec("Pendulum-v1")
    algo = agents.make(PATH, spec, {"hidden_sizes": [8]}, total_steps=100)
    assert type(algo).__name__ == "HalfTemperatureSAC" and algo.target_entropy == -0.5
    assert not agents.is_meta(PATH)


@pytest.mark.parametrize(
    "path,message",
    [
        ("tests.plugin_example:WithoutUpdate", "WithoutUpdate does not implement .*update"),
        ("tests.plugin_example:WithoutConfig", "WithoutConfig has no Config"),
        ("tests.plugin_example:WithUndecoratedConfig", "UndecoratedConfig sets actor_lr but is not decorated with @dataclass"),
        ("tests.plugin_example:not_a_class", "not_a_class is a function, not a learner class"),
        ("tests.plugin_example:Missing", "cannot import tests.plugin_example:Missing"),
        ("tests.no_such_module:Learner", "cannot import tests.no_such_module:Learner"),
    ],
)
def test_what_misses_the_interface_is_refused_by_name(fresh_registry, path, message):
    with pytest.raises(ConfigError, match=f"algorithm '{path}': {message}"):
        agents.config_class(path)


def test_an_entry_point_joins_the_registry_and_cannot_take_a_name_of_ours(fresh_registry, tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, f"half_sac = {PATH}\nsac = tests.plugin_example:HalfTemperatureSAC")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert registry.plugins()["half_sac"] == PATH and "sac" not in registry.plugins()
    assert any("'sac' names one of reprorl's own algorithms" in str(warning.message) for warning in caught)
    assert "half_sac" in agents.ALGORITHMS and len(agents.ALGORITHMS) == len(registry.REGISTRY) + len(registry.plugins())
    assert agents.algorithm_class("half_sac").__name__ == "HalfTemperatureSAC"
    assert agents.algorithm_class("sac").__name__ == "SAC"  # ours stays ours
    with pytest.raises(ConfigError, match=r"unknown algorithm 'half_sca'.*did you mean 'half_sac'"):
        agents.config_class("half_sca")


def test_a_suite_trains_a_plugin_batched_and_lists_it(tmp_path, write_suite, fresh_registry):
    """Through the real CLI: the import path in a suite, three seeds batched in one process
    (the learner inherits SAC's seed batch), stored and listed like ours."""
    suite = write_suite(
        f"""
        name: plugins
        seeds: [0, 1, 2]
        budget: {{total_steps: 300, eval_every: 150, eval_episodes: 1}}
        experiments:
          - algo: "{PATH}"
            envs: [Pendulum-v1]
            hyperparameters: {{hidden_sizes: [8], batch_size: 16, start_steps: 50, learning_starts: 50}}
        """
    )
    results = tmp_path / "results"
    env = {"PYTHONPATH": str(registry.__file__).rsplit("/agents/", 1)[0]}
    arguments = ("--seeds-per-process", "3", "--workers", "1", "--results-dir", str(results))
    completed = run_cli_in_process("run", "--suite", str(suite), *arguments, cwd=tmp_path, env=env)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "3/3 runs finished" in completed.stdout and "3 seeds batched" in completed.stdout
    reported = run_cli_in_process("report", "--suite", str(suite), "--results-dir", str(results), "--output", str(tmp_path / "report"), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr[-2000:]
    report = (tmp_path / "report" / "report.md").read_text()
    assert PATH in report and "Pendulum-v1" in report


def test_an_environment_named_by_import_path_trains_and_a_wrong_one_is_refused(tmp_path, write_suite):
    """``package.module:Env-vN``: the module is imported (registering the env) in the launching
    process and in every worker; a module or id that does not exist is one line, nothing stored."""
    text = """
        name: corridor
        seeds: [0]
        budget: {{total_steps: 400, eval_every: 200, eval_episodes: 2}}
        experiments:
          - algo: dqn
            envs: ["{env}"]
            hyperparameters: {{hidden_sizes: [8], learning_starts: 50}}
        """
    results = tmp_path / "results"
    suite = write_suite(text.format(env="tests.plugin_example:PluginCorridor-v0"))
    completed = run_cli_in_process("run", "--suite", str(suite), "--workers", "1", "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "1/1 runs finished" in completed.stdout
    for env, message in (
        ("tests.plugin_example:PluginCoridor-v0", "importing tests.plugin_example registered no 'PluginCoridor-v0' (did you mean 'PluginCorridor-v0'?)"),
        ("tests.no_such_module:Corridor-v0", "cannot import tests.no_such_module"),
    ):
        wrong = write_suite(text.format(env=env), "wrong.yaml")
        refused = run_cli_in_process("run", "--suite", str(wrong), "--results-dir", str(tmp_path / "refused"), cwd=tmp_path)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1 and message in refused.stderr, refused.stderr
        assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").rglob("*.db"))


def test_a_plugin_tunes_over_the_search_space_it_ships(tmp_path, fresh_registry):
    """The space is found next to the plug-in's module (``search_space``), named by the learner's
    ``name`` although the algorithm is named by its import path."""
    from benchmark.tuning.search_space import load_search_space

    space = load_search_space(PATH)
    assert [parameter.name for parameter in space.parameters] == ["actor_lr", "batch_size"]
    study = ("--algo", PATH, "--env", "Pendulum-v1", "--budget", "300", "--trials", "2", "--seed", "0")
    tuned = run_cli_in_process("tune", *study, "--results-dir", str(tmp_path / "results"), cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    assert "study 'tests.plugin_example_HalfTemperatureSAC-Pendulum-v1': trials 0..1 run; 2 in all (2 complete)" in tuned.stdout
