"""A candidate against baselines (``python -m benchmark compare``): is it better, on the tasks
both ran, at the candidate's budget, and by how much across tasks.

Each side is a set of finished runs (a suite's, from the store and bundles, or a bundle's),
grouped into configurations (algorithm and settings, ``report.group_records``). A candidate
configuration with budget B meets a baseline configuration on every task both ran, with the
env made the same way. The baseline is scored at B: its final evaluation when its budget is B;
else its evaluation at step B of its longer run, when nothing in it moves with the fraction of
its budget trained (``Hyperparameters.budget_schedules``: no learning-rate or clip annealing,
no exploration decaying over a fraction of the budget, no PER beta annealed to 1: SAC, TD3 and
DDPG read off their curves like runs of B steps); else not comparable.

Per task: the means over seeds with 95% Student-t intervals, judged by the verdict rule
(``verdict_rule``) with the margin stated in advance (default ±0.2 normalized): ``equivalent``
when the 90% interval of the difference lies inside it and no difference is shown; ``better`` /
``worse`` when Welch's two-sided test rejects after Holm's correction over the tasks of one pair
(beyond, within or across the margin); otherwise
``inconclusive (needs N)``, N seeds a side for a decision at 80% power; capped tasks (CartPole)
compared as success rates. Across tasks, on normalized scores (0: random policy,
1: the task's reference; ``normalizers.normalizer``): IQM, mean, median and optimality gap with
95% stratified-bootstrap intervals, the probability of improvement P(candidate > baseline) and
performance profiles, after Agarwal et al. (2021).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agents.errors import ConfigError
from agents.registry import known_config
from benchmark.analysis import plots, reference, stats, verdict_rule, verdicts
from benchmark.analysis.document import Document
from benchmark.analysis.normalizers import normalizer as fixed_normalizer
from benchmark.analysis.report import Group, group_records, interval_text, number_text
from benchmark.run_record import RunRecord

ALPHA = 0.05
AGGREGATE_REPS = 20_000
OUTCOMES = ("equivalent", "better", "worse", "inconclusive", "not tested")
WORDS = {verdict_rule.REPRODUCED: "equivalent", verdict_rule.ABOVE: "better", verdict_rule.BELOW: "worse", verdict_rule.INCONCLUSIVE: "inconclusive"}
"""The rule's labels as a comparison of two configurations says them."""


@dataclass
class Scored:
    """One configuration's seeds on one task at a budget."""

    label: str
    env_id: str
    scores: np.ndarray
    how: str
    """'final evaluation' or where on a longer run's curve the scores were read."""

    @property
    def interval(self) -> stats.Interval | None:
        return stats.t_interval(self.scores) if len(self.scores) >= 2 else None


@dataclass
class TaskResult:
    env_id: str
    candidate: Scored
    baseline: Scored | None
    difference: float | None = None
    p_value: float | None = None
    outcome: str = "not tested"
    """One of ``OUTCOMES``."""
    outcome_text: str = "not tested"
    """As tables print it: 'inconclusive (needs 12)', 'better, beyond the margin'."""
    reason: str = ""
    """Why not tested, or which test."""


@dataclass
class PairResult:
    """A candidate configuration against one baseline configuration."""

    candidate: str
    baseline: str
    budget: int
    tasks: list[TaskResult] = field(default_factory=list)
    aggregates: dict[str, dict[str, stats.Interval]] = field(default_factory=dict)
    """Side label -> metric -> interval, on the normalized scores of the tasks both have."""
    improvement: stats.Interval | None = None
    """P(candidate > baseline) on those tasks."""
    normalized: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def tested(self) -> list[TaskResult]:
        return [task for task in self.tasks if task.baseline is not None and task.outcome != "not tested"]


def score_at(record: RunRecord, budget: int) -> float | None:
    """The run's evaluation at env step ``budget``: its final one when that is its budget, else
    the evaluation its curve holds at that step (None when it holds none)."""
    if record.spec.budget.total_steps == budget:
        return record.final_return
    return next((value for step, value in record.curve if step == budget), None)


def budget_schedules(group: Group) -> list[str] | None:
    """The configuration's settings that move with the fraction of its budget trained
    (``Hyperparameters.budget_schedules``); None when its algorithm is not installed here."""
    spec = group.records[0].spec
    config = known_config(spec.algo)
    if config is None:
        return None
    try:
        return config.from_dict(spec.hyperparameters).budget_schedules()
    except ConfigError:
        return None


def scored(group: Group, budget: int) -> tuple[Scored | None, str]:
    """The group's finished seeds scored at ``budget``, or None and why not."""
    finished = [record for record in group.records if record.finished]
    own = group.records[0].spec.budget.total_steps
    if own < budget:
        return None, f"its budget is {own:,} steps, less than {budget:,}"
    schedules = budget_schedules(group) if own > budget else []
    if schedules is None:
        return None, f"its algorithm {group.algo} is not installed here: whether its {own:,}-step run depends on its budget is unknown"
    if schedules:
        return None, f"its {own:,}-step run moves {', '.join(schedules)} with its budget: its curve at {budget:,} is not a {budget:,}-step run"
    values = [score_at(record, budget) for record in finished]
    values = [value for value in values if value is not None]
    if not values:
        return None, f"no evaluation at {budget:,} steps on its curves"
    how = "final evaluation" if own == budget else f"evaluation at {budget:,} of its {own:,} steps"
    return Scored(group.label, group.env_id, np.array(values, dtype=float), how), ""


def compare(
    candidate: list[RunRecord],
    baseline: list[RunRecord],
    algos: list[str] | None = None,
    reference_dir: Path = reference.REFERENCE_DIR,
    margin: float = verdict_rule.DEFAULT_MARGIN,
) -> list[PairResult]:
    """Every candidate configuration against every baseline configuration (of ``algos`` only,
    where given) that shares a task with it."""
    candidate_groups = [group for group in group_records(candidate) if any(record.finished and record.final_return is not None for record in group.records)]
    baseline_groups = [group for group in group_records(baseline) if algos is None or group.algo in algos]
    normalizers = {env: fixed_normalizer(env, reference_dir) for env in {g.env_id for g in candidate_groups}}
    clash = {group.label for group in candidate_groups} & {group.label for group in baseline_groups}  # told apart everywhere
    pairs: dict[tuple[str, str, int], PairResult] = {}
    for mine in candidate_groups:
        budget = mine.records[0].spec.budget.total_steps
        ours, _ = scored(mine, budget)
        if ours is None:  # finished seeds without a final evaluation: nothing to compare
            continue
        for theirs in baseline_groups:
            if theirs.env_id != mine.env_id:
                continue
            names = (_told_apart(mine.label, clash, "candidate"), _told_apart(theirs.label, clash, "baseline"))
            pair = pairs.setdefault((*names, budget), PairResult(*names, budget))
            task = TaskResult(mine.env_id, ours, None)
            if _env_settings(theirs) != _env_settings(mine):
                task.reason = "the envs are made differently (env_kwargs or wrappers)"
            else:
                task.baseline, task.reason = scored(theirs, budget)
            pair.tasks.append(task)
    for pair in pairs.values():
        _test(pair, margin, reference_dir)
        _aggregate(pair, normalizers)
    return list(pairs.values())


def _told_apart(label: str, clash: set[str], side: str) -> str:
    return f"{label} ({side})" if label in clash else label


def _env_settings(group: Group) -> tuple[str, str]:
    spec = group.records[0].spec
    return repr(sorted(spec.env_kwargs.items())), repr(spec.wrappers)


def _test(pair: PairResult, margin: float, reference_dir: Path) -> None:
    """Each task of the pair decided by the verdict rule, Holm's correction over the pair's tasks."""
    testable = [task for task in pair.tasks if task.baseline is not None and len(task.candidate.scores) >= 2 and len(task.baseline.scores) >= 2]
    for task in pair.tasks:
        if task.baseline is not None and task not in testable:
            task.reason = f"{min(len(task.candidate.scores), len(task.baseline.scores))} seed(s) on one side: the test needs 2"
    rows = [verdicts.seeds_row(task.env_id, task.candidate.scores, task.baseline.scores, margin, reference_dir) for task in testable]  # type: ignore[union-attr]
    for task, decision in zip(testable, verdict_rule.decide(rows)):
        assert decision.evidence is not None
        task.difference, task.p_value = float(np.mean(task.candidate.scores) - np.mean(task.baseline.scores)), decision.evidence.p_value  # type: ignore[union-attr]
        task.outcome = WORDS[decision.label]
        task.outcome_text = task.outcome + decision.text[len(decision.label) :]
        task.reason = decision.explanation()


def _aggregate(pair: PairResult, normalizers: dict[str, reference.Normalizer]) -> None:
    mine: dict[str, np.ndarray] = {}
    theirs: dict[str, np.ndarray] = {}
    for task in pair.tasks:
        normalizer = normalizers[task.env_id]
        if task.baseline is not None and normalizer.available:
            mine[task.env_id], theirs[task.env_id] = normalizer(task.candidate.scores), normalizer(task.baseline.scores)
    if not mine:
        return
    pair.normalized = {pair.candidate: mine, pair.baseline: theirs}
    pair.aggregates = {label: stats.aggregate_intervals(scores, reps=AGGREGATE_REPS) for label, scores in pair.normalized.items()}
    pair.improvement = stats.probability_of_improvement_interval(mine, theirs)


# ------------------------------------------------------------------------------------ the report


def _with_interval(side: Scored | None) -> str:
    if side is None:
        return "—"
    interval = side.interval  # its estimate is the mean
    return f"{interval_text(interval) if interval else number_text(float(np.mean(side.scores)))} ({len(side.scores)})"


def task_rows(pairs: list[PairResult]) -> list[list[str]]:
    """One row per task of each pair: candidate, baseline, task, budget, both sides with their
    intervals and seeds, the difference, the outcome and the test (or why none)."""
    rows = []
    for pair in pairs:
        for task in pair.tasks:
            rows.append(
                [
                    pair.candidate,
                    pair.baseline,
                    task.env_id,
                    f"{pair.budget:,}",
                    _with_interval(task.candidate),
                    _with_interval(task.baseline) + (f"; {task.baseline.how}" if task.baseline and task.baseline.how != "final evaluation" else ""),
                    number_text(task.difference),
                    task.outcome_text,
                    task.reason,
                ]
            )
    return rows


TASK_HEADERS = ["candidate", "baseline", "task", "steps", "candidate [95% CI] (seeds)", "baseline [95% CI] (seeds)", "difference", "outcome", "test"]
AGGREGATE_HEADERS = ["candidate", "baseline", "tasks", "candidate IQM [95% CI]", "baseline IQM [95% CI]", "P(candidate > baseline) [95% CI]"]


def aggregate_rows(pairs: list[PairResult]) -> list[list[str]]:
    rows = []
    for pair in pairs:
        if not pair.aggregates:
            rows.append([pair.candidate, pair.baseline, "0", "—", "—", "— (no task with scores on both sides and a normalization)"])
            continue
        iqm = {label: pair.aggregates[label]["IQM"] for label in (pair.candidate, pair.baseline)}
        improvement = pair.improvement
        assert improvement is not None  # set with the aggregates
        rows.append(
            [
                pair.candidate,
                pair.baseline,
                str(len(pair.normalized[pair.candidate])),
                *(interval_text(interval, 2) for interval in iqm.values()),
                interval_text(improvement, 2),
            ]
        )
    return rows


def write(pairs: list[PairResult], out_dir: Path, title: str, description: str) -> Path:
    """report.md, report.html and plots/ of the comparison under ``out_dir``; report.md's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = Document()
    doc.heading(1, title)
    doc.paragraph(description)
    doc.paragraph(
        "A baseline is scored at the candidate's budget: its final evaluation when its budget is the same, else its evaluation "
        "at that step of a longer run when nothing in it depends on its budget (no annealing, no exploration decaying over a "
        "fraction of the budget), else it is not compared. Per task: means over seeds with 95% Student-t intervals, judged by "
        "one rule with its margin stated in advance: equivalent when the 90% interval of the difference lies within the margin "
        "and no difference is shown; "
        f"better or worse when Welch's two-sided test rejects after Holm's correction over the tasks of each pair at α = {ALPHA}; "
        "otherwise inconclusive, with the seeds a side that would decide at 80% power. Across tasks, on normalized scores (0: a random policy, 1: the task's "
        "reference score): IQM, mean, median and optimality gap with 95% stratified-bootstrap intervals, the probability of "
        "improvement P(candidate > baseline) and performance profiles (Agarwal et al., 2021)."
    )
    doc.heading(2, "Per task")
    doc.table(TASK_HEADERS, task_rows(pairs))
    counts = {outcome: sum(task.outcome == outcome for pair in pairs for task in pair.tasks) for outcome in OUTCOMES}
    doc.paragraph("Outcomes: " + ", ".join(f"{count} {outcome}" for outcome, count in counts.items() if count) + ".")
    doc.heading(2, "Across tasks (normalized scores)")
    doc.table(AGGREGATE_HEADERS, aggregate_rows(pairs))
    for index, pair in enumerate(pair for pair in pairs if pair.aggregates):
        metrics = list(next(iter(pair.aggregates.values())))
        doc.heading(3, f"{pair.candidate} against {pair.baseline} at {pair.budget:,} steps")
        rows = [[label, *(interval_text(intervals[m], 2) for m in metrics)] for label, intervals in pair.aggregates.items()]
        doc.table(["configuration", *(f"{m} [95% CI]" for m in metrics)], rows)
        plot_dir = out_dir / "plots"
        doc.image(f"plots/{plots.aggregate_intervals(pair.aggregates, plot_dir / f'aggregates-{index}.png').name}", "aggregate intervals")
        highest = max(float(np.max(values)) for side in pair.normalized.values() for values in side.values())
        thresholds = np.linspace(0.0, max(1.25, highest * 1.05), 81)
        profiles = {label: stats.performance_profile(scores, thresholds) for label, scores in pair.normalized.items()}
        doc.image(f"plots/{plots.performance_profiles(profiles, thresholds, plot_dir / f'profiles-{index}.png').name}", "performance profiles")
    markdown = out_dir / "report.md"
    for path, text in ((markdown, doc.markdown()), (out_dir / "report.html", doc.html(title, base=out_dir))):
        partial = path.with_name(f".{path.name}.partial")  # a crash leaves the previous report whole
        partial.write_text(text)
        partial.replace(path)
    return markdown
