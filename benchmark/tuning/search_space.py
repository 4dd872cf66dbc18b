"""Hyperparameter search spaces, declared as data: ``suites/search/<algo>.yaml``.

A search space file::

    algo: ppo
    description: where the ranges come from
    extends: ppo                  # optional: start from another space's parameters
    exclude: [clip_range]         # optional: drop some of the inherited ones
    fixed: {anneal_lr: true}      # optional: set for every trial
    parameters:                   # sampled in this order (a condition names an earlier one)
      learning_rate: {low: 1.0e-5, high: 3.0e-3, log: true}      # float, log-uniform
      num_epochs: {low: 1, high: 20}                              # integers: int-uniform
      num_steps: {low: 64, high: 2048, power_of_two: true}        # 64, 128, ..., 2048
      gamma: {choices: [0.95, 0.99, 0.999]}                       # categorical (null allowed)
      entropy_method: {choices: [no_entropy, regularized]}
      entropy_coef: {low: 1.0e-8, high: 0.1, log: true, when: {entropy_method: regularized}}
      hidden_sizes: {width: {choices: [64, 128, 256]}, depth: {low: 1, high: 3}}   # [w] * d

Every name must be a hyperparameter of the algorithm, and every bound and choice a value
the algorithm accepts: a space is checked when it is loaded, before any trial runs.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agents
from agents.errors import ConfigError, suggest
from benchmark.config import PROJECT_ROOT, stored_hyperparameters
from benchmark.yaml_input import check_keys, read_yaml

SEARCH_DIR = PROJECT_ROOT / "suites" / "search"

_SPACE_KEYS = {"algo", "description", "extends", "exclude", "fixed", "parameters"}
_PARAMETER_KEYS = {"low", "high", "log", "power_of_two", "choices", "width", "depth", "when"}


@dataclass(frozen=True)
class Distribution:
    """One sampled value: a float or int range, powers of two, or a list of choices."""

    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    power_of_two: bool = False
    choices: tuple[Any, ...] | None = None

    @property
    def is_int(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int)

    def extremes(self) -> list[Any]:
        """The values a check of the bounds must accept: both ends, or every choice."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]

    def sample(self, trial: Any, name: str) -> Any:
        """Draw from ``trial`` (an optuna Trial) under ``name``. Powers of two are a choice among
        them (as rl-zoo3 samples batch and rollout sizes), so the trial's parameter is the value
        the run uses: optuna-dashboard shows ``num_steps 512``, not an exponent."""
        if self.choices is not None:
            return trial.suggest_categorical(name, list(self.choices))
        assert self.low is not None and self.high is not None  # a range: both ends are set (_parse_distribution)
        if self.power_of_two:
            return trial.suggest_categorical(name, [2**e for e in range(int(math.log2(self.low)), int(math.log2(self.high)) + 1)])
        if self.is_int:
            return trial.suggest_int(name, self.low, self.high, log=self.log)
        return trial.suggest_float(name, float(self.low), float(self.high), log=self.log)

    def to_dict(self) -> dict[str, Any]:
        if self.choices is not None:
            return {"choices": list(self.choices)}
        data: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.log:
            data["log"] = True
        if self.power_of_two:
            data["power_of_two"] = True
        return data


@dataclass(frozen=True)
class Parameter:
    """A hyperparameter of the search: one distribution, or a layer stack ``[width] * depth``."""

    name: str
    distribution: Distribution | None = None
    width: Distribution | None = None
    depth: Distribution | None = None
    when: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    """Sampled only when each named parameter took one of these values."""

    def applies(self, values: dict[str, Any]) -> bool:
        return all(name in values and values[name] in allowed for name, allowed in self.when.items())

    def sample(self, trial: Any) -> Any:
        if self.distribution is not None:
            return self.distribution.sample(trial, self.name)
        assert self.width is not None and self.depth is not None
        width = self.width.sample(trial, f"{self.name}.width")
        depth = self.depth.sample(trial, f"{self.name}.depth")
        return [width] * depth

    def extremes(self) -> list[Any]:
        if self.distribution is not None:
            return self.distribution.extremes()
        assert self.width is not None and self.depth is not None
        return [[w] * d for w in self.width.extremes() for d in self.depth.extremes()]

    def to_dict(self) -> dict[str, Any]:
        data = (
            self.distribution.to_dict() if self.distribution is not None else {"width": self.width.to_dict(), "depth": self.depth.to_dict()}  # type: ignore[union-attr]
        )
        if self.when:
            data["when"] = {name: list(values) for name, values in self.when.items()}
        return data


@dataclass(frozen=True)
class SearchSpace:
    algo: str
    description: str
    fixed: dict[str, Any]
    parameters: tuple[Parameter, ...]
    path: Path | None = None

    def sample(self, trial: Any) -> dict[str, Any]:
        """The hyperparameters of one trial: ``fixed`` plus each parameter whose condition
        holds, drawn in declaration order."""
        values: dict[str, Any] = dict(self.fixed)
        for parameter in self.parameters:
            if parameter.applies(values):
                values[parameter.name] = parameter.sample(trial)
        return values

    def to_dict(self) -> dict[str, Any]:
        """The space as data (stored with a study, so that its trials can be read later)."""
        return {
            "algo": self.algo,
            "description": self.description,
            "fixed": self.fixed,
            "parameters": {parameter.name: parameter.to_dict() for parameter in self.parameters},
        }


def space_from_dict(data: dict[str, Any]) -> SearchSpace:
    """The space ``SearchSpace.to_dict`` wrote (a study keeps the space it was created with),
    validated again against the algorithm's hyperparameters; names of fields renamed since it
    was stored read under their new names (``Hyperparameters.from_stored``)."""
    algo = str(data["algo"])
    parameters = tuple(_parse_parameter(str(name), spec) for name, spec in stored_hyperparameters(algo, dict(data["parameters"])).items())
    space = SearchSpace(algo, str(data.get("description", "")), stored_hyperparameters(algo, dict(data.get("fixed") or {})), parameters)
    _check_names(space)
    _check_values(space)
    return space


def available_search_spaces() -> list[str]:
    return sorted(path.stem for path in SEARCH_DIR.glob("*.yaml"))


def load_search_space(algo: str, path: Path | None = None) -> SearchSpace:
    """The search space of ``algo`` (``suites/search/<algo>.yaml``, or the file at ``path``),
    validated against the algorithm's hyperparameters; ConfigError naming the problem."""
    agents.config_class(algo)  # an unknown algorithm is named as such first
    if path is None:
        path = SEARCH_DIR / f"{algo}.yaml" if algo in agents.registry.REGISTRY else _shipped_space(algo)
        if not path.exists():
            names = available_search_spaces()
            raise ConfigError(f"no search space for algorithm {algo!r} ({path}); spaces exist for {', '.join(names)} (write one, or pass --space PATH)")
    elif not path.exists():
        raise ConfigError(f"search space file {path} does not exist")
    try:
        space = _load(path, algo, seen=())
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    _check_values(space)
    return space


def _shipped_space(algo: str) -> Path:
    """A plug-in's own search space (its learner's ``search_space``, next to its module), else
    where ours would be. Its ``algo:`` may name the learner's ``name``: the plug-in cannot know
    whether it is named by entry point or by import path."""
    cls = agents.algorithm_class(algo)
    if cls.search_space is None:
        return SEARCH_DIR / f"{algo}.yaml"
    return Path(inspect.getfile(cls)).parent / cls.search_space


def _load(path: Path, algo: str, seen: tuple[Path, ...]) -> SearchSpace:
    data = read_yaml(path, "search space")
    if not isinstance(data, dict) or not isinstance(data.get("parameters"), dict):
        raise ConfigError("a search space must be a mapping with 'algo' and 'parameters' (a mapping of name -> range)")
    check_keys(data, _SPACE_KEYS, "search space")
    declared = str(data.get("algo", ""))
    if declared != algo and not (algo not in agents.registry.REGISTRY and declared == agents.algorithm_class(algo).name):
        raise ConfigError(f"this space is for algorithm {declared!r}, not {algo!r}")
    parameters: dict[str, Parameter] = {}
    fixed: dict[str, Any] = {}
    if "extends" in data:
        parent_path = SEARCH_DIR / f"{data['extends']}.yaml"
        if not parent_path.exists() or parent_path in seen:
            raise ConfigError(f"extends {data['extends']!r}: no such search space (or a cycle)")
        parent = _load(parent_path, str(data["extends"]), (*seen, path))
        parameters = {parameter.name: parameter for parameter in parent.parameters}
        fixed = dict(parent.fixed)
    for name in data.get("exclude") or []:
        if name not in parameters:
            raise ConfigError(f"exclude: {name!r} is not an inherited parameter{suggest(str(name), parameters)}")
        del parameters[name]
    fixed.update(data.get("fixed") or {})
    for name, spec in data["parameters"].items():
        parameters[str(name)] = _parse_parameter(str(name), spec)
    space = SearchSpace(algo, str(data.get("description", "")), fixed, tuple(parameters.values()), path)
    _check_names(space)
    return space


def _parse_parameter(name: str, spec: Any) -> Parameter:
    if not isinstance(spec, dict):
        raise ConfigError(f"parameter {name!r}: expected a mapping such as {{low: 1e-5, high: 1e-2, log: true}}, got {spec!r}")
    check_keys(spec, _PARAMETER_KEYS, f"parameter {name!r}")
    when = spec.get("when") or {}
    if not isinstance(when, dict):
        raise ConfigError(f"parameter {name!r}: 'when' must map parameter names to a value or a list of values")
    conditions = {str(key): tuple(value) if isinstance(value, list) else (value,) for key, value in when.items()}
    if "width" in spec or "depth" in spec:
        if not ("width" in spec and "depth" in spec) or {"low", "high", "choices"} & set(spec):
            raise ConfigError(f"parameter {name!r}: a layer stack takes both 'width' and 'depth' (and nothing else)")
        width = _parse_distribution(f"{name}.width", spec["width"])
        depth = _parse_distribution(f"{name}.depth", spec["depth"])
        for part, distribution in (("width", width), ("depth", depth)):
            if not all(isinstance(value, int) and not isinstance(value, bool) and value >= 1 for value in distribution.extremes()):
                raise ConfigError(f"parameter {name!r}: {part} must be positive integers")
        return Parameter(name, width=width, depth=depth, when=conditions)
    return Parameter(name, _parse_distribution(name, {k: v for k, v in spec.items() if k != "when"}), when=conditions)


def _parse_distribution(name: str, spec: Any) -> Distribution:
    if not isinstance(spec, dict):
        raise ConfigError(f"parameter {name!r}: expected a mapping with 'choices' or 'low' and 'high', got {spec!r}")
    check_keys(spec, _PARAMETER_KEYS - {"width", "depth", "when"}, f"parameter {name!r}")
    if "choices" in spec:
        choices = spec["choices"]
        if set(spec) != {"choices"} or not isinstance(choices, list) or not choices:
            raise ConfigError(f"parameter {name!r}: 'choices' must be a non-empty list, and alone")
        if len({repr(choice) for choice in choices}) != len(choices):
            raise ConfigError(f"parameter {name!r}: choices repeat: {choices}")
        # optuna stores categorical choices as None, bool, int, float or str
        if not all(choice is None or isinstance(choice, (bool, int, float, str)) for choice in choices):
            raise ConfigError(f"parameter {name!r}: choices must be numbers, strings, booleans or null, got {choices}")
        return Distribution(choices=tuple(choices))
    if "low" not in spec or "high" not in spec:
        raise ConfigError(f"parameter {name!r}: give 'choices', or 'low' and 'high'")
    low, high = spec["low"], spec["high"]
    if any(isinstance(value, bool) or not isinstance(value, (int, float)) for value in (low, high)):
        raise ConfigError(f"parameter {name!r}: low and high must be numbers, got {low!r} and {high!r}")
    if not low < high:
        raise ConfigError(f"parameter {name!r}: low must be below high, got {low} and {high}")
    log, power_of_two = spec.get("log", False), spec.get("power_of_two", False)
    if not isinstance(log, bool) or not isinstance(power_of_two, bool):
        raise ConfigError(f"parameter {name!r}: log and power_of_two must be true or false")
    if log and low <= 0:
        raise ConfigError(f"parameter {name!r}: a log-uniform range needs low > 0, got {low}")
    if power_of_two:
        if log:
            raise ConfigError(f"parameter {name!r}: power_of_two is already a log scale; drop log")
        if not all(isinstance(v, int) and v >= 1 and v & (v - 1) == 0 for v in (low, high)):
            raise ConfigError(f"parameter {name!r}: power_of_two needs powers of two as low and high, got {low} and {high}")
    # (two integer ends make an integer range; one float end, 1 .. 2.5, a float range)
    return Distribution(low, high, log, power_of_two)


def _check_names(space: SearchSpace) -> None:
    """Every parameter and fixed value is a hyperparameter of the algorithm, and each
    condition names a parameter sampled before it."""
    config_class = agents.config_class(space.algo)
    names = [field.name for field in dataclasses.fields(config_class)]
    for name in [*space.fixed, *(parameter.name for parameter in space.parameters)]:
        if config_class.aliases.get(name, name) not in names:  # an alias samples the field it names
            raise ConfigError(f"unknown hyperparameter {name!r} for {space.algo}{suggest(name, names)}; valid: {', '.join(sorted(names))}")
    earlier: set[str] = set(space.fixed)
    for parameter in space.parameters:
        for condition in parameter.when:
            if condition not in earlier:
                raise ConfigError(
                    f"parameter {parameter.name!r}: its condition names {condition!r}, which is not a fixed value or a parameter declared before it"
                )
        earlier.add(parameter.name)


def _check_values(space: SearchSpace) -> None:
    """Each bound and choice, with its conditions met, is a value the algorithm accepts."""
    for parameter in space.parameters:
        conditions = {name: allowed[0] for name, allowed in parameter.when.items()}
        for value in parameter.extremes():
            try:
                agents.resolve_config(space.algo, {**space.fixed, **conditions, parameter.name: value})
            except ConfigError as error:
                where = f" ({space.path})" if space.path else ""
                raise ConfigError(f"search space of {space.algo}{where}: parameter {parameter.name!r} = {value!r}: {error}") from None
