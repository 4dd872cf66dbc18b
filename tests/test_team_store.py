"""The team configuration, for real: MLflow tracking and the Optuna storage on a PostgreSQL
server (pgserver's bundled binaries, started here), written to by two launches at once on two
executors, and a study with two workers on it."""

import subprocess
import sys
from pathlib import Path

import pytest

pgserver = pytest.importorskip("pgserver")
pytest.importorskip("psycopg")

from mlflow.tracking import MlflowClient  # noqa: E402
from test_cli import run_cli  # noqa: E402

SUITE = """
name: team
seeds: [0, 1, 2]
budget: {total_steps: 512, eval_every: 256, eval_episodes: 2}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 2, num_steps: 64, num_minibatches: 2, num_epochs: 1, hidden_sizes: [16, 16]}
"""


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    """A PostgreSQL server on a Unix socket in a temporary directory, with databases mlflow and
    optuna; URLs as a team would pass them (``--tracking-uri``, ``--storage``)."""
    directory = tmp_path_factory.mktemp("postgres")
    server = pgserver.get_server(directory, cleanup_mode="stop")
    for database in ("mlflow", "optuna"):
        server.psql(f"CREATE DATABASE {database};")
    yield {name: f"postgresql://postgres:@/{name}?host={directory}" for name in ("mlflow", "optuna")}
    server.cleanup()


def test_two_launches_on_two_executors_share_a_postgres_store(postgres, write_suite, tmp_path):
    """A local pool and Slurm jobs (submitit's local executor) train one suite against one
    PostgreSQL tracking store and one results directory at the same time: every run key is
    trained exactly once, and both launches report the whole suite finished."""
    pytest.importorskip("submitit")
    suite = write_suite(SUITE)
    results = tmp_path / "results"
    common = ["-m", "benchmark", "run", "--suite", str(suite), "--workers", "2", "--results-dir", str(results), "--tracking-uri", postgres["mlflow"]]
    launches = [
        subprocess.Popen([sys.executable, *common], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        subprocess.Popen(
            [sys.executable, *common, "--executor", "slurm", "--slurm-cluster", "local"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    ]
    outputs = [launch.communicate(timeout=600) for launch in launches]
    for launch, (stdout, stderr) in zip(launches, outputs):
        assert launch.returncode == 0, stderr
        assert "3/3 runs finished" in stdout, stdout
    client = MlflowClient(postgres["mlflow"])
    experiment = client.get_experiment_by_name("team")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    children = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
    keys = [run.data.tags["run_key"] for run in children]
    assert len(children) == 3 and len(set(keys)) == 3, [(run.data.tags.get("run_key"), run.info.status) for run in children]
    assert all(run.info.status == "FINISHED" for run in children)
    parents = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert len(parents) == 2 and all(run.info.status == "FINISHED" for run in parents)


def test_a_two_worker_study_records_every_trial_once_on_postgres(postgres, tmp_path):
    import optuna

    results = tmp_path / "results"
    completed = run_cli(
        "tune",
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--budget",
        "1024",
        "--trials",
        "4",
        "--workers",
        "2",
        "--pruner",
        "none",
        "--study",
        "team-study",
        "--storage",
        postgres["optuna"],
        "--tracking-uri",
        postgres["mlflow"],
        "--results-dir",
        str(results),
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    study = optuna.load_study(study_name="team-study", storage=postgres["optuna"])
    assert [trial.number for trial in study.trials] == [0, 1, 2, 3]
    assert all(trial.state.name == "COMPLETE" for trial in study.trials)
    client = MlflowClient(postgres["mlflow"])
    experiment = client.get_experiment_by_name("tune-team-study")
    trials = [run for run in client.search_runs([experiment.experiment_id]) if run.data.tags.get("kind") == "trial"]
    numbers = sorted(int(run.data.tags["trial_number"]) for run in trials)
    assert numbers == [0, 1, 2, 3]
    assert {run.info.run_id for run in trials} == {trial.user_attrs["mlflow_run_id"] for trial in study.trials}
    assert Path(results).exists() and not (results / "optuna.db").exists() and not (results / "mlflow.db").exists()
