"""The record's learning curves as one figure grid per budget: one panel per task, one colour
per algorithm (the same in every panel, one legend), budgets never on one axis.

Each seed's evaluation returns are smoothed by a centered moving average over ``WINDOW``
evaluations (50k steps at the record's 10k-step evaluations; the window shrinks at the ends),
then averaged over seeds; the band is the 95% percentile bootstrap interval of that mean over
seeds (seeds resampled with replacement, ``REPS`` replicates, not clipped: with 3 seeds it is
wide, and shows it). A published score the cell's verdict compared with is a star at its budget
in the algorithm's colour (scored as its source scored it: some are training returns), with the
source's spread over seeds as an error bar where it gives one; a
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


def panels_by_budget(rows: Sequence[Any]) -> dict[int, list[Panel]]:
    """Budget -> one panel per task, in the record's order (rows are ``record.Row``)."""
    found: dict[int, dict[str, Panel]] = {}
    for row in rows:
        panel = found.setdefault(row.steps, {}).setdefault(row.group.env_id, Panel(row.group.env_id))
        drawn = line([r.curve for r in row.finished if r.curve])
        if drawn is not None:
            panel.lines[row.group.label] = drawn
        chosen, sample, decision = row.verdict.published, row.verdict.reference_sample, row.verdict.decision
        if chosen is not None and decision is not None and decision.evidence is not None:
            # the value the verdict used (the source's late-evaluation window where it gives seeds); its spread
            # over seeds only (one agent's is over episodes)
            mean = sample.mean if sample is not None else chosen.mean
            spread = (sample.sd if sample is not None else chosen.spread) if chosen.multi_seed else None
            panel.published[row.group.label] = (chosen.budget_steps or row.steps, mean, spread, chosen.source.split(" (")[0])
    return {steps: list(panels.values()) for steps, panels in sorted(found.items(), reverse=True)}


def paths(rows: Sequence[Any], directory: Path) -> list[Path]:
    """The PNG of each budget's grid (an SVG beside each)."""
    from benchmark.analysis.record_text import steps_text

    return [directory / f"curves_{steps_text(steps)}.png" for steps in panels_by_budget(rows)]


def draw(rows: Sequence[Any], directory: Path) -> list[Path]:
    """Write each budget's grid (PNG and SVG); the PNGs' paths."""
    from benchmark.analysis import plots
    from benchmark.analysis.record_text import steps_text

    written = []
    for (steps, panels), path in zip(panels_by_budget(rows).items(), paths(rows, directory)):
        title = (
            f"{steps_text(steps)} steps: evaluation return, mean over seeds of each seed's curve smoothed over {WINDOW} "
            "evaluations, 95% bootstrap band over seeds; star: the published score each verdict compared with, as its source scored it"
        )
        written.append(plots.curve_grid(title, panels, path))
    return written
