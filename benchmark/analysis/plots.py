"""PNG plots for reports: learning curves, aggregate intervals, performance profiles (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window, and no display needed on CI machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmark.analysis import stats  # noqa: E402

COLORS = matplotlib.color_sequences["tab10"]  # the colours of the tab10 colormap


def _save(figure: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")  # a legend wider than the axes is kept whole
    plt.close(figure)
    return path


def learning_curves(
    title: str,
    curves: dict[str, list[list[tuple[int, float]]]],
    path: Path,
    reference: tuple[float, str] | None = None,
    random: float | None = None,
    published: dict[str, tuple[float, str]] | None = None,
) -> Path:
    """Evaluation return against env steps: for each label (``curves[label]`` holds each seed's
    [(step, return), ...]) every seed as a thin line and their mean as a thick one, over a 95%
    Student-t band of the mean clipped to the returns the seeds reached (with 3 seeds the t band
    alone runs far past any possible return). At each step only the seeds that reached it count
    (runs still going have shorter curves). ``reference``: (score, whose: the algorithm and
    source), the dashed black line; ``published``: label -> (score, source) of that algorithm's
    own published score, dashed in its color."""
    figure, axes = plt.subplots(figsize=(7.5, 5.2), layout="constrained")
    drawn: set[str] = set()
    for index, (label, seeds) in enumerate(curves.items()):
        steps = sorted({step for curve in seeds for step, _ in curve})
        if not steps:
            continue
        color = COLORS[index % len(COLORS)]
        for curve in seeds:
            if curve:
                axes.plot(*zip(*curve), color=color, linewidth=0.7, alpha=0.35)
        by_step = [[dict(curve)[step] for curve in seeds if step in dict(curve)] for step in steps]
        mean, low, high = clipped_band(by_step)
        axes.plot(steps, mean, color=color, linewidth=2, label=f"{label} (mean of {len(seeds)} seeds)")
        axes.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
        algo = label.split(" [")[0]
        if published and label in published and algo not in drawn:
            drawn.add(algo)
            score, source = published[label]
            axes.axhline(score, color=color, linestyle="--", linewidth=1, label=f"{algo}, published: {score:.1f} ({source})")
    if reference is not None:
        axes.axhline(reference[0], color="black", linestyle="--", linewidth=1, label=f"reference: {reference[1]}, {reference[0]:.1f}")
    if random is not None:
        axes.axhline(random, color="grey", linestyle=":", linewidth=1, label=f"random policy: {random:.1f}")
    axes.set_xlabel("environment steps")
    axes.set_ylabel("evaluation return")
    axes.set_title(f"{title}: each seed (thin), mean (thick), 95% CI clipped to the seeds' range", fontsize=10)
    axes.grid(alpha=0.3)
    figure.legend(fontsize=7, loc="outside lower center", ncols=2, frameon=False)
    return _save(figure, path)


def clipped_band(by_step: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Per step, the mean of the seeds' returns and its 95% Student-t interval clipped to the
    lowest and highest return a seed reached there: (means, lows, highs)."""
    intervals = [stats.t_interval(values) for values in by_step]
    low = [max(interval.low, min(values)) for interval, values in zip(intervals, by_step)]
    high = [min(interval.high, max(values)) for interval, values in zip(intervals, by_step)]
    return [interval.estimate for interval in intervals], low, high


def aggregate_intervals(intervals: dict[str, dict[str, stats.Interval]], path: Path) -> Path:
    """One panel per aggregate metric (IQM, mean, median, optimality gap), one interval per
    algorithm: a bar for the interval and a marker at the estimate, so that a zero-width
    interval stays visible; the axes reach past every interval."""
    labels = list(intervals)
    metrics = list(next(iter(intervals.values())))
    figure, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 0.5 * len(labels) + 1.6), sharey=True, layout="constrained")
    axes = np.atleast_1d(axes)
    for axis, metric in zip(axes, metrics):
        lows = [intervals[label][metric].low for label in labels]
        highs = [intervals[label][metric].high for label in labels]
        for row, label in enumerate(labels):
            interval = intervals[label][metric]
            color = COLORS[row % len(COLORS)]
            axis.barh(row, interval.high - interval.low, left=interval.low, height=0.6, color=color, alpha=0.35)
            axis.plot([interval.estimate], [row], marker="D", markersize=6, color=color, markeredgecolor="black", markeredgewidth=0.5)
        span = max(max(highs) - min(lows), 0.1)
        axis.set_xlim(min(lows) - 0.08 * span, max(highs) + 0.08 * span)
        axis.set_title(metric, fontsize=10)
        axis.set_xlabel("normalized score")
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels)
    figure.suptitle("aggregate normalized scores: estimate (diamond) and 95% stratified bootstrap CI (bar)", fontsize=10)
    return _save(figure, path)


def performance_profiles(profiles: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], thresholds: np.ndarray, path: Path) -> Path:
    """Fraction of runs with normalized score > tau, a step function of tau, with its 95%
    bootstrap band (edges drawn, so that a narrow band is seen)."""
    figure, axes = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    for index, (label, (estimate, low, high)) in enumerate(profiles.items()):
        color = COLORS[index % len(COLORS)]
        axes.fill_between(thresholds, low, high, color=color, alpha=0.25, linewidth=0, step="post")
        for edge in (low, high):
            axes.step(thresholds, edge, where="post", color=color, linewidth=0.6, alpha=0.7)
        axes.step(thresholds, estimate, where="post", color=color, linewidth=2, label=label)
    axes.set_xlabel("normalized score τ")
    axes.set_ylabel("fraction of runs with score > τ")
    axes.set_ylim(-0.03, 1.03)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title("performance profiles (95% bootstrap bands)", fontsize=10)
    return _save(figure, path)
