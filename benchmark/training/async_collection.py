"""The asynchronous scheme's collection (``distributed: {mode: async}``): collectors never wait.

On-policy (``round``):

    every collector always has a rollout in flight, acting with the weights it was sent and
        drawing from a stream of its own (its seed derived from the run's, its index and restarts)
    a round (the learner's next batch): the first C rollouts to arrive, in arrival order; each
        collector that returns gets the learner's current weights and starts its next rollout
        at once; a rollout acted with weights more than ``max_staleness`` updates old is dropped
    the learner updates on the batch while the collectors go on with the weights they have

So a rollout may be one or more updates old (its ``staleness``): PPO's ratio to the stored
behaviour log-probabilities, clipped, keeps such a batch usable (the scheme of asynchronous PPO
without V-trace).

Off-policy (``chunks``, Ape-X): a round is the next chunk of ``chunk`` vector steps of every
collector, in collector order (each collector's envs keep their columns of the replay buffer,
so its episodes stay contiguous there), with each transition's initial priority computed by the
collector when replay is prioritized. With ``max_staleness`` >= 1 every collector starts its
next chunk with the current weights as soon as its last arrives, while the learner stores and
trains on the round: chunks are one update-round old; with 0 they wait for the update.
Staleness and drops are logged; nothing equals the run in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.api import Algorithm
from benchmark.training.collected import Collected
from benchmark.training.collectors import CollectorGroup


def staleness_report(kind: str, dropped_what: str, staleness: list[int], dropped: int) -> dict[str, float]:
    """``distributed/{kind}staleness_mean`` and ``_max`` of ``staleness``, and
    ``distributed/dropped_{dropped_what}``."""
    return {
        f"distributed/{kind}staleness_mean": sum(staleness) / max(len(staleness), 1),
        f"distributed/{kind}staleness_max": float(max(staleness, default=0)),
        f"distributed/dropped_{dropped_what}": float(dropped),
    }


class AsyncCollection:
    """Rollouts in flight on every collector of ``group``, handed out by rounds."""

    def __init__(self, group: CollectorGroup, num_steps: int, max_staleness: int):
        self.group, self.num_steps, self.max_staleness = group, num_steps, max_staleness
        self.pending: dict[Any, tuple[int, int]] = {}  # Ray reference -> (collector, weights version)
        self.staleness: list[int] = []  # of the rollouts used since the last report
        self.dropped = 0

    def _submit(self, index: int, weights: dict[str, dict[str, Any]], acting_state: dict[str, Any], version: int) -> None:
        actor = self.group.handles[index].actor  # type: ignore[attr-defined]
        self.pending[actor.collect.remote(weights, acting_state, self.num_steps, True, self.priorities, self.statistics())] = (index, version)

    priorities = False
    """Whether collectors compute initial priorities (off-policy, prioritized replay)."""

    statistics: Callable[[], dict[str, Any] | None] = staticmethod(lambda: None)
    """The learner's observation statistics to send with the weights, when the run normalizes
    (``normalized_collection.JoinedNormalization.snapshot``)."""

    def round(self, algo: Algorithm, version: int) -> list[Collected]:
        """The next C rollouts to arrive that are at most ``max_staleness`` updates old
        (``version``: the learner's update count now)."""
        import ray
        from ray.exceptions import RayActorError

        weights, acting_state = algo.get_weights(), algo.acting_state()
        busy = {index for index, _ in self.pending.values()}
        for index in range(self.group.count):
            if index not in busy:
                self._submit(index, weights, acting_state, version)
        batch: list[Collected] = []
        while len(batch) < self.group.count:
            (reference,), _ = ray.wait(list(self.pending), num_returns=1)
            index, used = self.pending.pop(reference)
            try:
                rollout: Collected = ray.get(reference)
            except RayActorError:
                self.group.replace(index)
                self._submit(index, weights, acting_state, version)
                continue
            self._submit(index, weights, acting_state, version)
            if version - used > self.max_staleness:
                self.dropped += 1
                continue
            self.staleness.append(version - used)
            batch.append(rollout)
        return batch

    def chunks(self, algo: Algorithm, version: int) -> list[Collected]:
        """Every collector's next chunk, in collector order (``version``: the learner's count of
        rounds now: an off-policy learner's weights change every gradient step, its rounds
        measure staleness); the next chunks start at once when ``max_staleness`` >= 1."""
        import ray
        from ray.exceptions import RayActorError

        weights, acting_state = algo.get_weights(), algo.acting_state()
        in_flight = {index: reference for reference, (index, _) in self.pending.items()}
        for index in range(self.group.count):
            if index not in in_flight:
                self._submit(index, weights, acting_state, version)
        by_index = {index: reference for reference, (index, _) in self.pending.items()}
        batch: list[Collected] = []
        for index in range(self.group.count):
            reference = by_index[index]
            used = self.pending.pop(reference)[1]
            try:
                chunk: Collected = ray.get(reference)
            except RayActorError:
                self.group.replace(index)
                used = version
                chunk = self.group.handles[index].collect(weights, acting_state, self.num_steps, True, self.priorities, self.statistics())
            self.staleness.append(version - used)
            batch.append(chunk)
        if self.max_staleness >= 1:
            for index in range(self.group.count):
                self._submit(index, weights, acting_state, version)
        return batch

    def report(self) -> dict[str, float]:
        """Staleness of the rollouts used since the last report, and the rollouts dropped so far."""
        staleness, self.staleness = self.staleness, []
        return staleness_report("", "rollouts", staleness, self.dropped)

    def close(self) -> None:
        """Forget the rollouts in flight (the group's close ends their actors)."""
        self.pending.clear()
