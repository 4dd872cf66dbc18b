"""The algorithm interface shared by every agent, and typed, validated hyperparameters.

The interface follows the distributed-gradient designs of this field (pytorchrl, RLlib): a
learner can ``compute_gradients`` on one node and ``apply_gradients`` on another, and weights
travel with ``get_weights``/``set_weights``. The local path is ``update()``, which does both.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from agents.errors import ConfigError, suggest  # noqa: F401 - re-exported: the package's face
from agents.hyperparameters import Hyperparameters, hp  # noqa: F401 - re-exported: the package's face

if TYPE_CHECKING:
    from agents.algos.seeds import MetaSeedBatch, SeedBatch
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

    #: the ``agents.algos.seeds.SeedBatch`` (``MetaSeedBatch`` for a meta-learner) that trains N
    #: seeds of it as one batched model, if any
    seed_batch: ClassVar[type[SeedBatch] | type[MetaSeedBatch] | None] = None

    #: whether it trains an ensemble of critics (with their targets) that its seed batch
    #: evaluates as one stacked network, so that a run alone may train as a batch of one
    #: (``agents.algos.seeds.stacks_alone``)
    critic_ensemble: ClassVar[bool] = False

    config: Hyperparameters

    if TYPE_CHECKING:  # the constructor every learner has (declared for type checkers only: each class writes its own)

        def __init__(self, env_spec: EnvSpec, config: Hyperparameters, total_steps: int, device: torch.device | str = "cpu", seed: int = 0) -> None: ...

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
