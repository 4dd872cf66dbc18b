"""The MuJoCo record: ``python -m benchmark record``.

From the committed result bundles of the record's suites (``results/published/mujoco`` and
``results/published/mujoco_300k``) and the parity records (``results/parity``), with no tracking
store and no training: one row per algorithm x task with our score, the published score chosen
like with like and scored as the source measured (``benchmark.analysis.verdicts``), the
difference in normalized units with its 90% interval, the verdict under the rule (one table:
Holm's correction over every tested cell of both suites), the share of collapsed seeds and the
code that trained the cell; then the verdict per algorithm across its tasks
(``aggregate_verdicts``); the parity table under the same rule and its aggregate; one
figure grid of learning curves per budget (``curve_grid``); per budget, rliable's figures
across tasks (``aggregate_figures``). Written to ``results/record/record.md`` (with every row's tests
and notes) with the figures beside it; a compact table (``record_readme``) is spliced into the README between two marker lines
(``--check`` only compares), so that the README's record is always what the bundles say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.errors import ConfigError
from benchmark.analysis import record_text
from benchmark.results_layout import ResultsDir

RECORD_SUITES = ("mujoco", "mujoco_300k")
RECORD_DIR = Path("results/record")
START = "<!-- record: written by `python -m benchmark record` from the committed bundles; do not edit by hand -->"
END = "<!-- end of record -->"


@dataclass
class Row:
    """One configuration of the record."""

    suite: str
    group: Any
    """``benchmark.analysis.report.Group``: the configuration's runs."""
    verdict: Any
    """``benchmark.analysis.verdicts.Verdict``."""
    parity: dict[str, Any] | None
    """The parity summary of this algorithm on this task, if one was run."""
    normalizer: Any = None
    """The task's fixed ``reference.Normalizer``."""
    code: dict[str, Any] = field(default_factory=dict)
    """Provenance: commits, fingerprint classes (``provenance_of``)."""

    @property
    def steps(self) -> int:
        return self.group.records[0].spec.budget.total_steps

    @property
    def finished(self) -> list[Any]:
        return [record for record in self.group.records if record.finished]


@dataclass
class Record:
    rows: list[Row]
    parity_rows: list[dict[str, Any]]
    aggregates: list[Any]
    """``aggregate_verdicts.Aggregate`` per algorithm and budget."""
    parity_aggregate: Any
    margin: float


def collect(results_dir: Path = Path("results"), suites: tuple[str, ...] = RECORD_SUITES, parity_dir: Path | None = None, margin: float = 0.2) -> Record:
    """The record: its rows in suite order (every configuration with a finished run), judged as one table."""
    from benchmark import bundles, config
    from benchmark.analysis import normalizers, parity_records, records, report, verdicts

    parity_rows = [row for row in parity_records.table_rows(parity_dir, margin) if row["seeds"]] if parity_dir is not None and parity_dir.is_dir() else []
    found: list[tuple[str, Any]] = []
    for name in suites:
        suite = config.load_suite(name)
        directory = bundles.published_directory(results_dir, suite.name)
        bundled = bundles.read_all([directory]) if bundles.is_bundle(directory) else {}
        found += [(suite.name, group) for group in report.group_records(records.collect(suite, None, True, bundled)) if len(group.scores)]
    judged = verdicts.suite_verdicts([group for _, group in found], margin=margin)
    rows = []
    for (suite_name, group), verdict in zip(found, judged):
        matches = [p for p in parity_rows if p["algo"] == group.algo and p["env_id"] == group.env_id]
        best = max(matches, key=lambda p: (len(p["seeds"]), p["steps"]), default=None)
        row = Row(suite_name, group, verdict, best, normalizers.normalizer(group.env_id))
        row.code = provenance_of(row.finished)
        rows.append(row)
    return Record(rows, parity_rows, aggregates_of(rows, margin), parity_aggregate_of(parity_rows, margin), margin)


def provenance_of(records: list[Any]) -> dict[str, Any]:
    """The commits a cell's runs were trained at and whether their code behaved the same: the
    runs' behaviour fingerprints in classes of matching ones ('mixed code' when more than one)."""
    from benchmark.training import fingerprint

    commits = sorted({(record.git_sha or "")[:7] for record in records} - {""})
    groups = fingerprint.classes([record.fingerprint for record in records])
    by_class = [sorted({(records[i].git_sha or "")[:7] for i in group} - {""}) for group in groups]
    known = sum(len(group) for group in groups)
    return {"commits": commits, "classes": by_class, "unknown": len(records) - known, "mixed": len(groups) > 1}


def aggregates_of(rows: list[Row], margin: float) -> list[Any]:
    """Per algorithm and budget, across the tasks whose verdict compared a published score."""
    from benchmark.analysis import aggregate_verdicts, verdicts

    by_algo: dict[tuple[str, int], dict[str, tuple[np.ndarray, Any]]] = {}
    norms: dict[str, Any] = {}
    for row in rows:
        verdict = row.verdict
        if verdict.decision is None or verdict.decision.evidence is None or verdict.reference_sample is None or not row.normalizer.available:
            continue
        values, _, _ = verdicts.our_scores(row.group.records, verdict.score, row.steps)
        by_algo.setdefault((row.group.label, row.steps), {})[row.group.env_id] = (values, verdict.reference_sample)
        norms[row.group.env_id] = row.normalizer
    found = [aggregate_verdicts.aggregate(label, budget, aggregate_verdicts.normalized_sides(per_task, norms)) for (label, budget), per_task in by_algo.items()]
    aggregate_verdicts.decide(found, margin)
    return found


def parity_aggregate_of(parity_rows: list[dict[str, Any]], margin: float) -> Any:
    """Ours against the peer library across the parity cells, normalized per task (raw returns, CartPole too)."""
    from benchmark.analysis import aggregate_verdicts, normalizers
    from benchmark.analysis.verdict_rule import Sample

    per_task: dict[str, tuple[np.ndarray, Any]] = {}
    norms: dict[str, Any] = {}
    for row in parity_rows:
        normalizer = normalizers.normalizer(row["env_id"])
        if not normalizer.available or len(row["seeds"]) < 2:
            continue
        name = f"{row['algo']} {row['env_id']} {record_text.steps_text(row['steps'])}"
        per_task[name] = (np.asarray(row["_ours_values"], dtype=float), Sample.of(row["_peer_values"]))
        norms[name] = normalizer
    if len(per_task) < 2:
        return None
    found = aggregate_verdicts.aggregate("ours vs SB3", 0, aggregate_verdicts.normalized_sides(per_task, norms), reference_grows=True)
    aggregate_verdicts.decide([found], margin)
    return found


def splice(readme: str, block: str) -> str:
    """``readme`` with the text between the marker lines replaced by ``block``."""
    if START not in readme or END not in readme:
        raise ConfigError(f"the README has no record markers: add the lines\n{START}\n{END}\nwhere the record belongs")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{block.rstrip()}\n{END}{tail}"


def write(
    results_dir: Path = Path("results"),
    output: Path = RECORD_DIR,
    readme: Path | None = None,
    parity_dir: Path | None = None,
    check: bool = False,
    margin: float = 0.2,
) -> tuple[Record, bool]:
    """Write the record (and splice it into ``readme``); with ``check``, write nothing and say
    whether ``readme`` already holds it. The record and whether the README is (now) current."""
    from benchmark.analysis import aggregate_figures, curve_grid, record_readme

    parity_dir = parity_dir if parity_dir is not None else ResultsDir(results_dir).parity
    found = collect(results_dir, parity_dir=parity_dir, margin=margin)
    cells = curve_grid.record_cells(found.rows)
    images = curve_grid.paths(cells, output) if check else curve_grid.draw(cells, output)
    profile_images = [path for _, path in record_text.profile_paths(found, output)] if check else record_text.profiles(found, output)
    across = aggregate_figures.budgets(found.rows, found.aggregates)
    aggregate_images = aggregate_figures.paths(across, output) if check else aggregate_figures.draw(across, output)
    overview = (aggregate_figures.overview_path(output) if across else None) if check else aggregate_figures.overview(across, output)
    prefix = _relative(output, readme.parent) if readme is not None else ""
    block = record_readme.markdown(found, overview, prefix, f"{prefix}record.md")
    current = True
    if readme is not None:
        text = readme.read_text()
        spliced = splice(text, block)
        current = spliced == text
        if not check and not current:
            readme.write_text(spliced)
            current = True
    if not check:
        output.mkdir(parents=True, exist_ok=True)
        text = record_text.markdown(found, images, "", notes=True, profile_images=profile_images, aggregate_images=aggregate_images)
        (output / "record.md").write_text("# The MuJoCo record\n\n" + text)
    return found, current


def _relative(directory: Path, base: Path) -> str:
    try:
        return str(directory.resolve().relative_to(base.resolve())) + "/"
    except ValueError:
        return str(directory.resolve()) + "/"
