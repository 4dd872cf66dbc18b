"""The peers' side of a throughput measurement (``benchmark.perf.worker``): Stable-Baselines3
and Stable Baselines Jax (SBX) trained with their own ``learn`` from the same setting (SB3's
constructor arguments, ``benchmark.perf.cases``), timed from their first env step."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch


def _arguments(job: dict[str, Any], activations: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The env, the constructor's keyword arguments and its policy_kwargs for ``job``: the
    activation named by ``activations``, the Gaussian action noise built from its sigma, and
    the arguments ``job["absent"]`` names left out."""
    import gymnasium as gym
    from stable_baselines3.common.noise import NormalActionNoise

    kwargs = {key: value for key, value in job["hyperparameters"].items() if key not in job.get("absent", ())}
    policy_kwargs = dict(kwargs.pop("policy_kwargs", {}))
    if "activation_fn" in policy_kwargs:
        policy_kwargs["activation_fn"] = activations[policy_kwargs["activation_fn"]]
    env = gym.make(job["env_id"])
    sigma = kwargs.pop("action_noise_sigma", None)
    if sigma is not None:
        assert env.action_space.shape is not None  # action noise: a continuous (Box) action space
        dims = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(dims), sigma * np.ones(dims))
    return env, kwargs, policy_kwargs


def run_sb3(job: dict[str, Any]) -> dict[str, Any]:
    """Train Stable-Baselines3's implementation of ``job["algo"]`` for ``job["steps"]`` env steps."""
    import stable_baselines3 as sb3
    from torch import nn

    torch.set_num_threads(int(job["threads"]))
    env, kwargs, policy_kwargs = _arguments(job, {"tanh": nn.Tanh, "relu": nn.ReLU})
    algorithm = {"ppo": sb3.PPO, "sac": sb3.SAC, "td3": sb3.TD3, "dqn": sb3.DQN}[job["algo"]]
    model = algorithm("MlpPolicy", env, seed=int(job["seed"]), device="cpu", verbose=0, policy_kwargs=policy_kwargs, **kwargs)
    steps = int(job["steps"])
    started = time.perf_counter()
    model.learn(total_timesteps=steps)
    seconds = time.perf_counter() - started
    return {"steps_per_second": steps / seconds, "seconds": seconds, "version": sb3.__version__}


def run_sbx(job: dict[str, Any]) -> dict[str, Any]:
    """Train SBX's implementation of ``job["algo"]`` (JAX, XLA-compiled) for ``job["steps"]`` env
    steps from SB3's setting, less ``job["absent"]`` (arguments SBX does not take). XLA runs on
    ``job["threads"]`` CPU threads; its compilation is not timed: a throwaway model of the same
    setting learns through its first update first, and the timed model, built after it, reuses
    the compiled functions (as ours and SB3's, it is timed from its first env step)."""
    import os

    threads = int(job["threads"])
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} intra_op_parallelism_threads={threads}"
    import flax.linen
    import gymnasium as gym
    import sbx

    torch.set_num_threads(threads)  # SB3's buffers and wrappers around SBX's networks
    env, kwargs, policy_kwargs = _arguments(job, {"tanh": flax.linen.tanh, "relu": flax.linen.relu})
    algorithm = {"ppo": sbx.PPO, "sac": sbx.SAC, "td3": sbx.TD3, "dqn": sbx.DQN}[job["algo"]]
    warm_up = int(kwargs["n_steps"]) if job["algo"] == "ppo" else int(kwargs["learning_starts"]) + int(kwargs.get("train_freq", 1)) + 1
    # a throwaway model compiles the jitted losses and steps (JAX caches them per function and shapes)
    algorithm("MlpPolicy", gym.make(job["env_id"]), seed=int(job["seed"]), verbose=0, policy_kwargs=policy_kwargs, **kwargs).learn(warm_up)
    model = algorithm("MlpPolicy", env, seed=int(job["seed"]), verbose=0, policy_kwargs=policy_kwargs, **kwargs)
    steps = int(job["steps"])
    started = time.perf_counter()
    model.learn(total_timesteps=steps)
    seconds = time.perf_counter() - started
    return {"steps_per_second": steps / seconds, "seconds": seconds, "version": sbx.__version__, "warm_up_steps": warm_up}
