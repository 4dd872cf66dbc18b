"""The suite report from MLflow: every run present in every state, plots that open, HTML that shows them."""

import base64
import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from conftest import run_cli_in_process as run_cli
from mlflow.tracking import MlflowClient

from benchmark.analysis import report
from benchmark.analysis.document import Document
from benchmark.analysis.records import RunRecord
from benchmark.config import load_suite

ROOT = Path(__file__).resolve().parent.parent

REPORT_SUITE = """
name: reportsuite
description: two algorithms on two tasks
seeds: [0, 1, 2, 3]
budget: {total_steps: 512, eval_every: 256, eval_episodes: 2}
experiments:
  - algo: ppo
    envs: [CartPole-v1, Pendulum-v1]
    hyperparameters: {num_envs: 2, num_steps: 64, num_minibatches: 2, num_epochs: 2, hidden_sizes: [16, 16]}
  - algo: a2c
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 2, hidden_sizes: [16, 16]}
"""


def test_report_of_a_small_suite_contains_every_run_and_plot(write_suite, tmp_path):
    suite_path = write_suite(REPORT_SUITE, "reportsuite.yaml")
    results = tmp_path / "results"
    # seeds 0 and 1 train; seed 2 gets a run that failed and seed 3 one still going; nothing else
    completed = run_cli("run", "--suite", str(suite_path), "--seeds", "0", "1", "--workers", "2", "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    uri = f"sqlite:///{results / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("reportsuite").experiment_id
    specs = {(s.algo, s.env_id, s.seed): s for s in load_suite(str(suite_path)).specs}
    failed = client.create_run(experiment, tags={"run_key": specs["ppo", "CartPole-v1", 2].run_key, "error": "RuntimeError: boom"})
    client.set_terminated(failed.info.run_id, "FAILED")
    running = client.create_run(experiment, tags={"run_key": specs["ppo", "Pendulum-v1", 3].run_key})
    client.log_metric(running.info.run_id, "eval/return_mean", -1234.5, step=256)

    completed = run_cli("report", "--suite", str(suite_path), "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    out = results / "reports" / "reportsuite"
    markdown, page = (out / "report.md").read_text(), (out / "report.html").read_text()

    for spec in specs.values():  # every run of the suite, whatever became of it
        assert spec.run_key in markdown and spec.run_key in page
    assert "RuntimeError: boom" in markdown and "256 of 512 steps" in markdown
    assert re.search(r"\| ppo \| CartPole-v1 \| 2 \| FAILED \|", markdown)
    assert re.search(r"\| ppo \| Pendulum-v1 \| 3 \| RUNNING \|", markdown)
    assert re.search(r"\| a2c \| CartPole-v1 \| 3 \| MISSING \|", markdown)
    assert "2 finished, 1 failed, 1 missing" in markdown
    assert "Reference: 499.8 (CleanRL paper" in markdown  # the reference and its source
    assert "## CartPole-v1" in markdown and "## Pendulum-v1" in markdown

    pngs = sorted(out.glob("plots/*.png"))
    names = {p.name for p in pngs}
    assert {"curves_0.512k.png", "aggregates.png", "profiles.png"} <= names  # one learning-curve grid per budget
    assert (out / "plots" / "curves_0.512k.svg").is_file()
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert matplotlib.image.imread(png).shape[0] > 100
        # the Markdown links the files; the HTML page carries them inline (it can be mailed on its own), the
        # learning curves, aggregates and profiles as interactive plots with plotly.js inlined once
        assert f"(plots/{png.name})" in markdown
        if png.name not in {"curves_0.512k.png", "aggregates.png", "profiles.png"}:
            assert f'src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"' in page
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == len(names) - 3 and "plots/" not in page
    assert page.count('<div class="plot"') == 3 and page.count("Plotly.newPlot(") == 3 and "<script src=" not in page
    assert page.count("<script>") == 2 + 3  # plotly.js once, the enlarging script, one per plot
    assert '<meta name="viewport"' in page and '<div class="scroll"><table>' in page
    assert str(tmp_path) not in markdown and str(tmp_path) not in page  # no local paths: "from `mlflow.db`"
    assert "from `mlflow.db`" in markdown


def test_urls_in_report_html_are_links_and_text_is_escaped():
    doc = Document()
    doc.paragraph("Reference: 499.8 (CleanRL paper, https://arxiv.org/abs/2111.08819). <script>")
    doc.table(["source"], [["see https://example.org/a?b=1&c=2, then <b>"]])
    page = doc.html("t")
    assert '<a href="https://arxiv.org/abs/2111.08819">https://arxiv.org/abs/2111.08819</a>).' in page
    assert '<a href="https://example.org/a?b=1&amp;c=2">' in page and "&lt;b&gt;" in page and "&lt;script&gt;" in page


def test_unknown_suite_for_report_is_a_clear_error(tmp_path):
    completed = run_cli("report", "--suite", "nonexistent", "--results-dir", str(tmp_path / "results"), cwd=ROOT)
    assert completed.returncode == 2 and "unknown suite 'nonexistent'" in completed.stderr
    assert not (tmp_path / "results").exists()


def test_variants_of_one_algorithm_are_labelled_by_what_differs(write_suite):
    suite = load_suite(
        str(
            write_suite(
                """
        name: grid
        seeds: 2
        budget: {total_steps: 512, eval_every: 256}
        experiments:
          - algo: ppo
            envs: [CartPole-v1]
            grid: {learning_rate: [1.0e-3, 3.0e-4]}
        """
            )
        )
    )
    groups = report.group_records([RunRecord(spec) for spec in suite.specs])
    assert [g.label for g in groups] == ["ppo [learning_rate=0.001]", "ppo [learning_rate=0.0003]"]
    assert all(len(g.records) == 2 for g in groups)


def test_group_scores_count_finished_runs_only(write_suite):
    suite = load_suite(
        str(
            write_suite(
                """
        name: g
        seeds: 3
        budget: {total_steps: 512, eval_every: 256}
        experiments: [{algo: ppo, envs: [CartPole-v1]}]
        """
            )
        )
    )
    records = [
        RunRecord(suite.specs[0], status="FINISHED", final_return=100.0),
        RunRecord(suite.specs[1], status="FAILED"),
        RunRecord(suite.specs[2], status="RUNNING"),
    ]
    (group,) = report.group_records(records)
    np.testing.assert_array_equal(group.scores, [100.0])
    assert group.status_counts == "1 finished, 1 running, 1 failed"


def test_variants_differing_only_in_budget_get_distinct_labels(write_suite):
    suite = load_suite(
        str(
            write_suite(
                """
        name: budgets
        seeds: 1
        budget: {total_steps: 512, eval_every: 256}
        experiments:
          - {algo: ppo, envs: [CartPole-v1]}
          - {algo: ppo, envs: [CartPole-v1], budget: {total_steps: 1024}}
        """
            )
        )
    )
    labels = [g.label for g in report.group_records([RunRecord(spec) for spec in suite.specs])]
    assert labels == ["ppo [budget.total_steps=512]", "ppo [budget.total_steps=1024]"]


def test_per_environment_intervals_by_hand():
    intervals = report.per_environment_intervals(np.array([0.2, 0.4, 0.6, 0.8, 1.2]), reps=2_000)
    assert intervals["mean"].estimate == pytest.approx(0.64)
    assert intervals["median"].estimate == pytest.approx(0.6)
    assert intervals["IQM"].estimate == pytest.approx(0.6)  # 5 values: one cut from each end
    assert intervals["optimality gap"].estimate == pytest.approx(1 - (0.2 + 0.4 + 0.6 + 0.8 + 1.0) / 5)
    assert all(i.low <= i.estimate <= i.high for i in intervals.values())


def test_markdown_table_cells_stay_on_one_line():
    doc = Document()
    doc.table(["run", "note"], [["a", "ValueError: Expected parameter loc\n  of shape (1,)\nfound | nan"]])
    lines = doc.markdown().strip().splitlines()
    assert len(lines) == 3 and lines[2] == "| a | ValueError: Expected parameter loc of shape (1,) found \\| nan |"
