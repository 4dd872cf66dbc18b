"""``python -m benchmark perf``: throughput side by side with Stable-Baselines3 (``benchmark.perf.throughput``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from agents.errors import ConfigError
from benchmark.perf.cases import BATCHED_CASES, BATCHED_EXTRA, CASES  # data only: the parser stays light

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    perf = commands.add_parser(
        "perf", help="throughput side by side with Stable-Baselines3 and Stable Baselines Jax, beside the env-only and update-floor bounds"
    )
    perf.add_argument(
        "--cases",
        nargs="+",
        default=None,
        metavar="CASE",
        help=f"{', '.join(CASES)} (default: all); with --batched-only also {', '.join(BATCHED_EXTRA)} (default: all {len(BATCHED_CASES)})",
    )
    perf.add_argument("--pairs", type=int, default=3, help="alternating rounds (ours, SB3, SBX; then reversed) per case; medians are reported (default 3)")
    perf.add_argument("--scale", type=float, default=1.0, help="multiply every measurement's step count (default 1)")
    perf.add_argument("--threads", type=int, default=1, help="torch threads in every measurement (default 1)")
    perf.add_argument("--no-compare", action="store_true", help="measure ours and the bounds only (neither peer needed)")
    perf.add_argument("--no-jax", action="store_true", help="leave Stable Baselines Jax (SBX) out: ours, SB3 and the bounds")
    perf.add_argument("--profile", action="store_true", help="also where our time goes per env step, and the top functions")
    perf.add_argument("--no-memory", action="store_true", help="skip the 1M-transition replay buffer measurement")
    perf.add_argument("--no-batched", action="store_true", help="skip the batched-seeds rows (N seeds in one process against N processes)")
    perf.add_argument("--batched-only", action="store_true", help="measure only the batched-seeds rows (results/perf/batched.json)")
    perf.add_argument(
        "--batched-seeds",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="seed counts of the batched rows (default 1 4 10)",
    )
    perf.add_argument("--batched-repeats", type=int, default=1, metavar="R", help="measurements per batched row; medians are reported (default 1)")
    perf.add_argument("--device", default="cpu", help="device of the batched rows: cpu (default) or cuda (SAC's 5x target applies on a GPU)")
    perf.add_argument(
        "--batched-graphs",
        action="store_true",
        help="capture the gradient steps of every batched-row run as CUDA graphs (separate runs and batched alike; needs --device cuda and capturable cases)",
    )
    perf.add_argument(
        "--graphs-only",
        action="store_true",
        help="only the CUDA-graph rows: one SAC and one TD3 run on --device cuda with and without captured steps (results/perf/cuda-graphs.json)",
    )
    perf.add_argument(
        "--output",
        type=Path,
        help="JSON written (default results/perf/compare.json)",
    )


def command_perf(args: argparse.Namespace, console: Output) -> int:
    from benchmark.perf import throughput as perf

    cases = args.cases or list(perf.BATCHED_CASES if args.batched_only else perf.CASES)
    compare = not args.no_compare and not args.batched_only and not args.graphs_only
    perf.check_arguments(cases, args.pairs, args.scale, args.threads, batched_only=args.batched_only)
    counts = args.batched_seeds or list(perf.BATCHED_COUNTS)
    if args.no_batched and args.batched_only:
        raise ConfigError("--no-batched and --batched-only contradict each other")
    if min(counts) < 1 or len(set(counts)) != len(counts) or args.batched_repeats < 1:
        raise ConfigError(f"--batched-seeds must be distinct positive counts and --batched-repeats >= 1, got {counts} and {args.batched_repeats}")
    if args.batched_graphs:
        from benchmark.perf.cases import GRAPHS_CAPABLE

        incapable = [name for name in cases if name not in GRAPHS_CAPABLE]
        if not args.device.startswith("cuda") or incapable:
            raise ConfigError(f"--batched-graphs needs --device cuda and cases among {', '.join(GRAPHS_CAPABLE)}, got {args.device} and {', '.join(cases)}")
    if args.device != "cpu":
        from benchmark.devices import resolve_device

        resolve_device(args.device)
    sb3_version = perf.check_sb3() if compare else None
    jax = compare and not args.no_jax
    sbx_version = perf.check_sbx() if jax else None
    if args.graphs_only:
        return _perf_graphs(args, console, perf)
    if args.batched_only:
        return _perf_batched(args, console, perf, cases, counts)
    console.print(
        f"perf: {', '.join(cases)}; {args.pairs} alternating pair(s) each, {args.threads} torch thread(s)"
        + (f", Stable-Baselines3 {sb3_version}" if compare else ", ours only")
        + (f", Stable Baselines Jax {sbx_version}" if jax else ""),
        highlight=False,
        soft_wrap=True,
    )

    def progress(name: str, side: str, pair: int, measurement: dict) -> None:
        console.print(
            f"  pair {pair + 1} {name:<4} {side:<5} {measurement['steps_per_second']:>10,.1f} /s  "
            f"{measurement['seconds']:6.1f} s  peak {measurement['peak_rss_mb']:,.0f} MiB",
            highlight=False,
            soft_wrap=True,
        )

    results = perf.measure(cases, args.pairs, args.scale, args.threads, compare, on_measurement=progress, jax=jax)
    memory = None if args.no_memory else perf.replay_memory()
    profiles = perf.profile(cases, args.scale, args.threads) if args.profile else None
    settings = {"cases": cases, "pairs": args.pairs, "scale": args.scale, "threads": args.threads, "compare": compare, "jax": jax}
    data = perf.report(results, memory, profiles, settings)
    console.print(_perf_table(data, compare))
    if memory is not None:
        mark = "met" if memory["ratio"] <= memory["target_ratio"] else "MISSED"
        console.print(
            f"replay buffer, {memory['capacity']:,} HalfCheetah transitions: {memory['tensor_bytes'] / 2**20:,.0f} MiB of tensors "
            f"({memory['ratio']:.3f}x the raw {memory['raw_bytes'] / 2**20:,.0f} MiB of its fields; target <= {memory['target_ratio']}x: {mark}); "
            f"resident memory grew {memory['rss_increase_bytes'] / 2**20:,.0f} MiB ({memory['rss_ratio']:.3f}x)",
            highlight=False,
            soft_wrap=True,
        )
    for name, found in (profiles or {}).items():
        console.print(_profile_table(name, found))
        console.print(found["top_functions"], highlight=False, soft_wrap=True, markup=False)
    path = perf.write(data, args.output or Path("results/perf/compare.json"))
    console.print(f"written to {path}", highlight=False, soft_wrap=True)
    if not args.no_batched:
        _perf_batched(args, console, perf, cases if args.cases else list(perf.BATCHED_CASES), counts)
    if args.device.startswith("cuda"):
        return _perf_graphs(args, console, perf)
    console.print("CUDA-graph rows: not measured (they need --device cuda on a machine with a GPU)", highlight=False)
    return 0


def _perf_graphs(args: argparse.Namespace, console: Output, perf) -> int:

    if not args.device.startswith("cuda"):
        raise ConfigError(f"--graphs-only needs --device cuda (CUDA graphs run on a GPU), got {args.device}")
    from benchmark.perf import graphs

    console.print(f"CUDA graphs: {', '.join(graphs.GRAPHS_CASES)} alone on {args.device}; {args.pairs} alternating pair(s)", highlight=False)

    def progress(name: str, mode: str, entry: dict) -> None:
        console.print(f"  {name:<4} {mode:<8} {entry['steps_per_second']:>10,.1f} steps/s  peak {entry['peak_rss_mb']:,.0f} MiB", highlight=False)

    data = graphs.measure_graphs(graphs.GRAPHS_CASES, args.pairs, args.scale, args.threads, args.device, on_measurement=progress)
    table = Table(title=f"a run alone with its gradient steps as CUDA graphs (steps/s, medians; {args.device})")
    for column in ("case", "env", "steps", "eager", "captured", "ratio (target)"):
        table.add_column(column, justify="left" if column in ("case", "env") else "right")
    for name, row in data["cases"].items():
        ratio = f"{row['ratio']:.2f}x" + (f" (>= {row['target_ratio']}: {'met' if row['target_met'] else 'missed'})" if "target_ratio" in row else "")
        table.add_row(
            name, row["env_id"], f"{row['steps']:,}", f"{row['eager']['steps_per_second']:,.1f}", f"{row['captured']['steps_per_second']:,.1f}", ratio
        )
    console.print(table)
    output = Path("results/perf/cuda-graphs.json") if args.output is None or not args.graphs_only else args.output
    console.print(f"written to {perf.write(data, output)}", highlight=False, soft_wrap=True)
    return 0


def _perf_batched(args: argparse.Namespace, console: Output, perf, cases: list[str], counts: list[int]) -> int:

    cores = os.cpu_count() or 1
    console.print(
        f"batched seeds: {', '.join(cases)}; N = {', '.join(map(str, counts))}; {args.batched_repeats} measurement(s) each, "
        f"{args.threads} torch thread(s), device {args.device}{' with CUDA graphs' if args.batched_graphs else ''}, {cores} cores",
        highlight=False,
        soft_wrap=True,
    )

    def progress(name: str, count: int, mode: str, entry: dict) -> None:
        console.print(
            f"  {name:<4} {mode:<11} {count:>3} seed(s) in {entry['processes']} process(es) {entry['steps_per_second']:>10,.1f} steps/s  "
            f"peak {entry['peak_rss_mb']:,.0f} MiB",
            highlight=False,
            soft_wrap=True,
        )

    data = perf.measure_batched(
        cases, counts, args.batched_repeats, args.scale, args.threads, args.device, cores, on_measurement=progress, cuda_graphs=args.batched_graphs
    )
    console.print(_batched_table(data))
    output = Path("results/perf/batched.json") if args.output is None or not args.batched_only else args.output
    path = perf.write(data, output)
    console.print(f"written to {path}", highlight=False, soft_wrap=True)
    return 0


def _batched_table(data: dict) -> Table:
    cores = data["settings"]["cores"]
    captured = ", gradient steps as CUDA graphs" if data["settings"].get("cuda_graphs") else ""
    table = Table(title=f"N seeds: aggregate env steps/s (summed over seeds; {data['settings']['device']}{captured}, {cores} cores)")
    for column in (
        "case",
        "env",
        "N",
        f"separate (N processes, {cores} at once)",
        "batched, 1 process",
        "ratio",
        f"batched, {cores} processes",
        "ratio",
        "peak MiB: N x one separate process / 1 batched process",
    ):
        table.add_column(column, justify="left" if column in ("case", "env") else "right")
    for name, case in data["cases"].items():
        for row in case["rows"]:
            per_core = row.get("per_core")
            ratio = f"{row['one_process_ratio']:.2f}x"
            if "target_ratio" in row:
                ratio += f" (>= {row['target_ratio']}: {'met' if row['target_met'] else 'missed'})"
            table.add_row(
                name,
                case["env_id"],
                str(row["seeds"]),
                f"{row['separate']['steps_per_second']:,.1f}",
                f"{row['one_process']['steps_per_second']:,.1f}",
                ratio,
                f"{per_core['steps_per_second']:,.1f}" if per_core else "—",
                f"{row['per_core_ratio']:.2f}x" if per_core else "—",
                f"{row['separate']['peak_rss_mb'] * row['seeds'] / row['separate']['processes']:,.0f} / {row['one_process']['peak_rss_mb']:,.0f}",
            )
    return table


def _perf_table(data: dict, compare: bool) -> Table:
    table = Table(title="throughput (medians over rounds; steps/s; the floor in updates/s)")
    jax = compare and all("sbx_ratio" in case["summary"] for case in data["cases"].values())
    columns = ["case", "env", "steps", "ours"]
    if compare:
        columns += ["SB3", "ours/SB3 (target)"]
    if jax:
        columns += ["SBX", "ours/SBX (target)"]
    columns += ["bound", "bound rate", "ours/bound (target)", "stacked floor", "peak MiB ours"]
    if compare:
        columns += ["peak MiB SB3", *(["peak MiB SBX"] if jax else []), "targets"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("case", "env", "bound", "targets") else "right")
    for name, case in data["cases"].items():
        s = case["summary"]
        row = [name, case["env_id"], f"{case['steps']:,}", f"{s['ours_steps_per_second']:,.1f}"]
        if compare:
            row += [f"{s['sb3_steps_per_second']:,.1f}", f"{s['ratio']:.2f}x (>= {s['target_ratio']})"]
        if jax:
            row += [f"{s['sbx_steps_per_second']:,.1f}", f"{s['sbx_ratio']:.2f}x (>= {s['sbx_target_ratio']})"]
        bound_target = s["target_fraction_of_bound"]
        row += [
            "env only" if s["bound"] == "env" else "update floor",
            f"{s['bound_steps_per_second']:,.1f}",
            f"{s['fraction_of_bound']:.2f}" + (f" (>= {bound_target:.2f})" if bound_target else ""),
            f"{s['stacked_floor_steps_per_second']:,.1f} ({s['fraction_of_stacked_floor']:.2f})" if "stacked_floor_steps_per_second" in s else "",
            f"{s['ours_peak_rss_mb']:,.0f}",
        ]
        if compare:
            row += [f"{s['sb3_peak_rss_mb']:,.0f}", *([f"{s['sbx_peak_rss_mb']:,.0f}"] if jax else []), "met" if s["target_met"] else "missed"]
        table.add_row(*row)
    return table


def _profile_table(name: str, found: dict) -> Table:
    per_step = found["microseconds_per_step"]
    total = sum(per_step.values())
    table = Table(title=f"{name}: where the time goes ({found['steps_per_second']:,.1f} steps/s while timed)")
    for column in ("part", "us per env step", "share", "calls"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part in ("env", "acting", "buffer", "update", "logging", "other"):
        if part in per_step:
            calls = found["calls"].get(part)
            table.add_row(part, f"{per_step[part]:,.1f}", f"{per_step[part] / total:.0%}", f"{calls:,}" if calls else "")
    table.add_row("total", f"{total:,.1f}", "100%", "")
    return table


COMMANDS = {"perf": command_perf}
