"""The table that ends a benchmark: one row per (algorithm, environment), aggregated over seeds."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from benchmark.config import configurations
from benchmark.run_record import RunRecord
from benchmark.tables import TableData


@dataclass
class SummaryRow:
    label: str
    """The algorithm, with the settings that tell its configurations apart when it has several."""
    env_id: str
    seeds: list[int]
    returns: list[float]  # final deterministic evaluation return of each finished seed
    steps_per_second: float | None
    failed: int
    elsewhere: int = 0
    """Seeds another launch is training (not waited for)."""
    algo: str = ""
    budget_steps: int = 0
    env_changed: str = ""
    """The env in words where env_kwargs or wrappers made it (not comparable with a source)."""
    records: list[RunRecord] | None = None
    """The finished seeds' records (what the verdict reads)."""
    verdict: str = "—"
    """The verdict against the published score (``benchmark.analysis.verdicts``), decided with the
    table's other rows; '—' without a finished seed."""

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    @property
    def std(self) -> float | None:
        """The sample standard deviation over seeds (ddof=1, as the report's); None below two seeds."""
        return float(np.std(self.returns, ddof=1)) if len(self.returns) > 1 else None


def summarize(outcomes: Iterable[RunRecord]) -> list[SummaryRow]:
    """One row per configuration (algorithm, environment, hyperparameters, budget: the grid points
    of one experiment stay apart, as in the report), seeds within a row, in first-seen order;
    failed seeds are counted, not averaged."""
    by_key = {outcome.spec.run_key: outcome for outcome in outcomes}
    rows = []
    for label, specs in configurations([outcome.spec for outcome in by_key.values()]):
        members = [by_key[spec.run_key] for spec in specs]
        finished = [m for m in members if m.ok]
        speeds = [m.steps_per_second for m in finished if m.steps_per_second is not None]
        elsewhere = sum(m.status == "CLAIMED" for m in members)
        rows.append(
            SummaryRow(
                label=label,
                env_id=specs[0].env_id,
                seeds=sorted(m.spec.seed for m in members),
                returns=[m.final_return for m in finished if m.final_return is not None],
                records=[m for m in finished if m.final_return is not None],
                steps_per_second=float(np.mean(speeds)) if speeds else None,
                failed=len(members) - len(finished) - elsewhere,
                elsewhere=elsewhere,
                algo=specs[0].algo,
                budget_steps=specs[0].budget.total_steps,
                env_changed="" if specs[0].env.plain else specs[0].env.describe(),
            )
        )
    _judge(rows)
    return rows


def _judge(rows: list[SummaryRow]) -> None:
    """Each row's verdict, the table decided at once (Holm's correction across its rows)."""
    from benchmark.analysis import verdicts

    judged = [row for row in rows if row.returns and row.algo and row.records]
    if not judged:
        return
    cases = [verdicts.Case(row.label, row.algo, row.env_id, row.budget_steps, tuple(row.records or ()), row.env_changed) for row in judged]
    for row, verdict in zip(judged, verdicts.judge_cases(cases)):
        row.verdict = verdict.text


HEADERS = ("algorithm", "environment", "seeds", "final eval return (mean ± sample std over seeds)", "per seed", "steps/s", "vs published")


def cells(row: SummaryRow) -> list[str]:
    """A row's values formatted for display, in HEADERS order."""
    score = "—" if row.mean is None else f"{row.mean:.1f}" + (f" ± {row.std:.1f}" if row.std is not None else "")
    notes = [f"{row.failed} failed"] if row.failed else []
    notes += [f"{row.elsewhere} in another launch"] if row.elsewhere else []
    per_seed = ", ".join(f"{value:.0f}" for value in row.returns) + (f" ({', '.join(notes)})" if notes else "")
    speed = "—" if row.steps_per_second is None else f"{row.steps_per_second:,.0f}"
    return [row.label, row.env_id, str(len(row.seeds)), score, per_seed, speed, row.verdict]


def table(rows: list[SummaryRow], title: str) -> TableData:
    table = TableData(title, list(HEADERS), names={"algorithm", "environment"}, right={"seeds", "steps/s"}, lists={"per seed"})
    for row in rows:
        table.add(*cells(row))
    return table


def to_markdown(rows: list[SummaryRow]) -> str:
    return table(rows, "").markdown()
