"""One throughput measurement, run in a fresh process by ``benchmark.perf.throughput``.

    python -m benchmark.perf.worker '<job as JSON>' <result.json>

A job names what to time (``kind``) and how: ``ours`` trains with ``benchmark.training.loop.run``,
``sb3`` with Stable-Baselines3's ``learn``, ``sbx`` with Stable Baselines Jax's (its XLA
compilation not timed), all from the same setting; ``env`` steps the
environment alone with pre-sampled random actions; ``floor`` runs the update's forward and
backward passes in a bare loop at the same network sizes; ``memory`` measures a full replay
buffer; ``seeds`` trains several seeds of one setting in this process as one batched model
(one seed: alone), after waiting at a barrier for the other processes of its measurement.
Construction is never timed, only training. The result holds the rate, the process's peak
resident memory and, for ``ours`` with ``profile``, where the time went.
"""

from __future__ import annotations

import contextlib
import copy
import cProfile
import dataclasses
import gc
import io
import json
import pstats
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmark.perf.peers import run_sb3, run_sbx

if TYPE_CHECKING:
    from agents.algos.sac import SAC


def peak_rss_mb() -> float:
    """The process's peak resident set size in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


# -- our training loop ---------------------------------------------------------------------


class SectionTimers:
    """Exclusive wall time per category of nested calls: a call's time minus its timed children's."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._children: list[float] = []
        self.enabled = True

    def wrap(self, category: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return function(*args, **kwargs)
            self._children.append(0.0)
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                children = self._children.pop()
                self.seconds[category] += elapsed - children
                self.calls[category] += 1
                if self._children:
                    self._children[-1] += elapsed

        return timed

    def wrap_iterator(self, category: str, make: Callable[..., Any]) -> Callable[..., Any]:
        """Time every ``next`` of the iterators ``make`` returns (minibatch generators)."""

        def timed_make(*args: Any, **kwargs: Any) -> Any:
            iterator = iter(make(*args, **kwargs))
            step = self.wrap(category, lambda: next(iterator, _END))
            while (item := step()) is not _END:
                yield item

        return timed_make


_END = object()


def _timing_hooks(timers: SectionTimers) -> Any:
    """The training loop's hooks that route its parts through ``timers``: the training envs'
    ``step``, the algorithm's acting, observing, updating and its buffer's insert and sample,
    the loop's bookkeeping as logging; evaluations are not timed."""
    from benchmark.training.hooks import LoopHooks

    class TimingHooks(LoopHooks):
        def train_envs(self, envs: Any) -> Any:
            envs.step = timers.wrap("env", envs.step)
            return envs

        def algorithm(self, algo: Any) -> Any:
            algo.behavior_act = timers.wrap("acting", algo.behavior_act)
            algo.observe = timers.wrap("buffer", algo.observe)
            algo.update = timers.wrap("update", algo.update)
            buffer = getattr(algo, "buffer", None)
            if buffer is not None:
                buffer.add = timers.wrap("buffer", buffer.add)
                buffer.sample = timers.wrap("buffer", buffer.sample)
            storage = getattr(algo, "storage", None)
            if storage is not None:
                storage.insert = timers.wrap("buffer", storage.insert)
                storage.minibatches = timers.wrap_iterator("buffer", storage.minibatches)
            return algo

        def logging(self, function: Any) -> Any:
            return timers.wrap("logging", function)

        @contextlib.contextmanager
        def evaluating(self) -> Iterator[None]:
            timers.enabled = False  # evaluation is not training time
            try:
                yield
            finally:
                timers.enabled = True

    return TimingHooks()


class _TimedTracker:
    """A tracker that keeps metrics in memory, its calls timed as logging."""

    def __init__(self, timers: SectionTimers) -> None:
        from benchmark.training.results import NullTracker

        self._tracker = NullTracker()
        self.log_metrics = timers.wrap("logging", self._tracker.log_metrics)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def flush(self) -> None:
        pass


def run_ours(job: dict[str, Any]) -> dict[str, Any]:
    """Train our implementation for ``job["steps"]`` env steps (no evaluation until the end;
    its time is not counted). With ``profile`` the loop's parts are timed (microseconds per
    env step); with ``functions`` cProfile lists the functions with the most own time."""
    import agents
    from benchmark.config import Budget, RunSpec
    from benchmark.training import loop as training_loop
    from benchmark.training.hooks import NO_HOOKS

    timers = SectionTimers() if job.get("profile") else None
    hooks = _timing_hooks(timers) if timers is not None else NO_HOOKS
    hyperparameters = agents.resolve_config(job["algo"], job["hyperparameters"]).to_dict()
    steps = int(job["steps"])
    spec = RunSpec(
        "perf",
        job["algo"],
        job["env_id"],
        int(job["seed"]),
        hyperparameters,
        Budget(total_steps=steps, eval_every=steps * 10, eval_episodes=1),
        device=job.get("device", "cpu"),
        torch_threads=int(job["threads"]),
    )
    tracker = _TimedTracker(timers) if timers is not None else None
    profiler = cProfile.Profile() if job.get("functions") else None
    if profiler is not None:
        profiler.enable()
    result = training_loop.run(spec, tracker=tracker, hooks=hooks)
    if profiler is not None:
        profiler.disable()
    train_seconds = steps / result.steps_per_second
    out: dict[str, Any] = {"steps_per_second": result.steps_per_second, "seconds": train_seconds}
    if profiler is not None:
        out["top_functions"] = _top_functions(profiler)
    if timers is not None:
        sections = dict(timers.seconds)
        sections["other"] = max(train_seconds - sum(sections.values()), 0.0)
        out["profile"] = {
            "microseconds_per_step": {name: 1e6 * seconds / steps for name, seconds in sections.items()},
            "calls": dict(timers.calls),
        }
    return out


def _top_functions(profiler: cProfile.Profile, count: int = 15) -> str:
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(count)
    lines = stream.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("ncalls")), 0)
    return "\n".join(line for line in lines[start:] if line.strip())


def run_seeds_job(job: dict[str, Any]) -> dict[str, Any]:
    """Train ``job["seeds"]`` of one setting for ``job["steps"]`` env steps each: as one batched
    model when there are several (``benchmark.training.loop.run_seeds``), alone otherwise. With
    ``barrier`` (a directory) the process says it is ready, then waits for the file ``go``, so
    that the processes of one measurement train at the same time. The rate is the sum over the
    seeds of each seed's env steps per second of training."""
    import agents
    from benchmark.config import Budget, RunSpec
    from benchmark.training import loop as training_loop

    hyperparameters = agents.resolve_config(job["algo"], job["hyperparameters"]).to_dict()
    steps = int(job["steps"])
    specs = [
        RunSpec(
            "perf",
            job["algo"],
            job["env_id"],
            int(seed),
            hyperparameters,
            Budget(total_steps=steps, eval_every=steps * 10, eval_episodes=1),
            device=job.get("device", "cpu"),
            torch_threads=int(job["threads"]),
            cuda_graphs=bool(job.get("cuda_graphs", False)),
        )
        for seed in job["seeds"]
    ]
    if job.get("barrier"):
        barrier = Path(job["barrier"])
        (barrier / f"ready-{job['index']}").touch()
        while not (barrier / "go").exists():
            time.sleep(0.01)
    if len(specs) == 1:
        results: list[Any] = [training_loop.run(specs[0])]
    else:
        results = training_loop.run_seeds([training_loop.SeedJob(spec) for spec in specs])
    for result in results:
        if isinstance(result, BaseException):
            raise result
    rates = [result.steps_per_second for result in results]
    return {"steps_per_second": sum(rates), "per_seed_steps_per_second": rates, "seconds": max(steps / rate for rate in rates)}


# -- the bounds: the env alone, the update alone --------------------------------------------


def run_env(job: dict[str, Any]) -> dict[str, Any]:
    """Step one env with pre-sampled uniform random actions, resetting at episode ends."""
    import gymnasium as gym

    env = gym.make(job["env_id"])
    env.action_space.seed(int(job["seed"]))
    steps = int(job["steps"])
    actions = [env.action_space.sample() for _ in range(steps)]
    env.reset(seed=int(job["seed"]))
    started = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    seconds = time.perf_counter() - started
    return {"steps_per_second": steps / seconds, "seconds": seconds}


def _mlp(sizes: list[int]) -> nn.Module:
    """Linear and ReLU layers as our networks run them (``agents.nets.mlp.MLP``: the CPU kernel
    of ``agents.nets.gemm``), so that the floor prices the same products."""
    from agents.nets.mlp import MLP

    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return MLP(*layers[:-1])


class _TwinCritics:
    """The floor's two critics on (obs, action) -> (2, B): one network after the other, or
    ``stacked`` as one (``agents.nets.stacked.StackedMLP``: each layer's two weights in one
    tensor, the inputs shared), as our critic ensembles run."""

    def __init__(self, networks: list[nn.Module], stacked: bool):
        from agents.nets.stacked import StackedMLP

        self.networks, self.stack = networks, StackedMLP(networks) if stacked else None
        self.parameters: list[torch.Tensor] = list(self.stack.parameters()) if self.stack is not None else [p for n in networks for p in n.parameters()]

    def __call__(self, states: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
        inputs = torch.cat([states, acts], dim=-1)
        if self.stack is not None:
            return self.stack(inputs.expand(2, *inputs.shape)).squeeze(-1)
        return torch.stack([network(inputs).squeeze(-1) for network in self.networks])

    def first(self, states: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
        inputs = torch.cat([states, acts], dim=-1)
        if self.stack is not None:
            return self.stack(inputs.unsqueeze(0), every=2)[0].squeeze(-1)
        return self.networks[0](inputs).squeeze(-1)


def run_floor(job: dict[str, Any]) -> dict[str, Any]:
    """Updates per second of a bare actor-critic loop at the case's sizes: a random batch
    prepared once, the algorithm's forward passes, gradients of only what each loss trains,
    fused Adam and foreach target updates; no buffer, env, logging or bookkeeping. With
    ``stacked`` the twin critics (and their targets) are one stacked network."""
    torch.set_num_threads(int(job["threads"]))
    torch.manual_seed(int(job["seed"]))
    kind, obs_dim, action_dim = job["algo"], int(job["obs_dim"]), int(job["action_dim"])
    hidden, batch_size, stacked = list(job["hidden_sizes"]), int(job["batch_size"]), bool(job.get("stacked"))
    actor = _mlp([obs_dim, *hidden, action_dim * (2 if kind == "sac" else 1)])
    networks = [_mlp([obs_dim + action_dim, *hidden, 1]) for _ in range(2)]
    target_networks = copy.deepcopy(networks)
    critics, critic_targets = _TwinCritics(networks, stacked), _TwinCritics(target_networks, stacked)
    actor_target = copy.deepcopy(actor)
    actor_parameters: list[torch.Tensor] = list(actor.parameters())
    critic_parameters, target_parameters = critics.parameters, critic_targets.parameters
    for parameter in target_parameters:
        parameter.requires_grad_(False)
    actor_optimizer = torch.optim.Adam(actor_parameters, lr=3e-4, fused=True)
    critic_optimizer = torch.optim.Adam(critic_parameters, lr=3e-4, fused=True)
    log_alpha = torch.zeros((), requires_grad=True)
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=3e-4, fused=True)
    obs, next_obs = torch.randn(batch_size, obs_dim), torch.randn(batch_size, obs_dim)
    actions, rewards = torch.rand(batch_size, action_dim) * 2 - 1, torch.randn(batch_size)
    not_done = torch.ones(batch_size)

    def q_min(twins: _TwinCritics, states: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
        return twins(states, acts).min(dim=0).values

    def squashed_sample(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = actor(states).chunk(2, dim=-1)
        log_std = log_std.clamp(-20.0, 2.0)
        noise = torch.randn_like(mean)
        pre_tanh = mean + log_std.exp() * noise
        log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
        log_prob = log_prob - (2.0 * (np.log(2.0) - pre_tanh - F.softplus(-2.0 * pre_tanh))).sum(-1)
        return torch.tanh(pre_tanh), log_prob

    def critic_step(targets: torch.Tensor) -> None:
        loss = ((critics(obs, actions) - targets) ** 2).mean(dim=1).sum()
        for parameter, gradient in zip(critic_parameters, torch.autograd.grad(loss, critic_parameters)):
            parameter.grad = gradient
        critic_optimizer.step()

    def sac_update(step: int) -> None:
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            next_actions, next_log_probs = squashed_sample(next_obs)
            targets = rewards + 0.99 * not_done * (q_min(critic_targets, next_obs, next_actions) - alpha * next_log_probs)
        critic_step(targets)
        new_actions, log_probs = squashed_sample(obs)
        actor_loss = (alpha * log_probs - q_min(critics, obs, new_actions)).mean()
        for parameter, gradient in zip(actor_parameters, torch.autograd.grad(actor_loss, actor_parameters)):
            parameter.grad = gradient
        actor_optimizer.step()
        alpha_loss = -(log_alpha * (log_probs.detach() - action_dim)).mean()
        (log_alpha.grad,) = torch.autograd.grad(alpha_loss, [log_alpha])
        alpha_optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(target_parameters, critic_parameters, 0.005)

    def td3_update(step: int) -> None:
        with torch.no_grad():
            noise = (torch.randn(batch_size, action_dim) * 0.2).clamp(-0.5, 0.5)
            next_actions = (torch.tanh(actor_target(next_obs)) + noise).clamp(-1.0, 1.0)
            targets = rewards + 0.99 * not_done * q_min(critic_targets, next_obs, next_actions)
        critic_step(targets)
        if step % 2 == 0:
            actor_loss = -critics.first(obs, torch.tanh(actor(obs))).mean()
            for parameter, gradient in zip(actor_parameters, torch.autograd.grad(actor_loss, actor_parameters)):
                parameter.grad = gradient
            actor_optimizer.step()
            with torch.no_grad():
                torch._foreach_lerp_(target_parameters, critic_parameters, 0.005)
                torch._foreach_lerp_(list(actor_target.parameters()), actor_parameters, 0.005)

    update = sac_update if kind == "sac" else td3_update
    for step in range(20):  # warm-up: allocator, optimizer state
        update(step)
    updates = int(job["steps"])
    started = time.perf_counter()
    for step in range(updates):
        update(step)
    seconds = time.perf_counter() - started
    return {"steps_per_second": updates / seconds, "seconds": seconds}


# -- memory ---------------------------------------------------------------------------------


def run_memory(job: dict[str, Any]) -> dict[str, Any]:
    """Bytes of a full replay buffer of ``capacity`` transitions of ``env_id`` (as SAC builds
    it), against the raw bytes of its fields: obs, action, reward, next obs, terminated and
    truncated at their stored dtypes."""
    import agents
    from agents.envs import env_spec

    spec = env_spec(job["env_id"])
    capacity = int(job["capacity"])
    algo = cast("SAC", agents.make("sac", spec, {"buffer_size": 1_000, "hidden_sizes": (8,)}, total_steps=capacity, seed=0))
    algo.config = dataclasses.replace(algo.config, buffer_size=capacity)
    before = current_rss_mb()  # imports and the algorithm are in place: only the buffer is new
    buffer = algo.make_buffer()
    for tensor in buffer.storage.values():  # touch every page, as a filled buffer would
        tensor.fill_(1)
    after = current_rss_mb()
    obs_dim, action_dim = int(np.prod(spec.observation_shape)), spec.num_actions
    raw = capacity * (4 * (2 * obs_dim + action_dim + 1) + 2)
    owned = sum(tensor.numel() * tensor.element_size() for tensor in _buffer_tensors(buffer))
    return {
        "capacity": capacity,
        "raw_bytes": raw,
        "tensor_bytes": owned,
        "rss_increase_bytes": int((after - before) * 2**20),
        "fields": {name: str(tensor.dtype).replace("torch.", "") + str(tuple(tensor.shape)) for name, tensor in buffer.storage.items()},
    }


def _buffer_tensors(buffer: Any) -> list[torch.Tensor]:
    """Every tensor a buffer owns (its storage, bookkeeping and sampler), each counted once."""
    seen, found = set(), []
    for value in [*buffer.storage.values(), *vars(buffer).values(), *vars(buffer.sampler).values()]:
        if isinstance(value, torch.Tensor) and id(value) not in seen:
            seen.add(id(value))
            found.append(value)
    return found


KINDS = {
    "ours": run_ours,
    "sb3": run_sb3,
    "sbx": run_sbx,
    "env": run_env,
    "floor": run_floor,
    "memory": run_memory,
    "seeds": run_seeds_job,
}


def pin_to_cores(count: int) -> list[int]:
    """Keep this process (and the threads it starts) on ``count`` of the cores it may use: a
    measurement's "one thread" must mean one core for every library alike (JAX, for one, runs
    its computations on threads of its own beside the Python thread). The cores kept."""
    import os

    if not hasattr(os, "sched_setaffinity"):
        return []
    cores = sorted(os.sched_getaffinity(0))[: max(count, 1)]
    os.sched_setaffinity(0, cores)
    return cores


def main(argv: list[str]) -> int:
    job, output = json.loads(argv[0]), Path(argv[1])
    cores = pin_to_cores(int(job.get("threads", 1))) if job["kind"] in ("ours", "sb3", "sbx", "env", "floor") else []
    result = KINDS[job["kind"]](job)
    result["cores"] = cores
    result["peak_rss_mb"] = peak_rss_mb()
    output.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    gc.freeze()  # the result is written: the exit need not collect torch's heap (seconds)
    sys.exit(code)
