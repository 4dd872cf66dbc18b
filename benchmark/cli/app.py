"""The command line: ``python -m benchmark COMMAND`` (also installed as ``reprorl``).

Each command lives in its own module, which adds its sub-parser (``add_parser``) and maps its
name to the function that runs it (``COMMANDS``); this module lists them, builds the parser
and dispatches. Configuration errors print one line naming the problem and exit 2 before any
result is written.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, cast

from rich.console import Console

from agents.errors import ConfigError
from benchmark.cli import compare, continuation, evaluate, fingerprint, listing, parity, perf, reference, regress, report, results, run, train, tune, ui
from benchmark.cli.common import (
    EXIT_CONFIG_ERROR,
    EXIT_INTERRUPTED,
    EXIT_RUNS_FAILED,
    EXIT_TERMINATED,
    Parser,
    Terminated,
    describe_failure,
    error_line,
    prog_name,
    raise_terminated,
)

COMMAND_MODULES = (run, train, continuation, evaluate, report, compare, regress, reference, tune, perf, ui, results, parity, fingerprint, listing)

GROUPS = {
    "train": ("train", "run", "continue", "evaluate", "reproduce", "tune"),
    "results": ("report", "verdicts", "compare", "record", "export", "import", "merge", "baseline", "regress", "parity", "reference"),
    "tools": ("list", "ui", "perf", "calibrate", "fingerprint"),
}
"""How ``--help`` lists the commands."""

EXAMPLES = {
    "train": "{prog} train --algo sac --env Pendulum-v1 --steps 20k",
    "run": "{prog} run --suite classic --algos ppo trpo --envs CartPole-v1 --workers 2",
    "continue": "{prog} continue RUN_KEY --steps 50k",
    "evaluate": "{prog} evaluate RUN_KEY --episodes 20 --video run.mp4",
    "reproduce": "{prog} reproduce RUN_KEY --from results/published/classic",
    "tune": "{prog} tune --algo ppo --env CartPole-v1 --trials 20 --steps 50k",
    "report": "{prog} report --suite classic",
    "verdicts": "{prog} verdicts --suite mujoco --plan",
    "compare": "{prog} compare --candidate mysuite --baseline results/published/mujoco",
    "record": "{prog} record --check",
    "export": "{prog} export --suite classic --with-weights --output my-agents",
    "import": "{prog} import results/published/mujoco results/published/mujoco_300k",
    "merge": "{prog} merge machine-a/classic machine-b/classic --output results/published/classic",
    "baseline": "{prog} baseline --suite ci --workers 2",
    "regress": "{prog} regress --suite ci --workers 2",
    "parity": "{prog} parity --algo sac --env Hopper-v5 --steps 100k --seeds 0 1 2 3 4",
    "reference": "{prog} reference show",
    "list": "{prog} list --algo sac",
    "ui": "{prog} ui --port 8080",
    "perf": "{prog} perf --cases ppo sac --scale 0.5",
    "calibrate": "{prog} calibrate --suite mujoco",
    "fingerprint": "{prog} fingerprint --algo ppo",
}
"""One example per command, shown at the end of its ``--help``."""


class _Commands:
    """The sub-parsers' factory as the command modules see it: each command gets its one-line
    help as its description and its example (``EXAMPLES``) at the end of its ``--help``."""

    def __init__(self, subparsers: Any, prog: str):
        self.subparsers, self.prog = subparsers, prog
        self.helps: dict[str, str] = {}

    def add_parser(self, name: str, **options: Any) -> Parser:
        summary = str(options.get("help", ""))
        self.helps[name] = summary
        options.setdefault("description", summary[:1].upper() + summary[1:] + ("" if summary.endswith(".") else "."))
        if name in EXAMPLES:
            options.setdefault("epilog", "example:\n  " + EXAMPLES[name].format(prog=self.prog))
        options.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        return cast("Parser", self.subparsers.add_parser(name, **options))


def build_parser() -> Parser:
    prog = prog_name()
    parser = Parser(prog=prog, usage=f"{prog} COMMAND [options]", formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS, prog=prog)
    commands = _Commands(subparsers, prog)
    for module in COMMAND_MODULES:
        module.add_parser(commands)
    listed = [name for names in GROUPS.values() for name in names]
    assert sorted(listed) == sorted(commands.helps), "every command belongs to one group of --help"
    width = max(map(len, listed)) + 2
    groups = [f"{group} commands:\n" + "\n".join(f"  {name:<{width}}{commands.helps[name]}" for name in names) for group, names in GROUPS.items()]
    parser.description = "reprorl: deep-RL algorithms on standard tasks over many seeds, tracked, tuned and compared with published scores.\n\n" + "\n\n".join(
        groups
    )
    parser.epilog = f"'{prog} COMMAND --help' gives a command's options and an example; every command: docs/commands.md"
    return parser


def interruption_line(command: str) -> str:
    """What an interrupted command left behind, in one line (a module's ``INTERRUPTED`` names it)."""
    lines = {name: line for module in COMMAND_MODULES for name, line in getattr(module, "INTERRUPTED", {}).items()}
    return lines.get(command, "interrupted")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no download bars in our output
    from agents import settings
    from benchmark.tables import Output

    console = Output(getattr(args, "format", "table"))
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        settings.cpu_gemm()  # checked before anything runs
        settings.critic_layout()
        commands = {name: command for module in COMMAND_MODULES for name, command in module.COMMANDS.items()}
        return commands[args.command](args, console)
    except ConfigError as error:
        error_line(str(error))
        return EXIT_CONFIG_ERROR
    except KeyboardInterrupt as interruption:
        Console(stderr=True).print(interruption_line(args.command), highlight=False, markup=False)
        return EXIT_TERMINATED if isinstance(interruption, Terminated) else EXIT_INTERRUPTED
    except Exception as error:  # noqa: BLE001 - a failure while running: one line, not a traceback
        if os.environ.get("REPRORL_DEBUG"):
            raise
        error_line(describe_failure(error))
        return EXIT_RUNS_FAILED


if __name__ == "__main__":
    sys.exit(main())
