"""reprorl agents: algorithms, networks, buffers and environments, knowing nothing of benchmarks.

    spec = agents.envs.env_spec("Pendulum-v1")
    algo = agents.make("sac", spec, {"learning_starts": 1000}, total_steps=20_000, seed=0)

The names below load on first use (PEP 562), so that ``import agents`` and ``ConfigError``
cost no torch import: a command that refuses bad input answers before the deep-learning stack
is loaded. ``agents.<submodule>`` imports that submodule on first use too.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError

_HOMES = {
    "ALGORITHMS": "agents.registry",
    "algorithm_class": "agents.registry",
    "check_config": "agents.registry",
    "check_env_spec": "agents.registry",
    "config_class": "agents.registry",
    "is_meta": "agents.registry",
    "make": "agents.registry",
    "resolve_config": "agents.registry",
    "Acted": "agents.api",
    "Algorithm": "agents.api",
    "Hyperparameters": "agents.hyperparameters",
    "Learner": "agents.api",
    "Transitions": "agents.api",
    "MetaAlgorithm": "agents.meta",
    "EnvSpec": "agents.envs",
}
"""Where each name of the package's face is defined."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from agents.api import Acted, Algorithm, Learner, Transitions
    from agents.envs import EnvSpec
    from agents.hyperparameters import Hyperparameters
    from agents.meta import MetaAlgorithm
    from agents.registry import ALGORITHMS, algorithm_class, check_config, check_env_spec, config_class, is_meta, make, resolve_config

__all__ = [
    "ALGORITHMS",
    "Acted",
    "Algorithm",
    "ConfigError",
    "EnvSpec",
    "Hyperparameters",
    "Learner",
    "MetaAlgorithm",
    "Transitions",
    "algorithm_class",
    "check_config",
    "check_env_spec",
    "config_class",
    "is_meta",
    "make",
    "resolve_config",
]
