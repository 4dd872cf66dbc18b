"""The record's learning curves as one figure grid per budget: one panel per task, one colour
per algorithm (the same in every panel, one legend), budgets never on one axis.

Each seed's evaluation returns are smoothed by a centered moving average over ``WINDOW``
evaluations (50k steps at the record's 10k-step evaluations; the window shrinks at the ends),
then averaged over seeds; the band is the 95% percentile bootstrap interval of that mean over
seeds (seeds resampled with replacement, ``REPS`` replicates, not clipped: with 3 seeds it is
wide, and shows it). A published score the cell's verdict compared with is a star at its budget
in the algorithm's colour (scored as its source scored it: some are training returns), with the
source's spread over seeds as an error bar where it gives one, and where the source publishes its
whole curve (Tianshou's 10-seed evaluation curves, ``results/reference/curves.csv``) that curve,
dashed, its mean over seeds; a
published score that is not comparable (another budget, env version or protocol) is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

WINDOW = 5
"""Evaluations in the centered moving average of each seed's curve."""
REPS = 2_000
SEED = 0


@dataclass
class Line:
    """One algorithm's smoothed mean curve on one task, shape (steps,) each."""

    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: int


@dataclass
class Panel:
    task: str
    lines: dict[str, Line] = field(default_factory=dict)
    published: dict[str, tuple[int, float, float | None, str]] = field(default_factory=dict)
    """Algorithm -> (budget steps, mean, standard deviation or None, source) of a comparable published score."""
    published_curves: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """Algorithm -> (steps, mean over seeds) of that source's published curve, where it gives one."""


def smooth(values: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """Centered moving average along the last axis of ``values`` (..., n): each point the mean of
    the ``window`` points around it, fewer at the ends (shape kept)."""
    values = np.asarray(values, dtype=float)
    n, half = values.shape[-1], window // 2
    ends = np.arange(n)
    low, high = np.maximum(ends - half, 0), np.minimum(ends + half + 1, n)
    sums = np.concatenate([np.zeros(values.shape[:-1] + (1,)), np.cumsum(values, axis=-1)], axis=-1)
    return (sums[..., high] - sums[..., low]) / (high - low)


def line(curves: Sequence[Sequence[tuple[int, float]]], window: int = WINDOW, reps: int = REPS, seed: int = SEED) -> Line | None:
    """The smoothed mean over seeds of ``curves`` (each seed's [(step, return), ...]) at the
    steps every seed evaluated, with its 95% bootstrap band; None without a common step."""
    by_step = [dict(curve) for curve in curves if curve]
    if not by_step:
        return None
    steps = sorted(set.intersection(*(set(curve) for curve in by_step)))
    if not steps:
        return None
    values = smooth(np.array([[curve[step] for step in steps] for curve in by_step]), window)  # (seeds, steps)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(by_step), size=(reps, len(by_step)))
    means = values[draws].mean(axis=1)  # (reps, steps)
    low, high = np.percentile(means, [2.5, 97.5], axis=0)
    return Line(np.asarray(steps), values.mean(axis=0), low, high, len(by_step))


@dataclass(frozen=True)
class Cell:
    """One configuration to draw: its budget, task, label, each seed's curve and the published
    score its verdict compared with (budget steps, mean, spread over seeds or None, source)."""

    steps: int
    task: str
    label: str
    curves: list[list[tuple[int, float]]]
    published: tuple[int, float, float | None, str] | None = None
    published_curve: tuple[np.ndarray, np.ndarray] | None = None
    """(steps, mean over seeds) of the compared source's whole curve, up to the budget, where it publishes one."""


def compared_score(verdict: Any, steps: int) -> tuple[int, float, float | None, str] | None:
    """The published score a verdict (``verdicts.Verdict``) compared with, as a star: the value
    it used (the source's late-evaluation window where it gives seeds) and its spread over seeds
    (one agent's spread is over episodes: none); None where the verdict compared nothing."""
    chosen, sample, decision = verdict.published, verdict.reference_sample, verdict.decision
    if chosen is None or decision is None or decision.evidence is None:
        return None
    spread = (sample.sd if sample is not None else chosen.spread) if chosen.multi_seed else None
    return (chosen.budget_steps or steps, verdict.published_value, spread, chosen.source.split(" (")[0])


CURVES = Path(__file__).resolve().parents[2] / "results" / "reference" / "curves.csv"
"""Published whole curves (source URL, env step, mean over seeds): Tianshou's 10-seed CSVs."""


def published_curves(path: Path = CURVES) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Source URL -> (env steps, mean over seeds) of each published curve ``path`` holds."""
    import csv

    if not path.is_file():
        return {}
    found: dict[str, list[tuple[int, float]]] = {}
    with path.open(newline="") as file:
        for row in csv.DictReader(file):
            found.setdefault(row["source_url"], []).append((int(row["env_step"]), float(row["mean"])))
    return {url: (np.array([s for s, _ in sorted(points)]), np.array([m for _, m in sorted(points)])) for url, points in found.items()}


def compared_curve(verdict: Any, steps: int, curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray] | None:
    """The whole published curve of the source a verdict compared with, up to ``steps``; None without one."""
    if compared_score(verdict, steps) is None or verdict.published.source_url not in curves:
        return None
    at, mean = curves[verdict.published.source_url]
    keep = at <= steps
    return (at[keep], mean[keep]) if keep.any() else None


def record_cells(rows: Sequence[Any], curves: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> list[Cell]:
    """The record's rows (``record.Row``) as cells: finished runs only, with the compared source's
    curve where ``curves`` (default: ``published_curves()``) holds it."""
    curves = published_curves() if curves is None else curves
    return [
        Cell(
            row.steps,
            row.group.env_id,
            row.group.label,
            [r.curve for r in row.finished if r.curve],
            compared_score(row.verdict, row.steps),
            compared_curve(row.verdict, row.steps, curves),
        )
        for row in rows
    ]


def panels_by_budget(cells: Sequence[Cell]) -> dict[int, list[Panel]]:
    """Budget (largest first) -> one panel per task, in the cells' order."""
    found: dict[int, dict[str, Panel]] = {}
    for cell in cells:
        panel = found.setdefault(cell.steps, {}).setdefault(cell.task, Panel(cell.task))
        drawn = line(cell.curves)
        if drawn is not None:
            panel.lines[cell.label] = drawn
        if cell.published is not None:
            panel.published[cell.label] = cell.published
        if cell.published_curve is not None:
            panel.published_curves[cell.label] = cell.published_curve
    return {steps: list(panels.values()) for steps, panels in sorted(found.items(), reverse=True)}


def paths(cells: Sequence[Cell], directory: Path) -> list[Path]:
    """The PNG of each budget's grid (an SVG beside each)."""
    from benchmark.analysis.record_text import steps_text

    return [directory / f"curves_{steps_text(steps)}.png" for steps in panels_by_budget(cells)]


def draw(cells: Sequence[Cell], directory: Path) -> list[Path]:
    """Write each budget's grid (PNG and SVG); the PNGs' paths."""
    from benchmark.analysis import plots
    from benchmark.analysis.record_text import steps_text

    written = []
    for (steps, panels), path in zip(panels_by_budget(cells).items(), paths(cells, directory)):
        title = (
            f"{steps_text(steps)} steps: evaluation return, mean over seeds of each seed's curve smoothed over {WINDOW} "
            "evaluations, 95% bootstrap band over seeds; star: the published score each verdict compared with, as its source scored it "
            "(dashed: the source's own mean curve, where it publishes one)"
        )
        written.append(plots.curve_grid(title, panels, path))
    return written
