"""The table that ends a benchmark: one row per (algorithm, environment), aggregated over seeds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
from rich.table import Table

from benchmark.runner import RunOutcome


@dataclass
class SummaryRow:
    algo: str
    env_id: str
    seeds: list[int]
    returns: list[float]  # final deterministic evaluation return of each finished seed
    steps_per_second: float | None
    failed: int

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    @property
    def std(self) -> float | None:
        return float(np.std(self.returns)) if self.returns else None


def summarize(outcomes: Iterable[RunOutcome]) -> list[SummaryRow]:
    """Group outcomes by (algo, env) in first-seen order; failed seeds are counted, not averaged."""
    groups: dict[tuple[str, str], list[RunOutcome]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.spec.algo, outcome.spec.env_id), []).append(outcome)
    rows = []
    for (algo, env_id), members in groups.items():
        finished = [m for m in members if m.ok]
        speeds = [m.steps_per_second for m in finished if m.steps_per_second is not None]
        rows.append(
            SummaryRow(
                algo=algo,
                env_id=env_id,
                seeds=sorted(m.spec.seed for m in members),
                returns=[m.final_return_mean for m in finished if m.final_return_mean is not None],
                steps_per_second=float(np.mean(speeds)) if speeds else None,
                failed=len(members) - len(finished),
            )
        )
    return rows


HEADERS = ("algorithm", "environment", "seeds", "final eval return (mean ± std over seeds)", "per seed", "steps/s")


def cells(row: SummaryRow) -> list[str]:
    """A row's values formatted for display, in HEADERS order."""
    score = "—" if row.mean is None else f"{row.mean:.1f} ± {row.std:.1f}"
    per_seed = ", ".join(f"{value:.0f}" for value in row.returns) + (f" ({row.failed} failed)" if row.failed else "")
    speed = "—" if row.steps_per_second is None else f"{row.steps_per_second:,.0f}"
    return [row.algo, row.env_id, str(len(row.seeds)), score, per_seed, speed]


def render_table(rows: list[SummaryRow], title: str) -> Table:
    table = Table(title=title)
    for header in HEADERS:
        table.add_column(header, justify="right" if header in ("seeds", "steps/s") else "left")
    for row in rows:
        table.add_row(*cells(row))
    return table


def to_markdown(rows: list[SummaryRow]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|---|---:|---:|---|---:|"]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"
