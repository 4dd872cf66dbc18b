"""The example package (examples/redq, installed by make install) as a user's plug-in: found by
its entry point and by import path, trained by a suite with seeds batched, resumed after its
launch is killed, listed, reported and compared with a baseline, on the package's own env."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import ROOT, run_cli_in_process
from mlflow import MlflowClient

import agents
from agents import registry
from benchmark.config import load_suite
from benchmark.training import checkpoint

SUITE = """
name: example
seeds: [0, 1]
budget: {total_steps: 1500, eval_every: 500, eval_episodes: 2}
seeds_per_process: 2
checkpoint: {every: 250}
experiments:
  - algo: redq
    envs: [redq_example.envs:PointReach-v0]
    hyperparameters: {hidden_sizes: [16], learning_starts: 200, start_steps: 200, gradient_steps: 2, policy_delay: 2}
  - algo: sac
    envs: [redq_example.envs:PointReach-v0]
    hyperparameters: {hidden_sizes: [16], learning_starts: 200, start_steps: 200}
"""


def test_the_example_is_found_by_entry_point_and_by_import_path():
    registry.plugins.cache_clear()
    registry._plugin.cache_clear()
    assert registry.plugins()["redq"] == "redq_example.redq:REDQ"
    assert agents.algorithm_class("redq") is agents.algorithm_class("redq_example.redq:REDQ")
    assert agents.resolve_config("redq").num_critics == 10  # its published defaults


def test_the_example_trains_batched_resumes_after_a_kill_and_is_listed_reported_and_compared(write_suite, tmp_path):
    suite = write_suite(SUITE, "example.yaml")
    results = tmp_path / "results"
    redq = next(spec for spec in load_suite(str(suite)).specs if spec.algo == "redq")
    latest = results / "checkpoints" / redq.run_key / checkpoint.LATEST
    launch = [sys.executable, "-m", "benchmark", "run", "--suite", str(suite), "--results-dir", str(results), "--workers", "1"]
    process = subprocess.Popen(launch, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        import time

        deadline = time.monotonic() + 300
        while not (latest.exists() and checkpoint.step_of(latest)):
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "no checkpoint of the plug-in's run"
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    killed_at = checkpoint.step_of(latest)
    assert killed_at is not None and 0 < killed_at < 1500
    again = run_cli_in_process("run", "--suite", str(suite), "--results-dir", str(results), "--workers", "1", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4/4 runs finished" in again.stdout and "from its checkpoint at env step" in again.stdout, again.stdout[-3000:]
    assert "2 seeds batched" in again.stdout
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.run_key != ''")
    finished = {run.data.tags["run_key"] for run in runs if run.info.status == "FINISHED"}
    assert finished == {spec.run_key for spec in load_suite(str(suite)).specs}

    listed = run_cli_in_process("list", cwd=tmp_path)
    assert listed.returncode == 0 and "redq" in listed.stdout
    reported = run_cli_in_process("report", "--suite", str(suite), "--results-dir", str(results), "--output", str(tmp_path / "report"), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert "redq" in (tmp_path / "report" / "report.md").read_text()
    compared = run_cli_in_process(
        "compare",
        "--candidate",
        str(suite),
        "--baseline",
        str(suite),
        "--algos",
        "sac",
        "--results-dir",
        str(results),
        "--output",
        str(tmp_path / "cmp"),
        cwd=tmp_path,
    )
    assert compared.returncode == 0, compared.stderr[-2000:]
    text = (tmp_path / "cmp" / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| redq | sac (baseline) |"))  # the candidate's sac too
    assert "redq_example.envs:PointReach-v0 | 1,500 |" in row and ("Welch's t-test" in row or "seed(s) on one side" in row), row
