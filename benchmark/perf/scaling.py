"""How a run's speed scales with its collectors (issue 29): env steps per second of one run
trained in one process against the same run over C synchronous collectors (Ray actors), C = 1,
2, 4, ... up to the cores there are.

    python -m benchmark.perf.scaling [--cases ppo sac] [--collectors 1 2 4 8 16] [--device cpu]
                                     [--mode sync|async] [--gradient-workers G] [--total-steps N]

Each case is the run the issue names, sized so that its envs split over the largest C:
PPO on Humanoid-v5 (16 envs x 128 steps = the published 2048-step rollout, 10 epochs of 32
minibatches; ``ppo`` normalizes observations and rewards as the record's settings do, so its
collectors step in lock-step with the learner's statistics; ``ppo-raw`` does not), SAC on HalfCheetah-v5 (8 envs; every vector step is a round, then 8 gradient
steps, as in one process). Synchronous collection trains exactly as one process (tested in
tests/test_collectors.py), so the returns need no comparison here: only the speed differs.
The rate is the loop's own ``steps_per_second`` (training time, evaluations excluded).
Writes results/perf/distributed-scaling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import agents
from benchmark import metric_names
from benchmark.config import Budget, RunSpec
from benchmark.training.results import NullTracker

CASES: dict[str, tuple[str, dict[str, Any], Budget]] = {
    # the record's PPO settings: observations and rewards normalized (in lock-step over collectors)
    "ppo": ("Humanoid-v5", {"num_envs": 16, "num_steps": 128}, Budget(total_steps=4 * 2048, eval_every=4 * 2048, eval_episodes=1)),
    # without normalization (what the asynchronous scheme can run; the rows measured before lock-step)
    "ppo-raw": (
        "Humanoid-v5",
        {"num_envs": 16, "num_steps": 128, "normalize_observations": False, "normalize_rewards": False},
        Budget(total_steps=4 * 2048, eval_every=4 * 2048, eval_episodes=1),
    ),
    "sac": (
        "HalfCheetah-v5",
        {"num_envs": 8, "learning_starts": 1000, "start_steps": 1000},
        Budget(total_steps=4000, eval_every=4000, eval_episodes=1),
    ),
}


class _Rates(NullTracker):
    """A tracker that keeps the loop's rates."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.values.update({key: value for key, value in metrics.items() if key == metric_names.STEPS_PER_SECOND or key.startswith("distributed/")})

    def flush(self) -> None:
        pass


def measure(case: str, collectors: int | None, device: str, mode: str = "sync", gradient_workers: int = 0) -> dict[str, Any]:
    """One run of ``case`` (in one process when ``collectors`` is None); its rates."""
    from benchmark.training import loop

    env_id, overrides, budget = CASES[case]
    algo = case.split("-")[0]
    config = agents.resolve_config(algo, overrides)
    staleness = max(1, gradient_workers)  # asynchronous workers: each gradient arrives about G - 1 steps late; one step of slack
    settings = {"collectors": collectors, "backend": "ray", "mode": mode, "gradient_workers": gradient_workers, "max_staleness": staleness}
    distributed = settings if collectors else None
    spec = RunSpec("scaling", algo, env_id, 0, config.to_dict(), budget, device=device, distributed=distributed)
    rates = _Rates()
    started = time.perf_counter()
    loop.run(spec, tracker=rates)
    return {
        "collectors": collectors,
        "mode": mode,
        "gradient_workers": gradient_workers,
        "steps_per_second": rates.values[metric_names.STEPS_PER_SECOND],
        "collector_steps_per_second": [value for key, value in sorted(rates.values.items()) if key.startswith("distributed/collector")],
        "wall_seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--collectors", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--device", default="cpu", help="the learner's device (collectors act on the CPU)")
    parser.add_argument("--mode", default="sync", choices=["sync", "async"], help="the collectors' scheme (async: they never wait)")
    parser.add_argument("--gradient-workers", type=int, default=0, metavar="G", help="gradient workers of every run (default 0; off-policy: CPU learners only)")
    parser.add_argument("--total-steps", type=int, default=0, help="each run's budget in env steps (default: the case's)")
    parser.add_argument("--output", type=Path, default=Path("results/perf/distributed-scaling.json"))
    args = parser.parse_args(argv)
    from benchmark.perf.throughput import machine, now
    from benchmark.training.distributed import start_ray

    start_ray()
    results: dict[str, Any] = {
        "created": now(),
        "machine": machine(),
        "device": args.device,
        "mode": args.mode,
        "gradient_workers": args.gradient_workers,
        "cpus": os.cpu_count(),
        "cases": {},
    }
    if args.total_steps:
        for name in args.cases:
            env_id, overrides, budget = CASES[name]
            CASES[name] = (env_id, overrides, Budget(args.total_steps, args.total_steps, budget.eval_episodes))
    for case in args.cases:
        num_envs = CASES[case][1]["num_envs"]
        rows = [measure(case, None, args.device)]
        results["cases"][case] = {"env_id": CASES[case][0], "hyperparameters": CASES[case][1], "rows": rows}
        _write(results, args.output)  # after each row: a measurement cut short keeps the rows it made
        print(f"{case}: one process {rows[0]['steps_per_second']:.0f} steps/s", flush=True)
        for count in args.collectors:
            if num_envs % count:
                continue
            workers = args.gradient_workers if case.startswith("ppo") or args.device == "cpu" else 0  # off-policy ones need a CPU learner
            row = measure(case, count, args.device, args.mode, workers)
            row["speedup"] = row["steps_per_second"] / rows[0]["steps_per_second"]
            rows.append(row)
            _write(results, args.output)
            extra = f", {workers} gradient workers" if workers else ""
            print(f"{case}: {count} collectors ({args.mode}{extra}) {row['steps_per_second']:.0f} steps/s ({row['speedup']:.2f}x)", flush=True)


def _write(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
