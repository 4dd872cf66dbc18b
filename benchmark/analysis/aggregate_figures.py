"""The record's figures across tasks, per budget, in the style of rliable (Agarwal et al., 2021).

For each budget of the record (1M steps, 300k steps), the algorithms are compared on the tasks
they all ran: the set of algorithms and common tasks that covers the most (algorithm, task)
cells, so that no aggregate mixes task sets (rliable's rule: an aggregate over different tasks
compares nothing); an algorithm on fewer of the budget's tasks is left out and named. Scores
are each run's final deterministic evaluation, normalized with the task's fixed normalizer
(``normalizers.csv``: random 0, the task's reference 1). Four figures per budget:

- **intervals**: IQM, mean, median and optimality gap over the pooled runs, each with its 95%
  stratified-bootstrap interval (runs resampled within each task);
- **profiles**: the fraction of runs above each normalized score, with 95% bootstrap bands;
- **improvement**: P(X > Y) between every pair of the budget's algorithms (per task the
  Mann-Whitney statistic, averaged over tasks), and P(ours > reference) of each algorithm's
  aggregate verdict (over the tasks its verdict compared a published score), 95% intervals;
- **sample efficiency**: the IQM of the normalized evaluation returns against env steps, at
  ``POINTS`` evenly spaced steps (each run's latest evaluation at or before the step), with a
  95% stratified-bootstrap band.

Each is written as PNG and SVG. Pure functions of the record: the same bundles give the same
bytes (fixed bootstrap seeds; the SVG without its date).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmark.analysis import stats

POINTS = 50
"""Steps of a sample-efficiency curve, evenly spaced up to the budget."""
REPS = 5_000
"""Bootstrap replicates of the intervals, profiles and improvement probabilities."""
CURVE_REPS = 2_000
"""Bootstrap replicates per point of a sample-efficiency curve."""
THRESHOLDS = np.linspace(0.0, 2.0, 81)
"""Normalized scores tau of the performance profiles."""
KINDS = ("intervals", "profiles", "improvement", "sample_efficiency")


@dataclass
class Budget:
    """The algorithms compared at one budget, on their common tasks."""

    steps: int
    tasks: list[str]
    scores: dict[str, dict[str, np.ndarray]]
    """Algorithm -> task -> normalized final scores of its finished runs, shape (runs,)."""
    curves: dict[str, dict[str, list[list[tuple[int, float]]]]]
    """Algorithm -> task -> each run's normalized (step, return) evaluations."""
    left_out: dict[str, str] = field(default_factory=dict)
    """Algorithm -> why it is not drawn (the tasks it ran at this budget)."""
    references: dict[str, tuple[stats.Interval, int]] = field(default_factory=dict)
    """Algorithm -> P(ours > reference) of its aggregate verdict and the tasks it spans."""


def common_cover(tasks_of: Mapping[str, set[str]]) -> tuple[list[str], list[str]]:
    """The algorithms and the tasks they all ran that cover the most (algorithm, task) cells
    (ties: more tasks, then the earlier algorithms): (algorithms in the given order, tasks sorted)."""
    names = list(tasks_of)
    best: tuple[tuple[int, int, int], list[str], set[str]] | None = None
    for size in range(len(names), 0, -1):
        for chosen in itertools.combinations(range(len(names)), size):
            shared = set.intersection(*(tasks_of[names[i]] for i in chosen))
            if not shared:
                continue
            key = (size * len(shared), len(shared), -sum(chosen))
            if best is None or key > best[0]:
                best = (key, [names[i] for i in chosen], shared)
    if best is None:
        return [], []
    return best[1], sorted(best[2])


def budgets(rows: Sequence[Any], aggregates: Sequence[Any] = ()) -> list[Budget]:
    """The record's rows (``record.Row``) grouped by budget, each restricted to its common cover;
    a budget where fewer than one algorithm has a normalizable task is skipped."""
    by_budget: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if not row.normalizer.available or not any(r.final_return is not None for r in row.finished):
            continue
        by_budget.setdefault(row.steps, {}).setdefault(row.group.label, {})[row.group.env_id] = row
    found = []
    for steps in sorted(by_budget, reverse=True):
        per_algo = by_budget[steps]
        chosen, tasks = common_cover({algo: set(cells) for algo, cells in per_algo.items()})
        if not chosen:
            continue
        scores: dict[str, dict[str, np.ndarray]] = {}
        curves: dict[str, dict[str, list[list[tuple[int, float]]]]] = {}
        for algo in chosen:
            scores[algo], curves[algo] = {}, {}
            for task in tasks:
                row = per_algo[algo][task]
                runs = [r for r in row.finished if r.final_return is not None]
                scores[algo][task] = np.asarray(row.normalizer(np.array([r.final_return for r in runs])), dtype=float)
                curves[algo][task] = [[(step, float(row.normalizer(value))) for step, value in r.curve] for r in runs if r.curve]
        left_out = {algo: ", ".join(sorted(cells)) for algo, cells in per_algo.items() if algo not in chosen}
        references = {a.label: (a.improvement, len(a.tasks)) for a in aggregates if a.budget == steps and a.label in chosen}
        found.append(Budget(steps, tasks, scores, curves, left_out, references))
    return found


def intervals(budget: Budget, reps: int = REPS) -> dict[str, dict[str, stats.Interval]]:
    """Algorithm -> IQM, mean, median, optimality gap with their 95% stratified-bootstrap intervals."""
    return {algo: stats.aggregate_intervals(scores, reps=reps, seed=0) for algo, scores in budget.scores.items()}


def profiles(budget: Budget, reps: int = REPS) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Algorithm -> (estimate, low, high) of the fraction of runs above each of ``THRESHOLDS``."""
    return {algo: stats.performance_profile(scores, THRESHOLDS, reps=reps, seed=0) for algo, scores in budget.scores.items()}


def improvements(budget: Budget, reps: int = REPS) -> dict[str, stats.Interval]:
    """'X > Y' -> P(X > Y) with its 95% interval, for every ordered pair of the budget's
    algorithms taken once (X first in the record's order), then 'X > reference' from each
    algorithm's aggregate verdict."""
    found = {
        f"{x} > {y}": stats.probability_of_improvement_interval(budget.scores[x], budget.scores[y], reps=reps, seed=0)
        for x, y in itertools.combinations(budget.scores, 2)
    }
    for algo, (interval, tasks) in budget.references.items():
        found[f"{algo} > published ({tasks} task{'s' if tasks != 1 else ''})"] = interval
    return found


def sample_efficiency(budget: Budget, points: int = POINTS, reps: int = CURVE_REPS) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Algorithm -> (steps, IQM, low, high), shape (points,) each: the IQM over every run of
    every task of its latest normalized evaluation at or before each step, with a 95%
    stratified-bootstrap interval. A step is skipped where a run has no evaluation yet."""
    grid = np.linspace(budget.steps / points, budget.steps, points).round().astype(int)
    found = {}
    for algo, per_task in budget.curves.items():
        steps, estimates, lows, highs = [], [], [], []
        for step in grid:
            at_step = {task: _latest(runs, int(step)) for task, runs in per_task.items()}
            if not all(values is not None and values.size for values in at_step.values()):
                continue
            interval = stats.stratified_bootstrap({task: values for task, values in at_step.items() if values is not None}, "IQM", reps=reps, seed=0)
            steps.append(step)
            estimates.append(interval.estimate)
            lows.append(interval.low)
            highs.append(interval.high)
        found[algo] = (np.asarray(steps), np.asarray(estimates), np.asarray(lows), np.asarray(highs))
    return found


def _latest(runs: list[list[tuple[int, float]]], step: int) -> np.ndarray | None:
    """Each run's latest evaluation at or before ``step`` (None where a run has none)."""
    values = []
    for curve in runs:
        before = [value for at, value in curve if at <= step]
        if not before:
            return None
        values.append(before[-1])
    return np.asarray(values, dtype=float)


def paths(found: Sequence[Budget], directory: Path) -> list[Path]:
    """The PNG of each figure ``draw`` writes (an SVG beside each)."""
    from benchmark.analysis.record_text import steps_text

    return [directory / f"aggregate_{kind}_{steps_text(budget.steps)}.png" for budget in found for kind in KINDS]


def draw(found: Sequence[Budget], directory: Path) -> list[Path]:
    """Write the four figures of every budget (PNG and SVG); the PNGs' paths."""
    from benchmark.analysis import plots
    from benchmark.analysis.record_text import steps_text

    written = []
    for budget in found:
        name = steps_text(budget.steps)
        tasks = f"{len(budget.tasks)} task{'s' if len(budget.tasks) != 1 else ''} ({', '.join(budget.tasks)})"
        runs = ", ".join(f"{algo} {sum(v.size for v in scores.values())}" for algo, scores in budget.scores.items())
        caption = f"{name} steps, {tasks}; runs: {runs}"
        if budget.left_out:
            caption += "; not drawn (fewer tasks): " + "; ".join(f"{algo} ({cells})" for algo, cells in budget.left_out.items())
        path = {kind: directory / f"aggregate_{kind}_{name}.png" for kind in KINDS}
        written.append(plots.aggregate_intervals(intervals(budget), path["intervals"], title=f"aggregates over tasks, {caption}", svg=True))
        written.append(plots.performance_profiles(profiles(budget), THRESHOLDS, path["profiles"], title=f"performance profiles, {caption}", svg=True))
        written.append(plots.improvement_intervals(improvements(budget), path["improvement"], title=f"probability of improvement, {caption}"))
        written.append(plots.sample_efficiency(sample_efficiency(budget), path["sample_efficiency"], title=f"IQM against steps, {caption}"))
    return written


def overview_path(directory: Path) -> Path:
    return directory / "aggregate_overview.png"


def overview(found: Sequence[Budget], directory: Path) -> Path | None:
    """The README's one figure: the IQM against steps of every budget, side by side (None without a budget)."""
    from benchmark.analysis import plots
    from benchmark.analysis.record_text import steps_text

    if not found:
        return None
    panels = [(f"{steps_text(budget.steps)} steps: {', '.join(budget.tasks)}", sample_efficiency(budget)) for budget in found]
    title = "IQM of normalized evaluation returns over tasks and seeds against env steps (random 0, the task's reference 1), 95% stratified bootstrap bands"
    return plots.sample_efficiency_panels(panels, overview_path(directory), title)
