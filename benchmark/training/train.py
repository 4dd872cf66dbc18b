"""One training run: seed everything, build envs and the algorithm, collect -> update -> evaluate.

The loop talks to the algorithm only through its interface (act, observe, ready_to_update,
update, state_dict), so every algorithm in the registry trains here unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import gymnasium as gym
import numpy as np
import torch

import agents
from agents.api import Acted, Algorithm, ConfigError, Transitions
from agents.env_state import load_vector_env_state, vector_env_state
from agents.envs import (
    env_spec,
    finished_episodes,
    freeze_normalization,
    load_normalization_state,
    make_vector_env,
    normalization_state,
    true_next_obs,
)
from benchmark.config import TRAIN_RETURN_METRIC, RunSpec
from benchmark.training import checkpoint

EVAL_SEED_OFFSET = 1_000_003  # evaluation envs never share seeds with training envs


class Tracker(Protocol):
    """Where a run's numbers go (MLflow in the runner; anything with these methods in tests)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def flush(self) -> None: ...


class NullTracker:
    """Keeps metrics in memory; used when no tracking store is wanted."""

    def __init__(self) -> None:
        self.metrics: list[tuple[str, float, int]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.metrics += [(key, float(value), step) for key, value in metrics.items()]

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def flush(self) -> None:
        pass


@dataclass
class Evaluation:
    step: int
    returns: list[float]
    lengths: list[int]
    train_return_mean: float | None = None
    """Mean return of the training episodes that ended since the previous evaluation (None: none
    ended): what sources that report training returns (CleanRL, openrlbenchmark) measure."""
    train_episodes: int = 0
    """How many training episodes that is."""

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


@dataclass
class RunResult:
    """What a finished run reports back to the runner."""

    spec: RunSpec
    evaluations: list[Evaluation] = field(default_factory=list)
    steps_per_second: float = 0.0
    wall_seconds: float = 0.0
    device: str = "cpu"
    checkpoint: str | None = None


ProgressCallback = Callable[[int, int, float | None], None]  # (step, total_steps, last eval mean)
EvaluationCallback = Callable[["Evaluation"], None]  # called after each evaluation; may raise to stop the run


class NonFiniteLoss(FloatingPointError):
    """An update produced NaN or infinite losses: the run has diverged and is stopped."""


def check_finite(logs: dict[str, float], step: int) -> None:
    """Raise NonFiniteLoss naming every non-finite value of one update's logs."""
    bad = {key: value for key, value in logs.items() if not math.isfinite(value)}
    if bad:
        values = ", ".join(f"{key}={value}" for key, value in sorted(bad.items()))
        raise NonFiniteLoss(f"non-finite update values at env step {step}: {values}")


def resolve_device(requested: str) -> torch.device:
    """'auto' -> the first CUDA device when one is present, else CPU; ConfigError for anything unusable."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise ConfigError(f"unknown device {requested!r}; use auto, cpu, cuda or cuda:i") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {requested!r}; use auto, cpu, cuda or cuda:i")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {requested!r} requested but CUDA is not available here; use --device auto or cpu")
    return device


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch global RNGs (envs are seeded through reset)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class ResumeError(RuntimeError):
    """A checkpoint could not be restored into this run (another format, other shapes)."""


class Preempted(Exception):
    """The run received SIGTERM: it wrote a checkpoint (when it has a checkpoint directory) and
    stopped; re-launching the suite resumes it."""


class _StopSignal:
    """Turns SIGTERM into a flag the training loop checks after each step (main thread only)."""

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None

    def __enter__(self) -> "_StopSignal":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = True

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


@dataclass
class _Loop:
    """The training loop's own counters: checkpointed with the algorithm."""

    step: int = 0
    next_eval: int = 0
    next_checkpoint: int = 0
    next_progress: int = 0
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    update_logs: dict[str, list[float]] = field(default_factory=dict)
    train_return_sum: float = 0.0
    """Of the training episodes that ended since the last evaluation (with train_episodes)."""
    train_episodes: int = 0


def run(
    spec: RunSpec,
    tracker: Tracker | None = None,
    progress: ProgressCallback | None = None,
    checkpoint_dir: Path | None = None,
    resume: dict[str, Any] | None = None,
    checkpoint_metadata: dict[str, Any] | None = None,
    remove_latest_on_finish: bool = True,
    on_evaluation: EvaluationCallback | None = None,
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
    and may raise to stop the run there). A meta-learner trains in ``benchmark.training.meta_train``
    instead, with the same arguments and result.
    """
    if agents.is_meta(spec.algo):
        from benchmark.training.meta_train import run_meta

        return run_meta(spec, tracker or NullTracker(), progress, checkpoint_dir, resume, checkpoint_metadata, remove_latest_on_finish, on_evaluation)
    outcome = run_seeds(
        [SeedJob(spec, tracker, progress, resume, checkpoint_metadata, on_evaluation)], checkpoint_dir, remove_latest_on_finish, batched=False
    )[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


@dataclass
class SeedJob:
    """One run of ``run_seeds``: its spec and what ``run`` takes for it."""

    spec: RunSpec
    tracker: Tracker | None = None
    progress: ProgressCallback | None = None
    resume: dict[str, Any] | None = None
    checkpoint_metadata: dict[str, Any] | None = None
    on_evaluation: EvaluationCallback | None = None


def batch_key(spec: RunSpec) -> str:
    """What the runs of one batch share: the spec without its seed (two specs with equal keys
    differ only by seed)."""
    data = spec.to_dict()
    for name in ("seed", "run_key"):
        data.pop(name)
    return json.dumps(data, sort_keys=True, default=str)


def batchable(spec: RunSpec) -> str | None:
    """Why ``spec`` cannot train in a batch of seeds, or None when it can."""
    if agents.is_meta(spec.algo):
        return f"{spec.algo} is a meta-learner"
    cls = agents.algorithm_class(spec.algo)
    if cls.seed_batch is None:
        return f"{spec.algo} has no batched training of seeds (it has: {', '.join(sorted(n for n, c in agents.ALGORITHMS.items() if c.seed_batch))})"
    return cls.seed_batch.unsupported(cls, agents.resolve_config(spec.algo, spec.hyperparameters))


def run_seeds(
    jobs: list[SeedJob],
    checkpoint_dir: Path | None = None,
    remove_latest_on_finish: bool = True,
    batched: bool = True,
    stop_together: bool = False,
) -> list[RunResult | BaseException]:
    """Train runs that differ only by seed in this process, as ``run`` trains each: with
    ``batched``, as one batched model (``agents.algos.seeds.SeedBatch``), each seed with its own
    envs, evaluations, checkpoints and tracker. Returns each run's result, or the exception
    that ended it: a run that diverges (non-finite losses), whose evaluation callback raises,
    or whose envs fail ends alone, and the others go on; with ``stop_together`` (a tuning
    trial, which one failed or pruned seed ends) the others end there with the same exception.
    Resumed runs must be at one step.
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
    torch.set_num_threads(spec.torch_threads)
    device = resolve_device(spec.device)
    seeds: list[_SeedRun] = []
    try:
        for job in jobs:
            seeds.append(_SeedRun(job, device, checkpoint_dir))
        if len({seed.loop.step for seed in seeds if seed.error is None}) > 1:
            raise ValueError(f"resumed runs at different steps cannot train as one batch: {[seed.loop.step for seed in seeds]}")
        _train(seeds, batched, stop_together)
        for seed in seeds:
            if seed.error is None:
                seed.guard(seed.finish, remove_latest_on_finish)
    finally:
        for seed in seeds:
            seed.close()
    return [seed.error if seed.error is not None else seed.result for seed in seeds]


class _Alone:
    """One algorithm (any: recurrent, offline) behind the interface of a seed batch."""

    def __init__(self, seed: "_SeedRun"):
        self.seed, self.algo = seed, seed.algo

    def act(self, obs: list[torch.Tensor]) -> list[Acted]:
        return [self.algo.behavior_act(obs[0], self.seed.state)]

    def ready_to_update(self) -> bool:
        return self.algo.ready_to_update()

    def update(self) -> list[dict[str, float]]:
        return [self.algo.update()]

    def sync_members(self) -> None:
        pass


def _learner(seeds: list["_SeedRun"], batched: bool) -> Any:
    if not batched:
        return _Alone(seeds[0])
    members = [seed.algo for seed in seeds]
    return type(members[0]).seed_batch(members)


def _train(seeds: list["_SeedRun"], batched: bool, stop_together: bool = False) -> None:
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
    with _StopSignal() as stop:
        while running:
            if collects:
                for seed, acted in zip(running, learner.act([seed.obs_tensor for seed in running]), strict=True):
                    seed.guard(seed.collect, acted)
            else:
                for seed in running:
                    seed.loop.step += seed.algo.samples_per_update
            if learner.ready_to_update():
                for seed, logs in zip(running, learner.update(), strict=True):
                    if seed.error is None:
                        seed.guard(seed.record_update, logs)
            evaluating = [seed for seed in running if seed.error is None and seed.evaluation_due()]
            if evaluating:  # members act with views of the batch's parameters: nothing to copy first
                eval_seconds = sum(seed.evaluate_now() for seed in evaluating)
                for seed in running:  # time spent on any seed's evaluation is time none trained
                    seed.loop.eval_seconds += eval_seconds
                for seed in evaluating:
                    seed.guard(seed.after_evaluation)
            for seed in running:
                if seed.error is None:
                    seed.guard(seed.report_progress)
            if stop_together:
                _share_first_error(running)
            if any(seed.error is None and seed.loop.step >= seed.spec.budget.total_steps for seed in running):
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
                _share_first_error(running)
            still = [seed for seed in running if seed.error is None]
            if len(still) < len(running):
                learner.sync_members()
                running = still
                if running:
                    learner = _learner(running, batched)
    if running:
        learner.sync_members()


def _share_first_error(seeds: list["_SeedRun"]) -> None:
    """Once one seed has failed, every other seed ends with the same exception."""
    first = next((seed.error for seed in seeds if seed.error is not None), None)
    if first is not None:
        for seed in seeds:
            if seed.error is None:
                seed.error = first


class _SeedRun:
    """One run's part of the loop: its envs, algorithm, counters, evaluations and checkpoints."""

    def __init__(self, job: SeedJob, device: torch.device, checkpoint_dir: Path | None):
        spec = self.spec = job.spec
        self.job, self.device = job, device
        self.tracker: Tracker = job.tracker or NullTracker()
        self.error: BaseException | None = None
        self.result = RunResult(spec, device=str(device))
        self.loop = _Loop(next_eval=spec.budget.eval_every, next_checkpoint=spec.checkpoint_interval)
        self.state: Any = None
        self.started = 0.0
        seed_everything(spec.seed)
        config = self.config = agents.resolve_config(spec.algo, spec.hyperparameters)
        self.run_dir = checkpoint.run_directory(checkpoint_dir, spec.run_key) if checkpoint_dir is not None else None
        if self.run_dir is not None:
            checkpoint.remove_partial_writes(self.run_dir)
        self.train_envs = make_vector_env(
            spec.env_id,
            config.num_envs,
            normalize_observations=config.normalize_observations,
            normalize_rewards=config.normalize_rewards,
            gamma=config.gamma,
            clip_observations=config.clip_observations,
            clip_rewards=config.clip_rewards,
        )
        self.eval_envs = make_vector_env(
            spec.env_id,
            spec.budget.eval_episodes,
            normalize_observations=config.normalize_observations,
            clip_observations=config.clip_observations,
        )
        freeze_normalization(self.eval_envs)
        self.algo = agents.make(spec.algo, env_spec(spec.env_id), config, total_steps=spec.budget.total_steps, device=device, seed=spec.seed)
        if job.resume is None:
            self.obs, _ = self.train_envs.reset(seed=spec.seed)
        else:
            try:
                self.obs, self.state = _restore(job.resume, self.algo, self.train_envs, self.loop, self.result, spec, device)
            except (KeyError, ValueError, RuntimeError, TypeError) as error:
                self.error = ResumeError(f"cannot resume {spec.label} from its checkpoint: {type(error).__name__}: {error}")
                self.error.__cause__ = error
                return
        self.obs_tensor = torch.as_tensor(self.obs, dtype=torch.float32, device=device)

    def guard(self, step: Callable[..., Any], *arguments: Any) -> None:
        """Run one of this seed's steps; an exception ends this seed's run (Ctrl-C ends all)."""
        try:
            step(*arguments)
        except Exception as error:  # noqa: BLE001 - kept as the run's outcome, raised by run()
            self.error = error

    def start_clock(self) -> None:
        """Wall time before a resume counts."""
        self.started = time.perf_counter() - self.loop.train_seconds - self.loop.eval_seconds

    def collect(self, acted: Acted) -> None:
        """Step this seed's envs with ``acted``, store the transitions, log ended episodes."""
        algo, device = self.algo, self.device
        next_obs, rewards, terminated, truncated, infos = self.train_envs.step(acted.env_actions)
        next_obs_tensor = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
        if acted.state is not None:
            self.state = algo.reset_state(acted.state, torch.as_tensor(terminated | truncated, device=device))
        else:
            self.state = None
        # where an episode ended, the stored next observation is its final one, not the reset one
        final_obs = true_next_obs(next_obs, infos)
        algo.observe(
            Transitions(
                obs=self.obs_tensor,
                acted=acted,
                rewards=torch.as_tensor(rewards, dtype=torch.float32, device=device),
                next_obs=next_obs_tensor if final_obs is next_obs else torch.as_tensor(final_obs, dtype=torch.float32, device=device),
                terminated=torch.as_tensor(terminated, device=device),
                truncated=torch.as_tensor(truncated, device=device),
            )
        )
        self.obs, self.obs_tensor = next_obs, next_obs_tensor
        self.loop.step += self.config.num_envs
        for episode_return, episode_length in finished_episodes(infos):
            self.tracker.log_metrics({"train/episode_return": episode_return, "train/episode_length": episode_length}, self.loop.step)
            self.loop.train_return_sum += episode_return
            self.loop.train_episodes += 1

    def record_update(self, logs: dict[str, float]) -> None:
        check_finite(logs, self.loop.step)
        for key, value in logs.items():
            self.loop.update_logs.setdefault(key, []).append(value)

    def evaluation_due(self) -> bool:
        return self.loop.step >= self.loop.next_eval or self.loop.step >= self.spec.budget.total_steps

    def evaluate_now(self) -> float:
        """Log the losses and evaluate; the seconds the evaluation took."""
        loop, step = self.loop, self.loop.step
        loop.train_seconds = time.perf_counter() - self.started - loop.eval_seconds
        losses = {f"train/{key}": float(np.mean(values)) for key, values in loop.update_logs.items()}
        self.tracker.log_metrics({**losses, "perf/steps_per_second": step / max(loop.train_seconds, 1e-9)}, step)
        loop.update_logs.clear()
        eval_started = time.perf_counter()
        evaluation = evaluate(self.algo, self.eval_envs, self.train_envs, self.spec.seed + EVAL_SEED_OFFSET, self.device, step)
        if loop.train_episodes:
            evaluation.train_return_mean = loop.train_return_sum / loop.train_episodes
            evaluation.train_episodes = loop.train_episodes
        loop.train_return_sum, loop.train_episodes = 0.0, 0
        self.result.evaluations.append(evaluation)
        self.tracker.log_metrics(
            {
                "eval/return_mean": evaluation.mean,
                "eval/return_std": evaluation.std,
                "eval/length_mean": float(np.mean(evaluation.lengths)),
                **({TRAIN_RETURN_METRIC: evaluation.train_return_mean} if evaluation.train_episodes else {}),
            },
            step,
        )
        loop.next_eval += self.spec.budget.eval_every
        self.tracker.flush()
        return time.perf_counter() - eval_started

    def after_evaluation(self) -> None:
        if self.job.on_evaluation is not None:
            self.job.on_evaluation(self.result.evaluations[-1])

    def report_progress(self) -> None:
        loop, total = self.loop, self.spec.budget.total_steps
        if self.job.progress is not None and (loop.step >= loop.next_progress or loop.step >= total):
            self.job.progress(loop.step, total, self.result.evaluations[-1].mean if self.result.evaluations else None)
            loop.next_progress = loop.step + max(total // 100, 1)

    def checkpoint_due(self) -> bool:
        interval = self.spec.checkpoint_interval
        if self.run_dir is not None and interval and self.loop.step >= self.loop.next_checkpoint:
            self.loop.next_checkpoint = self.loop.step + interval
            return True
        return False

    def save(self) -> Path:
        """Flush the metrics first: everything logged up to this step is stored before the
        checkpoint that a resume starts from exists."""
        assert self.run_dir is not None
        spec, algo, loop = self.spec, self.algo, self.loop
        self.tracker.flush()
        loop.train_seconds = time.perf_counter() - self.started - loop.eval_seconds
        env_state = vector_env_state(self.train_envs)
        payload = {
            "format": checkpoint.FORMAT,
            "spec": spec.to_dict(),
            "metadata": dict(self.job.checkpoint_metadata or {}),
            "loop": dataclasses.asdict(loop),
            "evaluations": [dataclasses.asdict(evaluation) for evaluation in self.result.evaluations],
            "obs": torch.as_tensor(self.obs),
            "recurrent_state": _to_cpu(self.state),
            "algorithm": _own_storage(algo.state_dict()),
            "replay": algo.replay_state_dict() if spec.checkpoint_replay_buffer else None,
            "envs": env_state,
            # whether resuming from here continues exactly as if never stopped
            "exact": env_state is not None and (spec.checkpoint_replay_buffer or not algo.has_replay_buffer),
            "normalization": _normalization_tensors(self.train_envs),
            "rng": checkpoint.rng_state(),
        }
        return checkpoint.write_atomic(payload, self.run_dir / checkpoint.LATEST)

    def preempt(self) -> None:
        where = f"; checkpoint {self.save()}" if self.run_dir is not None else ""
        raise Preempted(f"stopped by SIGTERM at env step {self.loop.step}{where}")

    def finish(self, remove_latest_on_finish: bool) -> None:
        final = policy_checkpoint(self.algo, self.train_envs, self.spec)
        final["algorithm"] = _own_storage(final["algorithm"])
        finish(self.result, self.loop, self.started, self.tracker, self.run_dir, final, remove_latest_on_finish)

    def close(self) -> None:
        for envs in ("train_envs", "eval_envs"):
            if hasattr(self, envs):
                getattr(self, envs).close()


def _own_storage(state: Any) -> Any:
    """``state`` with every tensor copied into storage of its own: a batched member's
    parameters are views of the whole batch's, which saving would otherwise write out whole."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone() if state.untyped_storage().nbytes() > state.nbytes else state
    if isinstance(state, dict):
        return {key: _own_storage(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_own_storage(value) for value in state)
    return state


def finish(
    result: RunResult,
    loop: Any,
    started: float,
    tracker: Tracker,
    run_dir: Path | None,
    final_payload: dict[str, Any],
    remove_latest_on_finish: bool,
) -> RunResult:
    """A run's end: its timing, ``final.pt`` (and ``latest.pt`` removed unless the caller
    removes it once the run is recorded), the metrics flushed."""
    result.wall_seconds = time.perf_counter() - started
    result.steps_per_second = loop.step / max(result.wall_seconds - loop.eval_seconds, 1e-9)
    if run_dir is not None:
        path = checkpoint.write_atomic(final_payload, run_dir / checkpoint.FINAL)
        if remove_latest_on_finish:
            (run_dir / checkpoint.LATEST).unlink(missing_ok=True)
        result.checkpoint = str(path)
        tracker.log_artifact(path, "checkpoints")
    tracker.flush()
    return result


def _restore(
    payload: dict[str, Any],
    algo: Algorithm,
    train_envs: gym.vector.VectorEnv,
    loop: _Loop,
    result: RunResult,
    spec: RunSpec,
    device: torch.device,
) -> tuple[np.ndarray, Any]:
    """Load a ``latest.pt`` payload into a freshly built run; the observation and recurrent
    state to act from next."""
    restore_learner(payload, algo, loop, result, spec)
    obs, state = payload["obs"].numpy(), _to_device(payload["recurrent_state"], device)
    if payload["envs"] is not None:
        load_vector_env_state(train_envs, payload["envs"])
    else:
        # the envs' state could not be saved: restart their episodes, the old ones end as truncated
        statistics = {name: {key: value.numpy() for key, value in stats.items()} for name, stats in payload["normalization"].items()}
        load_normalization_state(train_envs, statistics)
        algo.interrupt_episodes(torch.as_tensor(obs, dtype=torch.float32, device=device), state)
        obs, _ = train_envs.reset(seed=spec.seed + loop.step)
        state = None
    checkpoint.set_rng_state(payload["rng"])
    return obs, state


def restore_learner(payload: dict[str, Any], algo: Any, loop: Any, result: RunResult, spec: RunSpec, kind: str | None = None) -> None:
    """What every resume restores: after checking the payload's format (and ``kind``) and that
    it belongs to ``spec``, the algorithm (with its replay buffer when saved), the loop's
    counters and the evaluations so far."""
    if payload.get("format") != checkpoint.FORMAT or payload.get("kind") != kind:
        raise ValueError(f"checkpoint format {payload.get('format')!r} ({payload.get('kind') or 'online'}) is not {checkpoint.FORMAT} ({kind or 'online'})")
    if payload["spec"].get("run_key") != spec.run_key:
        raise ValueError(f"the checkpoint belongs to run key {payload['spec'].get('run_key')}, not {spec.run_key}")
    algo.load_state_dict(payload["algorithm"])
    if payload.get("replay") is not None:
        algo.load_replay_state_dict(payload["replay"])
    for name, value in payload["loop"].items():
        setattr(loop, name, value)
    result.evaluations = [Evaluation(**evaluation) for evaluation in payload["evaluations"]]


def _to_cpu(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, (tuple, list)):
        return type(state)(_to_cpu(item) for item in state)
    return state


def _to_device(state: Any, device: torch.device) -> Any:
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, (tuple, list)):
        return type(state)(_to_device(item, device) for item in state)
    return state


def _normalization_tensors(train_envs: gym.vector.VectorEnv) -> dict[str, dict[str, Any]]:
    return {
        name: {key: torch.as_tensor(value) for key, value in stats.items()}
        for name, stats in normalization_state(train_envs).items()
    }


def evaluate(
    algo: Algorithm,
    eval_envs: gym.vector.VectorEnv,
    train_envs: gym.vector.VectorEnv,
    seed: int,
    device: torch.device,
    step: int = 0,
) -> Evaluation:
    """One episode in each eval sub-env with the deterministic policy; unscaled returns.

    Observation normalization uses the training envs' current statistics, frozen.
    """
    load_normalization_state(eval_envs, normalization_state(train_envs))
    obs, _ = eval_envs.reset(seed=seed)
    num_envs = eval_envs.num_envs
    returns = np.zeros(num_envs)
    lengths = np.zeros(num_envs, dtype=np.int64)
    finished = np.zeros(num_envs, dtype=bool)
    state: Any = None
    while not finished.all():
        acted = algo.act(torch.as_tensor(obs, dtype=torch.float32, device=device), state, deterministic=True)
        obs, rewards, terminated, truncated, _ = eval_envs.step(acted.env_actions)
        state = algo.reset_state(acted.state, torch.as_tensor(terminated | truncated, device=device))
        running = ~finished
        returns[running] += rewards[running]
        lengths[running] += 1
        finished |= terminated | truncated
    return Evaluation(step=step, returns=returns.tolist(), lengths=lengths.tolist())


def policy_checkpoint(algo: Any, train_envs: gym.vector.VectorEnv | None, spec: RunSpec) -> dict[str, Any]:
    """The trained policy as ``final.pt`` holds it: algorithm state, normalization statistics
    and the spec (tensors and primitives only)."""
    normalization = _normalization_tensors(train_envs) if train_envs is not None else {}
    return {"spec": spec.to_dict(), "algorithm": algo.state_dict(), "normalization": normalization}


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by a run (no pickled objects are executed)."""
    return checkpoint.load(path)
