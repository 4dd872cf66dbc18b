"""The suite report: ``results/reports/<suite>/report.md`` and ``report.html`` with PNG plots.

Built from the suite file (which runs belong in it) and MLflow (what became of each run):
per environment, each algorithm's final score with a 95% bootstrap CI, its normalized score,
the reference it is normalized with and where that comes from, the algorithm's own published
score, seeds, steps/second and wall time; across environments, IQM / mean / median /
optimality gap of normalized scores with stratified bootstrap CIs, performance profiles and
probabilities of improvement. Unfinished runs (running, failed, killed, never started) are
counted and listed, never dropped silently.
"""

from __future__ import annotations

import datetime
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmark import provenance
from benchmark.analysis import curve_grid, interactive, plots, reference, stats, verdict_rule, verdicts
from benchmark.analysis.document import Document
from benchmark.analysis.normalizers import normalizer as fixed_normalizer
from benchmark.analysis.records import RunRecord
from benchmark.analysis.scores import NAMES as SCORE_NAMES
from benchmark.config import Suite, configurations

AGGREGATE_REPS = 20_000
STATUS_ORDER = ("FINISHED", "RUNNING", "FAILED", "KILLED", "MISSING")


@dataclass
class Group:
    """The seeds of one configuration of one algorithm on one environment."""

    env_id: str
    algo: str
    label: str
    records: list[RunRecord] = field(default_factory=list)

    @property
    def scores(self) -> np.ndarray:
        """Final evaluation returns of the finished seeds."""
        return np.array([r.final_return for r in self.records if r.finished], dtype=float)

    @property
    def status_counts(self) -> str:
        counts = Counter("FINISHED" if r.finished else r.status for r in self.records)
        return ", ".join(f"{counts[s]} {s.lower()}" for s in STATUS_ORDER if counts[s])


def group_records(records: list[RunRecord]) -> list[Group]:
    """Group by configuration (environment, algorithm, hyperparameters, budget), in suite order;
    configurations of one algorithm on one environment are labelled by the overrides that tell
    them apart (see ``benchmark.config.configurations``)."""
    by_key = {record.spec.run_key: record for record in records}
    return [
        Group(members[0].env_id, members[0].algo, label, [by_key[spec.run_key] for spec in members])
        for label, members in configurations([record.spec for record in records])
    ]


PER_ENVIRONMENT_METRICS = ("IQM", "mean", "median", "optimality gap")


def per_environment_intervals(normalized: np.ndarray, reps: int = AGGREGATE_REPS) -> dict[str, stats.Interval]:
    """IQM, mean, median (over seeds) and optimality gap of one environment's normalized
    scores, each with its percentile-bootstrap interval."""
    batched = {
        "IQM": stats.AGGREGATES["IQM"],
        "mean": stats.AGGREGATES["mean"],
        "median": lambda samples: np.median(samples[0], axis=1),
        "optimality gap": stats.AGGREGATES["optimality gap"],
    }
    return {name: stats.stratified_bootstrap({"env": normalized}, batched[name], reps=reps) for name in PER_ENVIRONMENT_METRICS}


# ------------------------------------------------------------------------------------ documents


# ------------------------------------------------------------------------------------ formatting


def number_text(value: float | None, digits: int = 1) -> str:
    """``value`` with thousands separators and ``digits`` decimals; — when missing or not finite."""
    return "—" if value is None or not np.isfinite(value) else f"{value:,.{digits}f}"


def interval_text(interval: stats.Interval | None, digits: int = 1) -> str:
    """``estimate [low, high]`` as ``number_text`` writes each; — when missing."""
    if interval is None:
        return "—"
    return f"{interval.estimate:,.{digits}f} [{interval.low:,.{digits}f}, {interval.high:,.{digits}f}]"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


# ------------------------------------------------------------------------------------ the report


def write_report(
    suite: Suite,
    records: list[RunRecord],
    out_dir: Path,
    source: str,
    reference_dir: Path = reference.REFERENCE_DIR,
    strips: dict[str, Path] | None = None,
    mlflow_ui: str | None = None,
) -> Path:
    """Write report.md, report.html and plots/*.png under ``out_dir``; returns report.md's path.
    ``strips`` (run key -> PNG under ``out_dir``) are the filmed episodes shown (``evaluate --video``);
    ``mlflow_ui`` (e.g. http://localhost:5000, where ``ui`` serves) links each run to its MLflow page."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_dir = out_dir / "plots"
    previous_plots = set(plot_dir.glob("*.png")) | set(plot_dir.glob("*.svg")) if plot_dir.exists() else set()
    groups = group_records(records)
    env_ids = list(dict.fromkeys(g.env_id for g in groups))
    normalizers = {env_id: fixed_normalizer(env_id, reference_dir) for env_id in env_ids}
    scores_table = reference.load_scores(reference_dir / "scores.csv")

    doc = Document()
    doc.heading(1, f"Suite {suite.name}")
    counts = Counter("FINISHED" if r.finished else r.status for r in records)
    shas = Counter((r.git_sha or "unknown")[:10] for r in records if r.run_id)
    doc.paragraph(
        f"{suite.description}. Generated {datetime.datetime.now().isoformat(timespec='seconds')} from `{source}`; "
        f"suite file `{suite.path.name}`, {len(records)} runs: "
        + ", ".join(f"{counts[s]} {s.lower()}" for s in STATUS_ORDER if counts[s])
        + ". Code versions of the runs: "
        + (", ".join(f"`{sha}` ({n})" for sha, n in shas.most_common()) or "none")
        + "."
    )
    doc.paragraph(
        "Scores are the mean return of the final deterministic evaluation of each seed. Per environment, "
        "intervals are 95% Student-t confidence intervals of the mean over seeds (with 3-10 seeds a percentile "
        "bootstrap would cover well below 95%); aggregates across environments use the stratified percentile "
        "bootstrap of Agarwal et al. (2021). "
        "Normalized score = (score − random) / (reference − random): 0 is a uniform random policy measured "
        "here on the same environment version, 1 the task's reference, the best published score of the most "
        "comparable kind: final evaluations over ≥3 seeds, then training returns over ≥3 seeds, then single-agent "
        "final evaluations, then maxima over training, then values read off plots; budgets differ from ours "
        "and are named; sources ran gym v1–v4, we run the versions named."
    )

    _aggregate_section(doc, groups, normalizers, plot_dir)
    judged = _verdicts_section(doc, groups, scores_table)
    _curves_section(doc, groups, judged, plot_dir)
    for env_id in env_ids:
        _environment_section(doc, env_id, [g for g in groups if g.env_id == env_id], normalizers[env_id], scores_table)
    _videos_section(doc, records, strips or {}, out_dir)
    _runs_section(doc, records, mlflow_ui, provenance.commit_url_template())

    markdown_path = out_dir / "report.md"
    markdown_path.write_text(doc.markdown())
    (out_dir / "report.html").write_text(doc.html(f"reprorl report: {suite.name}", base=out_dir))
    referenced = {out_dir / content[0] for kind, content in doc.blocks if kind == "image"}
    referenced |= {path.with_suffix(".svg") for path in referenced}
    for stale in previous_plots - referenced:  # e.g. an environment no longer in the suite
        stale.unlink()
    return markdown_path


def _aggregate_section(doc: Document, groups: list[Group], normalizers: dict[str, reference.Normalizer], plot_dir: Path) -> None:
    doc.heading(2, "Across environments (normalized scores)")
    per_label: dict[str, dict[str, np.ndarray]] = {}
    for group in groups:
        normalizer = normalizers[group.env_id]
        if normalizer.available and len(group.scores):
            per_label.setdefault(group.label, {})[group.env_id] = normalizer(group.scores)
    skipped = sorted({env for env, n in normalizers.items() if not n.available})
    if skipped:
        doc.paragraph("Not in the aggregates (no normalization): " + "; ".join(f"{env}: {normalizers[env].missing}" for env in skipped) + ".")
    if not per_label:
        doc.paragraph("No finished run on a normalized environment yet.")
        return
    intervals = {label: stats.aggregate_intervals(scores, reps=AGGREGATE_REPS) for label, scores in per_label.items()}
    metrics = list(next(iter(intervals.values())))
    rows = []
    for label, scores in per_label.items():
        runs = sum(len(v) for v in scores.values())
        rows.append([label, str(len(scores)), str(runs), *(interval_text(intervals[label][m], 2) for m in metrics)])
    doc.table(["algorithm", "environments", "runs", *(f"{m} [95% CI]" for m in metrics)], rows)
    doc.paragraph(
        "IQM: mean of the middle 50% of all runs pooled; mean and median: over the environments' mean scores; "
        "optimality gap: how far runs fall short of the reference (1 − mean of min(score, 1)); lower is better."
    )
    drawn = plots.aggregate_intervals(intervals, plot_dir / "aggregates.png")
    doc.plot(
        interactive.aggregate_intervals(intervals),
        f"plots/{drawn.name}",
        "aggregate normalized scores (optimality gap: lower is better)",
        interactive.aggregate_height(intervals),
    )
    highest = max(float(np.max(v)) for scores in per_label.values() for v in scores.values())
    thresholds = np.linspace(0.0, max(1.25, highest * 1.05), 81)
    profiles = {label: stats.performance_profile(scores, thresholds) for label, scores in per_label.items()}
    drawn = plots.performance_profiles(profiles, thresholds, plot_dir / "profiles.png")
    doc.plot(interactive.performance_profiles(profiles, thresholds), f"plots/{drawn.name}", "performance profiles", 460)

    labels = list(per_label)
    shares = any(set(per_label[x]) & set(per_label[y]) for x in labels for y in labels if x != y)
    if shares:
        rows = []
        for x in labels:
            row = [x]
            for y in labels:
                shared = sorted(set(per_label[x]) & set(per_label[y]))
                if x == y or not shared:
                    row.append("—")
                    continue
                interval = stats.probability_of_improvement_interval({e: per_label[x][e] for e in shared}, {e: per_label[y][e] for e in shared})
                row.append(interval_text(interval, 2))
            rows.append(row)
        doc.paragraph("Probability of improvement P(row > column) on the environments both ran, with 95% CIs:")
        doc.table(["P(row > column)", *labels], rows)


def _verdicts_section(doc: Document, groups: list[Group], scores_table: tuple[reference.ReferenceScore, ...]) -> list[verdicts.Verdict]:
    """The verdicts' table; the verdicts (none without a finished run)."""
    judged = verdicts.suite_verdicts([g for g in groups if len(g.scores)], scores_table)
    if not judged:
        return []
    doc.heading(2, "Reproduction verdicts")
    doc.paragraph(
        "Each configuration against the same algorithm's published score, chosen comparable first, then like protocol, "
        "closest budget and env version, both sides scored as the source measured (final evaluation, the mean of the "
        "evaluations in the last 10% of the budget, or the last 100 training episodes). One rule, its margin stated in "
        f"advance (±{verdict_rule.DEFAULT_MARGIN:g} in the task's normalized units): reproduced when the 90% interval of the "
        "difference lies within the margin (two one-sided tests at 5%) and no difference is shown; above or below when "
        f"Welch's test rejects after Holm's correction over this table at α = {verdicts.ALPHA} (beyond, within or across the "
        "margin); otherwise inconclusive, with the seeds that would decide "
        "at 80% power. Against one trained agent a cell is never reproduced: consistent with it or outside its interval. "
        "Not comparable: budget (more than 2x apart), protocol (maximum over training), env version (a changed reward) "
        "or env settings differ, or fewer than 2 seeds finished."
    )
    rows = [
        [v.label, v.env_id, f"{v.budget_steps:,}", SCORE_NAMES[v.score], verdicts.ours_text(v), verdicts.published_text(v), v.text, v.test, v.reason]
        for v in judged
    ]
    doc.table(["algorithm", "environment", "steps", "score", "ours (mean ± std)", "published", "verdict", "test and margin", "note"], rows, fold=7)
    doc.paragraph("In all: " + verdicts.counts_text(judged) + ".")
    return judged


def _curves_section(doc: Document, groups: list[Group], judged: list[verdicts.Verdict], plot_dir: Path) -> None:
    """One figure grid of learning curves per budget (``curve_grid``): finished runs and runs
    still going (a failed run's partial curve would drag the mean)."""
    by_cell = {(v.label, v.env_id): v for v in judged}
    cells = []
    for group in groups:
        curves = [r.curve for r in group.records if r.curve and (r.finished or r.status == "RUNNING")]
        if not curves:
            continue
        steps = group.records[0].spec.budget.total_steps
        verdict = by_cell.get((group.label, group.env_id))
        cells.append(curve_grid.Cell(steps, group.env_id, group.label, curves, curve_grid.compared_score(verdict, steps) if verdict else None))
    if not cells:
        return
    doc.heading(2, "Learning curves")
    for path, figure in zip(curve_grid.draw(cells, plot_dir), interactive.figures(cells).values()):
        doc.plot(figure, f"plots/{path.name}", f"learning curves, {path.stem.removeprefix('curves_')} steps")


def _environment_section(
    doc: Document,
    env_id: str,
    groups: list[Group],
    normalizer: reference.Normalizer,
    scores_table: tuple[reference.ReferenceScore, ...],
) -> None:
    doc.heading(2, env_id)
    ref, random = normalizer.reference, normalizer.random
    doc.paragraph(
        "Reference: "
        + (f"{ref.citation}, {ref.source_url}" if ref else "none published")
        + ". Random policy: "
        + (f"{random.mean:.2f} ± {random.std:.2f} over {random.episodes} episodes (measured here)" if random else "not measured")
        + "."
    )
    rows = []
    for group in groups:
        scores = group.scores
        final = stats.t_interval(scores) if len(scores) else None
        normalized = stats.t_interval(normalizer(scores)) if len(scores) and normalizer.available else None
        published = reference.published_score(group.algo, env_id, scores_table)
        speeds = [r.steps_per_second for r in group.records if r.finished and r.steps_per_second]
        walls = [r.wall_seconds for r in group.records if r.finished and r.wall_seconds]
        rows.append(
            [
                group.label,
                f"{len(scores)}/{len(group.records)}",
                group.status_counts,
                interval_text(final),
                number_text(stats.iqm(scores)) if len(scores) else "—",
                interval_text(normalized, 2),
                ", ".join(f"{s:.0f}" for s in scores) or "—",
                published.citation if published else "—",
                number_text(float(np.mean(speeds)), 0) if speeds else "—",
                _duration(float(np.mean(walls))) if walls else "—",
            ]
        )
    doc.table(
        [
            "algorithm",
            "seeds",
            "runs",
            "final evaluation return [95% CI]",
            "IQM",
            "normalized [95% CI]",
            "per seed",
            "published (this algorithm)",
            "steps/s",
            "wall time (mean)",
        ],
        rows,
        fold=6,
    )
    _adaptation_table(doc, groups)
    # finished runs and runs still going; a failed run's partial curve would drag the mean
    with_scores = [g for g in groups if len(g.scores) and normalizer.available]
    if with_scores:
        doc.paragraph(
            "Normalized scores of the seeds, with 95% percentile-bootstrap intervals (the per-environment case "
            "of the aggregates above; median and IQM over seeds):"
        )
        rows = []
        for group in with_scores:
            intervals = per_environment_intervals(normalizer(group.scores))
            rows.append([group.label, str(len(group.scores)), *(interval_text(intervals[m], 2) for m in intervals)])
        doc.table(["algorithm", "seeds", *(f"{m} [95% CI]" for m in PER_ENVIRONMENT_METRICS)], rows)


def _adaptation_table(doc: Document, groups: list[Group]) -> None:
    """Meta-RL groups: the final meta-test's return before and after adaptation, over seeds."""
    rows = []
    for group in groups:
        pairs = [(r.pre_adaptation_return, r.final_return) for r in group.records if r.finished and r.pre_adaptation_return is not None]
        if not pairs:
            continue
        pre, post = np.array(pairs).T
        rows.append(
            [
                group.label,
                str(len(pairs)),
                interval_text(stats.t_interval(pre)),
                interval_text(stats.t_interval(post)),
                interval_text(stats.t_interval(post - pre)),
            ]
        )
    if rows:
        doc.paragraph(
            "Meta-test on the held-out tasks (the final return above is the post-adaptation one): mean episode "
            "return before adaptation (exploring with the meta-policy) and after it, averaged over the test "
            "tasks, with 95% Student-t intervals over seeds:"
        )
        doc.table(["algorithm", "seeds", "pre-adaptation [95% CI]", "post-adaptation [95% CI]", "gain [95% CI]"], rows)


def _videos_section(doc: Document, records: list[RunRecord], strips: dict[str, Path], out_dir: Path) -> None:
    filmed = [record for record in records if record.spec.run_key in strips]
    if not filmed:
        return
    doc.heading(2, "Filmed episodes")
    doc.paragraph("Frames of one deterministic episode of each final policy, first to last (`python -m benchmark evaluate RUN_ID --video PATH` films it).")
    for record in filmed:
        path = strips[record.spec.run_key].relative_to(out_dir).as_posix()
        doc.image(path, f"{record.spec.label} (run key {record.spec.run_key}): final return {number_text(record.final_return)}")


def _runs_section(doc: Document, records: list[RunRecord], mlflow_ui: str | None = None, commit_url: str | None = None) -> None:
    """Every run: its state and final score, linked to its MLflow page (classic view) and its commit
    where known; the run's identities and notes folded into a details cell in HTML."""
    doc.heading(2, "Every run")
    rows = []
    for record in records:
        spec = record.spec
        status = "FINISHED" if record.finished else record.status
        note = record.error or (f"{record.curve[-1][0]:,} of {spec.budget.total_steps:,} steps" if status == "RUNNING" and record.curve else "")
        if record.latest_status:
            note = f"a newer attempt is {record.latest_status}; " + note
        run = record.run_id or "—"
        if mlflow_ui and record.run_id and record.experiment_id:
            run = f"[{record.run_id}]({mlflow_ui.rstrip('/')}/#/experiments/{record.experiment_id}/runs/{record.run_id})"
        sha = (record.git_sha or "—")[:10]
        if commit_url and record.git_sha:
            sha = f"[{sha}]({commit_url.format(sha=record.git_sha)})"
        rows.append(
            [
                spec.algo,
                spec.env_id,
                str(spec.seed),
                status,
                number_text(record.final_return),
                number_text(record.steps_per_second, 0),
                _duration(record.wall_seconds),
                run,
                sha,
                spec.run_key,
                _source(record),
                str(record.attempts),
                note[:200],
            ]
        )
    headers = ["algorithm", "environment", "seed", "status", "final evaluation return", "steps/s", "wall", "MLflow run", "commit"]
    doc.table([*headers, "run key", "from", "attempts", "note"], rows, fold=len(headers))


def _source(record: RunRecord) -> str:
    """'store' or the bundle directory the run was read from (its last two parts)."""
    if not record.source:
        return "store" if record.run_id else "—"
    return "bundle " + "/".join(Path(record.source).parts[-2:])
