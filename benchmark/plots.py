"""PNG plots for reports: learning curves, aggregate intervals, performance profiles (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never a window, and no display needed on CI machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmark import stats  # noqa: E402

COLORS = plt.get_cmap("tab10").colors


def _save(figure: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


def learning_curves(
    title: str,
    curves: dict[str, list[list[tuple[int, float]]]],
    path: Path,
    reference: tuple[float, str] | None = None,
    random: float | None = None,
) -> Path:
    """Mean evaluation return against env steps, one line per label with a 95% Student-t
    band over seeds; ``curves[label]`` holds each seed's [(step, return), ...]. At each step
    only the seeds that reached it count (runs still going have shorter curves)."""
    figure, axes = plt.subplots(figsize=(7, 4.2))
    for index, (label, seeds) in enumerate(curves.items()):
        steps = sorted({step for curve in seeds for step, _ in curve})
        if not steps:
            continue
        by_step = [[dict(curve)[step] for curve in seeds if step in dict(curve)] for step in steps]
        intervals = [stats.t_interval(values) for values in by_step]
        color = COLORS[index % len(COLORS)]
        axes.plot(steps, [i.estimate for i in intervals], color=color, label=f"{label} (n={len(seeds)})")
        axes.fill_between(steps, [i.low for i in intervals], [i.high for i in intervals], color=color, alpha=0.2, linewidth=0)
    if reference is not None:
        axes.axhline(reference[0], color="black", linestyle="--", linewidth=1, label=f"reference {reference[0]:.1f} ({reference[1]})")
    if random is not None:
        axes.axhline(random, color="grey", linestyle=":", linewidth=1, label=f"random policy {random:.1f}")
    axes.set_xlabel("environment steps")
    axes.set_ylabel("evaluation return (mean over seeds, 95% CI)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    return _save(figure, path)


def aggregate_intervals(intervals: dict[str, dict[str, stats.Interval]], path: Path) -> Path:
    """One panel per aggregate metric (IQM, mean, median, optimality gap), one interval per algorithm."""
    labels = list(intervals)
    metrics = list(next(iter(intervals.values())))
    figure, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 0.5 * len(labels) + 1.4), sharey=True)
    axes = np.atleast_1d(axes)
    for axis, metric in zip(axes, metrics):
        for row, label in enumerate(labels):
            interval = intervals[label][metric]
            color = COLORS[row % len(COLORS)]
            axis.barh(row, interval.high - interval.low, left=interval.low, height=0.6, color=color, alpha=0.35)
            axis.plot([interval.estimate] * 2, [row - 0.3, row + 0.3], color=color, linewidth=2)
        axis.set_title(metric)
        axis.set_xlabel("normalized score")
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels)
    figure.suptitle("aggregate normalized scores, 95% stratified bootstrap CIs", fontsize=10)
    return _save(figure, path)


def performance_profiles(
    profiles: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], thresholds: Sequence[float], path: Path
) -> Path:
    """Fraction of runs with normalized score > tau, with 95% bootstrap bands."""
    figure, axes = plt.subplots(figsize=(6, 4))
    for index, (label, (estimate, low, high)) in enumerate(profiles.items()):
        color = COLORS[index % len(COLORS)]
        axes.plot(thresholds, estimate, color=color, label=label)
        axes.fill_between(thresholds, low, high, color=color, alpha=0.2, linewidth=0)
    axes.set_xlabel("normalized score τ")
    axes.set_ylabel("fraction of runs with score > τ")
    axes.set_ylim(-0.02, 1.02)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title("performance profiles")
    return _save(figure, path)
