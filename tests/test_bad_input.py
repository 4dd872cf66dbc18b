"""Every bad path through the real CLI: exactly one line on stderr naming the problem, no
traceback, exit 2 for bad input (1 for a failure while running), and no stored byte changed."""

import contextlib
import errno
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_SUITE

from benchmark import stores, tracking
from benchmark.cli import app as cli
from benchmark.training import checkpoint

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmark", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def assert_one_line_error(completed: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert completed.returncode == code, (completed.returncode, completed.stderr)
    lines = completed.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), completed.stderr
    assert "Traceback" not in completed.stdout + completed.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def fingerprint(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` with the hash of its bytes."""
    if not directory.exists():
        return {}
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def template_store(tmp_path_factory) -> Path:
    """A valid MLflow store with one experiment in it."""
    results = tmp_path_factory.mktemp("template") / "results"
    results.mkdir()
    uri = f"sqlite:///{results / 'mlflow.db'}"
    tracking.experiment_id(uri, "existing", results / "mlartifacts")
    return results / "mlflow.db"


@pytest.fixture
def results(tmp_path, template_store) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(template_store, results / "mlflow.db")
    return results


@pytest.fixture
def tiny(write_suite) -> Path:
    return write_suite(TINY_SUITE, "tiny.yaml")


@pytest.mark.parametrize(
    "write,fragments",
    [
        (lambda path: path.write_bytes("name: caf\xe9\n".encode("latin-1")), ["suite.yaml:1:10: not UTF-8 text (byte 0xe9)"]),
        (lambda path: path.write_text("seeds: [0\nbudget: {}\n"), ["suite.yaml:2:", "YAML syntax error", "opened at line 1"]),
        (lambda path: path.mkdir(), ["is a directory"]),
    ],
    ids=["not-utf8", "yaml-syntax", "directory"],
)
def test_a_bad_suite_file(tmp_path, results, write, fragments):
    suite = tmp_path / "suite.yaml"
    write(suite)
    before = fingerprint(results)
    assert_one_line_error(run_cli("run", "--suite", str(suite), "--results-dir", str(results)), 2, *fragments)
    assert fingerprint(results) == before


@pytest.mark.parametrize(
    "damage,fragments",
    [
        (lambda path: path.write_bytes(b""), ["mlflow.db is empty (0 bytes), not an MLflow tracking store"]),
        (lambda path: path.write_bytes(path.read_bytes()[:50_000]), ["mlflow.db is truncated (50,000 of"]),
        (lambda path: path.write_bytes(os.urandom(8192)), ["mlflow.db is not an SQLite database"]),
        (lambda path: path.write_bytes(b"SQLite format 3\x00" + path.read_bytes()[16:4096] + os.urandom(path.stat().st_size - 4096)), ["mlflow.db is corrupt"]),
        (
            lambda path: (path.unlink(), __import__("sqlite3").connect(path).execute("create table studies (x)").connection.commit()),
            ["is an SQLite database but not an MLflow tracking store"],
        ),
    ],
    ids=["empty", "truncated", "garbage", "corrupt-pages", "foreign"],
)
@pytest.mark.parametrize("command", ["run", "report"])
def test_a_damaged_or_foreign_store_is_named_and_left_alone(tiny, results, damage, fragments, command):
    damage(results / "mlflow.db")
    before = fingerprint(results)
    assert_one_line_error(run_cli(command, "--suite", str(tiny), "--results-dir", str(results)), 2, *fragments)
    assert fingerprint(results) == before


def test_results_directory_or_tracking_uri_that_cannot_be_created(tmp_path, tiny):
    assert_one_line_error(
        run_cli("run", "--suite", str(tiny), "--results-dir", str(tmp_path / "no" / "such" / "results")),
        2,
        "cannot be created: its parent",
        "does not exist",
    )
    assert_one_line_error(
        run_cli("run", "--suite", str(tiny), "--results-dir", str(tmp_path / "r"), "--tracking-uri", f"sqlite:///{tmp_path}/nodir/mlflow.db"),
        2,
        "directory",
        "nodir does not exist",
    )
    assert_one_line_error(
        run_cli("run", "--suite", str(tiny), "--results-dir", str(tmp_path / "r"), "--tracking-uri", "ftp://host/x"),
        2,
        "unsupported scheme 'ftp'",
    )
    assert not (tmp_path / "no").exists() and not (tmp_path / "nodir").exists() and not (tmp_path / "r").exists()


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str, readonly: bool = False):
    """A small tmpfs at ``path`` (root only; the test is skipped elsewhere)."""
    path.mkdir()
    options = f"size={size}" + (",ro" if readonly else "")
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot mount a tmpfs here ({error})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_read_only_results_directory(tmp_path, tiny, template_store):
    if os.geteuid() != 0:  # an unprivileged user: permissions are enough
        readonly = tmp_path / "readonly"
        readonly.mkdir()
        shutil.copy(template_store, readonly / "mlflow.db")
        readonly.chmod(0o555)
        context = contextlib.nullcontext(readonly)
    else:  # root ignores permissions: a read-only mount
        source = tmp_path / "source"
        source.mkdir()
        shutil.copy(template_store, source / "mlflow.db")
        context = mounted_tmpfs(tmp_path / "readonly", "16m")
    with context as readonly:
        if os.geteuid() == 0:
            shutil.copy(source / "mlflow.db", readonly / "mlflow.db")
            subprocess.run(["mount", "-o", "remount,ro", str(readonly)], check=True)
        before = fingerprint(readonly)
        assert_one_line_error(run_cli("run", "--suite", str(tiny), "--results-dir", str(readonly)), 2, "is not writable")
        assert_one_line_error(run_cli("run", "--suite", str(tiny), "--results-dir", str(readonly / "new")), 2, "cannot be created")
        assert_one_line_error(run_cli("report", "--suite", str(tiny), "--results-dir", str(readonly)), 1, "no finished run")
        assert_one_line_error(
            run_cli("run", "--suite", str(tiny), "--results-dir", str(tmp_path / "elsewhere"), "--tracking-uri", f"sqlite:///{readonly / 'mlflow.db'}"),
            2,
            "mlflow.db is read-only",
        )
        assert fingerprint(readonly) == before


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["report", "--suite", "smoke"], ["does not exist", "mlflow.db not found"]),
        (["reproduce", "0123abcd"], ["does not exist", "mlflow.db not found"]),
        (["regress", "--suite", "ci"], ["results directory", "does not exist"]),
        (["tune", "show", "ppo-CartPole-v1"], ["no study storage at"]),
    ],
    ids=["report", "reproduce", "regress", "tune-show"],
)
def test_reading_commands_refuse_a_results_directory_that_does_not_exist(tmp_path, args, fragments):
    missing = tmp_path / "results"
    assert_one_line_error(run_cli(*args, "--results-dir", str(missing)), 2, *fragments)
    assert not missing.exists()


def test_report_of_a_suite_without_a_finished_run(tiny, results):
    before = fingerprint(results)
    assert_one_line_error(run_cli("report", "--suite", str(tiny), "--results-dir", str(results)), 1, "suite 'tiny' has no finished run", "3 missing of 3")
    assert fingerprint(results) == before and not (results / "reports").exists()


SLOW = """\
name: slow
seeds: [0]
budget: {total_steps: 100000000, eval_every: 2000, eval_episodes: 1}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 2, num_steps: 64, num_minibatches: 2, num_epochs: 1, hidden_sizes: [16, 16]}
"""


def test_a_full_disk_mid_run_says_so_and_keeps_the_last_checkpoint(tmp_path, write_suite):
    suite = write_suite(SLOW, "slow.yaml")
    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        results = disk / "results"
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmark", "run", "--suite", str(suite), "--results-dir", str(results)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            latest = None
            while latest is None and time.monotonic() < deadline:
                found = list((results / "checkpoints").glob(f"*/{checkpoint.LATEST}"))
                latest = found[0] if found else None
                assert process.poll() is None, process.communicate()[1]
                time.sleep(0.1)
            assert latest is not None
            time.sleep(0.5)  # the next checkpoints replace it atomically
            with contextlib.suppress(OSError), open(disk / "filler", "wb") as filler:  # fill the disk
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            out, err = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()
        completed = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        assert_one_line_error(completed, 1, "the disk is full")
        assert checkpoint.load(latest)["loop"]["step"] > 0  # the last checkpoint written stays whole
        assert not list(latest.parent.glob(".*.tmp"))  # and no partial write is left behind


def test_a_checkpoint_write_that_finds_the_disk_full_leaves_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / checkpoint.LATEST
    checkpoint.write_atomic({"step": torch.tensor(1)}, path)
    before = path.read_bytes()

    def full(payload, file):
        file.write(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.write_atomic({"step": torch.tensor(2)}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [checkpoint.LATEST]


@pytest.mark.parametrize("made_by", ["mlflow", "copy"])
def test_a_full_disk_when_the_store_is_created_is_one_line(tmp_path, tiny, capsys, monkeypatch, made_by):
    """(The unprivileged twin of the tmpfs test: the store's creation hits ENOSPC, whether MLflow
    sets its schema up or a cached empty store is copied.)"""

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device", str(args[-1]))

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if made_by == "mlflow":
        monkeypatch.setattr(tracking.store, "_create_mlflow_db", full)
    else:
        tracking.ensure_store(f"sqlite:///{tmp_path / 'first.db'}")  # leaves its empty store in the cache
        monkeypatch.setattr(stores.shutil, "copyfile", full)
    code = cli.main(["run", "--suite", str(tiny), "--results-dir", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert code == cli.EXIT_RUNS_FAILED and err.count("\n") == 1 and "the disk is full" in err
    assert not (tmp_path / "results" / "mlflow.db").exists()


def test_a_suite_whose_experiment_was_deleted_is_refused(tiny, results):
    uri = f"sqlite:///{results / 'mlflow.db'}"
    client = tracking.client(uri)
    client.delete_experiment(tracking.experiment_id(uri, "tiny", results / "mlartifacts"))
    before = fingerprint(results)
    assert_one_line_error(
        run_cli("run", "--suite", str(tiny), "--results-dir", str(results)),
        2,
        "experiment 'tiny'",
        "was deleted from the tracking store",
        "mlflow experiments restore",
    )
    assert fingerprint(results) == before


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["run", "--suite", "smoke", "--format", "xml"], ["python -m benchmark run: argument --format: invalid choice 'xml'; choose from table, md"]),
        (["run"], ["the following arguments are required: --suite"]),
        (["bogus"], ["unknown command 'bogus'; commands: run, train"]),
        (["trian"], ["unknown command 'trian' (did you mean 'train'?)"]),
        (["run", "--suite", "smoke", "--workers", "two"], ["argument --workers: invalid int value: 'two'"]),
    ],
    ids=["bad-choice", "missing-option", "unknown-command", "misspelled-command", "not-a-number"],
)
def test_a_bad_command_line_is_one_line_too(tmp_path, args, fragments):
    assert_one_line_error(run_cli(*args, "--results-dir", str(tmp_path / "results")), 2, *fragments)
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "header,fragments",
    [
        ("name: a/b", ["name 'a/b': use letters, digits"]),
        ("device: cuda", ["no CUDA device is visible here"]),
        ("device: tpu", ["device 'tpu': use auto, cpu, cuda or cuda:i"]),
    ],
    ids=["name-with-a-slash", "cuda-on-a-cpu-machine", "unknown-device"],
)
def test_a_suite_that_cannot_run_here_is_refused_before_anything_is_created(tmp_path, write_suite, header, fragments):
    import torch

    if header == "device: cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    suite = write_suite(f"{header}\nseeds: [0]\nbudget: {{total_steps: 100, eval_every: 50}}\nexperiments: [{{algo: ppo, envs: [CartPole-v1]}}]\n")
    assert_one_line_error(run_cli("run", "--suite", str(suite), "--results-dir", str(tmp_path / "results")), 2, *fragments)
    assert not (tmp_path / "results").exists()


def test_a_full_disk_when_a_run_s_mlflow_run_is_created_names_the_cause(tmp_path, tiny, monkeypatch):
    """The worker cannot create the run's child run (SQLite: 'database or disk is full', as
    SQLAlchemy and MLflow wrap it): the run FAILED with the cause named, not the wrappers'."""
    import queue

    from benchmark.config import load_suite
    from benchmark.execution import worker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = tracking.experiment_id(uri, "tiny", tmp_path / "mlartifacts")
    parent = tracking.client(uri).create_run(experiment)
    spec = load_suite(str(tiny), seeds=[0]).specs[0]

    def full(*args, **kwargs):
        try:
            raise OSError("(sqlite3.OperationalError) database or disk is full")
        except OSError as cause:
            raise RuntimeError("API request to create the run failed") from cause

    monkeypatch.setattr(tracking, "start_child_run", full)
    (outcome,) = worker.train_group([spec], worker.Launch(uri, experiment, parent.info.run_id, None), queue.Queue())
    assert outcome.status == "FAILED" and outcome.error == "the disk is full"
