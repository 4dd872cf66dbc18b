"""The algorithm registry: every algorithm by name, its resolved configuration, and ``make``.
``import agents`` offers these names without importing this module (and torch) until one is
used: see ``agents/__init__.py``."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from agents.algos import A2C, BC, DDPG, DQN, MAMLPPO, MAMLTRPO, MAMLVPG, MPO, PEARL, PPO, REINFORCE, SAC, TD3, TRPO, VPG, PPOAdaptiveKL, SurrogatePG
from agents.api import Hyperparameters, Learner
from agents.envs import EnvSpec
from agents.errors import ConfigError, suggest
from agents.meta import MetaAlgorithm

#: every algorithm by its registry name
ALGORITHMS: dict[str, type[Learner]] = {
    cls.name: cls
    for cls in (VPG, REINFORCE, A2C, PPO, PPOAdaptiveKL, SurrogatePG, TRPO, DDPG, TD3, SAC, DQN, MPO, BC, MAMLVPG, MAMLPPO, MAMLTRPO, PEARL)
}


def is_meta(name: str) -> bool:
    """Whether algorithm ``name`` is a meta-learner (trained by epochs over tasks)."""
    return issubclass(algorithm_class(name), MetaAlgorithm)


def algorithm_class(name: str) -> type[Learner]:
    """The class registered as ``name``; ConfigError naming the choices otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigError(
            f"unknown algorithm {name!r}{suggest(name, ALGORITHMS)}; available: {', '.join(sorted(ALGORITHMS))}"
        ) from None


def resolve_config(name: str, overrides: Mapping[str, Any] | None = None) -> Hyperparameters:
    """The algorithm's published defaults with ``overrides`` applied and validated."""
    return algorithm_class(name).Config.from_dict(overrides)


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
    config = hyperparameters if isinstance(hyperparameters, cls.Config) else cls.Config.from_dict(hyperparameters)
    return cls(env_spec, config, total_steps=total_steps, device=device, seed=seed)
