"""Side by side with a peer library at equal settings: ``python -m benchmark parity``.

For one algorithm and env, each seed trains our implementation and the same algorithm of
Stable-Baselines3 (sb3-contrib's for TRPO) with identical hyperparameters, network sizes,
normalization and step budget, each in a fresh process, and scores both by one protocol (our
final evaluation: deterministic policy, ``episodes`` episodes on seeded fresh envs, frozen
observation normalization). Every finished seed is written at once to the comparison's record
(``benchmark.analysis.parity_records``: the format, the statistics and the tables), so a killed
invocation loses nothing finished and a rerun trains only the seeds missing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmark.analysis.parity_records import (
    PARITY_DIR,
    SIDES,
    load_record,
    record_path,
    save_run,
)

# ConfigError (agents.api) is imported in the functions that raise it: importing agents starts torch,
# and the command line's parser reads this module (--help must not wait for torch).

EPISODES = 10


@dataclass(frozen=True)
class Setting:
    """One algorithm's setting, written for both libraries."""

    algo: str
    env_id: str
    """Default env."""
    steps: int
    """Default env-step budget."""
    ours: dict[str, Any]
    """Our hyperparameters (on top of the algorithm's defaults)."""
    peer: dict[str, Any]
    """The peer's constructor arguments, plus ``n_envs`` and ``normalize`` (VecNormalize)."""
    source: str
    """Where the setting comes from."""
    per_action_dimension: tuple[str, ...] = ()
    """Our hyperparameters that the peer states per action dimension of a Box action space:
    ours is the value here times the env's action dimensions (see ``ours_for``)."""

    def ours_for(self, env_id: str) -> dict[str, Any]:
        """Our hyperparameters on ``env_id``: ``ours`` with each ``per_action_dimension`` entry
        multiplied by the env's action dimensions (by 1 for discrete actions, whose KL the peer
        takes whole)."""
        if not self.per_action_dimension:
            return dict(self.ours)
        from agents.envs import env_spec

        spec = env_spec(env_id)
        dimensions = 1 if spec.discrete else spec.num_actions
        return {name: round(value * dimensions, 12) if name in self.per_action_dimension else value for name, value in self.ours.items()}


# Our value loss is 0.5 (V - R)^2 (as baselines' ppo2 and CleanRL write it); SB3's is F.mse_loss, (V - R)^2:
# SB3's vf_coef 0.5 is our value_coef 1.0 (the weight matters through the joint gradient-norm clip).
VALUE_COEF_PER_SB3_VF_COEF = 2.0
_ON_POLICY_NORMALIZED = dict(normalize_observations=True, normalize_rewards=True, clip_observations=10.0, clip_rewards=10.0)

PEERS = {
    "ppo": ("stable_baselines3", "PPO"),
    "a2c": ("stable_baselines3", "A2C"),
    "trpo": ("sb3_contrib", "TRPO"),
    "sac": ("stable_baselines3", "SAC"),
    "td3": ("stable_baselines3", "TD3"),
    "ddpg": ("stable_baselines3", "DDPG"),
    "dqn": ("stable_baselines3", "DQN"),
}
"""Our algorithm -> the peer library's module and class."""

_TANH_64 = dict(hidden_sizes=(64, 64), activation="tanh", initial_log_std=0.0, shared_network=False)
_SB3_TANH_64 = dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn="tanh", log_std_init=0.0)

SETTINGS: dict[str, Setting] = {
    "ppo": Setting(
        "ppo", "Hopper-v5", 500_000,
        ours=dict(num_envs=1, num_steps=2048, num_minibatches=32, num_epochs=10, learning_rate=3e-4, anneal_lr=False,
                  gamma=0.99, gae_lambda=0.95, clip_range=0.2, value_clip_range=None, value_coef=1.0, max_grad_norm=0.5,
                  entropy_method="no_entropy", policy_ent_coeff=0.0, center_adv=True, **_TANH_64, **_ON_POLICY_NORMALIZED),
        peer=dict(n_envs=1, normalize=True, n_steps=2048, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99,
                  gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, policy_kwargs=_SB3_TANH_64),
        source="SB3 PPO defaults (= Schulman et al. 2017, Table 3) with VecNormalize, as RL Zoo runs MuJoCo",
    ),
    "a2c": Setting(
        "a2c", "Hopper-v5", 500_000,
        ours=dict(num_envs=16, num_steps=5, learning_rate=7e-4, anneal_lr=False, optimizer="rmsprop", rmsprop_alpha=0.99,
                  rmsprop_eps=1e-5, gamma=0.99, gae_lambda=1.0, center_adv=False, value_coef=1.0, max_grad_norm=0.5,
                  entropy_method="no_entropy", policy_ent_coeff=0.0, **_TANH_64, **_ON_POLICY_NORMALIZED),
        peer=dict(n_envs=16, normalize=True, n_steps=5, learning_rate=7e-4, rms_prop_eps=1e-5, use_rms_prop=True, gamma=0.99,
                  gae_lambda=1.0, normalize_advantage=False, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, policy_kwargs=_SB3_TANH_64),
        source="SB3 A2C defaults with 16 envs (Mnih et al. 2016's 16 actor-learners) and VecNormalize",
    ),
    "trpo": Setting(
        "trpo", "Hopper-v5", 500_000,
        ours=dict(num_envs=1, num_steps=2048, learning_rate=1e-3, value_epochs=10, value_num_minibatches=16, max_kl=0.01,
                  cg_iterations=15, cg_damping=0.1, line_search_shrink=0.8, line_search_max_steps=10, gamma=0.99,
                  gae_lambda=0.95, center_adv=True, entropy_method="no_entropy", policy_ent_coeff=0.0, **_TANH_64,
                  **_ON_POLICY_NORMALIZED),
        peer=dict(n_envs=1, normalize=True, n_steps=2048, batch_size=128, learning_rate=1e-3, n_critic_updates=10, target_kl=0.01,
                  cg_max_steps=15, cg_damping=0.1, line_search_shrinking_factor=0.8, line_search_max_iter=10, gamma=0.99,
                  gae_lambda=0.95, normalize_advantage=True, policy_kwargs=_SB3_TANH_64),
        source="sb3-contrib TRPO defaults (Schulman et al. 2015, max KL 0.01) with VecNormalize, as RL Zoo runs MuJoCo",
        # sb3-contrib's KL of a Gaussian policy (and so its Fisher matrix) is averaged over the
        # action dimensions where ours, the paper's, is the whole action distribution's (summed
        # over them): its target_kl and cg_damping are ours divided by the action dimensions, and
        # with both scaled up our step equals its step on the same data (tests/test_parity.py)
        per_action_dimension=("max_kl", "cg_damping"),
    ),
    "sac": Setting(
        "sac", "Hopper-v5", 100_000,
        ours=dict(num_envs=1, buffer_size=1_000_000, batch_size=256, start_steps=10_000, learning_starts=10_000, update_every=1,
                  gradient_steps=1, actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4, tau=0.005, gamma=0.99, alpha=None,
                  initial_alpha=1.0, hidden_sizes=(256, 256), activation="relu"),
        peer=dict(buffer_size=1_000_000, batch_size=256, learning_starts=10_000, train_freq=1, gradient_steps=1, learning_rate=3e-4,
                  tau=0.005, gamma=0.99, ent_coef="auto_1.0", policy_kwargs=dict(net_arch=[256, 256], activation_fn="relu")),
        source="RL Zoo's MuJoCo SAC (SB3 defaults, 10k random steps first; Haarnoja et al. 2018b Table 1)",
    ),
    "td3": Setting(
        "td3", "Hopper-v5", 100_000,
        ours=dict(num_envs=1, buffer_size=1_000_000, batch_size=256, start_steps=10_000, learning_starts=10_000, update_every=1,
                  gradient_steps=1, actor_lr=1e-3, critic_lr=1e-3, tau=0.005, gamma=0.99, policy_delay=2, target_policy_noise=0.2,
                  target_noise_clip=0.5, exploration_noise="gaussian", noise_sigma=0.1, hidden_sizes=(400, 300), activation="relu"),
        peer=dict(buffer_size=1_000_000, batch_size=256, learning_starts=10_000, train_freq=1, gradient_steps=1, learning_rate=1e-3,
                  tau=0.005, gamma=0.99, policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5, action_noise_sigma=0.1,
                  policy_kwargs=dict(net_arch=[400, 300], activation_fn="relu")),
        source="RL Zoo's MuJoCo TD3 (Fujimoto et al. 2018: 400-300, lr 1e-3, Gaussian noise 0.1, 10k random steps)",
    ),
    "ddpg": Setting(
        "ddpg", "Hopper-v5", 100_000,
        ours=dict(num_envs=1, buffer_size=1_000_000, batch_size=256, start_steps=10_000, learning_starts=10_000, update_every=1,
                  gradient_steps=1, actor_lr=1e-3, critic_lr=1e-3, critic_weight_decay=0.0, tau=0.005, gamma=0.99, num_critics=1,
                  policy_delay=1, target_policy_noise=0.0, exploration_noise="gaussian", noise_sigma=0.1, hidden_sizes=(400, 300),
                  activation="relu"),
        peer=dict(buffer_size=1_000_000, batch_size=256, learning_starts=10_000, train_freq=1, gradient_steps=1, learning_rate=1e-3,
                  tau=0.005, gamma=0.99, action_noise_sigma=0.1, policy_kwargs=dict(net_arch=[400, 300], activation_fn="relu")),
        source="RL Zoo's MuJoCo DDPG (the TD3 paper's 'OurDDPG': 400-300, lr 1e-3, Gaussian noise 0.1, 10k random steps)",
    ),
    "dqn": Setting(
        "dqn", "CartPole-v1", 50_000,
        # SB3 copies the target every 10 env steps, i.e. once after each burst of 128 gradient steps
        ours=dict(num_envs=1, buffer_size=100_000, batch_size=64, start_steps=1_000, learning_starts=1_000, update_every=256,
                  gradient_steps=128, learning_rate=2.3e-3, gamma=0.99, tau=1.0, target_update_every=128,
                  exploration_fraction=0.16, epsilon_start=1.0, epsilon_final=0.04, max_grad_norm=10.0, double_q=False,
                  dueling=False, huber=True, hidden_sizes=(256, 256), activation="relu"),
        peer=dict(buffer_size=100_000, batch_size=64, learning_starts=1_000, train_freq=256, gradient_steps=128, learning_rate=2.3e-3,
                  gamma=0.99, tau=1.0, target_update_interval=10, exploration_fraction=0.16, exploration_initial_eps=1.0,
                  exploration_final_eps=0.04, max_grad_norm=10.0, policy_kwargs=dict(net_arch=[256, 256], activation_fn="relu")),
        source="RL Zoo's tuned CartPole-v1 DQN (50k steps)",
    ),
}


def _setting_record(setting: Setting, env_id: str, steps: int, episodes: int) -> dict[str, Any]:
    """The setting as a record stores it (tuples as lists)."""
    return json.loads(json.dumps({"algo": setting.algo, "env_id": env_id, "steps": steps, "episodes": episodes,
                                  "source": setting.source, "ours": setting.ours_for(env_id), "peer": setting.peer}))


# ---------------------------------------------------------------- running


def check_arguments(algo: str, env_id: str | None, steps: int | None, seeds: Sequence[int], episodes: int, margin: float, workers: int) -> None:
    """ConfigError naming the first bad argument."""
    from agents.envs import check_env_id
    from agents.errors import ConfigError

    if algo not in SETTINGS:
        raise ConfigError(f"parity has no setting for {algo!r}; choose from {', '.join(SETTINGS)}")
    if env_id is not None:
        check_env_id(env_id)
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ConfigError(f"--seeds must be distinct non-negative integers, got {list(seeds)}")
    if episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {episodes}")
    if not 0.0 < margin < 1.0:
        raise ConfigError(f"--margin must be a fraction in (0, 1), got {margin}")
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")


def check_peer(algo: str) -> str:
    """The peer library's version; ConfigError when it is not installed."""
    from importlib.util import find_spec

    from agents.errors import ConfigError

    module, _ = PEERS[algo]
    if find_spec(module) is None:  # found, not imported: it loads torch, which the training processes do
        raise ConfigError(f"{module} is not installed: pip install -e '.[compare]' (make install and make perf add it)")
    return f"{module.replace('_', '-')} {installed_version(module.replace('_', '-'))}"


def installed_version(distribution: str) -> str:
    """An installed distribution's version from its metadata (without importing it), or 'unknown'."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


def run_side(job: dict[str, Any], timeout: float = 12 * 3600) -> dict[str, Any]:
    """One side of one seed in a fresh process (one torch thread); its result."""
    with tempfile.TemporaryDirectory(prefix="reprorl-parity-") as directory:
        output = Path(directory) / "result.json"
        threads = str(job["threads"])
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        completed = subprocess.run([sys.executable, "-m", "benchmark.perf.parity_worker", json.dumps(job), str(output)],
                                   capture_output=True, text=True, timeout=timeout, env=env)
        if completed.returncode != 0 or not output.exists():
            tail = "\n".join(completed.stderr.strip().splitlines()[-12:])
            raise RuntimeError(f"parity {job['side']} {job['algo']} {job['env_id']} seed {job['seed']} failed (exit {completed.returncode}):\n{tail}")
        return json.loads(output.read_text())


def run(
    algo: str,
    env_id: str | None = None,
    steps: int | None = None,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    episodes: int = EPISODES,
    workers: int = 1,
    directory: Path = PARITY_DIR,
    force: bool = False,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Train both sides on every seed not yet in the record (all with ``force``), ``workers``
    processes at once; each finished side is saved as it ends. The record's path and content."""
    from agents.errors import ConfigError
    from benchmark.perf.throughput import machine, now

    setting = SETTINGS[algo]
    env_id, steps = env_id or setting.env_id, steps or setting.steps
    path = record_path(directory, algo, env_id, steps)
    plain = _setting_record(setting, env_id, steps, episodes)
    record = load_record(path)
    if record is not None and record["setting"] != plain:
        raise ConfigError(f"{path} holds another setting of {algo} on {env_id} (the code's setting changed); move it away to start over")
    done = set() if force or record is None else {(r["side"], r["seed"]) for r in record["runs"]}
    jobs = [{"side": side, "algo": algo, "env_id": env_id, "steps": steps, "episodes": episodes, "seed": seed, "threads": 1,
             "settings": setting.ours_for(env_id) if side == "ours" else setting.peer}
            for seed in seeds for side in SIDES if (side, seed) not in done]
    host = machine()
    failures = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_side, job): job for job in jobs}
        for future in as_completed(futures):
            job = futures[future]
            try:
                result = future.result()
            except Exception as error:  # one failed side fails alone; the others are kept
                failures.append(str(error))
                continue
            run_entry = {"side": job["side"], "seed": job["seed"], "final_return": statistics.fmean(result["returns"]),
                         "returns": result["returns"], "lengths": result["lengths"], "seconds": result["seconds"],
                         "version": result["version"], "created": now(), "machine": host}
            record = save_run(path, plain, run_entry)
            if on_run is not None:
                on_run(run_entry)
    if failures:
        raise RuntimeError("\n".join(failures))
    return path, load_record(path) or {"setting": plain, "runs": []}


