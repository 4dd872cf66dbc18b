"""Gradient workers of a distributed on-policy run (the seeds' scheme, synchronous): every
optimizer step of the learner is differentiated by G workers on shares of its batch (an
off-policy run's: ``offpolicy_gradient_workers``; both use ``GradientWorkerGroup``).

    for each optimizer step of the update (a minibatch, or the whole rollout):
        the learner centers the batch's advantages (center_adv / positive_adv over the whole
            batch, as one process does), splits the batch into G contiguous shares of m_g rows
        worker g (a copy of the algorithm with the learner's weights and loss state) returns
            the gradient of its share's mean loss, by parameter name
        the learner sums them weighted by m_g / M (the mean over the M rows), then clips and
            steps its optimizers as one process does

So G workers equal one learner on the whole batch up to the order of float sums (tested to
1e-5). Only the losses' mean-over-rows form makes the weighted sum exact: algorithms whose
policy loss is weighted by a batch-wide count (REINFORCE: only whole episodes count) are refused.
"""

from __future__ import annotations

from typing import Any

import torch

import agents
from agents.algos.onpolicy import PARTS, OneSeed, OnPolicyAlgorithm, process_advantages
from agents.api import ConfigError
from agents.batches import RolloutBatch
from agents.envs import env_spec
from benchmark.config import RunSpec
from benchmark.training.async_collection import staleness_report
from benchmark.training.checkpoint import rng_state, set_rng_state
from benchmark.training.collectors import READY_TIMEOUT

Gradients = dict[str, torch.Tensor | None]


class GradientWorker:
    """One gradient worker: a copy of the run's algorithm whose advantages come processed."""

    def __init__(self, spec: RunSpec):
        config = agents.resolve_config(spec.algo, spec.hyperparameters)
        config = config.replace(center_adv=False, positive_adv=False)  # the learner did it, batch-wide
        global_rngs = rng_state()  # its weights are replaced by the learner's: leave the process's RNGs alone
        try:
            algo = agents.make(spec.algo, env_spec(spec.env), config, total_steps=spec.budget.total_steps, seed=spec.seed)
        finally:
            set_rng_state(global_rngs)
        if not isinstance(algo, OnPolicyAlgorithm):
            raise ConfigError(f"distributed: gradient workers serve on-policy algorithms so far, not {spec.algo}")
        if not algo.learns_value:
            raise ConfigError(f"distributed: {spec.algo}'s policy loss counts whole episodes over the batch; gradient workers cannot split it")
        self.algo = algo

    def ready(self) -> bool:
        return True

    def gradients(
        self, weights: dict[str, dict[str, torch.Tensor]], loss_state: dict[str, Any], batch: RolloutBatch, parts: tuple[str, ...]
    ) -> tuple[Gradients, dict[str, torch.Tensor]]:
        """The gradient of the mean loss ``parts`` over ``batch`` (1, m, ...), by parameter name, and its logs (1,)."""
        algo = self.algo
        algo.set_weights(weights)
        algo.load_loss_state(loss_state)
        loss, info = algo.seeds_loss(algo.actor_critic, batch, parts)
        gradients = torch.autograd.grad(loss.sum(), algo.parameters, allow_unused=True)
        return dict(zip(algo.parameter_names(), gradients, strict=True)), {key: value.detach() for key, value in info.items()}


class GradientWorkerGroup:
    """G gradient workers: Ray actors (one CPU each), or in this process with ``inline``. A
    worker whose process dies is replaced and its share differentiated again (nothing is lost:
    a worker holds no state between steps)."""

    def __init__(self, spec: RunSpec, count: int, inline: bool = False, worker: type = GradientWorker):
        self.spec, self.count, self.inline, self.worker = spec, count, inline, worker
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
            return self.worker(self.spec)
        import ray

        # synchronous: they work while the collectors wait, and the reverse, so they take no CPU
        # of the collectors' reservation (a machine with C cores runs C collectors and G workers)
        return ray.remote(self.worker).options(num_cpus=0).remote(self.spec)

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


class WorkerSeeds(OneSeed):
    """A run's seed whose optimizer steps are differentiated by gradient workers: what the
    run's update optimizes through (``OnPolicyAlgorithm.optimized_as``)."""

    def __init__(self, algorithm: OnPolicyAlgorithm, group: GradientWorkerGroup):
        super().__init__(algorithm)
        self.group = group

    def gradient_step(self, batch: RolloutBatch, parts: tuple[str, ...] = PARTS, active: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        algorithm = self.algorithm
        if "policy" in parts:
            batch = batch.replace(advantages=process_advantages(algorithm.config, batch.advantages))
        rows = int(batch.advantages.shape[-1])
        pieces = shares(rows, self.group.count)
        shards = [batch.apply(lambda tensor, piece=piece: tensor[:, piece].cpu()) for piece in pieces]  # type: ignore[misc]
        weights, loss_state = algorithm.get_weights(), algorithm.loss_state()
        results = self.group.gradients([(weights, loss_state, shard, parts) for shard in shards])
        total: Gradients = {}
        logs: dict[str, torch.Tensor] = {}
        for piece, (gradients, info) in zip(pieces, results, strict=True):
            weight = (piece.stop - piece.start) / rows
            for name, gradient in gradients.items():
                if gradient is not None:
                    previous = total.get(name)
                    total[name] = weight * gradient if previous is None else previous + weight * gradient
                else:
                    total.setdefault(name, None)
            for key, value in info.items():
                logs[key] = logs[key] + weight * value if key in logs else weight * value
        algorithm.apply_gradients(total)
        return logs


class AsyncWorkerSeeds(OneSeed):
    """The asynchronous scheme's gradient workers (A3C-style): each optimizer step's batch goes
    whole to the next free worker with the learner's weights then; the learner applies each
    gradient when it arrives, unless more than ``max_staleness`` other steps were applied since
    its weights were sent (then it is dropped). The learner waits only when every worker is
    busy, and at the end of the update (``finish``). A step's logs are those of the last
    gradient applied (the first step waits for its own)."""

    def __init__(self, algorithm: OnPolicyAlgorithm, group: GradientWorkerGroup, max_staleness: int):
        super().__init__(algorithm)
        self.group, self.max_staleness = group, max_staleness
        self.applied = 0
        self.logs: dict[str, torch.Tensor] | None = None

    def gradient_step(self, batch: RolloutBatch, parts: tuple[str, ...] = PARTS, active: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        algorithm = self.algorithm
        if "policy" in parts:
            batch = batch.replace(advantages=process_advantages(algorithm.config, batch.advantages))
        if self.group.busy:
            self._apply_next()
        self.group.send((algorithm.get_weights(), algorithm.loss_state(), batch.apply(lambda tensor: tensor.cpu()), parts), self.applied)
        while self.logs is None:
            self._apply_next()
        return self.logs

    def _apply_next(self) -> None:
        arrived = self.group.arrival(self.applied, self.max_staleness)
        if arrived is not None:
            (gradients, self.logs), _ = arrived
            self.algorithm.apply_gradients(gradients)
            self.applied += 1

    def finish(self) -> None:
        while self.group.in_flight:
            self._apply_next()
