"""Gradient workers of a distributed off-policy run. Synchronous: every gradient step's sampled
batch differentiated by G workers on shares of its rows.

    the learner samples the batch (B rows) from its replay buffer, as one process does
    worker g (a copy with the learner's weights, update count, temperature and generator state)
        evaluates the losses on rows [a_g, b_g): each draw of noise is made for all B rows, as
        the learner alone would make it, and the worker keeps its rows; clipping inside the
        losses (DQN's) is left to the learner
    the learner sums each optimizer group's gradients weighted by (b_g - a_g) / B (the losses
        are means over the rows), clips where the losses clip, takes on the generator state the
        workers ended in (all the same), sets the TD errors of prioritized replay, and steps

So G workers equal one process up to the order of float sums. Asynchronous: each batch goes
whole to one free worker and its gradient is applied when it arrives
(``AsyncOffPolicyWorkerSteps``). MPO is refused: its E-step
optimizes a temperature over the whole batch and draws action samples batch-second.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import agents
from agents.algos.offpolicy import OffPolicyAlgorithm, SeedTools
from agents.algos.seeds import seed_axis
from agents.api import ConfigError
from agents.batches import ReplayBatch
from agents.envs import env_spec
from agents.optim import clip_gradients
from benchmark.config import RunSpec
from benchmark.training.checkpoint import rng_state, set_rng_state
from benchmark.training.collectors import collector_config
from benchmark.training.gradient_workers import GradientWorkerGroup, shares

GroupGradients = dict[str, list[torch.Tensor] | None]


class OffPolicyGradientWorker:
    """One gradient worker of an off-policy run: a copy of its algorithm (no replay memory)."""

    def __init__(self, spec: RunSpec):
        if spec.algo == "mpo":
            raise ConfigError("distributed: mpo's E-step optimizes over the whole batch; gradient workers cannot split it")
        global_rngs = rng_state()  # its weights are replaced by the learner's: leave the process's RNGs alone
        try:
            algo = agents.make(spec.algo, env_spec(spec.env), collector_config(spec), total_steps=spec.budget.total_steps, seed=spec.seed)
        finally:
            set_rng_state(global_rngs)
        if not isinstance(algo, OffPolicyAlgorithm):
            raise ConfigError(f"distributed: {spec.algo} is not an off-policy algorithm")
        self.algo = algo

    def ready(self) -> bool:
        return True

    def gradients(
        self, weights: dict[str, dict[str, torch.Tensor]], loss_state: dict[str, Any], batch: ReplayBatch, rows: slice, total: int
    ) -> tuple[GroupGradients, dict[str, torch.Tensor], torch.Tensor | None, torch.Tensor, dict[str, float]]:
        """The gradients of the losses on ``batch`` (rows ``rows`` of a batch of ``total``), by
        optimizer group; the logs (1,); the TD errors (m,) when prioritized; the generator state
        the draws ended in; the groups the losses asked to clip, with their max norms."""
        algo = self.algo
        algo.set_weights(weights)
        algo.load_loss_state(loss_state)
        generator, device = algo.generator, algo.device
        clipped: dict[int, float] = {}

        def noise(draw: Any, shape: Sequence[int]) -> torch.Tensor:
            return draw((1, total, *shape[1:]), generator, device)[:, rows]  # the whole batch's draw, this share's rows

        def clip(gradients: list[torch.Tensor], max_norm: float) -> torch.Tensor:
            clipped[id(gradients)] = max_norm  # the learner clips the sum
            return torch.zeros(1)

        groups = algo.groups
        tools = SeedTools(noise=noise, clip=clip, parameters=lambda group: groups[group][0])
        gradients, logs, errors = algo.seeds_gradients(algo.networks(), algo.encode(None, None, seed_axis(batch)), tools)
        to_clip = {name: clipped[id(values)] for name, values in gradients.items() if id(values) in clipped}
        return (
            {name: None if values is None else [value.detach() for value in values] for name, values in gradients.items()},
            {key: value.detach() for key, value in logs.items()},
            None if errors is None else errors[0].detach(),
            generator.get_state(),
            to_clip,
        )


class OffPolicyWorkerSteps:
    """The synchronous scheme: every gradient step's batch split over the G workers
    (``OffPolicyAlgorithm.stepped_by``); the learner waits for all of them."""

    def __init__(self, group: GradientWorkerGroup):
        self.group = group

    def step(self, algorithm: OffPolicyAlgorithm, batch: ReplayBatch) -> dict[str, float]:
        gradients, logs, errors = self.differentiate(algorithm, batch)
        algorithm.apply_step(gradients, batch.indices, errors)
        return logs

    def differentiate(self, algorithm: OffPolicyAlgorithm, batch: ReplayBatch) -> tuple[list[torch.Tensor | None], dict[str, float], torch.Tensor | None]:
        """The gradients of one step on ``batch`` (``gradient_list``'s order), its logs and TD
        errors (B,), as one process computes them; the learner's generator moves on as there."""
        total = int(batch.obs.shape[0])
        pieces = shares(total, self.group.count)
        weights, loss_state = algorithm.get_weights(), algorithm.loss_state()
        calls = [(weights, loss_state, batch.apply(lambda tensor, piece=piece: tensor[piece].cpu()), piece, total) for piece in pieces]  # type: ignore[misc]
        results = self.group.gradients(calls)
        states = [result[3] for result in results]
        if any(not torch.equal(state, states[0]) for state in states):
            raise RuntimeError("the gradient workers' noise diverged: they did not draw from one state")
        algorithm.generator.set_state(states[0])
        return joined(algorithm, [(piece.stop - piece.start) / total for piece in pieces], results)

    def finish(self, algorithm: OffPolicyAlgorithm) -> None:
        pass


class AsyncOffPolicyWorkerSteps:
    """The asynchronous scheme (Gorila-style): each gradient step's batch goes whole to the next
    free worker with the learner's weights then, and its own noise (a seed the learner draws);
    the learner applies each gradient when it arrives, and sets the priorities of the batch it
    came from (of its rows not stored again meanwhile), unless more than ``max_staleness``
    other steps were applied since its weights were sent (then it is dropped). The learner waits
    only when every worker is busy; what is in flight at the end of an update stays in flight (``finish`` applies it before a
    checkpoint and at the end of training). A step's logs are those of the last gradient
    applied (the first step waits for its own)."""

    def __init__(self, group: GradientWorkerGroup, max_staleness: int):
        self.group, self.max_staleness = group, max_staleness
        self.logs: dict[str, float] | None = None

    def step(self, algorithm: OffPolicyAlgorithm, batch: ReplayBatch) -> dict[str, float]:
        if self.group.busy:
            self._apply_next(algorithm)
        total = int(batch.obs.shape[0])
        seed = int(torch.randint(2**62, (1,), generator=algorithm.generator, device=algorithm.generator.device))
        loss_state = {**algorithm.loss_state(), "generator": torch.Generator().manual_seed(seed).get_state()}
        call = (algorithm.get_weights(), loss_state, batch.apply(lambda tensor: tensor.cpu()), slice(0, total), total)
        # tagged with the batch's rows and the buffer's count then: its priorities go to the rows not stored again since
        self.group.send(call, algorithm.num_updates, (batch.indices, algorithm.buffer.rows_written))
        while self.logs is None:
            self._apply_next(algorithm)
        return self.logs

    def _apply_next(self, algorithm: OffPolicyAlgorithm) -> None:
        arrived = self.group.arrival(algorithm.num_updates, self.max_staleness)
        if arrived is None:
            return
        result, (indices, written) = arrived
        gradients, self.logs, errors = joined(algorithm, [1.0], [result])
        if indices is not None and errors is not None:  # rows stored again since keep their new transitions' priorities
            kept = ~algorithm.buffer.rewritten_since(indices, written)
            indices, errors = indices[kept], errors[kept]
        algorithm.apply_step(gradients, indices, errors)

    def finish(self, algorithm: OffPolicyAlgorithm) -> None:
        while self.group.in_flight:
            self._apply_next(algorithm)


def joined(algorithm: OffPolicyAlgorithm, weights: list[float], results: list[Any]) -> tuple[list[torch.Tensor | None], dict[str, float], torch.Tensor | None]:
    """The workers' ``results`` on shares of one batch summed with ``weights`` (each share's
    fraction of the rows), clipped where the losses clip: the gradients in
    ``gradient_list``'s order, the logs, and the TD errors (B,) when every share has them."""
    summed: dict[str, list[torch.Tensor] | None] = {}
    logs: dict[str, torch.Tensor] = {}
    for share, (gradients, info, _, _, _) in zip(weights, results, strict=True):
        for name, values in gradients.items():
            if values is None:
                summed.setdefault(name, None)
                continue
            previous = summed.get(name)
            if len(results) == 1:  # one worker had the whole batch: its gradients as they are
                summed[name] = list(values)
            else:
                summed[name] = [share * value for value in values] if previous is None else [a + share * b for a, b in zip(previous, values, strict=True)]
        for key, value in info.items():
            logs[key] = logs[key] + share * value if key in logs else share * value
    for name, max_norm in results[0][4].items():
        values = summed.get(name)
        if values is not None:
            logs["grad_norm"] = clip_gradients(values, max_norm).reshape(1)
    errors = [result[2] for result in results if result[2] is not None]
    flat: list[torch.Tensor | None] = []
    for name, (parameters, _) in algorithm.groups.items():
        flat += summed.get(name) or [None] * len(parameters)
    return flat, {key: float(value.reshape(-1)[0]) for key, value in logs.items()}, torch.cat(errors) if errors and len(errors) == len(results) else None
