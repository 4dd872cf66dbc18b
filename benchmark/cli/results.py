"""The commands that move results between machines and judge them: export, import, merge, verdicts, record, calibrate.

Each command adds its own sub-parser (``add_parser``) and has one function; ``benchmark.cli.app``
registers them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.errors import ConfigError
from benchmark.cli.common import (
    add_bundle_arguments,
    add_format,
    add_margin,
    add_seeds_filter,
    add_store_arguments,
    bundled_runs,
    existing_store,
    steps_value,
    store_if_exists,
)
from benchmark.results_layout import ResultsDir

# ConfigError (agents.api) is imported in the functions that raise it: importing agents starts torch,
# and the command line's parser reads this module (--help must not wait for torch).

Command = Callable[[argparse.Namespace, Any], int]


def add_parser(commands: Any) -> None:
    """Add the sub-parsers of the commands in ``COMMANDS``."""
    export = commands.add_parser("export", help="write a suite's finished runs as a result bundle (default results/published/<suite>)")
    export.add_argument("--suite", required=True, help="suite name or path: its run keys decide which runs are exported")
    export.add_argument("--output", type=Path, help="bundle directory (default <results-dir>/published/<suite>); a bundle there is merged with")
    export.add_argument(
        "--replace", action="store_true", help="where the bundle at --output holds a run key with other results, keep the store's (default: refuse)"
    )
    add_seeds_filter(export)
    export.add_argument(
        "--with-weights",
        action="store_true",
        help="carry each run's trained agent (its final checkpoint: networks, optimizers, frozen normalization) for evaluate, continue and load_policy",
    )
    add_store_arguments(export)

    load = commands.add_parser("import", help="load result bundles into the tracking store (for the MLflow UI and every command)")
    load.add_argument("bundles", type=Path, nargs="+", metavar="DIR", help="bundle directories")
    add_store_arguments(load)

    merge = commands.add_parser("merge", help="union result bundles of one suite (from several machines) into one bundle")
    merge.add_argument("bundles", type=Path, nargs="+", metavar="DIR", help="bundle directories")
    merge.add_argument("--output", type=Path, required=True, help="the merged bundle's directory (may be one of the inputs)")

    verdicts = commands.add_parser(
        "verdicts", help="did each algorithm reproduce its published score within the margin? (reproduced, above, below, inconclusive, not comparable)"
    )
    verdicts.add_argument("--suite", required=True, help="suite name or path")
    add_margin(verdicts)
    add_seeds_filter(verdicts)
    verdicts.add_argument("--plan", action="store_true", help="per configuration: the seeds that would decide its verdict, and what they would cost")
    add_format(verdicts)
    add_store_arguments(verdicts)
    add_bundle_arguments(verdicts)

    record = commands.add_parser("record", help="the MuJoCo record from the committed bundles and parity records: results/record/ and the README's table")
    record.add_argument("--output", type=Path, help="directory of record.md and the figures (default <results-dir>/record)")
    record.add_argument(
        "--readme", type=Path, default=Path("README.md"), help="README whose record block (between its marker lines) is rewritten (default README.md)"
    )
    record.add_argument("--no-readme", action="store_true", help="write results/record only")
    record.add_argument("--check", action="store_true", help="write nothing; exit 1 when the README's record is not what the bundles say")
    record.add_argument("--results-dir", type=Path, default=Path("results"), help="where published/ and parity/ are (default results)")
    add_margin(record)
    record.add_argument("--plan", action="store_true", help="write nothing: per cell, the seeds that would decide its verdict and their cost")
    record.add_argument(
        "--refresh-mixed",
        action="store_true",
        help="list the runs of 'mixed code' cells whose behaviour fingerprint differs from this checkout's; with --yes, train them again here and export",
    )
    record.add_argument("--yes", action="store_true", help="with --refresh-mixed: train the listed runs (default: only list them)")
    record.add_argument("--workers", type=int, default=1, help="with --refresh-mixed --yes: runs trained at once (default 1)")
    add_format(record)

    calibrate = commands.add_parser("calibrate", help="measure training and evaluation steps/s on one core into results/perf/throughput.csv")
    calibrate.add_argument("--algos", nargs="+", help="algorithms (default: those of --suite, else every single-task one)")
    calibrate.add_argument("--envs", nargs="+", help="environments (default: those of --suite, else CartPole-v1 and HalfCheetah-v5)")
    calibrate.add_argument("--suite", help="calibrate the configurations of this suite (its settings, its seeds a process)")
    calibrate.add_argument("--steps", type=steps_value, help="env steps of the first of its two runs (default: two update cycles, 2,048 steps at least)")
    calibrate.add_argument(
        "--seeds-per-process", type=int, nargs="+", metavar="N", help="seeds trained in one process, each count measured (default: the suite's setting, else 1)"
    )
    calibrate.add_argument("--output", type=Path, help="throughput CSV (default results/perf/throughput.csv); rows of other pairs are kept")
    add_format(calibrate)


def command_export(args: argparse.Namespace, console: Any) -> int:
    from benchmark import bundles, config
    from benchmark.analysis import bundle_store, records

    tracking_uri = existing_store(args)
    suite = records.with_stored_seeds(config.load_suite(args.suite), tracking_uri, seeds=args.seeds)
    output = args.output or bundles.published_directory(args.results_dir, suite.name)
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output} is a file, not a directory")
    if output.is_dir() and any(output.iterdir()) and not bundles.is_bundle(output):
        raise ConfigError(f"--output {output} is a directory that holds no bundle: choose an empty or new directory")
    from benchmark.tables import plural

    checkpoints = ResultsDir(args.results_dir).checkpoints if args.with_weights else None
    exported = bundle_store.export(suite, tracking_uri, output, args.replace, checkpoints)
    bundle = exported.bundle
    size = sum(path.stat().st_size for path in output.rglob("*") if path.is_file())
    console.print(
        f"bundle {output}: {len(bundle.runs)} {plural(len(bundle.runs), 'run')} of suite {suite.name!r} ({exported.added} added"
        + (f", {exported.replaced} replaced" if exported.replaced else "")
        + f", {len(suite.specs) - len(bundle.runs)} of the suite's {len(suite.specs)} not in it)"
        + (f", {len(bundle.weights)} with {plural(len(bundle.weights), 'its', 'their')} weights" if bundle.weights else "")
        + f", {size / 1e6:.2f} MB",
        highlight=False,
        markup=False,
    )
    if exported.without_weights:
        shown = ", ".join(exported.without_weights[:3]) + (", ..." if len(exported.without_weights) > 3 else "")
        console.print(
            f"note: {len(exported.without_weights)} {plural(len(exported.without_weights), 'run has', 'runs have')} no final checkpoint "
            f"here or in MLflow, so no weights: {shown}",
            highlight=False,
            markup=False,
        )
    return 0


def command_import(args: argparse.Namespace, console: Any) -> int:
    from benchmark import bundles, stores, tracking
    from benchmark.analysis import bundle_store
    from benchmark.tables import plural

    loaded = [bundles.read(directory) for directory in args.bundles]  # every bundle is checked before anything is written
    bundles.merge(bundle.runs.values() for bundle in loaded)
    for bundle in loaded:  # and every weights file against its digest
        for key, weights in bundle.weights.items():
            bundles.weights_bytes(weights, key)
    stores.check_writable_directory(args.results_dir, "results directory")
    tracking_uri = args.tracking_uri or tracking.default_tracking_uri(args.results_dir)
    tracking.ensure_store(tracking_uri, deep=True, writing=True)
    plans: list[bundle_store.ImportPlan] = []
    for bundle in loaded:  # all checked against the store before any is written: all or nothing
        planned = {run.run_key for plan in plans if plan.bundle.suite == bundle.suite for run in plan.to_import}
        plans.append(bundle_store.plan_import(bundle, tracking_uri, planned))
    for plan in plans:
        imported, present, attached = bundle_store.import_bundle(plan, tracking_uri, args.results_dir)
        carried = sum(run.run_key in plan.bundle.weights for run in plan.to_import)
        console.print(
            f"{plan.bundle.origin}: {imported} {plural(imported, 'run')} imported into experiment {plan.bundle.suite!r}"
            + (f" ({carried} with {plural(carried, 'its', 'their')} weights)" if carried else "")
            + (f", {present} already there" if present else "")
            + (f" ({attached} given the bundle's weights)" if attached else "")
            + f" ({tracking.describe_uri(tracking_uri)})",
            highlight=False,
            markup=False,
        )
    return 0


def command_merge(args: argparse.Namespace, console: Any) -> int:
    from benchmark import bundles

    loaded = [bundles.read(directory) for directory in args.bundles]
    suites = sorted({bundle.suite for bundle in loaded})
    if len(suites) > 1:
        raise ConfigError(f"the bundles hold different suites ({', '.join(suites)}): merge bundles of one suite")
    merged = bundles.merge(bundle.runs.values() for bundle in loaded)
    if args.output.exists() and (not args.output.is_dir() or (any(args.output.iterdir()) and not bundles.is_bundle(args.output))):
        raise ConfigError(f"--output {args.output} exists and is not a bundle: choose a new directory")
    bundles.write(bundles.Bundle(suites[0], merged, weights=bundles.merged_weights(loaded, merged)), args.output)
    console.print(
        f"bundle {args.output}: {len(merged)} runs of suite {suites[0]!r} from {len(loaded)} bundles "
        f"({sum(len(b.runs) for b in loaded) - len(merged)} held by more than one)",
        highlight=False,
        markup=False,
    )
    return 0


def verdict_table(suite_name: str, found: list, margin: float) -> Any:
    from benchmark.analysis import scores, verdicts
    from benchmark.tables import TableData

    table = TableData(
        f"suite {suite_name}: reproduction verdicts (ours against the algorithm's own published score, margin ±{margin:g} normalized, stated in advance)",
        ["algorithm", "environment", "steps", "score", "ours (mean ± std)", "published", "verdict", "margin", "test", "note"],
        names={"algorithm", "environment"},
        right={"steps"},
    )
    for v in found:
        margin_text = v.margin.text() if v.margin is not None and v.decision is not None and v.decision.evidence is not None else "—"
        table.add(
            v.label,
            v.env_id,
            f"{v.budget_steps:,}",
            scores.NAMES[v.score],
            verdicts.ours_text(v),
            verdicts.published_text(v),
            v.text,
            margin_text,
            v.test,
            v.reason,
        )
    return table


def command_verdicts(args: argparse.Namespace, console: Any) -> int:
    from benchmark import config
    from benchmark.analysis import records, verdicts
    from benchmark.analysis.report import group_records

    suite = config.load_suite(args.suite)
    bundled = bundled_runs(args, suite.name)
    tracking_uri = store_if_exists(args)
    suite = records.with_stored_seeds(suite, tracking_uri, bundled, args.seeds)
    if tracking_uri is None and not bundled:
        raise ConfigError(
            f"no tracking store in {args.results_dir} and no result bundle of suite {suite.name!r}: pass --results-dir, --tracking-uri or --from DIR"
        )
    found = records.collect(suite, tracking_uri, with_curves=True, bundled=bundled)
    if not any(r.finished for r in found):
        raise ConfigError(f"suite {suite.name!r} has no finished run to judge: train it with python -m benchmark run --suite {args.suite}")
    groups = [g for g in group_records(found) if len(g.scores)]
    judged = verdicts.suite_verdicts(groups, margin=args.margin)
    if args.plan:
        console.table(plan_table(f"suite {suite.name}: seeds that would decide each verdict", plan_rows(groups, judged, tracking_uri, bundled)))
        return 0
    console.table(verdict_table(suite.name, judged, args.margin))
    console.print(
        verdicts.counts_text(judged) + f" (margin ±{args.margin:g} normalized, alpha {verdicts.ALPHA} after Holm; see docs/results.md, Reproduction verdicts)",
        highlight=False,
    )
    return 0


def plan_rows(groups: list, judged: list, tracking_uri: str | None, bundled: dict) -> list:
    """The seed plan of each judged group, priced from the finished runs and the throughput table."""
    from benchmark.analysis import seed_plan
    from benchmark.execution import plan

    past = plan.past_runs(tracking_uri, bundled)
    rows = []
    for group, verdict in zip(groups, judged):
        seconds, basis = seed_plan.seconds_per_seed(group.records[0].spec, past)
        seeds = verdict.ours.n if verdict.ours is not None else 0
        rows.append(seed_plan.plan_row(verdict.label, verdict.env_id, verdict.budget_steps, seeds, verdict.decision, seconds, basis))
    return rows


def plan_table(title: str, rows: list) -> Any:
    from benchmark.analysis import seed_plan
    from benchmark.tables import TableData

    table = TableData(title, seed_plan.HEADERS, names={"algorithm", "task"}, right={"steps", "seeds", "runs to add", "core-hours"})
    for row in rows:
        table.add(*seed_plan.cells(row))
    table.caption = seed_plan.total_text(rows)
    return table


def command_record(args: argparse.Namespace, console: Any) -> int:
    from benchmark import bundles
    from benchmark.analysis import record

    if args.plan or args.refresh_mixed:
        if not any(bundles.is_bundle(bundles.published_directory(args.results_dir, name)) for name in record.RECORD_SUITES):
            published = ResultsDir(args.results_dir).published
            raise ConfigError(f"no bundle of the record ({', '.join(record.RECORD_SUITES)}) under {published}: pass the --results-dir that holds it")
        return record_plan(args, console) if args.plan else refresh_mixed(args, console)
    readme = None if args.no_readme else args.readme
    if readme is not None and not readme.is_file():
        raise ConfigError(f"--readme {readme} is not a file (--no-readme writes {ResultsDir(args.results_dir).record} only)")
    if args.check and readme is None:
        raise ConfigError("--check compares the README's record: drop --no-readme")
    output = args.output or ResultsDir(args.results_dir).record
    found, current = record.write(args.results_dir, output, readme, check=args.check, margin=args.margin)
    runs = sum(len(row.group.scores) for row in found.rows)
    if args.check:
        console.print(
            f"{readme}: the record is {'current' if current else 'STALE: run python -m benchmark record'} ({len(found.rows)} configurations, {runs} runs)",
            highlight=False,
            markup=False,
        )
        return 0 if current else 1
    console.print(
        f"record: {len(found.rows)} configurations, {runs} runs -> {output / 'record.md'}" + (f" and {readme}" if readme is not None else ""),
        highlight=False,
        markup=False,
    )
    return 0


def stale_runs(found: Any) -> list[tuple[str, Any, list[Any]]]:
    """Per mixed-code cell of the record: its suite, its group and the runs whose fingerprint is
    not this checkout's (unknown fingerprints count as stale: their code is not shown to behave
    the same)."""
    from benchmark.training import fingerprint

    current: dict[str, str] = {}
    stale = []
    for row in found.rows:
        if not row.code.get("mixed"):
            continue
        algo = row.group.algo
        if algo not in current:
            current[algo] = fingerprint.fingerprint(algo)
        old = [r for r in row.finished if not (r.fingerprint and current[algo] and fingerprint.same_behaviour(r.fingerprint, current[algo]))]
        if old:
            stale.append((row.suite, row.group, old))
    return stale


def refresh_mixed(args: argparse.Namespace, console: Any) -> int:
    """``record --refresh-mixed``: the runs of mixed-code cells trained by code that behaves
    otherwise than this checkout's; with --yes, each cell's stale seeds trained again here
    (``run --force``) and exported over the bundle's rows (``export --replace``)."""
    import subprocess
    import sys

    from benchmark.analysis import record

    found = record.collect(args.results_dir, parity_dir=ResultsDir(args.results_dir).parity, margin=args.margin)
    stale = stale_runs(found)
    if not stale:
        console.print("no mixed-code cell: every cell's runs carry one behaviour fingerprint (or none is known)", highlight=False, markup=False)
        return 0
    commands = []
    for suite, group, runs in stale:
        seeds = sorted(r.spec.seed for r in runs)
        commits = sorted({(r.git_sha or "?")[:7] for r in runs})
        console.print(
            f"{group.label} on {group.env_id} ({suite}): seeds {' '.join(map(str, seeds))} were trained at {', '.join(commits)} by code that behaves otherwise",
            highlight=False,
            markup=False,
        )
        base = [sys.executable, "-m", "benchmark"]
        where = ["--results-dir", str(args.results_dir)]
        train = [*base, "run", "--suite", suite, "--algos", group.algo, "--envs", group.env_id, "--seeds", *map(str, seeds), "--force", "--yes"]
        commands.append([*train, "--workers", str(args.workers), *where])
        commands.append([*base, "export", "--suite", suite, "--replace", *where])
    if not args.yes:
        console.print("to train them again here and export them (or pass --yes):", highlight=False, markup=False)
        for command in commands:
            console.print("  " + " ".join(command[1:]), highlight=False, markup=False)
        return 0
    for command in commands:
        if subprocess.run(command, check=False).returncode != 0:
            raise ConfigError(f"{' '.join(command[2:])} failed: the bundles keep the runs exported so far")
    console.print("refreshed: run python -m benchmark record to rewrite the record", highlight=False, markup=False)
    return 0


def record_plan(args: argparse.Namespace, console: Any) -> int:
    """``record --plan``: the seeds that would decide each cell of the record and of the parity table, and their cost."""
    from benchmark import bundles
    from benchmark.analysis import record, seed_plan
    from benchmark.execution import plan

    found = record.collect(args.results_dir, parity_dir=ResultsDir(args.results_dir).parity, margin=args.margin)
    bundled: dict = {}
    for name in record.RECORD_SUITES:
        directory = bundles.published_directory(args.results_dir, name)
        if bundles.is_bundle(directory):
            bundled.update(bundles.read(directory).runs)
    past = plan.past_runs(None, bundled)
    rows = []
    for row in found.rows:
        seconds, basis = seed_plan.seconds_per_seed(row.group.records[0].spec, past)
        rows.append(seed_plan.plan_row(row.group.label, row.group.env_id, row.steps, len(row.group.scores), row.verdict.decision, seconds, basis))
    console.table(plan_table(f"the record: seeds that would decide each cell (margin ±{args.margin:g} normalized)", rows))
    parity_rows = []
    for summary in found.parity_rows:
        pair = summary.get("_seconds")
        parity_rows.append(
            seed_plan.plan_row(
                summary["algo"],
                summary["env_id"],
                summary["steps"],
                len(summary["seeds"]),
                summary.get("decision"),
                pair,
                "the record's own runs, both sides",
                sides=2,
            )
        )
    if parity_rows:
        console.table(plan_table("parity: seeds a side that would decide each cell", parity_rows))
    return 0


def command_calibrate(args: argparse.Namespace, console: Any) -> int:
    import agents
    from benchmark import config
    from benchmark.execution import calibrate, estimate
    from benchmark.tables import TableData

    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.seeds_per_process and min(args.seeds_per_process) < 1:
        raise ConfigError(f"--seeds-per-process must be >= 1, got {min(args.seeds_per_process)}")
    if args.suite:
        suite = config.load_suite(args.suite).select(args.algos, args.envs)
        targets = calibrate.targets_of(suite.specs, args.seeds_per_process)
    else:
        algos = args.algos or [name for name in agents.ALGORITHMS if not agents.is_meta(name) and name != "bc"]
        envs = args.envs or ["CartPole-v1", "HalfCheetah-v5"]
        specs = []
        for algo in algos:
            for env_id in envs:
                try:
                    specs.append(config.make_spec(algo, env_id, 0, {"total_steps": 1, "eval_every": 1}))
                except ConfigError as error:
                    if args.algos and args.envs:
                        raise
                    console.print(f"skipped {algo} on {env_id}: {error}", highlight=False, markup=False)
        targets = calibrate.targets_of(specs, args.seeds_per_process)
    for target in targets:  # every target is checked before any is measured
        if agents.is_meta(target.algo):
            raise ConfigError(f"calibrate measures single-task algorithms; {target.algo} is a meta-learner: its estimates come from finished runs")
        calibrate.calibration_specs(target, args.steps)
    output = args.output or estimate.THROUGHPUT_FILE

    def progress(measured: estimate.Throughput, seconds: float) -> None:
        batch = f", {measured.seeds_per_process} seeds a process" if measured.seeds_per_process > 1 else ""
        console.print(
            f"{measured.algo} on {measured.env_id}{batch}: {measured.train_steps_per_second:,.0f} training steps/s, "
            f"{measured.eval_steps_per_second:,.0f} evaluation steps/s ({seconds:.0f} s)",
            highlight=False,
        )

    measured = calibrate.calibrate(targets, args.steps, progress)
    estimate.save_throughput(measured, output)
    table = TableData(
        f"throughput per core-second ({measured[0].cpu_model if measured else ''}), written to {output}",
        ["algorithm", "environment", "seeds a process", "settings", "training steps/s", "evaluation steps/s", "steps"],
        names={"algorithm", "environment", "settings"},
        right={"seeds a process", "training steps/s", "evaluation steps/s", "steps"},
        caption=(
            "settings: those that set the work per step and differ from the algorithm's defaults; "
            "steps/s: env steps of all the process's seeds per second of its CPU"
        ),
    )
    for m in measured:
        table.add(
            m.algo,
            m.env_id,
            m.seeds_per_process,
            m.settings or "defaults",
            f"{m.train_steps_per_second:,.0f}",
            f"{m.eval_steps_per_second:,.0f}",
            f"{m.steps:,}",
        )
    console.table(table)
    return 0


COMMANDS: dict[str, Command] = {
    "export": command_export,
    "import": command_import,
    "merge": command_merge,
    "verdicts": command_verdicts,
    "record": command_record,
    "calibrate": command_calibrate,
}
