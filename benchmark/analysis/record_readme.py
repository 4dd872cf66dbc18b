"""The record as the README shows it: one compact row per cell (algorithm, task, budget, seeds,
ours with its 95% interval, the published score it was judged against, the verdict with a mark),
one footnote per source saying how it measured, one figure across tasks, and a link to the full
record (``results/record/record.md``: every column, every row's tests, aggregates, parity)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmark.analysis import scores, stats, verdict_rule
from benchmark.analysis.record_text import source_name, steps_text

# Marks every common font carries (DejaVu, Liberation, the system UI fonts): emoji render as boxes
# where no colour-emoji font is installed.
MARKS = {
    verdict_rule.REPRODUCED: "✓",
    verdict_rule.ABOVE: "↑",
    verdict_rule.BELOW: "↓",
    verdict_rule.INCONCLUSIVE: "?",
    verdict_rule.ONE_AGENT_CONSISTENT: "≈",
    verdict_rule.ONE_AGENT_OUTSIDE: "✗",
    verdict_rule.NOT_COMPARABLE: "–",
    verdict_rule.NO_REFERENCE: "–",
}
SUPERSCRIPTS = "¹²³⁴⁵⁶⁷⁸⁹"
HEADERS = ["algo", "task", "steps", "seeds", "ours ± 95% CI", "published", "verdict"]


def plus_minus(values: np.ndarray) -> str:
    """The mean over seeds ± the half-width of its 95% Student-t interval (symmetric, so nothing is lost)."""
    interval = stats.t_interval(values) if len(values) else None
    if interval is None:
        return "—"
    half = (interval.high - interval.low) / 2
    return f"{interval.estimate:,.0f} ± {half:,.0f}" if half > 0 else f"{interval.estimate:,.0f}"


def verdict_text(row: Any) -> str:
    """The verdict with its mark, short enough for one line of the README's table: 'needs 34
    seeds', 'above, within margin', 'not comparable (budget)'; the full words are record.md's."""
    verdict, decision = row.verdict, row.verdict.decision
    label = decision.label if decision is not None else verdict.verdict
    if verdict.verdict == verdict_rule.NOT_COMPARABLE:
        text = "not comparable"  # why: the footnote's source, and record.md's note
    elif label == verdict_rule.INCONCLUSIVE and decision is not None:
        if decision.seeds_needed is not None:
            text = f"needs {decision.seeds_needed:,} seeds"
        else:
            text = "no seed count decides" if decision.needed_for else f"needs over {decision.searched_to:,} seeds"
    elif label in (verdict_rule.ABOVE, verdict_rule.BELOW) and decision is not None:
        text = f"{label}, {decision.margin_position} margin"
    elif label == verdict_rule.ONE_AGENT_CONSISTENT:
        text = "consistent (1 agent)"
    elif label == verdict_rule.ONE_AGENT_OUTSIDE:
        text = "outside (1 agent)"
    else:
        text = verdict.text
    return f"{MARKS.get(label, MARKS.get(verdict.verdict, ''))} {text}".strip()


LEGEND = (
    "✓ reproduced: the 90% interval of the difference lies within ±{margin:g} normalized (random 0, the task's "
    "reference 1) and no difference is shown; ↑/↓ above/below: a difference shown (Welch, Holm over the table), "
    "beyond, within or perhaps within the margin; ? inconclusive: these seeds cannot tell, N seeds would with 80% "
    "power (or no seed count would, against the source's spread); ≈ consistent (1 agent) / ✗ outside (1 agent): "
    "the source is one trained agent, which no seed count can reproduce, and ours lies within / outside its 95% "
    "prediction interval; – not comparable: budget, task version or protocol differ."
)


def footnote_of(row: Any) -> str | None:
    """How the cell's source measured, one line per source and score (None without a source)."""
    published = row.verdict.published
    if published is None:
        return None
    if not published.multi_seed:
        seeds = "one trained agent"
    else:
        seeds = f"{published.n_seeds} seeds" if published.n_seeds else "≥3 seeds"
    version = f"{published.env_version} tasks" if published.env_version else "task version not stated"
    budget = f", {steps_text(published.budget_steps)} steps" if published.budget_steps and published.budget_steps != row.steps else ""
    return f"{source_name(published.source)} ({seeds}, {version}{budget}): {scores.NAMES[row.verdict.score]}"


def table(rows: list[Any]) -> tuple[str, list[str]]:
    """The compact table and its footnotes (each once, numbered in order of first use)."""
    from benchmark.analysis import verdicts

    notes: list[str] = []
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|---|---|---:|---|---|---|"]
    for row in rows:
        values, _, _ = verdicts.our_scores(row.group.records, row.verdict.score, row.steps)
        note = footnote_of(row)
        published = "—"
        if note is not None:
            if note not in notes:
                notes.append(note)
            published = f"{row.verdict.published_value:,.0f}{SUPERSCRIPTS[notes.index(note) % len(SUPERSCRIPTS)]}"
        cells = [
            row.group.label,
            row.group.env_id.removesuffix("-v5"),
            steps_text(row.steps),
            str(len(row.group.scores)),
            plus_minus(values),
            published,
            verdict_text(row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", notes


def markdown(record: Any, figure: Path | None, image_prefix: str, full_record: str) -> str:
    """The README's record block: the table, the sources' footnotes, one figure, the link to the full record."""
    rows = record.rows
    if not rows:
        return "No run of the record has been exported yet.\n"
    body, notes = table(rows)
    runs = sum(len(row.group.scores) for row in rows)
    parts = [
        body,
        LEGEND.format(margin=record.margin) + "\n",
        "\n".join(f"{SUPERSCRIPTS[i % len(SUPERSCRIPTS)]} {note}; ours scored the same way." for i, note in enumerate(notes)) + "\n",
        f"{runs} runs in {len(rows)} cells (tasks: Gymnasium v5); ours: mean over seeds ± the half-width of its 95% t interval, scored as "
        f"the source measured. Every column, each row's test, the aggregates per algorithm, the parity with "
        f"Stable-Baselines3 and the learning curves: [the full record]({full_record}).\n",
    ]
    if figure is not None:
        parts.append(f"![{figure.stem}]({image_prefix}{figure.name})\n")
    return "\n".join(parts)
