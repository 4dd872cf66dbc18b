"""Reference scores: the built table keeps every source column; the choice of reference; random scores."""

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agents.api import ConfigError
from benchmark.analysis import reference

ROOT = Path(__file__).resolve().parent.parent
SCORES = ROOT / "results" / "reference" / "scores.csv"


def test_built_table_keeps_every_published_row_and_source_column():
    with SCORES.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    with reference.ADDED_SCORES.open(newline="") as handle:
        added = list(csv.DictReader(handle))
    assert len(rows) == 496 + len(added) and len(added) == 7
    assert list(rows[0])[: len(reference.SOURCE_COLUMNS)] == list(reference.SOURCE_COLUMNS)
    assert set(reference.DERIVED_COLUMNS) <= set(rows[0])
    assert all(row["source"] and row["source_url"].startswith("http") for row in rows)
    assert [{k: r[k] for k in reference.SOURCE_COLUMNS} for r in rows[496:]] == added  # our additions come last
    # Tianshou's curves at 300k: deterministic test episodes, read exactly (not off a plot)
    tasks = ("HalfCheetah", "Hopper", "Walker2d")
    expected = {("sac", env) for env in tasks} | {("td3", env) for env in tasks} | {("ddpg", "Hopper")}
    assert {(r["algorithm"], r["env"], r["budget_steps"], r["protocol"], r["approximate"]) for r in rows[496:]} == {
        (algo, env, "300000", "final_eval", "false") for algo, env in expected
    }
    if reference.SHARED_SCORES.exists():  # the committed table is what `reference build` makes today
        with reference.SHARED_SCORES.open(newline="") as handle:
            shared = list(csv.DictReader(handle))
        assert [{k: r[k] for k in reference.SOURCE_COLUMNS} for r in rows[:496]] == shared


def test_build_adds_derived_columns(tmp_path):
    source = tmp_path / "in.csv"
    with source.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=reference.SOURCE_COLUMNS)
        writer.writeheader()
        writer.writerow(
            {
                **dict.fromkeys(reference.SOURCE_COLUMNS, ""),
                "source": "S",
                "algo": "PPO (cleanrl ppo.py)",
                "env_id": "HalfCheetah-v4",
                "metric": "mean of last 100 training episodic returns",
                "mean": "1442.6",
            }
        )
    assert reference.build(source, tmp_path / "out.csv", additions=None) == 1
    (row,) = csv.DictReader((tmp_path / "out.csv").open())
    assert (row["env"], row["env_version"], row["algorithm"], row["protocol"], row["approximate"]) == ("HalfCheetah", "v4", "ppo", "training_return", "false")


@pytest.mark.parametrize(
    "env_id,family",
    [
        ("HalfCheetah-v5", "HalfCheetah"),
        ("CartPole-v1", "CartPole"),
        ("Walker2d (gym -v2 class, D4RL walker2d-*)", "Walker2d"),
        ("reprorl/CartPoleNoVel-v1", "reprorl/CartPoleNoVel"),
    ],
)
def test_env_family(env_id, family):
    assert reference.env_family(env_id) == family


@pytest.mark.parametrize(
    "algo,metric,expected",
    [
        ("SAC", "mean_eval_episode_return (single trained agent; deterministic policy)", "final_eval"),
        ("TD3", "average return over the last 10 evaluations over 10 trials, 1M steps", "final_eval"),
        ("TD3", "max average return over 10 trials, 1M steps", "max_eval"),
        ("PPO (PPO paper)", "approx. value read off published plots by Tianshou authors", "approx_plot"),
        ("DQN (cleanrl dqn.py)", "average episodic return (training episodes)", "training_return"),
        ("random policy", "mean episode return of uniform-random actions", "random"),
    ],
)
def test_protocol_classification(algo, metric, expected):
    assert reference.protocol_of(metric, reference.algorithm_of(algo)) == expected


def _score(algo, mean, protocol, approximate=False, env="Hopper", seeds=None):
    return reference.ReferenceScore(
        "src", "http://x", algo, f"{env}-v3", None, "m", mean, None, seeds, env, "v3", reference.algorithm_of(algo), protocol, approximate
    )


def test_reference_prefers_the_most_comparable_kind_then_the_best_score():
    table = (
        _score("TD3", 3600.0, "max_eval", seeds=10),
        _score("PPO", 2400.0, "final_eval", seeds=1),
        _score("SAC", 2300.0, "final_eval", seeds=1),
        _score("PPO", 9000.0, "final_eval", env="HalfCheetah", seeds=1),
    )
    assert reference.env_reference("Hopper-v5", table).mean == 2400.0  # a final evaluation beats a higher max over training
    assert reference.published_score("sac", "Hopper-v5", table).mean == 2300.0
    assert reference.published_score("td3", "Hopper-v5", table).protocol == "max_eval"
    assert reference.published_score("dqn", "Hopper-v5", table) is None
    multi_seed = table + (_score("SAC", 2000.0, "training_return", seeds=3),)
    assert reference.env_reference("Hopper-v5", multi_seed).mean == 2000.0  # 3 seeds beat one agent's higher score
    multi_final = multi_seed + (_score("TD3", 1900.0, "final_eval", seeds=10),)
    assert reference.env_reference("Hopper-v5", multi_final).mean == 1900.0
    exact_first = (_score("TD3", 3700.0, "max_eval", approximate=True), _score("TD3", 3500.0, "max_eval"))
    assert reference.env_reference("Hopper-v5", exact_first).mean == 3500.0


def test_build_appends_our_additions_and_refuses_one_without_its_source(tmp_path):
    source, additions, destination = tmp_path / "shared.csv", tmp_path / "additions.csv", tmp_path / "scores.csv"
    row = {**dict.fromkeys(reference.SOURCE_COLUMNS, ""), "source": "S", "source_url": "https://x", "algo": "TD3", "env_id": "Hopper-v3", "mean": "1.0"}
    for path, rows in ((source, [row]), (additions, [{**row, "metric": "deterministic policy at 300k", "mean": "2.0"}])):
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=reference.SOURCE_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    assert reference.build(source, destination, additions) == 2
    written = list(csv.DictReader(destination.open()))
    assert [(r["mean"], r["protocol"]) for r in written] == [("1.0", "training_return"), ("2.0", "final_eval")]
    assert reference.build(source, tmp_path / "alone.csv", tmp_path / "absent.csv") == 1  # no additions file: the shared table alone
    text = additions.read_text().splitlines()
    additions.write_text("\n".join([text[0], text[1].replace("https://x", "")]) + "\n")
    with pytest.raises(ConfigError, match="additions.csv:2: every added score names its source and its address"):
        reference.build(source, destination, additions)
    assert [r["mean"] for r in csv.DictReader(destination.open())] == ["1.0", "2.0"]  # the table built before is untouched


def test_a_malformed_source_leaves_the_table_untouched(tmp_path):
    destination = tmp_path / "scores.csv"
    destination.write_text("kept\n")
    short_row = tmp_path / "short.csv"
    short_row.write_text(",".join(reference.SOURCE_COLUMNS) + "\nS,http://x,PPO,CartPole-v1\n")
    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(reference.SOURCE_COLUMNS) + "\n")
    for source, message in ((short_row, "short.csv:2: expected 11 fields"), (empty, "no rows")):
        with pytest.raises(ConfigError, match=message):
            reference.build(source, destination)
    assert destination.read_text() == "kept\n"


def test_normalized_score_is_zero_at_random_and_one_at_the_reference():
    norm = reference.Normalizer("Hopper-v5", reference.RandomScore("Hopper-v5", 10, 20.0, 5.0, 0), _score("PPO", 2420.0, "final_eval"))
    np.testing.assert_allclose(norm(np.array([20.0, 2420.0, 1220.0])), [0.0, 1.0, 0.5])
    missing = reference.Normalizer("X-v0", None, None)
    assert not missing.available and "no published reference" in missing.missing and "reference random --env X-v0" in missing.missing
    with pytest.raises(ValueError, match="no normalization for X-v0"):
        missing(1.0)


def test_every_suite_environment_has_a_measured_random_score():
    from benchmark.config import available_suites, load_suite

    random = reference.load_random()
    env_ids = {spec.env_id for name in available_suites() for spec in load_suite(name).specs}
    assert env_ids <= set(random), sorted(env_ids - set(random))
    assert -300 < random["HalfCheetah-v5"].mean < -250  # JAT measured -285 on v4 the same way


def test_random_policy_measurement_is_seeded_and_upserts(tmp_path):
    first = reference.measure_random("CartPole-v1", episodes=5, seed=3)
    assert first == reference.measure_random("CartPole-v1", episodes=5, seed=3)
    assert 8 < first.mean < 60  # a random CartPole policy balances for ~22 steps
    path = tmp_path / "random.csv"
    reference.save_random(first, path)
    reference.save_random(reference.measure_random("Acrobot-v1", episodes=1, seed=0), path)
    reference.save_random(reference.RandomScore("CartPole-v1", 5, 99.0, 1.0, 3), path)
    loaded = reference.load_random(path)
    assert list(loaded) == ["Acrobot-v1", "CartPole-v1"] and loaded["CartPole-v1"].mean == 99.0


def test_reference_random_cli_rejects_an_unknown_env_before_measuring():
    completed = subprocess.run(
        [sys.executable, "-m", "benchmark", "reference", "random", "--env", "CartPole-v1", "Nope-v9", "--episodes", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 2 and "unknown environment 'Nope-v9'" in completed.stderr
    assert completed.stdout == ""


def test_reference_show_lists_the_normalization_of_each_env():
    completed = subprocess.run(
        [sys.executable, "-m", "benchmark", "reference", "show", "--env", "CartPole-v1", "reprorl/CartPoleNoVel-v1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    assert "CleanRL" in completed.stdout and "no published score" in completed.stdout


def test_a_damaged_reference_table_is_named(tmp_path):
    garbage = tmp_path / "random.csv"
    garbage.write_bytes(b"\xfc\x00\x9a" * 50)
    with pytest.raises(ConfigError, match=r"cannot read .*random.csv as a CSV table"):
        reference.load_random(garbage)
    garbage.write_text("env_id,mean\nCartPole-v1,abc\n")
    with pytest.raises(ConfigError, match=r"random.csv, row 2: no column 'episodes'"):
        reference.load_random(garbage)
    scores = tmp_path / "scores.csv"
    scores.write_text("source,mean\nx,1.0\n")
    with pytest.raises(ConfigError, match=r"scores.csv, row 2: no column 'budget_steps'"):
        reference.load_scores(scores)


FIXED_NORMALIZERS = {
    # task: (random, reference) — chosen once (normalizers.csv); a published score added later must not move them
    "Acrobot-v1": (-497.08, -86.36),
    "Ant-v5": (-48.0484, 4950.47),
    "CartPole-v1": (23.68, 499.84),
    "HalfCheetah-v5": (-282.4868, 9532.99),
    "Hopper-v5": (16.6688, 3304.75),
    "Humanoid-v5": (112.5989, 5035.36),
    "InvertedPendulum-v5": (5.23, 988.94),
    "Pendulum-v1": (-1207.5552, -151.08),
    "Walker2d-v5": (1.77, 4565.24),
}


def test_every_task_has_its_pinned_fixed_normalizer():
    """The normalizer of every task is the one chosen once: Hopper's stays the TD3 paper's 1M score
    (3,304.75), not the 300k Tianshou value (3,387.66) added to the published table later."""
    from benchmark.analysis import normalizers

    fixed = normalizers.load()
    assert {env: (row.random, row.reference.mean) for env, row in fixed.items()} == FIXED_NORMALIZERS
    for env_id, (random, reference_score) in FIXED_NORMALIZERS.items():
        norm = normalizers.normalizer(env_id)
        assert not norm.provisional and norm(np.array([random, reference_score])) == pytest.approx([0.0, 1.0])
    assert reference.env_reference("Hopper-v5").mean != 3304.75  # the rule alone would now choose another


def test_adding_scores_never_moves_a_fixed_normalizer(tmp_path):
    from benchmark.analysis import normalizers

    for name in ("scores.csv", "random.csv", "normalizers.csv"):
        (tmp_path / name).write_bytes((reference.REFERENCE_DIR / name).read_bytes())
    before = (tmp_path / "normalizers.csv").read_text()
    with (tmp_path / "scores.csv").open("a") as handle:
        row = "New,https://x.org,TD3,Hopper-v5,1000000,mean of the final deterministic evaluation,9999.0,1.0,std across seeds,10,"
        handle.write(row + ",Hopper,v5,td3,final_eval,false\n")
    assert normalizers.fix_missing(tmp_path) == [] and (tmp_path / "normalizers.csv").read_text() == before
    assert normalizers.normalizer("Hopper-v5", tmp_path).reference.mean == 3304.75
    with (tmp_path / "random.csv").open("a") as handle:
        handle.write("Swimmer-v5,100,1.0,2.0,0,1.4.0,4.0.0,2026-11-28\n")
    with (tmp_path / "scores.csv").open("a") as handle:
        handle.write(
            "S,https://x.org,TD3,Swimmer-v3,1000000,mean of the final deterministic evaluation,100.0,1.0,std across seeds,10,,Swimmer,v3,td3,final_eval,false\n"
        )
    assert normalizers.normalizer("Swimmer-v5", tmp_path).provisional
    assert normalizers.fix_missing(tmp_path, today="2026-11-28") == ["Swimmer-v5"]
    assert normalizers.normalizer("Swimmer-v5", tmp_path).reference.mean == 100.0 and not normalizers.normalizer("Swimmer-v5", tmp_path).provisional
    assert (tmp_path / "normalizers.csv").read_text().startswith(before.splitlines()[0])


def test_the_per_seed_values_agree_with_the_published_rows_they_stand_behind():
    """Tianshou's 10 seeds at 300k (per_seed.csv) average to the published mean of the same row
    (additions.csv, read off the same file's column rew) and spread as its std (ddof 1)."""
    per_seed = reference.load_per_seed()
    rows = [score for score in reference.load_scores() if reference.per_seed_of(score, per_seed)]
    assert len(rows) == 7 and {score.algorithm for score in rows} == {"sac", "td3", "ddpg"}
    for score in rows:
        values = [dict(curve)[300_000] for curve in reference.per_seed_of(score, per_seed).values()]
        assert len(values) == score.n_seeds == 10
        assert np.mean(values) == pytest.approx(score.mean, abs=1e-3) and np.std(values, ddof=1) == pytest.approx(score.spread, abs=1e-3)


def test_the_published_whole_curves_agree_with_the_per_seed_values():
    """curves.csv (Tianshou's 10-seed curves, mean and ddof=0 std per step up to 300k, transcribed from
    the same files as per_seed.csv): at every step per_seed.csv holds, the curve's mean is the mean of
    those seeds' returns and its std their spread; every curve runs in 5k steps to the budget."""
    import csv
    from collections import defaultdict

    from benchmark.analysis import curve_grid

    curves = curve_grid.published_curves()
    per_seed: dict[tuple[str, int], list[float]] = defaultdict(list)
    with (reference.REFERENCE_DIR / "per_seed.csv").open(newline="") as file:
        for row in csv.DictReader(file):
            per_seed[row["source_url"], int(row["env_step"])].append(float(row["return"]))
    assert set(curves) == {url for url, _ in per_seed} and len(curves) == 7
    with (reference.REFERENCE_DIR / "curves.csv").open(newline="") as file:
        stds = {(row["source_url"], int(row["env_step"])): float(row["std"]) for row in csv.DictReader(file)}
    for (url, step), values in per_seed.items():
        at, mean = curves[url]
        assert len(values) == 10 and mean[list(at).index(step)] == pytest.approx(np.mean(values), abs=1e-4)
        assert stds[url, step] == pytest.approx(np.std(values), abs=1e-4)
    for at, _ in curves.values():
        assert at[-1] == 300_000 and set(np.diff(at)) == {5_000}
