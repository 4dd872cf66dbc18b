"""The settings ``python -m benchmark parity`` compares: each algorithm's hyperparameters in our
names, with the source of each choice; its peer's (Stable-Baselines3, sb3-contrib for TRPO) are
translated from them by one table (``benchmark.perf.sb3_names``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmark.perf import sb3_names


@dataclass(frozen=True)
class Setting:
    """One algorithm's setting, written in our names; the peer's arguments are translated from it."""

    algo: str
    env_id: str
    """Default env."""
    steps: int
    """Default env-step budget."""
    ours: dict[str, Any]
    """Our hyperparameters (on top of the algorithm's defaults)."""
    source: str
    """Where the setting comes from."""
    per_action_dimension: tuple[str, ...] = ()
    """Our hyperparameters that the peer states per action dimension of a Box action space:
    ours is the value here times the env's action dimensions (see ``ours_for``)."""

    @property
    def peer(self) -> dict[str, Any]:
        """The peer's constructor arguments, plus ``n_envs`` and ``normalize`` (VecNormalize):
        ``ours`` translated (``benchmark.perf.sb3_names``)."""
        return sb3_names.peer_runner_of(self.algo, self.ours)

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

SETTINGS: dict[str, Setting] = {
    "ppo": Setting(
        "ppo",
        "Hopper-v5",
        500_000,
        ours=dict(
            num_envs=1,
            num_steps=2048,
            num_minibatches=32,
            num_epochs=10,
            learning_rate=3e-4,
            anneal_lr=False,
            gamma=0.99,
            gae_lambda=0.95,
            clip_range=0.2,
            value_clip_range=None,
            value_coef=1.0,
            max_grad_norm=0.5,
            entropy_method="no_entropy",
            entropy_coef=0.0,
            center_adv=True,
            **_TANH_64,
            **_ON_POLICY_NORMALIZED,
        ),
        source="SB3 PPO defaults (= Schulman et al. 2017, Table 3) with VecNormalize, as RL Zoo runs MuJoCo",
    ),
    "a2c": Setting(
        "a2c",
        "Hopper-v5",
        500_000,
        ours=dict(
            num_envs=1,
            num_steps=5,
            learning_rate=7e-4,
            anneal_lr=False,
            optimizer="rmsprop",
            rmsprop_alpha=0.99,
            rmsprop_eps=1e-5,
            gamma=0.99,
            gae_lambda=1.0,
            center_adv=False,
            value_coef=1.0,
            max_grad_norm=0.5,
            entropy_method="no_entropy",
            entropy_coef=0.0,
            **_TANH_64,
            **_ON_POLICY_NORMALIZED,
        ),
        source="RL Zoo's MuJoCo A2C (a2c.yml: SB3's A2C defaults, one env, VecNormalize), the setting of the suite and of the published 1M scores",
    ),
    "trpo": Setting(
        "trpo",
        "Hopper-v5",
        500_000,
        ours=dict(
            num_envs=1,
            num_steps=2048,
            learning_rate=1e-3,
            value_epochs=10,
            value_num_minibatches=16,
            max_kl=0.01,
            cg_iterations=15,
            cg_damping=0.1,
            line_search_shrink=0.8,
            line_search_max_steps=10,
            gamma=0.99,
            gae_lambda=0.95,
            center_adv=True,
            entropy_method="no_entropy",
            entropy_coef=0.0,
            **_TANH_64,
            **_ON_POLICY_NORMALIZED,
        ),
        source="sb3-contrib TRPO defaults (Schulman et al. 2015, max KL 0.01) with VecNormalize, as RL Zoo runs MuJoCo",
        # sb3-contrib's KL of a Gaussian policy (and so its Fisher matrix) is averaged over the
        # action dimensions where ours, the paper's, is the whole action distribution's (summed
        # over them): its target_kl and cg_damping are ours divided by the action dimensions, and
        # with both scaled up our step equals its step on the same data (tests/test_parity.py)
        per_action_dimension=("max_kl", "cg_damping"),
    ),
    "sac": Setting(
        "sac",
        "Hopper-v5",
        100_000,
        ours=dict(
            num_envs=1,
            buffer_size=1_000_000,
            batch_size=256,
            start_steps=10_000,
            learning_starts=10_000,
            update_every=1,
            gradient_steps=1,
            actor_lr=3e-4,
            critic_lr=3e-4,
            alpha_lr=3e-4,
            tau=0.005,
            gamma=0.99,
            alpha=None,
            initial_alpha=1.0,
            hidden_sizes=(256, 256),
            activation="relu",
        ),
        source="RL Zoo's MuJoCo SAC (SB3 defaults, 10k random steps first; Haarnoja et al. 2018b Table 1)",
    ),
    "td3": Setting(
        "td3",
        "Hopper-v5",
        100_000,
        ours=dict(
            num_envs=1,
            buffer_size=1_000_000,
            batch_size=256,
            start_steps=10_000,
            learning_starts=10_000,
            update_every=1,
            gradient_steps=1,
            actor_lr=1e-3,
            critic_lr=1e-3,
            tau=0.005,
            gamma=0.99,
            policy_delay=2,
            target_policy_noise=0.2,
            target_noise_clip=0.5,
            exploration_noise="gaussian",
            noise_sigma=0.1,
            hidden_sizes=(400, 300),
            activation="relu",
        ),
        source="RL Zoo's MuJoCo TD3 (Fujimoto et al. 2018: 400-300, lr 1e-3, Gaussian noise 0.1, 10k random steps)",
    ),
    "ddpg": Setting(
        "ddpg",
        "Hopper-v5",
        100_000,
        ours=dict(
            num_envs=1,
            buffer_size=1_000_000,
            batch_size=256,
            start_steps=10_000,
            learning_starts=10_000,
            update_every=1,
            gradient_steps=1,
            actor_lr=1e-3,
            critic_lr=1e-3,
            critic_weight_decay=0.0,
            tau=0.005,
            gamma=0.99,
            num_critics=1,
            policy_delay=1,
            target_policy_noise=0.0,
            exploration_noise="gaussian",
            noise_sigma=0.1,
            hidden_sizes=(400, 300),
            activation="relu",
        ),
        source="RL Zoo's MuJoCo DDPG (the TD3 paper's 'OurDDPG': 400-300, lr 1e-3, Gaussian noise 0.1, 10k random steps)",
    ),
    "dqn": Setting(
        "dqn",
        "CartPole-v1",
        50_000,
        # SB3 copies the target every 10 env steps, i.e. once after each burst of 128 gradient steps
        ours=dict(
            num_envs=1,
            buffer_size=100_000,
            batch_size=64,
            start_steps=1_000,
            learning_starts=1_000,
            update_every=256,
            gradient_steps=128,
            learning_rate=2.3e-3,
            gamma=0.99,
            tau=1.0,
            target_update_every=128,
            exploration_fraction=0.16,
            epsilon_start=1.0,
            epsilon_final=0.04,
            max_grad_norm=10.0,
            double_q=False,
            dueling=False,
            huber=True,
            hidden_sizes=(256, 256),
            activation="relu",
        ),
        source="RL Zoo's tuned CartPole-v1 DQN (50k steps)",
    ),
}
