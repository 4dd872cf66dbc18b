"""The record as text and figures: its tables (per cell, per algorithm, parity), every row's tests
and notes, and one learning-curve figure per task (``benchmark.analysis.record`` collects it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmark.analysis import scores, stats, verdict_rule

SCORE_SHORT = {scores.FINAL: "final eval", scores.LATE: "last 10% of evals", scores.TRAIN100: "last 100 train episodes"}


def steps_text(steps: int) -> str:
    return f"{steps / 1e6:g}M" if steps >= 1_000_000 else f"{steps / 1e3:g}k"


def _number(value: float) -> str:
    return f"{value:,.0f}"


def interval_cell(values: np.ndarray) -> str:
    if len(values) < 2:
        return _number(float(np.mean(values))) if len(values) else "—"
    interval = stats.t_interval(values)
    return f"{interval.estimate:,.0f} [{interval.low:,.0f}, {interval.high:,.0f}]"


def source_name(source: str) -> str:
    return source.split(" (")[0].replace(" MuJoCo benchmark curves", "").replace(" benchmark.md", "").replace(" docs", "")


def published_cell(row: Any) -> str:
    """What the verdict compared: the source's value under the verdict's score, its seeds, source and version."""
    verdict = row.verdict
    published = verdict.published
    if published is None:
        return "none found"
    seeds = f"{published.n_seeds} seed{'s' if published.n_seeds != 1 else ''}" if published.n_seeds else "seeds not stated"
    where = f"{source_name(published.source)}, {published.env_id}, {seeds}"
    if published.budget_steps and published.budget_steps != verdict.budget_steps:
        where += f", {steps_text(published.budget_steps)} steps"
    return f"{verdict.published_value:,.0f} ({where})"


def difference_cell(row: Any) -> str:
    """The difference in normalized units with its 90% interval (what the margin bounds)."""
    decision = row.verdict.decision
    if decision is None or decision.evidence is None or decision.margin is None:
        return "—"
    evidence, scale = decision.evidence, decision.margin.scale
    return f"{evidence.difference / scale:+.2f} [{evidence.low / scale:+.2f}, {evidence.high / scale:+.2f}]"


def verdict_cell(row: Any) -> str:
    verdict = row.verdict
    if verdict.verdict == verdict_rule.NOT_COMPARABLE:
        kinds = dict.fromkeys(part.split(":")[0].strip() for part in verdict.reason.split(";") if part.strip())
        return f"**not comparable** ({', '.join(kinds)})" if kinds else "**not comparable**"
    return f"**{verdict.text}**"


def collapse_cell(row: Any) -> str:
    """Seeds collapsed (normalized final score < 0.2 where the cell's median is > 0.5), with a 95% Wilson interval."""
    from benchmark.analysis import verdicts

    if not row.normalizer.available:
        return "—"
    found = verdicts.collapsed(row.normalizer(row.group.scores))
    if found is None:
        return "— (median ≤ 0.5)"
    low, high = verdict_rule.wilson_interval(*found)
    return f"{found[0]}/{found[1]} [{low:.2f}, {high:.2f}]"


def code_cell(row: Any) -> str:
    code = row.code
    commits = code["commits"]
    head = commits[0] if len(commits) == 1 else f"{len(commits)} commits"
    if code["mixed"]:
        return f"{head}, **mixed code** ({' / '.join('+'.join(c) for c in code['classes'])})"
    if code["unknown"]:
        return f"{head} (fingerprint unknown for {code['unknown']})"
    return f"{head}, same code" if len(commits) > 1 else head


CELL_HEADERS = [
    "algorithm",
    "task",
    "steps",
    "seeds",
    "score",
    "ours [95% CI]",
    "published",
    "difference, normalized [90% CI; one agent: 95% PI]",
    "verdict",
    "collapsed",
    "code",
]


def cell_table(rows: list[Any]) -> str:
    from benchmark.analysis import verdicts

    lines = ["| " + " | ".join(CELL_HEADERS) + " |", "|" + "---|" * len(CELL_HEADERS)]
    for row in rows:
        values, kind, _ = verdicts.our_scores(row.group.records, row.verdict.score, row.steps)
        lines.append(
            "| "
            + " | ".join(
                [
                    row.group.label,
                    row.group.env_id,
                    steps_text(row.steps),
                    str(len(row.group.scores)),
                    SCORE_SHORT[kind],
                    interval_cell(values),
                    published_cell(row),
                    difference_cell(row),
                    verdict_cell(row),
                    collapse_cell(row),
                    code_cell(row),
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


AGGREGATE_HEADERS = [
    "algorithm",
    "steps",
    "tasks",
    "ours: IQM [95% CI]",
    "reference: IQM [95% CI]",
    "difference [90% CI]",
    "P(ours > reference) [95% CI]",
    "verdict",
]


def _iv(interval: stats.Interval, signed: bool = False) -> str:
    form = "{:+.2f}" if signed else "{:.2f}"
    return f"{form.format(interval.estimate)} [{form.format(interval.low)}, {form.format(interval.high)}]"


def aggregate_row(found: Any, name: str, steps: str) -> str:
    decision = found.decision
    cells = [
        name,
        steps,
        str(len(found.tasks)),
        _iv(found.ours_iqm),
        _iv(found.reference_iqm),
        _iv(found.difference, signed=True),
        _iv(found.improvement),
        f"**{decision.text}**" if decision is not None else "—",
    ]
    return "| " + " | ".join(cells) + " |"


def aggregate_table(aggregates: list[Any]) -> str:
    lines = ["| " + " | ".join(AGGREGATE_HEADERS) + " |", "|" + "---|" * len(AGGREGATE_HEADERS)]
    lines += [aggregate_row(found, found.label, steps_text(found.budget) if found.budget else "each cell's") for found in aggregates]
    return "\n".join(lines) + "\n"


def row_notes(record: Any) -> str:
    """Every row's tests, scores and provenance, and every aggregate's, as a list."""
    from benchmark.analysis import verdicts

    lines = []
    for row in record.rows:
        verdict = row.verdict
        finals = row.group.scores
        late = [scores.late(r.curve, row.steps) for r in row.finished]
        parts = [f"final evaluation {interval_cell(finals)}"]
        if all(value is not None for value in late):
            parts.append(f"last 10% of evaluations {interval_cell(np.array(late, dtype=float))}")
        windows = [verdicts.train_window(r) for r in row.finished]
        if all(window is not None for window in windows):
            parts.append(f"last 100 training episodes {interval_cell(np.array([w.mean for w in windows if w is not None]))}")
        parts += [part for part in (verdict.test, verdict.reason) if part]
        if verdict.published is not None:
            parts.append(f"source: {verdict.published.citation} <{verdict.published.source_url}>")
        code = row.code
        parts.append(f"trained at {', '.join(code['commits'])}" + (f"; fingerprint classes {code['classes']}" if code["classes"] else ""))
        lines.append(f"- **{row.group.label} {row.group.env_id} {steps_text(row.steps)}** ({verdict.text}): " + "; ".join(parts))
    for found in record.aggregates + ([record.parity_aggregate] if record.parity_aggregate is not None else []):
        if found.decision is not None:
            lines.append(f"- **{found.label} across {', '.join(found.tasks)}** ({found.decision.text}): {found.decision.explanation()}")
    return "\n".join(lines) + "\n"


def markdown(
    record: Any,
    images: list[Path],
    image_prefix: str,
    notes: bool = False,
    profile_images: list[Path] | None = None,
    aggregate_images: list[Path] | None = None,
) -> str:
    """The record as markdown; images are linked as ``image_prefix + file name``; with notes,
    every row's tests (record.md)."""
    from benchmark.analysis import parity_records, verdicts

    rows = record.rows
    judged = [row.verdict for row in rows]
    runs = sum(len(row.group.scores) for row in rows)
    tested = sum(1 for verdict in judged if verdict.decision is not None and verdict.decision.evidence is not None)
    parts = [
        f"{runs} runs in {len(rows)} cells, read from the bundles under `results/published/` (`mujoco`, `mujoco_300k`). "
        f"Each cell is judged against the same algorithm's published score, both scored as the source measured, by one rule "
        f"stated in advance (docs/results.md, Reproduction verdicts): **reproduced** when the 90% interval of the difference "
        f"lies within ±{record.margin:g} normalized (random 0, the task's reference 1) and no difference is shown; **above**/"
        f"**below** when Welch's test rejects after Holm's correction over the {tested} tested cells (beyond, within or across "
        f"the margin); otherwise **inconclusive (needs N seeds)**; against "
        f"one trained agent never reproduced. Verdicts: {verdicts.counts_text(judged) or 'none yet'}.\n",
        cell_table(rows) if rows else "No run of the record has been exported yet.\n",
    ]
    if record.aggregates:
        parts += [
            "\nPer algorithm, across its compared tasks: IQM of normalized scores, runs pooled over tasks as rliable pools "
            "them (a task with more seeds weighs more until every cell has its 10), stratified bootstrap (the reference "
            "resampled from its seeds, or parametrically from its mean and spread), judged by the same rule:\n",
            aggregate_table(record.aggregates),
        ]
    if record.parity_rows:
        parts += [
            "\nOurs against Stable-Baselines3 (sb3-contrib for TRPO) at identical settings, each side's final return scored by "
            "the same protocol, the same rule (Holm over the table; CartPole as success rates) (`python -m benchmark parity`; "
            "records in `results/parity/`):\n",
            parity_records.markdown(record.parity_rows),
        ]
        if record.parity_aggregate is not None:
            parts += ["\nAcross the parity cells (each cell a task, normalized; both sides resampled):\n", aggregate_table([record.parity_aggregate])]
    if notes:
        parts += ["\n## Every row's tests\n", row_notes(record)]
    if aggregate_images:
        parts += [
            "\n## Algorithms across tasks, per budget\n",
            "rliable's figures (`benchmark/analysis/aggregate_figures.py`): per budget, the algorithms on the tasks they all "
            "ran, each run's final evaluation normalized (random 0, the task's fixed reference 1); IQM, mean, median and "
            "optimality gap with 95% stratified-bootstrap intervals; performance profiles; P(X > Y) between algorithms and "
            "against each one's published scores; IQM against steps. SVG beside each PNG.\n",
            " ".join(f"![{path.stem}]({image_prefix}{path.name})" for path in aggregate_images) + "\n",
        ]
    if profile_images:
        parts += ["\n## Performance profiles per algorithm\n", " ".join(f"![{path.stem}]({image_prefix}{path.name})" for path in profile_images) + "\n"]
    if images:
        parts.append("\n" + " ".join(f"![{path.stem}]({image_prefix}{path.name})" for path in images) + "\n")
    return "\n".join(parts)


def profile_paths(record: Any, directory: Path) -> list[tuple[Any, Path]]:
    """Each aggregate with the path of its performance-profile figure (ours against the reference)."""
    found = list(record.aggregates) + ([record.parity_aggregate] if record.parity_aggregate is not None else [])
    names = [f"profile_{aggregate.label.replace(' ', '_')}_{steps_text(aggregate.budget) if aggregate.budget else 'parity'}.png" for aggregate in found]
    return [(aggregate, directory / name) for aggregate, name in zip(found, names)]


def profiles(record: Any, directory: Path) -> list[Path]:
    """One performance-profile figure per aggregate: the fraction of runs above each normalized
    score, ours and the reference's, with 95% bootstrap bands (rliable's profiles)."""
    from benchmark.analysis import plots

    paths = []
    for aggregate, path in profile_paths(record, directory):
        sides = {f"{aggregate.label} (ours)": aggregate.profiles["ours"], "reference" if aggregate.budget else "SB3": aggregate.profiles["reference"]}
        paths.append(plots.performance_profiles(sides, aggregate.thresholds, path))
    return paths
