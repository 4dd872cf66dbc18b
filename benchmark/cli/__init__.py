"""The command line: ``python -m benchmark COMMAND`` (``reprorl``). ``app`` lists the commands,
builds the parser and dispatches; each command is a module of its own (``run``, ``report``,
``regress``, ``reference``, ``tune``, ``perf``, ``ui``, ``results``, ``parity``, ``listing``)
on ``common``'s options and exit codes."""

from benchmark.cli.app import EXIT_CONFIG_ERROR, main

__all__ = ["EXIT_CONFIG_ERROR", "main"]
