"""``python -m benchmark compare``: a candidate against baselines on the tasks both ran, at the
candidate's budget (a longer baseline read off its curve when nothing in it depends on its
budget), per task equivalent / better / worse / inconclusive by the verdict rule (a margin, Welch's
test with Holm's correction), and
normalized aggregates, probability of improvement and profiles; through the real CLI against
the committed record."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT, run_cli_in_process

from benchmark import bundles
from benchmark.analysis import compare
from benchmark.bundles import Bundle, BundledRun, Evaluation
from benchmark.config import Budget, RunSpec
from benchmark.run_record import RunRecord

RECORD_300K = ROOT / "results" / "published" / "mujoco_300k"


def record(algo: str, env_id: str, seed: int, final: float, budget: int = 30_000, curve: list[tuple[int, float]] | None = None, **hyperparameters) -> RunRecord:
    spec = RunSpec("t", algo, env_id, seed, {"hidden_sizes": [8], **hyperparameters}, Budget(budget, 5_000, 10))
    return RunRecord(spec, "FINISHED", f"run-{algo}-{seed}", final, curve=curve or [(budget, final)])


def test_a_baseline_is_read_at_the_candidates_budget_only_when_its_run_does_not_depend_on_its_own():
    candidate = [record("mine", "Hopper-v5", seed, value) for seed, value in enumerate([900.0, 950.0, 1000.0])]
    constant = [record("sac", "Hopper-v5", seed, 3000.0, 300_000, [(30_000, 400.0 + seed), (300_000, 3000.0)]) for seed in range(3)]
    annealed = [record("ppo", "Hopper-v5", seed, 2000.0, 300_000, [(30_000, 300.0), (300_000, 2000.0)], anneal_lr=True) for seed in range(3)]
    shorter = [record("td3", "Hopper-v5", seed, 200.0, 10_000) for seed in range(3)]
    (sac, ppo, td3) = compare.compare(candidate, constant + annealed + shorter, margin=0.1)  # ±329: the 90% interval [465, 633] is past it
    ((task,),) = [sac.tasks]
    assert task.baseline is not None and list(task.baseline.scores) == [400.0, 401.0, 402.0]
    assert task.baseline.how == "evaluation at 30,000 of its 300,000 steps"
    assert task.outcome == "better" and task.outcome_text == "better, beyond the margin" and task.difference == pytest.approx(950.0 - 401.0)
    (within,) = compare.compare(candidate, constant)  # the default ±658 holds the whole interval, yet they differ
    assert within.tasks[0].outcome == "better" and within.tasks[0].outcome_text == "better, within the margin"
    (same,) = compare.compare(candidate, [record("sac", "Hopper-v5", s, 3000.0, 300_000, [(30_000, 940.0 + 15 * s), (300_000, 3000.0)]) for s in range(3)])
    assert same.tasks[0].outcome == "equivalent"
    assert ppo.tasks[0].baseline is None and "moves anneal_lr with its budget" in ppo.tasks[0].reason
    assert td3.tasks[0].baseline is None and "less than 30,000" in td3.tasks[0].reason


def test_outcomes_are_holm_corrected_over_the_tasks_of_a_pair():
    """p = 0.038 alone is 'better'; beside a task with p = 1 Holm needs p <= 0.025. A-v0 and B-v0
    have no normalizer: the margin is 0.2 of the baseline's mean (±1.7 and ±1.2)."""
    mine = {"A-v0": [10.0, 11.0, 12.0], "B-v0": [5.0, 6.0, 7.0]}
    theirs = {"A-v0": [7.5, 8.5, 9.5], "B-v0": [5.0, 6.0, 7.0]}
    candidate = [record("mine", env, seed, value) for env, values in mine.items() for seed, value in enumerate(values)]
    baseline = [record("base", env, seed, value) for env, values in theirs.items() for seed, value in enumerate(values)]
    (alone,) = compare.compare([r for r in candidate if r.spec.env_id == "A-v0"], [r for r in baseline if r.spec.env_id == "A-v0"])
    p = alone.tasks[0].p_value
    assert p is not None and 0.025 < p < 0.05 and alone.tasks[0].outcome == "better"
    (pair,) = compare.compare(candidate, baseline)
    assert [task.outcome for task in pair.tasks] == ["inconclusive", "inconclusive"]
    assert "(Holm-adjusted 0.075 over 2 rows)" in pair.tasks[0].reason and pair.tasks[0].outcome_text.startswith("inconclusive (needs ")
    worse = [dataclasses.replace(r, final_return=r.final_return - 5.0, curve=[(30_000, r.final_return - 5.0)]) for r in candidate if r.spec.env_id == "A-v0"]
    (lower,) = compare.compare(worse, [r for r in baseline if r.spec.env_id == "A-v0"])
    assert lower.tasks[0].outcome == "worse"


def test_one_seed_or_other_env_settings_are_not_tested_and_same_names_are_told_apart():
    one_seed = compare.compare([record("sac", "Hopper-v5", 0, 1.0)], [record("sac", "Hopper-v5", seed, 2.0 + seed) for seed in range(3)])
    assert one_seed[0].candidate == "sac (candidate)" and one_seed[0].baseline == "sac (baseline)"
    assert one_seed[0].tasks[0].outcome == "not tested" and "the test needs 2" in one_seed[0].tasks[0].reason
    wrapped = [
        dataclasses.replace(r, spec=dataclasses.replace(r.spec, env_kwargs={"ctrl_cost_weight": 0.1}))
        for r in (record("mine", "Hopper-v5", s, 1.0 + s) for s in range(2))
    ]
    (pair,) = compare.compare(wrapped, [record("sac", "Hopper-v5", seed, 2.0 + seed) for seed in range(2)])
    assert pair.tasks[0].baseline is None and "made differently" in pair.tasks[0].reason


def candidate_bundle(path, final: list[float]) -> None:
    runs = {}
    for seed, value in enumerate(final):
        spec = RunSpec("mine", "sac", "Hopper-v5", seed, {"hidden_sizes": [64, 64], "learning_starts": 1000}, Budget(30_000, 5_000, 10))
        evaluation = Evaluation(30_000, value, 1.0, (value,) * 10, (1000,) * 10)
        run = BundledRun(spec, value, 1.0, (evaluation,), device="cpu", provenance={name: "" for name in bundles.PROVENANCE})
        runs[run.run_key] = run
    bundles.write(Bundle("mine", runs), path)


def test_compare_against_the_committed_record_through_the_cli(tmp_path):
    """A candidate bundle of 3 seeds at 30k on Hopper against the record's SAC and TD3 (300k
    runs, read at 30k on their curves): a per-task table, aggregates and a report."""
    candidate_bundle(tmp_path / "mine", [2500.0, 2600.0, 2700.0])
    arguments = ("compare", "--candidate", str(tmp_path / "mine"), "--baseline", "published/mujoco_300k", "--algos", "sac", "td3")
    completed = run_cli_in_process(*arguments, "--results-dir", str(ROOT / "results"), "--output", str(tmp_path / "cmp"), "--format", "csv", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    rows = [line for line in lines if line.startswith("sac (candidate),sac (baseline),Hopper-v5") or line.startswith("sac (candidate),td3,Hopper-v5")]
    assert len(rows) == 2 and all("evaluation at 30,000 of its 300,000 steps" in row and '"better, beyond the margin"' in row for row in rows), completed.stdout
    assert (tmp_path / "cmp" / "report.html").is_file() and (tmp_path / "cmp" / "plots" / "profiles-0.png").is_file()
    text = (tmp_path / "cmp" / "report.md").read_text()
    assert "P(candidate > baseline)" in text and "IQM" in text and "optimality gap" in text


def test_bad_input_is_one_line(tmp_path):
    candidate_bundle(tmp_path / "mine", [1.0, 2.0])
    (tmp_path / "empty").mkdir()
    for arguments, message in (
        (("--candidate", str(tmp_path / "empty"), "--baseline", "published/mujoco_300k"), "is a directory but not a result bundle"),
        (
            ("--candidate", str(tmp_path / "mine"), "--baseline", "published/mujoco_300k", "--algos", "sax"),
            "--algos sax: the baseline has no finished run of it",
        ),
        (("--candidate", "no-such-suite", "--baseline", "published/mujoco_300k"), "unknown suite 'no-such-suite'"),
    ):
        completed = run_cli_in_process("compare", *arguments, "--results-dir", str(ROOT / "results"), "--output", str(tmp_path / "out"), cwd=tmp_path)
        assert completed.returncode == 2 and len(completed.stderr.strip().splitlines()) == 1, completed.stderr
        assert message in completed.stderr, completed.stderr
    assert not (tmp_path / "out").exists()
