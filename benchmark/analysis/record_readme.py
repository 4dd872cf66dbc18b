"""The record as the README shows it: one compact row per cell (algorithm, task, budget, seeds,
ours with its 95% interval, the published score it was judged against, the verdict with a mark),
one footnote per source saying how it measured, one figure across tasks, and a link to the full
record (``results/record/record.md``: every column, every row's tests, aggregates, parity)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmark.analysis import scores, verdict_rule
from benchmark.analysis.record_text import interval_cell, source_name, steps_text

MARKS = {
    verdict_rule.REPRODUCED: "✅",
    verdict_rule.ABOVE: "⬆️",
    verdict_rule.BELOW: "⬇️",
    verdict_rule.INCONCLUSIVE: "❔",
    verdict_rule.ONE_AGENT_CONSISTENT: "≈",
    verdict_rule.ONE_AGENT_OUTSIDE: "✖️",
    verdict_rule.NOT_COMPARABLE: "➖",
    verdict_rule.NO_REFERENCE: "➖",
}
SUPERSCRIPTS = "¹²³⁴⁵⁶⁷⁸⁹"
HEADERS = ["algorithm", "task", "budget", "seeds", "ours [95% CI]", "published", "verdict"]


def verdict_text(row: Any) -> str:
    """The verdict with its mark; 'not comparable' says why in a word or two."""
    verdict = row.verdict
    label = verdict.decision.label if verdict.decision is not None else verdict.verdict
    text = verdict.text
    if verdict.verdict == verdict_rule.NOT_COMPARABLE:
        kinds = dict.fromkeys(part.split(":")[0].strip() for part in verdict.reason.split(";") if part.strip())
        text = f"not comparable ({', '.join(kinds)})" if kinds else "not comparable"
    return f"{MARKS.get(label, MARKS.get(verdict.verdict, ''))} {text}".strip()


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
            sample = row.verdict.reference_sample
            value = sample.mean if sample is not None else row.verdict.published.mean
            published = f"{value:,.0f}{SUPERSCRIPTS[notes.index(note) % len(SUPERSCRIPTS)]}"
        cells = [row.group.label, row.group.env_id, steps_text(row.steps), str(len(row.group.scores)), interval_cell(values), published, verdict_text(row)]
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
        "\n".join(f"{SUPERSCRIPTS[i % len(SUPERSCRIPTS)]} {note}; ours scored the same way." for i, note in enumerate(notes)) + "\n",
        f"{runs} runs in {len(rows)} cells, margin ±{record.margin:g} normalized; ours: mean over seeds with its 95% t interval, "
        f"scored as the source measured. Every column, each row's test, the aggregates per algorithm, the parity with "
        f"Stable-Baselines3 and the learning curves: [the full record]({full_record}).\n",
    ]
    if figure is not None:
        parts.append(f"![{figure.stem}]({image_prefix}{figure.name})\n")
    return "\n".join(parts)
