"""The real CLI against a temporary MLflow store: runs, params, metrics, tags; bad input; failures."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_SUITE, as_from_a_terminal
from conftest import run_cli_in_process as run_cli
from mlflow.tracking import MlflowClient

from benchmark import provenance, tracking
from benchmark.cli import app as cli
from benchmark.config import load_suite
from benchmark.execution import base, worker

ROOT = Path(__file__).resolve().parent.parent


def all_runs(uri: str):
    client = MlflowClient(uri)
    experiments = client.search_experiments()
    return client, client.search_runs([e.experiment_id for e in experiments]) if experiments else []


def test_run_logs_parent_and_children_to_mlflow(tiny_suite, tmp_path):
    results = tmp_path / "results"
    completed = run_cli("run", "--suite", str(tiny_suite), "--workers", "2", "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "final eval return" in completed.stdout and "3/3 runs finished" in completed.stdout

    client, runs = all_runs(f"sqlite:///{results / 'mlflow.db'}")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 3 and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}

    expected_keys = {spec.run_key for spec in load_suite(str(tiny_suite)).specs}
    assert {r.data.tags["run_key"] for r in children} == expected_keys
    for child in children:
        tags, params, metrics = child.data.tags, child.data.params, child.data.metrics
        for tag in (
            "git_sha",
            "git_dirty",
            "version.torch",
            "version.gymnasium",
            "version.mlflow",
            "device",
            "python_version",
            "cpu_model",
            "gpu_model",
            "command",
        ):
            assert tags.get(tag), tag
        assert tags["cpu_gemm"] in ("onednn", "mkl")  # the kernel that set the run's last bits
        assert tags["critics"] == "auto"  # a run alone on the CPU: separate critics
        assert tags["command"].startswith("python -m benchmark run --suite ")  # runnable as it stands
        assert tags["device"] == "cpu" and tags["cuda_visible_devices"] == ""  # a CPU run sees no GPU
        assert params["algo"] in ("ppo", "sac") and "budget.total_steps" in params and "hp.gamma" in params
        for metric in ("eval/return_mean", "final/eval_return_mean", "perf/steps_per_second", "train/episode_return"):
            assert metric in metrics, metric
        evaluations = client.get_metric_history(child.info.run_id, "eval/return_mean")
        assert [m.step for m in evaluations] == sorted(m.step for m in evaluations) and len(evaluations) == 2
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"config.json", "evaluations.json", "checkpoints"} <= artifacts
        config = json.loads(Path(client.download_artifacts(child.info.run_id, "config.json", str(tmp_path))).read_text())
        assert config["run_key"] == tags["run_key"]
    assert list((results / "reports").glob("tiny-*.md"))


def test_dry_run_lists_mujoco_runs(tmp_path):
    completed = run_cli("run", "--suite", "mujoco", "--dry-run", cwd=ROOT)
    assert completed.returncode == 0, completed.stderr
    assert "400 runs in suite 'mujoco'" in completed.stdout
    assert not (tmp_path / "results").exists()


def test_dry_run_selects_algorithms_and_environments():
    completed = run_cli("run", "--suite", "mujoco", "--algos", "trpo", "a2c", "--envs", "Hopper-v5", "--dry-run", cwd=ROOT)
    assert completed.returncode == 0, completed.stderr
    assert "20 runs in suite 'mujoco'" in completed.stdout and "HalfCheetah" not in completed.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--suite", "nonexistent"], "unknown suite 'nonexistent'"),
        (["--suite", "smoke", "--workers", "0"], "--workers must be >= 1"),
        (["--suite", "smoke", "--seeds", "1", "1"], "--seeds must be distinct"),
        (["--suite", "smoke", "--device", "tpu"], "device 'tpu'"),
        (["--suite", "smoke", "--algos", "trpo"], "suite 'smoke' has no algorithm 'trpo'; it has ppo, sac"),
        (["--suite", "smoke", "--envs", "CartPole-v0"], "no environment 'CartPole-v0' (did you mean 'CartPole-v1'?)"),
        (["--suite", "smoke", "--seeds-per-process", "0"], "--seeds-per-process must be >= 1, got 0"),
    ],
)
def test_bad_arguments_exit_2_and_create_no_run(tmp_path, capsys, args, message):
    results = tmp_path / "results"
    code = cli.main(["run", *args, "--results-dir", str(results)])
    assert code == cli.EXIT_CONFIG_ERROR
    assert message in capsys.readouterr().err
    assert not (results / "mlflow.db").exists()


def test_bad_suite_exits_2_without_touching_existing_results(write_suite, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    tracking.experiment_id(f"sqlite:///{results / 'mlflow.db'}", "existing", results / "mlartifacts")
    stored = (results / "mlflow.db").read_bytes()
    bad = write_suite("seeds: [0]\nbudget: {total_steps: 10, eval_every: 5}\nexperiments: [{algo: dqnn, envs: [CartPole-v1]}]\n")
    completed = run_cli("run", "--suite", str(bad), "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 2
    assert "unknown algorithm 'dqnn'" in completed.stderr and "Traceback" not in completed.stderr
    assert (results / "mlflow.db").read_bytes() == stored


def test_failing_run_is_marked_failed_with_its_error(tiny_suite, tmp_path, monkeypatch):
    import queue

    from benchmark.training import loop as training_loop

    def explode(*args, **kwargs):
        raise FloatingPointError("loss became NaN")

    monkeypatch.setattr(training_loop, "run", explode)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = tracking.experiment_id(uri, "tiny", tmp_path / "artifacts")
    parent = tracking.start_parent_run(uri, experiment, "parent", {})
    spec = load_suite(str(tiny_suite)).specs[0]
    (outcome,) = worker.train_group([spec], worker.Launch(uri, experiment, parent.run_id, None), queue.Queue())
    assert outcome.status == "FAILED" and "loss became NaN" in outcome.error
    run = MlflowClient(uri).get_run(outcome.run_id)
    assert run.info.status == "FAILED" and "FloatingPointError: loss became NaN" in run.data.tags["error"]


def test_list_shows_algorithms_buffers_suites_envs(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("ppo", "sac", "rollout", "replay", "smoke", "mujoco", "HalfCheetah-v5", "Discrete(2)"):
        assert word in out, word


def test_children_left_running_by_a_dead_worker_are_closed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = tracking.experiment_id(uri, "crash", tmp_path / "artifacts")
    parent = tracking.start_parent_run(uri, experiment, "parent", {})
    orphan = tracking.start_child_run(uri, experiment, parent.run_id, "orphan", {}, {})
    finished = tracking.start_child_run(uri, experiment, parent.run_id, "finished", {}, {})
    finished.finish("FINISHED")
    other_parent = tracking.start_parent_run(uri, experiment, "other", {})
    unrelated = tracking.start_child_run(uri, experiment, other_parent.run_id, "unrelated", {}, {})

    closed = base.close_unfinished_children(uri, parent.run_id, "FAILED", "worker exited without reporting")
    client = MlflowClient(uri)
    assert closed == [orphan.run_id]
    assert client.get_run(orphan.run_id).info.status == "FAILED"
    assert client.get_run(orphan.run_id).data.tags["error"] == "worker exited without reporting"
    assert client.get_run(finished.run_id).info.status == "FINISHED"
    assert client.get_run(unrelated.run_id).info.status == "RUNNING"


def _start_long_suite(write_suite, tmp_path, *options: str):
    """The CLI on a 2-run suite that would train for hours, in its own process group, with
    Ctrl-C raising KeyboardInterrupt (pytest-xdist workers ignore SIGINT, and children inherit
    that); returns the process, the store's URI and the pids of its children once both runs
    train. ``options``: more arguments of ``run`` (an executor, say)."""
    suite = write_suite(
        "seeds: [0, 1]\nbudget: {total_steps: 100000000, eval_every: 50000000, eval_episodes: 1}\n"
        "experiments: [{algo: ppo, envs: [CartPole-v1], hyperparameters: {num_steps: 64, num_minibatches: 1, num_epochs: 1}}]\n"
    )
    results = tmp_path / "results"
    process = subprocess.Popen(
        as_from_a_terminal("run", "--suite", str(suite), "--workers", "2", "--results-dir", str(results), *options),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    uri = f"sqlite:///{results / 'mlflow.db'}"
    deadline, created = time.monotonic() + 180, None
    try:
        while time.monotonic() < deadline:  # until both child runs are training
            if created is None and (results / "mlflow.db").exists():
                created = time.monotonic()
            # read the store only once the CLI has had time to create its tables
            if created is not None and time.monotonic() > created + 5 and _running_children(uri) == 2:
                return process, uri, _worker_pids(process.pid)
            assert process.poll() is None, process.stderr.read()
            time.sleep(0.5)
        pytest.fail("the child runs never started")
    except BaseException:
        _kill_group(process)
        raise


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"]


@pytest.mark.parametrize("whole_group", [False, True], ids=["launch", "whole-group"])
def test_terminate_stops_workers_and_marks_runs_killed(write_suite, tmp_path, whole_group):
    """A scheduler's SIGTERM mid-run, to the launch or to its whole process group (a shell's
    timeout; the queue manager then outlives it until the workers are stopped): every run is
    KILLED in MLflow, the command exits 143, and the workers are gone. (Ctrl-C, exit 130, is the
    executor contract's test, once per executor:
    tests/test_executors.py::test_ctrl_c_cancels_each_executor_cleanly.)"""
    process, uri, workers = _start_long_suite(write_suite, tmp_path)
    try:
        assert len(workers) >= 4  # two workers, the queue manager and the fork server (or resource tracker)
        if whole_group:
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == cli.EXIT_TERMINATED, process.stderr.read()
    finally:
        if process.poll() is None:
            _kill_group(process)
    _, runs = all_runs(uri)
    assert len(runs) == 3 and all(r.info.status == "KILLED" for r in runs)
    deadline = time.monotonic() + 20  # the fork server ends its interpreter after the launch, in seconds
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(workers)


def test_ctrl_c_while_the_fork_server_imports_ends_quietly(write_suite, tmp_path):
    """Ctrl-C as a terminal sends it (to the whole process group) while the fork server imports
    torch and the training code, the first seconds of a launch: exit 130 and one line (it printed
    a 30-70 line traceback from the server's imports)."""
    suite = write_suite(
        "seeds: [0, 1]\nbudget: {total_steps: 100000000, eval_every: 50000000, eval_episodes: 1}\n"
        "experiments: [{algo: ppo, envs: [CartPole-v1], hyperparameters: {num_steps: 64}}]\n"
    )
    argv = ("run", "--suite", str(suite), "--workers", "2", "--results-dir", str(tmp_path / "results"))
    process = subprocess.Popen(as_from_a_terminal(*argv), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _fork_server_importing(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _fork_server_importing(process.pid), "the launch never started its fork server"
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        _kill_group(process)
    assert process.returncode == cli.EXIT_INTERRUPTED, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err


def _fork_server_importing(session: int) -> bool:
    """Whether the session's fork server is importing torch (its library mapped) and has not
    forked a worker yet. (Its interpreter's own first tenths of a second, before it reads the
    preload module: the next test.)"""
    processes = {}  # pid -> (parent, command line), of the session's live processes
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(") ", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session:
            processes[int(stat.parent.name)] = (int(fields[1]), command)
    servers = {pid for pid, (_, command) in processes.items() if b"forkserver" in command and _maps(pid, b"libtorch")}
    return bool(servers) and not any(parent in servers for parent, _ in processes.values())


def _maps(pid: int, library: bytes) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_bytes()
    except OSError:
        return False


def test_workers_die_with_a_killed_parent(write_suite, tmp_path):
    """SIGKILL leaves the parent no chance to clean up; its workers must not train on as orphans."""
    process, _, workers = _start_long_suite(write_suite, tmp_path)
    try:
        assert len(workers) >= 4  # two workers, the queue manager and the fork server (or resource tracker)
        process.kill()  # the main process only, not its group
        process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(workers)
    finally:
        _kill_group(process)


def _running_children(uri: str) -> int:
    """RUNNING child runs, or 0 while the CLI is still creating the store's tables."""
    try:
        _, runs = all_runs(uri)
    except Exception:  # sqlite locked or tables half-created by the other process
        return 0
    return sum("mlflow.parentRunId" in r.data.tags and r.info.status == "RUNNING" for r in runs)


def _worker_pids(parent: int) -> list[int]:
    """Descendants of ``parent`` (the pool's workers, their fork server, the queue manager), from /proc."""
    parents: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        parents[int(status.parent.name)] = int(fields.get("PPid", "0").strip() or 0)
    descendants, frontier = [], [parent]
    while frontier:
        children = [pid for pid, ppid in parents.items() if ppid in frontier]
        descendants += children
        frontier = children
    return descendants


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except OSError:
        return "Z"


def test_relaunching_a_suite_trains_only_what_is_missing(tiny_suite, tmp_path):
    """Half done -> re-launch trains the rest; finished -> nothing; a deleted child -> only it;
    --force -> everything. Each re-launch's parent run links to the previous invocation; one that
    trains nothing makes none."""
    results = tmp_path / "results"
    common = ["--suite", str(tiny_suite), "--results-dir", str(results), "--workers", "2"]
    uri = f"sqlite:///{results / 'mlflow.db'}"

    first = run_cli("run", *common, "--seeds", "0", cwd=tmp_path)  # ppo seed 0 and sac seed 0
    assert first.returncode == 0, first.stderr
    second = run_cli("run", *common, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "2 of 3 runs already finished" in second.stdout and "3/3 runs finished (2 of them in an earlier invocation)" in second.stdout

    client, runs = all_runs(uri)
    parents = sorted((r for r in runs if "mlflow.parentRunId" not in r.data.tags), key=lambda r: r.info.start_time)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 2 and len(children) == 3  # the seed-1 PPO run is the only new child
    assert "relaunch_of" not in parents[0].data.tags and parents[1].data.tags["relaunch_of"] == parents[0].info.run_id
    assert parents[1].data.params["runs_skipped"] == "2"

    third = run_cli("run", *common, cwd=tmp_path)
    assert third.returncode == 0 and "3 of 3 runs already finished" in third.stdout and "nothing to train: no parent run started" in third.stdout
    _, runs = all_runs(uri)
    assert len([r for r in runs if "mlflow.parentRunId" in r.data.tags]) == 3
    assert len([r for r in runs if "mlflow.parentRunId" not in r.data.tags]) == 2  # a launch that trains nothing leaves no parent run

    deleted = children[0]
    client.delete_run(deleted.info.run_id)
    fourth = run_cli("run", *common, cwd=tmp_path)
    assert fourth.returncode == 0 and "2 of 3 runs already finished" in fourth.stdout
    _, runs = all_runs(uri)
    fresh = [r for r in runs if "mlflow.parentRunId" in r.data.tags and r.info.run_id not in {c.info.run_id for c in children}]
    assert [r.data.tags["run_key"] for r in fresh] == [deleted.data.tags["run_key"]]

    forced = run_cli("run", *common, "--force", cwd=tmp_path)
    assert forced.returncode == 0 and "already finished" not in forced.stdout
    _, runs = all_runs(uri)
    assert len([r for r in runs if "mlflow.parentRunId" in r.data.tags]) == 2 + 1 + 3  # one of the first three deleted


# the tiny suite, with SAC's rewards scaled past float32's range: the critic's targets become
# infinite, its loss NaN
FAILING_SUITE = TINY_SUITE.replace("name: tiny", "name: failing").replace("buffer_size: 1000}", "buffer_size: 1000, reward_scale: 1.0e+38}")
assert "reward_scale" in FAILING_SUITE


def test_a_raising_run_and_a_diverging_run_fail_alone(write_suite, tmp_path):
    suite_path = write_suite(FAILING_SUITE, "failing.yaml")
    specs = {(s.algo, s.seed): s for s in load_suite(str(suite_path)).specs}
    results = tmp_path / "results"
    # ppo seed 1 cannot write its final checkpoint: a file stands where its directory goes
    (results / "checkpoints").mkdir(parents=True)
    (results / "checkpoints" / specs["ppo", 1].run_key).write_text("in the way")

    completed = run_cli("run", "--suite", str(suite_path), "--workers", "2", "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "2 runs did not finish: ppo/CartPole-v1/seed1, sac/Pendulum-v1/seed0" in completed.stdout
    assert f"python -m benchmark run --suite {suite_path}" in completed.stdout

    client, runs = all_runs(f"sqlite:///{results / 'mlflow.db'}")
    by_key = {r.data.tags["run_key"]: r for r in runs if "run_key" in r.data.tags}
    assert by_key[specs["ppo", 0].run_key].info.status == "FINISHED"
    raised, diverged = by_key[specs["ppo", 1].run_key], by_key[specs["sac", 0].run_key]
    assert raised.info.status == "FAILED" and "FileExistsError" in raised.data.tags["error"]
    assert diverged.info.status == "FAILED" and "NonFiniteLoss: non-finite update values" in diverged.data.tags["error"]
    for run in (raised, diverged):
        traceback_text = Path(client.download_artifacts(run.info.run_id, "error.txt", str(tmp_path))).read_text()
        assert traceback_text.startswith("Traceback (most recent call last)")


def test_check_finite_names_the_bad_values():
    from benchmark.training.control import NonFiniteLoss, check_finite

    check_finite({"policy_loss": 0.5, "entropy": -1.2}, step=10)
    with pytest.raises(NonFiniteLoss, match=r"at env step 640: critic_loss=nan, q_mean=-inf"):
        check_finite({"policy_loss": 0.5, "q_mean": float("-inf"), "critic_loss": float("nan")}, step=640)


def test_reproduce_a_finished_run_matches_bit_for_bit(write_suite, tmp_path):
    suite_path = write_suite(
        """
        name: repro
        seeds: [3]
        budget: {total_steps: 512, eval_every: 256, eval_episodes: 2}
        experiments:
          - algo: ppo
            envs: [CartPole-v1]
            hyperparameters: {num_envs: 2, num_steps: 64, num_minibatches: 2, num_epochs: 2, hidden_sizes: [16, 16]}
        """
    )
    results = tmp_path / "results"
    assert run_cli("run", "--suite", str(suite_path), "--results-dir", str(results), cwd=tmp_path).returncode == 0
    _, runs = all_runs(f"sqlite:///{results / 'mlflow.db'}")
    (child,) = [r for r in runs if "run_key" in r.data.tags]
    completed = run_cli("reproduce", child.info.run_id, "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "match: all 2 evaluations are bit-identical" in completed.stdout

    missing = run_cli("reproduce", "0" * 32, "--results-dir", str(results), cwd=tmp_path)
    assert missing.returncode == 2 and "no MLflow run" in missing.stderr


def test_reproduction_lists_the_evaluations_that_differ():
    from benchmark.analysis.reproduce import compare_evaluations

    assert compare_evaluations([(256, 21.5), (512, 40.0)], [(256, 21.5), (512, 40.0)]) == []
    assert compare_evaluations([(256, 21.5), (512, 40.0)], [(256, 21.5), (512, 41.5), (768, 9.0)]) == [
        "step 512: recorded 40.0, now 41.5 (difference +1.5)",
        "step 768: evaluated only now",
    ]


def test_git_diff_records_uncommitted_changes(tmp_path):
    """What a dirty run's git_diff.patch artifact holds: the changes to tracked files."""

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "agent.py").write_text("learning_rate = 3e-4\n")
    git("add", "agent.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    assert provenance.git_diff(tmp_path) == ""
    (tmp_path / "agent.py").write_text("learning_rate = 1e-3\n")
    diff = provenance.git_diff(tmp_path)
    assert "-learning_rate = 3e-4" in diff and "+learning_rate = 1e-3" in diff


def test_helper_interpreters_start_with_ctrl_c_ignored_and_the_launch_keeps_its_handler():
    """multiprocessing's helpers (fork server, queue manager) start with SIGINT ignored, so a
    Ctrl-C in their interpreter's first tenths of a second prints no traceback of its start; the
    launch ignores it only for the spawn itself and gets its own handler back."""
    import multiprocessing.util

    from benchmark.execution import child

    child.start_helpers_ignoring_ctrl_c()
    child.start_helpers_ignoring_ctrl_c()  # once is enough: not wrapped twice
    assert multiprocessing.util.spawnv_passfds.ignores_ctrl_c and multiprocessing.util.spawnv_passfds.__closure__
    handler = signal.getsignal(signal.SIGINT)
    code = "import signal, sys; sys.exit(0 if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else 3)"
    pid = multiprocessing.util.spawnv_passfds(os.fsencode(sys.executable), [sys.executable, "-c", code], ())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert signal.getsignal(signal.SIGINT) is handler
