"""Several launches on one results directory, and launches killed with SIGKILL: every run key
ends with exactly one FINISHED child run and none RUNNING, the store stays usable, and a
relaunch trains nothing more."""

import collections
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_SUITE, run_cli_in_process
from mlflow.tracking import MlflowClient

from benchmark import stores, tracking
from benchmark.config import load_suite
from benchmark.training import checkpoint

ROOT = Path(__file__).resolve().parent.parent

SLOW_PPO = """\
name: slowppo
seeds: [0, 1]
budget: {total_steps: 12000, eval_every: 6000, eval_episodes: 2}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 2, num_steps: 64, num_minibatches: 2, num_epochs: 2, hidden_sizes: [16, 16]}
"""


def launch(suite: Path, results: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmark", "run", "--suite", str(suite), "--results-dir", str(results), *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[str, str]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out, err


def run_here(suite: Path, results: Path, *extra: str) -> tuple[str, str]:
    """A launch that runs alone, in this process (``launch`` starts one beside others)."""
    completed = run_cli_in_process("run", "--suite", str(suite), "--results-dir", str(results), *extra)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout, completed.stderr


def statuses(results: Path) -> tuple[dict[str, list[str]], list[str]]:
    """run key -> the statuses of its child runs; and the statuses of the suite invocations."""
    uri = f"sqlite:///{results / 'mlflow.db'}"
    stores.check_sqlite_store(results / "mlflow.db", "the store", tracking.MLFLOW_TABLES)  # still intact
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=10_000)
    children: dict[str, list[str]] = collections.defaultdict(list)
    for run in runs:
        if "run_key" in run.data.tags:
            children[run.data.tags["run_key"]].append(run.info.status)
    return dict(children), [r.info.status for r in runs if "run_key" not in r.data.tags]


def assert_each_key_finished_once(results: Path, suite: Path) -> dict[str, list[str]]:
    children, parents = statuses(results)
    assert set(children) == {spec.run_key for spec in load_suite(str(suite)).specs}
    for key, found in children.items():
        assert found.count("FINISHED") == 1, (key, found)
        assert "RUNNING" not in found, (key, found)
    assert "RUNNING" not in parents
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.run_key != ''"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "eval/return_mean")]
        assert len(steps) == len(set(steps)), "two processes wrote into one run"  # each evaluation once
    return children


def assert_relaunch_trains_nothing(suite: Path, results: Path) -> None:
    before, _ = statuses(results)
    out, _ = run_here(suite, results)
    count = len(load_suite(str(suite)).specs)
    assert f"{count} of {count} runs already finished" in out
    assert statuses(results)[0] == before


@pytest.mark.parametrize("first_seeds", [None, ["0"]], ids=["fresh-store", "store-with-unfinished-specs"])
def test_two_launches_at_once_train_each_run_key_once(write_suite, tmp_path, first_seeds):
    suite, results = write_suite(TINY_SUITE, "tiny.yaml"), tmp_path / "results"
    if first_seeds:
        run_here(suite, results, "--seeds", *first_seeds)  # 2 of the 3 runs finished, one not
    first, second = launch(suite, results), launch(suite, results)
    (out1, err1), (out2, err2) = finish(first), finish(second)
    assert "Traceback" not in err1 + err2
    assert "3/3 runs finished" in out1 and "3/3 runs finished" in out2  # the second waited for the first's
    assert_each_key_finished_once(results, suite)
    assert_relaunch_trains_nothing(suite, results)


def test_a_second_launch_shares_the_grid_and_takes_over_what_a_killed_one_left(write_suite, tmp_path):
    """Launch A trains; launch B joins: B trains only keys nobody holds and waits for A's. A is
    killed with SIGKILL mid-run: B takes A's run over from A's checkpoint, in A's MLflow run, and
    ends with every key finished once. (A is paused from its first checkpoint until it is killed,
    so the order of events does not depend on how fast the machine trains.)"""
    suite = write_suite(SLOW_PPO.replace("seeds: [0, 1]", "seeds: [0, 1, 2]").replace("6000,", "2000,"), "slow.yaml")
    results = tmp_path / "results"
    first = results / "checkpoints" / load_suite(str(suite)).specs[0].run_key / checkpoint.LATEST
    a = launch(suite, results, "--workers", "1")
    try:
        wait_for(first.exists, a)  # A trains seed 0 and has checkpointed it
        pause(a, results / "mlflow.db")
        b = launch(suite, results)
        wait_for(lambda: running_children(results) >= 2, b)  # B planned around A's claim and started a run of its own
    finally:
        os.killpg(a.pid, signal.SIGKILL)
        a.wait()
    out, err = finish(b)
    assert "ppo/CartPole-v1/seed0 is being trained by another launch" in out and "Traceback" not in err
    assert "resuming ppo/CartPole-v1/seed0 from its checkpoint" in out
    assert_each_key_finished_once(results, suite)
    assert_relaunch_trains_nothing(suite, results)


def test_no_wait_leaves_a_live_launchs_runs_to_it(write_suite, tmp_path):
    suite = write_suite(SLOW_PPO.replace("seeds: [0, 1]", "seeds: [0]").replace("12000", "100000000"), "slow.yaml")
    results = tmp_path / "results"
    a = launch(suite, results)
    try:
        wait_for(lambda: running_children(results) >= 1, a)
        pause(a, results / "mlflow.db")  # alive and holding its claim, not training beside the check
        out, err = run_here(suite, results, "--no-wait")
        assert "left to the launch that is training them: ppo/CartPole-v1/seed0" in out and not err
        assert statuses(results)[0][load_suite(str(suite)).specs[0].run_key] == ["RUNNING"]  # A's, untouched
        assert a.poll() is None
    finally:
        os.killpg(a.pid, signal.SIGKILL)
        a.wait()


def running_children(results: Path) -> int:
    if not (results / "mlflow.db").exists():
        return 0
    try:
        children, _ = statuses(results)
    except Exception:  # noqa: BLE001 - the store is being created or written this instant
        return 0
    return sum(found.count("RUNNING") for found in children.values())


def pause(process: subprocess.Popen, store: Path) -> None:
    """SIGSTOP a launch's whole process group at a moment none of it holds a lock on the SQLite
    ``store`` (a process stopped inside a read or a write would block every other writer): the
    launch stays alive, holding its claims, and stops using a core."""
    for _ in range(100):
        os.killpg(process.pid, signal.SIGSTOP)
        connection = sqlite3.connect(store, timeout=0)
        try:
            connection.execute("BEGIN EXCLUSIVE")  # fails while anyone holds a lock on the file
            connection.rollback()
            return
        except sqlite3.OperationalError:
            os.killpg(process.pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            connection.close()
    pytest.fail(f"{store} stayed locked")


def wait_for(condition, process: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.3)
    pytest.fail("timed out")


@pytest.mark.parametrize("damage", ["killed-before-first-checkpoint", "truncated-latest"])
def test_a_run_restarted_from_scratch_closes_its_earlier_attempt(write_suite, tmp_path, damage):
    """SIGKILL before the first checkpoint, or a latest.pt cut short: the relaunch starts the run
    over in a new child run, and the old child, left RUNNING by the dead process, is closed as
    KILLED and linked to the new one."""
    suite, results = write_suite(SLOW_PPO, "slow.yaml"), tmp_path / "results"
    specs = load_suite(str(suite)).specs
    latest = [results / "checkpoints" / spec.run_key / checkpoint.LATEST for spec in specs]
    process = launch(suite, results, "--workers", "2")
    try:
        if damage == "truncated-latest":
            wait_for(lambda: all(path.exists() for path in latest), process)
        else:
            wait_for(lambda: running_children(results) == 2, process)
            assert not any(path.exists() for path in latest)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if damage == "truncated-latest":
        for path in latest:
            path.write_bytes(path.read_bytes()[:1000])
    children, _ = statuses(results)
    assert all(found == ["RUNNING"] for found in children.values())  # nobody was left to close them
    out, err = run_here(suite, results, "--workers", "2")
    children = assert_each_key_finished_once(results, suite)
    assert all(sorted(found) == ["FINISHED", "KILLED"] for found in children.values())
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.run_key != ''")
    by_id = {run.info.run_id: run for run in runs}
    for run in runs:
        if run.info.status == "KILLED":
            replacement = by_id[run.data.tags["superseded_by"]]
            assert replacement.info.status == "FINISHED" and run.info.run_id in replacement.data.tags["supersedes"]
            assert replacement.data.tags["run_key"] == run.data.tags["run_key"]


def test_two_tune_launches_at_once_share_one_study_and_one_store(tmp_path):
    """Optuna's and MLflow's stores are both created by two launches racing; the study gets every
    trial of both, under one MLflow parent run."""
    results = tmp_path / "results"
    argv = [
        sys.executable,
        "-m",
        "benchmark",
        "tune",
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--budget",
        "1024",
        "--trials",
        "2",
        "--pruner",
        "none",
        "--results-dir",
        str(results),
    ]
    processes = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for process in processes:
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0 and "Traceback" not in err, err
    import optuna

    from benchmark.tuning import storage as tuning_storage

    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=tuning_storage.open_storage(tuning_storage.default_storage_url(results)))
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"] * 4
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(run.data.tags.get("kind") for run in runs) == ["study", "trial", "trial", "trial", "trial"]
    assert all(run.info.status == "FINISHED" for run in runs)


def test_launches_sharing_a_store_but_not_a_results_directory_leave_each_others_runs_alone(write_suite, tmp_path):
    """Two results directories, one tracking store: neither launch can see the other's claims, so
    neither may close the other's live run as an orphan (each trains it; both are recorded)."""
    suite = write_suite(SLOW_PPO.replace("seeds: [0, 1]", "seeds: [0]").replace("12000", "100000000"), "slow.yaml")
    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    a = launch(suite, tmp_path / "a", "--tracking-uri", uri)
    try:
        wait_for(lambda: running_in(uri) >= 1, a)
        # A is paused from here on: alive, its claim and its invocation's lock held (a stopped
        # process keeps its locks), its run RUNNING, but not training on a core B and C start on
        pause(a, tmp_path / "shared.db")
        b = launch(suite, tmp_path / "b", "--tracking-uri", uri)
        wait_for(lambda: running_in(uri) >= 2, b)  # B started its own run and closed nothing of A's
        os.killpg(b.pid, signal.SIGKILL)
        b.wait()
        assert a.poll() is None and running_in(uri) == 2
        c = launch(suite, tmp_path / "b", "--tracking-uri", uri, "--no-wait")  # B's directory again: B's run is its orphan
        wait_for(lambda: sorted(statuses_in(uri)) == ["KILLED", "RUNNING", "RUNNING"], c)  # B's closed; A's and C's train
        assert a.poll() is None
    finally:
        for process in (a, locals().get("c")):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def statuses_in(uri: str) -> list[str]:
    if not Path(uri.removeprefix("sqlite:///")).exists():  # (MLflow's client would create it, racing the launch)
        return []
    client = MlflowClient(uri)
    try:
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.run_key != ''")
    except Exception:  # noqa: BLE001 - being created
        return []
    return [run.info.status for run in runs]


def running_in(uri: str) -> int:
    return statuses_in(uri).count("RUNNING")


def test_a_forced_launch_killed_as_a_whole_leaves_no_running_run(write_suite, tmp_path):
    """`baseline`/`regress` always train (--force); killed with their workers they leave RUNNING
    child runs whose keys a later plain `run` skips (they finished before). The next launch
    closes them with their dead parent."""
    suite, results = write_suite(SLOW_PPO.replace("seeds: [0, 1]", "seeds: [0]"), "slow.yaml"), tmp_path / "results"
    run_here(suite, results)
    forced = launch(suite, results, "--force")
    try:
        wait_for(lambda: running_children(results) == 1, forced)
    finally:
        os.killpg(forced.pid, signal.SIGKILL)
        forced.wait()
    out, _ = run_here(suite, results)
    assert "1 of 1 runs already finished" in out and "marked KILLED" in out
    children, parents = statuses(results)
    (found,) = children.values()
    assert sorted(found) == ["FINISHED", "KILLED"] and "RUNNING" not in parents
