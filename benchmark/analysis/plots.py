"""PNG (and SVG) plots for reports and the record: learning curves, aggregate intervals,
performance profiles, probabilities of improvement, IQM against steps (matplotlib, Agg)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window, and no display needed on CI machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmark.analysis import stats  # noqa: E402

COLORS = matplotlib.color_sequences["tab10"]  # the colours of the tab10 colormap
matplotlib.rcParams["svg.hashsalt"] = "reprorl"  # the SVGs' element ids: the same bytes on every run


def _save(figure: plt.Figure, path: Path, svg: bool = False) -> Path:
    """``path`` (PNG), and with ``svg`` the same figure beside it as SVG (no date written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")  # a legend wider than the axes is kept whole
    if svg:
        figure.savefig(path.with_suffix(".svg"), bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    return path


def _title(text: str, width: int = 110) -> str:
    return "\n".join(textwrap.wrap(text, width))


def steps_axis(axis: plt.Axes) -> None:
    """Env steps on the x axis in millions, written 0.3M, 0.05M (no `1e6` offset text)."""
    from matplotlib.ticker import FuncFormatter

    def text(value: float, _: int) -> str:
        return "0" if value == 0 else f"{value / 1e6:g}M"

    axis.xaxis.set_major_formatter(FuncFormatter(text))


def aggregate_intervals(intervals: dict[str, dict[str, stats.Interval]], path: Path, title: str | None = None, svg: bool = False) -> Path:
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
        axis.set_xlabel("normalized score" if metric != "optimality gap" else "gap to 1 (lower is better)")
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels)
    heading = "aggregate normalized scores: estimate (diamond) and 95% stratified bootstrap CI (bar)"
    figure.suptitle(_title(f"{title}: estimate (diamond), 95% stratified bootstrap CI (bar)" if title else heading), fontsize=9)
    return _save(figure, path, svg)


def performance_profiles(
    profiles: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], thresholds: np.ndarray, path: Path, title: str | None = None, svg: bool = False
) -> Path:
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
    axes.set_title(_title(f"{title} (95% bootstrap bands)", 80) if title else "performance profiles (95% bootstrap bands)", fontsize=9 if title else 10)
    return _save(figure, path, svg)


def improvement_intervals(probabilities: dict[str, stats.Interval], path: Path, title: str) -> Path:
    """One row per comparison 'X > Y': P(X > Y) as a marker with its 95% interval as a bar, on
    [0, 1] with 0.5 (no difference) marked; PNG and SVG."""
    labels = list(probabilities)
    figure, axes = plt.subplots(figsize=(6.5, 0.45 * len(labels) + 1.5), layout="constrained")
    for row, label in enumerate(labels):
        interval = probabilities[label]
        color = COLORS[0] if "reference" not in label else COLORS[1]
        axes.barh(row, interval.high - interval.low, left=interval.low, height=0.55, color=color, alpha=0.35)
        axes.plot([interval.estimate], [row], marker="D", markersize=6, color=color, markeredgecolor="black", markeredgewidth=0.5)
    axes.axvline(0.5, color="grey", linestyle=":", linewidth=1)
    axes.set_yticks(range(len(labels)), labels)
    axes.invert_yaxis()
    axes.set_xlim(0, 1)
    axes.set_xlabel("P(X > Y): a run of X beats a run of Y, averaged over tasks")
    axes.grid(axis="x", alpha=0.3)
    axes.set_title(_title(f"{title}: estimate (diamond), 95% bootstrap CI (bar)", 80), fontsize=9)
    return _save(figure, path, svg=True)


def sample_efficiency(curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], path: Path, title: str) -> Path:
    """IQM of normalized returns against env steps per algorithm, ``curves[label]`` = (steps,
    IQM, low, high), with its 95% band; PNG and SVG."""
    return sample_efficiency_panels([("", curves)], path, f"{title} (95% stratified bootstrap bands)")


def sample_efficiency_panels(panels: list[tuple[str, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]]], path: Path, title: str) -> Path:
    """``sample_efficiency`` side by side, one panel per (panel title, curves), each algorithm in
    its own colour across panels; PNG and SVG."""
    algos = list(dict.fromkeys(label for _, curves in panels for label in curves))
    color = {algo: COLORS[index % len(COLORS)] for index, algo in enumerate(algos)}
    figure, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), layout="constrained", squeeze=False)
    for axis, (heading, curves) in zip(axes[0], panels):
        for label, (steps, estimate, low, high) in curves.items():
            if not len(steps):
                continue
            axis.fill_between(steps, low, high, color=color[label], alpha=0.2, linewidth=0)
            axis.plot(steps, estimate, color=color[label], linewidth=2, label=label)
        axis.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="the tasks' reference (1)")
        axis.axhline(0.0, color="grey", linestyle=":", linewidth=0.8, label="random policy (0)")
        steps_axis(axis)
        axis.set_xlabel("environment steps")
        axis.set_ylabel("IQM normalized return")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
        if heading:
            axis.set_title(_title(heading, 80), fontsize=9)
    figure.suptitle(_title(title, 80 * len(panels)), fontsize=9)
    return _save(figure, path, svg=True)


def curve_grid(title: str, panels: list, path: Path) -> Path:
    """One panel per task (``curve_grid.Panel``): each algorithm's smoothed mean and band in its
    colour, the same colour in every panel, one legend below; published scores as stars at their
    budget with their spread as an error bar. PNG and SVG."""
    algos = list(dict.fromkeys(algo for panel in panels for algo in panel.lines))
    color = {algo: COLORS[index % len(COLORS)] for index, algo in enumerate(algos)}
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.4 * columns, 3.3 * rows + 0.9), layout="constrained", squeeze=False)
    for axis, panel in zip(axes.flat, panels):
        for algo, drawn in panel.lines.items():
            axis.fill_between(drawn.steps, drawn.low, drawn.high, color=color[algo], alpha=0.18, linewidth=0)
            axis.plot(drawn.steps, drawn.mean, color=color[algo], linewidth=1.8, label=algo)
        for algo, (steps, mean) in panel.published_curves.items():
            axis.plot(steps, mean, color=color.get(algo, "black"), linewidth=1.2, linestyle="--", alpha=0.9)
        for algo, (steps, mean, spread, _) in panel.published.items():
            axis.errorbar(
                [steps],
                [mean],
                yerr=None if spread is None else [[spread], [spread]],
                color=color.get(algo, "black"),
                marker="*",
                markersize=11,
                markeredgecolor="black",
                markeredgewidth=0.6,
                capsize=3,
                linewidth=1,
                clip_on=False,
            )
        seeds = ", ".join(f"{algo} {drawn.seeds}" for algo, drawn in panel.lines.items())
        axis.set_title(f"{panel.task}\nseeds: {seeds}", fontsize=9)
        steps_axis(axis)
        axis.grid(alpha=0.3)
        axis.tick_params(labelsize=8)
    for axis in axes.flat[len(panels) :]:
        axis.set_visible(False)
    for axis in axes[:, 0]:
        axis.set_ylabel("evaluation return", fontsize=9)
    for axis in axes[-1, :]:
        axis.set_xlabel("environment steps", fontsize=9)
    handles = [matplotlib.lines.Line2D([], [], color=color[algo], linewidth=2, label=algo) for algo in algos]
    handles.append(matplotlib.lines.Line2D([], [], color="grey", marker="*", markersize=10, markeredgecolor="black", linestyle="none", label="published score"))
    if any(panel.published_curves for panel in panels):
        handles.append(matplotlib.lines.Line2D([], [], color="grey", linestyle="--", linewidth=1.2, label="published curve (mean over its seeds)"))
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9, frameon=False)
    figure.suptitle(_title(title, 150), fontsize=9)
    return _save(figure, path, svg=True)
