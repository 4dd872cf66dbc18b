"""The algorithm registry: every algorithm by name, its settings, and ``make``.

Below the algorithms and torch-free: a name maps to its Config class (published defaults, ranges,
the environments it accepts) and to where its learner lives, imported on first use. So a whole
suite is validated, and refused, without loading the deep-learning stack; ``make`` and
``algorithm_class`` import the one learner asked for. ``import agents`` offers these names
without importing this module until one is used: see ``agents/__init__.py``.
"""

from __future__ import annotations

import pkgutil
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


class _Learners(Mapping[str, "type[Learner]"]):
    """Name -> learner class, each imported (with torch) when first looked up."""

    def __getitem__(self, name: str) -> type[Learner]:
        if name not in REGISTRY:
            raise KeyError(name)
        return pkgutil.resolve_name(REGISTRY[name][1])

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)


ALGORITHMS: Mapping[str, type[Learner]] = _Learners()
"""Every algorithm's learner class by its registry name (looking one up imports it)."""


def _check_name(name: str) -> None:
    if name not in REGISTRY:
        raise ConfigError(f"unknown algorithm {name!r}{suggest(name, REGISTRY)}; available: {', '.join(sorted(REGISTRY))}")


def config_class(name: str) -> type[Hyperparameters]:
    """The Config class of algorithm ``name``; ConfigError naming the choices otherwise."""
    _check_name(name)
    return REGISTRY[name][0]


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
