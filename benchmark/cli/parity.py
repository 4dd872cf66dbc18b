"""``python -m benchmark parity``: our algorithm and Stable-Baselines3's at one setting, seed by seed.

See ``benchmark.perf.parity`` for the settings, the protocol and the statistics.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agents.errors import ConfigError
from benchmark.cli.common import add_format, add_margin, steps_value

# ConfigError (agents.api) is imported in the functions that raise it: importing agents starts torch,
# and the command line's parser reads this module (--help must not wait for torch).


def add_parser(commands: Any) -> None:
    from benchmark.analysis import parity_records
    from benchmark.perf import parity

    command = commands.add_parser(
        "parity",
        help="train our algorithm and Stable-Baselines3's at identical settings on the same seeds; compare final returns",
    )
    command.add_argument("--algo", help=f"algorithm: {', '.join(parity.SETTINGS)} (omit with --table)")
    command.add_argument("--env", help="environment (default: the algorithm's, Hopper-v5 or CartPole-v1)")
    command.add_argument("--steps", type=steps_value, help="env steps per run (default: 500k on-policy, 100k off-policy, 50k DQN)")
    command.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0, 1, 2, 3, 4],
        metavar="SEED",
        help="seeds (default 0-4); seeds the record already holds are not trained again",
    )
    command.add_argument(
        "--eval-episodes", dest="episodes", type=int, default=parity.EPISODES, metavar="N", help=f"final evaluation episodes (default {parity.EPISODES})"
    )
    command.add_argument("--episodes", dest="episodes", type=int, help=argparse.SUPPRESS)  # the earlier name, kept for a release
    add_margin(command, parity_records.MARGIN, "normalized units (random 0, the task's reference 1; on CartPole and InvertedPendulum: of the success rate)")
    command.add_argument("--workers", type=int, default=1, help="runs trained at once, one core each (default 1, as for run)")
    command.add_argument("--device", default="cpu", help="cpu (default) or cuda: where both sides train (the runs of one invocation share the GPU)")
    command.add_argument("--force", action="store_true", help="train the seeds again even where the record holds them")
    command.add_argument("--table", action="store_true", help="only tabulate the records held (no training)")
    command.add_argument("--output", dest="output_dir", type=Path, default=Path("results/parity"), help="records and tables (default results/parity)")
    command.add_argument("--output-dir", dest="output_dir", type=Path, help=argparse.SUPPRESS)  # the earlier name, kept for a release
    add_format(command)


def command_parity(args: argparse.Namespace, console: Any) -> int:
    from benchmark.analysis import parity_records
    from benchmark.perf import parity
    from benchmark.tables import TableData

    if args.table:
        if args.algo:
            raise ConfigError("--table tabulates every record; drop --algo")
    else:
        if not args.algo:
            raise ConfigError("parity needs --algo (or --table)")
        parity.check_arguments(args.algo, args.env, args.steps, args.seeds, args.episodes, args.margin, args.workers, args.device)
        peer = parity.check_peer(args.algo)
        setting = parity.SETTINGS[args.algo]
        env_id, steps = args.env or setting.env_id, args.steps or setting.steps
        console.print(
            f"parity: {args.algo} on {env_id}, {steps:,} steps, seeds {' '.join(map(str, args.seeds))}; ours against {peer}; "
            f"{args.workers} at once on {args.device}",
            highlight=False,
            markup=False,
        )

        def progress(run: dict) -> None:
            console.print(
                f"  seed {run['seed']} {run['side']:<4} final return {run['final_return']:10.1f}  ({run['seconds'] / 60:.1f} min)",
                highlight=False,
                markup=False,
            )

        path, _ = parity.run(args.algo, args.env, args.steps, args.seeds, args.episodes, args.workers, args.output_dir, args.force, progress, args.device)
        console.print(f"record: {path}", highlight=False, markup=False)
    if not args.output_dir.is_dir():
        raise ConfigError(f"no parity records in {args.output_dir}: run python -m benchmark parity --algo ALGO first")
    rows = parity_records.write_tables(args.output_dir, args.margin)
    table = TableData(
        "parity: ours against the peer library at identical settings (final deterministic returns)",
        list(parity_records.TABLE_COLUMNS),
        names={"algorithm", "environment"},
        right={"steps", "seeds", "p, Holm-adjusted"},
    )
    for row in rows:
        table.add(*parity_records.row_cells(row))
    console.table(table)
    console.print(
        f"reproduced: the 90% interval of the difference lies within the margin (TOST, 5%) and no difference is shown; above/below: Welch's test rejects "
        f"after Holm's correction over the table; inconclusive (needs N): N seeds a side would decide with 80% power; tables: "
        f"{args.output_dir / 'parity.md'}, {args.output_dir / 'parity.csv'}",
        highlight=False,
        markup=False,
    )
    return 0


COMMANDS = {"parity": command_parity}
INTERRUPTED = {"parity": "interrupted: the record keeps every finished side; a rerun trains the others"}
