"""``python -m benchmark baseline|regress``: store a suite's final scores as the regression
baseline; rerun it on new seeds and fail on a significant drop."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import (
    EXIT_REGRESSION,
    add_format,
    add_seeds_per_process,
    add_store_arguments,
    nonnegative_margin_value,
)
from benchmark.cli.run import check_run_arguments, execute_suite

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    baseline = commands.add_parser("baseline", help="run a suite and store its final scores as the regression baseline")
    baseline.add_argument("--suite", default="ci", help="suite name or path (default ci)")
    baseline.add_argument("--output", type=Path, help="baseline JSON (default results/baselines/<suite>.json)")
    baseline.add_argument("--seeds", type=int, nargs="+", help="override the suite's seeds")
    baseline.add_argument("--workers", type=int, default=1, help="runs trained in parallel processes (default 1)")
    add_seeds_per_process(baseline)
    add_format(baseline)
    add_store_arguments(baseline)

    regress = commands.add_parser("regress", help="rerun a suite on new seeds and compare with its baseline; exit 1 on a regression")
    regress.add_argument("--suite", default="ci", help="suite name or path (default ci)")
    regress.add_argument("--baseline", type=Path, help="baseline JSON (default results/baselines/<suite>.json)")
    regress.add_argument("--seeds", type=int, nargs="+", help="seeds to run (default: the baseline's shifted by 100)")
    regress.add_argument("--algos", nargs="+", help="check only these algorithms' rows")
    regress.add_argument("--envs", nargs="+", help="check only the rows on these environments")
    regress.add_argument("--workers", type=int, default=1, help="runs trained in parallel processes (default 1)")
    add_seeds_per_process(regress)
    regress.add_argument("--alpha", type=float, default=0.05, help="family-wise false-alarm rate (Holm over rows; default 0.05)")
    regress.add_argument(
        "--margin",
        "--min-effect",
        dest="min_effect",
        type=nonnegative_margin_value,
        default=0.1,
        help="the margin, in normalized score: equivalent within it, and the smallest drop that counts as a regression (default 0.1)",
    )
    regress.add_argument(
        "--from",
        dest="from_dirs",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="compare against these result bundles' runs of the suite instead of the baseline JSON",
    )
    add_format(regress)
    add_store_arguments(regress)


def command_baseline(args: argparse.Namespace, console: Output) -> int:
    from benchmark import config
    from benchmark.analysis import regress

    check_run_arguments(args)
    suite = config.load_suite(args.suite, seeds=args.seeds).with_seeds_per_process(args.seeds_per_process)
    output = args.output or regress.BASELINE_DIR / f"{suite.name}.json"
    execution = execute_suite(suite, args, console)
    payload = regress.baseline_payload(suite.name, execution.records, execution.parent_run_id)
    regress.write_baseline(payload, output)
    console.print(f"baseline of suite {suite.name!r} at code version {payload['code']['git_sha'][:10]} written to {output}")
    return 0


def _bundle_baseline(args: argparse.Namespace) -> dict:
    """A regression baseline made of the bundles' finished runs of the suite (configurations
    without one are left out; unfinished seeds are not counted)."""
    from collections import Counter

    from benchmark import bundles, config
    from benchmark.analysis import records, regress

    suite = config.load_suite(args.suite)
    bundled = bundles.read_all(args.from_dirs)
    found = [r for r in records.collect(suite, None, with_curves=False, bundled=bundled) if r.finished]
    if not found:
        raise ConfigError(f"the bundles {' '.join(map(str, args.from_dirs))} hold no run of suite {suite.name!r}: nothing to compare against")
    payload = regress.baseline_payload(suite.name, found)
    shas = Counter(r.git_sha or "unknown" for r in found)
    payload["code"] = {"git_sha": shas.most_common(1)[0][0], "from": " ".join(map(str, args.from_dirs))}
    payload["created"] = max((run.ended for run in bundled.values() if run.ended), default=payload["created"])[:10]
    return payload


def command_regress(args: argparse.Namespace, console: Output) -> int:
    from rich.markup import escape

    from benchmark import config
    from benchmark.analysis import regress
    from benchmark.tables import TableData

    check_run_arguments(args)
    if args.from_dirs and args.baseline:
        raise ConfigError("--from and --baseline both name what to compare against: pass one")
    if args.from_dirs:
        payload = _bundle_baseline(args)
    else:
        baseline_path = args.baseline or regress.BASELINE_DIR / f"{config.suite_path(args.suite).stem}.json"
        payload = regress.load_baseline(baseline_path)
    if not args.results_dir.is_dir():
        raise ConfigError(f"results directory {args.results_dir} does not exist: pass the --results-dir to store the check's runs in")
    seeds = args.seeds or regress.regress_seeds(payload)
    suite = config.load_suite(args.suite, seeds=seeds).select(args.algos, args.envs).with_seeds_per_process(args.seeds_per_process)
    regress.compare(payload, [], args.alpha, args.min_effect)  # argument errors before any training
    execution = execute_suite(suite, args, console)
    verdicts = regress.compare(payload, execution.records, args.alpha, args.min_effect, args.algos, args.envs)

    table = TableData(
        f"regression check of suite {suite.name!r}: seeds {seeds} against the baseline of {payload['code']['git_sha'][:10]} ({payload['created']})",
        ["configuration", "baseline mean", "current mean", "difference [95% CI]", "normalized", "p (Welch, Holm-adjusted)", "P(current > baseline)", "verdict"],
        names={"configuration"},
        right={"baseline mean", "current mean", "normalized", "p (Welch, Holm-adjusted)"},
    )
    for v in verdicts:
        w = v.welch
        judged = v.decision.text if v.decision is not None else "not compared"
        verdict = f"REGRESSION ({judged})" if v.regressed else (f"improved ({judged})" if v.improved else judged)
        table.add(
            v.key,
            f"{sum(v.baseline) / len(v.baseline):.1f}" if v.baseline else "—",
            f"{sum(v.current) / len(v.current):.1f}" if v.current else "—",
            f"{w.difference:+.1f} [{w.low:+.1f}, {w.high:+.1f}]" if w else "—",
            f"{v.normalized_difference:+.2f}" if w else "—",
            f"{v.decision.adjusted_p:.2g}" if v.decision is not None and v.decision.adjusted_p is not None else "—",
            f"{v.improvement.estimate:.2f} [{v.improvement.low:.2f}, {v.improvement.high:.2f}]" if v.improvement else "—",
            verdict,
        )
    console.table(table)
    regressions = [v for v in verdicts if v.regressed]
    for v in verdicts:
        if v.note and not v.regressed:
            console.print(f"note: {escape(v.describe())}", highlight=False, soft_wrap=True)
    if regressions:
        for v in regressions:
            console.print(f"[bold red]REGRESSION[/] {escape(v.describe())}", highlight=False, soft_wrap=True)
        console.print(
            f"{len(regressions)} of {len(verdicts)} configurations regressed (below by the verdict rule: Welch two-sided, Holm-corrected "
            f"at alpha {args.alpha}, a drop of at least the margin {args.min_effect} normalized)"
        )
        return EXIT_REGRESSION
    console.print(f"no regression in {len(verdicts)} configurations (alpha {args.alpha}, margin {args.min_effect} normalized)")
    return 0


COMMANDS = {"baseline": command_baseline, "regress": command_regress}
INTERRUPTED = {"baseline": "interrupted: unfinished runs are marked KILLED in MLflow", "regress": "interrupted: unfinished runs are marked KILLED in MLflow"}
