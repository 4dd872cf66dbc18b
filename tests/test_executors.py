"""The executor contract, once against each executor (local pool, Ray, Slurm through
submitit's local executor): the same suite gives the same evaluations, Ctrl-C cancels cleanly,
and the pieces that carry a worker's messages and options behave."""

import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import run_cli_in_process, run_cli_subprocess
from test_cli import _kill_group, _start_long_suite, all_runs

from agents.api import ConfigError
from benchmark.cli import app as cli
from benchmark.cli.common import slurm_options
from benchmark.execution.messages import FileSink, FileSource, Note, Progress, Started
from benchmark.execution.slurm import SlurmOptions

EXECUTORS = {
    "local": [],
    "ray": ["--executor", "ray"],
    "slurm": ["--executor", "slurm", "--slurm-cluster", "local"],
}


def run_cli(*args: str, cwd: Path):
    """The command in this process (its local pool's fork server and imports are the test
    process's: ~15 s of a CI core less per launch), except with Ray, which a test process
    starts slowly and keeps running."""
    runner = run_cli_subprocess if "ray" in args else run_cli_in_process
    return runner(*args, cwd=cwd)


def _needs(executor: str) -> None:
    if executor == "ray":
        pytest.importorskip("ray")
    if executor == "slurm":
        pytest.importorskip("submitit")


def _evaluations_by_run_key(uri: str) -> dict[str, list[tuple[int, float]]]:
    client, runs = all_runs(uri)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert children and all(r.info.status == "FINISHED" for r in children)
    return {r.data.tags["run_key"]: [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, "eval/return_mean")] for r in children}


def test_every_executor_gives_the_same_evaluations(tiny_suite, tmp_path):
    """A two-spec suite (PPO and SAC, seed 0) trains to bit-identical evaluations in a local
    pool, on a local Ray instance and as Slurm jobs (submitit's local executor)."""
    stores, outputs = {}, {}
    for executor, options in EXECUTORS.items():
        _needs(executor)
        results = tmp_path / executor
        completed = run_cli("run", "--suite", str(tiny_suite), "--seeds", "0", "--workers", "2", "--results-dir", str(results), *options, cwd=tmp_path)
        assert completed.returncode == 0, completed.stderr
        assert "Token authentication" not in completed.stderr  # Ray's banner, printed by every launch before
        stores[executor], outputs[executor] = _evaluations_by_run_key(f"sqlite:///{results / 'mlflow.db'}"), completed.stdout
    assert len(stores["local"]) == 2 and stores["ray"] == stores["local"] and stores["slurm"] == stores["local"]
    assert "CPU (Ray)" in outputs["ray"] and "Slurm job" in outputs["slurm"]
    jobs = list((tmp_path / "slurm" / "slurm").glob("*/*_result.pkl"))
    assert len(jobs) == 2, "one Slurm job per run, its result kept in the shared folder"


def _session_processes(session: int) -> list[int]:
    """Live processes of a session (the launch's, started with start_new_session)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize("executor", EXECUTORS)
def test_ctrl_c_cancels_each_executor_cleanly(write_suite, tmp_path, executor):
    """Ctrl-C while both runs of a long suite train: the launch exits 130, every run is KILLED
    in MLflow, nothing of the launch keeps running, and where the executor can signal its
    workers (the pool, Slurm) each run wrote a checkpoint to resume from."""
    _needs(executor)
    process, uri, _ = _start_long_suite(write_suite, tmp_path, *EXECUTORS[executor])
    try:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=150) == cli.EXIT_INTERRUPTED, process.stderr.read()
        deadline = time.monotonic() + 30
        while _session_processes(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _session_processes(process.pid)
    finally:
        if process.poll() is None:
            _kill_group(process)
    _, runs = all_runs(uri)
    assert len(runs) == 3 and all(r.info.status == "KILLED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    if executor != "ray":  # a cancelled Ray task stops where it is (no signal reaches the loop)
        assert len(list((tmp_path / "results" / "checkpoints").glob("*/latest.pt"))) == 2


@pytest.mark.extended
def test_ray_s_processes_end_with_a_launch_killed_with_sigkill(write_suite, tmp_path):
    """kill -9 of the launch alone (not its group) while its runs train on the Ray instance it
    started: Ray's GCS and raylet (started with the kernel's parent-death signal) end with it,
    their workers with them, and Ray's dashboard and runtime-env agents once they see the raylet
    gone (about a minute: they flush their logs through the GCS first); nothing of the launch's
    session stays."""
    _needs("ray")
    process, _, _ = _start_long_suite(write_suite, tmp_path, *EXECUTORS["ray"])
    try:
        assert len(_session_processes(process.pid)) > 3  # the launch, Ray's helpers and workers
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        deadline = time.monotonic() + 150
        while _session_processes(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _session_processes(process.pid), [Path(f"/proc/{pid}/comm").read_text().strip() for pid in _session_processes(process.pid)]
    finally:
        _kill_group(process)


def run_locally(tasks: list) -> list:
    """The results of ``tasks`` run on a one-slot local pool, in the order they ended."""
    from benchmark.execution import devices
    from benchmark.execution.local import LocalExecutor

    submission = LocalExecutor([devices.CPU]).submit(tasks, log=print)
    try:
        ended = []
        while not submission.done:
            ended += submission.wait(timeout=1.0)
    finally:
        submission.close()
    return [result for _, result in ended]


@dataclass(frozen=True)
class _Probe:
    """A task that tells what its worker sees."""

    variable: str

    def __call__(self, messages, device: str, where: str) -> tuple:
        return os.environ.get(self.variable), os.getcwd(), device


def test_local_workers_take_the_launchs_environment_and_directory_as_they_are_at_submission(tmp_path, monkeypatch):
    """Pool workers are forked from a server the process's first launch starts, which later
    launches reuse; each launch's workers still see its environment and working directory as
    they are when it submits, as spawned workers would."""

    seen = []
    for value in ("first", "second"):
        (tmp_path / value).mkdir()
        monkeypatch.chdir(tmp_path / value)
        monkeypatch.setenv("REPRORL_PROBE", value)
        seen += run_locally([_Probe("REPRORL_PROBE")])
    assert seen == [("first", str(tmp_path / "first"), "cpu"), ("second", str(tmp_path / "second"), "cpu")]


@dataclass
class _Signals:
    """A task that tells what its worker does with SIGTERM."""

    def __call__(self, messages, device: str, where: str) -> tuple:
        return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, os.getppid()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_fork_server_outlives_a_sigterm_to_the_group_and_its_workers_do_not_ignore_it():
    """A SIGTERM to a launch's whole process group reaches the fork server its workers come from.
    Were it to die, the launch would hear from it that every worker had ended while they were
    still writing their checkpoints, and leave their runs RUNNING (seen under load in CI). It
    ignores SIGTERM; the workers it forks get the default back; and a worker whose server is gone
    is asked of the kernel."""
    from multiprocessing import forkserver

    from benchmark.execution.local import _alive

    ((default, server),) = run_locally([_Signals()])
    assert default and server == forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGTERM)
    time.sleep(0.5)
    state = Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state != "Z", "the fork server died of SIGTERM"  # (a zombie until this process reaps it)

    class Reported:  # what a dead server's pipe makes of a living worker
        pid = os.getpid()

        def is_alive(self) -> bool:
            return False

    assert _alive(Reported())
    Reported.pid = server + 2**22  # above any pid_max: no such process
    assert not _alive(Reported())


def test_file_messages_round_trip_and_survive_a_torn_line(tmp_path):
    """Slurm's messages: typed on both ends; a line still being written waits for the next read,
    and a malformed one is skipped."""
    path = tmp_path / "messages.jsonl"
    sink, source = FileSink(path), FileSource(path)
    assert source.read() == []
    sent = [Started("k", "run", 0, "Slurm job 1"), Progress("k", 100, 1000, None), Note("k", "checkpoint kept aside")]
    for message in sent:
        sink.put(message)
    partial = json.dumps({"kind": "Progress", "run_key": "k", "step": 200, "total": 1000, "last_eval": 9.5})
    with path.open("a") as file:
        file.write("not json\n" + partial[:20])
    assert source.read() == sent
    with path.open("a") as file:
        file.write(partial[20:] + "\n")
    assert source.read() == [Progress("k", 200, 1000, 9.5)]


def test_slurm_options_come_from_the_suite_and_the_command_line(write_suite, tmp_path):
    suite = write_suite(
        "seeds: [0]\nbudget: {total_steps: 64, eval_every: 64, eval_episodes: 1}\n"
        "slurm: {partition: gpu, time_minutes: 90, gpus: 1, account: rl}\n"
        "experiments: [{algo: ppo, envs: [CartPole-v1]}]\n"
    )
    from benchmark.config import load_suite

    loaded = load_suite(str(suite))
    args = cli.build_parser().parse_args(["run", "--suite", str(suite), "--executor", "slurm", "--slurm-time", "30", "--slurm-constraint", "a100"])
    options = slurm_options(args, loaded.slurm)
    assert options == SlurmOptions(partition="gpu", time_minutes=30, gpus=1, account="rl", constraint="a100")
    parameters = options.parameters()
    assert parameters["slurm_partition"] == "gpu" and parameters["timeout_min"] == 30 and parameters["gpus_per_node"] == 1
    assert parameters["slurm_constraint"] == "a100" and parameters["slurm_account"] == "rl"
    with pytest.raises(ConfigError, match="gpus must be 0 or 1"):
        SlurmOptions(gpus=4).check()


@pytest.mark.parametrize(
    "text,message",
    [
        ("slurm: {partition: 3}", "slurm.partition must be a string"),
        ("slurm: {time: 30}", "unknown slurm key 'time'"),
        ("slurm: {gpus: true}", "slurm.gpus must be an integer"),
    ],
)
def test_bad_slurm_suite_keys_are_named(write_suite, text, message):
    from benchmark.config import load_suite

    suite = write_suite(
        "seeds: [0]\nbudget: {total_steps: 64, eval_every: 64, eval_episodes: 1}\n" + text + "\nexperiments: [{algo: ppo, envs: [CartPole-v1]}]\n"
    )
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_suite(str(suite))


def test_slurm_options_without_the_slurm_executor_are_a_clear_error(tiny_suite, tmp_path):
    completed = run_cli("run", "--suite", str(tiny_suite), "--slurm-partition", "gpu", "--results-dir", str(tmp_path / "results"), cwd=tmp_path)
    assert completed.returncode == 2 and "--slurm-partition is for --executor slurm" in completed.stderr
    assert not (tmp_path / "results").exists()


def test_a_study_gives_the_same_trials_on_ray_as_locally(tmp_path):
    """A tiny study (2 trials, one worker) on a local Ray instance draws and scores exactly the
    trials of the local one (trials are tasks like a suite's runs: the Slurm executor serves them
    through the same contract, checked above)."""
    import optuna

    from benchmark.tuning import storage

    trials = {}
    for executor in ("local", "ray"):
        _needs(executor)
        options = EXECUTORS[executor]
        results = tmp_path / executor
        completed = run_cli(
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
            *options,
            cwd=tmp_path,
        )
        assert completed.returncode == 0, completed.stderr
        assert "trial 1 COMPLETE" in completed.stderr
        study = optuna.load_study(study_name="ppo-CartPole-v1", storage=storage.open_storage(storage.default_storage_url(results)))
        trials[executor] = [(t.number, t.state.name, t.params, t.value) for t in study.trials]
    assert len(trials["local"]) == 2 and trials["ray"] == trials["local"]


@pytest.mark.extended
def test_a_slurm_job_warned_of_its_time_limit_is_requeued_and_its_run_resumes(write_suite, tmp_path):
    """submitit's local executor: once the run has a checkpoint, its job gets the signal Slurm
    sends before a time limit (USR2); the run stops with a checkpoint, the job is requeued, and
    the run resumes there and finishes in its MLflow run (it used to be recorded as FAILED with
    submitit's exit code, 144). `make test-all` runs it (a minute of a core)."""
    _needs("slurm")
    suite = write_suite(
        "name: requeue\nseeds: [0]\nbudget: {total_steps: 40000, eval_every: 10000, eval_episodes: 2}\n"
        "experiments: [{algo: ppo, envs: [CartPole-v1], hyperparameters: {num_envs: 4, num_steps: 64, hidden_sizes: [16]}}]\n"
    )
    results = tmp_path / "results"
    warned: list[int] = []

    def warn_once() -> None:  # as Slurm does before a time limit, at a moment a resume can be seen
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not warned:
            tasks = [pid for pid in _pids_with(b"submitit.core._submit", str(results).encode())]
            if tasks and list((results / "checkpoints").glob("*/latest.pt")):
                os.kill(tasks[0], signal.SIGUSR2)
                warned.append(tasks[0])
            time.sleep(0.2)

    threading.Thread(target=warn_once, daemon=True).start()
    arguments = ("run", "--suite", str(suite), "--results-dir", str(results), "--checkpoint-every", "2000")
    completed = run_cli(*arguments, *EXECUTORS["slurm"], "--slurm-time", "20", cwd=tmp_path)
    assert warned and completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert re.search(r"resum\w* ppo/CartPole-v1/seed0 from its checkpoint at env step [\d,]+", completed.stdout), completed.stdout[-3000:]
    client, runs = all_runs(f"sqlite:///{results / 'mlflow.db'}")
    (child,) = [run for run in runs if "run_key" in run.data.tags]
    assert child.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(child.info.run_id, "eval/return_mean")]
    assert steps == list(range(10000, 40001, 10000)), steps  # every evaluation once, across the two attempts
    logs = "".join(path.read_text() for path in (results / "slurm").glob("*/*_log.out"))
    assert "Requeued job" in logs


def _pids_with(*parts: bytes) -> list[int]:
    """Live processes whose command line holds every one of ``parts``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
        except OSError:
            continue
        if all(part in text for part in parts):
            found.append(int(cmdline.parent.name))
    return found


def test_a_queue_manager_interrupted_while_it_starts_is_ended_all_the_same():
    """A Ctrl-C in ``SyncManager.start`` leaves its process started but no ``shutdown`` yet
    (which raised AttributeError and exit 1): the pool's clean-up ends the process itself."""
    import multiprocessing
    from multiprocessing.managers import SyncManager

    from benchmark.execution import local

    manager = SyncManager(ctx=multiprocessing.get_context("spawn"))
    manager._process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    manager._process.start()
    assert not hasattr(manager, "shutdown")
    local._stop_manager(manager)
    assert not manager._process.is_alive()
    local._stop_manager(SyncManager())  # never started: nothing to end
