"""How and where a run trains, beyond its run key: its ``distributed:`` settings (the suite key,
per experiment, and ``--distributed``), checked with defaults filled in (docs/distributed.md
explains the scheme); whether its gradient steps can be captured (``cuda_graphs``); a suite's
``slurm:`` options."""

from __future__ import annotations

from typing import Any

import agents
from agents.configs.bc import BCConfig
from agents.errors import ConfigError, suggest

COLLECTOR_CPUS = "REPRORL_COLLECTOR_CPUS"
"""Environment variable: the CPUs each collector actor reserves (default 1); 0 inside a task of
``--executor ray``, which reserved its runs' collectors' CPUs with the task itself."""

SLURM_KEYS: dict[str, type] = {
    "partition": str,
    "time_minutes": int,
    "gpus": int,
    "cpus": int,
    "constraint": str,
    "account": str,
    "memory_gb": float,
    "signal_delay_s": int,
}
"""What each Slurm job asks for (``--executor slurm``), with the type of each value."""

DISTRIBUTED_DEFAULTS: dict[str, Any] = {"collectors": 1, "gradient_workers": 0, "mode": "sync", "max_staleness": 1, "chunk": 16, "backend": "ray"}
"""A distributed run's settings when the suite leaves them out (docs/distributed.md)."""


def check_distributed(value: Any, where: str) -> dict[str, Any]:
    """The ``distributed:`` settings with defaults filled in; ConfigError naming ``where``.

    collectors: Ray actors stepping the envs, C >= 1 (num_envs must split evenly over them);
    gradient_workers: G >= 0 actors differentiating each optimizer step's batch in shares
    (0: the learner does; asynchronous, each step's batch goes whole to the next free one);
    mode: sync (C collectors of k envs train exactly as one process with C*k envs) or async
    (collectors never wait; rollouts at most max_staleness updates old are used, older dropped;
    off-policy collectors send chunks of ``chunk`` vector steps, Ape-X style);
    backend: ray (actors, on a local instance or the cluster of ``--address``) or inline (the
    collectors in the run's own process, one after another: for tests and debugging)."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping such as {{collectors: 4}}, got {value!r}")
    for key in value:
        if key not in DISTRIBUTED_DEFAULTS:
            raise ConfigError(f"unknown {where} key {key!r}{suggest(str(key), DISTRIBUTED_DEFAULTS)}; valid: {', '.join(sorted(DISTRIBUTED_DEFAULTS))}")
    settings = {**DISTRIBUTED_DEFAULTS, **value}
    for key in ("collectors", "gradient_workers", "max_staleness", "chunk"):
        number = settings[key]
        least = 1 if key in ("collectors", "chunk") else 0
        if isinstance(number, bool) or not isinstance(number, int) or number < least:
            raise ConfigError(f"{where}.{key} must be an integer >= {least}, got {number!r}")
    if settings["mode"] not in ("sync", "async"):
        raise ConfigError(f"{where}.mode must be sync or async, got {settings['mode']!r}")
    if settings["backend"] not in ("ray", "inline"):
        raise ConfigError(f"{where}.backend must be ray or inline, got {settings['backend']!r}")
    if settings["mode"] == "async" and settings["backend"] != "ray":
        raise ConfigError(f"{where}.mode: async needs backend ray (inline collectors cannot collect while the learner updates)")
    workers = settings["gradient_workers"]
    if settings["mode"] == "async" and workers > 1 and settings["max_staleness"] < workers - 1:
        # with G busy workers each gradient arrives about G - 1 steps after its weights left
        raise ConfigError(
            f"{where}.max_staleness {settings['max_staleness']} would drop most gradients of {workers} asynchronous gradient workers "
            f"(each arrives about {workers - 1} steps late); set it to at least {workers - 1}"
        )
    return settings


def check_distributable(algo: str, hyperparameters: dict[str, Any], settings: dict[str, Any], device: str = "cpu") -> None:
    """ConfigError, in one line, when ``algo`` with these hyperparameters cannot train over
    ``settings``' collectors, its learner on ``device``."""
    if agents.is_meta(algo):
        raise ConfigError(f"distributed: {algo} is a meta-learner; it collects through its task envs, not collectors")
    if issubclass(agents.config_class(algo), BCConfig):
        raise ConfigError(f"distributed: {algo} learns from a dataset; it has nothing for collectors to collect")
    if hyperparameters.get("recurrent", "none") != "none":
        raise ConfigError(f"distributed: collection of {algo}'s recurrent policy is not supported yet")
    if settings.get("mode") == "async" and hyperparameters.get("exploration_noise") == "ou":
        raise ConfigError(f"distributed: {algo}'s Ornstein-Uhlenbeck noise lives in the learner; the asynchronous mode needs exploration_noise: gaussian")
    if settings.get("gradient_workers"):  # the learner's class says (its module loads torch: only here)
        from agents.api import Algorithm

        learner = agents.algorithm_class(algo)
        why = (
            learner.unsplittable_steps(agents.resolve_config(algo, hyperparameters), device)
            if issubclass(learner, Algorithm)
            else f"{algo} is not an online learner"
        )
        if why is not None:
            raise ConfigError(f"distributed: {why}")
    num_envs, collectors = int(hyperparameters.get("num_envs", 1)), settings["collectors"]
    if num_envs % collectors:
        raise ConfigError(f"distributed: num_envs {num_envs} must split evenly over {collectors} collectors")


def check_capturable(algo: str, hyperparameters: dict[str, Any], device: str, distributed: dict[str, Any] | None) -> None:
    """ConfigError, in one line, when ``algo``'s gradient steps cannot be captured as CUDA graphs."""
    if not getattr(agents.algorithm_class(algo), "capturable_update", False):
        capturable = sorted(name for name, cls in agents.ALGORITHMS.items() if getattr(cls, "capturable_update", False))
        raise ConfigError(f"cuda_graphs: {algo}'s gradient steps cannot be captured (those of {', '.join(capturable)} can)")
    if hyperparameters.get("recurrent", "none") != "none":
        raise ConfigError(f"cuda_graphs: {algo}'s recurrent encoder cannot be captured (set recurrent: none)")
    if device == "cpu":
        raise ConfigError("cuda_graphs: CUDA graphs need a GPU, and the device is cpu")
    if distributed is not None:
        raise ConfigError("cuda_graphs: a distributed run's gradient steps are not captured (train it in one process)")


def check_slurm(options: dict[str, Any], where: str) -> dict[str, Any]:
    """``options`` when every key is one of SLURM_KEYS with a value of its type; ConfigError otherwise."""
    for key in options:
        if key not in SLURM_KEYS:
            raise ConfigError(f"unknown {where} key {key!r}{suggest(str(key), SLURM_KEYS)}; valid: {', '.join(sorted(SLURM_KEYS))}")
    for key, value in options.items():
        kind = SLURM_KEYS[key]
        valid = isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else isinstance(value, kind) and not isinstance(value, bool)
        if not valid:
            raise ConfigError(f"{where}.{key} must be {'a number' if kind is float else 'an integer' if kind is int else 'a string'}, got {value!r}")
    return dict(options)


def quiet_ray_banners() -> None:
    """Before ``ray.init`` starts a local cluster: Ray announces on the console, every launch, that
    it enabled token authentication (its default for a local cluster since 2.5x); the default
    stays and the announcement goes unprinted (its logger set to errors only)."""
    import logging

    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


def check_seeds_per_process(value: Any, where: str) -> int:
    """``value`` when it is a positive integer; ConfigError naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where} must be a positive integer (seeds trained as one batched model per process), got {value!r}")
    return value
