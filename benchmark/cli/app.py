"""Command line: ``python -m benchmark run|list`` (also installed as ``reprorl``).

Configuration errors print one message naming the problem and the valid choices, and exit 2
before any MLflow run is created.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.table import Table

EXIT_CONFIG_ERROR = 2
EXIT_RUNS_FAILED = 1
EXIT_REGRESSION = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or ``kill``), handled like Ctrl-C: workers stopped, runs marked KILLED."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (not the usage block), exit 2 like every bad input."""

    def error(self, message: str) -> NoReturn:
        _error_line(f"{self.prog}: {message} (see {self.prog} --help)")
        sys.exit(EXIT_CONFIG_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m benchmark", description="reprorl: reproducible deep-RL benchmarks")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="train every run of a suite and log it to MLflow")
    run.add_argument("--suite", required=True, help="suite name (suites/NAME.yaml) or path to a suite YAML")
    run.add_argument("--workers", type=int, default=1, help="runs trained in parallel processes (default 1)")
    run.add_argument("--seeds", type=int, nargs="+", help="override the suite's seeds, e.g. --seeds 0 1 2")
    run.add_argument(
        "--device",
        help="auto (every visible GPU, else CPU), cpu, cuda (every visible GPU) or cuda:i (that GPU only); overrides the suite",
    )
    run.add_argument(
        "--runs-per-gpu", type=int, metavar="K",
        help="runs trained at once on each GPU (default: --workers spread over the GPUs); each run process sees only its GPU",
    )
    run.add_argument("--executor", choices=("local", "ray", "slurm"), default="local",
                     help="local process pool (default), Ray tasks or Slurm jobs through submitit (make install adds both)")
    run.add_argument("--address", help="with --executor ray: the cluster to join ('auto': the running one); default: a local Ray")
    add_slurm_arguments(run)
    run.add_argument("--algos", nargs="+", help="only the runs of these algorithms, e.g. --algos ppo trpo")
    run.add_argument("--envs", nargs="+", help="only the runs on these environments, e.g. --envs CartPole-v1")
    run.add_argument("--dry-run", action="store_true",
                     help="list the runs with their state (finished, resumes, claimed, to train) and the estimated cost, and exit")
    run.add_argument("--force", action="store_true",
                     help="rerun specs that already have a FINISHED run in the tracking store or a bundle")
    run.add_argument("--max-hours", type=float, default=24.0, metavar="H",
                     help="ask before starting an invocation estimated to take more than H hours of wall time (default 24); "
                          "without a terminal, refuse unless --yes")
    run.add_argument("--yes", action="store_true", help="start without asking, whatever the estimate")
    _add_bundle_arguments(run)
    run.add_argument(
        "--no-wait", action="store_true",
        help="leave the runs another launch is training to it instead of waiting for them (default: wait, and take "
             "over any it leaves unfinished)",
    )
    run.add_argument(
        "--checkpoint-every", type=int, metavar="STEPS",
        help="env steps between resumable checkpoints (default: the suite's, else at every evaluation; 0: only the final one)",
    )
    run.add_argument(
        "--checkpoint-replay-buffer", action="store_true",
        help="include the replay buffer in checkpoints (large), so off-policy runs resume exactly",
    )
    _add_seeds_per_process(run)
    _add_format(run)
    run.add_argument("--results-dir", type=Path, default=Path("results"), help="MLflow store, artifacts, checkpoints")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite in --results-dir)")

    reproduce = commands.add_parser("reproduce", help="train a recorded MLflow run again from its config and compare the metrics")
    reproduce.add_argument("run_id", help="MLflow run id of a finished child run, or a run key (or its MLflow run id) that a bundle holds")
    _add_store_arguments(reproduce)
    _add_bundle_arguments(reproduce, suite_default=False)

    report = commands.add_parser("report", help="report of a suite's runs from MLflow: results/reports/<suite>/report.md and .html")
    report.add_argument("--suite", required=True, help="suite name or path; its run keys decide which runs belong in the report")
    report.add_argument("--output", type=Path, help="directory (default results/reports/<suite>)")
    _add_store_arguments(report)
    _add_bundle_arguments(report)

    baseline = commands.add_parser("baseline", help="run a suite and store its final scores as the regression baseline")
    baseline.add_argument("--suite", default="ci", help="suite name or path (default ci)")
    baseline.add_argument("--output", type=Path, help="baseline JSON (default results/baselines/<suite>.json)")
    baseline.add_argument("--seeds", type=int, nargs="+", help="override the suite's seeds")
    baseline.add_argument("--workers", type=int, default=1, help="runs trained in parallel processes (default 1)")
    _add_seeds_per_process(baseline)
    _add_format(baseline)
    _add_store_arguments(baseline)

    regress = commands.add_parser("regress", help="rerun a suite on new seeds and compare with its baseline; exit 1 on a regression")
    regress.add_argument("--suite", default="ci", help="suite name or path (default ci)")
    regress.add_argument("--baseline", type=Path, help="baseline JSON (default results/baselines/<suite>.json)")
    regress.add_argument("--seeds", type=int, nargs="+", help="seeds to run (default: the baseline's shifted by 100)")
    regress.add_argument("--algos", nargs="+", help="check only these algorithms' rows")
    regress.add_argument("--envs", nargs="+", help="check only the rows on these environments")
    regress.add_argument("--workers", type=int, default=1, help="runs trained in parallel processes (default 1)")
    _add_seeds_per_process(regress)
    regress.add_argument("--alpha", type=float, default=0.05, help="family-wise false-alarm rate (Holm over rows; default 0.05)")
    regress.add_argument("--min-effect", type=float, default=0.1, help="smallest drop that counts, in normalized score (default 0.1)")
    regress.add_argument("--from", dest="from_dirs", type=Path, nargs="+", metavar="DIR",
                         help="compare against these result bundles' runs of the suite instead of the baseline JSON")
    _add_format(regress)
    _add_store_arguments(regress)

    reference = commands.add_parser("reference", help="reference scores: build the table, measure random-policy scores, show")
    reference_commands = reference.add_subparsers(dest="reference_command", required=True)
    build = reference_commands.add_parser("build", help="write results/reference/scores.csv from the shared published table")
    build.add_argument("--source", type=Path, help="published scores CSV (default ../shared/reference/scores.csv)")
    random = reference_commands.add_parser("random", help="measure uniform-random-policy returns into results/reference/random.csv")
    random.add_argument("--env", nargs="+", required=True, help="gymnasium ids, e.g. --env CartPole-v1 HalfCheetah-v5")
    random.add_argument("--episodes", type=int, default=100, help="episodes per environment (default 100)")
    random.add_argument("--seed", type=int, default=0, help="seed of the first episode and of the action sampler")
    show = reference_commands.add_parser("show", help="the reference and random score each environment is normalized with")
    show.add_argument("--env", nargs="+", help="environments (default: every environment of every suite)")
    _add_format(show)

    tune = commands.add_parser(
        "tune", help="Optuna study: tune ALGO on ENV against its reference score (tune show|export STUDY to read one)",
        description="Run (or resume) an Optuna study of --algo on --env; `tune show STUDY` and `tune export STUDY` read one.",
        allow_abbrev=False,  # `tune export S --seeds N` is export's option, not an abbreviation of tune's --seeds-per-*
    )
    tune.add_argument("--algo", help="algorithm to tune (its search space: suites/search/ALGO.yaml)")
    tune.add_argument("--env", help="gymnasium id; its reference and random scores normalize the objective")
    tune.add_argument("--trials", type=int, default=20, help="trials this invocation adds to the study (default 20)")
    tune.add_argument("--budget", type=int, metavar="STEPS",
                      help="env steps per seed of a trial (default: the budget of the suite that runs ALGO on ENV)")
    tune.add_argument("--seeds-per-trial", type=int, metavar="S", help="seeds each trial trains and averages (default 1)")
    tune.add_argument(
        "--seeds-per-process", type=int, default=1, metavar="N",
        help="train a trial's seeds N at a time as one batched model (default 1: one after another)",
    )
    tune.add_argument("--study", help="study name (default ALGO-ENV); an existing study is resumed")
    tune.add_argument("--storage", help="Optuna storage URL: sqlite:///PATH, postgresql://..., journal:PATH (default sqlite in --results-dir)")
    tune.add_argument("--workers", type=int, default=1, help="worker processes running trials of the study at once (default 1)")
    tune.add_argument("--sampler", choices=("tpe", "random", "cmaes"), default="tpe", help="default tpe (seeded)")
    tune.add_argument("--pruner", choices=("median", "hyperband", "none"), default="median", help="default median")
    tune.add_argument("--pruner-startup-trials", type=int, default=5, metavar="N", help="median pruner: trials before any pruning (default 5)")
    tune.add_argument("--pruner-warmup-steps", type=int, metavar="STEPS",
                      help="median pruner: steps of a trial before it can be pruned (default a third of the budget)")
    tune.add_argument("--timeout", type=float, metavar="SECONDS", help="start no new trial after this long")
    tune.add_argument("--suite", help="take the budget and fixed hyperparameters from this suite's ALGO/ENV run (none: published defaults)")
    tune.add_argument("--space", type=Path, help="search space YAML (default suites/search/ALGO.yaml)")
    tune.add_argument("--reference", type=float, metavar="SCORE", help="reference score, for an env without a published one")
    tune.add_argument("--random", type=float, metavar="SCORE", help="random-policy score, for an env not measured yet")
    tune.add_argument("--seed", type=int, help="seed of the samplers and of the trials' seeds (default 0)")
    tune.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:i (as for run)")
    tune.add_argument("--runs-per-gpu", type=int, metavar="K", help="workers per GPU, at most (default: the workers spread over the GPUs)")
    tune.add_argument("--executor", choices=("local", "ray", "slurm"), default="local",
                      help="where trials run: local processes (default), Ray tasks or Slurm jobs; at most --workers at once")
    tune.add_argument("--address", help="with --executor ray: the cluster to join ('auto': the running one); default: a local Ray")
    add_slurm_arguments(tune)
    _add_store_arguments(tune)
    tune_commands = tune.add_subparsers(dest="tune_command")
    show_study = tune_commands.add_parser("show", help="best trials, parameter importances, plots (PNG) under results/tune/STUDY")
    show_study.add_argument("study", help="study name")
    show_study.add_argument("--top", type=int, default=10, help="best trials to list (default 10)")
    show_study.add_argument("--output", type=Path, help="plot directory (default results/tune/STUDY)")
    _add_format(show_study)
    # (SUPPRESS: given before the subcommand, `tune --results-dir X show S`, they still count)
    show_study.add_argument("--storage", default=argparse.SUPPRESS, help="Optuna storage URL (default sqlite in --results-dir)")
    show_study.add_argument("--results-dir", type=Path, default=argparse.SUPPRESS, help="where the default storage and plots are")
    export_study = tune_commands.add_parser("export", help="write the best trial as a suite: suites/tuned/ALGO-ENV.yaml")
    export_study.add_argument("study", help="study name")
    export_study.add_argument("--seeds", type=int, default=10, help="seeds of the exported suite (default 10: seeds 0..9)")
    export_study.add_argument("--output", type=Path, help="suite file (default suites/tuned/ALGO-ENV.yaml)")
    export_study.add_argument("--force", action="store_true", help="replace an existing suite file")
    export_study.add_argument("--storage", default=argparse.SUPPRESS, help="Optuna storage URL (default sqlite in --results-dir)")
    export_study.add_argument("--results-dir", type=Path, default=argparse.SUPPRESS, help="where the default storage is")

    perf = commands.add_parser(
        "perf", help="throughput side by side with Stable-Baselines3, beside the env-only and update-floor bounds"
    )
    perf.add_argument("--cases", nargs="+", default=None, metavar="CASE", help="ppo, sac, td3, dqn (default: all)")
    perf.add_argument("--pairs", type=int, default=3, help="alternating our/SB3 pairs per case; medians are reported (default 3)")
    perf.add_argument("--scale", type=float, default=1.0, help="multiply every measurement's step count (default 1)")
    perf.add_argument("--threads", type=int, default=1, help="torch threads in every measurement (default 1)")
    perf.add_argument("--no-compare", action="store_true", help="measure ours and the bounds only (SB3 not needed)")
    perf.add_argument("--profile", action="store_true", help="also where our time goes per env step, and the top functions")
    perf.add_argument("--no-memory", action="store_true", help="skip the 1M-transition replay buffer measurement")
    perf.add_argument("--no-batched", action="store_true", help="skip the batched-seeds rows (N seeds in one process against N processes)")
    perf.add_argument("--batched-only", action="store_true", help="measure only the batched-seeds rows (results/perf/batched.json)")
    perf.add_argument(
        "--batched-seeds", type=int, nargs="+", default=None, metavar="N",
        help="seed counts of the batched rows (default 1 4 10)",
    )
    perf.add_argument("--batched-repeats", type=int, default=1, metavar="R", help="measurements per batched row; medians are reported (default 1)")
    perf.add_argument("--device", default="cpu", help="device of the batched rows: cpu (default) or cuda (SAC's 5x target applies on a GPU)")
    perf.add_argument(
        "--output", type=Path,
        help="JSON written (default results/perf/compare.json)",
    )

    ui = commands.add_parser("ui", help="the MLflow UI on the results' store; prints the runs page of each suite")
    ui.add_argument("--port", type=int, default=None, help="port to serve on (default $PORT, else 5000)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    _add_store_arguments(ui)

    from benchmark.cli import results as cli_results

    cli_results.add_parsers(commands, _add_store_arguments, _add_bundle_arguments, _add_format)
    from benchmark.cli import parity as cli_parity

    cli_parity.add_parsers(commands, _add_format)

    listing = commands.add_parser("list", help="algorithms, buffers, suites and environments; an algorithm's defaults")
    listing.add_argument("what", nargs="?", metavar="algorithms|buffers|suites|envs|ALGO",
                         help="one section only, or one algorithm's hyperparameters with their defaults")
    _add_format(listing)
    return parser


def _add_format(parser: argparse.ArgumentParser) -> None:
    from benchmark.tables import FORMATS

    parser.add_argument(
        "--format", choices=FORMATS, default="table",
        help="table (default: for the terminal), md, csv or json: the bare table on stdout, other lines on stderr",
    )


def _add_seeds_per_process(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seeds-per-process", type=int, metavar="N",
        help="train up to N seeds of one configuration in one process as one batched model "
             "(PPO, SAC, TD3, DDPG, DQN...; overrides the suite's seeds_in_process; each seed stays its own MLflow run)",
    )


def _add_bundle_arguments(parser: argparse.ArgumentParser, suite_default: bool = True) -> None:
    parser.add_argument(
        "--from", dest="from_dirs", type=Path, nargs="+", metavar="DIR",
        help="result bundles to read as well as the tracking store (python -m benchmark export writes them)"
             + ("; results/published/<suite> is read by default" if suite_default else ""),
    )
    if suite_default:
        parser.add_argument("--no-published", action="store_true", help="do not read the suite's bundle under <results-dir>/published/")


def _add_store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results-dir", type=Path, default=Path("results"), help="MLflow store, artifacts, checkpoints, reports")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite in --results-dir)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no download bars in our output
    from agents.api import ConfigError
    from benchmark.cli import parity as cli_parity
    from benchmark.cli import results as cli_results
    from benchmark.tables import Output

    console = Output(getattr(args, "format", "table"))
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        commands = {
            "run": command_run,
            "list": command_list,
            "reference": command_reference,
            "report": command_report,
            "baseline": command_baseline,
            "regress": command_regress,
            "reproduce": command_reproduce,
            "tune": command_tune,
            "perf": command_perf,
            "ui": command_ui,
            **cli_results.COMMANDS,
            **cli_parity.COMMANDS,
        }
        return commands[args.command](args, console)
    except ConfigError as error:
        _error_line(str(error))
        return EXIT_CONFIG_ERROR
    except KeyboardInterrupt as interruption:
        Console(stderr=True).print("interrupted: unfinished runs are marked KILLED in MLflow")
        return EXIT_TERMINATED if isinstance(interruption, Terminated) else EXIT_INTERRUPTED
    except Exception as error:  # noqa: BLE001 - a failure while running: one line, not a traceback
        if os.environ.get("REPRORL_DEBUG"):
            raise
        _error_line(_describe_failure(error))
        return EXIT_RUNS_FAILED


def _error_line(message: str) -> None:
    """``error: message`` as exactly one line on stderr (rich markup in the message is not interpreted)."""
    sys.stderr.write("error: " + " ".join(message.split()) + "\n")
    sys.stderr.flush()


def _describe_failure(error: BaseException) -> str:
    """One line for an error that ended a command while it ran."""
    from benchmark import stores

    if isinstance(error, stores.StoreBusy):
        return str(error)
    if stores.is_disk_full(error):
        where = error.strerror if isinstance(error, stores.DiskFull) else getattr(error, "filename", None)
        return (f"the disk is full{f' ({where})' if where else ''}: free some space and launch again; finished runs and "
                "the last checkpoints are intact, and finished runs are not run again")
    text = str(error)
    for marker in ("database disk image is malformed", "file is not a database"):
        if marker in text:
            return f"the tracking store is corrupt (SQLite: {marker}): restore it from a copy or move it aside"
    return f"{type(error).__name__}: {text} (set REPRORL_DEBUG=1 to see the traceback)"


def _bundle_baseline(args: argparse.Namespace) -> dict:
    """A regression baseline made of the bundles' finished runs of the suite (configurations
    without one are left out; unfinished seeds are not counted)."""
    from collections import Counter

    from agents.api import ConfigError
    from benchmark import bundles, config
    from benchmark.analysis import records, regress

    suite = config.load_suite(args.suite)
    bundled = bundles.read_all(args.from_dirs)
    found = [r for r in records.collect(suite, None, with_curves=False, bundled=bundled) if r.finished]
    if not found:
        raise ConfigError(f"the bundles {' '.join(map(str, args.from_dirs))} hold no run of suite {suite.name!r}: nothing to compare against")
    payload = regress.baseline_payload(suite.name, found)
    shas = Counter(r.git_sha or "unknown" for r in found)
    payload["code"] = {"git_sha": shas.most_common(1)[0][0], "from": " ".join(map(str, args.from_dirs))}
    payload["created"] = max((run.ended for run in bundled.values() if run.ended), default=payload["created"])[:10]
    return payload


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    """The Slurm job options (with --executor slurm; each overrides the suite's ``slurm:`` key)."""
    group = parser.add_argument_group("Slurm (--executor slurm; each option overrides the suite's slurm: key)")
    group.add_argument("--slurm-partition", help="partition to submit to")
    group.add_argument("--slurm-time", type=int, metavar="MINUTES", help="time limit per job (default 1440); a job that reaches it is requeued and resumes")
    group.add_argument("--slurm-gpus", type=int, metavar="G", help="GPUs per job: 0 (CPU, the default) or 1")
    group.add_argument("--slurm-cpus", type=int, metavar="C", help="CPUs per job (default 1)")
    group.add_argument("--slurm-constraint", help="node features required (Slurm --constraint)")
    group.add_argument("--slurm-account", help="account to charge")
    group.add_argument("--slurm-memory", type=float, metavar="GB", help="memory per job in GB (default: the partition's)")
    group.add_argument("--slurm-cluster", choices=("slurm", "local"), default="slurm",
                       help="slurm (default), or local: submitit's local executor, each job a process on this machine (to try it out)")


SLURM_ARGUMENTS = {"slurm_partition": "partition", "slurm_time": "time_minutes", "slurm_gpus": "gpus", "slurm_cpus": "cpus",
                   "slurm_constraint": "constraint", "slurm_account": "account", "slurm_memory": "memory_gb"}


def slurm_options(args: argparse.Namespace, suite_options: dict | None = None):
    """The Slurm job options: the suite's ``slurm:`` key, overridden by the command line."""
    from benchmark.execution.slurm import SlurmOptions

    options = dict(suite_options or {})
    options.update({key: getattr(args, name) for name, key in SLURM_ARGUMENTS.items() if getattr(args, name, None) is not None})
    result = SlurmOptions(**options)
    result.check()
    return result


def _check_run_arguments(args: argparse.Namespace) -> None:
    from agents.api import ConfigError

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
        from benchmark.training.control import resolve_device

        resolve_device(args.device)


def command_run(args: argparse.Namespace, console: Console) -> int:
    from benchmark import config

    _check_run_arguments(args)
    suite = config.load_suite(args.suite, seeds=args.seeds, device=args.device).select(args.algos, args.envs)
    suite = suite.with_checkpointing(args.checkpoint_every, args.checkpoint_replay_buffer or None)
    suite = suite.with_seeds_in_process(args.seeds_per_process)
    bundled = _bundled(args, suite.name)
    if args.dry_run:
        from benchmark.execution import plan as planning

        found = _plan(suite, args, bundled)
        _, notices = planning.plan_processes([state.spec for state in found.left])
        console.table(planning.runs_table(found, f"suite {suite.name}: {len(suite.specs)} runs"),
                      planning.experiments_table(found, f"suite {suite.name}: per experiment"))
        for notice in notices:
            console.print(notice, highlight=False, soft_wrap=True)
        processes = len(set(found.processes.values()))
        console.print(f"{len(suite.specs)} runs in suite {suite.name!r} ({suite.path})"
                      + (f", the {len(found.left)} left trained in {processes} processes" if processes < len(found.left) else ""),
                      highlight=False)
        console.print(planning.total_line(found, _workers_text(args, suite)), highlight=False, markup=False)
        return 0
    found = _plan(suite, args, bundled)  # reads the store when it exists (a bad URI fails here), creates nothing
    _confirm_cost(found, args, console, suite)
    execution = _execute_suite(suite, args, console, force=args.force, bundled=bundled)
    elsewhere = [o for o in execution.outcomes if o.status == "CLAIMED"]
    if elsewhere:
        console.print(
            f"{len(elsewhere)} run(s) left to the launch that is training them: " + ", ".join(o.spec.label for o in elsewhere),
            highlight=False, soft_wrap=True, markup=False,
        )
    failed = [o for o in execution.outcomes if not o.ok and o.status != "CLAIMED"]
    if not failed:
        return 0
    console.print(f"[red]{len(failed)} run(s) did not finish:[/] " + ", ".join(o.spec.label for o in failed), highlight=False, soft_wrap=True)
    command = ["python", "-m", "benchmark", "run", "--suite", args.suite]
    if args.seeds is not None:
        command += ["--seeds", *map(str, args.seeds)]
    for flag, values in (("--algos", args.algos), ("--envs", args.envs)):
        if values:
            command += [flag, *values]
    if args.seeds_per_process is not None:
        command += ["--seeds-per-process", str(args.seeds_per_process)]
    console.print(
        "re-run them (finished runs are skipped, so this trains only the failed ones): " + " ".join(command),
        highlight=False, soft_wrap=True, markup=False,
    )
    return EXIT_RUNS_FAILED


def _bundled(args: argparse.Namespace, suite_name: str) -> dict:
    """Run key -> bundled run, from ``--from`` and (unless --no-published) the suite's published bundle."""
    from benchmark.execution import plan

    return plan.default_bundles(args.results_dir, suite_name, getattr(args, "from_dirs", None), not getattr(args, "no_published", False))


def _store_if_exists(args: argparse.Namespace) -> str | None:
    """The tracking URI when its store exists (checked, never created); None for a SQLite file not there yet."""
    from benchmark import stores, tracking

    tracking_uri = args.tracking_uri or tracking.default_tracking_uri(args.results_dir)
    path = stores.sqlite_path(tracking_uri)
    if path is not None and not path.exists():
        return None
    tracking.ensure_store(tracking_uri, deep=True)
    return tracking_uri


def _workers_text(args: argparse.Namespace, suite) -> str:
    workers = min(args.workers, len(suite.specs))
    return f"{workers} worker{'s' if workers != 1 else ''}"


def _plan(suite, args: argparse.Namespace, bundled: dict):
    from benchmark.execution import plan

    return plan.make_plan(suite.specs, _store_if_exists(args), suite.name, bundled, args.results_dir,
                          min(args.workers, len(suite.specs)), force=args.force)


def _confirm_cost(found, args: argparse.Namespace, console, suite) -> None:
    """Print what the invocation will cost; above --max-hours, ask on a terminal, else refuse without --yes."""
    from agents.api import ConfigError
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
    question = (f"suite {suite.name!r} is estimated at {estimate.hours(found.cost.wall_seconds)} of wall time with "
                f"{_workers_text(args, suite)}, above --max-hours {args.max_hours:g}")
    if sys.stdin.isatty():
        answer = input(f"{question}. Start it? [y/N] ").strip().lower()
        if answer in ("y", "yes"):
            return
        raise ConfigError(f"{question}: not started")
    raise ConfigError(f"{question}: pass --yes to start it anyway, or --max-hours H, or select runs with --algos/--envs/--seeds")


def _execute_suite(suite, args: argparse.Namespace, console: Console, force: bool = True, bundled: dict | None = None):
    """Train every run of ``suite`` under one MLflow parent run; print and store the summary table.

    ``force=False`` reuses the runs an earlier invocation finished (``run``); baseline and
    regress measure the code as it is now, so they always train."""
    from rich.markup import escape

    from benchmark import config, stores, tracking
    from benchmark.analysis import summary
    from benchmark.execution import suite as launching

    results_dir = args.results_dir
    workers = min(args.workers, len(suite.specs))
    name = getattr(args, "executor", "local")
    # a device this machine lacks, a missing package or a bad option fails before anything is created
    executor = launching.make_executor(
        name, suite.specs, workers, results_dir, getattr(args, "runs_per_gpu", None), getattr(args, "address", None),
        slurm_options(args, suite.slurm) if name == "slurm" else None, getattr(args, "slurm_cluster", "slurm"),
    )
    if args.tracking_uri:  # a bad URI fails before anything is created
        tracking.ensure_store(args.tracking_uri, deep=True, writing=True)
    stores.check_writable_directory(results_dir, "results directory")
    tracking_uri = args.tracking_uri or tracking.default_tracking_uri(results_dir)
    tracking.ensure_store(tracking_uri, deep=True, writing=True)
    console.print(f"suite {suite.name!r}: {len(suite.specs)} runs, {workers} worker(s), tracking at {tracking_uri}")
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
    )
    rows = summary.summarize(execution.outcomes)
    console.table(summary.table(rows, f"suite {suite.name} — final deterministic evaluation"))
    report_dir = results_dir / "reports"
    report_dir.mkdir(parents=True, exist_ok=True)
    report = report_dir / f"{suite.name}-{execution.parent_run_id[:8]}.md"
    report.write_text(f"# suite {suite.name}\n\nMLflow parent run `{execution.parent_run_id}`\n\n{summary.to_markdown(rows)}")
    tracking.MlflowTracker(tracking_uri, execution.parent_run_id).log_artifact(report)
    for outcome in execution.outcomes:
        if not outcome.ok and outcome.status != "CLAIMED":
            console.print(f"[red]{escape(outcome.spec.label)} {outcome.status}[/]: {escape(str(outcome.error))}", highlight=False)
    from_bundles = sum(bool(o.source) for o in execution.outcomes)
    earlier = execution.finished_before - from_bundles
    meanwhile = sum(o.skipped for o in execution.outcomes) - execution.finished_before
    by_others = [f"{from_bundles} of them held by result bundles"] if from_bundles else []
    by_others += [f"{earlier} of them in an earlier invocation"] if earlier else []
    by_others += [f"{meanwhile} by another launch meanwhile"] if meanwhile else []
    console.print(
        f"{sum(o.ok for o in execution.outcomes)}/{len(execution.outcomes)} runs finished"
        + (f" ({', '.join(by_others)})" if by_others else "")
        + " in "
        f"{time.perf_counter() - started:.0f} s; parent run {execution.parent_run_id}; table in {report}; "
        f"full report with CIs and plots: python -m benchmark report --suite {suite.path if suite.path.parent != config.SUITES_DIR else suite.name}",
        soft_wrap=True,
    )
    return execution


def _records(execution) -> list:
    """The runner's outcomes as report records (no MLflow round trip needed)."""
    from benchmark.analysis.records import RunRecord, mark_unusable

    records = [
        RunRecord(
            o.spec,
            status=o.status,
            run_id=o.run_id,
            final_return=o.final_return_mean,
            steps_per_second=o.steps_per_second,
            error=o.error,
        )
        for o in execution.outcomes
    ]
    for record in records:
        mark_unusable(record)
    return records


def existing_store(args: argparse.Namespace) -> str:
    """The tracking URI of a command that only reads results: refused (ConfigError, nothing
    created) when its SQLite file does not exist, and checked when it does."""
    from agents.api import ConfigError
    from benchmark import stores, tracking

    tracking_uri = _store_if_exists(args)
    if tracking_uri is None:
        path = stores.sqlite_path(args.tracking_uri or tracking.default_tracking_uri(args.results_dir))
        where = f"results directory {args.results_dir}" if args.tracking_uri is None else "--tracking-uri"
        missing = "does not exist" if not path.parent.exists() else "holds no tracking store"
        raise ConfigError(f"{where} {missing} ({path} not found): pass the --results-dir (or --tracking-uri) your runs were stored in")
    return tracking_uri


def command_reproduce(args: argparse.Namespace, console: Console) -> int:
    from benchmark import bundles
    from benchmark.analysis import reproduce

    published = args.results_dir / bundles.PUBLISHED_DIR
    directories = list(args.from_dirs or []) + sorted(d for d in (published.iterdir() if published.is_dir() else []) if bundles.is_bundle(d))
    bundled = reproduce.find_bundled(args.run_id, bundles.read_all(directories)) if directories else None
    if bundled is not None:
        console.print(f"reproducing run {args.run_id} from bundle {bundled.origin} ...")
        result = reproduce.reproduce_bundled(bundled)
    else:
        tracking_uri = existing_store(args)
        console.print(f"reproducing run {args.run_id} from its recorded config ...")
        result = reproduce.reproduce(args.run_id, tracking_uri)
    spec = result.spec
    console.print(f"{spec.label}, {spec.budget.total_steps:,} steps, run key {spec.run_key}"
                  + (f"; trained again in its batch of seeds {' '.join(map(str, result.batch_seeds))}" if result.batch_seeds else ""),
                  highlight=False)
    for name, (before, after) in result.environment_changes.items():
        console.print(f"  differs from the recorded run: {name}: {before!r} -> {after!r}", highlight=False, markup=False)
    if result.matches:
        console.print(f"match: all {len(result.now)} evaluations are bit-identical to the recorded ones "
                      f"(final {result.now[-1][1]:.4f})", highlight=False)
        return 0
    console.print(f"[red]differ:[/] {len(result.differences)} of {len(set(dict(result.recorded)) | set(dict(result.now)))} evaluations", highlight=False)
    for line in result.differences:
        console.print(f"  {line}", highlight=False, markup=False)
    return 1


def command_report(args: argparse.Namespace, console: Console) -> int:
    from collections import Counter

    from agents.api import ConfigError
    from benchmark import config, stores, tracking
    from benchmark.analysis import records, report

    suite = config.load_suite(args.suite)
    bundled = _bundled(args, suite.name)
    tracking_uri = _store_if_exists(args) if bundled else existing_store(args)
    found = records.collect(suite, tracking_uri, bundled=bundled)
    finished = sum(r.finished for r in found)
    sources = ([tracking.describe_uri(tracking_uri, short=True)] if tracking_uri else []) + sorted({r.source for r in found if r.source})
    if not finished:
        states = Counter(r.status for r in found)
        _error_line(
            f"suite {suite.name!r} has no finished run in {' or '.join(sources) or tracking.describe_uri(str(tracking_uri))} ("
            + ", ".join(f"{count} {state.lower()}" for state, count in states.most_common())
            + f" of {len(found)}): nothing to report; train it with: python -m benchmark run --suite {args.suite}"
        )
        return EXIT_RUNS_FAILED
    out_dir = args.output or args.results_dir / "reports" / suite.name
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        stores.check_writable_directory(out_dir, "report directory")
    except OSError as error:
        if stores.is_disk_full(error):
            raise
        raise ConfigError(f"cannot write the report to {out_dir}: {error.strerror or error}; pass --output DIR") from None
    path = report.write_report(suite, found, out_dir, " and ".join(sources))
    console.print(f"report of suite {suite.name!r} ({finished}/{len(found)} runs finished): {path} and {path.with_suffix('.html')}")
    return 0


def command_baseline(args: argparse.Namespace, console: Console) -> int:
    from benchmark import config
    from benchmark.analysis import regress

    _check_run_arguments(args)
    suite = config.load_suite(args.suite, seeds=args.seeds).with_seeds_in_process(args.seeds_per_process)
    output = args.output or regress.BASELINE_DIR / f"{suite.name}.json"
    execution = _execute_suite(suite, args, console)
    payload = regress.baseline_payload(suite.name, _records(execution), execution.parent_run_id)
    regress.write_baseline(payload, output)
    console.print(f"baseline of suite {suite.name!r} at code version {payload['code']['git_sha'][:10]} written to {output}")
    return 0


def command_regress(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from agents.api import ConfigError
    from benchmark import config
    from benchmark.analysis import regress
    from benchmark.tables import TableData

    _check_run_arguments(args)
    if args.from_dirs and args.baseline:
        raise ConfigError("--from and --baseline both name what to compare against: pass one")
    if args.from_dirs:
        payload = _bundle_baseline(args)
    else:
        baseline_path = args.baseline or regress.BASELINE_DIR / f"{config.suite_path(args.suite).stem}.json"
        payload = regress.load_baseline(baseline_path)
    if not args.results_dir.is_dir():
        raise ConfigError(f"results directory {args.results_dir} does not exist: pass the --results-dir to store the check's runs in")
    seeds = args.seeds or regress.regress_seeds(payload)
    suite = config.load_suite(args.suite, seeds=seeds).select(args.algos, args.envs).with_seeds_in_process(args.seeds_per_process)
    regress.compare(payload, [], args.alpha, args.min_effect)  # argument errors before any training
    execution = _execute_suite(suite, args, console)
    verdicts = regress.compare(payload, _records(execution), args.alpha, args.min_effect, args.algos, args.envs)

    table = TableData(
        f"regression check of suite {suite.name!r}: seeds {seeds} against the baseline of {payload['code']['git_sha'][:10]} ({payload['created']})",
        ["configuration", "baseline mean", "current mean", "difference [95% CI]", "normalized", "p (Welch, one-sided)",
         "P(current > baseline)", "verdict"],
        names={"configuration"}, right={"baseline mean", "current mean", "normalized", "p (Welch, one-sided)"},
    )
    for v in verdicts:
        w = v.welch
        verdict = "REGRESSION" if v.regressed else ("improved" if v.improved else "ok")
        table.add(
            v.key,
            f"{sum(v.baseline) / len(v.baseline):.1f}" if v.baseline else "—",
            f"{sum(v.current) / len(v.current):.1f}" if v.current else "—",
            f"{w.difference:+.1f} [{w.low:+.1f}, {w.high:+.1f}]" if w else "—",
            f"{v.normalized_difference:+.2f}" if w else "—",
            f"{w.p_value:.2g}" if w else "—",
            f"{v.improvement.estimate:.2f} [{v.improvement.low:.2f}, {v.improvement.high:.2f}]" if v.improvement else "—",
            verdict,
        )
    console.table(table)
    regressions = [v for v in verdicts if v.regressed]
    for v in verdicts:
        if v.note and not v.regressed:
            console.print(f"note: {escape(v.describe())}", highlight=False, soft_wrap=True)
    if regressions:
        for v in regressions:
            console.print(f"[bold red]REGRESSION[/] {escape(v.describe())}", highlight=False, soft_wrap=True)
        console.print(
            f"{len(regressions)} of {len(verdicts)} configurations regressed (Welch one-sided, Holm-corrected at "
            f"alpha {args.alpha}, drop >= {args.min_effect} normalized)"
        )
        return EXIT_REGRESSION
    console.print(f"no regression in {len(verdicts)} configurations (alpha {args.alpha}, min effect {args.min_effect} normalized)")
    return 0


def command_reference(args: argparse.Namespace, console: Console) -> int:
    from benchmark import config
    from benchmark.analysis import reference

    if args.reference_command == "build":
        source = args.source or reference.SHARED_SCORES
        if not source.exists():
            from agents.api import ConfigError

            raise ConfigError(f"published scores not found at {source}; pass --source PATH")
        count = reference.build(source)
        console.print(f"wrote {count} published scores to {reference.REFERENCE_DIR / 'scores.csv'}")
        return 0
    if args.reference_command == "random":
        from agents.envs import check_env_id

        for env_id in args.env:  # every id checked before any is measured
            check_env_id(env_id)
        for env_id in args.env:
            score = reference.measure_random(env_id, args.episodes, args.seed)
            reference.save_random(score)
            console.print(f"{env_id}: random policy {score.mean:.2f} ± {score.std:.2f} over {score.episodes} episodes")
        return 0
    env_ids = args.env or sorted({s.env_id for name in config.available_suites() for s in config.load_suite(name).specs})
    from benchmark.tables import TableData

    table = TableData("normalization: (score - random) / (reference - random)",
                      ["environment", "random (measured here)", "reference", "source"], names={"environment"}, right={"reference"})
    for env_id in env_ids:
        norm = reference.normalizer(env_id)
        random_cell = f"{norm.random.mean:.2f} ± {norm.random.std:.2f} ({norm.random.episodes} ep.)" if norm.random else "— (not measured)"
        ref = norm.reference
        table.add(env_id, random_cell, f"{ref.mean:.1f}" if ref else "—", ref.citation if ref else "no published score")
    console.table(table)
    return 0


def command_tune(args: argparse.Namespace, console: Console) -> int:
    from agents.api import ConfigError
    from benchmark import stores, tracking
    from benchmark.tuning import storage as tuning_storage
    from benchmark.tuning import study as tuning_study

    if args.tune_command == "show":
        return _tune_show(args, console)
    if args.tune_command == "export":
        return _tune_export(args, console)
    if not args.algo or not args.env:
        raise ConfigError("tune needs --algo and --env (or: tune show STUDY, tune export STUDY)")
    options = dict(
        trials=args.trials, workers=args.workers, sampler=args.sampler, pruner=args.pruner,
        pruner_startup_trials=args.pruner_startup_trials, pruner_warmup_steps=args.pruner_warmup_steps,
        timeout=args.timeout, device=args.device, runs_per_gpu=args.runs_per_gpu, seeds_per_process=args.seeds_per_process,
    )
    slots = tuning_study.check_options(**options, local=args.executor == "local")
    executor = _tune_executor(args, slots)
    study_name = args.study or f"{args.algo}-{args.env.replace('/', '-')}"
    if not re.fullmatch(r"[\w.\-]+", study_name):
        raise ConfigError(f"study name {study_name!r}: use letters, digits, '.', '_' and '-' only")
    default_url = tuning_storage.default_storage_url(args.results_dir)
    storage_url = args.storage or default_url
    given = {
        "budget": args.budget, "seeds_per_trial": args.seeds_per_trial, "suite": args.suite,
        "reference": args.reference, "random": args.random, "seed": args.seed,
    }
    settings, _ = tuning_study.prepare(args.algo, args.env, study_name, storage_url, default_url, given, args.space)
    stores.check_writable_directory(args.results_dir, "results directory")
    tracking_uri = args.tracking_uri or tracking.default_tracking_uri(args.results_dir)
    tracking.ensure_store(tracking_uri, deep=True, writing=True)
    result = tuning_study.run_study(
        settings, study_name=study_name, storage_url=storage_url, tracking_uri=tracking_uri, results_dir=args.results_dir,
        executor=executor, **options,
    )
    counts = ", ".join(f"{count} {state.lower()}" for state, count in result.counts.items() if count)
    console.print(
        f"study {study_name!r}: trials {result.trials_before}..{result.trials_after - 1} run; {result.trials_after} in all ({counts}); "
        f"MLflow parent run {result.parent_run_id}",
        soft_wrap=True, markup=False, highlight=False,
    )
    if result.best_trial is not None:
        best = result.best_trial
        console.print(
            f"best: trial {best.number}, normalized score {best.value:.3f} (final returns "
            f"{', '.join(f'{r:.1f}' for r in best.user_attrs.get('final_returns', []))}); "
            f"python -m benchmark tune show {study_name} | tune export {study_name}",
            soft_wrap=True, markup=False, highlight=False,
        )
    for error in result.worker_errors:
        console.print(f"[red]{error}[/]", highlight=False)
    return EXIT_RUNS_FAILED if result.worker_errors else 0


def _tune_executor(args: argparse.Namespace, slots: list):
    """The executor the trials run on (``--executor``), at most ``--workers`` trials at once."""
    from agents.api import ConfigError
    from benchmark.execution.local import LocalExecutor

    if args.address and args.executor != "ray":
        raise ConfigError("--address is for --executor ray")
    given = [name for name in (*SLURM_ARGUMENTS, "slurm_cluster") if getattr(args, name, None) not in (None, "slurm")]
    if given and args.executor != "slurm":
        raise ConfigError(f"--{given[0].replace('_', '-')} is for --executor slurm")
    if args.executor == "ray":
        from benchmark.execution.ray import RayExecutor

        return RayExecutor(args.device, args.workers, args.runs_per_gpu, args.address)
    if args.executor == "slurm":
        from benchmark.execution.slurm import SlurmExecutor

        return SlurmExecutor(args.results_dir.resolve() / "slurm", slurm_options(args), args.device, args.slurm_cluster, max_jobs=args.workers)
    return LocalExecutor(slots)


def _tune_show(args: argparse.Namespace, console: Console) -> int:
    from benchmark import tracking
    from benchmark.tables import TableData
    from benchmark.tuning import inspect as tuning_inspect
    from benchmark.tuning import storage as tuning_storage

    url, storage = tuning_storage.open_existing_storage(args.storage, args.results_dir)
    study = tuning_storage.load_study(args.study, storage)
    found = tuning_inspect.summary(study, args.top)
    settings = found["settings"]
    console.print(
        f"study {study.study_name!r}: {settings.algo} on {settings.env_id}, {settings.seeds_per_trial} seed(s) x "
        f"{settings.budget.total_steps:,} steps per trial, base {settings.base_suite or 'published defaults'}; "
        f"normalized by random {settings.random_score:.2f} and reference {settings.reference_score:.2f} "
        f"({settings.reference_source}); trials: "
        + ", ".join(f"{count} {state.lower()}" for state, count in sorted(found["counts"].items())),
        soft_wrap=True, markup=False, highlight=False,
    )
    table = TableData(f"best trials of {study.study_name}", ["trial", "normalized", "final returns", "seconds", "parameters"],
                      right={"trial", "normalized", "seconds"})
    for trial in found["best"]:
        returns = ", ".join(f"{r:.1f}" for r in trial.user_attrs.get("final_returns", []))
        seconds = f"{trial.duration.total_seconds():.0f}" if trial.duration else "—"
        tuned = trial.user_attrs.get("tuned", trial.params)
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in tuned.items())
        table.add(trial.number, f"{trial.value:.3f}", returns, seconds, params)
    weights = tuning_inspect.importances(study)
    if weights is not None:
        importance = TableData("parameter importances (fANOVA over the completed trials)", ["parameter", "importance"],
                               names={"parameter"}, right={"importance"})
        for name, weight in weights.items():
            importance.add(name, f"{weight:.3f}")
        console.table(table, importance)
    else:
        console.table(table)
        console.print("no parameter importances: they need at least two completed trials with different scores")
    written = tuning_inspect.write_plots(study, args.output or args.results_dir / "tune" / study.study_name, weights is not None)
    console.print("plots: " + ", ".join(str(path) for path in written), soft_wrap=True, markup=False, highlight=False)
    console.print(f"browse it: optuna-dashboard {tracking.redact(url)}", soft_wrap=True, markup=False, highlight=False)
    return 0


def _tune_export(args: argparse.Namespace, console: Console) -> int:
    from benchmark import config
    from benchmark.tuning import inspect as tuning_inspect
    from benchmark.tuning import storage as tuning_storage

    _, storage = tuning_storage.open_existing_storage(args.storage, args.results_dir)
    study = tuning_storage.load_study(args.study, storage)
    path, best = tuning_inspect.export_suite(study, args.seeds, args.output, args.force)
    try:
        name = str(path.resolve().relative_to(config.SUITES_DIR).with_suffix(""))
        command = f"make bench SUITE={name}"
    except ValueError:
        command = f"python -m benchmark run --suite {path}"
    console.print(
        f"wrote {path}: trial {best.number} (normalized {best.value:.3f}) over {args.seeds} seeds; run it: {command}",
        soft_wrap=True, markup=False, highlight=False,
    )
    return 0


def command_perf(args: argparse.Namespace, console: Console) -> int:
    from agents.api import ConfigError
    from benchmark.perf import throughput as perf

    cases = args.cases or list(perf.CASES)
    compare = not args.no_compare and not args.batched_only
    perf.check_arguments(cases, args.pairs, args.scale, args.threads)
    counts = args.batched_seeds or list(perf.BATCHED_COUNTS)
    if args.no_batched and args.batched_only:
        raise ConfigError("--no-batched and --batched-only contradict each other")
    if min(counts) < 1 or len(set(counts)) != len(counts) or args.batched_repeats < 1:
        raise ConfigError(f"--batched-seeds must be distinct positive counts and --batched-repeats >= 1, got {counts} and {args.batched_repeats}")
    if args.device != "cpu":
        from benchmark.training.control import resolve_device

        resolve_device(args.device)
    sb3_version = perf.check_sb3() if compare else None
    if args.batched_only:
        return _perf_batched(args, console, perf, cases, counts)
    console.print(
        f"perf: {', '.join(cases)}; {args.pairs} alternating pair(s) each, {args.threads} torch thread(s)"
        + (f", Stable-Baselines3 {sb3_version}" if compare else ", ours only"),
        highlight=False, soft_wrap=True,
    )

    def progress(name: str, side: str, pair: int, measurement: dict) -> None:
        console.print(
            f"  pair {pair + 1} {name:<4} {side:<5} {measurement['steps_per_second']:>10,.1f} /s  "
            f"{measurement['seconds']:6.1f} s  peak {measurement['peak_rss_mb']:,.0f} MiB",
            highlight=False, soft_wrap=True,
        )

    results = perf.measure(cases, args.pairs, args.scale, args.threads, compare, on_measurement=progress)
    memory = None if args.no_memory else perf.replay_memory()
    profiles = perf.profile(cases, args.scale, args.threads) if args.profile else None
    settings = {"cases": cases, "pairs": args.pairs, "scale": args.scale, "threads": args.threads, "compare": compare}
    data = perf.report(results, memory, profiles, settings)
    console.print(_perf_table(data, compare))
    if memory is not None:
        mark = "met" if memory["ratio"] <= memory["target_ratio"] else "MISSED"
        console.print(
            f"replay buffer, {memory['capacity']:,} HalfCheetah transitions: {memory['tensor_bytes'] / 2**20:,.0f} MiB of tensors "
            f"({memory['ratio']:.3f}x the raw {memory['raw_bytes'] / 2**20:,.0f} MiB of its fields; target <= {memory['target_ratio']}x: {mark}); "
            f"resident memory grew {memory['rss_increase_bytes'] / 2**20:,.0f} MiB ({memory['rss_ratio']:.3f}x)",
            highlight=False, soft_wrap=True,
        )
    for name, found in (profiles or {}).items():
        console.print(_profile_table(name, found))
        console.print(found["top_functions"], highlight=False, soft_wrap=True, markup=False)
    path = perf.write(data, args.output or Path("results/perf/compare.json"))
    console.print(f"written to {path}", highlight=False, soft_wrap=True)
    if not args.no_batched:
        return _perf_batched(args, console, perf, cases, counts)
    return 0


def _perf_batched(args: argparse.Namespace, console: Console, perf, cases: list[str], counts: list[int]) -> int:
    import os

    cores = os.cpu_count() or 1
    console.print(
        f"batched seeds: {', '.join(cases)}; N = {', '.join(map(str, counts))}; {args.batched_repeats} measurement(s) each, "
        f"{args.threads} torch thread(s), device {args.device}, {cores} cores",
        highlight=False, soft_wrap=True,
    )

    def progress(name: str, count: int, mode: str, entry: dict) -> None:
        console.print(
            f"  {name:<4} {mode:<11} {count:>3} seed(s) in {entry['processes']} process(es) {entry['steps_per_second']:>10,.1f} steps/s  "
            f"peak {entry['peak_rss_mb']:,.0f} MiB",
            highlight=False, soft_wrap=True,
        )

    data = perf.measure_batched(cases, counts, args.batched_repeats, args.scale, args.threads, args.device, cores, on_measurement=progress)
    console.print(_batched_table(data))
    output = Path("results/perf/batched.json") if args.output is None or not args.batched_only else args.output
    path = perf.write(data, output)
    console.print(f"written to {path}", highlight=False, soft_wrap=True)
    return 0


def _batched_table(data: dict) -> Table:
    cores = data["settings"]["cores"]
    table = Table(title=f"N seeds: aggregate env steps/s (summed over seeds; {data['settings']['device']}, {cores} cores)")
    for column in ("case", "env", "N", f"separate (N processes, {cores} at once)", "batched, 1 process", "ratio",
                   f"batched, {cores} processes", "ratio", "peak MiB: N x one separate process / 1 batched process"):
        table.add_column(column, justify="left" if column in ("case", "env") else "right")
    for name, case in data["cases"].items():
        for row in case["rows"]:
            per_core = row.get("per_core")
            ratio = f"{row['one_process_ratio']:.2f}x"
            if "target_ratio" in row:
                ratio += f" (>= {row['target_ratio']}: {'met' if row['target_met'] else 'missed'})"
            table.add_row(
                name, case["env_id"], str(row["seeds"]),
                f"{row['separate']['steps_per_second']:,.1f}",
                f"{row['one_process']['steps_per_second']:,.1f}", ratio,
                f"{per_core['steps_per_second']:,.1f}" if per_core else "—",
                f"{row['per_core_ratio']:.2f}x" if per_core else "—",
                f"{row['separate']['peak_rss_mb'] * row['seeds'] / row['separate']['processes']:,.0f} / {row['one_process']['peak_rss_mb']:,.0f}",
            )
    return table


def _perf_table(data: dict, compare: bool) -> Table:
    table = Table(title="throughput (medians over pairs; steps/s; the floor in updates/s)")
    columns = ["case", "env", "steps", "ours"]
    if compare:
        columns += ["SB3", "ours/SB3 (target)"]
    columns += ["bound", "bound rate", "ours/bound (target)", "peak MiB ours"]
    if compare:
        columns += ["peak MiB SB3", "targets"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("case", "env", "bound", "targets") else "right")
    for name, case in data["cases"].items():
        s = case["summary"]
        row = [name, case["env_id"], f"{case['steps']:,}", f"{s['ours_steps_per_second']:,.1f}"]
        if compare:
            row += [f"{s['sb3_steps_per_second']:,.1f}", f"{s['ratio']:.2f}x (>= {s['target_ratio']})"]
        bound_target = s["target_fraction_of_bound"]
        row += [
            "env only" if s["bound"] == "env" else "update floor",
            f"{s['bound_steps_per_second']:,.1f}",
            f"{s['fraction_of_bound']:.2f}" + (f" (>= {bound_target:.2f})" if bound_target else ""),
            f"{s['ours_peak_rss_mb']:,.0f}",
        ]
        if compare:
            row += [f"{s['sb3_peak_rss_mb']:,.0f}", "met" if s["target_met"] else "missed"]
        table.add_row(*row)
    return table


def _profile_table(name: str, found: dict) -> Table:
    per_step = found["microseconds_per_step"]
    total = sum(per_step.values())
    table = Table(title=f"{name}: where the time goes ({found['steps_per_second']:,.1f} steps/s while timed)")
    for column in ("part", "us per env step", "share", "calls"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part in ("env", "acting", "buffer", "update", "logging", "other"):
        if part in per_step:
            calls = found["calls"].get(part)
            table.add_row(part, f"{per_step[part]:,.1f}", f"{per_step[part] / total:.0%}", f"{calls:,}" if calls else "")
    table.add_row("total", f"{total:,.1f}", "100%", "")
    return table


def command_ui(args: argparse.Namespace, console: Console) -> int:
    """Print where each suite's runs are, then become ``mlflow ui`` (one worker: it starts in seconds)."""
    from agents.api import ConfigError
    from benchmark import tracking

    port = args.port if args.port is not None else int(os.environ.get("PORT") or 5000)
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    tracking_uri = existing_store(args)
    client = tracking.client(tracking_uri)
    experiments = [e for e in tracking.retry(lambda: client.search_experiments()) if e.name != "Default"]
    server = tracking_uri.startswith(("http://", "https://"))  # a tracking server serves its own UI
    address = tracking_uri.rstrip("/") if server else f"http://{'localhost' if args.host in ('127.0.0.1', '0.0.0.0') else args.host}:{port}"
    view = "?workflowType=machine_learning"  # MLflow 3 opens on its GenAI view otherwise
    console.print(f"MLflow UI at {address}/#/experiments{view}{'' if server else ' (Ctrl-C stops it)'}; the runs of each suite and study:",
                  markup=False, highlight=False, soft_wrap=True)
    for experiment in experiments:
        if experiment.tags.get("mlflow.experimentKind") != tracking.EXPERIMENT_TAGS["mlflow.experimentKind"]:
            # an experiment made before this tag: MLflow 3 would open it in its GenAI view
            try:
                for key, value in tracking.EXPERIMENT_TAGS.items():
                    tracking.retry(lambda: client.set_experiment_tag(experiment.experiment_id, key, value))
            except Exception:  # noqa: BLE001 - a read-only store: the link below opens the runs all the same
                pass
        console.print(f"  {experiment.name}: {address}/#/experiments/{experiment.experiment_id}/runs{view}",
                      markup=False, highlight=False, soft_wrap=True)
    if not experiments:
        console.print("  (none yet: run a suite first)", markup=False, highlight=False)
    if server:
        return 0
    mlflow = Path(sys.executable).with_name("mlflow")
    artifacts = (args.results_dir / "mlartifacts").resolve()
    command = [str(mlflow), "ui", "--backend-store-uri", tracking_uri, "--default-artifact-root", str(artifacts),
               "--host", args.host, "--port", str(port), "--workers", "1"]
    sys.stdout.flush()
    os.execv(command[0], command)
    return 0  # not reached


def command_list(args: argparse.Namespace, console: Console) -> int:
    import dataclasses

    import agents
    from agents.api import ConfigError, suggest
    from agents.buffers import BUFFERS
    from benchmark import config
    from benchmark.tables import TableData

    sections = ("algorithms", "buffers", "suites", "envs")
    what = args.what
    if what is not None and what not in sections:
        if what not in agents.ALGORITHMS:
            choices = [*sections, *sorted(agents.ALGORITHMS)]
            raise ConfigError(f"nothing to list as {what!r}{suggest(what, choices)}; list one of {', '.join(sections)} or an algorithm")
        cls = agents.ALGORITHMS[what]
        table = TableData(f"{what}: hyperparameters", ["hyperparameter", "default"], names={"hyperparameter"},
                          caption=f"defaults: {' '.join((cls.Config.__doc__ or '').split())}")
        defaults = cls.Config()
        for field in dataclasses.fields(cls.Config):
            table.add(field.name, getattr(defaults, field.name))
        console.table(table)
        return 0
    tables = []
    if what in (None, "algorithms"):
        table = TableData("algorithms (list ALGO: its hyperparameters)", ["name", "actions", "what it is"], names={"name"})
        for name, cls in sorted(agents.ALGORITHMS.items()):
            kinds = [kind for kind, ok in (("discrete", cls.supports_discrete), ("multi-discrete", cls.supports_multi_discrete),
                                           ("box", cls.supports_continuous)) if ok]
            table.add(name, ", ".join(kinds), (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "")
        tables.append(table)
    if what in (None, "buffers"):
        table = TableData("buffers", ["name", "description"], names={"name"})
        for name, (_, description) in BUFFERS.items():
            table.add(name, description)
        tables.append(table)
    suites = {name: config.load_suite(name) for name in config.available_suites()} if what in (None, "suites", "envs") else {}
    if what in (None, "suites"):
        narrow = console.format == "table" and console.stdout.width < 120  # the descriptions get a table of their own
        headers = ["name", "runs", "algorithms", "environments", *([] if narrow else ["description"])]
        table = TableData("suites", headers, names={"name"}, right={"runs"}, lists={"algorithms", "environments"})
        descriptions = TableData("what each suite is for", ["name", "description"], names={"name"})
        for name, suite in suites.items():
            algos = sorted({s.algo for s in suite.specs})
            envs = sorted({s.env_id for s in suite.specs})
            table.add(name, len(suite.specs), ", ".join(algos), ", ".join(envs), *([] if narrow else [suite.description]))
            descriptions.add(name, suite.description)
        tables += [table, descriptions] if narrow else [table]
    if what in (None, "envs"):
        from agents.envs import env_spec

        table = TableData("environments used by the suites", ["id", "observation", "actions", "max episode steps"],
                          names={"id"}, right={"max episode steps"})
        env_ids = sorted({s.env_id for suite in suites.values() for s in suite.specs})
        for env_id in env_ids:
            spec = env_spec(env_id)
            actions = spec.action_space_name
            if not spec.discrete:
                actions += f" in [{min(spec.action_low):g}, {max(spec.action_high):g}]"
            table.add(env_id, f"Box{spec.observation_shape}", actions, spec.max_episode_steps)
        tables.append(table)
    console.table(*tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
