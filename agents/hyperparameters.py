"""Typed, validated hyperparameters: every algorithm's settings, with their published defaults,
the ranges they must lie in, and what the algorithm accepts of an environment.

Torch-free, so that suites, search spaces and refusals are checked before the deep-learning
stack is loaded (``benchmark.config`` validates a whole suite with this and ``agents.registry``).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Self, TypeVar

from agents.errors import ConfigError, suggest

H = TypeVar("H")

#: other libraries' names of our fields (Stable-Baselines3, garage, Spinning Up), for "did you
#: mean" when one is given where it is not an accepted alias
OTHER_NAMES: dict[str, str] = {
    "soft_target_tau": "tau",
    "target_update_tau": "tau",
    "replay_buffer_size": "buffer_size",
    "policy_ent_coeff": "entropy_coef",
    "ent_coef": "entropy_coef",
    "vf_coef": "value_coef",
    "n_steps": "num_steps",
    "n_epochs": "num_epochs",
    "n_envs": "num_envs",
    "train_freq": "update_every",
    "target_update_interval": "target_update_every",
    "exploration_final_eps": "epsilon_final",
    "exploration_initial_eps": "epsilon_start",
    "policy_lr": "actor_lr",
    "qf_lr": "critic_lr",
    "vf_lr": "value_lr",
    "pi_lr": "actor_lr",
    "net_arch": "hidden_sizes",
    "activation_fn": "activation",
    "clip_range_vf": "value_clip_range",
    "normalize_advantage": "center_adv",
}


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


def defaults(**values: Any) -> Callable[[type[H]], type[H]]:
    """A configuration that changes only its parent's defaults (a variant's published ones): each
    named field keeps the parent's type, range and documentation. Put it under ``@dataclass``::

        @dataclass
        @defaults(batch_size=256, tau=0.005)
        class TD3Config(DDPGConfig): ...
    """

    def variant(cls: type[H]) -> type[H]:
        parents = {item.name: item for item in fields(cls.__mro__[1])} if is_dataclass(cls.__mro__[1]) else {}
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in values.items():
            if name not in parents:
                raise TypeError(f"{cls.__name__}: its parent has no field {name!r} whose default it could change")
            bounds = parents[name].metadata
            changed = (
                field(default_factory=functools.partial(tuple, value), metadata=bounds)
                if isinstance(value, (list, tuple))
                else field(default=value, metadata=bounds)
            )
            setattr(cls, name, changed)
            annotations[name] = parents[name].type
        cls.__annotations__ = annotations
        return cls

    return variant


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
    declared with ``hp(default, ...)`` so its range is checked on construction. A Config also
    says what its algorithm accepts of an environment (the ``supports_*`` flags,
    ``meta_learning``, ``check_settings``), so a suite is checked without the algorithm's code.
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

    #: other libraries' names for fields, accepted as documented aliases where parity with them
    #: is the point (garage's, the seed libraries'): alias -> this class's name
    aliases: ClassVar[Mapping[str, str]] = {}
    #: fields renamed after results were recorded: this class's name -> the name run keys hash,
    #: so that stored runs, bundles and baselines keep matching (``key_form``)
    key_names: ClassVar[Mapping[str, str]] = {}

    #: which action spaces the algorithm acts in
    supports_discrete: ClassVar[bool] = True
    supports_continuous: ClassVar[bool] = True
    supports_multi_discrete: ClassVar[bool] = False
    #: whether the algorithm is a meta-learner, trained by epochs over a task family
    meta_learning: ClassVar[bool] = False

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _coerce(f.name, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, value)
            _check_range(f.name, value, f.metadata)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None = None) -> Self:
        """Build from a mapping (aliases translated), naming any unknown key and the valid ones."""
        values = cls.canonical(values or {})
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                raise ConfigError(f"unknown hyperparameter {key!r} for {cls.__name__}{cls.suggest_name(key, names)}; valid: {', '.join(sorted(names))}")
        return cls(**values)

    @classmethod
    def suggest_name(cls, key: str, names: list[str]) -> str:
        """' (did you mean X?)' for an unknown ``key``: the field it was renamed to, the field
        another library's name stands for, or a close spelling."""
        former = {old: new for new, old in cls.key_names.items()}
        meant = former.get(key) or OTHER_NAMES.get(key)
        if meant in names:
            return f" (did you mean {meant!r}?)"
        return suggest(key, names)

    @classmethod
    def from_stored(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Settings as a stored run recorded them (a checkpoint, an MLflow run, a bundle row)
        under this version's names: fields renamed since (``key_names``) read under their new
        name, so stored runs keep loading; the run key is unchanged (``key_form``)."""
        former = {old: new for new, old in cls.key_names.items() if old not in cls.aliases}
        return {former.get(key, key): value for key, value in values.items()}

    @classmethod
    def canonical(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` with aliases under this class's names; ConfigError when a setting is given
        under both."""
        translated: dict[str, Any] = {}
        for key, value in values.items():
            name = cls.aliases.get(key, key)
            if name in translated:
                alias = key if name != key else next(a for a, n in cls.aliases.items() if n == name)
                raise ConfigError(f"hyperparameter {name!r} is given twice (also as its alias {alias!r})")
            translated[name] = value
        return translated

    @classmethod
    def key_form(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """A resolved configuration (``to_dict``) as run keys hash it: renamed fields under the
        names they had when runs were first recorded (``key_names``)."""
        return {cls.key_names.get(key, key): value for key, value in values.items()}

    def to_dict(self) -> dict[str, Any]:
        """Plain values (tuples become lists) for YAML, JSON and MLflow."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def replace(self, **changes: Any) -> Self:
        """A validated copy with some fields changed."""
        return type(self).from_dict({**dataclasses.asdict(self), **changes})

    @classmethod
    def check_env_spec(cls, spec: Any, algorithm: str) -> None:
        """ConfigError if ``algorithm`` (whose settings these are) cannot act in an environment of
        ``spec`` (an ``agents.envs.EnvSpec``) at all."""
        if spec.multi_discrete and not cls.supports_multi_discrete:
            raise ConfigError(
                f"{algorithm} cannot act in {spec.env_id}'s {spec.action_space_name} action space; "
                "the on-policy algorithms (vpg, reinforce, a2c, ppo, ppo_kl, surrogate_pg, trpo) can"
            )
        if spec.discrete and not cls.supports_discrete:
            raise ConfigError(f"{algorithm} needs continuous (Box) actions; {spec.env_id} has {spec.action_space_name}")
        if not spec.discrete and not cls.supports_continuous:
            raise ConfigError(f"{algorithm} needs discrete actions; {spec.env_id} has {spec.action_space_name}")
        if cls.meta_learning:
            if not spec.task_family:
                from agents.tasks import TASK_FAMILIES

                raise ConfigError(
                    f"{algorithm} is a meta-RL algorithm and needs a task family; {spec.env_id} has no tasks (task families: {', '.join(TASK_FAMILIES)})"
                )
            if spec.max_episode_steps is None:
                raise ConfigError(f"{spec.env_id} has no episode horizon (max_episode_steps); meta-RL collects whole episodes")

    def check_settings(self, spec: Any, algorithm: str) -> None:
        """ConfigError if these settings of ``algorithm`` cannot run on an env of ``spec`` or
        contradict each other; checked before any run starts. Each algorithm adds its own."""

    def budget_schedules(self) -> list[str]:
        """The settings in force whose values move with the fraction of the budget trained (a
        learning rate annealed to 0 over the run, say): with any, a run's first N steps depend on
        its whole budget. Each algorithm with such a schedule names it; none by default."""
        return []

    def first_update(self, refilling: bool = False) -> tuple[int, str]:
        """(env steps a run collects before its first gradient step, the settings that make it
        so): a budget below it trains nothing. ``refilling``: from a checkpoint without its replay
        buffer (``continue``), which is refilled first. (0, "") where the first update needs no
        env step, or the learner trains on no env (offline, or meta-learning in epochs)."""
        return 0, ""


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
