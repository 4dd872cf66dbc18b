"""Gradient workers of a distributed run (the seeds' scheme): a learner's gradient steps taken
through its step strategy (``agents.api.StepStrategy``), for any learner that implements the
shared step (``Algorithm.shared_step`` ... ``apply_shared_step``: both families of
``agents.algos``, and the plug-ins derived from them).

    synchronous (``WorkerSteps``), for each gradient step of the learner:
        step = learner.shared_step(batch)      (advantages centred over the whole batch, ...)
        the step's M rows split into G contiguous shares of m_g rows
        worker g (a copy with the learner's weights and loss state) returns the gradient of
            its share's mean loss, by parameter name: ``share_gradients``
        the learner sums them weighted by m_g / M (the mean over the M rows), and applies the
            sum as its own step does (clipping, optimizers, priorities): ``apply_shared_step``
    asynchronous (``AsyncWorkerSteps``, A3C/Gorila-style): each step's batch goes whole to the
        next free worker with the learner's weights then; its gradient is applied when it
        arrives, unless more than ``max_staleness`` others were applied since (dropped)

So G workers equal one process up to the order of float sums (tested to 1e-5). Only losses
that are means over the rows split exactly: a learner refuses what does not
(``Algorithm.unsplittable_steps``: REINFORCE's episode-weighted loss, MPO's E-step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

import agents
from agents.api import Algorithm, ConfigError, Gradients, ShareGradients, StepStrategy
from agents.envs import env_spec
from benchmark.config import RunSpec
from benchmark.training.async_collection import staleness_report
from benchmark.training.checkpoint import rng_state, set_rng_state
from benchmark.training.collectors import READY_TIMEOUT


class GradientWorker:
    """One gradient worker: a copy of the run's algorithm (``Algorithm.replica_config``)."""

    def __init__(self, spec: RunSpec):
        cls = agents.algorithm_class(spec.algo)
        config = agents.resolve_config(spec.algo, spec.hyperparameters)
        if not issubclass(cls, Algorithm):
            raise ConfigError(f"distributed: {spec.algo} is not an online learner")
        why = cls.unsplittable_steps(config)
        if why is not None:
            raise ConfigError(f"distributed: {why}")
        global_rngs = rng_state()  # its weights are replaced by the learner's: leave the process's RNGs alone
        try:
            algo = agents.make(spec.algo, env_spec(spec.env), cls.replica_config(config), total_steps=spec.budget.total_steps, seed=spec.seed)
        finally:
            set_rng_state(global_rngs)
        assert isinstance(algo, Algorithm)
        self.algo = algo

    def ready(self) -> bool:
        return True

    def gradients(self, weights: Mapping[str, Mapping[str, torch.Tensor]], loss_state: dict[str, Any], share: Any, rows: slice, total: int) -> ShareGradients:
        """``share_gradients`` of rows ``rows`` of a step of ``total``, at the learner's ``weights`` and ``loss_state``."""
        algo = self.algo
        algo.set_weights(weights)
        algo.load_loss_state(loss_state)
        return algo.share_gradients(share, rows, total)


class GradientWorkerGroup:
    """G gradient workers: Ray actors (one CPU each), or in this process with ``inline``. A
    worker whose process dies is replaced and its share differentiated again (nothing is lost:
    a worker holds no state between steps)."""

    def __init__(self, spec: RunSpec, count: int, inline: bool = False):
        self.spec, self.count, self.inline = spec, count, inline
        self.restarts, self.dropped = 0, 0
        self.staleness: list[int] = []  # of the asynchronous gradients applied since the last report
        self.in_flight: dict[Any, tuple[int, int, tuple[Any, ...], Any]] = {}  # asynchronous: reference -> (worker, version, call, tag)
        self.workers: list[Any] = []
        try:
            self.workers += [self._start() for _ in range(count)]
            if not inline:
                self._wait_ready(self.workers)
        except BaseException:
            self.close()
            raise

    def _start(self) -> Any:
        if self.inline:
            return GradientWorker(self.spec)
        import ray

        # synchronous: they work while the collectors wait, and the reverse, so they take no CPU
        # of the collectors' reservation (a machine with C cores runs C collectors and G workers)
        return ray.remote(GradientWorker).options(num_cpus=0).remote(self.spec)

    def _wait_ready(self, workers: list[Any]) -> None:
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            ray.get([worker.ready.remote() for worker in workers], timeout=READY_TIMEOUT)
        except GetTimeoutError:
            raise RuntimeError(f"{self.spec.label}: {len(workers)} gradient worker actor(s) not started after {READY_TIMEOUT:.0f} s") from None

    def gradients(self, calls: list[tuple[Any, ...]]) -> list[Any]:
        """Worker g's ``gradients(*calls[g])``, all at once; a worker that died is replaced and
        asked again."""
        if self.inline:
            return [worker.gradients(*arguments) for worker, arguments in zip(self.workers, calls, strict=True)]
        references = [self.submit(index, call) for index, call in enumerate(calls)]
        return [self.result(reference, index, calls[index]) for index, reference in enumerate(references)]

    def submit(self, index: int, call: tuple[Any, ...]) -> Any:
        """Worker ``index``'s ``gradients(*call)``, started; its reference (inline: computed now)."""
        if self.inline:
            return _Done(self.workers[index].gradients(*call))
        return self.workers[index].gradients.remote(*call)

    def wait_any(self, references: dict[Any, Any]) -> tuple[Any, Any]:
        """The first of ``references`` to finish (inline: the first submitted), and what it maps to."""
        if self.inline:
            reference = next(iter(references))
            return reference, references[reference]
        import ray

        (reference,), _ = ray.wait(list(references), num_returns=1)
        return reference, references[reference]

    def result(self, reference: Any, index: int, call: tuple[Any, ...]) -> Any:
        """What ``reference`` returned; if worker ``index`` died, a replacement computes ``call`` again."""
        if isinstance(reference, _Done):
            return reference.value
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(reference)
        except RayActorError:
            self.restarts += 1
            self.workers[index] = self._start()
            self._wait_ready([self.workers[index]])
            return ray.get(self.workers[index].gradients.remote(*call))

    def send(self, call: tuple[Any, ...], version: int, tag: Any = None) -> None:
        """Asynchronous: ``gradients(*call)`` on a free worker (the caller waits for an arrival
        first when none is), remembered with the learner's update count ``version`` and ``tag``."""
        busy = {worker for worker, _, _, _ in self.in_flight.values()}
        worker = next(index for index in range(self.count) if index not in busy)
        self.in_flight[self.submit(worker, call)] = (worker, version, call, tag)

    def arrival(self, version: int, max_staleness: int) -> tuple[Any, Any] | None:
        """The first result in flight to arrive and its tag; None when it is more than
        ``max_staleness`` updates older than ``version`` (dropped, counted)."""
        reference, (worker, sent, call, tag) = self.wait_any(self.in_flight)
        del self.in_flight[reference]
        result = self.result(reference, worker, call)
        if version - sent > max_staleness:
            self.dropped += 1
            return None
        self.staleness.append(version - sent)
        return result, tag

    @property
    def busy(self) -> bool:
        """Whether every worker has a result in flight."""
        return len(self.in_flight) == self.count

    def report(self) -> dict[str, float]:
        """Staleness of the asynchronous gradients applied since the last report, and those dropped so far."""
        staleness, self.staleness = self.staleness, []
        return staleness_report("gradient_", "gradients", staleness, self.dropped)

    def close(self) -> None:
        if not self.inline:
            import ray

            for worker in self.workers:
                ray.kill(worker)
        self.workers = []


class _Done:
    """An inline worker's result, as a reference (``GradientWorkerGroup.submit``)."""

    def __init__(self, value: Any):
        self.value = value


def shares(rows: int, count: int) -> list[slice]:
    """``rows`` split into ``count`` contiguous shares as even as can be (the first get one more)."""
    size, extra = divmod(rows, count)
    bounds = [0]
    for index in range(count):
        bounds.append(bounds[-1] + size + (index < extra))
    return [slice(start, end) for start, end in zip(bounds, bounds[1:], strict=False) if end > start]


def weighted_sum(fractions: Sequence[float], answers: Sequence[ShareGradients]) -> tuple[Gradients, dict[str, torch.Tensor]]:
    """The shares' gradients and logs weighted by ``fractions`` (each share's part of the rows)
    and summed: the whole batch's mean loss; one share's as they are."""
    if len(answers) == 1:
        return dict(answers[0].gradients), dict(answers[0].logs)
    total: Gradients = {}
    logs: dict[str, torch.Tensor] = {}
    for fraction, answer in zip(fractions, answers, strict=True):
        for name, gradient in answer.gradients.items():
            if gradient is None:
                total.setdefault(name, None)
                continue
            previous = total.get(name)
            total[name] = fraction * gradient if previous is None else previous + fraction * gradient
        for key, value in answer.logs.items():
            logs[key] = logs[key] + fraction * value if key in logs else fraction * value
    return total, logs


class WorkerSteps(StepStrategy):
    """The synchronous scheme: every gradient step split over the G workers; the learner waits
    for all of them."""

    def __init__(self, group: GradientWorkerGroup):
        self.group = group

    def take(self, learner: Algorithm, batch: Any) -> Any:
        step = learner.shared_step(batch)
        pieces = shares(step.rows, self.group.count)
        weights = learner.get_weights()
        answers = self.group.gradients([(weights, step.loss_state, learner.share_of(step, piece), piece, step.rows) for piece in pieces])
        gradients, logs = weighted_sum([(piece.stop - piece.start) / step.rows for piece in pieces], answers)
        return learner.apply_shared_step(step, gradients, logs, answers)


class AsyncWorkerSteps(StepStrategy):
    """The asynchronous scheme: each gradient step's batch goes whole to the next free worker
    with the learner's weights then (its noise its own: ``shared_step(asynchronous=True)``); the
    learner applies each gradient when it arrives, unless more than ``max_staleness`` other
    steps were applied since its weights were sent (then it is dropped). The learner waits only
    when every worker is busy; what is in flight stays in flight until ``finish`` (the end of an
    on-policy update; an off-policy run's checkpoint and end). A step's logs are those of the
    last gradient applied (the first step waits for its own)."""

    def __init__(self, group: GradientWorkerGroup, max_staleness: int):
        self.group, self.max_staleness = group, max_staleness
        self.applied = 0
        self.logs: Any = None

    def take(self, learner: Algorithm, batch: Any) -> Any:
        if self.group.busy:
            self._apply_next(learner)
        step = learner.shared_step(batch, asynchronous=True)
        whole = slice(0, step.rows)
        self.group.send((learner.get_weights(), step.loss_state, learner.share_of(step, whole), whole, step.rows), self.applied, step)
        while self.logs is None:
            self._apply_next(learner)
        return self.logs

    def _apply_next(self, learner: Algorithm) -> None:
        arrived = self.group.arrival(self.applied, self.max_staleness)
        if arrived is not None:
            answer, step = arrived
            self.logs = learner.apply_shared_step(step, answer.gradients, answer.logs, [answer])
            self.applied += 1

    def finish(self, learner: Algorithm) -> None:
        while self.group.in_flight:
            self._apply_next(learner)
