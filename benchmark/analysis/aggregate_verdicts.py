"""Aggregate verdicts: one algorithm at one budget, across its tasks, against its references.

Per task, both sides are normalized with the task's fixed normalizer (``normalizers.csv``) and
scored as the task's verdict scored them. The aggregate is the IQM of all runs pooled (rliable's
``aggregate_iqm``); its interval comes from a stratified bootstrap (Agarwal et al., 2021): in
each replicate our runs are resampled within each task, and so is the reference: its seeds
where the source gives them (Tianshou's per-seed curves), else ``n`` values drawn from a normal
with the source's mean and spread (a parametric bootstrap), else (one agent, or a mean without a
spread) its value held fixed. The reference's point estimate for a summary source is the IQM
of its "representative" sample, mean + sd x the normal quantiles at (i - 1/2) / n.

The verdict is the rule's (``verdict_rule``), on the difference IQM(ours) - IQM(reference): its
90% bootstrap interval inside ±margin (normalized) without a difference shown is **reproduced**;
a two-sided bootstrap p-value (twice the smaller tail of the replicates at 0) rejected after
Holm's correction over the table's aggregates is **above** / **below** (beyond, within or across
the margin); otherwise **inconclusive**, with the seeds per
task that would decide at 80% power (the bootstrap variance of our IQM scaled by n / N). A
reference with a one-agent task can only be "consistent with" or "outside" it. Beside it:
P(ours > reference) with its interval, and a performance profile per side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from benchmark.analysis import power, stats, verdict_rule
from benchmark.analysis.verdict_rule import Decision, Evidence, Margin, Sample

REPS = 20_000


@dataclass(frozen=True)
class TaskSides:
    """One task of the aggregate: our normalized per-seed scores and the reference's side, normalized."""

    task: str
    ours: np.ndarray
    reference: Sample


@dataclass
class Aggregate:
    """One algorithm (or comparison) at one budget across its tasks."""

    label: str
    budget: int
    tasks: list[str]
    ours_iqm: stats.Interval
    reference_iqm: stats.Interval
    difference: stats.Interval
    """IQM(ours) - IQM(reference) with its 90% interval."""
    p_value: float
    improvement: stats.Interval
    """P(ours > reference), 95% interval."""
    ours_variance: float
    reference_variance: float
    one_agent: bool
    seeds: int
    """Our runs in the smallest task."""
    reference_grows: bool = False
    """The reference is a side we can train more seeds of (parity): seeds needed count per side."""
    decision: Decision | None = None
    profiles: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    thresholds: np.ndarray | None = None


def representative(sample: Sample, runs: int) -> np.ndarray:
    """The reference's side as ``runs`` values (as many as ours on the task, so that both sides
    weigh the tasks alike in the pooled IQM): its seeds (their quantiles at (i - 1/2) / runs where
    it has another count), a summary's normal quantiles, or its one value repeated."""
    from scipy import stats as scipy_stats

    levels = (np.arange(runs) + 0.5) / runs
    if sample.values is not None:
        values = np.asarray(sample.values, dtype=float)
        return values if values.size == runs else np.quantile(values, levels)
    if sample.sd is None or sample.n < 2:
        return np.full(runs, sample.mean)
    return sample.mean + sample.sd * scipy_stats.norm.ppf(levels)


def _draws(rng: np.random.Generator, sample: Sample, reps: int, ours: np.ndarray) -> np.ndarray:
    """(reps, runs) resampled reference runs, ``runs`` = ours on the task. Its seeds: k resampled,
    then ``runs`` drawn from those; a mean with a spread over k seeds: the mean drawn with its
    standard error, then ``runs`` values around it; a value without a spread (one agent, or a mean
    of k runs) moves as the mean of k runs drawn like ours would (our seeds' deviations from their
    mean, resampled): the prediction interval of the per-task rule, in the bootstrap."""
    runs = ours.size
    if sample.values is not None:
        values = np.asarray(sample.values, dtype=float)
        resampled = values[rng.integers(0, values.size, size=(reps, values.size))]
        return resampled if values.size == runs else np.take_along_axis(resampled, rng.integers(0, values.size, size=(reps, runs)), axis=1)
    if sample.sd is None or sample.n < 2:
        deviations = ours - ours.mean()
        moved = sample.mean + deviations[rng.integers(0, deviations.size, size=(reps, sample.n))].mean(axis=1, keepdims=True)
        return np.repeat(moved, runs, axis=1)
    means = rng.normal(sample.mean, sample.sd / np.sqrt(sample.n), size=(reps, 1))
    return rng.normal(means, sample.sd, size=(reps, runs))


def aggregate(label: str, budget: int, sides: Sequence[TaskSides], reps: int = REPS, seed: int = 0, reference_grows: bool = False) -> Aggregate:
    """The aggregate of ``sides`` (every task with at least one run of ours)."""
    rng = np.random.default_rng(seed)
    ours_point = stats.aggregate_iqm({side.task: side.ours for side in sides})
    reference_runs = {side.task: representative(side.reference, side.ours.size) for side in sides}
    reference_point = stats.aggregate_iqm(reference_runs)
    ours_reps = np.empty(reps)
    reference_reps = np.empty(reps)
    for start in range(0, reps, 5_000):
        size = min(5_000, reps - start)
        mine = [side.ours[rng.integers(0, side.ours.size, size=(size, side.ours.size))] for side in sides]
        theirs = [_draws(rng, side.reference, size, side.ours) for side in sides]
        ours_reps[start : start + size] = stats.AGGREGATES["IQM"](mine)
        reference_reps[start : start + size] = stats.AGGREGATES["IQM"](theirs)
    differences = ours_reps - reference_reps
    low90, high90 = np.quantile(differences, [0.05, 0.95])
    p_value = min(1.0, 2.0 * min(float(np.mean(differences <= 0)), float(np.mean(differences >= 0))))
    ours_interval = stats.Interval(ours_point, *map(float, np.quantile(ours_reps, [0.025, 0.975])))
    reference_interval = stats.Interval(reference_point, *map(float, np.quantile(reference_reps, [0.025, 0.975])))
    improvement = stats.probability_of_improvement_interval({s.task: s.ours for s in sides}, reference_runs, seed=seed)
    found = Aggregate(
        label,
        budget,
        [side.task for side in sides],
        ours_interval,
        reference_interval,
        stats.Interval(ours_point - reference_point, float(low90), float(high90)),
        p_value,
        improvement,
        float(np.var(ours_reps)),
        float(np.var(reference_reps)),
        any(side.reference.one_agent for side in sides),
        min(side.ours.size for side in sides),
        reference_grows,
    )
    highest = max(max(float(np.max(side.ours)) for side in sides), max(float(np.max(r)) for r in reference_runs.values()))
    found.thresholds = np.linspace(0.0, max(1.25, highest * 1.05), 81)
    found.profiles = {
        "ours": stats.performance_profile({s.task: s.ours for s in sides}, found.thresholds, seed=seed),
        "reference": stats.performance_profile(reference_runs, found.thresholds, seed=seed),
    }
    return found


def decide(aggregates: Sequence[Aggregate], margin: float = verdict_rule.DEFAULT_MARGIN, alpha: float = verdict_rule.ALPHA) -> None:
    """Each aggregate's decision by the rule, Holm's correction over the table's aggregates."""
    adjusted = stats.holm_adjusted([found.p_value for found in aggregates]) if aggregates else []
    unit = Margin(margin, 1.0, "normalized units")
    for found, adjusted_p in zip(aggregates, adjusted):
        difference, significant = found.difference, adjusted_p <= alpha
        evidence = Evidence(
            difference.estimate,
            difference.low,
            difference.high,
            found.p_value,
            math.sqrt(found.ours_variance + found.reference_variance),
            math.inf,
            "stratified bootstrap of the IQM difference",
            one_agent=found.one_agent,
        )
        decision = Decision(
            verdict_rule.INCONCLUSIVE, evidence, unit, significant, adjusted_p, family=len(aggregates), reference_fixed=not found.reference_grows
        )
        inside = -margin < difference.low and difference.high < margin
        if found.one_agent:
            decision.label = verdict_rule.ONE_AGENT_OUTSIDE if significant else verdict_rule.ONE_AGENT_CONSISTENT
            decision.notes.append("a task's reference is one trained agent: equivalence cannot be shown")
        elif significant:
            decision.label = verdict_rule.ABOVE if difference.estimate > 0 else verdict_rule.BELOW
            beyond = difference.low > margin if difference.estimate > 0 else difference.high < -margin
            decision.margin_position = "beyond" if beyond else ("within" if inside else "perhaps within")
        elif inside:
            decision.label = verdict_rule.REPRODUCED
        else:
            decision.seeds_needed, decision.needed_for = _seeds_needed(found, margin, len(aggregates), alpha)
            decision.searched_to = verdict_rule.MAX_SEEDS
        found.decision = decision


def _seeds_needed(found: Aggregate, margin: float, family: int, alpha: float) -> tuple[int | None, str]:
    """Seeds per task (of ours, or per side when the reference grows) at which the rule decides
    with 80% power (normal approximation: the bootstrap variances scaled by n / N)."""
    d = found.difference.estimate

    def decides(n: float) -> str:
        reference_variance = found.reference_variance * (found.seeds / n if found.reference_grows else 1.0)
        se = math.sqrt(found.ours_variance * found.seeds / n + reference_variance)
        if abs(d) < margin and power.tost_power(d, margin, se, math.inf, alpha) >= verdict_rule.POWER:
            return "equivalence"
        if d != 0 and power.difference_power(d, se, math.inf, alpha / max(family, 1)) >= verdict_rule.POWER:
            return "a difference"
        return ""

    for n in range(found.seeds + 1, verdict_rule.MAX_SEEDS + 1):
        if decides(n):
            return n, decides(n)
    if not found.reference_grows and not decides(1e12):
        return None, "no seed count of ours decides: the references' own spread is too wide for the margin at this difference"
    return None, ""


def normalized_sides(per_task: Mapping[str, tuple[np.ndarray, Sample]], normalize: Mapping[str, object]) -> list[TaskSides]:
    """TaskSides from raw scores: each task's values and reference normalized by its normalizer."""
    sides = []
    for task, (values, sample) in per_task.items():
        norm = normalize[task]
        scale = float(norm(1.0) - norm(0.0))  # type: ignore[operator]
        reference = Sample(
            float(norm(sample.mean)),  # type: ignore[operator]
            None if sample.sd is None else abs(sample.sd * scale),
            sample.n,
            None if sample.values is None else tuple(map(float, norm(np.asarray(sample.values)))),  # type: ignore[operator]
        )
        sides.append(TaskSides(task, np.asarray(norm(np.asarray(values, dtype=float)), dtype=float), reference))  # type: ignore[operator]
    return sides
