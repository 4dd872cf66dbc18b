"""Command line: ``python -m benchmark run|list`` (also installed as ``reprorl``).

Configuration errors print one message naming the problem and the valid choices, and exit 2
before any MLflow run is created.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

EXIT_CONFIG_ERROR = 2
EXIT_RUNS_FAILED = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or ``kill``), handled like Ctrl-C: workers stopped, runs marked KILLED."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmark", description="reprorl: reproducible deep-RL benchmarks")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="train every run of a suite and log it to MLflow")
    run.add_argument("--suite", required=True, help="suite name (suites/NAME.yaml) or path to a suite YAML")
    run.add_argument("--workers", type=int, default=1, help="runs trained in parallel processes (default 1)")
    run.add_argument("--seeds", type=int, nargs="+", help="override the suite's seeds, e.g. --seeds 0 1 2")
    run.add_argument("--device", help="auto (CUDA when available), cpu, cuda or cuda:i; overrides the suite")
    run.add_argument("--algos", nargs="+", help="only the runs of these algorithms, e.g. --algos ppo trpo")
    run.add_argument("--envs", nargs="+", help="only the runs on these environments, e.g. --envs CartPole-v1")
    run.add_argument("--dry-run", action="store_true", help="list the runs the suite expands to and exit")
    run.add_argument("--results-dir", type=Path, default=Path("results"), help="MLflow store, artifacts, checkpoints")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite in --results-dir)")

    listing = commands.add_parser("list", help="algorithms, buffers, suites and environments")
    listing.add_argument("what", nargs="?", choices=("algorithms", "buffers", "suites", "envs"), help="one section only")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from agents.api import ConfigError

    console = Console(width=None if sys.stdout.isatty() else 200)  # logs and pipes get full tables
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        if args.command == "run":
            return command_run(args, console)
        return command_list(args, console)
    except ConfigError as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        return EXIT_CONFIG_ERROR
    except KeyboardInterrupt as interruption:
        Console(stderr=True).print("interrupted: unfinished runs are marked KILLED in MLflow")
        return EXIT_TERMINATED if isinstance(interruption, Terminated) else EXIT_INTERRUPTED


def command_run(args: argparse.Namespace, console: Console) -> int:
    from agents.api import ConfigError
    from benchmark import config

    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if args.seeds is not None and (len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0):
        raise ConfigError(f"--seeds must be distinct non-negative integers, got {args.seeds}")
    if args.device is not None:
        from benchmark.train import resolve_device

        resolve_device(args.device)
    suite = config.load_suite(args.suite, seeds=args.seeds, device=args.device).select(args.algos, args.envs)

    if args.dry_run:
        console.print(_runs_table(suite))
        console.print(f"{len(suite.specs)} runs in suite {suite.name!r} ({suite.path})")
        return 0

    from benchmark import runner, summary, tracking

    results_dir = args.results_dir
    results_dir.mkdir(parents=True, exist_ok=True)
    tracking_uri = args.tracking_uri or tracking.default_tracking_uri(results_dir)
    workers = min(args.workers, len(suite.specs))
    console.print(f"suite {suite.name!r}: {len(suite.specs)} runs, {workers} worker(s), tracking at {tracking_uri}")
    started = time.perf_counter()
    execution = runner.execute(
        suite.specs, suite_name=suite.name, workers=workers, tracking_uri=tracking_uri, results_dir=results_dir
    )
    rows = summary.summarize(execution.outcomes)
    console.print(summary.render_table(rows, f"suite {suite.name} — final deterministic evaluation"))
    report_dir = results_dir / "reports"
    report_dir.mkdir(parents=True, exist_ok=True)
    report = report_dir / f"{suite.name}-{execution.parent_run_id[:8]}.md"
    report.write_text(f"# suite {suite.name}\n\nMLflow parent run `{execution.parent_run_id}`\n\n{summary.to_markdown(rows)}")
    tracking.MlflowTracker(tracking_uri, execution.parent_run_id).log_artifact(report)
    for outcome in execution.outcomes:
        if not outcome.ok:
            console.print(f"[red]{outcome.spec.label} {outcome.status}[/]: {outcome.error}", highlight=False)
    console.print(
        f"{sum(o.ok for o in execution.outcomes)}/{len(execution.outcomes)} runs finished in "
        f"{time.perf_counter() - started:.0f} s; parent run {execution.parent_run_id}; table in {report}"
    )
    return 0 if execution.ok else EXIT_RUNS_FAILED


def _runs_table(suite) -> Table:
    table = Table(title=f"suite {suite.name}: {len(suite.specs)} runs")
    for column in ("run key", "algorithm", "environment", "seed", "steps", "eval every", "overrides"):
        table.add_column(column)
    for spec in suite.specs:
        overrides = ", ".join(f"{k}={v}" for k, v in spec.overrides.items())
        table.add_row(
            spec.run_key, spec.algo, spec.env_id, str(spec.seed), f"{spec.budget.total_steps:,}", f"{spec.budget.eval_every:,}", overrides
        )
    return table


def command_list(args: argparse.Namespace, console: Console) -> int:
    import dataclasses

    import agents
    from agents.buffers import BUFFERS
    from benchmark import config

    what = args.what
    if what in (None, "algorithms"):
        table = Table(title="algorithms")
        for column in ("name", "class", "actions", "hyperparameters (defaults)"):
            table.add_column(column)
        for name, cls in sorted(agents.ALGORITHMS.items()):
            kinds = [
                kind
                for kind, ok in (
                    ("discrete", cls.supports_discrete),
                    ("multi-discrete", cls.supports_multi_discrete),
                    ("continuous", cls.supports_continuous),
                )
                if ok
            ]
            defaults = ", ".join(f"{f.name}={getattr(cls.Config(), f.name)}" for f in dataclasses.fields(cls.Config))
            table.add_row(name, cls.__name__, "/".join(kinds), defaults)
        console.print(table)
    if what in (None, "buffers"):
        table = Table(title="buffers")
        table.add_column("name")
        table.add_column("description")
        for name, (_, description) in BUFFERS.items():
            table.add_row(name, description)
        console.print(table)
    suites = {name: config.load_suite(name) for name in config.available_suites()} if what in (None, "suites", "envs") else {}
    if what in (None, "suites"):
        table = Table(title="suites")
        for column in ("name", "runs", "algorithms", "environments", "description"):
            table.add_column(column)
        for name, suite in suites.items():
            algos = sorted({s.algo for s in suite.specs})
            envs = sorted({s.env_id for s in suite.specs})
            table.add_row(name, str(len(suite.specs)), ", ".join(algos), ", ".join(envs), suite.description)
        console.print(table)
    if what in (None, "envs"):
        from agents.envs import env_spec

        table = Table(title="environments used by the suites")
        for column in ("id", "observation", "actions", "max episode steps"):
            table.add_column(column)
        env_ids = sorted({s.env_id for suite in suites.values() for s in suite.specs})
        for env_id in env_ids:
            spec = env_spec(env_id)
            actions = spec.action_space_name
            if not spec.discrete:
                actions += f" in [{min(spec.action_low):g}, {max(spec.action_high):g}]"
            table.add_row(env_id, f"Box{spec.observation_shape}", actions, str(spec.max_episode_steps))
        console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
