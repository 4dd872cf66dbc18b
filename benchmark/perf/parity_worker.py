"""One side of one parity seed, in a fresh process: ``python -m benchmark.perf.parity_worker JOB OUT``.

``JOB`` (JSON) names the side ("ours" or "peer"), algorithm, env, steps, seed, evaluation
episodes and the side's settings; the final deterministic returns go to ``OUT`` (JSON). Both
sides are scored by the same protocol, ours: after the last step, one episode in each of
``episodes`` fresh envs seeded ``seed + EVAL_SEED_OFFSET + i``, deterministic actions,
observations normalized with the training statistics frozen, unscaled returns.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmark.perf.parity import PEERS, installed_version


def train_ours(job: dict[str, Any]) -> dict[str, Any]:
    """Our algorithm trained ``steps`` env steps; the final evaluation's returns."""
    import agents
    from benchmark.config import Budget, RunSpec
    from benchmark.training import loop as training_loop

    steps, episodes = int(job["steps"]), int(job["episodes"])
    hyperparameters = agents.resolve_config(job["algo"], job["settings"]).to_dict()
    spec = RunSpec(
        "parity",
        job["algo"],
        job["env_id"],
        int(job["seed"]),
        hyperparameters,
        Budget(total_steps=steps, eval_every=steps, eval_episodes=episodes),
        device=job.get("device", "cpu"),
        torch_threads=int(job["threads"]),
    )
    started = time.perf_counter()
    result = training_loop.run(spec)
    final = result.evaluations[-1]
    return {"returns": list(final.returns), "lengths": list(final.lengths), "seconds": time.perf_counter() - started, "version": installed_version("reprorl")}


def train_peer(job: dict[str, Any]) -> dict[str, Any]:
    """The peer library's algorithm trained ``steps`` env steps on ``num_envs`` envs (with
    VecNormalize when ``normalize``); scored by our evaluation protocol."""
    import importlib

    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(int(job["threads"]))
    settings = dict(job["settings"])
    num_envs = int(settings.pop("n_envs", 1))
    normalize = settings.pop("normalize", False)
    seed = int(job["seed"])
    envs = make_vec_env(job["env_id"], n_envs=num_envs, seed=seed)
    if normalize:
        envs = VecNormalize(envs, norm_obs=True, norm_reward=True, clip_obs=10.0, clip_reward=10.0, gamma=settings.get("gamma", 0.99))
    policy_kwargs = dict(settings.pop("policy_kwargs", {}))
    if "activation_fn" in policy_kwargs:
        policy_kwargs["activation_fn"] = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[policy_kwargs["activation_fn"]]
    sigma = settings.pop("action_noise_sigma", None)
    if sigma is not None:
        assert envs.action_space.shape is not None  # action noise: a continuous (Box) action space
        dims = envs.action_space.shape[0]
        settings["action_noise"] = NormalActionNoise(np.zeros(dims), sigma * np.ones(dims))
    module, name = PEERS[job["algo"]]
    algorithm = getattr(importlib.import_module(module), name)
    model = algorithm("MlpPolicy", envs, seed=seed, device=job.get("device", "cpu"), verbose=0, policy_kwargs=policy_kwargs, **settings)
    started = time.perf_counter()
    model.learn(total_timesteps=int(job["steps"]))
    seconds = time.perf_counter() - started
    normalizer = envs if normalize else None
    returns, lengths = evaluate_peer(model, normalizer, job["env_id"], int(job["episodes"]), seed)
    return {"returns": returns, "lengths": lengths, "seconds": seconds, "version": f"{module.replace('_', '-')} {installed_version(module.replace('_', '-'))}"}


def evaluate_peer(model: Any, normalizer: Any, env_id: str, episodes: int, seed: int) -> tuple[list[float], list[int]]:
    """Our evaluation protocol applied to a peer's model: one episode in each of ``episodes``
    envs seeded as ours are, ``model.predict(deterministic=True)`` on observations normalized by
    ``normalizer`` (a VecNormalize, frozen; None: raw); unscaled returns and lengths."""
    from agents.envs import make_vector_env
    from benchmark.training.evaluate import EVAL_SEED_OFFSET

    envs = make_vector_env(env_id, episodes)
    obs, _ = envs.reset(seed=seed + EVAL_SEED_OFFSET)
    returns = np.zeros(episodes)
    lengths = np.zeros(episodes, dtype=np.int64)
    finished = np.zeros(episodes, dtype=bool)
    while not finished.all():
        seen = normalizer.normalize_obs(obs) if normalizer is not None else obs
        actions, _ = model.predict(seen, deterministic=True)
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        running = ~finished
        returns[running] += rewards[running]
        lengths[running] += 1
        finished |= terminated | truncated
    envs.close()
    return returns.tolist(), lengths.tolist()


SIDES = {"ours": train_ours, "peer": train_peer}


def main(argv: list[str]) -> int:
    job, output = json.loads(argv[0]), Path(argv[1])
    result = SIDES[job["side"]](job)
    output.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    gc.freeze()  # the result is written: the exit need not collect torch's heap (seconds)
    sys.exit(code)
