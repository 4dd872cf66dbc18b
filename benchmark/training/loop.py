"""One training run, or a batch of runs that differ only by seed, in this process:
seed everything, build envs and the algorithm, collect -> update -> evaluate -> checkpoint.

    for each env step (every seed of a batch at once):
        act with the behavior policy; step each seed's envs; observe the transitions
        when the algorithm is ready: update (one batched update for a batch of seeds)
        every eval_every env steps and at the end: evaluate deterministically
        every checkpoint_interval env steps and on SIGTERM: write latest.pt

The loop talks to the algorithm only through its interface (act, observe, ready_to_update,
update, state_dict), so every algorithm in the registry trains here unchanged; meta-learners
train in ``benchmark.training.meta_loop``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import agents
from agents.api import Acted, ConfigError
from benchmark.config import RunSpec
from benchmark.devices import resolve_device
from benchmark.training.control import (
    StopSignal,
    share_first_error,
    train_runs,
)
from benchmark.training.distributed import DistributedRun
from benchmark.training.hooks import NO_HOOKS, LoopHooks
from benchmark.training.meta_loop import run_meta, run_meta_seeds
from benchmark.training.results import EvaluationCallback, NullTracker, ProgressCallback, RunResult, SeedJob, Tracker
from benchmark.training.seed_run import SeedRun


def run(
    spec: RunSpec,
    tracker: Tracker | None = None,
    progress: ProgressCallback | None = None,
    checkpoint_dir: Path | None = None,
    resume: dict[str, Any] | None = None,
    checkpoint_metadata: dict[str, Any] | None = None,
    remove_latest_on_finish: bool = True,
    on_evaluation: EvaluationCallback | None = None,
    hooks: LoopHooks = NO_HOOKS,
) -> RunResult:
    """Train ``spec`` to its budget, evaluating every ``eval_every`` steps and at the end.

    With ``checkpoint_dir``, ``<dir>/<run_key>/latest.pt`` is rewritten every
    ``spec.checkpoint_interval`` env steps and when SIGTERM arrives (the run then raises
    ``Preempted``); ``final.pt`` is written at the end. ``resume`` is such a checkpoint's
    payload: training continues from its step with every state restored (networks, optimizers,
    normalization, counters, RNGs, the envs' episodes where ``agents.env_state`` can capture
    them, the replay buffer when it was saved). ``checkpoint_metadata`` is stored in each
    checkpoint (the runner keeps the MLflow run id there). ``remove_latest_on_finish=False``
    leaves ``latest.pt`` for the caller to remove once it has recorded the finished run.
    ``on_evaluation`` sees each evaluation once it is logged (a tuner reports it to its pruner
    and may raise to stop the run there). ``hooks`` instrument the loop's parts (the perf
    harness). A meta-learner trains in ``benchmark.training.meta_loop`` instead, with the same
    arguments and result.
    """
    if agents.is_meta(spec.algo):
        return run_meta(spec, tracker or NullTracker(), progress, checkpoint_dir, resume, checkpoint_metadata, remove_latest_on_finish, on_evaluation, hooks)
    outcome = run_seeds(
        [SeedJob(spec, tracker, progress, resume, checkpoint_metadata, on_evaluation)], checkpoint_dir, remove_latest_on_finish, batched=False, hooks=hooks
    )[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def batch_key(spec: RunSpec) -> str:
    """What the runs of one batch share: the spec without its seed (two specs with equal keys
    differ only by seed)."""
    data = spec.to_dict()
    for name in ("seed", "run_key"):
        data.pop(name)
    return json.dumps(data, sort_keys=True, default=str)


def batchable(spec: RunSpec) -> str | None:
    """Why ``spec`` cannot train in a batch of seeds, or None when it can."""
    cls = agents.algorithm_class(spec.algo)
    if cls.seed_batch is None:
        return f"{spec.algo} has no batched training of seeds (it has: {', '.join(sorted(n for n, c in agents.ALGORITHMS.items() if c.seed_batch))})"
    return None


def run_seeds(
    jobs: list[SeedJob],
    checkpoint_dir: Path | None = None,
    remove_latest_on_finish: bool = True,
    batched: bool = True,
    stop_together: bool = False,
    hooks: LoopHooks = NO_HOOKS,
) -> list[RunResult | BaseException]:
    """Train runs that differ only by seed in this process, as ``run`` trains each: with
    ``batched``, as one batched model (``agents.algos.seeds.SeedBatch``), each seed with its own
    envs, evaluations, checkpoints and tracker. Returns each run's result, or the exception
    that ended it: a run that diverges (non-finite losses), whose evaluation callback raises,
    or whose envs fail ends alone, and the others go on; with ``stop_together`` (a tuning
    trial, which one failed or pruned seed ends) the others end there with the same exception.
    Resumed runs must be at one step. Meta-learners train in ``meta_loop.run_meta_seeds``.
    """
    if batched:
        keys = {batch_key(job.spec) for job in jobs}
        if len(keys) != 1:
            raise ConfigError("the runs of a batch must differ only by seed")
        reason = batchable(jobs[0].spec)
        if reason:
            raise ConfigError(f"cannot train seeds of {jobs[0].spec.algo} batched: {reason}")
    elif len(jobs) != 1:
        raise ValueError("unbatched, run_seeds trains one run")
    spec = jobs[0].spec
    if agents.is_meta(spec.algo):
        return run_meta_seeds(jobs, checkpoint_dir, remove_latest_on_finish, batched, stop_together, hooks)
    torch.set_num_threads(spec.torch_threads)
    device = resolve_device(spec.device)
    return train_runs(
        jobs,
        lambda job: (DistributedRun if job.spec.distributed else SeedRun)(job, device, checkpoint_dir, hooks),
        lambda seed: seed.counters.step,
        "steps",
        lambda seeds: _train(seeds, batched, stop_together),
        remove_latest_on_finish,
    )


class _Alone:
    """One algorithm (any: recurrent, offline) behind the interface of a seed batch."""

    def __init__(self, seed: SeedRun):
        self.seed, self.algo = seed, seed.algo

    def act(self, obs: list[torch.Tensor], states: list[Any]) -> list[Acted]:
        return [self.algo.behavior_act(obs[0], states[0])]

    def ready_to_update(self) -> bool:
        return self.algo.ready_to_update()

    def update(self) -> list[dict[str, float]]:
        return [self.algo.update()]

    def sync_members(self) -> None:
        pass


def _learner(seeds: list[SeedRun], batched: bool) -> Any:
    """What acts and updates for ``seeds``: their seed batch; a run alone by itself, or as a
    batch of one where its critics train stacked or its steps are captured as CUDA graphs."""
    spec = seeds[0].spec
    if not batched:
        seed = seeds[0]
        if not (seed.acts_here and (spec.cuda_graphs or seed.algo.stacks_alone())):
            return _Alone(seed)
    learner = type(seeds[0].algo).seed_batch([seed.algo for seed in seeds])
    if spec.cuda_graphs:
        learner.capture_steps()
    return learner


def _train(seeds: list[SeedRun], batched: bool, stop_together: bool = False) -> None:
    """The loop: act for every running seed at once, step each seed's envs, update all at once;
    then each seed's evaluations, progress, checkpoints. A seed that fails leaves the batch
    (with ``stop_together``, every seed leaves with it)."""
    running = [seed for seed in seeds if seed.error is None]
    if not running:
        return
    learner = _learner(running, batched)
    collects = running[0].algo.collects_experience
    for seed in running:
        seed.start_clock()
    with StopSignal() as stop:
        while running:
            if not running[0].acts_here:  # a distributed run (alone): its collectors act
                running[0].guard(running[0].collect_round)
            elif collects:
                for seed, acted in zip(running, learner.act([seed.obs_tensor for seed in running], [seed.state for seed in running]), strict=True):
                    seed.guard(seed.collect, acted)
            else:
                for seed in running:
                    seed.counters.step += seed.algo.samples_per_update
            if learner.ready_to_update():
                for seed, logs in zip(running, learner.update(), strict=True):
                    if seed.error is None:
                        seed.guard(seed.record_update, logs)
            evaluating = [seed for seed in running if seed.error is None and seed.evaluation_due()]
            if evaluating:  # members act with views of the batch's parameters: nothing to copy first
                eval_seconds = sum(seed.evaluate_now() for seed in evaluating)
                for seed in running:  # time spent on any seed's evaluation is time none trained
                    seed.counters.eval_seconds += eval_seconds
                for seed in evaluating:
                    seed.guard(seed.after_evaluation)
            for seed in running:
                if seed.error is None:
                    seed.guard(seed.report_progress)
            if stop_together:
                share_first_error(running)
            if any(seed.error is None and seed.counters.step >= seed.spec.budget.total_steps for seed in running):
                break
            due = [seed for seed in running if seed.error is None and seed.checkpoint_due()]
            if due:
                learner.sync_members()
                for seed in due:
                    seed.guard(seed.save)
            if stop.received:
                learner.sync_members()
                for seed in running:
                    if seed.error is None:
                        seed.guard(seed.preempt)
            if stop_together:
                share_first_error(running)
            still = [seed for seed in running if seed.error is None]
            if len(still) < len(running):
                learner.sync_members()
                running = still
                if running:
                    learner = _learner(running, batched)
    if running:
        learner.sync_members()
