"""``python -m benchmark calibrate``: measure how fast one work key trains and evaluates on one
core of this machine, for the cost estimates (``benchmark.execution.estimate``).

A target is a configuration (an algorithm with its suite's settings on an environment) and the
seeds trained in one process. It is measured by two short runs over whole update cycles, the
second longer: on-policy learners collect and update at least twice (2,048 env steps at least)
in the first; off-policy ones start updating after one batch instead of after their warm-up of
random actions (the estimate prices warm-up steps apart) and then train 1,500 steps. The
training rate is the steps the second run adds per CPU second it adds (training only): what a
process spends once (building envs and networks, first calls) is left out, as it is negligible
over a real run but weighed on the rate of one short run (A2C with one env, three seeds a
process: 877 training steps per CPU second by one run, 1,277 by two, on 2026-11-29). The second
run adds at least as many steps as the first took and about two CPU seconds' worth. The
evaluation rate is env steps per CPU second of the deterministic evaluations (2 episodes at the
start and the end of each run); a batch of N seeds counts N runs' steps. CPU time, not wall
time: waiting for a core another process holds does not count. A busy neighbour still slows
the figure, through the caches and cores it shares (on our 2-vCPU development machine, A2C's
defaults on HalfCheetah-v5 read 13,823 training steps per CPU second with the other core idle
and 6,242 beside a training run, the same day): calibrate on an otherwise idle machine, and
expect a launch that keeps every core busy to take up to about twice as long per run. The rows
go to ``results/perf/throughput.csv`` with the CPU model.
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
MARGINAL_CPU_SECONDS = 2.0


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
        for count in seeds_per_process or [spec.seeds_per_process]:
            count = count if count == 1 or training_loop.batchable(spec) is None else 1
            target = Target(spec.algo, spec.env_id, dict(spec.overrides), dict(spec.env_kwargs), list(spec.wrappers), count)
            found.setdefault(json.dumps(dataclasses.asdict(target), sort_keys=True, default=str), target)
    return list(found.values())


def calibration_specs(target: Target, steps: int | None = None) -> list[config.RunSpec]:
    """The short runs that measure ``target``: one per seed of its process, ``steps`` env steps
    each (default: whole update cycles, see the module docstring)."""
    defaults, overrides = _settings(target)
    if steps is None:
        cycle = update_cycle(target)
        steps = cycle * max(2, -(-2048 // cycle)) if cycle > 1 else int(defaults.get("batch_size", 256)) + 1500
    budget = {"total_steps": steps, "eval_every": steps, "eval_episodes": EVAL_EPISODES}
    specs = []
    for seed in range(target.seeds_per_process):
        spec = config.make_spec(target.algo, target.env_id, seed, budget, overrides, suite="calibrate")
        specs.append(dataclasses.replace(spec, env_kwargs=dict(target.env_kwargs), wrappers=list(target.wrappers), seeds_per_process=target.seeds_per_process))
    return specs


def _settings(target: Target) -> tuple[dict, dict]:
    """``target``'s full settings, and the overrides its calibration runs with (warm-up cut to one batch)."""
    defaults = config.make_spec(target.algo, target.env_id, 0, {"total_steps": 1, "eval_every": 1}, target.hyperparameters).hyperparameters
    overrides = dict(target.hyperparameters)
    batch = int(defaults.get("batch_size", 256))
    for key in estimate.WARM_UP_SETTINGS:
        if key in defaults:
            overrides[key] = min(int(defaults[key]), batch)
    return defaults, overrides


def update_cycle(target: Target) -> int:
    """Env steps of one collect-and-update cycle of an on-policy learner (envs x rollout steps); 1
    for a learner that updates as it steps (off-policy, with a warm-up setting)."""
    defaults, _ = _settings(target)
    rollout = int(defaults.get("num_envs", 1)) * int(defaults.get("num_steps", 0) or 0)
    return rollout if rollout and not any(key in defaults for key in estimate.WARM_UP_SETTINGS) else 1


def settings_text(spec: config.RunSpec) -> str:
    """The work settings of ``spec`` that differ from its algorithm's defaults, with its env
    options (JSON; '' none)."""
    shown = {**estimate.work_settings(tracking.child_params(spec)), **{k: v for k, v in (("env_kwargs", spec.env_kwargs), ("wrappers", spec.wrappers)) if v}}
    return json.dumps(shown, sort_keys=True, separators=(",", ":"), default=str) if shown else ""


@dataclass(frozen=True)
class _Timing:
    steps: int
    """Env steps of each run of the batch."""
    train_cpu: float
    """CPU seconds of the process outside the evaluations."""
    eval_cpu: float
    evaluated: int
    """Env steps the evaluations took, over the batch."""


def _run(specs: list[config.RunSpec]) -> _Timing:
    """Train ``specs`` (seeds batched in this process) and time them in CPU seconds."""
    from benchmark.training import loop as training_loop
    from benchmark.training.results import SeedJob

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
    total = specs[0].budget.total_steps
    # the loop times evaluations in wall seconds (the batch's, on each seed's result): in CPU
    # seconds, at the share of a core this process had meanwhile
    train_wall = total / results[0].steps_per_second if results[0].steps_per_second else results[0].wall_seconds
    eval_wall = max(results[0].wall_seconds - train_wall, 0.0)
    eval_cpu = min(eval_wall * min(cpu / wall, 1.0) if wall > 0 else eval_wall, cpu)
    evaluated = sum(sum(e.lengths) for result in results for e in result.evaluations)
    return _Timing(total, cpu - eval_cpu, eval_cpu, evaluated)


def marginal_steps(target: Target, first: _Timing) -> int:
    """Env steps the second run trains beyond the first: at least the first's, about
    ``MARGINAL_CPU_SECONDS`` of CPU at the first run's rate, in whole update cycles."""
    rate = first.steps / max(first.train_cpu, 1e-6)
    cycle = update_cycle(target)
    wanted = max(first.steps, int(rate * MARGINAL_CPU_SECONDS))
    return -(-wanted // cycle) * cycle


def measure(target: Target, steps: int | None = None) -> Throughput:
    """Train ``target``'s two calibration runs (its seeds batched in this process) and return its rates."""
    first_specs = calibration_specs(target, steps)
    first = _run(first_specs)
    second = _run(calibration_specs(target, first.steps + marginal_steps(target, first)))
    # the steps the second run adds over the CPU they add; at least a quarter of the second run's
    # training CPU, should timing noise leave less (a run's fixed costs are not its larger part)
    added = max(second.train_cpu - first.train_cpu, second.train_cpu / 4, 1e-6)
    seeds = len(first_specs)
    return Throughput(
        target.algo,
        target.env_id,
        seeds * (second.steps - first.steps) / added,
        (first.evaluated + second.evaluated) / max(first.eval_cpu + second.eval_cpu, 1e-6),
        provenance.cpu_model(),
        torch.__version__,
        second.steps,
        datetime.date.today().isoformat(),
        estimate.work_key(tracking.child_params(first_specs[0]), seeds, first_specs[0].device),
        seeds,
        settings_text(first_specs[0]),
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
