"""One run over several workers (the seeds' distributed scheme), as the training loop sees it:
a ``SeedRun`` whose envs live in collectors (``benchmark.training.collectors``).

    every round:
        synchronous: the collectors step their envs with the learner's weights and acting
            state: on-policy, a whole rollout (num_steps); off-policy, one vector step (the
            learner updates between steps, as one process does)
        asynchronous: the rollouts or chunks that arrive (``async_collection``)
        the learner observes the steps joined, logs the ended episodes as one process would
    then the loop goes on as for any run: update when ready (through the gradient workers when
    it has them: ``gradient_workers``), evaluate, checkpoint

A checkpoint holds every collector's envs (their state where ``agents.env_state`` captures it)
besides what any run's holds, so a synchronous run resumes exactly. A collector whose process
dies is replaced and collects its round again; its envs start new episodes (the episodes it had
in progress are lost; ``distributed/collector_restarts`` counts them).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import agents
from agents.api import Algorithm, ConfigError
from benchmark import metric_names
from benchmark.distributed_config import check_distributable, quiet_ray_banners
from benchmark.training import checkpoint
from benchmark.training.async_collection import AsyncCollection
from benchmark.training.collectors import CollectorGroup, observe_rollout
from benchmark.training.gradient_workers import AsyncWorkerSteps, GradientWorkerGroup, WorkerSteps
from benchmark.training.normalized_collection import JoinedNormalization, collect_in_lockstep, first_observations
from benchmark.training.seed_run import SeedRun

COLLECTOR_RESTARTS = "distributed/collector_restarts"
GRADIENT_WORKER_RESTARTS = "distributed/gradient_worker_restarts"


def collector_rate(index: int) -> str:
    """The metric of collector ``index``'s env steps per second."""
    return f"distributed/collector{index}/steps_per_second"


def start_ray() -> bool:
    """Join the Ray instance this process belongs to (a Ray worker, or ``RAY_ADDRESS``), else
    start a local one; whether it started one (and should shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    # Ray runs its workers at nice 15; collectors are the run's own work, not background work
    os.environ.setdefault("RAY_worker_niceness", "0")
    # Ray's GCS and raylet would join this process's group, and a SIGTERM sent to the group (a
    # shell's timeout, a batch scheduler) would end them at once: the run could not write its
    # preemption checkpoint, and its driver would wait 60 s for the GCS, then exit. So they start
    # in a group of their own (they still die with this process: Ray binds them to it).
    # ray.init also makes SIGTERM exit the driver at once; the run's own handler (a preemption
    # checkpoint, ``control.StopSignal`` / ``deferred_stop``) is put back.
    group, handler = os.getpgid(0), signal.getsignal(signal.SIGTERM)
    alone = group != os.getpid()  # a group's leader cannot leave it: its Ray stays in its group
    if alone:
        os.setpgid(0, 0)
    quiet_ray_banners()
    try:
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    finally:
        try:
            if alone:
                os.setpgid(0, group)
        except OSError:  # the group ended meanwhile (this process was its last member): stay in Ray's
            pass
        finally:
            if handler is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, handler)
    return True


class DistributedRun(SeedRun):
    """A run whose envs are stepped by collectors, on-policy or off-policy, synchronously or
    not, its optimizer steps differentiated by gradient workers when it has them."""

    acts_here = False

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.gradient_group: GradientWorkerGroup | None = None
        count = self.settings["gradient_workers"]
        try:  # the device "auto" chose (RunSpec refuses an explicit one)
            check_distributable(self.spec.algo, self.spec.hyperparameters, self.settings, self.device.type)
        except ConfigError as error:
            self.error = error
        if count and self.error is None:
            group = self.gradient_group = GradientWorkerGroup(self.spec, count, self.settings["backend"] == "inline")
            asynchronous = self.settings["mode"] == "async"
            self.algo.step_strategy = AsyncWorkerSteps(group, self.settings["max_staleness"]) if asynchronous else WorkerSteps(group)

    def open_train_envs(self) -> gym.vector.VectorEnv | None:
        settings = self.spec.distributed
        assert settings is not None
        self.settings = settings
        # on-policy: the whole rollout acts with one policy; off-policy: updates come between
        # steps (synchronous) or between chunks (asynchronous)
        cls = agents.algorithm_class(self.spec.algo)
        rollout = cls.rollout_length(self.config) if issubclass(cls, Algorithm) else None
        self.on_policy = rollout is not None
        asynchronous = settings["mode"] == "async"
        self.rollout = rollout if rollout is not None else settings["chunk"] if asynchronous else 1
        self.rounds = 0
        inline = settings["backend"] == "inline"
        self.started_ray = not inline and start_ray()
        self.group = CollectorGroup(self.spec, settings["collectors"], inline=inline)
        self.asynchronous = AsyncCollection(self.group, self.rollout, settings["max_staleness"]) if asynchronous else None
        if self.asynchronous is not None and not self.on_policy:
            self.asynchronous.priorities = bool(getattr(self.config, "prioritized", False))
        self.collector_seconds = np.zeros(settings["collectors"])
        self.collector_steps = np.zeros(settings["collectors"])
        # the run's normalization lives here, its wrappers around the collectors' steps joined
        self.normalization: JoinedNormalization | None = None
        if getattr(self.config, "normalize_observations", False) or getattr(self.config, "normalize_rewards", False):
            self.normalization = JoinedNormalization(self.spec, self.config)
            self.normalization.start(first_observations(self.group))
            if self.asynchronous is not None:  # its rule: statistics sent with the weights, absorbed on arrival
                self.asynchronous.statistics = self.normalization.snapshot
            return self.normalization.envs
        return None

    def start(self, reset_seed: int | None = None) -> None:
        """Nothing to reset here: the collectors reset their envs when they start."""

    def restore(self, payload: dict[str, Any]) -> None:
        checkpoint.restore_learner(payload, self.algo, self.counters, self.result, self.spec)
        collectors = payload.get("collectors")
        if collectors is None:
            raise ValueError("it was written by a run in one process, not over collectors")
        self.group.load_state(collectors)
        self.group.restarts = int(payload.get("collector_restarts", 0))
        if self.normalization is not None:
            joined = payload.get("joined_normalization")
            if joined is None:
                raise ValueError("it was written by a run without observation or reward normalization")
            self.normalization.load_state(joined)
            for index, state in enumerate(collectors):  # envs whose state was not captured start new episodes
                if state["envs"] is None:
                    k = self.group.per_collector
                    self.normalization.restart_rows(slice(index * k, (index + 1) * k), self.group.handles[index].raw_obs())
        checkpoint.set_rng_state(payload["rng"])
        self.start()

    def collect_round(self) -> None:
        """One round: the collectors' steps observed, their ended episodes logged in the order
        one process logs them (by step, then env: exactly so in the synchronous scheme)."""
        restarts = self.group.restarts
        num_envs = int(self.config.num_envs)
        # the last round steps only to the budget, as one process stops there (no update on a partial rollout)
        steps = min(self.rollout, -(-(self.spec.budget.total_steps - self.counters.step) // num_envs))
        if self.asynchronous is not None:
            arrived = self.asynchronous.round(self.algo, self.algo.num_updates) if self.on_policy else self.asynchronous.chunks(self.algo, self.rounds)
            collected = [part.head(steps) for part in arrived]
            if self.normalization is not None:
                k = self.group.per_collector
                collected = [self.normalization.absorb(part, slice(part.collector * k, (part.collector + 1) * k)) for part in collected]
        elif self.normalization is not None:
            collected = collect_in_lockstep(self.group, self.algo, steps, self.normalization)
        else:
            collected = self.group.collect(self.algo, steps)
        for part in collected:
            self.collector_seconds[part.collector] += part.seconds
            self.collector_steps[part.collector] += part.num_steps * self.group.per_collector
        observe_rollout(self.algo, collected, synchronous=self.asynchronous is None)
        # by step, then collector, then env (a stable sort keeps each collector's envs in order)
        ended = sorted(
            ((step, index, episode_return, length) for index, part in enumerate(collected) for episode_return, length, step in part.episodes),
            key=lambda episode: episode[:2],
        )
        for step, _, episode_return, length in ended:
            self.tracker.log_metrics(
                {metric_names.TRAIN_EPISODE_RETURN: episode_return, metric_names.TRAIN_EPISODE_LENGTH: length}, self.counters.step + (step + 1) * num_envs
            )
            self.counters.record_episode(episode_return)
        self.counters.step += steps * num_envs
        self.rounds += 1
        if self.group.restarts > restarts:
            self.tracker.log_metrics({COLLECTOR_RESTARTS: float(self.group.restarts)}, self.counters.step)

    def evaluate_now(self) -> float:
        """Each collector's env steps per second of its own collection time, since the last
        evaluation (how evenly the workers keep up), then what every run logs."""
        if self.counters.step >= self.spec.budget.total_steps:
            self.guard(self._finish_steps)  # the last evaluation sees every gradient step taken
        rates = self.collector_steps / np.maximum(self.collector_seconds, 1e-9)
        metrics = {collector_rate(index): float(rate) for index, rate in enumerate(rates)}
        if self.asynchronous is not None:
            metrics.update(self.asynchronous.report())
        if self.gradient_group is not None:
            metrics[GRADIENT_WORKER_RESTARTS] = float(self.gradient_group.restarts)
            if self.settings["mode"] == "async":
                metrics.update(self.gradient_group.report())
        self.tracker.log_metrics(metrics, self.counters.step)
        self.collector_seconds[:] = 0.0
        self.collector_steps[:] = 0.0
        return super().evaluate_now()

    def save(self) -> Path:
        self._finish_steps()
        return super().save()

    def finish(self, remove_latest_on_finish: bool) -> None:
        self._finish_steps()
        super().finish(remove_latest_on_finish)

    def _finish_steps(self) -> None:
        """Apply the asynchronous gradient steps in flight (off-policy: they outlive an update)."""
        self.algo.finish_steps()

    def envs_payload(self) -> dict[str, Any]:
        states = self.group.state()
        return {
            "collectors": states,
            "collector_restarts": self.group.restarts,
            "envs": None,
            # asynchronous: the rollouts in flight are lost on a resume, and the collectors' streams restart
            "exact_envs": self.asynchronous is None and all(state["envs"] is not None for state in states),
            "normalization": {} if self.normalization is None else checkpoint.normalization_tensors(self.normalization.envs),
            "joined_normalization": None if self.normalization is None else self.normalization.state(),
        }

    def close(self) -> None:
        if getattr(self, "asynchronous", None) is not None:
            self.asynchronous.close()  # type: ignore[union-attr]
        if getattr(self, "group", None) is not None:
            self.group.close()
        if getattr(self, "gradient_group", None) is not None:
            self.gradient_group.close()  # type: ignore[union-attr]
        if getattr(self, "started_ray", False):  # a local instance lives as long as its run
            import ray

            ray.shutdown()
        super().close()
