"""How a run makes its environment: a gymnasium id, keyword arguments for its constructor, and
gymnasium wrappers around each sub-env, as a suite names them::

    envs: [Hopper-v5]
    env_kwargs: {ctrl_cost_weight: 0.0005, max_episode_steps: 500}
    wrappers:
      - gymnasium.wrappers:TimeAwareObservation             # an import path
      - gymnasium.wrappers.RescaleAction: {min_action: -1, max_action: 1}   # or path -> kwargs

``env_kwargs`` go to ``gymnasium.make`` (the env's constructor, or make's own ``max_episode_steps``
and friends); the wrappers wrap each sub-env innermost first, before reprorl's own vector
wrappers (episode statistics, then normalization), so returns are those of the wrapped env.
"""

from __future__ import annotations

import functools
import json
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from agents.errors import ConfigError, suggest

WrapperFactory = Callable[[gym.Env], gym.Wrapper]


@dataclass(frozen=True)
class EnvSetup:
    """An environment as a run makes it. Both ``kwargs`` and each wrapper's arguments are plain
    JSON values (they enter the run key)."""

    env_id: str
    """A gymnasium id, or ``package.module:Env-vN``."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make``."""
    wrappers: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    """(import path, keyword arguments) of each wrapper, innermost first."""

    def __hash__(self) -> int:  # the mappings are not hashable; equal setups share id and sizes
        return hash((self.env_id, len(self.kwargs), len(self.wrappers)))

    @property
    def plain(self) -> bool:
        """Whether the env is made from its id alone."""
        return not self.kwargs and not self.wrappers

    def describe(self) -> str:
        """The env in words: ``Hopper-v5 (ctrl_cost_weight=0.0005; TimeAwareObservation)``."""
        parts = [", ".join(f"{key}={value}" for key, value in self.kwargs.items())] if self.kwargs else []
        if self.wrappers:
            parts.append(", ".join(path.replace(":", ".").rpartition(".")[2] for path, _ in self.wrappers))
        return f"{self.env_id} ({'; '.join(parts)})" if parts else self.env_id

    def wrapper_factories(self) -> list[WrapperFactory]:
        """One callable per wrapper: env -> wrapped env (ConfigError when a path does not import)."""
        return [functools.partial(load_wrapper(path, index), **kwargs) for index, (path, kwargs) in enumerate(self.wrappers)]

    def make(self, **extra: Any) -> gym.Env:
        """One env, made with ``kwargs`` (and ``extra``, e.g. ``render_mode``), then wrapped. Where
        kwargs or wrappers are set, what they make fail is a ConfigError in one line naming them."""
        factories = self.wrapper_factories()  # an import error names its wrapper
        if self.plain and not extra:
            return gym.make(self.env_id)
        try:
            env = gym.make(self.env_id, **{**self.kwargs, **extra})
        except Exception as error:  # noqa: BLE001 - whatever the constructor raises, in one line
            raise ConfigError(f"{self.env_id}: env_kwargs {dict(self.kwargs) | extra} refused ({type(error).__name__}: {error})") from None
        for index, wrap in enumerate(factories):
            try:
                env = wrap(env)
            except Exception as error:  # noqa: BLE001
                env.close()
                raise ConfigError(f"{self.env_id}: wrappers[{index}] {self.wrappers[index][0]} refused ({type(error).__name__}: {error})") from None
        return env


def as_setup(env: str | EnvSetup) -> EnvSetup:
    """``env`` as an EnvSetup (an id alone is made with no kwargs and no wrappers)."""
    return env if isinstance(env, EnvSetup) else EnvSetup(env)


def load_wrapper(path: str, index: int = 0) -> Callable[..., gym.Wrapper]:
    """The wrapper class (or factory) ``path`` names: ``package.module:Name`` or
    ``package.module.Name``; ConfigError in one line when it does not import."""
    try:
        found = pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as error:
        module = path.partition(":")[0] if ":" in path else path.rpartition(".")[0]
        names = _public_names(module)
        hint = suggest(path.replace(":", ".").rpartition(".")[2], names) if names else ""
        raise ConfigError(f"wrappers[{index}]: cannot import {path!r} ({type(error).__name__}: {error}){hint}") from None
    except Exception as error:  # noqa: BLE001 - whatever the wrapper's module raises on import, in one line
        raise ConfigError(f"wrappers[{index}]: importing {path!r} failed ({type(error).__name__}: {error})") from None
    if not callable(found):
        raise ConfigError(f"wrappers[{index}]: {path!r} is a {type(found).__name__}, not a wrapper class")
    return found


def _public_names(module: str) -> list[str]:
    try:
        return [name for name in dir(pkgutil.resolve_name(module)) if not name.startswith("_")]
    except Exception:  # noqa: BLE001 - only for a suggestion
        return []


def parse_env_kwargs(value: Any, where: str = "env_kwargs") -> dict[str, Any]:
    """``value`` (a suite's ``env_kwargs``) checked: a mapping of names to JSON values."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping of keyword arguments, got {type(value).__name__}: {value!r}")
    for key in value:
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"{where}: {key!r} is not a keyword argument name")
    _check_json(value, where)
    return dict(value)


def parse_wrappers(value: Any, where: str = "wrappers") -> list[dict[str, dict[str, Any]]]:
    """``value`` (a suite's ``wrappers``) checked and in one form: a list of one-key mappings
    ``{import path: kwargs}`` (a bare path has no kwargs)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a list of wrapper import paths (package.module:Wrapper), got {type(value).__name__}: {value!r}")
    parsed = []
    for index, item in enumerate(value):
        kwargs: dict[str, Any] = {}
        if isinstance(item, str):
            path = item
        elif isinstance(item, Mapping) and len(item) == 1:
            path, kwargs = next(iter(item.items()))
            kwargs = parse_env_kwargs(kwargs, f"{where}[{index}] {path}")
        else:
            raise ConfigError(f"{where}[{index}]: give an import path, or one mapping of an import path to its keyword arguments; got {item!r}")
        if not isinstance(path, str) or not _is_dotted_path(path):
            raise ConfigError(f"{where}[{index}]: {path!r} is not an import path (package.module:Wrapper or package.module.Wrapper)")
        parsed.append({path: kwargs})
    return parsed


def _is_dotted_path(path: str) -> bool:
    module, colon, attribute = path.partition(":")
    if colon:
        return bool(attribute) and all(part.isidentifier() for part in (*module.split("."), *attribute.split(".")))
    parts = path.split(".")
    return len(parts) > 1 and all(part.isidentifier() for part in parts)


def _check_json(value: Any, where: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where}: values must be numbers, strings, booleans, lists or mappings ({error})") from None


def setup_of(env_id: str, env_kwargs: Mapping[str, Any], wrappers: list[dict[str, dict[str, Any]]]) -> EnvSetup:
    """The EnvSetup of a suite's ``env_kwargs`` and (parsed) ``wrappers`` for ``env_id``."""
    return EnvSetup(env_id, dict(env_kwargs), tuple(next(iter(item.items())) for item in wrappers))
