"""``python -m benchmark list``: algorithms, buffers, suites, environments, an algorithm's defaults."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError, suggest
from benchmark.cli.common import (
    add_format,
)

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    listing = commands.add_parser("list", help="algorithms, buffers, suites and environments; an algorithm's defaults")
    listing.add_argument(
        "what", nargs="?", metavar="algorithms|buffers|suites|envs|ALGO", help="one section only, or one algorithm's hyperparameters with their defaults"
    )
    add_format(listing)


def command_list(args: argparse.Namespace, console: Output) -> int:
    import agents
    from agents.buffers import BUFFERS
    from agents.config_docs import field_docs
    from benchmark import config
    from benchmark.tables import TableData

    sections = ("algorithms", "buffers", "suites", "envs")
    what = args.what
    if what is not None and what not in sections:
        if what not in agents.ALGORITHMS:
            choices = [*sections, *sorted(agents.ALGORITHMS)]
            raise ConfigError(f"nothing to list as {what!r}{suggest(what, choices)}; list one of {', '.join(sections)} or an algorithm")
        config_class = agents.config_class(what)
        table = TableData(
            f"{what}: hyperparameters",
            ["hyperparameter", "default", "range", "meaning"],
            names={"hyperparameter"},
            caption=f"defaults: {' '.join((config_class.__doc__ or '').split())}",
        )
        for field in field_docs(config_class):
            table.add(field.name, field.default, field.range, field.meaning)
        console.table(table)
        return 0
    tables = []
    if what in (None, "algorithms"):
        table = TableData("algorithms (list ALGO: its hyperparameters)", ["name", "actions", "what it is"], names={"name"})
        for name, cls in sorted(agents.ALGORITHMS.items()):
            kinds = [
                kind
                for kind, ok in (
                    ("discrete", cls.Config.supports_discrete),
                    ("multi-discrete", cls.Config.supports_multi_discrete),
                    ("box", cls.Config.supports_continuous),
                )
                if ok
            ]
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

        table = TableData("environments used by the suites", ["id", "observation", "actions", "max episode steps"], names={"id"}, right={"max episode steps"})
        env_ids = sorted({s.env_id for suite in suites.values() for s in suite.specs})
        for env_id in env_ids:
            spec = env_spec(env_id)
            actions = spec.action_space_name
            if not spec.discrete:
                assert spec.action_low is not None and spec.action_high is not None  # continuous: a Box's bounds
                actions += f" in [{min(spec.action_low):g}, {max(spec.action_high):g}]"
            table.add(env_id, f"Box{spec.observation_shape}", actions, spec.max_episode_steps)
        tables.append(table)
    console.table(*tables)
    return 0


COMMANDS = {"list": command_list}
