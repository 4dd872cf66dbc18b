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
    terminated: torch.Tensor  # (N,) bool
    truncated: torch.Tensor  # (N,) bool


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
    #: names accepted by update_parameter
    tunable_parameters: ClassVar[tuple[str, ...]] = ()

    #: whether it learns from a replay buffer (which checkpoints hold only when asked to)
    has_replay_buffer: ClassVar[bool] = False

    #: the ``agents.algos.seeds.SeedBatch`` (``MetaSeedBatch`` for a meta-learner) that trains N
    #: seeds of it as one batched model, if any
    seed_batch: ClassVar[type[SeedBatch] | type[MetaSeedBatch] | None] = None

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
    def compute_gradients(self, batch: Any) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Losses on one batch -> gradients of every trainable parameter (no optimizer step)."""

    @abc.abstractmethod
    def apply_gradients(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """Optimizer step, first setting ``gradients`` (in ``compute_gradients`` order) if given."""

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


def set_gradients(parameters: list[torch.nn.Parameter], gradients: list[torch.Tensor | None]) -> None:
    """Write ``gradients`` (possibly from another device) into ``parameters[i].grad``."""
    if len(parameters) != len(gradients):
        raise ValueError(f"got {len(gradients)} gradients for {len(parameters)} parameters")
    for parameter, gradient in zip(parameters, gradients):
        parameter.grad = None if gradient is None else gradient.to(parameter.device)
