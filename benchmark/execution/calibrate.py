"""``python -m benchmark calibrate``: measure how fast each algorithm trains and evaluates on each
environment on one core of this machine, for the cost estimates (``benchmark.execution.estimate``).

Each pair trains a short run with the algorithm's defaults (one torch thread, on CPU): off-policy
algorithms start updating after one batch instead of after their warm-up of random actions, so
that the rate measured is the one that dominates a full run. The training rate is env steps per
second of training; the evaluation rate is env steps per second of the deterministic evaluation
at the end (2 episodes). The rows go to ``results/perf/throughput.csv`` with the CPU model.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

import torch

from benchmark import config, provenance
from benchmark.execution.estimate import Throughput

WARM_UP_KEYS = ("start_steps", "learning_starts")
EVAL_EPISODES = 2


def calibration_spec(algo: str, env_id: str, steps: int | None = None) -> config.RunSpec:
    """The short run that measures ``algo`` on ``env_id``: ``steps`` env steps (default: two
    updates' worth for on-policy algorithms, at least 2,048; 1,500 beyond the first batch for off-policy ones)."""
    defaults = config.make_spec(algo, env_id, 0, {"total_steps": 1, "eval_every": 1}).hyperparameters
    overrides = {}
    batch = int(defaults.get("batch_size", 256))
    for key in WARM_UP_KEYS:
        if key in defaults:
            overrides[key] = min(int(defaults[key]), batch)
    if steps is None:
        rollout = int(defaults.get("num_envs", 1)) * int(defaults.get("num_steps", 0) or 0)
        steps = max(2 * rollout, 2048) if rollout and not overrides else batch + 1500
    return config.make_spec(algo, env_id, 0, {"total_steps": steps, "eval_every": steps, "eval_episodes": EVAL_EPISODES}, overrides, suite="calibrate")


def measure(algo: str, env_id: str, steps: int | None = None) -> Throughput:
    """Train the calibration run of ``algo`` on ``env_id`` and return its rates."""
    from benchmark.training import loop as training_loop

    spec = calibration_spec(algo, env_id, steps)
    threads = torch.get_num_threads()
    started = time.perf_counter()
    try:
        result = training_loop.run(spec)
    finally:
        torch.set_num_threads(threads)
    wall = time.perf_counter() - started
    total = spec.budget.total_steps
    train_seconds = total / result.steps_per_second if result.steps_per_second else wall
    evaluated = sum(sum(evaluation.lengths) for evaluation in result.evaluations)
    eval_seconds = max(result.wall_seconds - train_seconds, 1e-3)
    return Throughput(
        algo, env_id, result.steps_per_second, evaluated / eval_seconds, provenance.cpu_model(), torch.__version__, total, datetime.date.today().isoformat()
    )


def calibrate(pairs: list[tuple[str, str]], steps: int | None = None, progress: Callable[[Throughput, float], None] | None = None) -> list[Throughput]:
    """Measure every (algorithm, environment) pair; ``progress`` is told each result and its seconds."""
    results = []
    for algo, env_id in pairs:
        started = time.perf_counter()
        measured = measure(algo, env_id, steps)
        results.append(measured)
        if progress is not None:
            progress(measured, time.perf_counter() - started)
    return results
