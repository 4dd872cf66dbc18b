"""The algorithm interface shared by every agent, and typed, validated hyperparameters.

The interface follows the distributed-gradient designs of this field (pytorchrl, RLlib): a
learner can ``compute_gradients`` on one node and ``apply_gradients`` on another, and weights
travel with ``get_weights``/``set_weights``. The local path is ``update()``, which does both.
"""

from __future__ import annotations

import abc
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import torch

from agents.errors import ConfigError, suggest  # noqa: F401 - re-exported: the package's face

# --------------------------------------------------------------------------------------------
# Hyperparameters
# --------------------------------------------------------------------------------------------


def hp(
    default: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    choices: tuple[Any, ...] | None = None,
) -> Any:
    """A hyperparameter field with its default and the range it must lie in."""
    bounds = {"gt": gt, "ge": ge, "lt": lt, "le": le, "choices": choices}
    metadata = {k: v for k, v in bounds.items() if v is not None}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    """Convert a YAML/CLI value to the annotated type, or raise ConfigError."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(name, value, inner[0])
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"hyperparameter {name!r} must be a list, got {value!r}")
        item_type = args[0] if args else Any
        return tuple(_coerce(name, v, item_type) for v in value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"hyperparameter {name!r} must be true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool):
            raise ConfigError(f"hyperparameter {name!r} must be an integer, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"hyperparameter {name!r} must be an integer, got {value!r}") from None
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int):
            return value
        raise ConfigError(f"hyperparameter {name!r} must be an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, bool):
            raise ConfigError(f"hyperparameter {name!r} must be a number, got {value!r}")
        try:
            return float(value)  # accepts YAML's "3e-4", which PyYAML reads as a string
        except (TypeError, ValueError):
            raise ConfigError(f"hyperparameter {name!r} must be a number, got {value!r}") from None
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"hyperparameter {name!r} must be a string, got {value!r}")
    return value


@dataclass
class Hyperparameters:
    """Base of every algorithm's hyperparameter dataclass.

    Fields shared by all algorithms come first; each algorithm adds its own. Every field is
    declared with ``hp(default, ...)`` so its range is checked on construction.
    """

    num_envs: int = hp(1, ge=1)
    """Parallel environments collecting experience (gymnasium sync vector env)."""
    gamma: float = hp(0.99, ge=0.0, le=1.0)
    """Discount factor."""
    normalize_observations: bool = hp(False)
    """Running mean/std observation normalization (statistics saved with checkpoints)."""
    normalize_rewards: bool = hp(False)
    """Scale rewards by the running std of the discounted return."""
    clip_observations: float = hp(10.0, gt=0.0)
    """Clip normalized observations to [-c, c] (only with normalize_observations)."""
    clip_rewards: float = hp(10.0, gt=0.0)
    """Clip scaled rewards to [-c, c] (only with normalize_rewards)."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _coerce(f.name, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, value)
            _check_range(f.name, value, f.metadata)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None = None) -> "Hyperparameters":
        """Build from a mapping, naming any unknown key and the valid ones."""
        values = dict(values or {})
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                raise ConfigError(
                    f"unknown hyperparameter {key!r} for {cls.__name__}{suggest(key, names)}; "
                    f"valid: {', '.join(sorted(names))}"
                )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (tuples become lists) for YAML, JSON and MLflow."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def replace(self, **changes: Any) -> "Hyperparameters":
        """A validated copy with some fields changed."""
        return type(self).from_dict({**dataclasses.asdict(self), **changes})


def _check_range(name: str, value: Any, bounds: Mapping[str, Any]) -> None:
    if value is None:
        return
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if "choices" in bounds and item not in bounds["choices"]:
            raise ConfigError(f"hyperparameter {name!r} must be one of {list(bounds['choices'])}, got {item!r}")
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        for op, ok, word in (
            ("gt", lambda a, b: a > b, ">"),
            ("ge", lambda a, b: a >= b, ">="),
            ("lt", lambda a, b: a < b, "<"),
            ("le", lambda a, b: a <= b, "<="),
        ):
            if op in bounds and not ok(item, bounds[op]):
                raise ConfigError(f"hyperparameter {name!r} must be {word} {bounds[op]}, got {item!r}")


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

    Subclasses set ``name`` and ``Config`` (their Hyperparameters dataclass) and take
    ``(env_spec, config, total_steps, device, seed)`` in their constructor.
    """

    name: ClassVar[str]
    Config: ClassVar[type[Hyperparameters]]
    #: names accepted by update_parameter
    tunable_parameters: ClassVar[tuple[str, ...]] = ()

    #: whether it learns from a replay buffer (which checkpoints hold only when asked to)
    has_replay_buffer: ClassVar[bool] = False

    #: which action spaces the algorithm handles
    supports_discrete: ClassVar[bool] = True
    supports_continuous: ClassVar[bool] = True
    supports_multi_discrete: ClassVar[bool] = False

    #: the ``agents.algos.seeds.SeedBatch`` that trains N seeds of it as one batched model, if any
    seed_batch: ClassVar[type | None] = None

    config: Hyperparameters

    @classmethod
    def check_env_spec(cls, spec: Any) -> None:
        """ConfigError if this algorithm cannot act in an environment of this spec."""
        if spec.multi_discrete and not cls.supports_multi_discrete:
            raise ConfigError(
                f"{cls.name} cannot act in {spec.env_id}'s {spec.action_space_name} action space; "
                "the on-policy algorithms (vpg, reinforce, a2c, ppo, ppo_kl, surrogate_pg, trpo) can"
            )
        if spec.discrete and not cls.supports_discrete:
            raise ConfigError(f"{cls.name} needs continuous (Box) actions; {spec.env_id} has {spec.action_space_name}")
        if not spec.discrete and not cls.supports_continuous:
            raise ConfigError(f"{cls.name} needs discrete actions; {spec.env_id} has {spec.action_space_name}")

    @classmethod
    def check_config(cls, config: Any, spec: Any) -> None:
        """ConfigError if ``config`` cannot run on an env of this spec (checked before any run starts)."""

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
        return {
            name: {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
            for name, module in self.modules().items()
        }

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
                f"{self.name} cannot update {name!r}{suggest(name, self.tunable_parameters)}; "
                f"updatable: {', '.join(self.tunable_parameters) or 'none'}"
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
