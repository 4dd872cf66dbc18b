"""Seeds planned by power: per cell, how many seeds would decide its verdict at the margin, and
what training them would cost (``verdicts --plan``, ``record --plan``).

A cell that is inconclusive under the verdict rule needs ``Decision.seeds_needed`` seeds (per
side, or of ours against a published source): the count at which, with the observed spreads and
difference taken as true, equivalence or the difference would be shown with 80% power (Colas et
al., 2018). The cost of the missing seeds is priced like ``run --dry-run`` prices a run
(``benchmark.execution.estimate``: finished runs of the same configuration first, then the
calibrated throughput table). A cell already decided needs nothing; a cell no seed count can
decide (one trained agent; a source whose own spread is too wide) says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmark.analysis import verdict_rule
from benchmark.config import RunSpec
from benchmark.execution import estimate


@dataclass(frozen=True)
class PlanRow:
    label: str
    env_id: str
    budget_steps: int
    seeds: int
    """Seeds finished now (ours; parity: per side)."""
    verdict: str
    needed: int | None
    """Seeds for a decision (None: decided already, or no count decides: see ``why``)."""
    why: str
    more: int
    """Runs to train: (needed - seeds) of ours, or per side twice for parity."""
    core_seconds: float | None
    basis: str

    @property
    def needed_text(self) -> str:
        if self.needed is not None:
            return f"{self.needed:,}"
        return self.why


def plan_row(
    label: str, env_id: str, budget_steps: int, seeds: int, decision: verdict_rule.Decision | None, seconds_per_seed: float | None, basis: str, sides: int = 1
) -> PlanRow:
    """The plan of one cell from its decision; ``seconds_per_seed`` prices one seed of every side."""
    if decision is None or decision.label != verdict_rule.INCONCLUSIVE:
        label_text = decision.text if decision is not None else "—"
        why = (
            "decided" if decision is not None and decision.label in (verdict_rule.REPRODUCED, verdict_rule.ABOVE, verdict_rule.BELOW) else "no decision to plan"
        )
        if decision is not None and decision.label in (verdict_rule.ONE_AGENT_CONSISTENT, verdict_rule.ONE_AGENT_OUTSIDE):
            why = "one trained agent: no seed count shows equivalence"
        return PlanRow(label, env_id, budget_steps, seeds, label_text, None, why, 0, 0.0, basis)
    if decision.seeds_needed is None:
        why = f"more than {verdict_rule.MAX_SEEDS:,}" if not decision.needed_for else "no seed count decides (the source's spread)"
        return PlanRow(label, env_id, budget_steps, seeds, decision.text, None, why, 0, None, basis)
    more = max(decision.seeds_needed - seeds, 0) * sides
    cost = None if seconds_per_seed is None else max(decision.seeds_needed - seeds, 0) * seconds_per_seed
    return PlanRow(label, env_id, budget_steps, seeds, decision.text, decision.seeds_needed, f"for {decision.needed_for}", more, cost, basis)


def seconds_per_seed(spec: RunSpec, past: Sequence[estimate.PastRun], table: dict | None = None) -> tuple[float | None, str]:
    """Core-seconds one more seed of ``spec``'s configuration takes, and where the figure comes from."""
    found = estimate.estimate_run(spec, list(past), estimate.load_throughput() if table is None else table, estimate.keys_of(spec, spec.seeds_per_process))
    return found.seconds, found.basis


HEADERS = ["algorithm", "task", "steps", "seeds", "verdict", "seeds needed", "runs to add", "core-hours", "priced from"]


def cells(row: PlanRow) -> list[str]:
    hours = "—" if row.core_seconds is None else f"{row.core_seconds / 3600:,.1f}"
    needed = row.needed_text if row.needed is None else f"{row.needed:,} ({row.why})"
    return [row.label, row.env_id, f"{row.budget_steps:,}", str(row.seeds), row.verdict, needed, str(row.more), hours, row.basis]


def total_text(rows: Sequence[PlanRow]) -> str:
    known = [row.core_seconds for row in rows if row.core_seconds]
    runs = sum(row.more for row in rows)
    unpriced = sum(1 for row in rows if row.more and row.core_seconds is None)
    return f"{runs:,} runs to add, about {sum(known) / 3600:,.1f} core-hours" + (f" ({unpriced} cells not priced)" if unpriced else "")
