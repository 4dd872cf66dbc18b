"""``python -m benchmark reference build|random|show``: the reference and random scores runs are normalized with."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import (
    add_format,
)

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    reference = commands.add_parser("reference", help="reference scores: build the table, measure random-policy scores, show")
    reference_commands = reference.add_subparsers(dest="reference_command", required=True)
    build = reference_commands.add_parser("build", help="write results/reference/scores.csv from the shared published table")
    build.add_argument("--source", type=Path, help="published scores CSV (default ../shared/reference/scores.csv)")
    random = reference_commands.add_parser("random", help="measure uniform-random-policy returns into results/reference/random.csv")
    random.add_argument("--env", nargs="+", required=True, help="gymnasium ids, e.g. --env CartPole-v1 HalfCheetah-v5")
    random.add_argument("--episodes", type=int, default=100, help="episodes per environment (default 100)")
    random.add_argument("--seed", type=int, default=0, help="seed of the first episode and of the action sampler")
    show = reference_commands.add_parser("show", help="the reference and random score each environment is normalized with")
    show.add_argument("--env", nargs="+", help="environments (default: every environment of every suite)")
    add_format(show)


def command_reference(args: argparse.Namespace, console: Output) -> int:
    from benchmark import config
    from benchmark.analysis import normalizers, reference

    if args.reference_command == "build":
        source = args.source or reference.SHARED_SCORES
        if not source.exists():
            raise ConfigError(f"published scores not found at {source}; pass --source PATH")
        count = reference.build(source)
        console.print(f"wrote {count} published scores to {reference.REFERENCE_DIR / 'scores.csv'}")
        _fix_normalizers(console)
        return 0
    if args.reference_command == "random":
        from agents.envs import check_env_id

        for env_id in args.env:  # every id checked before any is measured
            check_env_id(env_id)
        for env_id in args.env:
            score = reference.measure_random(env_id, args.episodes, args.seed)
            reference.save_random(score)
            console.print(f"{env_id}: random policy {score.mean:.2f} ± {score.std:.2f} over {score.episodes} episodes")
        _fix_normalizers(console)
        return 0
    env_ids = args.env or sorted({s.env_id for name in config.available_suites() for s in config.load_suite(name).specs})
    from benchmark.tables import TableData

    table = TableData(
        "normalization: (score - random) / (reference - random)",
        ["environment", "random (measured here)", "reference", "source", "fixed"],
        names={"environment"},
        right={"reference"},
    )
    for env_id in env_ids:
        norm = normalizers.normalizer(env_id)
        random_cell = f"{norm.random.mean:.2f} ({norm.random.episodes} ep.)" if norm.random else "— (not measured)"
        ref = norm.reference
        fixed = "provisional (reference build fixes it)" if norm.provisional else "normalizers.csv"
        table.add(env_id, random_cell, f"{ref.mean:.1f}" if ref else "—", ref.citation if ref else "no published score", fixed if ref and norm.random else "—")
    console.table(table)
    return 0


def _fix_normalizers(console: Output) -> None:
    """A task that gained both a random score and a published reference gets its fixed normalizer (once)."""
    from benchmark.analysis import normalizers

    for env_id in normalizers.fix_missing():
        console.print(f"{env_id}: normalizer fixed in {normalizers.FILE_NAME} (never moved afterwards)")


COMMANDS = {"reference": command_reference}
