"""The command line: ``python -m benchmark COMMAND`` (``reprorl``). ``app`` lists the commands,
builds the parser and dispatches; each command is a module of its own (``run``, ``train``, ``continuation``, ``evaluate``, ``report``, ``compare``,
``regress``, ``reference``, ``tune``, ``perf``, ``ui``, ``results``, ``parity``, ``listing``)
on ``common``'s options and exit codes."""

import gc

from benchmark.cli import app
from benchmark.cli.app import EXIT_CONFIG_ERROR

__all__ = ["EXIT_CONFIG_ERROR", "main"]


def main(argv: list[str] | None = None) -> int:
    """The process's entry point (``python -m benchmark``, ``reprorl``): the command (``app.main``),
    then ``gc.freeze()``, so that the interpreter's exit does not collect the libraries' heap
    (about a second with MLflow and SQLAlchemy loaded). The commands close what they open, so
    nothing is left for that collection to finalize."""
    code = app.main(argv)
    gc.freeze()
    return code
