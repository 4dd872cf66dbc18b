"""One meta-RL training run, or a batch of runs that differ only by seed: epochs of
``train_epoch`` over a task family, meta-tested on held-out tasks.

    repeat until budget.total_steps env steps (summed over every task and episode):
        logs = algo.train_epoch(train task envs)             sample tasks, collect, adapt, update
        every eval_every env steps (and at the end):
            for each of budget.eval_episodes held-out test tasks (the same in every run):
                explore -> adapt_policy -> score the adapted policy
            log meta_test/pre_adaptation_return, meta_test/post_adaptation_return (means over
            the tasks), each task's pair, and eval/return_mean = the post-adaptation mean

For a meta-RL run, ``budget.eval_episodes`` is the number of held-out test tasks; how many
episodes each task gets is the algorithm's (``meta_test_*``). Checkpoints are written at epoch
boundaries, where no episode is in flight, so a resumed run continues exactly (PEARL's
per-task buffers only when the checkpoint holds them: ``checkpoint.replay_buffer``; without
them it refills every task's buffers before its next update).

Seeds batched (the algorithm's ``MetaSeedBatch``) train their epochs together: one call
trains every running seed's epoch. Each seed counts its own env steps (its episodes' lengths
are its own), so it meta-tests at its own steps and leaves the batch when it reaches its
budget, as its run alone would; all seeds checkpoint together (at one epoch: a resumed batch
starts from one epoch) once any is due.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import agents
from agents.envs import env_spec
from agents.meta import MetaAlgorithm, TaskEnvs, TaskResult, meta_test
from benchmark import metric_names
from benchmark.config import RunSpec
from benchmark.devices import resolve_device
from benchmark.training import checkpoint
from benchmark.training.control import (
    Counters,
    Preempted,
    ResumeError,
    SeedOutcome,
    StopSignal,
    check_finite,
    finish,
    seed_everything,
    share_first_error,
    train_runs,
)
from benchmark.training.evaluate import EVAL_SEED_OFFSET  # meta-test episodes never share env seeds with meta-training ones
from benchmark.training.hooks import NO_HOOKS, LoopHooks
from benchmark.training.results import Evaluation, EvaluationCallback, NullTracker, ProgressCallback, RunResult, SeedJob, Tracker


@dataclass
class MetaCounters(Counters):
    """The training loop's counters and the epoch: checkpointed with the algorithm."""

    epoch: int = 0


def meta_test_metrics(results: list[TaskResult]) -> dict[str, float]:
    """The means over test tasks and each task's pre/post-adaptation returns."""
    pre = [r.pre_adaptation_return for r in results]
    post = [r.post_adaptation_return for r in results]
    metrics = {
        metric_names.EVAL_RETURN_MEAN: float(np.mean(post)),
        metric_names.EVAL_RETURN_STD: float(np.std(post)),
        metric_names.EVAL_LENGTH_MEAN: float(np.mean([r.post_adaptation_length for r in results])),
        metric_names.PRE_ADAPTATION_RETURN: float(np.mean(pre)),
        metric_names.POST_ADAPTATION_RETURN: float(np.mean(post)),
        metric_names.ADAPTATION_GAIN: float(np.mean(post) - np.mean(pre)),
    }
    for i, result in enumerate(results):
        metrics[f"meta_test/task{i}/pre_adaptation_return"] = result.pre_adaptation_return
        metrics[f"meta_test/task{i}/post_adaptation_return"] = result.post_adaptation_return
    return metrics


def run_meta(
    spec: RunSpec,
    tracker: Tracker,
    progress: ProgressCallback | None = None,
    checkpoint_dir: Path | None = None,
    resume: dict[str, Any] | None = None,
    checkpoint_metadata: dict[str, Any] | None = None,
    remove_latest_on_finish: bool = True,
    on_evaluation: EvaluationCallback | None = None,
    hooks: LoopHooks = NO_HOOKS,
) -> RunResult:
    """``benchmark.training.loop.run`` for a meta-learner (same arguments, same RunResult)."""
    job = SeedJob(spec, tracker, progress, resume, checkpoint_metadata, on_evaluation)
    outcome = run_meta_seeds([job], checkpoint_dir, remove_latest_on_finish, batched=False, hooks=hooks)[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def run_meta_seeds(
    jobs: list[SeedJob],
    checkpoint_dir: Path | None = None,
    remove_latest_on_finish: bool = True,
    batched: bool = True,
    stop_together: bool = False,
    hooks: LoopHooks = NO_HOOKS,
) -> list[RunResult | BaseException]:
    """``benchmark.training.loop.run_seeds`` for a meta-learner: the runs (one, or with
    ``batched`` seeds of one configuration as one batched model) each with its own task envs,
    meta-tests, checkpoints and tracker; each run's result or the exception that ended it.
    Resumed runs must be at one epoch."""
    spec = jobs[0].spec
    torch.set_num_threads(spec.torch_threads)
    device = resolve_device(spec.device)
    return train_runs(
        jobs,
        lambda job: _MetaSeedRun(job, device, checkpoint_dir, hooks),
        lambda seed: seed.counters.epoch,
        "epochs",
        lambda seeds: _train(seeds, batched, stop_together),
        remove_latest_on_finish,
    )


class _Alone:
    """One meta-learner behind the interface of a ``MetaSeedBatch``."""

    def __init__(self, algo: MetaAlgorithm[Any]):
        self.algo = algo

    def train_epoch(self, task_envs: list[TaskEnvs]) -> list[dict[str, float]]:
        return [self.algo.train_epoch(task_envs[0])]

    def sync_members(self) -> None:
        pass


def _learner(seeds: list[_MetaSeedRun], batched: bool) -> Any:
    if not batched:
        algo = seeds[0].algo
        if algo.stacks_alone():  # its critic ensemble as one stacked network
            return type(algo).seed_batch([algo])  # type: ignore[misc]
        return _Alone(algo)
    members = [seed.algo for seed in seeds]
    return type(members[0]).seed_batch(members)  # type: ignore[misc]


def _train(seeds: list[_MetaSeedRun], batched: bool, stop_together: bool) -> None:
    """Epochs of every running seed at once; then each seed's logs, meta-tests and progress.
    A seed that reaches its budget, or fails, leaves the batch (with ``stop_together``, the
    first failure ends every seed)."""
    running = [seed for seed in seeds if seed.error is None and not seed.done]
    if not running:
        return
    learner = _learner(running, batched)
    for seed in running:
        seed.start_clock()
    with StopSignal() as stop:
        while running:
            snapshots: list[dict[str, Any]] = []
            if len(running) > 1 and not getattr(learner, "isolates_failures", False):  # to redo the epoch without a seed whose envs fail
                learner.sync_members()
                snapshots = [seed.snapshot() for seed in running]
            try:
                logs = learner.train_epoch([_Attributed(seed.train_envs, index) for index, seed in enumerate(running)])
            except SeedFailure as failure:  # one seed's envs failed: it ends; the others redo the epoch without it
                running[failure.index].error = failure.error
                if stop_together:
                    share_first_error(running)
                    break
                learner.sync_members()
                for seed, snapshot in zip(running, snapshots, strict=True):
                    if seed.error is None:
                        seed.restore(snapshot)
                running = [seed for seed in running if seed.error is None]
                learner = _learner(running, batched)
                continue
            except Exception as error:  # noqa: BLE001 - an update that fails fails every seed it trained
                for seed in running:
                    seed.error = error
                break
            for seed, seed_logs in zip(running, logs, strict=True):
                if isinstance(seed_logs, Exception):  # its envs failed; the batch's other seeds went on
                    seed.error = seed_logs.error if isinstance(seed_logs, SeedFailure) else seed_logs
                else:
                    seed.guard(seed.record_epoch, seed_logs)
            if stop_together:
                share_first_error(running)
            still = [seed for seed in running if seed.error is None and not seed.done]
            due = [seed for seed in still if seed.checkpoint_due()]
            if due or stop.received:
                learner.sync_members()
                for seed in still if due else []:  # together: a resumed batch starts from one epoch
                    seed.guard(seed.save)
                if stop.received:
                    for seed in still:
                        seed.guard(seed.preempt)
            if len(still) < len(running) or any(seed.error is not None for seed in still):
                learner.sync_members()
                running = [seed for seed in still if seed.error is None]
                if running:
                    learner = _learner(running, batched)
    learner.sync_members()


class SeedFailure(Exception):
    """Seed ``index`` of a batch failed in its own envs with ``error``."""

    def __init__(self, index: int, error: Exception):
        super().__init__(f"seed {index}: {error}")
        self.index, self.error = index, error


class _Attributed:
    """A seed's task envs whose failures name the seed (``SeedFailure``)."""

    def __init__(self, envs: TaskEnvs, index: int):
        self._envs, self._index = envs, index

    def __getattr__(self, name: str) -> Any:
        return getattr(self._envs, name)

    def collect(self, *arguments: Any, **options: Any) -> Any:
        try:
            return self._envs.collect(*arguments, **options)
        except Exception as error:  # noqa: BLE001 - attributed, then handled by the loop
            raise SeedFailure(self._index, error) from error


class _MetaSeedRun(SeedOutcome):
    """One meta run's part of the loop: its task envs, algorithm, counters, meta-tests and checkpoints."""

    def __init__(self, job: SeedJob, device: torch.device, checkpoint_dir: Path | None, hooks: LoopHooks):
        spec = self.spec = job.spec
        self.job, self.hooks = job, hooks
        self.tracker: Tracker = job.tracker or NullTracker()
        self.error: BaseException | None = None
        self.result = RunResult(spec, device=str(device))
        self.counters = MetaCounters(next_eval=spec.budget.eval_every, next_checkpoint=spec.checkpoint_interval)
        self.check_finite = hooks.logging(check_finite)
        self.started = 0.0
        self.cpu_started = 0.0
        seed_everything(spec.seed)
        config = agents.resolve_config(spec.algo, spec.hyperparameters)
        self.run_dir = checkpoint.run_directory(checkpoint_dir, spec.run_key) if checkpoint_dir is not None else None
        if self.run_dir is not None:
            checkpoint.remove_partial_writes(self.run_dir)
        algo = hooks.algorithm(agents.make(spec.algo, env_spec(spec.env), config, total_steps=spec.budget.total_steps, device=device, seed=spec.seed))
        assert isinstance(algo, MetaAlgorithm)
        self.algo: MetaAlgorithm[Any] = algo
        self.train_envs = TaskEnvs(spec.env, algo.collection_envs, seed=spec.seed, device=device)
        self.test_envs = TaskEnvs(spec.env, algo.collection_envs, seed=spec.seed + EVAL_SEED_OFFSET, device=device)
        self.test_tasks = self.train_envs.sampler.test_tasks(spec.budget.eval_episodes)
        if job.resume is not None:
            try:
                checkpoint.restore_learner(job.resume, algo, self.counters, self.result, spec, kind="meta")
                self.train_envs.load_state_dict(job.resume["task_envs"])
                checkpoint.set_rng_state(job.resume["rng"])
            except (KeyError, ValueError, RuntimeError, TypeError) as error:
                self.error = ResumeError(f"cannot resume {spec.label} from its checkpoint: {type(error).__name__}: {error}")
                self.error.__cause__ = error

    @property
    def done(self) -> bool:
        return self.counters.step >= self.spec.budget.total_steps

    def start_clock(self) -> None:
        """Wall time before a resume counts."""
        self.started = time.perf_counter() - self.counters.train_seconds - self.counters.eval_seconds
        self.cpu_started = time.process_time() - self.counters.cpu_seconds

    def record_epoch(self, logs: dict[str, float]) -> None:
        """Log one epoch; meta-test when due (and at the end); report progress."""
        counters, budget = self.counters, self.spec.budget
        self.check_finite(logs, self.train_envs.steps)
        counters.step = step = self.train_envs.steps
        counters.epoch += 1
        counters.train_seconds = time.perf_counter() - self.started - counters.eval_seconds
        self.tracker.log_metrics(
            {
                **{f"train/{k}": v for k, v in logs.items()},
                "train/epoch": float(counters.epoch),
                metric_names.STEPS_PER_SECOND: (step - counters.first_step) / max(counters.train_seconds, 1e-9),
            },
            step,
        )
        if step >= counters.next_eval or step >= budget.total_steps:
            eval_started = time.perf_counter()
            self.evaluate_now(step)
            counters.eval_seconds += time.perf_counter() - eval_started
            while counters.next_eval <= step:
                counters.next_eval += budget.eval_every
            self.tracker.flush()
            if self.job.on_evaluation is not None:
                self.job.on_evaluation(self.result.evaluations[-1])
        if self.job.progress is not None and (step >= counters.next_progress or step >= budget.total_steps):
            self.job.progress(min(step, budget.total_steps), budget.total_steps, self.result.evaluations[-1].mean if self.result.evaluations else None)
            counters.next_progress = step + max(budget.total_steps // 100, 1)

    def evaluate_now(self, step: int) -> None:
        self.test_envs.rounds = 0  # every meta-test sees the same env seeds and (seeded) action noise
        with self.hooks.evaluating():
            results = meta_test(self.algo, self.test_envs, self.test_tasks, seed=self.spec.seed + EVAL_SEED_OFFSET)
        metrics = meta_test_metrics(results)
        lengths = [int(round(r.post_adaptation_length)) for r in results]
        self.result.evaluations.append(Evaluation(step, [r.post_adaptation_return for r in results], lengths))
        self.tracker.log_metrics({**metrics, "meta_test/epoch": float(self.counters.epoch)}, step)

    def snapshot(self) -> dict[str, Any]:
        """What an epoch changes (the algorithm's state, the envs' counters), to redo it."""
        return {"algorithm": copy.deepcopy(self.algo.state_dict()), "task_envs": self.train_envs.state_dict()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        self.algo.load_state_dict(snapshot["algorithm"])
        self.train_envs.load_state_dict(snapshot["task_envs"])

    def checkpoint_due(self) -> bool:
        counters, interval = self.counters, self.spec.checkpoint_interval
        return self.run_dir is not None and bool(interval) and counters.step >= counters.next_checkpoint

    def save(self) -> Path:
        """Flush the metrics first: everything logged up to here is stored before the
        checkpoint a resume starts from exists."""
        assert self.run_dir is not None
        counters, spec, algo = self.counters, self.spec, self.algo
        while counters.next_checkpoint <= counters.step:
            counters.next_checkpoint += spec.checkpoint_interval
        self.tracker.flush()
        counters.train_seconds = time.perf_counter() - self.started - counters.eval_seconds
        counters.cpu_seconds = time.process_time() - self.cpu_started
        payload = {
            "format": checkpoint.FORMAT,
            "kind": "meta",
            "spec": spec.to_dict(),
            "metadata": dict(self.job.checkpoint_metadata or {}),
            "loop": dataclasses.asdict(counters),
            "evaluations": [dataclasses.asdict(evaluation) for evaluation in self.result.evaluations],
            "algorithm": algo.state_dict(),
            "replay": algo.replay_state_dict() if spec.checkpoint_replay_buffer else None,
            # epochs end with no episode in flight: exact unless a replay buffer is left out
            "exact": spec.checkpoint_replay_buffer or not algo.has_replay_buffer,
            "task_envs": self.train_envs.state_dict(),
            "rng": checkpoint.rng_state(),
        }
        return checkpoint.write_atomic(payload, self.run_dir / checkpoint.LATEST)

    def preempt(self) -> None:
        where = f"; checkpoint {self.save()}" if self.run_dir is not None else ""
        raise Preempted(f"stopped by SIGTERM at env step {self.counters.step}{where}")

    def finish(self, remove_latest_on_finish: bool) -> None:
        final = checkpoint.policy_payload(self.algo, None, self.spec)
        finish(self.result, self.counters, self.started, self.tracker, self.run_dir, final, remove_latest_on_finish, self.cpu_started)

    def close(self) -> None:
        for envs in ("train_envs", "test_envs"):
            if hasattr(self, envs):
                getattr(self, envs).close()
