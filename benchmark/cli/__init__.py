"""The command line: ``python -m benchmark COMMAND`` (``reprorl``). ``app`` builds the parser
and dispatches; the commands that move and judge results live in ``results``, ``parity``
in ``parity``."""

from benchmark.cli.app import EXIT_CONFIG_ERROR, main

__all__ = ["EXIT_CONFIG_ERROR", "main"]
