"""One meta-RL training run: epochs of ``train_epoch`` over a task family, meta-tested on
held-out tasks.

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
"""

from __future__ import annotations

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
from benchmark.training import checkpoint
from benchmark.training.control import Counters, Preempted, ResumeError, StopSignal, check_finite, finish, resolve_device, seed_everything
from benchmark.training.evaluate import EVAL_SEED_OFFSET  # meta-test episodes never share env seeds with meta-training ones
from benchmark.training.hooks import NO_HOOKS, LoopHooks
from benchmark.training.results import Evaluation, EvaluationCallback, ProgressCallback, RunResult, Tracker


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
    torch.set_num_threads(spec.torch_threads)
    seed_everything(spec.seed)
    device = resolve_device(spec.device)
    config = agents.resolve_config(spec.algo, spec.hyperparameters)
    budget = spec.budget
    run_dir = checkpoint.run_directory(checkpoint_dir, spec.run_key) if checkpoint_dir is not None else None
    if run_dir is not None:
        checkpoint.remove_partial_writes(run_dir)
    algo = hooks.algorithm(agents.make(spec.algo, env_spec(spec.env_id), config, total_steps=budget.total_steps, device=device, seed=spec.seed))
    assert isinstance(algo, MetaAlgorithm)
    train_envs = TaskEnvs(spec.env_id, algo.collection_envs, seed=spec.seed, device=device)
    test_envs = TaskEnvs(spec.env_id, algo.collection_envs, seed=spec.seed + EVAL_SEED_OFFSET, device=device)
    test_tasks = train_envs.sampler.test_tasks(budget.eval_episodes)
    result = RunResult(spec, device=str(device))
    loop = MetaCounters(next_eval=budget.eval_every, next_checkpoint=spec.checkpoint_interval)

    def evaluate_now(step: int) -> None:
        test_envs.rounds = 0  # every meta-test sees the same env seeds and (seeded) action noise
        with hooks.evaluating():
            results = meta_test(algo, test_envs, test_tasks, seed=spec.seed + EVAL_SEED_OFFSET)
        metrics = meta_test_metrics(results)
        lengths = [int(round(r.post_adaptation_length)) for r in results]
        result.evaluations.append(Evaluation(step, [r.post_adaptation_return for r in results], lengths))
        tracker.log_metrics({**metrics, "meta_test/epoch": float(loop.epoch)}, step)

    def payload() -> dict[str, Any]:
        loop.train_seconds = time.perf_counter() - started - loop.eval_seconds
        return {
            "format": checkpoint.FORMAT,
            "kind": "meta",
            "spec": spec.to_dict(),
            "metadata": dict(checkpoint_metadata or {}),
            "loop": dataclasses.asdict(loop),
            "evaluations": [dataclasses.asdict(evaluation) for evaluation in result.evaluations],
            "algorithm": algo.state_dict(),
            "replay": algo.replay_state_dict() if spec.checkpoint_replay_buffer else None,
            # epochs end with no episode in flight: exact unless a replay buffer is left out
            "exact": spec.checkpoint_replay_buffer or not algo.has_replay_buffer,
            "task_envs": train_envs.state_dict(),
            "rng": checkpoint.rng_state(),
        }

    def save() -> Path:
        assert run_dir is not None
        tracker.flush()  # everything logged up to here is stored before the checkpoint a resume starts from
        return checkpoint.write_atomic(payload(), run_dir / checkpoint.LATEST)

    try:
        if resume is not None:
            try:
                _restore(resume, algo, train_envs, loop, result, spec)
            except (KeyError, ValueError, RuntimeError, TypeError) as error:
                raise ResumeError(f"cannot resume {spec.label} from its checkpoint: {type(error).__name__}: {error}") from error
        started = time.perf_counter() - loop.train_seconds - loop.eval_seconds
        check = hooks.logging(check_finite)
        with StopSignal() as stop:
            while loop.step < budget.total_steps:
                logs = algo.train_epoch(train_envs)
                check(logs, train_envs.steps)
                loop.step = step = train_envs.steps
                loop.epoch += 1
                loop.train_seconds = time.perf_counter() - started - loop.eval_seconds
                tracker.log_metrics(
                    {
                        **{f"train/{k}": v for k, v in logs.items()},
                        "train/epoch": float(loop.epoch),
                        metric_names.STEPS_PER_SECOND: step / max(loop.train_seconds, 1e-9),
                    },
                    step,
                )
                if step >= loop.next_eval or step >= budget.total_steps:
                    eval_started = time.perf_counter()
                    evaluate_now(step)
                    loop.eval_seconds += time.perf_counter() - eval_started
                    while loop.next_eval <= step:
                        loop.next_eval += budget.eval_every
                    tracker.flush()
                    if on_evaluation is not None:
                        on_evaluation(result.evaluations[-1])
                if progress is not None and (step >= loop.next_progress or step >= budget.total_steps):
                    progress(min(step, budget.total_steps), budget.total_steps, result.evaluations[-1].mean if result.evaluations else None)
                    loop.next_progress = step + max(budget.total_steps // 100, 1)
                if step >= budget.total_steps:
                    break
                if run_dir is not None and spec.checkpoint_interval and step >= loop.next_checkpoint:
                    while loop.next_checkpoint <= step:
                        loop.next_checkpoint += spec.checkpoint_interval
                    save()
                if stop.received:
                    where = f"; checkpoint {save()}" if run_dir is not None else ""
                    raise Preempted(f"stopped by SIGTERM at env step {step}{where}")

        return finish(result, loop, started, tracker, run_dir, checkpoint.policy_payload(algo, None, spec), remove_latest_on_finish)
    finally:
        train_envs.close()
        test_envs.close()


def _restore(payload: dict[str, Any], algo: MetaAlgorithm, train_envs: TaskEnvs, loop: MetaCounters, result: RunResult, spec: RunSpec) -> None:
    checkpoint.restore_learner(payload, algo, loop, result, spec, kind="meta")
    train_envs.load_state_dict(payload["task_envs"])
    checkpoint.set_rng_state(payload["rng"])
