"""``python -m benchmark compare --candidate SUITE_OR_BUNDLE --baseline published/mujoco``: a
candidate's runs against baselines' on the tasks both ran (``benchmark.analysis.compare``):
per task equivalent, better, worse or inconclusive by the verdict rule; normalized aggregates, the
probability of improvement and performance profiles; a report under results/reports/."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import EXIT_RUNS_FAILED, add_format, add_margin, add_store_arguments, error_line, store_if_exists, writable_report_directory
from benchmark.results_layout import ResultsDir

if TYPE_CHECKING:
    from benchmark.run_record import RunRecord
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    compare = commands.add_parser(
        "compare",
        help="a candidate's runs against baselines' (e.g. published/mujoco): per task equivalent, better, worse or inconclusive; aggregates",
    )
    compare.add_argument("--candidate", required=True, help="a suite (name or path: its runs in the store and its bundle) or a result bundle directory")
    compare.add_argument(
        "--baseline", required=True, nargs="+", help="result bundles or suites; published/NAME is <results-dir>/published/NAME (the committed record)"
    )
    compare.add_argument("--algos", nargs="+", help="only these baseline algorithms (default: every one)")
    compare.add_argument("--output", type=Path, help="report directory (default results/reports/compare-<candidate>-vs-<baseline>)")
    add_margin(compare)
    add_store_arguments(compare)
    add_format(compare)


def records_of(source: str, args: argparse.Namespace) -> tuple[str, list[RunRecord]]:
    """The name and the runs of a bundle directory (``published/NAME``: under the results
    directory, else the checkout's committed one) or of a suite (its runs in the store, and its
    published bundle)."""
    from benchmark import bundles, config
    from benchmark.analysis import records
    from benchmark.execution import plan
    from benchmark.run_record import from_bundle

    path = Path(source)
    for results in (Path(args.results_dir), config.PROJECT_ROOT / "results"):  # then the checkout's committed record
        if not path.is_dir() and (results / source).is_dir():
            path = results / source
    if path.is_dir():
        if not bundles.is_bundle(path):
            raise ConfigError(f"{source} is a directory but not a result bundle (it has no {bundles.MANIFEST})")
        bundle = bundles.read(path)
        return bundle.suite or path.name, [from_bundle(run.spec, run) for run in bundle.runs.values()]
    suite = config.load_suite(source)
    bundled = plan.default_bundles(Path(args.results_dir), suite.name, None, True)
    return suite.name, records.collect(suite, store_if_exists(args), bundled=bundled)


def command_compare(args: argparse.Namespace, console: Output) -> int:
    from benchmark.analysis import compare
    from benchmark.config import name_from
    from benchmark.tables import TableData

    candidate_name, candidate = records_of(args.candidate, args)
    baseline_names, baseline = [], []
    for source in args.baseline:
        name, found = records_of(source, args)
        baseline_names.append(name)
        baseline += found
    finished = [record for record in candidate if record.finished]
    if not finished:
        error_line(f"the candidate {args.candidate} has no finished run: nothing to compare (train it first)")
        return EXIT_RUNS_FAILED
    algos = sorted({record.spec.algo for record in baseline if record.finished})
    for algo in args.algos or []:
        if algo not in algos:
            raise ConfigError(f"--algos {algo}: the baseline has no finished run of it; it has {', '.join(algos) or 'none'}")
    pairs = compare.compare(candidate, baseline, args.algos, margin=args.margin)
    if not pairs:
        tasks = sorted({record.spec.env_id for record in finished})
        error_line(f"the baseline has no run on the candidate's tasks ({', '.join(tasks)}): nothing to compare")
        return EXIT_RUNS_FAILED
    title = f"{candidate_name} against {' and '.join(baseline_names)}"
    default = ResultsDir(args.results_dir).report(name_from(f"compare-{candidate_name}-vs-{'-'.join(baseline_names)}"))
    out_dir = writable_report_directory(args.output or default, "comparison")
    per_task = TableData(f"{title}: per task", compare.TASK_HEADERS, names={"candidate", "baseline", "task"}, right={"steps", "difference"})
    for row in compare.task_rows(pairs):
        per_task.add(*row)
    console.table(per_task)
    across = TableData(f"{title}: across tasks (normalized scores)", compare.AGGREGATE_HEADERS, names={"candidate", "baseline"}, right={"tasks"})
    for row in compare.aggregate_rows(pairs):
        across.add(*row)
    console.table(across)
    path = compare.write(pairs, out_dir, f"Comparison: {title}", f"Candidate: `{args.candidate}`; baseline: {', '.join(f'`{b}`' for b in args.baseline)}.")
    console.print(f"comparison report: {path} and {path.with_suffix('.html')}", highlight=False, soft_wrap=True)
    return 0


COMMANDS = {"compare": command_compare}
