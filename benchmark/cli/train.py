"""``python -m benchmark train``: one algorithm on one environment without writing a suite file,
as RL Baselines3 Zoo's ``train --algo --env``. The command writes the ad-hoc suite it stands for
under ``<results-dir>/suites/`` and trains it as ``run`` would: the same run keys, tracking,
skip-finished and resume, and ``report --suite <that file>`` reports it. With ``--dry-run`` it
plans from a temporary copy and writes nothing."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import steps_value
from benchmark.cli.run import INTERRUPTED as RUN_INTERRUPTED
from benchmark.cli.run import add_run_options, check_run_arguments, command_run
from benchmark.results_layout import ResultsDir

if TYPE_CHECKING:
    from benchmark.tables import Output

DEFAULT_STEPS = 100_000


def add_parser(commands: Any) -> None:
    train = commands.add_parser("train", help="train one algorithm on one environment (an ad-hoc suite, tracked and resumable like run)")
    train.add_argument("--algo", required=True, help="an algorithm of ours, a plug-in's name or a learner's import path (package.module:Class)")
    train.add_argument("--env", required=True, help="a gymnasium id, or package.module:Env-vN")
    train.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "hyperparameters over the published defaults, values in YAML (1e-3 reads as a number): --set learning_rate=1e-3 hidden_sizes=[64,64]; "
            "the env's too: env_kwargs.NAME=VALUE (or env_kwargs={...}) and wrappers=[package.module:Wrapper, ...]"
        ),
    )
    train.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (default 0)")
    train.add_argument(
        "--steps", type=steps_value, help=f"env steps per run (default: the task's budget in the suite its settings come from, else {DEFAULT_STEPS:,})"
    )
    train.add_argument(
        "--eval-every", type=steps_value, metavar="STEPS", help="env steps between deterministic evaluations (default: the task's, else a tenth of --steps)"
    )
    train.add_argument(
        "--published-defaults",
        action="store_true",
        help="start from the algorithm's published defaults, not the task's settings in the project's suites (classic, mujoco, then the others)",
    )
    train.add_argument("--eval-episodes", type=int, default=10, metavar="N", help="episodes per evaluation (default 10)")
    add_run_options(train)


ENV_OPTIONS = ("env_kwargs", "wrappers")
"""``--set`` keys that set how the env is made (experiment keys of a suite), not hyperparameters."""


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs -> hyperparameters (and ``env_kwargs``, ``wrappers``), each value read
    as YAML (numbers, lists, booleans); ``env_kwargs.NAME=VALUE`` sets one env kwarg."""
    import yaml

    overrides: dict[str, Any] = {}
    whole: set[str] = set()  # keys given whole (env_kwargs={...} forbids env_kwargs.NAME=...)
    for item in items:
        key, separator, text = item.partition("=")
        if not separator or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|env_kwargs\.[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a hyperparameter name (or env_kwargs.NAME) as KEY")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as error:
            raise ConfigError(f"--set {item!r}: the value is not YAML ({error.__class__.__name__})") from None
        value = _numbers(value)
        if key.startswith("env_kwargs."):  # one env kwarg, into the env_kwargs mapping
            name = key.partition(".")[2]
            if "env_kwargs" in whole or name in overrides.get("env_kwargs", {}):
                raise ConfigError(f"--set: {key} is given twice (by name or in env_kwargs)")
            overrides.setdefault("env_kwargs", {})[name] = value
            continue
        if key in overrides:
            raise ConfigError(f"--set: {key} is given twice")
        whole.add(key)
        overrides[key] = value
    return overrides


def _numbers(value: Any) -> Any:
    """``value`` with every string that reads as a number (at any depth) made one."""
    if isinstance(value, dict):
        return {key: _numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_numbers(item) for item in value]
    return _number(value) if isinstance(value, str) else value


def _number(text: str) -> Any:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string: a value that reads as a number is one."""
    try:
        return float(text) if text.strip().lower() not in ("nan", "inf", "-inf", "+inf", "infinity") else text
    except ValueError:
        return text


def adhoc_suite(algo: str, env: str, overrides: dict[str, Any], seeds: list[int], steps: int, eval_every: int | None, episodes: int) -> dict[str, Any]:
    """The suite ``train`` stands for. Its name says what it trains; settings other than the
    published defaults add a short hash of them, so that two settings never share a file."""
    from benchmark.config import name_from

    budget = {"total_steps": steps, "eval_every": eval_every or max(steps // 10, 1), "eval_episodes": episodes}
    name = name_from(f"train-{algo}-{env}")
    if overrides:
        name += "-" + hashlib.sha256(json.dumps(overrides, sort_keys=True, default=str).encode()).hexdigest()[:8]
    experiment: dict[str, Any] = {"algo": algo, "envs": [env]}
    hyperparameters = {key: value for key, value in overrides.items() if key not in ENV_OPTIONS}
    if hyperparameters:
        experiment["hyperparameters"] = hyperparameters
    experiment.update({key: overrides[key] for key in ENV_OPTIONS if key in overrides})
    return {
        "name": name,
        "description": f"python -m benchmark train --algo {algo} --env {env}",
        "seeds": seeds,
        "budget": budget,
        "experiments": [experiment],
    }


def command_train(args: argparse.Namespace, console: Output) -> int:
    from benchmark import task_defaults

    check_run_arguments(args)
    given = parse_overrides(args.set)
    task = None if args.published_defaults else task_defaults.find(args.algo, args.env)
    steps, eval_every, overrides = args.steps, args.eval_every, given
    if task is not None:
        overrides = {**task.hyperparameters, **task.options, **given}
        if steps is None:
            steps, eval_every = task.budget.total_steps, eval_every or task.budget.eval_every
    data = adhoc_suite(args.algo, args.env, overrides, args.seeds, DEFAULT_STEPS if steps is None else steps, eval_every, args.eval_episodes)

    def settings(_: Path) -> None:
        if task is not None:
            replaced = sorted(set(given) & {*task.hyperparameters, *task.options})
            console.print(task.describe() + (f" (--set replaces {', '.join(replaced)})" if replaced else ""), highlight=False, soft_wrap=True, markup=False)
        elif not args.published_defaults:
            console.print(f"settings: {args.algo}'s published defaults (no suite of the project trains it on {args.env})", highlight=False, soft_wrap=True)

    return train_adhoc(args, console, data, before=settings)


@contextlib.contextmanager
def adhoc_suite_file(data: dict[str, Any], results_dir: Path, dry_run: bool, continued: int | None = None) -> Iterator[tuple[Path, Path]]:
    """The suite ``data`` (one experiment) as a file, once it loads and its budget leaves at least
    one gradient step (else ConfigError, one line, and nothing written): (the file to load,
    ``<results_dir>/suites/<name>.yaml`` where it is kept). With ``dry_run`` it is a temporary
    file, removed on leaving, and nothing is written under ``results_dir``. ``continued``: the
    env step a continued run starts from (its replay buffer is refilled first)."""
    import yaml

    from benchmark import config

    text = yaml.safe_dump(data, sort_keys=False)
    kept = ResultsDir(results_dir).kept_suites / f"{data['name']}.yaml"
    with tempfile.TemporaryDirectory(prefix="reprorl-suite-") as scratch:  # every problem named before anything is written
        checked = Path(scratch) / f"{data['name']}.yaml"
        checked.write_text(text)
        try:
            suite = config.load_suite(str(checked))
        except ConfigError as error:
            raise ConfigError(str(error).replace(f"{checked}: ", "", 1).replace("experiments[0]: ", "", 1)) from None
        spec = suite.specs[0]
        from benchmark.execution.plan import no_update_problem

        problem = no_update_problem(spec, spec.budget.total_steps - (continued or 0), refilling=continued is not None)
        if problem:
            raise ConfigError(f"{problem[0]}: give --steps {problem[1]} or more, or lower those settings with --set")
        if dry_run:
            yield checked, kept
            return
    kept.parent.mkdir(parents=True, exist_ok=True)
    temporary = kept.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(kept)
    yield kept, kept


def train_adhoc(
    args: argparse.Namespace, console: Output, data: dict[str, Any], continued: int | None = None, before: Callable[[Path], None] | None = None
) -> int:
    """Train the ad-hoc suite ``data`` as ``run`` would (``run --dry-run`` with ``--dry-run``,
    which writes nothing); ``before`` prints what the command says first, given the suite's path."""
    with adhoc_suite_file(data, Path(args.results_dir), args.dry_run, continued) as (path, kept):
        if before is not None:
            before(kept)
        console.print(
            f"suite {kept}" + (" (not written: --dry-run)" if args.dry_run else f" (report with: python -m benchmark report --suite {kept})"),
            highlight=False,
            soft_wrap=True,
        )
        args.suite, args.algos, args.envs, args.suite_shown = str(path), None, None, str(kept)
        args.seeds = None  # the suite file holds them
        return command_run(args, console)


COMMANDS = {"train": command_train}
INTERRUPTED = {"train": RUN_INTERRUPTED["run"]}
