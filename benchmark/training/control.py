"""Loop control shared by the training loop and the meta loop: seeding, devices, the stop
signal, non-finite checks, the counters a checkpoint keeps, and a run's end."""

from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmark.training import checkpoint
from benchmark.training.results import RunResult, Tracker


class NonFiniteLoss(FloatingPointError):
    """An update produced NaN or infinite losses: the run has diverged and is stopped."""


class ResumeError(RuntimeError):
    """A checkpoint could not be restored into this run (another format, other shapes)."""


class Preempted(Exception):
    """The run received SIGTERM: it wrote a checkpoint (when it has a checkpoint directory) and
    stopped; re-launching the suite resumes it."""


def check_finite(logs: dict[str, float], step: int) -> None:
    """Raise NonFiniteLoss naming every non-finite value of one update's logs."""
    bad = {key: value for key, value in logs.items() if not math.isfinite(value)}
    if bad:
        values = ", ".join(f"{key}={value}" for key, value in sorted(bad.items()))
        raise NonFiniteLoss(f"non-finite update values at env step {step}: {values}")


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch global RNGs (envs are seeded through reset)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class StopSignal:
    """Turns SIGTERM into a flag the training loop checks after each step (main thread only).

    A SIGTERM that arrived earlier, while ``deferred_stop`` held it (a worker setting a run up),
    counts as received: the loop stops at its first step, with a checkpoint."""

    pending = False
    """Process-wide, inside ``deferred_stop``: a SIGTERM has arrived (there or in a loop)."""
    deferring = False

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None

    def __enter__(self) -> StopSignal:
        self.received = StopSignal.pending
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = StopSignal.pending = True

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        if not StopSignal.deferring:
            StopSignal.pending = False


@contextlib.contextmanager
def deferred_stop() -> Iterator[None]:
    """Around a worker's task: a SIGTERM that arrives outside the training loop (while runs are
    set up or recorded) is remembered instead of ending the process, so that the next loop stops
    at once with a checkpoint and every run is recorded as stopped (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def remember(signum: int, frame: Any) -> None:
        StopSignal.pending = True

    StopSignal.pending, StopSignal.deferring = False, True
    previous = signal.signal(signal.SIGTERM, remember)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        StopSignal.pending, StopSignal.deferring = False, False


RECENT_TRAIN_EPISODES = 100


@dataclass
class Counters:
    """The training loop's own counters (env steps, seconds): checkpointed with the algorithm."""

    step: int = 0
    first_step: int = 0
    """Where this run's training began: 0, or the last step of the run it continues."""
    next_eval: int = 0
    next_checkpoint: int = 0
    next_progress: int = 0
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    cpu_seconds: float = 0.0
    """CPU seconds (user + system) of the training process so far, every attempt; NaN when a
    checkpoint from before it was counted resumed the run."""
    update_logs: dict[str, list[float]] = field(default_factory=dict)
    train_return_sum: float = 0.0
    """Of the training episodes that ended since the last evaluation (with train_episodes)."""
    train_episodes: int = 0
    recent_train_returns: list[float] = field(default_factory=list)
    """The returns of the last ``RECENT_TRAIN_EPISODES`` training episodes (CleanRL's score)."""

    def record_episode(self, episode_return: float) -> None:
        """A training episode ended with ``episode_return`` (unnormalized)."""
        self.train_return_sum += episode_return
        self.train_episodes += 1
        self.recent_train_returns.append(float(episode_return))
        del self.recent_train_returns[:-RECENT_TRAIN_EPISODES]


def finish(
    result: RunResult,
    counters: Counters,
    started: float,
    tracker: Tracker,
    run_dir: Path | None,
    final_payload: dict[str, Any],
    remove_latest_on_finish: bool,
    cpu_started: float = math.nan,
) -> RunResult:
    """A run's end: its timing, ``final.pt`` (and ``latest.pt`` removed unless the caller
    removes it once the run is recorded), the metrics flushed. ``started`` is a
    ``time.perf_counter()`` reading, ``cpu_started`` a ``time.process_time()`` one (both moved
    back by the time of earlier attempts)."""
    result.wall_seconds = time.perf_counter() - started
    result.cpu_seconds = time.process_time() - cpu_started
    recent = counters.recent_train_returns
    result.train_last100 = (sum(recent) / len(recent), len(recent)) if recent else None
    result.steps_per_second = (counters.step - counters.first_step) / max(result.wall_seconds - counters.eval_seconds, 1e-9)
    if run_dir is not None:
        path = checkpoint.write_atomic(final_payload, run_dir / checkpoint.FINAL)
        if remove_latest_on_finish:
            (run_dir / checkpoint.LATEST).unlink(missing_ok=True)
        result.checkpoint = str(path)
        tracker.log_artifact(path, "checkpoints")
    tracker.flush()
    return result


class SeedOutcome:
    """One run's part of a loop that trains several (a batch of seeds): the exception that
    ended it, if one did."""

    error: BaseException | None = None

    def guard(self, step: Callable[..., Any], *arguments: Any) -> None:
        """Run one of this seed's steps; an exception ends this seed's run (Ctrl-C ends all)."""
        try:
            step(*arguments)
        except Exception as error:  # noqa: BLE001 - kept as the run's outcome, raised by run()
            self.error = error


def share_first_error(seeds: Sequence[SeedOutcome]) -> None:
    """Once one seed has failed, every other seed ends with the same exception (a tuning
    trial, which one failed or pruned seed ends)."""
    first = next((seed.error for seed in seeds if seed.error is not None), None)
    if first is not None:
        for seed in seeds:
            if seed.error is None:
                seed.error = first


def train_runs(
    jobs: Sequence[Any],
    build: Callable[[Any], Any],
    position: Callable[[Any], int],
    what: str,
    train: Callable[[list[Any]], None],
    remove_latest_on_finish: bool,
) -> list[RunResult | BaseException]:
    """``run_seeds`` for either loop: each job's run is built (and resumed), they must resume
    from one ``position`` (a step, or a meta-learner's epoch) to train as one batch; ``train``
    trains them, each that did not fail finishes, all close. Each run's result or the
    exception that ended it."""
    runs: list[Any] = []
    try:
        for job in jobs:
            runs.append(build(job))
        positions = {position(run) for run in runs if run.error is None}
        if len(positions) > 1:
            raise ValueError(f"resumed runs at different {what} cannot train as one batch: {[position(run) for run in runs]}")
        train(runs)
        for run in runs:
            if run.error is None:
                run.guard(run.finish, remove_latest_on_finish)
    finally:
        for run in runs:
            run.close()
    return [run.error if run.error is not None else run.result for run in runs]
