"""``python -m benchmark tune [show|export]``: run or resume an Optuna study on an executor; read one."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import (
    EXIT_RUNS_FAILED,
    SLURM_ARGUMENTS,
    add_format,
    add_slurm_arguments,
    add_store_arguments,
    slurm_options,
    steps_value,
)
from benchmark.results_layout import ResultsDir

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    tune = commands.add_parser(
        "tune",
        help="Optuna study: tune ALGO on ENV against its reference score (tune show|export STUDY to read one)",
        description="Run (or resume) an Optuna study of --algo on --env; `tune show STUDY` and `tune export STUDY` read one.",
        allow_abbrev=False,  # `tune export S --seeds N` is export's option, not an abbreviation of tune's --seeds-per-*
    )
    tune.add_argument("--algo", help="algorithm to tune (its search space: suites/search/ALGO.yaml)")
    tune.add_argument("--env", help="gymnasium id; its reference and random scores normalize the objective")
    tune.add_argument("--trials", type=int, default=20, help="trials this invocation adds to the study (default 20)")
    tune.add_argument("--steps", dest="budget", type=steps_value, help="env steps per seed of a trial (default: the budget of the suite that runs ALGO on ENV)")
    tune.add_argument("--budget", dest="budget", type=steps_value, help=argparse.SUPPRESS)  # the earlier name, kept for a release
    tune.add_argument("--seeds-per-trial", type=int, metavar="S", help="seeds each trial trains and averages (default 1)")
    tune.add_argument(
        "--seeds-per-process",
        type=int,
        default=1,
        metavar="N",
        help="train a trial's seeds N at a time as one batched model (default 1: one after another)",
    )
    tune.add_argument("--study", help="study name (default ALGO-ENV); an existing study is resumed")
    tune.add_argument("--storage", help="Optuna storage URL: sqlite:///PATH, postgresql://..., journal:PATH (default sqlite in --results-dir)")
    tune.add_argument("--workers", type=int, default=1, help="worker processes running trials of the study at once (default 1)")
    tune.add_argument("--sampler", choices=("tpe", "random", "cmaes"), default="tpe", help="default tpe (seeded)")
    tune.add_argument("--pruner", choices=("median", "hyperband", "none"), default="median", help="default median")
    tune.add_argument("--pruner-startup-trials", type=int, default=5, metavar="N", help="median pruner: trials before any pruning (default 5)")
    tune.add_argument(
        "--pruner-warmup-steps", type=int, metavar="STEPS", help="median pruner: steps of a trial before it can be pruned (default a third of the budget)"
    )
    tune.add_argument("--timeout", type=float, metavar="SECONDS", help="start no new trial after this long")
    tune.add_argument("--suite", help="take the budget and fixed hyperparameters from this suite's ALGO/ENV run (none: published defaults)")
    tune.add_argument("--space", type=Path, help="search space YAML (default suites/search/ALGO.yaml)")
    tune.add_argument("--reference", type=float, metavar="SCORE", help="reference score, for an env without a published one")
    tune.add_argument("--random", type=float, metavar="SCORE", help="random-policy score, for an env not measured yet")
    tune.add_argument("--seed", type=int, help="seed of the samplers and of the trials' seeds (default 0)")
    tune.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:i (as for run)")
    tune.add_argument("--runs-per-gpu", type=int, metavar="K", help="workers per GPU, at most (default: the workers spread over the GPUs)")
    tune.add_argument(
        "--executor",
        choices=("local", "ray", "slurm"),
        default="local",
        help="where trials run: local processes (default), Ray tasks or Slurm jobs; at most --workers at once",
    )
    tune.add_argument("--address", help="with --executor ray: the cluster to join ('auto': the running one); default: a local Ray")
    add_slurm_arguments(tune)
    add_store_arguments(tune)
    tune_commands = tune.add_subparsers(dest="tune_command")
    show_study = tune_commands.add_parser("show", help="best trials, parameter importances, plots (PNG) under results/tune/STUDY")
    show_study.add_argument("study", help="study name")
    show_study.add_argument("--top", type=int, default=10, help="best trials to list (default 10)")
    show_study.add_argument("--output", type=Path, help="plot directory (default results/tune/STUDY)")
    add_format(show_study)
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


def command_tune(args: argparse.Namespace, console: Output) -> int:
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
        trials=args.trials,
        workers=args.workers,
        sampler=args.sampler,
        pruner=args.pruner,
        pruner_startup_trials=args.pruner_startup_trials,
        pruner_warmup_steps=args.pruner_warmup_steps,
        timeout=args.timeout,
        device=args.device,
        runs_per_gpu=args.runs_per_gpu,
        seeds_per_process=args.seeds_per_process,
    )
    slots = tuning_study.check_options(**options, local=args.executor == "local")
    executor = _tune_executor(args, slots)
    from benchmark.config import name_from

    study_name = args.study or name_from(f"{args.algo}-{args.env.replace('/', '-')}")
    if not re.fullmatch(r"[\w.\-]+", study_name):
        raise ConfigError(f"study name {study_name!r}: use letters, digits, '.', '_' and '-' only")
    default_url = tuning_storage.default_storage_url(args.results_dir)
    storage_url = args.storage or default_url
    given = {
        "budget": args.budget,
        "seeds_per_trial": args.seeds_per_trial,
        "suite": args.suite,
        "reference": args.reference,
        "random": args.random,
        "seed": args.seed,
    }
    settings, _ = tuning_study.prepare(args.algo, args.env, study_name, storage_url, default_url, given, args.space)
    stores.check_writable_directory(args.results_dir, "results directory")
    tracking_uri = args.tracking_uri or tracking.default_tracking_uri(args.results_dir)
    tracking.ensure_store(tracking_uri, deep=True, writing=True)
    result = tuning_study.run_study(
        settings,
        study_name=study_name,
        storage_url=storage_url,
        tracking_uri=tracking_uri,
        results_dir=args.results_dir,
        executor=executor,
        **options,
    )
    counts = ", ".join(f"{count} {state.lower()}" for state, count in result.counts.items() if count)
    console.print(
        f"study {study_name!r}: trials {result.trials_before}..{result.trials_after - 1} run; {result.trials_after} in all ({counts}); "
        f"MLflow parent run {result.parent_run_id}",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )
    if result.best_trial is not None:
        best = result.best_trial
        console.print(
            f"best: trial {best.number}, normalized score {best.value:.3f} (final returns "
            f"{', '.join(f'{r:.1f}' for r in best.user_attrs.get('final_returns', []))}); "
            f"see it with: python -m benchmark tune show {study_name}; make it a suite with: python -m benchmark tune export {study_name}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    for error in result.worker_errors:
        console.print(f"[red]{error}[/]", highlight=False)
    return EXIT_RUNS_FAILED if result.worker_errors else 0


def _tune_executor(args: argparse.Namespace, slots: list):
    """The executor the trials run on (``--executor``), at most ``--workers`` trials at once."""
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


def _tune_show(args: argparse.Namespace, console: Output) -> int:
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
        f"({settings.reference_source}); trials: " + ", ".join(f"{count} {state.lower()}" for state, count in sorted(found["counts"].items())),
        soft_wrap=True,
        markup=False,
        highlight=False,
    )
    table = TableData(
        f"best trials of {study.study_name}", ["trial", "normalized", "final returns", "seconds", "parameters"], right={"trial", "normalized", "seconds"}
    )
    for trial in found["best"]:
        returns = ", ".join(f"{r:.1f}" for r in trial.user_attrs.get("final_returns", []))
        seconds = f"{trial.duration.total_seconds():.0f}" if trial.duration else "—"
        tuned = trial.user_attrs.get("tuned", trial.params)
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in tuned.items())
        table.add(trial.number, f"{trial.value:.3f}", returns, seconds, params)
    weights = tuning_inspect.importances(study)
    if weights is not None:
        importance = TableData(
            "parameter importances (fANOVA over the completed trials)", ["parameter", "importance"], names={"parameter"}, right={"importance"}
        )
        for name, weight in weights.items():
            importance.add(name, f"{weight:.3f}")
        console.table(table, importance)
    else:
        console.table(table)
        console.print("no parameter importances: they need at least two completed trials with different scores")
    written = tuning_inspect.write_plots(study, args.output or ResultsDir(args.results_dir).tune_plots(study.study_name), weights is not None)
    console.print("plots: " + ", ".join(str(path) for path in written), soft_wrap=True, markup=False, highlight=False)
    console.print(f"browse it: optuna-dashboard {tracking.redact(url)}", soft_wrap=True, markup=False, highlight=False)
    return 0


def _tune_export(args: argparse.Namespace, console: Output) -> int:
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
        soft_wrap=True,
        markup=False,
        highlight=False,
    )
    return 0


COMMANDS = {"tune": command_tune}
INTERRUPTED = {"tune": "interrupted: the running trials are marked FAIL in the study and KILLED in MLflow"}
