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

A replayed step therefore runs the eager step's kernels on the eager step's numbers. A batch
whose exploring actions draw their noise only through its seed tools (SAC's) captures its
acting the same way (``CapturedActing``: the observations in, the actions out, keyed by the
observations' shape). What the step changes in Python (the members' update counts, the
stacked optimizers' step counts) is measured around the capture and applied again at each
replay. Python control flow that varies between steps selects the graph: the update's phase
(``OffPolicyAlgorithm.update_phase``: TD3's delayed actor and target steps) and the learning
rates, which the fused Adam kernels take as arguments fixed at capture.

``emulate`` runs the same bookkeeping without CUDA (a "replay" calls the step again on the
static buffers), so the buffers, the noise order and the Python state are tested on a CPU.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agents.algos.seeds import StackedOptimizer, stacked_noise
from agents.batches import ReplayBatch
from agents.errors import ConfigError


class CapturableBatch(Protocol):
    """What the captured steps and acting use of an off-policy seed batch
    (``agents.algos.offpolicy.OffPolicySeedBatch``, which captures through this module)."""

    @property
    def device(self) -> torch.device | str: ...
    @property
    def num_seeds(self) -> int: ...
    @property
    def generators(self) -> Sequence[torch.Generator]: ...
    @property
    def members(self) -> Sequence[Any]:
        """The seeds' learners: their ``update_phase()`` and ``num_updates``."""

    @property
    def optimizers(self) -> Mapping[str, StackedOptimizer]: ...
    @property
    def tools(self) -> Any:
        """The batch's ``SeedTools`` (its ``noise`` draws from each seed's generator)."""

    @property
    def td_errors(self) -> torch.Tensor | None: ...
    def compute_gradients(self, batch: ReplayBatch) -> tuple[dict[str, Sequence[torch.Tensor | None]], dict[str, torch.Tensor]]: ...
    def apply_gradients(self, gradients: Mapping[str, Sequence[torch.Tensor | None]]) -> None: ...
    def policy_actions(self, obs: torch.Tensor) -> torch.Tensor: ...


WARMUP_STEPS = 3
"""Eager steps of each key before its capture: the optimizers' state exists and the allocator
and libraries have warmed up (torch's documentation asks for a few on a side stream)."""
MAX_GRAPHS = 4
"""Graphs kept (the most recently replayed): each holds a private memory pool, and a learning
rate that a schedule moves every few steps would otherwise pile them up."""
KEYS_REMEMBERED = 16
"""Keys whose eager steps are counted toward a capture (the most recent)."""

Draw = Callable[..., torch.Tensor]


@dataclass
class _Graph:
    """One captured call: its static inputs, its noise tape and its outputs."""

    inputs: Any
    """The static inputs (a ``ReplayBatch`` for a gradient step, a dict of tensors for acting)."""
    tape: list[tuple[Draw, tuple[int, ...]]]
    noise: torch.Tensor
    """Every draw of the tape, flat, on the device; the call reads views of it."""
    staging: torch.Tensor
    """The same on the host (pinned on a GPU machine), filled before each replay."""
    copied: Any
    """A CUDA event recorded after the staging buffer's copy (None when emulated)."""
    outputs: Any
    python_effects: _Effects | None
    body: Callable[[], Any] | None = None
    graph: Any = None  # torch.cuda.CUDAGraph, or None when emulated


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


class _CapturedCalls:
    """What a captured call shares, whatever it computes: eager calls on a side stream that record
    the noise tape, one graph per key on static inputs (at most ``MAX_GRAPHS``), replays that copy
    the inputs and the noise in. Subclasses say what the key is, what the body computes, and what
    it changes in Python."""

    def __init__(self, batch: CapturableBatch, emulate: bool = False):
        device = torch.device(batch.device)
        if not emulate and device.type != "cuda":
            raise ConfigError(f"cuda_graphs: CUDA graphs need a GPU, and this run trains on {device}")
        self.batch, self.emulate, self.device = batch, emulate, device
        self.graphs: OrderedDict[Hashable, _Graph] = OrderedDict()
        # per key not yet captured: eager calls made and the noise tape (the latest keys only:
        # a schedule that moves a rate every step makes a new key every step)
        self.eager_steps: OrderedDict[Hashable, int] = OrderedDict()
        self.tapes: dict[Hashable, list[tuple[Draw, tuple[int, ...]]]] = {}
        self.stream = None if emulate else torch.cuda.Stream(device)  # eager calls before a capture
        self.capture_stream = None if emulate else torch.cuda.Stream(device)
        self.replays = 0

    def key(self, inputs: Any) -> Hashable:
        """What a graph fixes that may change between calls."""
        raise NotImplementedError

    def _body(self, inputs: Any) -> Any:
        """The computation captured: tensors (or containers of them) out."""
        raise NotImplementedError

    def _static(self, inputs: Any) -> Any:
        """Static buffers shaped as ``inputs`` (and holding their values)."""
        return inputs.apply(torch.clone)

    def _python_state(self) -> _Effects:
        """The Python state a call changes (none by default)."""
        return _Effects([], {})

    def _restore(self, state: _Effects) -> None:
        """Set the Python state back to ``state``."""

    def _apply(self, effects: _Effects) -> None:
        """Apply one call's effects on the Python state."""

    def _check(self) -> None:
        """Raise if the call cannot be captured now."""

    def call(self, inputs: Any) -> Any:
        """The body on ``inputs``: eager for a key's first ``WARMUP_STEPS`` calls, replayed after."""
        key = self.key(inputs)
        graph = self.graphs.get(key)
        if graph is None and self.eager_steps.get(key, 0) < WARMUP_STEPS:
            self.eager_steps[key] = self.eager_steps.get(key, 0) + 1
            self.eager_steps.move_to_end(key)
            while len(self.eager_steps) > KEYS_REMEMBERED:
                forgotten, _ = self.eager_steps.popitem(last=False)
                self.tapes.pop(forgotten, None)
            return self._eager(key, inputs)
        if graph is None:
            graph = self.graphs[key] = self._capture(key, inputs)
            if len(self.graphs) > MAX_GRAPHS:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        return self._replay(graph, inputs)

    # -- eager calls (recording the noise tape) ---------------------------------------------------

    def _eager(self, key: Hashable, inputs: Any) -> Any:
        tape: list[tuple[Draw, tuple[int, ...]]] = []
        tools, draw_noise = self.batch.tools, self.batch.tools.noise

        def recording(draw: Draw, shape: Any) -> torch.Tensor:
            tape.append((draw, tuple(shape)))
            return draw_noise(draw, shape)

        tools.noise = recording
        try:
            with self._side_stream():
                outputs = self._body(inputs)
        finally:
            tools.noise = draw_noise
        if self.tapes.setdefault(key, tape) != tape:
            raise RuntimeError(f"the noise a captured call draws changed between two calls of key {key}: it cannot be captured")
        return outputs

    @contextlib.contextmanager
    def _side_stream(self) -> Iterator[None]:
        """Eager calls run on a side stream (as torch asks before a capture); the current stream
        waits for them."""
        if self.stream is None:
            yield
            return
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            yield
        current.wait_stream(self.stream)

    # -- capture and replay -----------------------------------------------------------------------

    def _capture(self, key: Hashable, inputs: Any) -> _Graph:
        """The call of ``key`` on static buffers. Capturing runs the call's Python (and launches
        nothing): its effects on Python state are measured and undone, for each replay to apply."""
        with _outside_inference_mode():  # the static buffers and the graph's state are plain tensors
            return self._capture_here(key, inputs)

    def _capture_here(self, key: Hashable, inputs: Any) -> _Graph:
        self._check()
        tape = self.tapes[key]
        static = self._static(inputs)
        num_seeds = self.batch.num_seeds
        sizes = [num_seeds * math.prod(shape) for _, shape in tape]
        flat = torch.empty(sum(sizes), device=self.device)
        views = [part.view(num_seeds, *shape) for part, (_, shape) in zip(flat.split(sizes), tape, strict=True)]
        staging = torch.empty(sum(sizes), pin_memory=not self.emulate)

        def body() -> Any:
            return self._with_noise(tape, views, lambda: self._body(static))

        if self.emulate:  # nothing to capture: each replay runs ``body`` and measures its effects
            return _Graph(static, tape, flat, staging, None, None, None, body)
        before = self._python_state()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph, stream=self.capture_stream):
                outputs = body()
            effects = self._python_state().minus(before)
        finally:
            self._restore(before)
        return _Graph(static, tape, flat, staging, torch.cuda.Event(), outputs, effects, None, graph)

    def _with_noise(self, tape: list[tuple[Draw, tuple[int, ...]]], noise: list[torch.Tensor], run: Callable[[], Any]) -> Any:
        """``run()`` with the batch's noise read from ``noise``, in ``tape``'s order."""
        tools, draw_noise = self.batch.tools, self.batch.tools.noise
        position = iter(range(len(tape)))

        def from_buffers(draw: Draw, shape: Any) -> torch.Tensor:
            index = next(position, None)
            if index is None or tape[index] != (draw, tuple(shape)):
                raise RuntimeError("a captured call drew noise its eager calls did not")
            return noise[index]

        tools.noise = from_buffers
        try:
            return run()
        finally:
            tools.noise = draw_noise

    def _replay(self, graph: _Graph, inputs: Any) -> Any:
        """Copy ``inputs`` and the call's noise in and replay; the outputs are the graph's own
        buffers, which its next replay overwrites."""
        for name, tensor in inputs.items():
            graph.inputs[name].copy_(tensor)
        if graph.copied is not None:
            graph.copied.synchronize()  # the previous replay's copy has left the staging buffer
        offset, cpu = 0, torch.device("cpu")
        for draw, shape in graph.tape:  # each seed's draws from its generator, in the eager order
            draws = stacked_noise(draw, shape, self.batch.generators, cpu)
            graph.staging[offset : offset + draws.numel()].copy_(draws.flatten())
            offset += draws.numel()
        graph.noise.copy_(graph.staging, non_blocking=graph.copied is not None)
        if graph.graph is not None:
            graph.copied.record(torch.cuda.current_stream(self.device))
            graph.graph.replay()
            outputs = graph.outputs
        else:  # emulated: the call again on the static buffers; its Python effects undone, measured
            assert graph.body is not None
            before = self._python_state()
            with _outside_inference_mode(), _NoHostReads():
                outputs = graph.body()
            if graph.python_effects is None:
                graph.python_effects = self._python_state().minus(before)
            self._restore(before)
        assert graph.python_effects is not None
        self._apply(graph.python_effects)
        self.replays += 1
        return outputs


class CapturedSteps(_CapturedCalls):
    """The gradient steps of ``batch`` (an ``OffPolicySeedBatch`` on a CUDA device, or any
    device with ``emulate``), as described in the module docstring."""

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
        logs, td_errors = self.call(sampled)
        # a graph overwrites its outputs at its next replay: the caller keeps copies
        return {name: value.clone() for name, value in logs.items()}, None if td_errors is None else td_errors.clone()

    def _body(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        gradients, logs = self.batch.compute_gradients(batch)
        self.batch.apply_gradients(gradients)
        return logs, self.batch.td_errors

    def _check(self) -> None:
        if any(optimizer._parted for optimizer in self.batch.optimizers.values()):
            raise RuntimeError("cuda_graphs: seeds whose optimizers stepped apart take per-seed Adam steps, which read step counts on the host")

    def _python_state(self) -> _Effects:
        batch = self.batch
        return _Effects([member.num_updates for member in batch.members], {name: optimizer.steps.clone() for name, optimizer in batch.optimizers.items()})

    def _restore(self, state: _Effects) -> None:
        batch = self.batch
        for member, count in zip(batch.members, state.updates, strict=True):
            member.num_updates = count
        for name, optimizer in batch.optimizers.items():
            optimizer.steps.copy_(state.optimizer_steps[name])

    def _apply(self, effects: _Effects) -> None:
        for member, count in zip(self.batch.members, effects.updates, strict=True):
            member.num_updates += count
        for name, optimizer in self.batch.optimizers.items():
            optimizer.steps += effects.optimizer_steps[name]


class CapturedActing(_CapturedCalls):
    """A batch's exploring actions (``policy_actions``) captured: the seed-stacked observations
    (N, E, *obs_shape) copied in, each seed's noise drawn from its generator in the eager order,
    one replay. Nothing in Python changes; the key is the observations' shape."""

    def key(self, inputs: dict[str, torch.Tensor]) -> Hashable:
        return tuple(inputs["obs"].shape)

    def actions(self, obs: torch.Tensor) -> torch.Tensor:
        """Every seed's exploring actions (N, E, ...) for ``obs`` (N, E, *obs_shape)."""
        return self.call({"obs": obs}).clone()  # a copy: the graph's next replay overwrites its own

    def _body(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.batch.policy_actions(inputs["obs"])

    def _static(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in inputs.items()}


def _outside_inference_mode() -> contextlib.ExitStack:
    """Leave inference mode (acting runs in it) for ``no_grad``, which runs the same kernels:
    torch's dispatch modes do not see ops under inference mode, and a capture there can make
    inference tensors of the CUDA generator's graph state, which later captures outside it then
    fail to update (pytorch#166792)."""
    stack = contextlib.ExitStack()
    if torch.is_inference_mode_enabled():
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.no_grad())
    return stack


class _NoHostReads(TorchDispatchMode):
    """Emulated replays: what a CUDA graph cannot capture raises here too: reading a tensor's
    value on the host (``.item()``, ``bool(tensor)``, ``nonzero``) or making a tensor from host
    data inside the step (a copy from the host, illegal while capturing)."""

    FORBIDDEN = frozenset({torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default, torch.ops.aten.lift_fresh.default})

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in self.FORBIDDEN:
            raise RuntimeError(f"a CUDA graph cannot capture {func} (it reads or makes tensors on the host)")
        return func(*args, **(kwargs or {}))
