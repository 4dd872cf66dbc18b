"""The algorithm registry: every algorithm by name, its settings, and ``make``.

Below the algorithms and torch-free: a name maps to its Config class (published defaults, ranges,
the environments it accepts) and to where its learner lives, imported on first use. So a whole
suite is validated, and refused, without loading the deep-learning stack; ``make`` and
``algorithm_class`` import the one learner asked for. ``import agents`` offers these names
without importing this module until one is used: see ``agents/__init__.py``.

Algorithms of other packages (plug-ins) join in two ways: an installed package declares them in
the entry-point group ``reprorl.algorithms`` (``name = "package.module:ClassName"``), or a suite
or the command line names one by its import path, ``package.module:ClassName``. A plug-in's
learner is imported when its name is first used and checked against the interface
(``check_plugin``): a subclass of ``agents.Algorithm`` or ``agents.MetaAlgorithm`` whose
``Config`` holds its published defaults, with nothing abstract left.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import inspect
import pkgutil
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from agents.configs.bc import BCConfig
from agents.configs.ddpg import DDPGConfig, TD3Config
from agents.configs.dqn import DQNConfig
from agents.configs.maml import MAMLPPOConfig, MAMLTRPOConfig, MAMLVPGConfig
from agents.configs.mpo import MPOConfig
from agents.configs.pearl import PEARLConfig
from agents.configs.ppo import PPOAdaptiveKLConfig, PPOConfig, SurrogateConfig
from agents.configs.sac import SACConfig
from agents.configs.trpo import TRPOConfig
from agents.configs.vpg import A2CConfig, REINFORCEConfig, VPGConfig
from agents.errors import ConfigError, suggest
from agents.hyperparameters import Hyperparameters

if TYPE_CHECKING:
    import torch

    from agents.api import Learner
    from agents.envs import EnvSpec

#: every algorithm by its registry name: its Config class and its learner as ``module:Class``
REGISTRY: dict[str, tuple[type[Hyperparameters], str]] = {
    "vpg": (VPGConfig, "agents.algos.vpg:VPG"),
    "reinforce": (REINFORCEConfig, "agents.algos.vpg:REINFORCE"),
    "a2c": (A2CConfig, "agents.algos.vpg:A2C"),
    "ppo": (PPOConfig, "agents.algos.ppo:PPO"),
    "ppo_kl": (PPOAdaptiveKLConfig, "agents.algos.ppo:PPOAdaptiveKL"),
    "surrogate_pg": (SurrogateConfig, "agents.algos.ppo:SurrogatePG"),
    "trpo": (TRPOConfig, "agents.algos.trpo:TRPO"),
    "ddpg": (DDPGConfig, "agents.algos.ddpg:DDPG"),
    "td3": (TD3Config, "agents.algos.ddpg:TD3"),
    "sac": (SACConfig, "agents.algos.sac:SAC"),
    "dqn": (DQNConfig, "agents.algos.dqn:DQN"),
    "mpo": (MPOConfig, "agents.algos.mpo:MPO"),
    "bc": (BCConfig, "agents.algos.bc:BC"),
    "maml_vpg": (MAMLVPGConfig, "agents.algos.maml:MAMLVPG"),
    "maml_ppo": (MAMLPPOConfig, "agents.algos.maml:MAMLPPO"),
    "maml_trpo": (MAMLTRPOConfig, "agents.algos.maml:MAMLTRPO"),
    "pearl": (PEARLConfig, "agents.algos.pearl:PEARL"),
}


ENTRY_POINT_GROUP = "reprorl.algorithms"
"""The entry-point group where installed packages declare their algorithms."""


@functools.cache
def plugins() -> dict[str, str]:
    """The installed packages' algorithms: name -> ``module:Class`` (read once per process).
    A name of ours is not taken over: such an entry point is left out with a warning."""
    found: dict[str, str] = {}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in REGISTRY:
            warnings.warn(f"entry point {entry.name} = {entry.value} left out: {entry.name!r} names one of reprorl's own algorithms", stacklevel=2)
            continue
        found.setdefault(entry.name, entry.value)
    return found


def is_import_path(name: str) -> bool:
    """Whether ``name`` names a learner by import path (``package.module:ClassName``)."""
    module, _, attribute = name.partition(":")
    return bool(module and attribute) and all(part.isidentifier() for part in (*module.split("."), *attribute.split(".")))


@functools.cache
def _plugin(name: str) -> type[Learner]:
    """The plug-in learner ``name`` names (an entry point's name or an import path), imported
    and checked once."""
    path = plugins().get(name, name)
    try:
        cls = pkgutil.resolve_name(path)
    except Exception as error:  # noqa: BLE001 - whatever a plug-in's import raises, the user is told in one line
        raise ConfigError(f"algorithm {name!r}: cannot import {path} ({type(error).__name__}: {error})") from None
    check_plugin(cls, name)
    return cast("type[Learner]", cls)


def check_plugin(cls: Any, name: str) -> None:
    """ConfigError naming what ``cls`` lacks to serve as algorithm ``name``."""
    from agents.api import Learner

    if not (inspect.isclass(cls) and issubclass(cls, Learner)):
        what = f"{getattr(cls, '__qualname__', cls)!s} is a {type(cls).__name__}" if not inspect.isclass(cls) else f"{cls.__qualname__} is a class"
        raise ConfigError(f"algorithm {name!r}: {what}, not a learner class (subclass agents.Algorithm or agents.MetaAlgorithm)")
    config = getattr(cls, "Config", None)
    if not (inspect.isclass(config) and issubclass(config, Hyperparameters)):
        raise ConfigError(f"algorithm {name!r}: {cls.__name__} has no Config (a subclass of agents.Hyperparameters with its published defaults)")
    undeclared = _undeclared_fields(config)
    if undeclared:
        raise ConfigError(
            f"algorithm {name!r}: {config.__qualname__} sets {', '.join(undeclared)} but is not decorated with @dataclass "
            "(without it the parent's fields and defaults apply and these are ignored)"
        )
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise ConfigError(f"algorithm {name!r}: {cls.__name__} sets no name (a class attribute, used in its messages and logs)")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise ConfigError(f"algorithm {name!r}: {cls.__name__} does not implement {', '.join(missing)}")
    parameters = inspect.signature(cls).parameters
    absent = [parameter for parameter in ("env_spec", "config", "total_steps", "device", "seed") if parameter not in parameters]
    if absent and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        raise ConfigError(f"algorithm {name!r}: {cls.__name__}'s constructor lacks {', '.join(absent)} (agents.make passes them)")


def _undeclared_fields(config: type[Hyperparameters]) -> list[str]:
    """The annotated attributes and field defaults ``config`` sets in its own body that are not
    dataclass fields of its own: what a subclass without ``@dataclass`` silently drops."""
    if "__dataclass_fields__" in vars(config):
        return []
    inherited = {field.name for field in dataclasses.fields(config)}
    own = set(vars(config).get("__annotations__", {})) | {name for name in vars(config) if name in inherited}
    return sorted(own)


def known(name: str) -> bool:
    """Whether ``name`` is ours or a plug-in's (an installed entry point or an import path);
    imports nothing."""
    return name in REGISTRY or name in plugins() or is_import_path(name)


def known_config(name: str) -> type[Hyperparameters] | None:
    """The Config class of ``name``, ours or an importable plug-in's; None for an algorithm this
    installation does not have (a stored run of a plug-in since uninstalled)."""
    if name in REGISTRY:
        return REGISTRY[name][0]
    if not known(name):
        return None
    try:
        return _plugin(name).Config
    except ConfigError:
        return None


class _Learners(Mapping[str, "type[Learner]"]):
    """Name -> learner class, each imported (with torch) when first looked up: ours, then the
    installed plug-ins'."""

    def __getitem__(self, name: str) -> type[Learner]:
        if name in REGISTRY:
            return pkgutil.resolve_name(REGISTRY[name][1])
        if name in plugins() or is_import_path(name):
            return _plugin(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter([*REGISTRY, *plugins()])

    def __len__(self) -> int:
        return len(REGISTRY) + len(plugins())


ALGORITHMS: Mapping[str, type[Learner]] = _Learners()
"""Every algorithm's learner class by its registry name, the installed plug-ins' included
(looking one up imports it)."""


def _check_name(name: str) -> None:
    if not known(name):
        choices = [*REGISTRY, *plugins()]
        raise ConfigError(
            f"unknown algorithm {name!r}{suggest(name, choices)}; available: {', '.join(sorted(choices))} (or a plug-in's package.module:ClassName)"
        )


def config_class(name: str) -> type[Hyperparameters]:
    """The Config class of algorithm ``name``; ConfigError naming the choices otherwise."""
    _check_name(name)
    return REGISTRY[name][0] if name in REGISTRY else _plugin(name).Config


def algorithm_class(name: str) -> type[Learner]:
    """The learner class registered as ``name`` (imported now); ConfigError naming the choices otherwise."""
    _check_name(name)
    return ALGORITHMS[name]


def is_meta(name: str) -> bool:
    """Whether algorithm ``name`` is a meta-learner (trained by epochs over tasks)."""
    return config_class(name).meta_learning


def resolve_config(name: str, overrides: Mapping[str, Any] | None = None) -> Hyperparameters:
    """The algorithm's published defaults with ``overrides`` applied and validated."""
    return config_class(name).from_dict(overrides)


def check_env_spec(name: str, spec: EnvSpec) -> None:
    """ConfigError if algorithm ``name`` cannot act in an environment of ``spec`` at all."""
    config_class(name).check_env_spec(spec, name)


def check_config(name: str, config: Hyperparameters, spec: EnvSpec) -> None:
    """ConfigError if ``config`` of algorithm ``name`` cannot run on an env of ``spec``."""
    config.check_settings(spec, name)


def make(
    name: str,
    env_spec: EnvSpec,
    hyperparameters: Mapping[str, Any] | Hyperparameters | None = None,
    *,
    total_steps: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Learner:
    """Build algorithm ``name`` for ``env_spec``; ``total_steps`` sizes schedules (e.g. LR annealing)."""
    cls = algorithm_class(name)
    # a mapping of overrides, or None; another algorithm's Hyperparameters fails in from_dict (not a mapping)
    config = hyperparameters if isinstance(hyperparameters, cls.Config) else cls.Config.from_dict(cast("Mapping[str, Any] | None", hyperparameters))
    return cls(env_spec, config, total_steps=total_steps, device=device, seed=seed)
