"""``reproduce`` in its two modes, through the real CLI: at today's code (bit-identical, or the new
score judged against its cell's seeds, with the behaviour fingerprint) and at the run's own
commit (a temporary worktree, what differs from the run's machine named); and the judgement by
hand."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import run_cli_in_process
from scipy import stats

from benchmark import bundles, provenance
from benchmark.analysis import reproduce
from benchmark.bundles import Bundle

TINY = """
name: replayed
description: one short PPO run on CartPole
seeds: 2
budget:
  total_steps: 1024
  eval_every: 512
  eval_episodes: 2
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters:
      num_steps: 128
      num_minibatches: 4
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two seeds trained here and exported as a bundle."""
    root = tmp_path_factory.mktemp("replayed")
    suite = root / "replayed.yaml"
    suite.write_text(TINY)
    results = root / "results"
    assert run_cli_in_process("run", "--suite", str(suite), "--results-dir", str(results), "--yes").returncode == 0
    assert run_cli_in_process("export", "--suite", str(suite), "--results-dir", str(results), "--output", str(root / "bundle")).returncode == 0
    return root


def test_the_prediction_interval_of_one_run_by_hand():
    cell = [100.0, 110.0, 120.0, 130.0]
    judged = reproduce.judge_against_cell(150.0, cell)
    half = stats.t.ppf(0.975, 3) * stats.tstd(cell) * (1 + 1 / 4) ** 0.5
    assert (judged.low, judged.high) == pytest.approx((115.0 - half, 115.0 + half)) and judged.seeds == 4
    assert judged.consistent and "consistent with the record" in judged.text()
    assert not reproduce.judge_against_cell(115.0 + half + 1, cell).consistent
    assert reproduce.judge_against_cell(1.0, [1.0]) is None


def test_at_todays_code_a_changed_score_is_judged_against_its_cells_seeds(trained, tmp_path):
    """The bundle's seed 0 made to differ from what training repeats: not bit-identical, and
    judged by the cell's two seeds (a wide interval: consistent)."""
    bundle = bundles.read(trained / "bundle")
    key = sorted(bundle.runs)[0]
    run = bundle.runs[key]
    shifted = [dataclasses.replace(e, mean=e.mean + 1.0) for e in run.curve]
    edited = {**bundle.runs, key: dataclasses.replace(run, curve=tuple(shifted), final_return=shifted[-1].mean)}
    bundles.write(Bundle(bundle.suite, edited), tmp_path / "bundle")
    done = run_cli_in_process("reproduce", key, "--from", str(tmp_path / "bundle"), "--results-dir", str(tmp_path))
    out = done.stdout
    assert "differ:" in out and "prediction interval of one run from the cell's 2 seeds" in out, out + done.stderr
    assert "behaviour: ppo's code here behaves as the code that trained the run" in out
    assert done.returncode == (0 if "consistent with the record:" in out else 1)
    unchanged = run_cli_in_process("reproduce", key, "--from", str(trained / "bundle"), "--results-dir", str(tmp_path))
    assert unchanged.returncode == 0 and "bit-identical" in unchanged.stdout


def test_at_the_recorded_commit_a_worktree_trains_it_with_that_commits_code(trained, tmp_path):
    run = next(iter(bundles.read(trained / "bundle").runs.values()))
    done = run_cli_in_process("reproduce", run.run_key, "--from", str(trained / "bundle"), "--results-dir", str(tmp_path), "--at-recorded-commit")
    assert f"with the code of {run.provenance['git_sha'][:7]} in a temporary worktree" in done.stdout, done.stdout + done.stderr
    if run.provenance["git_dirty"] == "false":  # a clean checkout (CI): its own commit repeats it bit for bit
        assert done.returncode == 0 and "bit-identical at" in done.stdout
    else:  # trained from uncommitted changes: named, whatever the outcome
        assert "uncommitted changes" in done.stdout
    assert str(tmp_path) not in provenance.git(provenance.repository(), "worktree", "list").stdout  # the worktree is gone


def test_a_run_without_a_known_commit_is_one_line(trained, tmp_path):
    bundle = bundles.read(trained / "bundle")
    key = sorted(bundle.runs)[0]
    unknown = dataclasses.replace(bundle.runs[key], provenance={**bundle.runs[key].provenance, "git_sha": "0123456789abcdef0123"})
    bundles.write(Bundle(bundle.suite, {**bundle.runs, key: unknown}), tmp_path / "bundle")
    done = run_cli_in_process("reproduce", key, "--from", str(tmp_path / "bundle"), "--results-dir", str(tmp_path), "--at-recorded-commit")
    assert done.returncode == 2 and "unknown commit '0123456789abcdef0123'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_expected_differences_name_the_cpu_the_packages_and_a_dirty_tree():
    here = provenance.environment_tags()
    found = reproduce.expected_differences({"cpu_model": "Some Other CPU", "git_dirty": "true"}, {"torch": "0.0.1", "numpy": here["version.numpy"]})
    assert any("Some Other CPU" in line for line in found) and any(line.startswith("torch 0.0.1 recorded") for line in found)
    assert any("uncommitted changes" in line for line in found) and not any(line.startswith("numpy") for line in found)


def test_a_cpu_recorded_by_its_model_name_alone_is_not_taken_for_this_one(monkeypatch):
    monkeypatch.setattr(provenance, "environment_tags", lambda: {"cpu_model": "AMD EPYC (family 25, model 1, AVX2)"})
    (found,) = reproduce.expected_differences({"cpu_model": "AMD EPYC"}, {})
    assert "recorded only the model name 'AMD EPYC'" in found and "family 25, model 1" in found
    assert reproduce.expected_differences({"cpu_model": "AMD EPYC (family 25, model 1, AVX2)"}, {}) == []


def test_the_cpu_model_names_family_model_and_vector_unit_where_proc_cpuinfo_tells(monkeypatch):
    fields = {"model name": "AMD EPYC", "cpu family": "26", "model\t": "2", "flags": "fpu sse2 avx avx2 avx512f"}
    monkeypatch.setattr(provenance, "cpu_info", lambda field: fields.get(field, ""))
    provenance.cpu_model.cache_clear()
    assert provenance.cpu_model() == "AMD EPYC (family 26, model 2, AVX-512)"
    fields = {"model name": "Apple M2", "cpu family": "arm", "model\t": "arm"}
    provenance.cpu_model.cache_clear()
    assert provenance.cpu_model() == "Apple M2"
    provenance.cpu_model.cache_clear()  # this machine's again for the tests after
