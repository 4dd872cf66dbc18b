"""The algorithm interface shared by every agent, and typed, validated hyperparameters.

The interface follows the distributed-gradient designs of this field (pytorchrl, RLlib): a
learner can ``compute_gradients`` on one node and ``apply_gradients`` on another, and weights
travel with ``get_weights``/``set_weights``. The local path is ``update()``, which does both.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from agents import settings
from agents.errors import ConfigError, suggest  # noqa: F401 - re-exported: the package's face
from agents.hyperparameters import Hyperparameters, hp  # noqa: F401 - re-exported: the package's face

if TYPE_CHECKING:
    from agents.envs import EnvSpec

# --------------------------------------------------------------------------------------------
# The algorithm interface
# --------------------------------------------------------------------------------------------


@dataclass
class Acted:
    """What ``Algorithm.act`` returns for a batch of N observations.

    ``actions`` are the policy's own outputs (what storage keeps and log-probs refer to);
    ``env_actions`` are what the environment receives (clipped or rescaled to its bounds).
    """

    actions: torch.Tensor
    env_actions: Any
    state: Any = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Transitions:
    """One vector-env step for N environments, as handed to ``Algorithm.observe``.

    ``next_obs`` holds the true next observation: for an episode that just ended it is the
    final observation, not the first one of the next episode. ``terminated`` marks true
    terminal states (no bootstrap); ``truncated`` marks time limits (bootstrap from next_obs).
    """

    obs: torch.Tensor  # (N, *obs_shape)
    acted: Acted
    rewards: torch.Tensor  # (N,) float32, after any reward scaling
    next_obs: torch.Tensor  # (N, *obs_shape)
    terminated: torch.Tensor  # (N,) bool, on any device (the loop's are on the host)
    truncated: torch.Tensor  # (N,) bool, on any device


class Learner(abc.ABC):
    """What every learner shares, online or meta: acting, gradients computed apart from their
    application (so they can travel between processes), weights, live hyperparameter updates
    and checkpointable state.

    Subclasses set ``name`` and ``Config`` (their Hyperparameters dataclass, in ``agents.configs``:
    published defaults, ranges and the environments the algorithm accepts) and take
    ``(env_spec, config, total_steps, device, seed)`` in their constructor.
    """

    name: ClassVar[str]
    Config: ClassVar[type[Hyperparameters]]
    #: a plug-in's search space file for tuning, relative to its module's file (ours live in suites/search/)
    search_space: ClassVar[str | None] = None
    #: names accepted by update_parameter
    tunable_parameters: ClassVar[tuple[str, ...]] = ()

    #: whether it learns from a replay buffer (which checkpoints hold only when asked to)
    has_replay_buffer: ClassVar[bool] = False

    #: the class that trains N seeds of it as one batched model, if any: a ``BatchedSeeds``
    #: (``agents.meta.BatchedMetaSeeds`` for a meta-learner)
    seed_batch: ClassVar[type | None] = None

    #: whether it trains an ensemble of critics (with their targets) that its seed batch
    #: evaluates as one stacked network, so that a run alone may train as a batch of one
    #: (``stacks_alone``)
    critic_ensemble: ClassVar[bool] = False

    config: Hyperparameters

    if TYPE_CHECKING:  # the constructor every learner has (declared for type checkers only: each class writes its own)

        def __init__(self, env_spec: EnvSpec, config: Hyperparameters, total_steps: int, device: torch.device | str = "cpu", seed: int = 0) -> None: ...

    def stacks_alone(self) -> bool:
        """Whether a run alone of it trains as a seed batch of one, its critic ensemble and
        targets evaluated as one stacked network. ``REPRORL_CRITICS`` decides: 'stacked',
        'separate', or 'auto' (the default): stacked on a GPU, where one batched product per layer
        replaces a kernel launch per critic; separate on the CPU, where oneDNN multiplies a stack
        copy by copy and the separate critics measured faster (docs/performance.md)."""
        if not self.critic_ensemble or self.seed_batch is None:
            return False
        layout = settings.critic_layout()
        if layout == "auto":
            return torch.device(getattr(self, "device", "cpu")).type == "cuda"
        return layout == "stacked"

    @classmethod
    def check_env_spec(cls, spec: Any) -> None:
        """ConfigError if this algorithm cannot act in an environment of this spec (its Config says)."""
        cls.Config.check_env_spec(spec, cls.name)

    @classmethod
    def check_config(cls, config: Hyperparameters, spec: Any) -> None:
        """ConfigError if ``config`` cannot run on an env of this spec (checked before any run starts)."""
        config.check_settings(spec, cls.name)

    @abc.abstractmethod
    def act(self, obs: torch.Tensor, state: Any = None, deterministic: bool = False) -> Acted:
        """Actions for a batch of observations (N, *obs_shape)."""

    def reset_state(self, state: Any, episode_ended: torch.Tensor) -> Any:
        """The recurrent state to act with next, after episodes ended where ``episode_ended`` (N,)
        is true: those envs start their next episode from a fresh state. Stateless policies
        return ``state`` unchanged."""
        return state

    @abc.abstractmethod
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Every parameter a loss trains, in the order of ``gradient_list``."""

    @abc.abstractmethod
    def gradient_list(self, batch: Any) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Losses on one batch -> the gradient of each of ``trainable_parameters()`` (None where
        no loss reaches it now), and the logs; no optimizer step."""

    @abc.abstractmethod
    def apply_gradient_list(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """Optimizer step, first setting ``gradients`` (``gradient_list``'s order) if given."""

    def compute_gradients(self, batch: Any) -> tuple[Gradients, dict[str, float]]:
        """Losses on one batch -> the gradient of every trainable parameter by its name
        (``parameter_names``), and the logs; no optimizer step. What travels between processes:
        by name, so no order has to agree between them."""
        gradients, logs = self.gradient_list(batch)
        return dict(zip(self.parameter_names(), gradients, strict=True)), logs

    def apply_gradients(self, gradients: Mapping[str, torch.Tensor | None] | None = None) -> None:
        """Optimizer step, first setting ``gradients`` (by parameter name, as ``compute_gradients``
        gives them; a name left out has no gradient) if given."""
        if gradients is None:
            self.apply_gradient_list(None)
            return
        names = self.parameter_names()
        unknown = sorted(set(gradients) - set(names))
        if unknown:
            known = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
            raise ValueError(f"gradients of unknown parameters {', '.join(unknown[:5])}: {self.name}'s are {known}")
        self.apply_gradient_list([gradients.get(name) for name in names])

    def parameter_names(self) -> list[str]:
        """The name of each of ``trainable_parameters()``: ``<network>.<parameter>`` for the
        networks of ``modules()``, else the attribute that holds it (``log_alpha``)."""
        parameters = self.trainable_parameters()
        key = tuple(map(id, parameters))
        cached = self.__dict__.get("_parameter_names")
        if cached is not None and cached[0] == key:
            return list(cached[1])
        index: dict[int, str] = {}
        for module_name, module in self.modules().items():
            for name, parameter in module.named_parameters():
                index.setdefault(id(parameter), f"{module_name}.{name}")
        for attribute, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                index.setdefault(id(value), attribute)
        missing = [position for position, parameter in enumerate(parameters) if id(parameter) not in index]
        if missing:
            raise ValueError(f"{self.name}: trainable parameters {missing} belong to no network of modules() and no attribute")
        names = [index[id(parameter)] for parameter in parameters]
        self._parameter_names = (key, names)
        return list(names)

    @abc.abstractmethod
    def modules(self) -> dict[str, torch.nn.Module]:
        """The named networks whose weights define the policy and its critics."""

    # -- shared implementations -----------------------------------------------------------

    def get_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """CPU copies of every network's parameters and buffers."""
        return {name: {k: v.detach().cpu().clone() for k, v in module.state_dict().items()} for name, module in self.modules().items()}

    def set_weights(self, weights: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """Load weights produced by ``get_weights`` (possibly on another process)."""
        modules = self.modules()
        for name, state in weights.items():
            if name not in modules:
                raise KeyError(f"{self.name} has no network {name!r}; it has {sorted(modules)}")
            modules[name].load_state_dict(state)

    def update_parameter(self, name: str, value: Any) -> None:
        """Change a hyperparameter during training (e.g. learning rate, clip range)."""
        if name not in self.tunable_parameters:
            raise ConfigError(
                f"{self.name} cannot update {name!r}{suggest(name, self.tunable_parameters)}; updatable: {', '.join(self.tunable_parameters) or 'none'}"
            )
        self.config = self.config.replace(**{name: value})
        self._on_parameter_updated(name)

    def _on_parameter_updated(self, name: str) -> None:
        """Hook for subclasses whose optimizers cache a hyperparameter."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, counters and RNG state: tensors and primitives only."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def replay_state_dict(self) -> dict[str, Any] | None:
        """The replay buffer's contents, for checkpoints that ask for it (it can be GBs);
        None for algorithms without one."""
        return None

    def load_replay_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``replay_state_dict`` returned."""


class Algorithm(Learner):
    """An online learner, trained by the benchmark's collect -> update loop: it acts in a
    vector env, is handed each step's transitions, and updates when it says it is ready.
    ``benchmark`` talks to nothing else."""

    seed_batch: ClassVar[type[BatchedSeeds] | None] = None

    #: whether it learns from the transitions the loop collects; an offline learner (behavioral
    #: cloning from a dataset) is only asked to update, each update consuming ``samples_per_update``
    collects_experience: bool = True
    samples_per_update: int = 0

    #: the device its networks live on, and the generator its own random draws come from
    device: torch.device
    generator: torch.Generator

    def behavior_act(self, obs: torch.Tensor, state: Any = None) -> Acted:
        """What acts in the training envs: the policy itself, its exploration included, except
        for a learner that collects another policy's behaviour (BC collects its expert's)."""
        return self.act(obs, state)

    def acting_state(self) -> dict[str, Any]:
        """What acting reads and advances besides the weights: the generator's state here;
        subclasses add the counters their exploration schedules read and their noise processes.
        A collector's policy copy takes the learner's on before it acts (with ``set_weights``),
        and the learner takes on the one the collectors end in."""
        return {"generator": self.generator.get_state()}

    def load_acting_state(self, state: Mapping[str, Any]) -> None:
        """Take on an ``acting_state`` (possibly another process's)."""
        self.generator.set_state(state["generator"])

    @abc.abstractmethod
    def observe(self, transitions: Transitions) -> None:
        """Hand one vector step of collected data to the algorithm's storage."""

    @abc.abstractmethod
    def ready_to_update(self) -> bool:
        """Whether enough data has been observed for ``update``."""

    @abc.abstractmethod
    def update(self) -> dict[str, float]:
        """Local training step: sample batches, compute and apply gradients; mean logs."""

    def interrupt_episodes(self, final_obs: torch.Tensor, state: Any = None) -> None:
        """The envs were restarted mid-episode (a resume without their state): treat the
        episodes in progress as truncated at the last observed step, whose next observation
        is ``final_obs`` (N, *obs_shape), acted on from recurrent ``state``."""

    @classmethod
    def rollout_length(cls, config: Hyperparameters) -> int | None:
        """The vector steps of one rollout when it learns only from rollouts of its current
        policy (on-policy: collectors act a whole rollout with one set of weights), else None
        (it may update after any step)."""
        return None

    @classmethod
    def replica_config(cls, config: Hyperparameters) -> Hyperparameters:
        """The configuration of a copy that only acts or differentiates for a learner elsewhere
        (a collector's policy, a gradient worker): what it need not hold dropped."""
        return config

    def initial_priorities(self, transitions: Transitions) -> torch.Tensor:
        """|TD error| (N,) of N transitions under the current weights, as initial priorities of
        prioritized replay computed where they are collected (Ape-X's actors)."""
        raise ConfigError(f"{self.name} computes no TD errors: its replay is not prioritized")

    def prioritize_newest(self, td_errors: torch.Tensor) -> None:
        """Set the priorities of the vector step observed last from ``td_errors`` (num_envs,)."""
        raise ConfigError(f"{self.name} has no prioritized replay")

    # -- gradient steps taken elsewhere (``StepStrategy``) ---------------------------------------
    #
    # A learner whose steps may be split over gradient workers implements the five methods below
    # (both families of this package do; a plug-in that derives from one inherits them):
    #
    #     learner:  step = shared_step(batch)            the batch processed batch-wide, the loss state
    #               share_of(step, rows) for each worker  its rows, to ship
    #     worker g: (a copy with the learner's weights and loss_state)
    #               share_gradients(share, rows, total)  the gradient of its share's mean loss
    #     learner:  apply_shared_step(step, the shares' gradients weighted by their rows, ...)

    #: who takes its gradient steps in its place (a distributed run's gradient workers); None: it does
    step_strategy: StepStrategy | None = None

    @classmethod
    def unsplittable_steps(cls, config: Hyperparameters, device: str = "cpu") -> str | None:
        """Why its gradient steps under ``config`` cannot be split over gradient workers, with
        its learner on ``device``; None when they can."""
        return f"{cls.name} does not implement gradient steps elsewhere (agents.api.Algorithm.share_gradients)"

    def loss_state(self) -> dict[str, Any]:
        """What its losses read besides the weights and the batch (update counters, schedules'
        coefficients, a noise generator): a worker's copy takes it on before it differentiates."""
        raise NotImplementedError(f"{self.name} does not take gradient steps elsewhere")

    def load_loss_state(self, state: Mapping[str, Any]) -> None:
        """Take on a ``loss_state`` (another process's)."""
        raise NotImplementedError(f"{self.name} does not take gradient steps elsewhere")

    def shared_step(self, batch: Any, asynchronous: bool = False) -> SharedStep:
        """One gradient step's ``batch`` as it leaves for gradient workers: processed where the
        losses need the whole batch (centred advantages), with the loss state; ``asynchronous``:
        one worker takes it whole while this learner goes on (its noise must be its own)."""
        raise NotImplementedError(f"{self.name} does not take gradient steps elsewhere")

    def share_of(self, step: SharedStep, rows: slice) -> Any:
        """The part of ``step``'s batch a worker differentiates: its ``rows``, on the CPU."""
        raise NotImplementedError(f"{self.name} does not take gradient steps elsewhere")

    def share_gradients(self, share: Any, rows: slice, total: int) -> ShareGradients:
        """On a worker's copy: the gradient of the mean loss over ``share`` (rows ``rows`` of a
        step batch of ``total``), by parameter name, its logs, and what the learner's apply needs."""
        raise NotImplementedError(f"{self.name} does not take gradient steps elsewhere")

    def apply_shared_step(self, step: SharedStep, gradients: Gradients, logs: Mapping[str, torch.Tensor], shares: Sequence[ShareGradients]) -> Any:
        """Step on ``gradients`` (the shares' weighted by their rows: the whole batch's mean
        loss) and their ``logs`` (weighted alike); the step's logs, as a local step returns them."""
        raise NotImplementedError(f"{self.name} does not take gradient steps elsewhere")

    def finish_steps(self) -> None:
        """Apply the steps still in flight (asynchronous gradient workers) before a checkpoint or
        the end of training; nothing when its steps are its own."""
        if self.step_strategy is not None:
            self.step_strategy.finish(self)


class BatchedSeeds(abc.ABC):
    """N seeds of one online learner's configuration trained in one process as one batched
    model, as the training loop drives it (``agents.algos.seeds.SeedBatch`` implements it for
    this package's learners): each call takes and returns one item per seed, in the members'
    order, each what that seed's run alone would take or return."""

    def __init__(self, members: Sequence[Algorithm]):
        self.members = list(members)
        self.num_seeds = len(self.members)

    @abc.abstractmethod
    def act(self, obs: Sequence[torch.Tensor], states: Sequence[Any] | None = None) -> list[Acted]:
        """Each seed's behavior actions for its observations obs[i] (E, *obs_shape), from its
        recurrent state states[i] (None: a fresh one; ``states`` None: every seed's fresh)."""

    @abc.abstractmethod
    def observe(self, transitions: Sequence[Transitions]) -> None:
        """Each seed's vector step, into its own storage."""

    @abc.abstractmethod
    def ready_to_update(self) -> bool:
        """Whether every seed is ready for ``update`` (they stay in step)."""

    @abc.abstractmethod
    def update(self) -> list[dict[str, float]]:
        """One update of every seed; each seed's logs, as its own ``update()`` returns them."""

    @abc.abstractmethod
    def sync_members(self) -> None:
        """Make ``members[i].state_dict()`` seed i's complete state (before a save)."""


@dataclass
class SharedStep:
    """One gradient step of a learner as it leaves for gradient workers (``Algorithm.shared_step``)."""

    batch: Any
    """What the losses read, processed batch-wide where they need it."""
    rows: int
    """Its rows: each loss is a mean over them, so shares weighted by their rows sum exactly."""
    loss_state: dict[str, Any]
    """``Algorithm.loss_state`` for this step."""
    tag: Any = None
    """What the learner's own apply needs back (the rows' replay indices, the loss parts)."""


@dataclass
class ShareGradients:
    """A gradient worker's answer for its share of a step (``Algorithm.share_gradients``)."""

    gradients: Gradients
    """Of the share's mean loss, by parameter name (None: no loss reaches it at this step)."""
    logs: dict[str, torch.Tensor]
    """Each (1,): means over the share's rows."""
    outputs: dict[str, Any] = field(default_factory=dict)
    """Anything else the learner's apply reads (per-row TD errors, the state its noise ended in)."""


class StepStrategy(abc.ABC):
    """Who takes a learner's gradient steps in its place (``Algorithm.step_strategy``): the
    learner hands each step's batch to ``take`` instead of differentiating it."""

    @abc.abstractmethod
    def take(self, learner: Algorithm, batch: Any) -> Any:
        """One gradient step on ``batch`` (or its start, when asynchronous); the logs of the step applied."""

    def finish(self, learner: Algorithm) -> None:
        """Apply the steps still in flight."""


class _BatchedBy:
    """A learner's ``seed_batch`` declared in its class body by name (``batched_by``)."""

    def __init__(self, where: str):
        self.where = where
        self.home = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.home = owner.__module__

    def __get__(self, instance: object, owner: type) -> type:
        module, _, name = self.where.rpartition(":")
        batch: type = getattr(importlib.import_module(module or self.home), name)
        return batch


def batched_by(where: str) -> Any:
    """``seed_batch = batched_by("SACSeedBatch")`` in a learner's class body: its seed batch,
    a class written after it (in the same module, or ``"module:Class"`` in another, which
    imports the learner's), looked up when first read."""
    return _BatchedBy(where)


def parameters_of(*modules: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Trainable parameters of several modules, in a fixed order."""
    return [p for m in modules for p in m.parameters() if p.requires_grad]


Gradients = dict[str, torch.Tensor | None]
"""Gradients by parameter name (``Learner.compute_gradients``)."""


def set_gradients(parameters: list[torch.nn.Parameter], gradients: list[torch.Tensor | None]) -> None:
    """Write ``gradients`` (possibly from another device) into ``parameters[i].grad``."""
    if len(parameters) != len(gradients):
        raise ValueError(f"got {len(gradients)} gradients for {len(parameters)} parameters")
    for parameter, gradient in zip(parameters, gradients):
        parameter.grad = None if gradient is None else gradient.to(parameter.device)
