"""``python -m benchmark continue RUN_ID --steps N``: train a finished run further, as a new run
linked to it (RL Baselines3 Zoo's ``--trained-agent``).

The new run is the old one's algorithm, environment, seed and every hyperparameter, with a
budget N env steps longer and ``continued_from`` set to the old run's key (so it has a run key
of its own, and the old run stays as it was). It starts from the old run's ``final.pt`` (the
local checkpoint, else the copy in its MLflow artifacts): networks, optimizers and
normalization statistics as they ended, its step counter where it ended; its episodes start
anew and an off-policy learner refills its replay buffer before updating again. Like ``train``,
the command writes the ad-hoc suite it stands for under ``<results-dir>/suites/`` and trains it
as ``run`` does (tracked, resumable, skipped once finished); ``--dry-run`` writes nothing."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import existing_store, steps_value
from benchmark.cli.run import INTERRUPTED as RUN_INTERRUPTED
from benchmark.cli.run import add_run_options, check_run_arguments
from benchmark.cli.train import train_adhoc
from benchmark.results_layout import ResultsDir

if TYPE_CHECKING:
    from benchmark.config import RunSpec
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    further = commands.add_parser("continue", help="train a finished run further, as a new run linked to it")
    further.add_argument("run", metavar="RUN_ID", help="the finished run: its MLflow run id, or its run key")
    further.add_argument("--steps", type=steps_value, required=True, help="env steps to train beyond where it ended")
    further.add_argument("--eval-every", type=steps_value, metavar="STEPS", help="env steps between evaluations (default: the run's)")
    add_run_options(further)


def command_continue(args: argparse.Namespace, console: Output) -> int:
    import agents

    args.seeds = None
    check_run_arguments(args)
    if args.steps < 1:
        raise ConfigError(f"--steps must be a positive number of env steps, got {args.steps}")
    if args.eval_every is not None and args.eval_every < 1:
        raise ConfigError(f"--eval-every must be a positive number of env steps, got {args.eval_every}")
    tracking_uri = existing_store(args)
    from benchmark.analysis.trained import final_checkpoint, finished_run
    from benchmark.training.checkpoint_paths import FINAL, run_directory

    run_id, origin = finished_run(args.run, tracking_uri)
    checkpoints = ResultsDir(args.results_dir).checkpoints
    with tempfile.TemporaryDirectory(prefix="reprorl-final-") as scratch:  # --dry-run fetches no final.pt into the results
        local = (run_directory(checkpoints, origin.run_key) / FINAL).is_file()
        final = final_checkpoint(run_id, origin, tracking_uri, checkpoints if local or not args.dry_run else Path(scratch))
    ended = int(final.get("step", origin.budget.total_steps))
    data = continuation_suite(origin, ended, args.steps, args.eval_every, f"python -m benchmark continue {args.run} --steps {args.steps}")

    def described(path: Path) -> None:
        console.print(
            f"continues run {run_id} ({origin.label}, run key {origin.run_key}) from env step {ended:,} to {ended + args.steps:,}",
            highlight=False,
            soft_wrap=True,
        )
        schedules = agents.resolve_config(origin.algo, origin.hyperparameters).budget_schedules()
        if schedules:
            console.print(
                f"note: {', '.join(schedules)} move with the fraction of the budget trained; over the new budget they start "
                f"{ended / (ended + args.steps):.0%} of the way (the run ended at 100% of its own)",
                highlight=False,
                soft_wrap=True,
            )

    return train_adhoc(args, console, data, continued=ended, before=described)


def continuation_suite(origin: RunSpec, ended: int, steps: int, eval_every: int | None, command: str) -> dict[str, Any]:
    """The suite of the run that trains ``origin`` (which ended at env step ``ended``) ``steps``
    env steps further: its settings exactly, every hyperparameter spelled out."""
    from benchmark.config import name_from

    budget = {"total_steps": ended + steps, "eval_every": eval_every or origin.budget.eval_every, "eval_episodes": origin.budget.eval_episodes}
    experiment: dict[str, Any] = {"algo": origin.algo, "envs": [origin.env_id], "hyperparameters": origin.hyperparameters}
    if origin.env_kwargs:
        experiment["env_kwargs"] = origin.env_kwargs
    if origin.wrappers:
        experiment["wrappers"] = origin.wrappers
    experiment["continued_from"] = origin.run_key
    return {
        "name": name_from(f"continue-{origin.algo}-{origin.env_id}-{origin.run_key[:8]}-to-{ended + steps}"),
        "description": command,
        "seeds": [origin.seed],
        "budget": budget,
        "experiments": [experiment],
    }


COMMANDS = {"continue": command_continue}
INTERRUPTED = {"continue": RUN_INTERRUPTED["run"]}
