"""An off-policy seed batch's gradient steps captured as CUDA graphs and replayed.

On a GPU a gradient step of SAC or TD3 is a few hundred small kernels (forward, backward, the
fused Adam steps, the target networks' move), and launching them from Python costs more than
running them. Captured once (``torch.cuda.CUDAGraph``), the step replays as one launch:

    for each gradient step:
        key = (the update's phase, the learning rates)   # what Python decides inside the step
        fewer than WARMUP_STEPS eager steps with this key so far:
            step eagerly (on a side stream), recording the order and shapes of the noise drawn
        else:
            (once) capture the step on static buffers: the batch, one buffer per noise draw
            copy the sampled batch in; draw the recorded noise from each seed's generator, in
            the order the eager step draws it, and copy it in; replay; read the logs

A replayed step therefore runs the eager step's kernels on the eager step's numbers. What the
step changes in Python (the members' update counts, the stacked optimizers' step counts) is
measured around the capture and applied again at each replay. Python control flow that varies
between steps selects the graph: the update's phase (``OffPolicyAlgorithm.update_phase``: TD3's
delayed actor and target steps) and the learning rates, which the fused Adam kernels take as
arguments fixed at capture.

``emulate`` runs the same bookkeeping without CUDA (a "replay" calls the step again on the
static buffers), so the buffers, the noise order and the Python state are tested on a CPU.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agents.algos.seeds import stacked_noise
from agents.batches import ReplayBatch
from agents.errors import ConfigError

if TYPE_CHECKING:
    from agents.algos.offpolicy import OffPolicySeedBatch

WARMUP_STEPS = 3
"""Eager steps of each key before its capture: the optimizers' state exists and the allocator
and libraries have warmed up (torch's documentation asks for a few on a side stream)."""
MAX_GRAPHS = 4
KEYS_REMEMBERED = 16
"""Keys whose eager steps are counted toward a capture (the most recent)."""
"""Graphs kept (the most recently replayed): each holds a private memory pool, and a learning
rate that a schedule moves every few steps would otherwise pile them up."""

Draw = Callable[..., torch.Tensor]


@dataclass
class _Graph:
    """One captured step: its static inputs, its noise tape and its outputs."""

    batch: ReplayBatch
    tape: list[tuple[Draw, tuple[int, ...]]]
    noise: torch.Tensor
    """Every draw of the tape, flat, on the device; the step reads views of it."""
    staging: torch.Tensor
    """The same on the host (pinned on a GPU machine), filled before each replay."""
    copied: Any
    """A CUDA event recorded after the staging buffer's copy (None when emulated)."""
    logs: dict[str, torch.Tensor]
    td_errors: torch.Tensor | None
    python_effects: _Effects | None
    graph: Any = None  # torch.cuda.CUDAGraph, or None when emulated
    body: Callable[[], tuple[dict[str, torch.Tensor], torch.Tensor | None]] | None = None


@dataclass
class _Effects:
    """What one step changes in Python: each member's update count and each stacked
    optimizer's per-seed step counts."""

    updates: list[int]
    optimizer_steps: dict[str, torch.Tensor]

    def minus(self, before: _Effects) -> _Effects:
        """What changed since ``before``."""
        return _Effects(
            [after - earlier for after, earlier in zip(self.updates, before.updates, strict=True)],
            {name: steps - before.optimizer_steps[name] for name, steps in self.optimizer_steps.items()},
        )


class CapturedSteps:
    """The gradient steps of ``batch`` (an ``OffPolicySeedBatch`` on a CUDA device, or any
    device with ``emulate``), as described in the module docstring."""

    def __init__(self, batch: OffPolicySeedBatch, emulate: bool = False):
        device = torch.device(batch.device)
        if not emulate and device.type != "cuda":
            raise ConfigError(f"cuda_graphs: CUDA graphs need a GPU, and this run trains on {device}")
        self.batch, self.emulate, self.device = batch, emulate, device
        self.graphs: OrderedDict[Hashable, _Graph] = OrderedDict()
        # per key not yet captured: eager steps taken and the noise tape (the latest keys only:
        # a schedule that moves a rate every step makes a new key every step)
        self.eager_steps: OrderedDict[Hashable, int] = OrderedDict()
        self.tapes: dict[Hashable, list[tuple[Draw, tuple[int, ...]]]] = {}
        self.stream = None if emulate else torch.cuda.Stream(device)  # eager steps before a capture
        self.capture_stream = None if emulate else torch.cuda.Stream(device)
        self.replays = 0

    def key(self, sampled: ReplayBatch) -> Hashable:
        """What a captured step fixes that may change between steps: the update's phase, the
        learning rates and the batch's shapes."""
        batch = self.batch
        return (
            batch.members[0].update_phase(),
            tuple(optimizer.lr for optimizer in batch.optimizers.values()),
            tuple((name, tuple(tensor.shape)) for name, tensor in sampled.items()),
        )

    def step(self, sampled: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """One gradient step of every seed on ``sampled`` (seed-stacked, on the batch's device):
        the logs (N,) and the TD errors (N, B) (None without prioritized replay)."""
        key = self.key(sampled)
        graph = self.graphs.get(key)
        if graph is None and self.eager_steps.get(key, 0) < WARMUP_STEPS:
            self.eager_steps[key] = self.eager_steps.get(key, 0) + 1
            self.eager_steps.move_to_end(key)
            while len(self.eager_steps) > KEYS_REMEMBERED:
                forgotten, _ = self.eager_steps.popitem(last=False)
                self.tapes.pop(forgotten, None)
            return self._eager(key, sampled)
        if graph is None:
            graph = self.graphs[key] = self._capture(key, sampled)
            if len(self.graphs) > MAX_GRAPHS:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        return self._replay(graph, sampled)

    # -- eager steps (recording the noise tape) ---------------------------------------------------

    def _eager(self, key: Hashable, sampled: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        tape: list[tuple[Draw, tuple[int, ...]]] = []
        tools, draw_noise = self.batch.tools, self.batch.tools.noise

        def recording(draw: Draw, shape: Any) -> torch.Tensor:
            tape.append((draw, tuple(shape)))
            return draw_noise(draw, shape)

        tools.noise = recording
        try:
            with self._side_stream():
                logs, td_errors = self._body(sampled)
        finally:
            tools.noise = draw_noise
        if self.tapes.setdefault(key, tape) != tape:
            raise RuntimeError(f"the noise a gradient step draws changed between two steps of phase {key}: it cannot be captured")
        return logs, td_errors

    @contextlib.contextmanager
    def _side_stream(self) -> Iterator[None]:
        """Eager steps run on a side stream (as torch asks before a capture); the current stream
        waits for them."""
        if self.stream is None:
            yield
            return
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            yield
        current.wait_stream(self.stream)

    def _body(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        gradients, logs = self.batch.compute_gradients(batch)
        self.batch.apply_gradients(gradients)
        return logs, self.batch.td_errors

    # -- capture and replay -----------------------------------------------------------------------

    def _python_state(self) -> _Effects:
        batch = self.batch
        return _Effects([member.num_updates for member in batch.members], {name: optimizer.steps.clone() for name, optimizer in batch.optimizers.items()})

    def _restore(self, state: _Effects) -> None:
        batch = self.batch
        for member, count in zip(batch.members, state.updates, strict=True):
            member.num_updates = count
        for name, optimizer in batch.optimizers.items():
            optimizer.steps.copy_(state.optimizer_steps[name])

    def _capture(self, key: Hashable, sampled: ReplayBatch) -> _Graph:
        """The step of ``key`` on static buffers. Capturing runs the step's Python (and launches
        nothing): its effects on Python state are measured and undone, for each replay to apply."""
        if any(optimizer._parted for optimizer in self.batch.optimizers.values()):
            raise RuntimeError("cuda_graphs: seeds whose optimizers stepped apart take per-seed Adam steps, which read step counts on the host")
        tape = self.tapes[key]
        static_batch = sampled.apply(torch.clone)
        num_seeds = self.batch.num_seeds
        sizes = [num_seeds * math.prod(shape) for _, shape in tape]
        flat = torch.empty(sum(sizes), device=self.device)
        views = [part.view(num_seeds, *shape) for part, (_, shape) in zip(flat.split(sizes), tape, strict=True)]
        staging = torch.empty(sum(sizes), pin_memory=not self.emulate)

        def body() -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
            return self._with_noise(tape, views, lambda: self._body(static_batch))

        if self.emulate:  # nothing to capture: each replay runs ``body`` and measures its effects
            return _Graph(static_batch, tape, flat, staging, None, {}, None, None, None, body)
        before = self._python_state()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph, stream=self.capture_stream):
                logs, td_errors = body()
            effects = self._python_state().minus(before)
        finally:
            self._restore(before)
        return _Graph(static_batch, tape, flat, staging, torch.cuda.Event(), logs, td_errors, effects, graph)

    def _with_noise(self, tape: list[tuple[Draw, tuple[int, ...]]], noise: list[torch.Tensor], run: Callable[[], Any]) -> Any:
        """``run()`` with the batch's noise read from ``noise``, in ``tape``'s order."""
        tools, draw_noise = self.batch.tools, self.batch.tools.noise
        position = iter(range(len(tape)))

        def from_buffers(draw: Draw, shape: Any) -> torch.Tensor:
            index = next(position, None)
            if index is None or tape[index] != (draw, tuple(shape)):
                raise RuntimeError("a captured gradient step drew noise its eager steps did not")
            return noise[index]

        tools.noise = from_buffers
        try:
            return run()
        finally:
            tools.noise = draw_noise

    def _replay(self, graph: _Graph, sampled: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        batch = self.batch
        for name, tensor in sampled.items():
            graph.batch[name].copy_(tensor)
        if graph.copied is not None:
            graph.copied.synchronize()  # the previous replay's copy has left the staging buffer
        offset, cpu = 0, torch.device("cpu")
        for draw, shape in graph.tape:  # each seed's draws from its generator, in the eager order
            draws = stacked_noise(draw, shape, batch.generators, cpu)
            graph.staging[offset : offset + draws.numel()].copy_(draws.flatten())
            offset += draws.numel()
        graph.noise.copy_(graph.staging, non_blocking=graph.copied is not None)
        if graph.graph is not None:
            graph.copied.record()
            graph.graph.replay()
            logs, td_errors = graph.logs, graph.td_errors
        else:  # emulated: the step again on the static buffers; its Python effects undone, measured
            assert graph.body is not None
            before = self._python_state()
            with _NoHostReads():
                logs, td_errors = graph.body()
            if graph.python_effects is None:
                graph.python_effects = self._python_state().minus(before)
            self._restore(before)
        assert graph.python_effects is not None
        for member, count in zip(batch.members, graph.python_effects.updates, strict=True):
            member.num_updates += count
        for name, optimizer in batch.optimizers.items():
            optimizer.steps += graph.python_effects.optimizer_steps[name]
        self.replays += 1
        # a graph overwrites its outputs at its next replay: the caller keeps copies
        return {name: value.clone() for name, value in logs.items()}, None if td_errors is None else td_errors.clone()


class _NoHostReads(TorchDispatchMode):
    """Emulated replays: what a CUDA graph cannot capture raises here too: reading a tensor's
    value on the host (``.item()``, ``bool(tensor)``, ``nonzero``) or making a tensor from host
    data inside the step (a copy from the host, illegal while capturing)."""

    FORBIDDEN = frozenset({torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default, torch.ops.aten.lift_fresh.default})

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in self.FORBIDDEN:
            raise RuntimeError(f"a captured gradient step cannot call {func} (it reads or makes tensors on the host)")
        return func(*args, **(kwargs or {}))
