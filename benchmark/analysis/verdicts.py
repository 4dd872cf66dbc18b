"""Reproduction verdicts: did our seeds reproduce the published score of the same algorithm on
the task, within a margin stated in advance?

For each configuration (algorithm, environment, hyperparameters, budget) with finished seeds,
the algorithm's own published score is chosen from ``results/reference/scores.csv``: a
comparable one first (below), then one measured over several seeds (a final evaluation or
training returns over >= 3 seeds before a single trained agent), then like protocol (a final
evaluation, as ours; then training returns; then values read off plots; the maximum over
training last), then the closest budget, then the same env version, then more seeds.

Each side is scored as the source measured (``benchmark.analysis.scores``): against training
returns, the mean of each run's last 100 training episodes; against a source whose per-seed
curves we hold (``per_seed.csv``), the mean of the evaluations in the last 10% of the budget on
both sides; otherwise the final evaluation. The table is then decided by the verdict rule
(``benchmark.analysis.verdict_rule``): the margin (default ±0.2 in the task's normalized units,
``normalizers.csv``) is stated before looking and printed with every verdict;
**reproduced** when the 90% interval of (ours - published) lies inside it and no difference is
shown; **above** / **below** when Welch's test rejects after Holm's correction across the table
(beyond, within or across the margin); **inconclusive
(needs N)** otherwise; against one trained agent (RL Zoo) never reproduced: **consistent with
one agent** or **outside one agent's interval**. **Not comparable** when the budget differs
more than ``BUDGET_RATIO`` times (or the source does not state it), the source reports the
maximum over training, the env version changed the reward (Ant and Humanoid: contact costs;
CartPole: the episode cap), the env was made with other settings, or fewer than 2 seeds finished.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmark.analysis import normalizers, reference, scores, verdict_rule
from benchmark.analysis.reference import ReferenceScore
from benchmark.analysis.verdict_rule import Decision, Margin, Sample
from benchmark.run_record import RunRecord
from benchmark.tables import plural

ALPHA = verdict_rule.ALPHA
BUDGET_RATIO = 2.0
"""A published budget more than this many times ours (or less than 1/this) is not comparable."""
PROTOCOL_ORDER = ("final_eval", "training_return", "approx_plot", "max_eval")
SAME_REWARD_ACROSS_VERSIONS = frozenset(
    {"HalfCheetah", "Hopper", "Walker2d", "Swimmer", "InvertedPendulum", "Reacher", "Pendulum", "Acrobot", "MountainCar", "MountainCarContinuous"}
)
"""Tasks whose reward and episode length are the same in every version the sources ran (gym
v1-v4) and the one we run; for others (Ant, Humanoid: contact costs changed in v4/v5; CartPole:
200 steps in v0, 500 in v1) a different version is not comparable."""
VERDICTS = verdict_rule.LABELS
COLLAPSE_BELOW = 0.2
COLLAPSE_MEDIAN_ABOVE = 0.5
"""A seed collapsed when its normalized final score is below 0.2 while its cell's median is above 0.5."""


@dataclass(frozen=True)
class Ours:
    mean: float
    std: float
    """Sample standard deviation over seeds (ddof=1; 0 for one seed)."""
    n: int


@dataclass
class Verdict:
    label: str
    """The configuration (algorithm, and what sets it apart)."""
    algo: str
    env_id: str
    budget_steps: int
    verdict: str
    """One of ``VERDICTS``."""
    ours: Ours | None
    """Our seeds, by the score the verdict used."""
    published: ReferenceScore | None
    test: str = ""
    """The tests made, their figures and the margin."""
    reason: str = ""
    """Why not comparable, or what to bear in mind (env version, protocol, approximate value)."""
    score: str = scores.FINAL
    """The score both sides were judged by (``benchmark.analysis.scores``)."""
    decision: Decision | None = None
    reference_sample: Sample | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The verdict as tables print it: 'inconclusive (needs 14)', 'below, beyond the margin'."""
        return self.decision.text if self.decision is not None else self.verdict

    @property
    def margin(self) -> Margin | None:
        return self.decision.margin if self.decision is not None else None

    @property
    def published_value(self) -> float | None:
        """The published value the verdict compared with: the mean of the source's sample as
        scored (its late-evaluation window where it gives seeds), else its stated mean."""
        if self.reference_sample is not None:
            return self.reference_sample.mean
        return self.published.mean if self.published is not None else None


@dataclass(frozen=True)
class Case:
    """One configuration to judge: its finished runs and how its env was made."""

    label: str
    algo: str
    env_id: str
    budget_steps: int
    records: tuple[RunRecord, ...]
    env_changed: str = ""
    """The env in words where env_kwargs or wrappers made it (then no source ran the same task)."""


def _spread_over_seeds(score: ReferenceScore) -> float | None:
    """The published standard deviation over seeds (ddof=1), when the source gives one."""
    if score.spread is None or score.n_seeds is None or score.n_seeds < 2:
        return None
    text = score.spread_kind.lower()
    if "episode" in text or "ci" in text.split() or "[low, high]" in text:
        return None
    if "ddof=0" in text or "ddof 0" in text:
        return score.spread * math.sqrt(score.n_seeds / (score.n_seeds - 1))
    return score.spread


def choose_published(algo: str, env_id: str, budget_steps: int, scores_table: tuple[ReferenceScore, ...]) -> ReferenceScore | None:
    """The algorithm's published score most comparable with ours (see the module docstring)."""
    family, version = reference.env_family(env_id), reference.env_version(env_id)
    candidates = [s for s in scores_table if s.env == family and s.algorithm == algo and s.protocol in PROTOCOL_ORDER]
    if not candidates:
        return None

    def rank(score: ReferenceScore) -> tuple:
        budget_gap = abs(math.log(score.budget_steps / budget_steps)) if score.budget_steps else math.inf
        measured = score.protocol in ("final_eval", "training_return")
        tier = (0 if score.multi_seed else 1) if measured else 2
        return (
            bool(not_comparable_reason(budget_steps, env_id, score)),
            tier,
            PROTOCOL_ORDER.index(score.protocol),
            budget_gap,
            score.env_version != version,
            -(score.n_seeds or 0),
            score.approximate,
        )

    return min(candidates, key=rank)


def not_comparable_reason(ours_budget: int, env_id: str, published: ReferenceScore) -> str:
    """Why ours and ``published`` cannot be compared ('' when they can)."""
    reasons = []
    if published.protocol == "max_eval":
        reasons.append("the source reports the maximum over training, optimistic by construction")
    if not published.budget_steps:
        reasons.append("budget: the source does not state it")
    else:
        ratio = published.budget_steps / ours_budget
        if ratio > BUDGET_RATIO or ratio < 1 / BUDGET_RATIO:
            reasons.append(f"budget: {ours_budget:,} steps here, {published.budget_steps:,} in the source")
    family, version = reference.env_family(env_id), reference.env_version(env_id)
    if published.env_version and version and published.env_version != version and family not in SAME_REWARD_ACROSS_VERSIONS:
        reasons.append(f"env version: {family}-{version} here, {family}-{published.env_version} in the source (the reward or episode cap differ)")
    return "; ".join(reasons)


# ------------------------------------------------------------------------------------ the two sides


def reference_sample(published: ReferenceScore, kind: str, per_seed: dict | None = None) -> Sample:
    """The source's side, scored by ``kind``: its seeds' values where ``per_seed.csv`` holds them,
    else its mean with its spread over seeds (ddof=1) and seed count, else its mean alone."""
    seeds = reference.per_seed_of(published, per_seed)
    budget = published.budget_steps or 0
    if seeds and kind in (scores.FINAL, scores.LATE):
        values = [scores.late(curve, budget) if kind == scores.LATE else dict(curve).get(budget) for curve in seeds.values()]
        if all(value is not None for value in values):
            return Sample.of([float(value) for value in values])  # type: ignore[arg-type]
    return Sample.summary(published.mean, _spread_over_seeds(published), published.n_seeds or 1)


def our_scores(records: Sequence[RunRecord], kind: str, budget: int) -> tuple[np.ndarray, str, str]:
    """Our finished seeds scored by ``kind``: (values, the kind used, a note). Where a run lacks
    what ``kind`` needs, every seed falls back to the final evaluation and the note says why."""
    finished = [r for r in records if r.finished]
    finals = np.array([r.final_return for r in finished], dtype=float)
    if kind == scores.LATE:
        values = [scores.late(r.curve, budget) for r in finished]
        if finished and all(v is not None for v in values):
            return np.array(values, dtype=float), scores.LATE, ""
        return finals, scores.FINAL, "ours: final evaluation (a run without its curve's last 10%)"
    if kind == scores.TRAIN100:
        windows = [train_window(r) for r in finished]
        if finished and all(w is not None for w in windows):
            approximate = [w for w in windows if w is not None and not w.exact]
            note = ""
            if approximate:
                counts = sorted({w.episodes for w in approximate})
                span = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"
                covered = f"the last {span} episodes" if counts[0] else "the last evaluation interval's episodes"
                note = (
                    f"ours: {len(approximate)} of {len(windows)} seeds' training returns read from whole evaluation intervals "
                    f"({covered}, not exactly the last 100: these runs did not record them)"
                )
            return np.array([w.mean for w in windows if w is not None], dtype=float), scores.TRAIN100, note
        return finals, scores.FINAL, "source: returns of training episodes; ours: final evaluation (no training returns recorded)"
    return finals, scores.FINAL, ""


def train_window(record: RunRecord) -> scores.TrainWindow | None:
    """A run's last 100 training episodes: as it recorded them, else from its curve's intervals."""
    if record.train_last100 is not None:
        return scores.TrainWindow(record.train_last100[0], record.train_last100[1], exact=True)
    if record.train_intervals:
        return scores.window_from_intervals(record.train_intervals)
    if record.final_train_return is not None:  # a record without its curve: the last interval only
        return scores.TrainWindow(record.final_train_return, 0, exact=False)
    return None


def margin_for(env_id: str, fraction: float = verdict_rule.DEFAULT_MARGIN, baseline_mean: float | None = None, reference_dir: Path | None = None) -> Margin:
    """``fraction`` in the task's normalized units (its fixed normalizer: reference - random);
    a task without one: ``fraction`` of the baseline's mean, as the margin's text says."""
    normalizer = normalizers.normalizer(env_id, reference_dir or reference.REFERENCE_DIR)
    if normalizer.available:
        assert normalizer.reference is not None and normalizer.random is not None
        return Margin(fraction, abs(normalizer.reference.mean - normalizer.random.mean))
    scale = abs(baseline_mean) if baseline_mean else 1.0
    return Margin(fraction, scale, "the reference's mean (the task has no normalizer)")


Seeds = Sequence[float] | np.ndarray


def seeds_row(env_id: str, ours: Seeds, theirs: Seeds, fraction: float, reference_dir: Path | None = None) -> verdict_rule.Row:
    """The rule's row for two sides of seeds we can both grow (parity, compare): success rates on
    a capped task (``scores.SUCCESS_THRESHOLDS``), else the returns with the task's margin."""
    threshold = scores.success_threshold(env_id)
    if threshold is not None:
        return verdict_rule.Row(
            Sample.of(ours, [value >= threshold for value in ours]),
            Sample.of(theirs, [value >= threshold for value in theirs]),
            Margin.for_rates(fraction),
            reference_fixed=False,
        )
    margin = margin_for(env_id, fraction, float(np.mean(theirs)), reference_dir)
    return verdict_rule.Row(Sample.of(ours), Sample.of(theirs), margin, reference_fixed=False)


# ------------------------------------------------------------------------------------ the table


def judge_cases(
    cases: Sequence[Case],
    scores_table: tuple[ReferenceScore, ...] | None = None,
    margin: float = verdict_rule.DEFAULT_MARGIN,
    per_seed: dict | None = None,
) -> list[Verdict]:
    """One verdict per case, the table decided at once (Holm's correction over its tested rows)."""
    scores_table = reference.load_scores() if scores_table is None else scores_table
    per_seed = reference.load_per_seed() if per_seed is None else per_seed
    prepared = [_prepare(case, scores_table, margin, per_seed) for case in cases]
    decisions = verdict_rule.decide([row for row, _ in prepared])
    verdicts = []
    for (_, verdict), decision in zip(prepared, decisions):
        verdict.decision = decision
        verdict.verdict = decision.label
        verdict.test = decision.explanation() if decision.evidence is not None else ""
        verdicts.append(verdict)
    return verdicts


def _prepare(case: Case, scores_table: tuple[ReferenceScore, ...], fraction: float, per_seed: dict) -> tuple[verdict_rule.Row, Verdict]:
    published = choose_published(case.algo, case.env_id, case.budget_steps, scores_table)
    base = Verdict(case.label or case.algo, case.algo, case.env_id, case.budget_steps, verdict_rule.NO_REFERENCE, None, published)
    finals, _, _ = our_scores(case.records, scores.FINAL, case.budget_steps)
    base.ours = _ours(finals)
    if published is None:
        base.reason = "no source in results/reference/scores.csv has this algorithm on this task"
        return verdict_rule.Row(_sample(finals), None, None), base
    reasons = [reason for reason in (not_comparable_reason(case.budget_steps, case.env_id, published),) if reason]
    if case.env_changed:
        reasons.insert(0, f"env: {case.env_changed} here, made as registered in the source")
    if len(finals) < 2:
        reasons.append(f"{len(finals)} finished {plural(len(finals), 'seed')} here: at least 2 are needed")
    margin = margin_for(case.env_id, fraction, published.mean)
    if reasons:
        base.reason = "; ".join(reasons)
        return verdict_rule.Row(_sample(finals), None, margin, base.reason), base
    has_curves = reference.per_seed_of(published, per_seed) is not None
    values, kind, note = our_scores(case.records, scores.for_protocol(published.protocol, has_curves), case.budget_steps)
    base.score, base.ours = kind, _ours(values)
    base.reference_sample = reference_sample(published, kind, per_seed)
    notes = [note] if note else []
    if published.env_version and published.env_version != reference.env_version(case.env_id):
        notes.append(f"source ran {reference.env_family(case.env_id)}-{published.env_version}")
    if published.protocol == "approx_plot":
        notes.append("source: read off a plot")
    if published.approximate and published.protocol != "approx_plot":
        notes.append("source value approximate")
    normalizer = normalizers.normalizer(case.env_id)
    if normalizer.available and margin.basis == "normalized units":
        level = float(normalizer(published.mean))
        if abs(level) < fraction:
            notes.append(
                f"the margin (±{fraction:g}) is wider than the source's own normalized score ({level:.2f}): "
                "equivalence here says little (a smaller --margin asks more)"
            )
    base.reason = "; ".join(notes)
    return verdict_rule.Row(Sample.of(values), base.reference_sample, margin), base


def _sample(values: np.ndarray) -> Sample | None:
    return Sample.of(values) if len(values) else None


def _ours(values: np.ndarray) -> Ours | None:
    if not len(values):
        return None
    return Ours(float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0, len(values))


def suite_verdicts(groups: list, scores_table: tuple[ReferenceScore, ...] | None = None, margin: float = verdict_rule.DEFAULT_MARGIN) -> list[Verdict]:
    """One verdict per configuration group (``benchmark.analysis.report.Group``), as one table."""
    return judge_cases([case_of(group) for group in groups], scores_table, margin)


def case_of(group: object) -> Case:
    """The case of a ``report.Group``."""
    records: list[RunRecord] = group.records  # type: ignore[attr-defined]
    spec = records[0].spec
    return Case(group.label, group.algo, group.env_id, spec.budget.total_steps, tuple(records), "" if spec.env.plain else spec.env.describe())  # type: ignore[attr-defined]


def counts_text(found: Sequence[Verdict]) -> str:
    """'14 reproduced, 2 above, ...' in the order of ``VERDICTS``."""
    return ", ".join(f"{n} {name}" for name in VERDICTS if (n := sum(v.verdict == name for v in found)))


def collapsed(normalized: np.ndarray) -> tuple[int, int] | None:
    """Seeds that collapsed (normalized final score below ``COLLAPSE_BELOW``) and seeds, where the
    cell's median is above ``COLLAPSE_MEDIAN_ABOVE`` (None: collapse is not defined for the cell)."""
    if len(normalized) < 2 or float(np.median(normalized)) <= COLLAPSE_MEDIAN_ABOVE:
        return None
    return int(np.sum(normalized < COLLAPSE_BELOW)), len(normalized)


def ours_text(verdict: Verdict) -> str:
    ours = verdict.ours
    return "—" if ours is None else f"{ours.mean:.1f} ± {ours.std:.1f} ({ours.n} seeds)"


def published_text(verdict: Verdict) -> str:
    return verdict.published.citation if verdict.published else "—"
