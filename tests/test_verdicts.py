"""Reproduction verdicts at the edges, against hand-computed tests."""

import math

import numpy as np
import pytest
from scipy import stats

from benchmark.analysis import verdicts
from benchmark.analysis.records import RunRecord
from benchmark.analysis.reference import ReferenceScore
from benchmark.analysis.report import group_records
from benchmark.config import Budget, RunSpec


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


def test_clearly_reproduced_with_a_spread_over_seeds_is_welch():
    ours = np.array([3000.0, 3100.0, 2900.0, 3050.0, 2950.0])
    source = published(3020.0, 150.0, 5)
    verdict = verdicts.judge(ours, 1_000_000, "Hopper-v5", source, algo="sac")
    expected = stats.ttest_ind_from_stats(3000.0, np.std(ours, ddof=1), 5, 3020.0, 150.0, 5, equal_var=False).pvalue
    assert verdict.verdict == "reproduced"
    assert f"p = {expected:.2g}" in verdict.test and "Welch" in verdict.test


def test_clearly_below_and_above():
    ours = np.array([1000.0, 1100.0, 900.0])
    assert verdicts.judge(ours, 1_000_000, "Hopper-v5", published(3000.0, 200.0, 10), algo="sac").verdict == "below"
    assert verdicts.judge(ours, 1_000_000, "Hopper-v5", published(500.0, 50.0, 10), algo="sac").verdict == "above"


def test_a_population_std_is_turned_into_a_sample_std():
    """'ddof=0' spreads are scaled by sqrt(n/(n-1)) before Welch's test."""
    ours = np.array([10.0, 12.0, 14.0])
    source = published(13.0, 1.0, 4, spread_kind="std across seeds (numpy, ddof=0)")
    verdict = verdicts.judge(ours, 1_000_000, "Hopper-v5", source, algo="sac")
    expected = stats.ttest_ind_from_stats(12.0, 2.0, 3, 13.0, math.sqrt(4 / 3), 4, equal_var=False).pvalue
    assert f"p = {expected:.2g}" in verdict.test


def test_a_one_agent_source_uses_the_prediction_interval_of_one_run():
    """ours 10, 12, 14: mean 12, s = 2; t(0.975, 2) = 4.303; half width 4.303 * 2 * sqrt(1/3 + 1) = 9.937."""
    ours = np.array([10.0, 12.0, 14.0])
    one_agent = dict(n_seeds=1, spread=5.0, spread_kind="std over evaluation episodes (one agent)")
    inside = verdicts.judge(ours, 1_000_000, "Hopper-v5", published(21.9, **one_agent), algo="sac")
    outside = verdicts.judge(ours, 1_000_000, "Hopper-v5", published(22.0, **one_agent), algo="sac")
    assert inside.verdict == "reproduced" and "[2.1, 21.9]" in inside.test and "one run" in inside.test
    assert outside.verdict == "below"
    low = verdicts.judge(ours, 1_000_000, "Hopper-v5", published(2.0, **one_agent), algo="sac")
    assert low.verdict == "above"


def test_a_mean_of_k_seeds_without_a_spread_uses_the_interval_of_a_mean_of_k():
    ours = np.array([10.0, 12.0, 14.0])
    half = stats.t.ppf(0.975, 2) * 2.0 * math.sqrt(1 / 3 + 1 / 10)
    verdict = verdicts.judge(ours, 1_000_000, "Hopper-v5", published(12 + half - 0.01, n_seeds=10, spread_kind=""), algo="sac")
    assert verdict.verdict == "reproduced" and "the mean of 10 runs" in verdict.test
    assert verdicts.judge(ours, 1_000_000, "Hopper-v5", published(12 + half + 0.01, n_seeds=10), algo="sac").verdict == "below"


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
    verdict = verdicts.judge(np.array([1.0, 2.0, 3.0]), budget, env_id, source, algo="sac")
    assert verdict.verdict == "not comparable" and reason in verdict.reason


def test_a_version_with_the_same_reward_is_compared_with_a_note():
    verdict = verdicts.judge(np.array([3000.0, 3100.0, 2900.0]), 1_000_000, "Hopper-v5", published(3000.0, 100.0, 5, env_id="Hopper-v3"), algo="sac")
    assert verdict.verdict == "reproduced" and "source ran Hopper-v3" in verdict.reason


def test_one_seed_and_no_source():
    assert verdicts.judge(np.array([1.0]), 1_000_000, "Hopper-v5", published(1.0, 1.0, 5), algo="sac").verdict == "not comparable"
    missing = verdicts.judge(np.array([1.0, 2.0]), 1_000_000, "Hopper-v5", None, algo="sac")
    assert missing.verdict == "no published score"


def test_zero_spread_on_both_sides():
    assert (
        verdicts.judge(
            np.array([500.0, 500.0, 500.0]), 100_000, "CartPole-v1", published(500.0, 0.0, 5, env_id="CartPole-v1", budget=100_000), algo="ppo"
        ).verdict
        == "reproduced"
    )
    assert (
        verdicts.judge(
            np.array([490.0, 490.0, 490.0]), 100_000, "CartPole-v1", published(500.0, 0.0, 5, env_id="CartPole-v1", budget=100_000), algo="ppo"
        ).verdict
        == "below"
    )


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


def test_a_training_return_source_is_compared_with_our_training_returns():
    spec = RunSpec("s", "sac", "Hopper-v5", 0, {}, Budget(1_000_000, 10_000))
    records = []
    for seed, (final, train) in enumerate([(3500.0, 2500.0), (3600.0, 2400.0), (3400.0, 2600.0)]):
        records.append(RunRecord(RunSpec("s", "sac", "Hopper-v5", seed, {}, spec.budget), "FINISHED", f"r{seed}", final, final_train_return=train))
    source = published(2500.0, 100.0, 5, protocol="training_return")
    [verdict] = verdicts.suite_verdicts(group_records(records), (source,))
    assert verdict.verdict == "reproduced" and verdict.ours.mean == 2500.0 and "training episodes" in verdict.reason
    for record in records:
        record.final_train_return = None
    [fallback] = verdicts.suite_verdicts(group_records(records), (source,))
    assert fallback.ours.mean == 3500.0 and fallback.verdict == "above" and "no training returns recorded" in fallback.reason
