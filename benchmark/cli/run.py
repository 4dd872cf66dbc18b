"""``python -m benchmark run``: train a suite's runs (what is left of them) on an executor, with
the plan and cost first, live progress, and the end-of-run table."""

from __future__ import annotations

import argparse
import collections
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import (
    EXIT_RUNS_FAILED,
    SLURM_ARGUMENTS,
    add_bundle_arguments,
    add_format,
    add_seeds_per_process,
    add_slurm_arguments,
    bundled_runs,
    slurm_options,
    steps_value,
    store_if_exists,
)
from benchmark.results_layout import ResultsDir
from benchmark.tables import plural

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    run = commands.add_parser("run", help="train every run of a suite and log it to MLflow")
    run.add_argument("--suite", required=True, help="suite name (suites/NAME.yaml) or path to a suite YAML")
    run.add_argument("--seeds", type=int, nargs="+", help="override the suite's seeds, e.g. --seeds 0 1 2")
    run.add_argument("--algos", nargs="+", help="only the runs of these algorithms, e.g. --algos ppo trpo")
    run.add_argument("--envs", nargs="+", help="only the runs on these environments, e.g. --envs CartPole-v1")
    add_run_options(run)


def add_run_options(run: argparse.ArgumentParser) -> None:
    """What ``run`` and ``train`` share: where and how the runs train, and what is shown."""
    run.add_argument("--workers", type=int, default=1, help="runs trained in parallel processes (default 1)")
    run.add_argument(
        "--device",
        help="auto (every visible GPU, else CPU), cpu, cuda (every visible GPU) or cuda:i (that GPU only); overrides the suite",
    )
    run.add_argument(
        "--runs-per-gpu",
        type=int,
        metavar="K",
        help="runs trained at once on each GPU (default: --workers spread over the GPUs); each run process sees only its GPU",
    )
    run.add_argument(
        "--executor",
        choices=("local", "ray", "slurm"),
        default="local",
        help="local process pool (default), Ray tasks or Slurm jobs through submitit (make install adds both)",
    )
    run.add_argument("--address", help="with --executor ray: the cluster to join ('auto': the running one); default: a local Ray")
    add_slurm_arguments(run)
    run.add_argument(
        "--dry-run", action="store_true", help="list the runs with their state (finished, resumes, claimed, to train) and the estimated cost, and exit"
    )
    run.add_argument("--force", action="store_true", help="rerun specs that already have a FINISHED run in the tracking store or a bundle")
    run.add_argument(
        "--max-hours",
        type=float,
        default=24.0,
        metavar="H",
        help="ask before starting an invocation estimated to take more than H hours of wall time (default 24); without a terminal, refuse unless --yes",
    )
    run.add_argument("--yes", action="store_true", help="start without asking, whatever the estimate")
    add_bundle_arguments(run)
    run.add_argument(
        "--no-wait",
        action="store_true",
        help="leave the runs another launch is training to it instead of waiting for them (default: wait, and take over any it leaves unfinished)",
    )
    run.add_argument(
        "--checkpoint-every",
        type=steps_value,
        metavar="STEPS",
        help="env steps between resumable checkpoints (default: the suite's, else at every evaluation; 0: only the final one)",
    )
    run.add_argument(
        "--checkpoint-replay-buffer",
        action="store_true",
        help="include the replay buffer in checkpoints (large), so off-policy runs resume exactly",
    )
    add_seeds_per_process(run)
    run.add_argument(
        "--distributed",
        metavar="KEY=VALUE,...",
        help=(
            "train each run over workers, e.g. collectors=4,gradient_workers=2 (keys: collectors, gradient_workers, mode, "
            "max_staleness, chunk, backend; merged into the suite's distributed:; docs/distributed.md)"
        ),
    )
    run.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture each gradient step as a CUDA graph and replay it (sac, td3, ddpg on a GPU; docs/performance.md)",
    )
    add_format(run)
    run.add_argument("--results-dir", type=Path, default=Path("results"), help="MLflow store, artifacts, checkpoints")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite in --results-dir)")


def check_run_arguments(args: argparse.Namespace) -> None:

    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if getattr(args, "runs_per_gpu", None) is not None and args.runs_per_gpu < 1:
        raise ConfigError(f"--runs-per-gpu must be >= 1, got {args.runs_per_gpu}")
    if getattr(args, "address", None) and getattr(args, "executor", "local") != "ray":
        raise ConfigError("--address is for --executor ray")
    given = [name for name in (*SLURM_ARGUMENTS, "slurm_cluster") if getattr(args, name, None) not in (None, "slurm")]
    if given and getattr(args, "executor", "local") != "slurm":
        raise ConfigError(f"--{given[0].replace('_', '-')} is for --executor slurm")
    if args.seeds is not None and (len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0):
        raise ConfigError(f"--seeds must be distinct non-negative integers, got {args.seeds}")
    if args.seeds_per_process is not None and args.seeds_per_process < 1:
        raise ConfigError(f"--seeds-per-process must be >= 1, got {args.seeds_per_process}")
    if getattr(args, "device", None) is not None:
        from benchmark.devices import resolve_device

        resolve_device(args.device)


def command_run(args: argparse.Namespace, console: Output) -> int:
    from benchmark import config, stores

    check_run_arguments(args)
    store_if_exists(args, local_only=True)  # a damaged store is named before the suite is read
    suite = config.load_suite(args.suite, seeds=args.seeds, device=args.device).select(args.algos, args.envs)
    suite = suite.with_checkpointing(args.checkpoint_every, args.checkpoint_replay_buffer or None)
    suite = suite.with_seeds_per_process(args.seeds_per_process)
    suite = suite.with_distributed(parse_settings(args.distributed, "--distributed") if args.distributed is not None else None)
    suite = suite.with_cuda_graphs(getattr(args, "cuda_graphs", False))
    if getattr(args, "executor", "local") == "local" and any(spec.cuda_graphs for spec in suite.specs):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("cuda_graphs: this machine has no GPU that torch can use")
    _warn_no_update(suite, console)
    bundled = bundled_runs(args, suite.name)
    if args.dry_run:
        from benchmark.execution import plan as planning

        found = _plan(suite, args, bundled)
        _, notices = planning.plan_processes([state.spec for state in found.left])
        console.table(
            planning.runs_table(found, f"suite {suite.name}: {len(suite.specs)} runs"), planning.experiments_table(found, f"suite {suite.name}: per experiment")
        )
        for notice in notices:
            console.print(notice, highlight=False, soft_wrap=True)
        processes = len(set(found.processes.values()))
        console.print(
            f"{len(suite.specs)} runs in suite {suite.name!r} ({getattr(args, 'suite_shown', None) or suite.path})"
            + (f", the {len(found.left)} left trained in {processes} process{'es' if processes != 1 else ''}" if processes < len(found.left) else ""),
            highlight=False,
        )
        console.print(planning.total_line(found, _workers_text(args, suite)), highlight=False, markup=False)
        return 0
    found = _plan(suite, args, bundled)  # reads the store when it exists (a bad URI fails here), creates nothing
    stores.check_usable_directory(args.results_dir, "results directory")  # before the plan is printed
    _confirm_cost(found, args, console, suite)
    # the live ETA's figure for a run before runs of its work are measured: the wall seconds of
    # its process (a batch's seeds train at once, each over its process's whole time)
    batch = collections.Counter(found.processes.values())
    estimated = {run.spec.run_key: run.seconds * batch[found.processes[run.spec.run_key]] for run in found.cost.runs if run.seconds is not None}
    execution = execute_suite(suite, args, console, force=args.force, bundled=bundled, estimated=estimated)
    _next_commands(execution.records, suite, args, console)
    elsewhere = [o for o in execution.records if o.status == "CLAIMED"]
    if elsewhere:
        console.print(
            f"{len(elsewhere)} {plural(len(elsewhere), 'run')} left to the launch that is training them: " + ", ".join(o.spec.label for o in elsewhere),
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    failed = [o for o in execution.records if not o.ok and o.status != "CLAIMED"]
    if not failed:
        return 0
    console.print(
        f"[red]{len(failed)} {plural(len(failed), 'run')} did not finish:[/] " + ", ".join(o.spec.label for o in failed), highlight=False, soft_wrap=True
    )
    command = ["python", "-m", "benchmark", "run", "--suite", args.suite]
    if args.seeds is not None:
        command += ["--seeds", *map(str, args.seeds)]
    for flag, values in (("--algos", args.algos), ("--envs", args.envs)):
        if values:
            command += [flag, *values]
    if args.seeds_per_process is not None:
        command += ["--seeds-per-process", str(args.seeds_per_process)]
    if args.distributed is not None:
        command += ["--distributed", args.distributed]
    if getattr(args, "cuda_graphs", False):
        command.append("--cuda-graphs")
    console.print(
        "re-run them (finished runs are skipped, so this trains only the failed ones): " + " ".join(command),
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    return EXIT_RUNS_FAILED


SHOWN_RUNS = 8
"""Finished runs named one per line at the end of a launch (more: the table and the report hold them)."""


def store_options(args: argparse.Namespace) -> list[str]:
    """The options that say where this command's runs are, to repeat in a command it suggests."""
    options = ["--results-dir", str(args.results_dir)]
    if getattr(args, "tracking_uri", None):
        options += ["--tracking-uri", args.tracking_uri]
    return options


def suite_argument(suite) -> str:
    """How a command names ``suite``: its name when it is one of the project's, else its path."""
    from benchmark import config

    return str(suite.path) if suite.path.parent != config.SUITES_DIR else suite.name


def _next_commands(records: list, suite, args: argparse.Namespace, console: Output) -> None:
    """Each finished run's key and MLflow run id (evaluate and continue take either), then the
    evaluate and continue commands of the first, ready to paste with this launch's store options
    (the report's command closes ``execute_suite``'s last line)."""

    finished = [record for record in records if record.status == "FINISHED" and record.run_id and not record.source]
    for record in finished[:SHOWN_RUNS]:
        console.print(f"{record.spec.label}: run key {record.spec.run_key}, MLflow run {record.run_id}", highlight=False, soft_wrap=True, markup=False)
    if len(finished) > SHOWN_RUNS:
        console.print(f"... and {len(finished) - SHOWN_RUNS} more finished runs (their keys: the table above and the report)", highlight=False)
    if not finished:
        return
    where, key = store_options(args), finished[0].spec.run_key
    lines = [
        ["python", "-m", "benchmark", "evaluate", key, *where],
        ["python", "-m", "benchmark", "continue", key, "--steps", str(finished[0].spec.budget.total_steps), *where],
    ]
    console.print("next: " + "\n      ".join(shlex.join(line) for line in lines), highlight=False, soft_wrap=True, markup=False)


def _warn_no_update(suite, console: Output) -> None:
    """One line per configuration whose budget ends before its first gradient step (``train``
    and ``continue`` refuse such a run; a suite's runs are warned about and still trained)."""
    from benchmark.execution.plan import no_update_problem

    said = set()
    for spec in suite.specs:
        key = (spec.algo, spec.env_id, repr(sorted(spec.hyperparameters.items())), spec.budget.total_steps)
        if spec.continued_from is not None or key in said:  # (a continued run's refill depends on where it ended)
            continue
        said.add(key)
        problem = no_update_problem(spec, spec.budget.total_steps)
        if problem:
            console.print(
                f"warning: {problem[0]}: raise its budget's total_steps to {problem[1]:,} or lower those settings",
                highlight=False,
                soft_wrap=True,
                markup=False,
            )


def parse_settings(text: str, flag: str) -> dict[str, int | str]:
    """``key=value,key=value`` -> a mapping (integers where the value is one); ConfigError
    naming ``flag`` when a pair has no ``=``."""

    settings: dict[str, int | str] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, equals, value = pair.partition("=")
        if not equals or not key.strip() or not value.strip():
            raise ConfigError(f"{flag}: {pair!r} is not KEY=VALUE (e.g. {flag} collectors=4,mode=sync)")
        value = value.strip()
        settings[key.strip()] = int(value) if value.lstrip("-").isdigit() else value
    if not settings:
        raise ConfigError(f"{flag}: give KEY=VALUE pairs, e.g. {flag} collectors=4")
    return settings


def _workers_text(args: argparse.Namespace, suite) -> str:
    workers = min(args.workers, len(suite.specs))
    return f"{workers} worker{'s' if workers != 1 else ''}"


def _plan(suite, args: argparse.Namespace, bundled: dict):
    from benchmark.execution import plan

    return plan.make_plan(suite.specs, store_if_exists(args), suite.name, bundled, args.results_dir, min(args.workers, len(suite.specs)), force=args.force)


def _confirm_cost(found, args: argparse.Namespace, console, suite) -> None:
    """Print what the invocation will cost; above --max-hours, ask on a terminal, else refuse without --yes."""
    from benchmark.execution import estimate
    from benchmark.execution import plan as planning

    if found.left:
        table = planning.experiments_table(found, f"suite {suite.name}: what is left and what it costs")
        console.console.print(table.rich(console.console.width))  # beside a machine format: on stderr
    total = planning.total_line(found, _workers_text(args, suite))
    console.print(total, highlight=False, markup=False)
    hours = found.cost.wall_seconds / 3600
    if args.yes or hours <= args.max_hours:
        return
    question = (
        f"suite {suite.name!r} is estimated at {estimate.hours(found.cost.wall_seconds)} of wall time with "
        f"{_workers_text(args, suite)}, above --max-hours {args.max_hours:g}"
    )
    if sys.stdin.isatty():
        answer = input(f"{question}. Start it? [y/N] ").strip().lower()
        if answer in ("y", "yes"):
            return
        raise ConfigError(f"{question}: not started")
    raise ConfigError(f"{question}: pass --yes to start it anyway, or --max-hours H, or select runs with --algos/--envs/--seeds")


def execute_suite(suite, args: argparse.Namespace, console: Output, force: bool = True, bundled: dict | None = None, estimated: dict | None = None):
    """Train every run of ``suite`` under one MLflow parent run; print and store the summary table.

    ``force=False`` reuses the runs an earlier invocation finished (``run``); baseline and
    regress measure the code as it is now, so they always train."""
    from rich.markup import escape

    from benchmark import stores, tracking
    from benchmark.analysis import summary
    from benchmark.execution import suite as launching

    results_dir = args.results_dir
    workers = min(args.workers, len(suite.specs))
    name = getattr(args, "executor", "local")
    # a device this machine lacks, a missing package or a bad option fails before anything is created
    executor = launching.make_executor(
        name,
        suite.specs,
        workers,
        results_dir,
        getattr(args, "runs_per_gpu", None),
        getattr(args, "address", None),
        slurm_options(args, suite.slurm) if name == "slurm" else None,
        getattr(args, "slurm_cluster", "slurm"),
    )
    if args.tracking_uri:  # a bad URI fails before anything is created
        tracking.ensure_store(args.tracking_uri, deep=True, writing=True)
    stores.check_writable_directory(results_dir, "results directory")
    tracking_uri = args.tracking_uri or tracking.default_tracking_uri(results_dir)
    tracking.ensure_store(tracking_uri, deep=True, writing=True)
    console.print(
        f"suite {suite.name!r}: {len(suite.specs)} {plural(len(suite.specs), 'run')}, {workers} {plural(workers, 'worker')}, tracking at {tracking_uri}"
    )
    started = time.perf_counter()
    execution = launching.execute(
        suite.specs,
        suite_name=suite.name,
        workers=workers,
        tracking_uri=tracking_uri,
        results_dir=results_dir,
        force=force,
        executor=executor,
        console=console.console,
        wait_for_others=not getattr(args, "no_wait", False),
        bundled=bundled,
        estimated=estimated,
    )
    rows = summary.summarize(execution.records)
    console.table(summary.table(rows, f"suite {suite.name} — final deterministic evaluation"))
    report = None
    if execution.parent_run_id:  # a launch that trained something: its table, beside its parent run
        report_dir = ResultsDir(results_dir).reports
        report_dir.mkdir(parents=True, exist_ok=True)
        report = report_dir / f"{suite.name}-{execution.parent_run_id[:8]}.md"
        report.write_text(f"# suite {suite.name}\n\nMLflow parent run `{execution.parent_run_id}`\n\n{summary.to_markdown(rows)}")
        tracking.MlflowTracker(tracking_uri, execution.parent_run_id).log_artifact(report)
    for outcome in execution.records:
        if not outcome.ok and outcome.status != "CLAIMED":
            console.print(f"[red]{escape(outcome.spec.label)} {outcome.status}[/]: {escape(str(outcome.error))}", highlight=False)
    bundles = ["--from", *map(str, args.from_dirs)] if getattr(args, "from_dirs", None) else []
    from_bundles = sum(bool(o.source) for o in execution.records)
    earlier = execution.finished_before - from_bundles
    meanwhile = sum(o.skipped for o in execution.records) - execution.finished_before
    by_others = [f"{from_bundles} of them held by result bundles"] if from_bundles else []
    by_others += [f"{earlier} of them in an earlier invocation"] if earlier else []
    by_others += [f"{meanwhile} by another launch meanwhile"] if meanwhile else []
    console.print(
        f"{sum(o.ok for o in execution.records)}/{len(execution.records)} runs finished" + (f" ({', '.join(by_others)})" if by_others else "") + " in "
        f"{time.perf_counter() - started:.0f} s; "
        + (f"parent run {execution.parent_run_id}; table in {report}; " if report else "")
        + "full report with CIs and plots: "
        + shlex.join(["python", "-m", "benchmark", "report", "--suite", suite_argument(suite), *store_options(args), *bundles]),
        soft_wrap=True,
    )
    return execution


COMMANDS = {"run": command_run}
INTERRUPTED = {"run": "interrupted: unfinished runs are marked KILLED in MLflow"}
