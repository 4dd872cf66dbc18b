"""``python -m benchmark report|reproduce``: a suite's report from the store and bundles; a
recorded run trained again and compared."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import (
    EXIT_RUNS_FAILED,
    add_bundle_arguments,
    add_seeds_filter,
    add_store_arguments,
    bundled_runs,
    error_line,
    existing_store,
    store_if_exists,
    writable_report_directory,
)
from benchmark.results_layout import ResultsDir

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    reproduce = commands.add_parser(
        "reproduce", help="train a recorded run again: bit-identical, or consistent with its cell's seeds; --at-recorded-commit: with its own commit's code"
    )
    reproduce.add_argument("run_id", help="MLflow run id of a finished child run, or a run key (or its MLflow run id) that a bundle holds")
    reproduce.add_argument(
        "--at-recorded-commit",
        action="store_true",
        help="train it with the code of the commit that trained it (a temporary git worktree), name what differs from its machine, compare bit for bit",
    )
    add_store_arguments(reproduce)
    add_bundle_arguments(reproduce, suite_default=False)

    report = commands.add_parser("report", help="report of a suite's runs from MLflow: results/reports/<suite>/report.md and .html")
    report.add_argument("--suite", required=True, help="suite name or path; its run keys decide which runs belong in the report")
    report.add_argument("--output", type=Path, help="directory (default results/reports/<suite>)")
    report.add_argument(
        "--mlflow-ui",
        metavar="URL",
        help="where the MLflow UI serves this store, to link each run to its page (default: the tracking server, else http://localhost:$PORT or 5000)",
    )
    add_seeds_filter(report)
    add_store_arguments(report)
    add_bundle_arguments(report)


def command_reproduce(args: argparse.Namespace, console: Output) -> int:
    from benchmark import bundles
    from benchmark.analysis import reproduce

    published = ResultsDir(args.results_dir).published
    directories = list(args.from_dirs or []) + sorted(d for d in (published.iterdir() if published.is_dir() else []) if bundles.is_bundle(d))
    held = bundles.read_all(directories) if directories else {}
    bundled = reproduce.find_bundled(args.run_id, held)
    tracking_uri = None if bundled is not None else _store_of(args, published)
    if args.at_recorded_commit:
        run = bundled if bundled is not None else reproduce.bundled_from_store(args.run_id, str(tracking_uri))
        return _reproduce_at_commit(run, console)
    if bundled is not None:
        console.print(f"reproducing run {args.run_id} from bundle {bundled.origin} at today's code ...")
        result = reproduce.reproduce_bundled(bundled, ResultsDir(args.results_dir).checkpoints)
        recorded_fingerprint, commit = bundled.fingerprint, bundled.provenance.get("git_sha", "")
        cell = reproduce.cell_scores(result.spec, list(held.values()))
    else:
        console.print(f"reproducing run {args.run_id} from its recorded config at today's code ...")
        result = reproduce.reproduce(args.run_id, str(tracking_uri), ResultsDir(args.results_dir).checkpoints)
        stored = reproduce.bundled_from_store(args.run_id, str(tracking_uri))
        recorded_fingerprint, commit = stored.fingerprint, stored.provenance.get("git_sha", "")
        cell = reproduce.store_cell_scores(result.spec, str(tracking_uri))
    spec = result.spec
    console.print(
        f"{spec.label}, {spec.budget.total_steps:,} steps, run key {spec.run_key}"
        + (f"; trained again in its batch of seeds {' '.join(map(str, result.batch_seeds))}" if result.batch_seeds else ""),
        highlight=False,
    )
    for name, (before, after) in result.environment_changes.items():
        console.print(f"  differs from the recorded run: {name}: {before!r} -> {after!r}", highlight=False, markup=False)
    console.print(reproduce.behaviour_text(spec.algo, recorded_fingerprint, commit), highlight=False, markup=False)
    if result.matches:
        console.print(f"match: all {len(result.now)} evaluations are bit-identical to the recorded ones (final {result.now[-1][1]:.4f})", highlight=False)
        return 0
    console.print(f"[red]differ:[/] {len(result.differences)} of {len(set(dict(result.recorded)) | set(dict(result.now)))} evaluations", highlight=False)
    for line in result.differences[:5]:
        console.print(f"  {line}", highlight=False, markup=False)
    if len(result.differences) > 5:
        console.print(f"  ... and {len(result.differences) - 5} more", highlight=False, markup=False)
    judged = reproduce.judge_against_cell(result.now[-1][1], cell) if result.now else None
    if judged is None:
        console.print("not judged: fewer than 2 finished seeds of this configuration are at hand (--from the bundle that holds them)", highlight=False)
        return 1
    console.print(judged.text(), highlight=False, markup=False)
    console.print("bit-exact repetition needs the recorded commit and CPU type: reproduce --at-recorded-commit", highlight=False, markup=False)
    return 0 if judged.consistent else 1


def _store_of(args: argparse.Namespace, published: Path) -> str:
    """The tracking store to find a run no bundle holds in; its absence named with where else was looked."""

    try:
        return existing_store(args)
    except ConfigError as error:
        raise ConfigError(f"run {args.run_id!r} is in no bundle under {published} (--from DIR reads others), and {error}") from None


def _reproduce_at_commit(run: Any, console: Output) -> int:
    from benchmark.analysis import reproduce

    commit = run.provenance.get("git_sha", "")
    console.print(f"reproducing run {run.run_key} ({run.spec.label}) with the code of {commit[:7]} in a temporary worktree ...", highlight=False)
    for line in reproduce.expected_differences(run.provenance, run.versions):
        console.print(f"  differs from the run's machine: {line}", highlight=False, markup=False)
    found = reproduce.at_recorded_commit(run)
    if not found.mismatches:
        console.print(f"match: all {len(found.now)} evaluations are bit-identical at {found.commit[:7]} (final {found.now[-1][1]:.4f})", highlight=False)
        return 0
    console.print(f"[red]differ:[/] {len(found.mismatches)} evaluations at {found.commit[:7]}", highlight=False)
    for line in found.mismatches[:5]:
        console.print(f"  {line}", highlight=False, markup=False)
    reason = "; ".join(found.differences) or "nothing recorded differs: the run's numbers are not repeated by its own code on this machine"
    console.print(f"expected where the machine or packages differ: {reason}", highlight=False, markup=False)
    return 1


def command_report(args: argparse.Namespace, console: Output) -> int:
    from collections import Counter

    from benchmark import config, tracking
    from benchmark.analysis import records, report

    store_if_exists(args, local_only=True)  # a damaged store is named before the suite is read
    suite = config.load_suite(args.suite)
    bundled = bundled_runs(args, suite.name)
    tracking_uri = store_if_exists(args) if bundled else existing_store(args)
    suite = records.with_stored_seeds(suite, tracking_uri, bundled, args.seeds)
    found = records.collect(suite, tracking_uri, bundled=bundled)
    finished = sum(r.finished for r in found)
    sources = ([tracking.describe_uri(tracking_uri, short=True)] if tracking_uri else []) + sorted({r.source for r in found if r.source})
    if not finished:
        states = Counter(r.status for r in found)
        error_line(
            f"suite {suite.name!r} has no finished run in {' or '.join(sources) or tracking.describe_uri(str(tracking_uri))} ("
            + ", ".join(f"{count} {state.lower()}" for state, count in states.most_common())
            + f" of {len(found)}): nothing to report; train it with: python -m benchmark run --suite {args.suite}"
        )
        return EXIT_RUNS_FAILED
    out_dir = writable_report_directory(args.output or ResultsDir(args.results_dir).report(suite.name), "report")
    strips = records.fetch_video_strips(found, tracking_uri, out_dir / "plots")
    server = tracking_uri is not None and str(tracking_uri).startswith(("http://", "https://"))
    mlflow_ui = args.mlflow_ui or (str(tracking_uri).rstrip("/") if server else f"http://localhost:{os.environ.get('PORT') or 5000}")
    path = report.write_report(suite, found, out_dir, " and ".join(sources), strips=strips, mlflow_ui=mlflow_ui)
    console.print(f"report of suite {suite.name!r} ({finished}/{len(found)} runs finished): {path} and {path.with_suffix('.html')}")
    return 0


COMMANDS = {"reproduce": command_reproduce, "report": command_report}
INTERRUPTED = {"reproduce": "interrupted: unfinished runs are marked KILLED in MLflow"}
