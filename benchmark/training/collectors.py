"""Experience collected by several workers for one learner: the collection part of the seeds'
distributed scheme (``distributed.DistributedRun`` drives it; ``async_collection`` when the
collectors never wait).

    learner: the algorithm (observe, update) and its evaluations
    collector c = 0 .. C-1: a copy of the policy and k envs, the sub-envs c*k .. c*k+k-1 of
        the run's C*k (seeded as those sub-envs of one process's run: seed + c*k + j)

    every round (synchronous):
        the learner sends its weights and its acting state (generator, counters, noise) to
        every collector
        each collector steps its envs for the round: it acts on a batch of C*k observations
            (its own rows, zeros elsewhere) from that state, so every step draws the noise of
            all C*k envs, as one process would, and its rows get exactly that process's actions
        the learner takes on the acting state the collectors ended in (all the same) and
        observes their steps joined along the env axis

So C collectors of k envs train exactly as one process with C*k envs (tested): acting on the
whole batch costs each collector C times one process's share of forward passes, small next to
stepping its envs. A run that normalizes observations or rewards steps in lock-step with the
learner's statistics instead (``normalized_collection``: ``begin``, ``step``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

import numpy as np
import torch

import agents
from agents.api import Acted, Algorithm, ConfigError, Transitions
from agents.env_state import load_vector_env_state, vector_env_state
from agents.envs import env_spec, finished_episodes, make_vector_env, normalize_observation, true_next_obs
from benchmark.config import RunSpec, check_distributable
from benchmark.distributed_config import COLLECTOR_CPUS
from benchmark.training.checkpoint import rng_state, set_rng_state
from benchmark.training.collected import FIELDS, Collected, RawStep


def collector_config(spec: RunSpec) -> Any:
    """The run's configuration as a collector's policy copy needs it; what collection cannot
    split is refused here, in one line, before anything is built."""
    config = agents.resolve_config(spec.algo, spec.hyperparameters)
    check_distributable(spec.algo, config.to_dict(), {"collectors": 1})
    cls = agents.algorithm_class(spec.algo)
    assert issubclass(cls, Algorithm)  # check_distributable refused meta-learners
    return cls.replica_config(config)


class Collector:
    """One collection worker of a run: its envs and a policy copy (run it in-process, or as a
    Ray actor: ``RayCollector``)."""

    def __init__(self, spec: RunSpec, index: int, collectors: int, restarts: int = 0):
        config = collector_config(spec)
        total = int(config.num_envs)
        if collectors < 1 or not 0 <= index < collectors:
            raise ConfigError(f"collector {index} of {collectors}: there must be at least one, indexed from 0")
        if total % collectors:
            raise ConfigError(f"num_envs {total} must split evenly over {collectors} collectors")
        self.index, self.collectors, self.total = index, collectors, total
        self.seed, self.restarts, self.independent = spec.seed, restarts, False
        self.per_collector = total // collectors
        self.rows = slice(index * self.per_collector, (index + 1) * self.per_collector)
        # its initial weights are replaced by the learner's: building it must not move the
        # global RNGs of the process it runs in (an inline collector shares the learner's)
        global_rngs = rng_state()
        try:
            algo = agents.make(spec.algo, env_spec(spec.env), config, total_steps=spec.budget.total_steps, seed=spec.seed)
            assert isinstance(algo, Algorithm)  # collector_config refused meta-learners
            self.algo = algo
            self.envs = make_vector_env(spec.env, self.per_collector, gamma=getattr(config, "gamma", 0.99))
            # a replacement's envs start new episodes from seeds no earlier one of its envs used
            self.obs, _ = self.envs.reset(seed=spec.seed + index * self.per_collector + restarts * total)
        finally:
            set_rng_state(global_rngs)

    def collect(
        self,
        weights: dict[str, dict[str, torch.Tensor]],
        acting_state: dict[str, Any],
        num_steps: int,
        independent: bool = False,
        priorities: bool = False,
        statistics: dict[str, Any] | None = None,
    ) -> Collected:
        """``num_steps`` steps of this collector's envs with the learner's ``weights``, acting
        from its ``acting_state`` (``Algorithm.acting_state``). ``independent`` (the
        asynchronous scheme): only the learner's counters are taken on, and advanced here as
        the run's envs step; draws come from this collector's own stream, acting on its own
        rows. ``priorities``: each transition's initial priority for prioritized replay, its
        one-step TD error under these weights (Ape-X's actors compute them). ``statistics``
        (asynchronous, normalized): the learner's observation statistics when it sent the
        weights, which normalize what it acts on and returns, unchanged through the rollout;
        the raw observations and rewards come back too (``Collected.raw``)."""
        started = time.perf_counter()
        algo = self.algo
        algo.set_weights(weights)
        if independent and not self.independent:
            self.independent = True  # its own stream from here on, apart from every other collector's
            stream = np.random.SeedSequence([self.seed, ASYNC_STREAM, self.index, self.restarts])
            algo.generator.manual_seed(int(stream.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)))
        if self.independent:
            acting_state = {**acting_state, "generator": algo.generator.get_state()}
        algo.load_acting_state(acting_state)
        columns: dict[str, list[Any]] = {name: [] for name in (*FIELDS, "env_actions")}
        extras: dict[str, list[torch.Tensor]] = {}
        episodes: list[tuple[float, int, int]] = []
        padded = np.zeros((self.total, *self.obs.shape[1:]), dtype=np.float32)
        raw: dict[str, list[np.ndarray]] = {"obs": [], "rewards": []}

        def seen(obs: np.ndarray) -> np.ndarray:
            if statistics is None or statistics.get("mean") is None:
                return obs
            return normalize_observation(obs, statistics["mean"], statistics["var"], statistics["clip"], statistics["epsilon"])

        for step in range(num_steps):
            if self.independent:
                acted = algo.behavior_act(torch.as_tensor(seen(self.obs), dtype=torch.float32))
                rows = slice(None)
            else:
                padded[self.rows] = self.obs  # the other collectors' rows stay zeros
                acted = algo.behavior_act(torch.as_tensor(padded))
                rows = self.rows
            env_actions = acted.env_actions[rows]
            next_obs, rewards, terminated, truncated, infos = self.envs.step(env_actions)
            for name, value in (
                ("obs", torch.as_tensor(seen(self.obs), dtype=torch.float32)),
                ("actions", acted.actions[rows]),
                ("env_actions", env_actions),
                ("rewards", torch.as_tensor(rewards, dtype=torch.float32)),
                ("next_obs", torch.as_tensor(seen(true_next_obs(next_obs, infos)), dtype=torch.float32)),
                ("terminated", torch.as_tensor(terminated)),
                ("truncated", torch.as_tensor(truncated)),
            ):
                columns[name].append(value)
            for name, value in acted.extras.items():
                extras.setdefault(name, []).append(value[rows])
            episodes += [(episode_return, length, step) for episode_return, length in finished_episodes(infos)]
            if statistics is not None:
                raw["obs"].append(next_obs)
                raw["rewards"].append(rewards)
            self.obs = next_obs
            if self.independent and "env_steps" in acting_state:  # the run's envs all step meanwhile
                now = algo.acting_state()
                algo.load_acting_state({**now, "env_steps": now["env_steps"] + self.total})
        fields = {name: torch.stack(columns[name]) for name in FIELDS}
        return Collected(
            fields=fields,
            env_actions=np.stack(columns["env_actions"]),
            extras={name: torch.stack(values) for name, values in extras.items()},
            episodes=episodes,
            acting_state=algo.acting_state(),
            seconds=time.perf_counter() - started,
            priorities=self._td_errors(fields) if priorities else None,
            collector=self.index,
            raw={name: np.stack(values) for name, values in raw.items()} if statistics is not None else {},
        )

    # -- lock-step rounds (a run that normalizes: ``normalized_collection``) -------------------

    def raw_obs(self) -> np.ndarray:
        """Its envs' observations now, as the envs gave them (k, ...)."""
        return np.asarray(self.obs)

    def begin(self, weights: dict[str, dict[str, torch.Tensor]], acting_state: dict[str, Any], past_obs: tuple[np.ndarray, ...] = ()) -> None:
        """A lock-step round: the learner's weights and acting state taken on; a replacement
        that joins a round late first acts on the round's ``past_obs`` (the run's C*k
        observations at each step before), so that its draws catch up with the others'."""
        self.algo.set_weights(weights)
        self.algo.load_acting_state(acting_state)
        for obs in past_obs:
            self.algo.behavior_act(torch.as_tensor(obs))

    def step(self, obs: np.ndarray) -> RawStep:
        """One step of its envs, acting on the run's C*k observations ``obs`` (normalized by
        the learner, float32) as one process acts on them; what its envs returned, raw."""
        started = time.perf_counter()
        acted = self.algo.behavior_act(torch.as_tensor(obs))
        rows = self.rows
        env_actions = acted.env_actions[rows]
        next_obs, rewards, terminated, truncated, infos = self.envs.step(env_actions)
        self.obs = next_obs
        final = infos.get("_final_obs")
        return RawStep(
            actions=acted.actions[rows],
            env_actions=np.asarray(env_actions),
            extras={name: value[rows] for name, value in acted.extras.items()},
            next_obs=next_obs,
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            final_obs=(infos["final_obs"], final) if final is not None and final.any() else None,
            episodes=finished_episodes(infos),
            seconds=time.perf_counter() - started,
        )

    def acting_state(self) -> dict[str, Any]:
        """Its policy copy's acting state (after a lock-step round: the one the learner takes on)."""
        return self.algo.acting_state()

    def _td_errors(self, fields: dict[str, torch.Tensor]) -> torch.Tensor:
        """|one-step TD error| (T, k) of a chunk under the current weights."""
        steps, envs = fields["rewards"].shape
        flat = {name: value.flatten(0, 1) for name, value in fields.items()}
        transitions = Transitions(flat["obs"], Acted(flat["actions"], None), flat["rewards"], flat["next_obs"], flat["terminated"], flat["truncated"])
        return self.algo.initial_priorities(transitions).reshape(steps, envs)

    def ready(self) -> int:
        """Its index, once it is built (a Ray actor builds in the background)."""
        return self.index

    def state(self) -> dict[str, Any]:
        """Its envs' state and observation (for a checkpoint); ``envs`` is None where the envs'
        state cannot be captured."""
        return {"envs": vector_env_state(self.envs), "obs": torch.as_tensor(self.obs)}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a ``state``; envs whose state was not captured start new episodes."""
        if state["envs"] is not None:
            load_vector_env_state(self.envs, state["envs"])
            self.obs = state["obs"].numpy()

    def close(self) -> None:
        self.envs.close()


def same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[key], b[key]) for key in a)
    return bool(a == b)


def observe_rollout(algo: Algorithm, collected: list[Collected], synchronous: bool = True) -> None:
    """The learner takes on the acting state the collectors ended in (the draws of the whole
    rollout are made), then observes their rollouts step by step, joined (as one process
    observes after acting: an episode's end resets its exploration noise). Asynchronous
    collectors draw from streams of their own: the learner keeps its state."""
    if synchronous:
        states = [part.acting_state for part in collected]
        if any(not same_state(state, states[0]) for state in states):
            raise RuntimeError("the collectors' acting states diverged: they did not act from one state")
        algo.load_acting_state(states[0])
    # the collectors' envs side by side, in collector order: (T, C*k, ...)
    fields = {name: torch.cat([part.fields[name] for part in collected], dim=1) for name in FIELDS}
    env_actions = np.concatenate([part.env_actions for part in collected], axis=1)
    extras = {name: torch.cat([part.extras[name] for part in collected], dim=1) for name in collected[0].extras}
    given = [part.priorities for part in collected if part.priorities is not None]
    priorities = torch.cat(given, dim=1) if len(given) == len(collected) else None
    for t in range(collected[0].num_steps):
        algo.observe(
            Transitions(
                obs=fields["obs"][t],
                acted=Acted(fields["actions"][t], env_actions[t], None, {name: value[t] for name, value in extras.items()}),
                rewards=fields["rewards"][t],
                next_obs=fields["next_obs"][t],
                terminated=fields["terminated"][t],
                truncated=fields["truncated"][t],
            )
        )
        if priorities is not None:  # the collectors' initial priorities replace the buffer's maximum
            algo.prioritize_newest(priorities[t])


class CollectorHandle(Protocol):
    """A collector as the learner calls it: in this process, or a Ray actor behind ``remote``."""

    def collect(
        self,
        weights: dict[str, dict[str, torch.Tensor]],
        acting_state: dict[str, Any],
        num_steps: int,
        independent: bool = False,
        priorities: bool = False,
        statistics: dict[str, Any] | None = None,
    ) -> Collected: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def raw_obs(self) -> np.ndarray: ...

    def begin(self, weights: dict[str, dict[str, torch.Tensor]], acting_state: dict[str, Any], past_obs: tuple[np.ndarray, ...] = ()) -> None: ...

    def step(self, obs: np.ndarray) -> RawStep: ...

    def acting_state(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class CollectorLost(RuntimeError):
    """A collector's process died (its actor is gone); the group replaces it."""


class RayCollector:
    """A ``Collector`` running as a Ray actor (its own process, on any node of the cluster)."""

    def __init__(self, spec: RunSpec, index: int, collectors: int, restarts: int = 0):
        import ray

        self._ray = ray
        cpus = float(os.environ.get(COLLECTOR_CPUS, "1"))
        self.actor: Any = ray.remote(Collector).options(num_cpus=cpus).remote(spec, index, collectors, restarts)

    def _get(self, reference: Any) -> Any:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        try:
            return self._ray.get(reference)
        except (ActorDiedError, ActorUnavailableError, RayActorError) as error:
            raise CollectorLost(str(error).splitlines()[0] if str(error) else type(error).__name__) from error

    def collect(
        self,
        weights: dict[str, dict[str, torch.Tensor]],
        acting_state: dict[str, Any],
        num_steps: int,
        independent: bool = False,
        priorities: bool = False,
        statistics: dict[str, Any] | None = None,
    ) -> Collected:
        collected: Collected = self._get(self.actor.collect.remote(weights, acting_state, num_steps, independent, priorities, statistics))
        return collected

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = self._get(self.actor.state.remote())
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        self._get(self.actor.load_state.remote(state))

    def raw_obs(self) -> np.ndarray:
        obs: np.ndarray = self._get(self.actor.raw_obs.remote())
        return obs

    def begin(self, weights: dict[str, dict[str, torch.Tensor]], acting_state: dict[str, Any], past_obs: tuple[np.ndarray, ...] = ()) -> None:
        self._get(self.actor.begin.remote(weights, acting_state, past_obs))

    def step(self, obs: np.ndarray) -> RawStep:
        done: RawStep = self._get(self.actor.step.remote(obs))
        return done

    def acting_state(self) -> dict[str, Any]:
        state: dict[str, Any] = self._get(self.actor.acting_state.remote())
        return state

    def close(self) -> None:
        try:
            self._ray.get(self.actor.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - a dead actor has nothing left to close
            pass
        self._ray.kill(self.actor)


ASYNC_STREAM = 29
"""Mixed into an asynchronous collector's generator seed: its stream is none of the learner's."""

READY_TIMEOUT = 120.0
"""Seconds collectors may take to start (import torch, build envs) before the run says why not."""


class CollectorGroup:
    """The run's C collectors (Ray actors, or in this process with ``inline``): one
    synchronous round of collection, their state for checkpoints, and a replacement for one
    whose process died (its round is collected again by the replacement, whose envs start new
    episodes: the episodes it had in progress are lost, and the run no longer equals one
    process from there)."""

    def __init__(self, spec: RunSpec, collectors: int, inline: bool = False):
        self.spec, self.count, self.inline = spec, collectors, inline
        self.per_collector = int(spec.hyperparameters.get("num_envs", 1)) // collectors
        self.restarts = 0
        self.handles: list[CollectorHandle] = []
        try:
            for index in range(collectors):
                self.handles.append(self._start(index))
            if not inline:  # they build at once; the run's clock starts once all are ready
                self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, handles: list[Any] | None = None) -> None:
        """Wait for Ray actors to be built; a cluster without a free CPU for one never
        schedules it: that is said in one line after ``READY_TIMEOUT`` seconds."""
        import ray
        from ray.exceptions import GetTimeoutError

        waiting: list[Any] = list(self.handles if handles is None else handles)
        try:
            ray.get([handle.actor.ready.remote() for handle in waiting], timeout=READY_TIMEOUT)
        except GetTimeoutError:
            free = ray.available_resources().get("CPU", 0)
            raise RuntimeError(
                f"{self.spec.label}: {len(waiting)} collector actor(s) not started after {READY_TIMEOUT:.0f} s; "
                f"the Ray cluster has {free:g} free CPU(s) and each collector takes one (start Ray with more CPUs, or fewer collectors)"
            ) from None

    def _start(self, index: int) -> CollectorHandle:
        if self.inline:
            return Collector(self.spec, index, self.count, self.restarts)
        return RayCollector(self.spec, index, self.count, self.restarts)

    def collect(self, algo: Algorithm, num_steps: int) -> list[Collected]:
        """Every collector's next ``num_steps`` steps with ``algo``'s weights and acting state
        (sent to all first, then awaited: they step their envs at once)."""
        weights, acting_state = algo.get_weights(), algo.acting_state()
        if self.inline:
            return [handle.collect(weights, acting_state, num_steps) for handle in self.handles]
        references = [handle.actor.collect.remote(weights, acting_state, num_steps) for handle in self.handles]  # type: ignore[attr-defined]
        collected: list[Collected] = []
        for index, reference in enumerate(references):
            try:
                collected.append(self.handles[index]._get(reference))  # type: ignore[attr-defined]
            except CollectorLost:
                collected.append(self.replace(index).collect(weights, acting_state, num_steps))
        return collected

    def replace(self, index: int) -> CollectorHandle:
        """A new collector in place of the dead one at ``index``."""
        self.restarts += 1
        try:
            self.handles[index].close()
        except Exception:  # noqa: BLE001 - it is dead already
            pass
        self.handles[index] = self._start(index)
        if not self.inline:
            self._wait_ready([self.handles[index]])
        return self.handles[index]

    def state(self) -> list[dict[str, Any]]:
        return [handle.state() for handle in self.handles]

    def load_state(self, states: list[dict[str, Any]]) -> None:
        if len(states) != len(self.handles):
            raise ValueError(f"the checkpoint holds {len(states)} collectors' state, the run has {len(self.handles)}")
        for handle, state in zip(self.handles, states, strict=True):
            handle.load_state(state)

    def close(self) -> None:
        for handle in self.handles:
            handle.close()
        self.handles = []
