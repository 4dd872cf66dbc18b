"""The MuJoCo record: ``python -m benchmark record``.

From the committed result bundles of the record's suites (``results/published/mujoco`` and
``results/published/mujoco_300k``) and the parity records (``results/parity``), with no tracking
store and no training: one row per algorithm x task with our final score and its 95% t interval,
the published score chosen like with like (``benchmark.analysis.verdicts``), the verdict, and the
side-by-side result against Stable-Baselines3; then the parity table and one learning-curve
figure per task (every algorithm's seeds and mean, each algorithm's published score as a dashed
line in its color). Written to ``results/record/record.md`` with the figures beside it, and
spliced into the README between two marker lines (``--check`` only compares), so that the
README's record is always what the bundles say.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.errors import ConfigError

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

    @property
    def steps(self) -> int:
        return self.group.records[0].spec.budget.total_steps


def collect(results_dir: Path = Path("results"), suites: tuple[str, ...] = RECORD_SUITES, parity_dir: Path | None = None) -> list[Row]:
    """The record's rows, in suite order: every configuration with at least one finished run."""
    from benchmark import bundles, config
    from benchmark.analysis import parity_records, records, report, verdicts

    parity_rows = parity_records.table_rows(parity_dir) if parity_dir is not None and parity_dir.is_dir() else []
    rows = []
    for name in suites:
        suite = config.load_suite(name)
        directory = bundles.published_directory(results_dir, suite.name)
        bundled = bundles.read_all([directory]) if bundles.is_bundle(directory) else {}
        groups = [g for g in report.group_records(records.collect(suite, None, True, bundled)) if len(g.scores)]
        for group, verdict in zip(groups, verdicts.suite_verdicts(groups)):
            matches = [p for p in parity_rows if p["algo"] == group.algo and p["env_id"] == group.env_id and p["seeds"]]
            best = max(matches, key=lambda p: (len(p["seeds"]), p["steps"]), default=None)
            rows.append(Row(suite.name, group, verdict, best))
    return rows


def _k(steps: int) -> str:
    return f"{steps / 1e6:g}M" if steps >= 1_000_000 else f"{steps / 1e3:g}k"


def parity_text(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "—"
    p = summary["welch_p"]
    return (
        f"{summary['verdict']} at {_k(summary['steps'])} ({summary['ours']['mean']:,.0f} vs {summary['peer']['mean']:,.0f}"
        + ("" if p is None else f", p = {p:.2f}" if p >= 0.01 else ", p < 0.01")
        + f", {len(summary['seeds'])} seed{'' if len(summary['seeds']) == 1 else 's'})"
    )


def published_text(verdict: Any) -> str:
    published = verdict.published
    if published is None:
        return "none found"
    if published.budget_steps and published.budget_steps != verdict.budget_steps:
        return f"no published value at this budget (nearest: {published.citation})"
    return published.citation


def note(verdict: Any) -> str:
    """The test and its caveats; when our seeds were judged by their training returns (as the
    source measured), their mean and standard deviation first."""
    judged = ""
    if verdict.ours is not None and "training episodes" in verdict.reason:
        judged = f"ours judged by training returns: {verdict.ours.mean:,.0f} ± {verdict.ours.std:,.0f}"
    return "; ".join(part for part in (judged, verdict.test, verdict.reason) if part) or "—"


def table(rows: list[Row]) -> str:
    from benchmark.analysis.stats import t_interval

    lines = [
        "| algorithm | task | steps | seeds | ours: final return [95% CI] | published | verdict | note | vs SB3, same settings |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        interval = t_interval(row.group.scores)
        verdict = row.verdict
        lines.append(
            f"| {row.group.label} | {row.group.env_id} | {_k(row.steps)} | {len(row.group.scores)} | "
            f"{interval.estimate:,.0f} [{interval.low:,.0f}, {interval.high:,.0f}] | {published_text(verdict)} | "
            f"**{verdict.verdict}** | {note(verdict)} | {parity_text(row.parity)} |"
        )
    return "\n".join(lines) + "\n"


def figure_paths(rows: list[Row], directory: Path) -> dict[str, Path]:
    """Task -> its figure's path, in the rows' order."""
    return {env_id: directory / f"curves_{env_id.split('-')[0].lower()}.png" for env_id in dict.fromkeys(row.group.env_id for row in rows)}


def figures(rows: list[Row], directory: Path) -> list[Path]:
    """One learning-curve figure per task: every configuration's seeds and mean, and the
    published score each verdict was judged against as a dashed line in its color."""
    from benchmark.analysis import plots

    paths = []
    for env_id, path in figure_paths(rows, directory).items():
        curves, published = {}, {}
        for row in rows:
            if row.group.env_id != env_id:
                continue
            label = f"{row.group.label} [{_k(row.steps)}]"
            curves[label] = [r.curve for r in row.group.records if r.finished and r.curve]
            chosen = row.verdict.published
            if chosen is not None:
                budget = f", {_k(chosen.budget_steps)}" if chosen.budget_steps else ""
                protocol = {"training_return": ", training returns", "final_eval": ", final evaluation"}.get(chosen.protocol, f", {chosen.protocol}")
                published[label] = (chosen.mean, f"{chosen.source.split(' (')[0]}{budget}{protocol}")
        paths.append(plots.learning_curves(env_id, curves, path, published=published))
    return paths


def markdown(rows: list[Row], parity_rows: list[dict[str, Any]], images: list[Path], image_prefix: str) -> str:
    """The record as markdown; images are linked as ``image_prefix + file name``."""
    from benchmark.analysis import parity_records

    counts: dict[str, int] = {}
    for row in rows:
        counts[row.verdict.verdict] = counts.get(row.verdict.verdict, 0) + 1
    runs = sum(len(row.group.scores) for row in rows)
    parts = [
        f"{runs} runs in {len(rows)} configurations, read from the bundles under `results/published/` "
        f"({', '.join(f'`{name}`' for name in RECORD_SUITES)}); verdicts: "
        + (", ".join(f"{n} {name}" for name, n in counts.items()) or "none yet")
        + ". Final return: the deterministic policy's mean over 10 episodes after the last step, mean over seeds "
        "with Student's t interval. Verdicts compare like with like (docs/results.md, Reproduction verdicts).\n",
        table(rows) if rows else "No run of the record has been exported yet.\n",
    ]
    if parity_rows:
        parts += [
            "\nOurs against Stable-Baselines3 (sb3-contrib for TRPO) at identical settings, each side's final "
            "return scored by the same protocol (`python -m benchmark parity`; records in `results/parity/`):\n",
            parity_records.markdown(parity_rows),
        ]
    if images:
        parts.append("\n" + " ".join(f"![{path.stem}]({image_prefix}{path.name})" for path in images) + "\n")
    return "\n".join(parts)


def splice(readme: str, block: str) -> str:
    """``readme`` with the text between the marker lines replaced by ``block``."""
    if START not in readme or END not in readme:
        raise ConfigError(f"the README has no record markers: add the lines\n{START}\n{END}\nwhere the record belongs")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{block.rstrip()}\n{END}{tail}"


def write(
    results_dir: Path = Path("results"), output: Path = RECORD_DIR, readme: Path | None = None, parity_dir: Path | None = None, check: bool = False
) -> tuple[list[Row], bool]:
    """Write the record (and splice it into ``readme``); with ``check``, write nothing and say
    whether ``readme`` already holds it. The rows and whether the README is (now) current."""
    from benchmark.analysis import parity_records

    parity_dir = parity_dir if parity_dir is not None else results_dir / "parity"
    rows = collect(results_dir, parity_dir=parity_dir)
    parity_rows = [row for row in parity_records.table_rows(parity_dir) if row["seeds"]] if parity_dir.is_dir() else []
    images = list(figure_paths(rows, output).values()) if check else figures(rows, output)
    prefix = _relative(output, readme.parent) if readme is not None else ""
    block = markdown(rows, parity_rows, images, prefix)
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
        (output / "record.md").write_text("# The MuJoCo record\n\n" + markdown(rows, parity_rows, images, ""))
    return rows, current


def _relative(directory: Path, base: Path) -> str:
    try:
        return str(directory.resolve().relative_to(base.resolve())) + "/"
    except ValueError:
        return str(directory.resolve()) + "/"
