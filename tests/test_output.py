"""What a user reads in a terminal: tables within COLUMNS without a cut name, --format md|csv|json,
one summary row per configuration, a runnable command tag, and `ui` pointing at the runs page."""

import csv
import io
import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import as_from_a_terminal, run_cli_in_process
from rich.console import Console

from benchmark import provenance, tracking
from benchmark.analysis import summary
from benchmark.cli import app as cli
from benchmark.config import load_suite
from benchmark.run_record import RunRecord
from benchmark.tables import TableData

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, columns: int | None = None) -> subprocess.CompletedProcess:
    """The command as a pipe sees it (no terminal), in this process: its tables take their width
    from COLUMNS as in a new one."""
    return run_cli_in_process(*args, env={"COLUMNS": str(columns)} if columns else None)


def render(table: TableData, width: int) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table.rich(width))
    return console.export_text().splitlines()


def test_a_table_fits_the_width_and_never_cuts_a_name():
    table = TableData("t", ["name", "environments", "description"], names={"name"}, lists={"environments"})
    table.add("tuned/ppo-Pendulum-v1", "reprorl/HalfCheetahDir-v5, reprorl/HalfCheetahVel-v5, Hopper-v5", "word " * 40)
    table.add("ci", "CartPole-v1", "short")
    lines = render(table, 80)
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    for name in ("tuned/ppo-Pendulum-v1", "reprorl/HalfCheetahDir-v5", "reprorl/HalfCheetahVel-v5", "Hopper-v5"):
        assert name in text, name  # whole, on one line


def _tokens(text: str) -> set[str]:
    """Every whitespace-separated token of ``text``, table borders left out."""
    return {token for token in text.replace("│", " ").replace("┃", " ").split() if token.strip("─━┏┓┗┛┡┩└┘┳┻╇┴┬")}


def test_the_dry_run_is_one_line_per_run_at_80_columns():
    """No run key, env id or number is cut; each run is one line; the settings go once per experiment."""
    completed = run_cli("run", "--suite", "mujoco", "--algos", "sac", "td3", "--envs", "Hopper-v5", "--seeds", "0", "1", "2", "--dry-run", columns=80)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert max(map(len, lines[: lines.index(next(line for line in lines if line.startswith("6 runs in suite")))])) <= 80
    for spec in load_suite("mujoco", seeds=[0, 1, 2]).select(["sac", "td3"], ["Hopper-v5"]).specs:
        (line,) = [line for line in lines if spec.run_key in line]  # the whole key, on exactly one line
        assert spec.algo in line.split() and "Hopper-v5" in line.split() and "1M" in line.split() and "to train" in line
    assert "3,000,000" in _tokens(completed.stdout)  # the experiments' steps left, whole


def test_verdicts_and_the_summary_cut_no_number_at_80_columns():
    machine = run_cli("verdicts", "--suite", "mujoco", "--format", "json", "--results-dir", str(ROOT / "results"))
    terminal = run_cli("verdicts", "--suite", "mujoco", "--results-dir", str(ROOT / "results"), columns=80)
    assert machine.returncode == 0 and terminal.returncode == 0, machine.stderr + terminal.stderr
    tokens = _tokens(terminal.stdout)
    for row in json.loads(machine.stdout)["rows"]:
        for value in (row["algorithm"], row["environment"], row["steps"], str(row["published"]).split()[0]):
            assert str(value) in tokens, value
        for number in row["ours (mean ± std)"].split():
            assert number in tokens, number
    suite = load_suite("mujoco", seeds=[0, 1, 2])
    records = [RunRecord(spec, status="FINISHED", final_return=1234.5 * (i + 1), steps_per_second=1234.0) for i, spec in enumerate(suite.specs[:6])]
    lines = render(summary.table(summary.summarize(records), "summary"), 80)
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    assert "1,234" in _tokens(text) and "final eval return (mean ± sample std over seeds)".split()[0] in text


@pytest.mark.parametrize("section", ["algorithms", "suites", "envs", "buffers", "ppo"])
def test_list_is_readable_at_80_columns(section):
    completed = run_cli("list", section, columns=80)
    assert completed.returncode == 0, completed.stderr
    assert max(map(len, completed.stdout.splitlines())) <= 80
    if section == "suites":
        for name in ("tuned/ppo-Pendulum-v1", "reprorl/HalfCheetahDir-v5", "InvertedPendulum-v5", "surrogate_pg"):
            assert name in completed.stdout
    if section == "ppo":
        assert "clip_range" in completed.stdout and "Schulman" in completed.stdout


def test_list_formats_for_pasting_and_programs():
    as_csv = run_cli("list", "envs", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert {"id": "CartPole-v1", "observation": "Box(4,)", "actions": "Discrete(2)", "max episode steps": "500"} in rows
    as_json = json.loads(run_cli("list", "suites", "--format", "json").stdout)
    assert {"smoke", "mujoco"} <= {row["name"] for row in as_json["rows"]}
    as_md = run_cli("list", "buffers", "--format", "md").stdout.splitlines()
    assert as_md[0] == "| name | description |" and as_md[1] == "|---|---|" and any(line.startswith("| per |") for line in as_md)
    unknown = run_cli("list", "sacc")
    assert unknown.returncode == 2 and unknown.stderr.strip() == (
        "error: nothing to list as 'sacc' (did you mean 'sac'?); list one of algorithms, buffers, suites, envs or an algorithm"
    )


def test_the_summary_keeps_grid_points_apart(write_suite):
    suite = load_suite(
        str(
            write_suite(
                """
        name: grid
        seeds: 2
        budget: {total_steps: 512, eval_every: 256}
        experiments:
          - {algo: ppo, envs: [CartPole-v1], grid: {learning_rate: [1.0e-3, 3.0e-4]}}
          - {algo: sac, envs: [Pendulum-v1]}
        """
            )
        )
    )
    outcomes = [RunRecord(spec, status="FINISHED", final_return=float(index), steps_per_second=10.0) for index, spec in enumerate(suite.specs)]
    outcomes[-1] = RunRecord(suite.specs[-1], status="CLAIMED", claimed_by="pid 1 on h")
    rows = summary.summarize(outcomes)
    assert [(row.label, row.env_id, row.returns) for row in rows] == [
        ("ppo [learning_rate=0.001]", "CartPole-v1", [0.0, 1.0]),
        ("ppo [learning_rate=0.0003]", "CartPole-v1", [2.0, 3.0]),
        ("sac", "Pendulum-v1", [4.0]),
    ]
    assert summary.cells(rows[2])[4] == "4 (1 in another launch)"
    markdown = summary.to_markdown(rows)
    assert "| ppo [learning_rate=0.001] | CartPole-v1 | 2 | 0.5 ± 0.7 | 0, 1 | 10 |" in markdown


def test_the_command_tag_can_be_typed_again():
    benchmark_main = str(ROOT / "benchmark" / "__main__.py")
    assert provenance.command_line([benchmark_main, "run", "--suite", "my suite.yaml"]) == "python -m benchmark run --suite 'my suite.yaml'"
    assert provenance.command_line(["/venv/bin/reprorl", "report", "--suite", "smoke"]) == "reprorl report --suite smoke"


def test_ui_prints_each_suites_runs_page_once_it_answers_and_stops_quietly(tmp_path):
    """The links come once the server answers, its access log goes to a file, and Ctrl-C ends it
    without a traceback; experiments made before the kind tag get it (MLflow 3 would open them
    in its GenAI view)."""
    import signal
    import socket

    results = tmp_path / "results"
    results.mkdir()
    uri = f"sqlite:///{results / 'mlflow.db'}"
    client = tracking.client(uri)
    old = client.create_experiment("old", artifact_location=(results / "a").as_uri())  # made before the kind tag
    new = tracking.experiment_id(uri, "smoke", results / "mlartifacts")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ui = subprocess.Popen(
        as_from_a_terminal("ui", "--port", str(port), "--results-dir", str(results)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = ui.stdout.readline()
        assert first.startswith(f"MLflow UI at http://localhost:{port}/#/experiments?workflowType=machine_learning (Ctrl-C stops it"), first
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:  # up when it says so
            assert answer.status == 200
        pages = [ui.stdout.readline() for _ in range(3)]
        assert "switched to 'Model training'" in pages[2]
        assert f"  smoke: http://localhost:{port}/#/experiments/{new}/runs?workflowType=machine_learning\n" in pages
        assert f"  old: http://localhost:{port}/#/experiments/{old}/runs?workflowType=machine_learning\n" in pages
        ui.send_signal(signal.SIGINT)
        out, err = ui.communicate(timeout=60)
    finally:
        ui.kill()
    assert ui.returncode == 0 and out.strip() == "MLflow UI stopped" and err == "", (out, err)
    deadline = time.monotonic() + 30  # the server and what it started end with it
    while time.monotonic() < deadline and any(str(results).encode() in line for line in _cmdlines()):
        time.sleep(0.2)
    assert not any(str(results).encode() in line for line in _cmdlines())
    assert (results / "mlflow-ui.log").stat().st_size > 0  # the server's own lines, out of the terminal
    kinds = {e.name: e.tags.get("mlflow.experimentKind") for e in client.search_experiments()}
    assert kinds["old"] == kinds["smoke"] == "custom_model_development"  # opens on the runs table, not the GenAI view
    assert cli.main(["ui", "--results-dir", str(tmp_path / "none")]) == cli.EXIT_CONFIG_ERROR  # nothing to show


def _cmdlines() -> list[bytes]:
    """The command lines of the live processes."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(path.read_bytes())
        except OSError:  # it ended meanwhile
            continue
    return found


def test_the_live_board_never_cuts_a_run_label():
    from benchmark.execution.progress import Board

    for width in (80, 60):
        console = Console(width=width, record=True, file=io.StringIO())
        board = Board({"k": 1_000_000}, console, live=False)
        board.started("k", "ppo/HalfCheetah-v5/seed0", "CPU, 3 seeds batched")
        board.progressed("k", 500_000, 1234.5)
        console.print(board.table())
        text = console.export_text()
        assert "ppo/HalfCheetah-v5/seed0 " in text and max(map(len, text.splitlines())) <= width
