"""What every command shares: exit codes, the one-line errors, the common options (formats,
stores, bundles, seeds per process, Slurm) and finding the stores."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import NoReturn

from agents.errors import ConfigError

EXIT_CONFIG_ERROR = 2
EXIT_RUNS_FAILED = 1
EXIT_REGRESSION = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or ``kill``), handled like Ctrl-C: workers stopped, runs marked KILLED."""


def raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


class Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (not the usage block), exit 2 like every bad input; a
    misspelled command gets the closest one."""

    def error(self, message: str) -> NoReturn:
        invalid = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if invalid:  # argparse lists the choices but does not say which one was meant (before Python 3.14)
            argument, given, choices = invalid.group(1), invalid.group(2), re.findall(r"'([^']*)'", invalid.group(3))
            close = difflib.get_close_matches(given, choices, n=1)
            meant = f" (did you mean {close[0]!r}?)" if close else ""
            if argument == "COMMAND":
                message = f"unknown command {given!r}{meant}; commands: {', '.join(choices)}"
            else:
                message = f"argument {argument}: invalid choice {given!r}{meant}; choose from {', '.join(choices)}"
        error_line(f"{self.prog}: {message} (see {self.prog} --help)")
        sys.exit(EXIT_CONFIG_ERROR)


def prog_name() -> str:
    """The command as the user typed it: ``reprorl`` (the installed entry point), else ``python -m benchmark``."""
    return "reprorl" if Path(sys.argv[0]).name == "reprorl" else "python -m benchmark"


_MULTIPLIERS = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def steps_value(text: str) -> int:
    """A number of env steps as people write them: 100000, 100_000, 100,000, 1e5, 300k, 1.5M
    (argparse names the option on error)."""
    import decimal

    cleaned = text.strip().replace("_", "").replace(",", "")
    multiplier = _MULTIPLIERS.get(cleaned[-1:].lower(), 1)
    if multiplier != 1:
        cleaned = cleaned[:-1]
    try:
        value = decimal.Decimal(cleaned) * multiplier
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of steps (write 100000, 1e5, 300k or 1M)") from None
    if not value.is_finite() or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of steps")
    return int(value)


def error_line(message: str) -> None:
    """``error: message`` as exactly one line on stderr (rich markup in the message is not interpreted)."""
    sys.stderr.write("error: " + " ".join(message.split()) + "\n")
    sys.stderr.flush()


def describe_failure(error: BaseException) -> str:
    """One line for an error that ended a command while it ran."""
    from benchmark import stores

    if isinstance(error, stores.StoreBusy):
        return str(error)
    if stores.is_disk_full(error):
        where = error.strerror if isinstance(error, stores.DiskFull) else getattr(error, "filename", None)
        return (
            f"the disk is full{f' ({where})' if where else ''}: free some space and launch again; finished runs and "
            "the last checkpoints are intact, and finished runs are not run again"
        )
    text = str(error)
    for marker in ("database disk image is malformed", "file is not a database"):
        if marker in text:
            return f"the tracking store is corrupt (SQLite: {marker}): restore it from a copy or move it aside"
    return f"{type(error).__name__}: {text} (set REPRORL_DEBUG=1 to see the traceback)"


def add_format(parser: argparse.ArgumentParser) -> None:
    from benchmark.tables import FORMATS

    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (default: for the terminal), md, csv or json: the bare table on stdout, other lines on stderr",
    )


def margin_value(text: str) -> float:
    """--margin: a positive number of normalized units (argparse names the option on error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number of normalized units such as 0.2, got {text!r}") from None
    if not (value > 0 and value < 100):  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected a positive number of normalized units such as 0.2, got {text!r}")
    return value


def nonnegative_margin_value(text: str) -> float:
    """--margin where 0 is meaningful (regress: every significant drop counts)."""
    if text.strip() in ("0", "0.0"):
        return 0.0
    return margin_value(text)


def add_margin(parser: argparse.ArgumentParser, default: float = 0.2, what: str = "normalized units (random 0, the task's reference 1)") -> None:
    """The equivalence margin, stated before looking (the verdict rule: docs/results.md)."""
    parser.add_argument(
        "--margin",
        type=margin_value,
        default=default,
        metavar="M",
        help=f"equivalence margin in {what}: reproduced means the 90%% interval of the difference lies within ±M "
        f"and no difference is shown (default {default:g})",
    )


def add_seeds_per_process(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seeds-per-process",
        type=int,
        metavar="N",
        help="train up to N seeds of one configuration in one process as one batched model "
        "(PPO, SAC, TD3, DDPG, DQN...; overrides the suite's seeds_per_process; each seed stays its own MLflow run)",
    )


def add_bundle_arguments(parser: argparse.ArgumentParser, suite_default: bool = True) -> None:
    parser.add_argument(
        "--from",
        dest="from_dirs",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="result bundles to read as well as the tracking store (python -m benchmark export writes them)"
        + ("; results/published/<suite> is read by default" if suite_default else ""),
    )
    if suite_default:
        parser.add_argument("--no-published", action="store_true", help="do not read the suite's bundle under <results-dir>/published/")


def add_seeds_filter(parser: argparse.ArgumentParser) -> None:
    """--seeds for the commands that read finished runs: which seeds of the suite's configurations count."""
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        metavar="SEED",
        help="only these seeds (default: every seed of the suite's configurations that the store or the bundles hold, its seeds: or not)",
    )


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results-dir", type=Path, default=Path("results"), help="MLflow store, artifacts, checkpoints, reports")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite in --results-dir)")


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
    group.add_argument(
        "--slurm-signal-delay",
        type=int,
        metavar="SECONDS",
        help="warn a job this long before its time limit: its runs stop with a checkpoint and it is requeued (default 90)",
    )
    group.add_argument(
        "--slurm-cluster",
        choices=("slurm", "local"),
        default="slurm",
        help="slurm (default), or local: submitit's local executor, each job a process on this machine (to try it out)",
    )


SLURM_ARGUMENTS = {
    "slurm_partition": "partition",
    "slurm_time": "time_minutes",
    "slurm_gpus": "gpus",
    "slurm_cpus": "cpus",
    "slurm_constraint": "constraint",
    "slurm_account": "account",
    "slurm_memory": "memory_gb",
    "slurm_signal_delay": "signal_delay_s",
}


def slurm_options(args: argparse.Namespace, suite_options: dict | None = None):
    """The Slurm job options: the suite's ``slurm:`` key, overridden by the command line."""
    from benchmark.execution.slurm import SlurmOptions

    options = dict(suite_options or {})
    options.update({key: getattr(args, name) for name, key in SLURM_ARGUMENTS.items() if getattr(args, name, None) is not None})
    result = SlurmOptions(**options)
    result.check()
    return result


def existing_store(args: argparse.Namespace) -> str:
    """The tracking URI of a command that only reads results: refused (ConfigError, nothing
    created) when its SQLite file does not exist, and checked when it does."""
    from benchmark import stores, tracking

    tracking_uri = store_if_exists(args)
    if tracking_uri is None:
        path = stores.sqlite_path(args.tracking_uri or tracking.default_tracking_uri(args.results_dir))
        assert path is not None  # store_if_exists answers None only for a SQLite file not there
        where = f"results directory {args.results_dir}" if args.tracking_uri is None else "--tracking-uri"
        missing = "does not exist" if not path.parent.exists() else "holds no tracking store"
        raise ConfigError(f"{where} {missing} ({path} not found): pass the --results-dir (or --tracking-uri) your runs were stored in")
    return tracking_uri


def bundled_runs(args: argparse.Namespace, suite_name: str) -> dict:
    """Run key -> bundled run, from ``--from`` and (unless --no-published) the suite's published bundle."""
    from benchmark.execution import plan

    return plan.default_bundles(args.results_dir, suite_name, getattr(args, "from_dirs", None), not getattr(args, "no_published", False))


def store_if_exists(args: argparse.Namespace, local_only: bool = False) -> str | None:
    """The tracking URI when its store exists (checked, never created); None for a SQLite file not
    there yet. ``local_only``: only a SQLite file is checked (None for a server), a check cheap
    enough to come before anything slow, so that a damaged store is named at once."""
    from benchmark import stores, tracking

    tracking_uri = args.tracking_uri or tracking.default_tracking_uri(args.results_dir)
    path = stores.sqlite_path(tracking_uri)
    if (path is None and local_only) or (path is not None and not path.exists()):
        return None
    tracking.ensure_store(tracking_uri, deep=True)
    return tracking_uri


def writable_report_directory(directory: Path, what: str) -> Path:
    """``directory``, created and checked writable for a command's report; ConfigError in one
    line when it cannot be (a full disk is raised as it is: the command names it)."""
    from benchmark import stores

    try:
        directory.mkdir(parents=True, exist_ok=True)
        stores.check_writable_directory(directory, "report directory")
    except OSError as error:
        if stores.is_disk_full(error):
            raise
        raise ConfigError(f"cannot write the {what} to {directory}: {error.strerror or error}; pass --output DIR") from None
    return directory
