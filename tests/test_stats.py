"""Interval estimates of benchmark/stats.py: hand-computed aggregates, bootstrap behaviour, Welch and Holm."""

import math
import warnings

import numpy as np
import pytest
from scipy import stats as scipy_stats

from benchmark.analysis import stats
from benchmark.analysis.stats import (
    AGGREGATES,
    Interval,
    aggregate_intervals,
    aggregate_iqm,
    aggregate_mean,
    aggregate_median,
    holm,
    iqm,
    iqm_interval,
    mean_interval,
    optimality_gap,
    performance_profile,
    probability_of_improvement,
    probability_of_improvement_interval,
    stratified_bootstrap,
    welch_less,
)

# ---------------------------------------------------------------- point estimates by hand


def test_iqm_cuts_a_quarter_from_each_end():
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    # 10 values: int(2.5) = 2 cut from each end, leaving 1..6 -> 3.5 (the 100s are gone).
    assert iqm([100, 0, 6, 1, 5, 100, 2, 4, 3, 0]) == pytest.approx(3.5)
    assert iqm([7.0]) == 7.0
    assert iqm([1, 2, 9]) == pytest.approx(4.0)  # 3 values: int(0.75) = 0 cut


@pytest.mark.parametrize("count", range(1, 14))
def test_iqm_matches_scipy_trim_mean(count):
    values = np.random.default_rng(count).normal(size=count)
    assert iqm(values) == pytest.approx(scipy_stats.trim_mean(values, 0.25), rel=1e-12)


def test_mean_and_median_over_task_means():
    two = {"a": [1.0, 3.0], "b": [10.0]}  # task means 2, 10
    assert aggregate_mean(two) == pytest.approx(6.0)
    assert aggregate_median(two) == pytest.approx(6.0)
    three = {**two, "c": [4.0, 5.0, 6.0]}  # task means 2, 10, 5
    assert aggregate_mean(three) == pytest.approx(17 / 3)
    assert aggregate_median(three) == pytest.approx(5.0)


def test_iqm_pools_runs_so_tasks_with_more_runs_weigh_more():
    assert aggregate_iqm({"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]}) == pytest.approx(4.5)
    unequal = {"a": [0.0, 0.0, 0.0], "b": [1.0]}  # pooled 0, 0, 0, 1 -> keeps 0, 0
    assert aggregate_iqm(unequal) == 0.0
    assert aggregate_mean(unequal) == pytest.approx(0.5)


def test_optimality_gap_clips_at_gamma():
    scores = {"a": [0.5, 1.5], "b": [0.8, 1.0, 0.2]}
    # min(score, 1): 0.5, 1, 0.8, 1, 0.2 -> mean 0.7
    assert optimality_gap(scores) == pytest.approx(0.3)
    # min(score, 2): 0.5, 1.5, 0.8, 1, 0.2 -> mean 0.8
    assert optimality_gap(scores, gamma=2.0) == pytest.approx(1.2)
    assert optimality_gap({"a": [1.2, 3.0]}) == 0.0


def test_probability_of_improvement_counts_ties_as_half():
    # task t1: pairs (x, y) over x=[1,2,3], y=[2,2]: 1 loses twice, 2 ties twice, 3 wins twice -> 3/6.
    # task t2: every x beats every y -> 1. Task "only_x" is not in y and is ignored.
    x = {"t1": [1, 2, 3], "t2": [5, 6], "only_x": [0]}
    y = {"t1": [2, 2], "t2": [1, 2, 3]}
    assert probability_of_improvement(x, y) == pytest.approx(0.75)
    assert probability_of_improvement(y, x) == pytest.approx(0.25)
    same = {"t": [0.3, 0.1, 0.7]}
    assert probability_of_improvement(same, same) == 0.5


def test_probability_of_improvement_matches_mann_whitney():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 4, 7).astype(float), rng.integers(0, 4, 5).astype(float)  # many ties
    u = scipy_stats.mannwhitneyu(x, y, alternative="greater").statistic
    assert probability_of_improvement({"t": x}, {"t": y}) == pytest.approx(u / (7 * 5))


def test_performance_profile_fractions_by_hand():
    scores = {"a": [0.0, 0.5, 1.0, 1.5], "b": [2.0, 0.2]}  # 6 runs pooled
    estimate, low, high = performance_profile(scores, [0.0, 0.5, 1.0, 3.0], reps=500)
    # score > tau is strict: at 0.5 the run scoring 0.5 does not count.
    np.testing.assert_allclose(estimate, [5 / 6, 3 / 6, 2 / 6, 0.0])
    assert estimate.shape == low.shape == high.shape == (4,)
    assert np.all(low <= estimate) and np.all(estimate <= high)
    assert low[3] == high[3] == 0.0


def test_interval_str():
    assert str(Interval(0.8123, 0.7, 0.90456)) == "0.812 [0.700, 0.905]"


# ---------------------------------------------------------------- bootstrap behaviour


def test_replicates_never_mix_tasks():
    scores = {"a": [0.0, 0.0, 0.0], "b": [1.0, 1.0, 1.0]}
    for statistic in ("mean", "median"):
        assert stratified_bootstrap(scores, statistic, reps=2_000) == Interval(0.5, 0.5, 0.5)
    # Unequal counts are kept per task too: every replicate has 1 run of 4 above 0.5.
    estimate, low, high = performance_profile({"a": [0.0, 0.0, 0.0], "b": [1.0]}, [0.5], reps=1_000)
    assert estimate[0] == low[0] == high[0] == 0.25


def test_probability_of_improvement_interval():
    x = {"t1": [3.0, 4.0, 5.0], "t2": [10.0, 11.0]}
    y = {"t1": [0.0, 1.0, 2.0], "t2": [1.0, 2.0, 3.0]}
    assert probability_of_improvement_interval(x, y, reps=500) == Interval(1.0, 1.0, 1.0)
    rng = np.random.default_rng(0)
    a = {f"t{i}": rng.normal(size=10) for i in range(3)}
    b = {f"t{i}": rng.normal(size=8) for i in range(3)}
    interval = probability_of_improvement_interval(a, b, reps=2_000)
    assert interval.estimate == pytest.approx(probability_of_improvement(a, b))
    assert 0.0 <= interval.low < interval.estimate < interval.high <= 1.0


def test_aggregate_intervals_share_replicates_with_stratified_bootstrap():
    rng = np.random.default_rng(7)
    scores = {f"task{i}": rng.normal(1.0, 0.3, size=10 + i) for i in range(5)}
    intervals = aggregate_intervals(scores, reps=20_000, seed=4)
    assert list(intervals) == ["IQM", "mean", "median", "optimality gap"] == list(AGGREGATES)
    for name, interval in intervals.items():
        assert interval == stratified_bootstrap(scores, name, reps=20_000, seed=4)
        assert interval.low <= interval.estimate <= interval.high
    assert intervals["IQM"].estimate == pytest.approx(aggregate_iqm(scores))
    assert intervals["mean"].estimate == pytest.approx(aggregate_mean(scores))
    assert intervals["median"].estimate == pytest.approx(aggregate_median(scores))
    assert intervals["optimality gap"].estimate == pytest.approx(optimality_gap(scores))
    assert aggregate_intervals(scores, reps=20_000, seed=5) != intervals  # the seed matters


def test_custom_statistic_and_chunk_remainders(monkeypatch):
    monkeypatch.setattr(stats, "_MAX_CHUNK_REPS", 7)  # 50 reps -> chunks of 7, ..., 7, 1
    scores = {"a": [1.0, 2.0, 3.0], "b": [5.0, 9.0]}
    best_of_b = stratified_bootstrap(scores, lambda samples: samples[1].max(axis=1), reps=50)
    assert best_of_b.estimate == 9.0 and best_of_b.high == 9.0 and best_of_b.low in (5.0, 9.0)
    assert stratified_bootstrap({"a": [0.0] * 3, "b": [1.0] * 3}, "mean", reps=50) == Interval(0.5, 0.5, 0.5)
    assert probability_of_improvement_interval({"t": [2.0, 3.0]}, {"t": [0.0]}, reps=50) == Interval(1.0, 1.0, 1.0)
    estimate, low, high = performance_profile({"a": [0.0, 0.0, 0.0], "b": [1.0]}, [0.5, 2.0], reps=50)
    np.testing.assert_array_equal(np.stack([estimate, low, high]), [[0.25, 0.0]] * 3)


def test_statistic_errors():
    scores = {"a": [1.0, 2.0]}
    with pytest.raises(ValueError, match="unknown statistic 'iqm'"):
        stratified_bootstrap(scores, "iqm")
    with pytest.raises(ValueError, match="one value per replicate"):
        stratified_bootstrap(scores, lambda samples: samples[0], reps=10)
    with pytest.raises(ValueError, match="confidence"):
        stratified_bootstrap(scores, "mean", confidence=95)
    with pytest.raises(ValueError, match="reps"):
        mean_interval([1.0, 2.0], reps=0)


def test_one_task_intervals():
    assert mean_interval([3.0]) == Interval(3.0, 3.0, 3.0)
    assert iqm_interval([3.0]) == Interval(3.0, 3.0, 3.0)
    values = [0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 100.0, 100.0]
    interval = iqm_interval(values, reps=4_000)
    assert interval.estimate == pytest.approx(3.5)
    assert 0.0 < interval.low < 3.5 < interval.high < 100.0


def test_mean_interval_matches_scipy_percentile_bootstrap():
    data = np.random.default_rng(11).normal(2.0, 1.0, size=12)
    ours = mean_interval(data, reps=20_000, seed=1)
    theirs = scipy_stats.bootstrap(
        (data,), np.mean, n_resamples=20_000, method="percentile", confidence_level=0.95, rng=np.random.default_rng(2)
    ).confidence_interval
    assert ours.estimate == pytest.approx(data.mean())
    # Independent random streams: the bounds differ by Monte Carlo error only (about 0.006 sd each here).
    assert ours.low == pytest.approx(theirs.low, abs=0.03)
    assert ours.high == pytest.approx(theirs.high, abs=0.03)


def test_mean_interval_coverage():
    """A 95% percentile interval of the mean of 10 normal draws covers the true mean only ~90% of
    the time: its spread is the plug-in sd (sqrt(9/10) of the unbiased one) times normal rather
    than t quantiles, so coverage is about P(|T_9| < 1.96 * sqrt(0.9)) = 0.90. 1,000 trials give
    a coverage sd of about 0.01; the band allows that bias and 3 sd of noise either side."""
    rng = np.random.default_rng(2021)
    trials, covered = 1_000, 0
    for trial in range(trials):
        interval = mean_interval(rng.normal(1.0, 1.0, size=10), reps=1_000, seed=trial)
        covered += interval.low <= 1.0 <= interval.high
    assert 0.87 <= covered / trials <= 0.97


# ---------------------------------------------------------------- input errors


@pytest.mark.parametrize(
    "scores, message",
    [
        ({}, "no tasks"),
        ({"a": [1.0], "b": []}, "task 'b': no scores"),
        ({"a": [1.0, float("nan")]}, "task 'a': scores must be finite"),
        ({"a": [1.0, float("inf")]}, "must be finite"),
        ({"a": [[1.0, 2.0]]}, "1-D"),
    ],
)
def test_invalid_scores(scores, message):
    for call in (aggregate_mean, aggregate_iqm, lambda s: aggregate_intervals(s, reps=10)):
        with pytest.raises(ValueError, match=message):
            call(scores)


def test_invalid_inputs_elsewhere():
    with pytest.raises(ValueError, match="share no task"):
        probability_of_improvement({"a": [1.0]}, {"b": [1.0]})
    with pytest.raises(ValueError, match="must be finite"):
        mean_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="no scores"):
        iqm([])
    with pytest.raises(ValueError, match="thresholds"):
        performance_profile({"a": [1.0]}, [])


# ---------------------------------------------------------------- Welch


def test_welch_less_by_hand():
    current, baseline = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0, 10.0]
    # means 2.5 and 6; unbiased variances 5/3 and 10
    var_over_n_current, var_over_n_baseline = (5 / 3) / 4, 10 / 5
    standard_error = math.sqrt(var_over_n_current + var_over_n_baseline)
    t = (2.5 - 6.0) / standard_error  # -2.2514...
    df = (var_over_n_current + var_over_n_baseline) ** 2 / (var_over_n_current**2 / 3 + var_over_n_baseline**2 / 4)
    assert t == pytest.approx(-2.25143, abs=1e-5) and df == pytest.approx(5.52079, abs=1e-5)
    result = welch_less(current, baseline)
    assert result.difference == pytest.approx(-3.5)
    assert result.p_value == pytest.approx(scipy_stats.t.cdf(t, df))
    half_width = scipy_stats.t.ppf(0.975, df) * standard_error
    assert result.low == pytest.approx(-3.5 - half_width) and result.high == pytest.approx(-3.5 + half_width)
    wider = welch_less(current, baseline, confidence=0.99)
    assert wider.low < result.low and wider.high > result.high and wider.p_value == result.p_value


def test_welch_less_degenerate_and_invalid():
    assert welch_less([1.0, 1.0, 1.0], [2.0, 2.0]) == stats.WelchResult(-1.0, -1.0, -1.0, 0.0)
    assert welch_less([0.1] * 3, [0.1] * 4) == stats.WelchResult(0.0, 0.0, 0.0, 1.0)
    assert welch_less([3.0, 3.0], [2.0, 2.0]).p_value == 1.0
    # The other sample's variance suffices (all seeds at a capped return is common in RL), and
    # scipy's precision-loss warning for the constant sample is not raised to the caller.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one_constant = welch_less([1.0, 1.0, 1.0], [2.0, 3.0, 4.0])
    assert 0.0 < one_constant.p_value < 0.5 and one_constant.low < -2.0 < one_constant.high
    with pytest.raises(ValueError, match="at least 2 values in current"):
        welch_less([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="at least 2 values in baseline"):
        welch_less([1.0, 2.0], [3.0])
    with pytest.raises(ValueError, match="finite"):
        welch_less([1.0, float("nan")], [1.0, 2.0])


def test_welch_less_rejection_rates():
    rng = np.random.default_rng(5)
    null_rejections = np.mean([welch_less(rng.normal(size=5), rng.normal(size=5)).p_value < 0.05 for _ in range(1_000)])
    assert 0.02 <= null_rejections <= 0.08
    shifted_rejections = np.mean([welch_less(rng.normal(-3.0, 1.0, size=5), rng.normal(size=5)).p_value < 0.05 for _ in range(200)])
    assert shifted_rejections >= 0.95


# ---------------------------------------------------------------- Holm


def test_holm_by_hand():
    # sorted: 0.005 <= 0.05/4 reject, 0.01 <= 0.05/3 reject, 0.03 > 0.05/2 stop (0.04 is then kept too)
    assert holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm([0.01, 0.04, 0.03, 0.005], alpha=0.2) == [True, True, True, True]
    assert holm([0.04, 0.001]) == [True, True]  # 0.001 <= 0.05/2, then 0.04 <= 0.05/1
    assert holm([0.06, 0.001]) == [False, True]
    assert holm([0.03, 0.03]) == [False, False]  # 0.03 > 0.05/2 (Bonferroni's bar for the first)
    assert holm([]) == []
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([0.5, 1.5])


def test_t_interval_by_hand():
    # values 1, 2, 3, 6: mean 3, sample sd sqrt(14/3), t(0.975, df=3) = 3.182446
    interval = stats.t_interval([1.0, 2.0, 3.0, 6.0])
    half_width = 3.182446305284263 * np.sqrt(14.0 / 3.0) / 2.0
    assert interval.estimate == pytest.approx(3.0)
    assert (interval.low, interval.high) == pytest.approx((3.0 - half_width, 3.0 + half_width))
    assert stats.t_interval([5.0]) == stats.Interval(5.0, 5.0, 5.0)
    assert stats.t_interval([500.0] * 5) == stats.Interval(500.0, 500.0, 500.0)
    with pytest.raises(ValueError, match="finite"):
        stats.t_interval([1.0, float("nan")])


def test_t_interval_covers_at_about_the_nominal_rate_with_five_seeds():
    """Where the percentile bootstrap covers ~85% at n = 5, the t interval is near 95%."""
    rng = np.random.default_rng(1)
    trials = 2000
    covered = sum((interval := stats.t_interval(rng.normal(1.0, 2.0, 5))).low <= 1.0 <= interval.high for _ in range(trials))
    assert 0.93 <= covered / trials <= 0.97


def test_the_aggregate_iqm_and_its_interval_equal_rliables():
    """rliable's IQM (scipy's trim_mean over all runs) and its stratified-bootstrap interval,
    computed by rliable itself on a fixed sample: the point exactly, the interval within the
    Monte-Carlo error of 50,000 replicates (different random draws)."""
    from rliable import library as rly
    from rliable import metrics as rliable_metrics

    scores = np.random.default_rng(7).normal(loc=[0.4, 0.8, 1.1], scale=[0.2, 0.3, 0.1], size=(10, 3))  # (runs, tasks)
    points, intervals = rly.get_interval_estimates({"x": scores}, lambda s: np.array([rliable_metrics.aggregate_iqm(s)]), reps=50_000)
    ours = stats.stratified_bootstrap({str(task): scores[:, task] for task in range(3)}, "IQM", reps=50_000)
    assert ours.estimate == pytest.approx(float(points["x"][0]), abs=1e-12)
    assert (ours.low, ours.high) == pytest.approx((float(intervals["x"][0, 0]), float(intervals["x"][1, 0])), abs=0.01)


def test_the_records_aggregate_verdict_computes_rliables_iqm_and_interval():
    """aggregate_verdicts.aggregate (the record's per-algorithm verdict) on a fixed sample: our
    side's IQM is rliable's exactly, its interval within the Monte-Carlo error of 20,000 draws."""
    from rliable import library as rly
    from rliable import metrics as rliable_metrics

    from benchmark.analysis import aggregate_verdicts
    from benchmark.analysis.verdict_rule import Sample

    scores = np.random.default_rng(11).normal(loc=[0.5, 0.9, 0.7], scale=[0.15, 0.1, 0.3], size=(10, 3))
    sides = [aggregate_verdicts.TaskSides(str(task), scores[:, task], Sample.summary(0.8, 0.1, 10)) for task in range(3)]
    found = aggregate_verdicts.aggregate("x", 1, sides, reps=20_000)
    points, intervals = rly.get_interval_estimates({"x": scores}, lambda s: np.array([rliable_metrics.aggregate_iqm(s)]), reps=20_000)
    assert found.ours_iqm.estimate == pytest.approx(float(points["x"][0]), abs=1e-12)
    assert (found.ours_iqm.low, found.ours_iqm.high) == pytest.approx((float(intervals["x"][0, 0]), float(intervals["x"][1, 0])), abs=0.01)
