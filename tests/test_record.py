"""The MuJoCo record: the committed bundles, the README's block, and ``record`` on synthetic bundles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmark import bundles
from benchmark.analysis import parity_records, record
from benchmark.bundles import Bundle, BundledRun, Evaluation
from benchmark.cli.app import EXIT_CONFIG_ERROR, main
from benchmark.config import load_suite
from benchmark.perf import parity

ROOT = Path(__file__).resolve().parent.parent
BUDGETS = {"mujoco": 1_000_000, "mujoco_300k": 300_000}


@pytest.mark.parametrize("suite_name", record.RECORD_SUITES)
def test_committed_bundles_load_and_every_run_belongs_to_its_suite(suite_name):
    """Each committed bundle of the record reads (checksums and schema), holds only run keys of
    its suite file, at the suite's budget, with a full curve and a final evaluation per run."""
    directory = ROOT / "results" / "published" / suite_name
    if not bundles.is_bundle(directory):
        pytest.skip(f"no bundle of {suite_name} committed yet")
    suite = load_suite(suite_name)
    keys = {spec.run_key: spec for spec in suite.specs}
    runs = bundles.read(directory).runs
    assert runs and set(runs) <= set(keys), sorted(set(runs) - set(keys))
    for key, run in runs.items():
        spec = keys[key]
        assert run.spec.budget.total_steps == BUDGETS[suite_name] == spec.budget.total_steps
        assert run.curve[-1].step >= spec.budget.total_steps and np.isfinite(run.final_return)
        assert len(run.curve) >= spec.budget.total_steps // spec.budget.eval_every
        assert len(run.curve[-1].returns) == spec.budget.eval_episodes


def test_the_readme_shows_the_record_the_committed_bundles_hold(capsys):
    """`record --check` rebuilds the README's block from the bundles and parity records: it must
    be what is committed (run `python -m benchmark record` after exporting a slice)."""
    arguments = ["record", "--check", "--results-dir", str(ROOT / "results"), "--readme", str(ROOT / "README.md"), "--output", str(ROOT / "results" / "record")]
    assert main(arguments) == 0, capsys.readouterr().out


def test_the_committed_record_regenerates_byte_identically(tmp_path):
    """`record` into a scratch directory writes the committed results/record/ byte for byte:
    record.md, every learning-curve figure and every performance profile (the README's block is
    checked by the test above). In a fresh process, as `record` runs: matplotlib's state that
    other tests leave in this one may move a figure's pixels."""
    from conftest import run_cli_subprocess

    done = run_cli_subprocess("record", "--results-dir", str(ROOT / "results"), "--no-readme", "--output", str(tmp_path / "record"))
    assert done.returncode == 0, done.stderr
    committed = sorted(path.name for path in (ROOT / "results" / "record").iterdir())
    assert sorted(path.name for path in (tmp_path / "record").iterdir()) == committed
    for name in committed:
        assert (tmp_path / "record" / name).read_bytes() == (ROOT / "results" / "record" / name).read_bytes(), name


def test_report_renders_mujoco_from_the_committed_bundle_without_training(tmp_path):
    directory = ROOT / "results" / "published" / "mujoco"
    if not bundles.is_bundle(directory):
        pytest.skip("no bundle of mujoco committed yet")
    out = tmp_path / "report"
    assert main(["report", "--suite", "mujoco", "--results-dir", str(tmp_path), "--from", str(directory), "--output", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "Reproduction verdicts" in text and "Hopper-v5" in text
    assert not (tmp_path / "mlflow.db").exists()  # read-only: no store was created


def _synthetic(results: Path, seeds: int = 3, final: float = 2500.0, fingerprints: list[str] | None = None) -> None:
    """A mujoco bundle with PPO on Hopper-v5 (``seeds`` seeds at 1M steps, their fingerprints
    where given) and a PPO parity record."""
    suite = load_suite("mujoco")
    rng = np.random.default_rng(0)
    runs = {}
    for spec in [s for s in suite.specs if s.algo == "ppo" and s.env_id == "Hopper-v5"][:seeds]:
        curve = []
        for step in range(0, spec.budget.total_steps + 1, spec.budget.eval_every):
            returns = tuple(float(x) for x in rng.normal(final * step / spec.budget.total_steps, 100, spec.budget.eval_episodes))
            curve.append(
                Evaluation(
                    step, float(np.mean(returns)), float(np.std(returns)), returns, (1000,) * spec.budget.eval_episodes, float(np.mean(returns)) - 50, 20
                )
            )
        runs[spec.run_key] = BundledRun(
            spec,
            curve[-1].mean,
            curve[-1].std,
            tuple(curve),
            wall_seconds=600.0,
            steps_per_second=1700.0,
            device="cpu",
            provenance={"git_sha": str(spec.seed) * 40},
            versions={"torch": "2.13.0"},
            fingerprint=fingerprints[spec.seed] if fingerprints else "",
        )
    bundles.write(Bundle("mujoco", runs), bundles.published_directory(results, "mujoco"))
    setting = parity._setting_record(parity.SETTINGS["ppo"], "Hopper-v5", 500_000, 10)
    for side, base in (("ours", 2000.0), ("peer", 2100.0)):
        for seed in range(3):
            parity_records.save_run(
                results / "parity" / "ppo-Hopper-v5-500000.json",
                setting,
                {
                    "side": side,
                    "seed": seed,
                    "final_return": base + 10 * seed,
                    "returns": [base],
                    "lengths": [1000],
                    "seconds": 1.0,
                    "version": "stable-baselines3 2.9.2" if side == "peer" else "0.1",
                    "created": "",
                    "machine": {},
                },
            )


def test_record_writes_the_table_figures_and_readme_block_from_bundles(tmp_path, capsys):
    results = tmp_path / "results"
    _synthetic(results)
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nintro\n\n{record.START}\nold text\n{record.END}\n\n## after\n")
    arguments = ["record", "--results-dir", str(results), "--readme", str(readme)]
    assert main(arguments) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\nintro\n\n") and text.endswith(f"{record.END}\n\n## after\n") and "old text" not in text
    # the README: the compact table (the full one is record.md's), a footnote per source, one figure, the link
    row = next(line for line in text.splitlines() if line.startswith("| ppo | Hopper |"))
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    assert cells[2:4] == ["1M", "3"] and " ± " in cells[4] and cells[5].endswith("¹")
    assert cells[6].split(" ", 1)[1].split(",")[0] in {"reproduced", "above", "below", "no seed count decides"} or "seeds" in cells[6]
    assert "\n¹ CleanRL (3 seeds, v4 tasks): mean of the last 100 training episodes; ours scored the same way." in text
    assert "within ±0.2 normalized" in text and "[the full record](results/record/record.md)" in text
    assert "results/record/aggregate_overview.png" in text and (results / "record" / "aggregate_overview.png").stat().st_size > 10_000
    assert (results / "record" / "curves_1M.png").stat().st_size > 10_000 and (results / "record" / "curves_1M.svg").is_file()
    full = (results / "record" / "record.md").read_text()
    row = next(line for line in full.splitlines() if line.startswith("| ppo | Hopper-v5 | 1M |"))
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    assert cells[2:5] == ["1M", "3", "last 100 train episodes"] and "CleanRL" in cells[6]
    assert "±0.2 normalized" in full and "Holm's correction" in full
    parity_row = next(line for line in full.splitlines() if line.startswith("| ppo | Hopper-v5 | 500,000 | 3 |"))
    assert parity_row.endswith("| below, within the margin |")  # -100 [-117, -83]: inside ±658, yet shown
    assert full.count("| ppo | Hopper-v5 | 1M | 3 |") == 1
    assert main([*arguments, "--check"]) == 0
    _synthetic(results, seeds=4)  # a slice exported, the README not regenerated
    before = readme.read_text()
    assert main([*arguments, "--check"]) == 1
    assert "STALE" in capsys.readouterr().out and readme.read_text() == before
    assert main(arguments) == 0 and "| ppo | Hopper | 1M | 4 |" in readme.read_text()


def test_a_cell_whose_runs_behave_differently_is_mixed_code_and_refresh_lists_the_stale_ones(tmp_path, capsys):
    results = tmp_path / "results"
    _synthetic(results, fingerprints=["v1 1.0 2.0", "v1 1.0 2.0005", "v1 1.0 3.0"])  # seeds 0 and 1 match (5e-4 < 1e-3)
    arguments = ["record", "--results-dir", str(results), "--no-readme", "--output", str(tmp_path / "record")]
    assert main(arguments) == 0
    row = next(line for line in (tmp_path / "record" / "record.md").read_text().splitlines() if line.startswith("| ppo | Hopper-v5 | 1M |"))
    assert "**mixed code** (0000000+1111111 / 2222222)" in row
    capsys.readouterr()
    before = (bundles.published_directory(results, "mujoco") / "runs.csv").read_bytes()
    assert main(["record", "--results-dir", str(results), "--refresh-mixed"]) == 0
    out = capsys.readouterr().out
    assert "ppo on Hopper-v5 (mujoco): seeds 0 1 2 were trained at 0000000, 1111111, 2222222 by code that behaves otherwise" in out
    assert "run --suite mujoco --algos ppo --envs Hopper-v5 --seeds 0 1 2 --force" in out and "export --suite mujoco --replace" in out
    assert (bundles.published_directory(results, "mujoco") / "runs.csv").read_bytes() == before  # listed, not trained
    _synthetic(results, fingerprints=["v1 1.0 2.0"] * 3)
    assert main(arguments) == 0
    assert "mixed code" not in (tmp_path / "record" / "record.md").read_text()


def test_record_plan_prices_the_seeds_that_would_decide(tmp_path, capsys):
    results = tmp_path / "results"
    _synthetic(results)
    assert main(["record", "--results-dir", str(results), "--plan", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("ppo,Hopper-v5,"))
    assert "core-hours" in out.splitlines()[0] and ",3," in row
    assert ("decided" in row) or ("inconclusive (needs" in row and "of this configuration" in row)


def test_a_readme_without_markers_is_refused_and_left_alone(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert main(["record", "--results-dir", str(tmp_path / "results"), "--readme", str(readme)]) == EXIT_CONFIG_ERROR
    assert "no record markers" in capsys.readouterr().err and readme.read_text() == "# no markers\n"
    assert main(["record", "--readme", str(tmp_path / "missing.md")]) == EXIT_CONFIG_ERROR


def test_parity_record_files_stay_json(tmp_path):
    """The parity record the record reads back is plain JSON with the setting beside the runs."""
    _synthetic(tmp_path)
    held = json.loads((tmp_path / "parity" / "ppo-Hopper-v5-500000.json").read_text())
    assert held["setting"]["peer"]["n_steps"] == 2048 and len(held["runs"]) == 6


GRID = {
    # (algorithm, task): seeds committed. The record grows to 10 seeds per cell (issue 51) in slices.
    **{("ppo", task): 5 for task in ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid")},
    **{(algo, task): 3 for algo in ("trpo", "a2c", "sac", "td3") for task in ("HalfCheetah", "Hopper", "Walker2d")},
    ("ddpg", "Hopper"): 3,
    ("a2c", "HalfCheetah"): 10,
    ("a2c", "Hopper"): 10,
    ("trpo", "HalfCheetah"): 10,
    ("trpo", "Hopper"): 10,
    ("trpo", "Walker2d"): 10,
}


def test_the_committed_record_holds_the_whole_grid():
    """The record's grid, as committed: PPO on five tasks, TRPO and A2C on three (1M steps); SAC
    and TD3 on three and DDPG on Hopper (300k); N seeds of each cell as in ``GRID``, among the
    suite's seeds 0-9 (batches of seeds finish in any order)."""
    from collections import defaultdict

    seeds: dict = defaultdict(set)
    for suite_name in record.RECORD_SUITES:
        for run in bundles.read(ROOT / "results" / "published" / suite_name).runs.values():
            seeds[run.spec.algo, run.spec.env_id.split("-")[0]].add(run.spec.seed)
    assert {cell: len(found) for cell, found in seeds.items()} == GRID
    assert all(found <= set(range(10)) for found in seeds.values())
