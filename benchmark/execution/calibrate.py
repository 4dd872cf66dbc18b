"""``python -m benchmark calibrate``: measure how fast one work key trains and evaluates on one
core of this machine, for the cost estimates (``benchmark.execution.estimate``).

A target is a configuration (an algorithm with its suite's settings on an environment) and the
seeds trained in one process. Its short run covers whole update cycles: on-policy learners
collect and update at least twice (2,048 env steps at least); off-policy ones start updating
after one batch instead of after their warm-up of random actions (the estimate prices warm-up
steps apart) and then train 1,500 steps. The training rate is env steps per CPU second of
training, the evaluation rate env steps per CPU second of the deterministic evaluation at the
end (2 episodes); a batch of N seeds counts N runs' steps. CPU time, not wall time: a core shared
with other processes does not slow the figure. The rows go to ``results/perf/throughput.csv``
with the CPU model.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmark import config, provenance, tracking
from benchmark.execution import estimate
from benchmark.execution.estimate import Throughput

EVAL_EPISODES = 2


@dataclass(frozen=True)
class Target:
    """What one calibration measures: a configuration and the seeds in its process."""

    algo: str
    env_id: str
    hyperparameters: dict = dataclasses.field(default_factory=dict)
    """The suite's settings for it (the algorithm's defaults otherwise)."""
    env_kwargs: dict = dataclasses.field(default_factory=dict)
    wrappers: list = dataclasses.field(default_factory=list)
    seeds_per_process: int = 1


def targets_of(specs: list[config.RunSpec], seeds_per_process: list[int] | None = None) -> list[Target]:
    """One target per configuration of ``specs`` and per seeds-a-process count (``seeds_per_process``,
    default: each spec's own), in order; counts above 1 only where the algorithm batches seeds."""
    from benchmark.training import loop as training_loop

    found: dict[str, Target] = {}
    for spec in specs:
        for count in seeds_per_process or [spec.seeds_in_process]:
            count = count if count == 1 or training_loop.batchable(spec) is None else 1
            target = Target(spec.algo, spec.env_id, dict(spec.overrides), dict(spec.env_kwargs), list(spec.wrappers), count)
            found.setdefault(json.dumps(dataclasses.asdict(target), sort_keys=True, default=str), target)
    return list(found.values())


def calibration_specs(target: Target, steps: int | None = None) -> list[config.RunSpec]:
    """The short runs that measure ``target``: one per seed of its process, ``steps`` env steps
    each (default: whole update cycles, see the module docstring)."""
    budget = {"total_steps": 1, "eval_every": 1}
    defaults = config.make_spec(target.algo, target.env_id, 0, budget, target.hyperparameters).hyperparameters
    overrides = dict(target.hyperparameters)
    batch = int(defaults.get("batch_size", 256))
    for key in estimate.WARM_UP_SETTINGS:
        if key in defaults:
            overrides[key] = min(int(defaults[key]), batch)
    if steps is None:
        rollout = int(defaults.get("num_envs", 1)) * int(defaults.get("num_steps", 0) or 0)
        if rollout and not any(key in defaults for key in estimate.WARM_UP_SETTINGS):
            steps = rollout * max(2, -(-2048 // rollout))
        else:
            steps = batch + 1500
    budget = {"total_steps": steps, "eval_every": steps, "eval_episodes": EVAL_EPISODES}
    specs = []
    for seed in range(target.seeds_per_process):
        spec = config.make_spec(target.algo, target.env_id, seed, budget, overrides, suite="calibrate")
        specs.append(dataclasses.replace(spec, env_kwargs=dict(target.env_kwargs), wrappers=list(target.wrappers), seeds_in_process=target.seeds_per_process))
    return specs


def settings_text(spec: config.RunSpec) -> str:
    """The work settings of ``spec`` that differ from its algorithm's defaults, with its env
    options (JSON; '' none)."""
    shown = {**estimate.work_settings(tracking.child_params(spec)), **{k: v for k, v in (("env_kwargs", spec.env_kwargs), ("wrappers", spec.wrappers)) if v}}
    return json.dumps(shown, sort_keys=True, separators=(",", ":"), default=str) if shown else ""


def measure(target: Target, steps: int | None = None) -> Throughput:
    """Train ``target``'s calibration runs (its seeds batched in this process) and return its rates."""
    from benchmark.training import loop as training_loop
    from benchmark.training.results import SeedJob

    specs = calibration_specs(target, steps)
    threads = torch.get_num_threads()
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    try:
        outcomes = training_loop.run_seeds([SeedJob(spec) for spec in specs], batched=len(specs) > 1)
    finally:
        torch.set_num_threads(threads)
    wall, cpu = time.perf_counter() - wall_started, time.process_time() - cpu_started
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    results = [o for o in outcomes if not isinstance(o, BaseException)]
    cpu_share = min(cpu / wall, 1.0) if wall > 0 else 1.0  # of each wall second, the CPU it had
    total = specs[0].budget.total_steps
    train_seconds = max(total / results[0].steps_per_second if results[0].steps_per_second else results[0].wall_seconds, 1e-6)
    eval_seconds = max(results[0].wall_seconds - train_seconds, 1e-6)
    evaluated = sum(sum(e.lengths) for result in results for e in result.evaluations)
    return Throughput(
        target.algo,
        target.env_id,
        len(specs) * total / (train_seconds * cpu_share),
        evaluated / (eval_seconds * cpu_share),
        provenance.cpu_model(),
        torch.__version__,
        total,
        datetime.date.today().isoformat(),
        estimate.work_key(tracking.child_params(specs[0]), len(specs), specs[0].device),
        len(specs),
        settings_text(specs[0]),
    )


def calibrate(targets: list[Target], steps: int | None = None, progress: Callable[[Throughput, float], None] | None = None) -> list[Throughput]:
    """Measure every target; ``progress`` is told each result and its wall seconds."""
    results = []
    for target in targets:
        started = time.perf_counter()
        measured = measure(target, steps)
        results.append(measured)
        if progress is not None:
            progress(measured, time.perf_counter() - started)
    return results
