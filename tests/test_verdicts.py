"""Reproduction verdicts against published scores: the source chosen, each side scored as the
source measured, the table decided by the verdict rule (tests/test_verdict_rule.py tests the rule)."""

import math

import numpy as np
import pytest
from scipy import stats

from benchmark.analysis import scores, verdicts
from benchmark.analysis.records import RunRecord
from benchmark.analysis.reference import ReferenceScore
from benchmark.config import Budget, RunSpec

HOPPER_SCALE = 3304.75 - 16.6688  # Hopper-v5's fixed normalizer: TD3 paper's 1M score - random


def published(
    mean, spread=None, n_seeds=None, spread_kind="std across seeds", budget=1_000_000, env_id="Hopper-v5", protocol="final_eval", algo="sac", approximate=False
):
    family, version = env_id.rsplit("-", 1)
    return ReferenceScore(
        "A paper",
        "https://example.org",
        algo.upper(),
        env_id,
        budget,
        "final evaluation",
        mean,
        spread,
        n_seeds,
        family,
        version,
        algo,
        protocol,
        approximate,
        spread_kind,
    )


def records_of(finals, budget=1_000_000, env_id="Hopper-v5", algo="sac", trains=None, curves=None):
    found = []
    for seed, final in enumerate(finals):
        record = RunRecord(RunSpec("s", algo, env_id, seed, {}, Budget(budget, budget // 10)), "FINISHED", f"r{seed}", float(final))
        if trains is not None:
            record.train_last100 = None if trains[seed] is None else (float(trains[seed]), 100)
        if curves is not None:
            record.curve = curves[seed]
        found.append(record)
    return found


def judge(finals, budget, env_id, source, algo="sac", margin=0.2, **options):
    [verdict] = verdicts.judge_cases(
        [verdicts.Case(algo, algo, env_id, budget, tuple(records_of(finals, budget, env_id, algo, **options)))],
        (source,) if source else (),
        margin,
        per_seed={},
    )
    return verdict


def test_a_close_score_with_a_spread_over_seeds_is_reproduced_by_welchs_interval():
    ours = np.array([3000.0, 3100.0, 2900.0, 3050.0, 2950.0])
    verdict = judge(ours, 1_000_000, "Hopper-v5", published(3020.0, 150.0, 5))
    found = stats.ttest_ind_from_stats(3000.0, np.std(ours, ddof=1), 5, 3020.0, 150.0, 5, equal_var=False)
    assert verdict.verdict == "reproduced" and verdict.score == scores.FINAL
    assert f"p = {found.pvalue:.2g}" in verdict.test and "Welch" in verdict.test
    assert "margin ±0.2 normalized (±658)" in verdict.test and verdict.margin.absolute == pytest.approx(0.2 * HOPPER_SCALE)


def test_clearly_below_and_above():
    ours = np.array([1000.0, 1100.0, 900.0])
    assert judge(ours, 1_000_000, "Hopper-v5", published(3000.0, 200.0, 10)).text == "below, beyond the margin"
    assert judge(ours, 1_000_000, "Hopper-v5", published(500.0, 50.0, 10)).verdict == "above"


def test_not_rejected_is_no_longer_reproduced():
    """The old rule called this 'reproduced' (Welch p = 0.59): its interval is far wider than the margin."""
    verdict = judge([500.0, 3500.0, 1800.0], 1_000_000, "Hopper-v5", published(2400.0, 600.0, 10))
    assert verdict.verdict == "inconclusive" and verdict.text.startswith("inconclusive (")


def test_a_population_std_is_turned_into_a_sample_std():
    """'ddof=0' spreads are scaled by sqrt(n/(n-1)) before Welch's test."""
    source = published(13.0, 1.0, 4, spread_kind="std across seeds (numpy, ddof=0)")
    verdict = judge([10.0, 12.0, 14.0], 1_000_000, "Hopper-v5", source)
    expected = stats.ttest_ind_from_stats(12.0, 2.0, 3, 13.0, math.sqrt(4 / 3), 4, equal_var=False).pvalue
    assert f"p = {expected:.2g}" in verdict.test


def test_a_one_agent_source_is_never_reproduced():
    one_agent = dict(n_seeds=1, spread=5.0, spread_kind="std over evaluation episodes (one agent)")
    close = judge([3000.0, 3010.0, 2990.0, 3005.0], 1_000_000, "Hopper-v5", published(3001.0, **one_agent))
    assert close.verdict == "consistent with one agent" and "prediction interval of one run" in close.test
    far = judge([1000.0, 1010.0, 990.0, 1005.0], 1_000_000, "Hopper-v5", published(3000.0, **one_agent))
    assert far.verdict == "outside one agent's interval"


def test_a_mean_of_k_seeds_without_a_spread_uses_the_interval_of_a_mean_of_k():
    verdict = judge([10.0, 12.0, 14.0], 1_000_000, "Hopper-v5", published(12.5, n_seeds=10, spread_kind=""))
    assert verdict.verdict == "reproduced" and "a mean of 10 runs" in verdict.test


@pytest.mark.parametrize(
    "source,budget,env_id,reason",
    [
        (published(3000.0, 100.0, 5, budget=1_000_000), 300_000, "Hopper-v5", "budget: 300,000 steps here, 1,000,000 in the source"),
        (published(3000.0, 100.0, 5, budget=None), 1_000_000, "Hopper-v5", "the source does not state it"),
        (published(3000.0, 100.0, 5, protocol="max_eval"), 1_000_000, "Hopper-v5", "maximum over training"),
        (published(3000.0, 100.0, 5, env_id="Ant-v3"), 1_000_000, "Ant-v5", "env version: Ant-v5 here, Ant-v3"),
        (published(500.0, 0.0, 5, env_id="CartPole-v0"), 1_000_000, "CartPole-v1", "env version"),
    ],
)
def test_not_comparable_says_why(source, budget, env_id, reason):
    verdict = judge([1.0, 2.0, 3.0], budget, env_id, source)
    assert verdict.verdict == "not comparable" and reason in verdict.reason and verdict.decision.evidence is None


def test_a_version_with_the_same_reward_is_compared_with_a_note():
    verdict = judge([3000.0, 3100.0, 2900.0], 1_000_000, "Hopper-v5", published(3000.0, 100.0, 5, env_id="Hopper-v3"))
    assert verdict.verdict == "reproduced" and "source ran Hopper-v3" in verdict.reason


def test_one_seed_and_no_source():
    assert judge([1.0], 1_000_000, "Hopper-v5", published(1.0, 1.0, 5)).verdict == "not comparable"
    assert judge([1.0, 2.0], 1_000_000, "Hopper-v5", None).verdict == "no published score"


def test_zero_spread_on_both_sides():
    source = published(500.0, 0.0, 5, env_id="CartPole-v1", budget=100_000, algo="ppo")
    assert judge([500.0, 500.0, 500.0], 100_000, "CartPole-v1", source, algo="ppo").verdict == "reproduced"
    assert judge([300.0, 300.0, 300.0], 100_000, "CartPole-v1", source, algo="ppo").verdict == "below"


def test_the_table_is_corrected_by_holm_over_its_rows():
    """p = 0.035 alone is above; beside two rows the family's first level is 0.05 / 3."""
    tight = verdicts.Case("sac", "sac", "Hopper-v5", 1_000_000, tuple(records_of([100.0, 110.0, 120.0, 105.0, 115.0])))
    others = [verdicts.Case("sac", "sac", env, 1_000_000, tuple(records_of([2500.0, 2600.0, 2700.0], env_id=env))) for env in ("Walker2d-v5", "HalfCheetah-v5")]
    source = published(99.0, 8.0, 10)
    table = (source, published(2600.0, 100.0, 10, env_id="Walker2d-v3"), published(2600.0, 100.0, 10, env_id="HalfCheetah-v3"))
    [alone] = verdicts.judge_cases([tight], table, margin=0.001, per_seed={})
    together = verdicts.judge_cases([tight, *others], table, margin=0.001, per_seed={})
    assert alone.verdict == "above" and together[0].verdict == "inconclusive" and "Holm-adjusted 0.1 over 3 rows" in together[0].test


def test_the_published_score_chosen_is_comparable_then_like_protocol_then_closest_budget():
    scores = (
        published(9000.0, 10.0, 10, protocol="max_eval"),
        published(2500.0, 10.0, 10, protocol="training_return", budget=1_000_000),
        published(2800.0, 10.0, 10, protocol="final_eval", budget=3_000_000),
        published(2900.0, 10.0, 10, protocol="final_eval", budget=1_000_000, env_id="Hopper-v3"),
        published(2700.0, 10.0, 10, protocol="final_eval", budget=1_200_000),
        published(2000.0, 10.0, 10, protocol="final_eval", budget=1_000_000, algo="td3"),
    )
    chosen = verdicts.choose_published("sac", "Hopper-v5", 1_000_000, scores)
    assert chosen.mean == 2900.0  # final_eval at the same budget (another version of Hopper: same reward)
    assert verdicts.choose_published("sac", "Hopper-v5", 1_000_000, scores[:3]).mean == 2500.0  # 3M is not comparable
    assert verdicts.choose_published("ppo", "Hopper-v5", 1_000_000, scores) is None


def test_several_seeds_of_training_returns_come_before_one_trained_agent():
    """RL Zoo's one agent per task (tuned per task) against CleanRL's 3 seeds of training returns
    at the published defaults: the multi-seed source is chosen, as for the normalization reference."""
    zoo = published(5819.1, 663.5, 1, spread_kind="std over evaluation episodes (one agent)", env_id="HalfCheetah-v3", algo="ppo")
    cleanrl = published(1442.6, 46.0, 3, spread_kind="std across seeds (np.std, ddof=0)", env_id="HalfCheetah-v4", algo="ppo", protocol="training_return")
    assert verdicts.choose_published("ppo", "HalfCheetah-v5", 1_000_000, (zoo, cleanrl)) is cleanrl
    assert verdicts.choose_published("ppo", "HalfCheetah-v5", 1_000_000, (zoo,)) is zoo
    three_seed_eval = published(1500.0, 50.0, 3, env_id="HalfCheetah-v4", algo="ppo")
    assert verdicts.choose_published("ppo", "HalfCheetah-v5", 1_000_000, (zoo, cleanrl, three_seed_eval)) is three_seed_eval


def test_a_training_return_source_is_compared_with_our_last_hundred_training_episodes():
    source = published(2500.0, 100.0, 5, protocol="training_return")
    verdict = judge([3500.0, 3600.0, 3400.0], 1_000_000, "Hopper-v5", source, trains=[2500.0, 2400.0, 2600.0])
    assert verdict.verdict == "reproduced" and verdict.ours.mean == 2500.0 and verdict.score == scores.TRAIN100
    fallback = judge([3500.0, 3600.0, 3400.0], 1_000_000, "Hopper-v5", source, trains=[None, None, None])
    assert fallback.ours.mean == 3500.0 and fallback.score == scores.FINAL and "no training returns recorded" in fallback.reason


def test_whole_intervals_approximate_the_last_hundred_training_episodes_of_old_runs():
    record = records_of([1.0])[0]
    record.train_intervals = [(10, 100.0, 60), (20, 200.0, 30), (30, 400.0, 50), (40, 500.0, 40)]
    window = verdicts.train_window(record)
    assert (window.mean, window.episodes, window.exact) == ((400.0 * 50 + 500.0 * 40 + 200.0 * 30) / 120, 120, False)
    record.train_intervals = [(30, 400.0, 50), (40, 500.0, 50)]
    assert verdicts.train_window(record).exact  # exactly the last 100: contiguous intervals
    record.train_last100 = (321.0, 100)
    assert verdicts.train_window(record) == scores.TrainWindow(321.0, 100, True)


def test_a_source_with_per_seed_curves_is_judged_on_the_last_tenth_of_both_curves():
    """Ours and the source's seeds: the mean of the evaluations above 0.9 x the budget (270k of 300k)."""
    source = published(3000.0, 100.0, 3, budget=300_000, env_id="Hopper-v3")
    per_seed = {(source.source, source.algo, source.env_id, 300_000): {s: [(265_000, 0.0), (280_000, 2900.0 + s), (300_000, 3100.0 + s)] for s in range(3)}}
    curves = [[(270_000, -1e6), (285_000, 3000.0 + 10 * s), (300_000, 3000.0 - 10 * s)] for s in range(3)]
    case = verdicts.Case("sac", "sac", "Hopper-v5", 300_000, tuple(records_of([3000.0, 3000.0, 3000.0], 300_000, curves=curves)))
    [verdict] = verdicts.judge_cases([case], (source,), per_seed=per_seed)
    assert verdict.score == scores.LATE and verdict.ours.mean == 3000.0
    assert verdict.reference_sample.values == (3000.0, 3001.0, 3002.0) and verdict.verdict == "reproduced"


def test_collapse_is_counted_where_the_cell_succeeds():
    assert verdicts.collapsed(np.array([0.9, 0.1, 0.95, 0.8])) == (1, 4)
    assert verdicts.collapsed(np.array([0.1, 0.2, 0.3])) is None  # the cell's median is 0.2: collapse is not defined


def test_verdicts_through_the_cli_state_the_margin_and_plan_the_seeds(tmp_path):
    """The committed classic bundle: every comparable source is one RL Zoo agent, so nothing is
    reproduced and nothing can be planned for; a margin that is not a number is one line."""
    from conftest import ROOT, run_cli_in_process

    bundle = ["--from", str(ROOT / "results" / "published" / "classic")]
    done = run_cli_in_process("verdicts", "--suite", "classic", "--results-dir", str(tmp_path), *bundle, "--format", "csv", "--margin", "0.1")
    assert done.returncode == 0, done.stderr
    assert "consistent with one agent" in done.stdout and ",reproduced," not in done.stdout and "±0.1 normalized" in done.stdout
    planned = run_cli_in_process("verdicts", "--suite", "classic", "--results-dir", str(tmp_path), *bundle, "--plan", "--format", "csv")
    assert planned.returncode == 0 and "one trained agent: no seed count shows equivalence" in planned.stdout
    refused = run_cli_in_process("verdicts", "--suite", "classic", "--results-dir", str(tmp_path), *bundle, "--margin", "wide")
    assert refused.returncode == 2 and "--margin: expected a positive number" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
