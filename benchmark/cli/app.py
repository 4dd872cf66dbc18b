"""The command line: ``python -m benchmark COMMAND`` (also installed as ``reprorl``).

Each command lives in its own module, which adds its sub-parser (``add_parser``) and maps its
name to the function that runs it (``COMMANDS``); this module lists them, builds the parser
and dispatches. Configuration errors print one line naming the problem and exit 2 before any
result is written.
"""

from __future__ import annotations

import os
import signal
import sys

from rich.console import Console

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
    raise_terminated,
)

COMMAND_MODULES = (run, train, continuation, evaluate, report, compare, regress, reference, tune, perf, ui, results, parity, fingerprint, listing)
"""In the order ``--help`` lists their commands."""


def build_parser() -> Parser:
    parser = Parser(prog="python -m benchmark", description="reprorl: reproducible deep-RL benchmarks")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.add_parser(commands)
    return parser


def interruption_line(command: str) -> str:
    """What an interrupted command left behind, in one line (a module's ``INTERRUPTED`` names it)."""
    lines = {name: line for module in COMMAND_MODULES for name, line in getattr(module, "INTERRUPTED", {}).items()}
    return lines.get(command, "interrupted")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no download bars in our output
    from agents import settings
    from agents.errors import ConfigError
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
