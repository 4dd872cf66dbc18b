"""What ``make perf`` measures: the cases compared with Stable-Baselines3 (one setting in our
names, SB3's arguments translated from it by ``benchmark.perf.sb3_names``), the cases of the
batched-seeds rows, and their step counts and targets. ``benchmark.perf.throughput`` measures
them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmark.perf import sb3_names

HALF_CHEETAH, CARTPOLE, POINT_NAV = "HalfCheetah-v5", "CartPole-v1", "reprorl/PointNav-v0"
PAIRS_DEFAULT = 3
REPLAY_CAPACITY = 1_000_000
REPLAY_TARGET = 1.2  # at most this times the raw bytes of a transition's fields


@dataclass(frozen=True)
class Case:
    """One algorithm's comparison: the same setting expressed for both libraries."""

    name: str
    env_id: str
    steps: int
    """Env steps per measurement (scaled by --scale)."""
    ours: dict[str, Any]
    """Our hyperparameters (on top of the algorithm's defaults)."""
    bound: str
    """'env' or 'floor': what this case's rate is compared with."""
    target: float
    """Our/SB3 steps/s ratio aimed at."""
    sbx_target: float
    """Our/SBX (Stable Baselines Jax) steps/s ratio aimed at."""
    bound_target: float | None = None
    """Smallest fraction of the bound's rate aimed at (None: none)."""
    floor: dict[str, Any] = field(default_factory=dict)
    """Sizes of the bare update loop (bound 'floor')."""
    sbx_absent: tuple[str, ...] = ()
    """SB3 arguments that SBX's constructor does not take (SBX gets the rest of ``sb3``)."""

    @property
    def sb3(self) -> dict[str, Any]:
        """Stable-Baselines3's constructor arguments: ``ours`` translated (``benchmark.perf.sb3_names``)."""
        return sb3_names.to_sb3(self.name, self.ours)


# SB3's own defaults (2.x) written out in our names (SB3's arguments are translated from them:
# benchmark.perf.sb3_names); SBX takes SB3's arguments. Targets: issue 30 (ours/SB3 and ours/SBX, one thread each).
CASES: dict[str, Case] = {
    "ppo": Case(
        "ppo",
        HALF_CHEETAH,
        8_192,
        ours=dict(
            num_envs=1,
            num_steps=2048,
            num_minibatches=32,
            num_epochs=10,
            learning_rate=3e-4,
            gamma=0.99,
            gae_lambda=0.95,
            clip_range=0.2,
            value_clip_range=None,
            value_coef=1.0,
            max_grad_norm=0.5,
            entropy_method="no_entropy",
            entropy_coef=0.0,
            hidden_sizes=(64, 64),
            activation="tanh",
            initial_log_std=0.0,
            normalize_observations=False,
            normalize_rewards=False,
            anneal_lr=False,
        ),
        bound="env",
        target=2.0,
        sbx_target=1.5,
    ),
    "sac": Case(
        "sac",
        HALF_CHEETAH,
        1_500,
        ours=dict(
            num_envs=1,
            buffer_size=1_000_000,
            batch_size=256,
            start_steps=100,
            learning_starts=100,
            update_every=1,
            gradient_steps=1,
            actor_lr=3e-4,
            critic_lr=3e-4,
            alpha_lr=3e-4,
            tau=0.005,
            gamma=0.99,
            initial_alpha=1.0,
            hidden_sizes=(256, 256),
            activation="relu",
        ),
        bound="floor",
        target=1.5,
        sbx_target=1.15,
        bound_target=1 / 1.5,
        floor=dict(hidden_sizes=(256, 256), batch_size=256),
    ),
    "td3": Case(
        "td3",
        HALF_CHEETAH,
        1_500,
        ours=dict(
            num_envs=1,
            buffer_size=1_000_000,
            batch_size=256,
            start_steps=100,
            learning_starts=100,
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
        bound="floor",
        target=1.4,
        sbx_target=1.3,
        bound_target=1 / 1.5,
        floor=dict(hidden_sizes=(400, 300), batch_size=256),
    ),
    "dqn": Case(
        "dqn",
        CARTPOLE,
        20_000,
        # SB3 counts target_update_interval in env steps (10,000); ours in gradient steps (every 4 env steps)
        ours=dict(
            num_envs=1,
            buffer_size=1_000_000,
            batch_size=32,
            learning_starts=100,
            update_every=4,
            gradient_steps=1,
            learning_rate=1e-4,
            gamma=0.99,
            tau=1.0,
            target_update_every=2_500,
            exploration_fraction=0.1,
            epsilon_start=1.0,
            epsilon_final=0.05,
            max_grad_norm=10.0,
            double_q=False,
            dueling=False,
            huber=True,
            hidden_sizes=(64, 64),
            activation="relu",
        ),
        sbx_absent=("max_grad_norm",),  # SBX's DQN does not clip its gradients (SB3 and ours clip at norm 10)
        bound="env",
        target=1.5,
        sbx_target=1.2,
    ),
}
ENV_STEPS = {HALF_CHEETAH: 20_000, CARTPOLE: 50_000}
FLOOR_UPDATES = 300


BATCHED_COUNTS = (1, 4, 10)
BATCHED_EXTRA: dict[str, tuple[str, dict[str, Any], int]] = {
    "a2c": (HALF_CHEETAH, {}, 16 * 5),
    "vpg": (HALF_CHEETAH, {}, 4_000),
    "reinforce": (HALF_CHEETAH, {}, 4_000),
    "ppo_kl": (HALF_CHEETAH, {}, 2_048),
    "trpo": (HALF_CHEETAH, {}, 2_048),
    "mpo": (HALF_CHEETAH, {"start_steps": 100, "learning_starts": 100}, 1),
    # recurrent variants: PPO's rollout in 32 sequences of 64 steps; DQN on R2D2's sequences
    "ppo_gru": (HALF_CHEETAH, {"recurrent": "gru", "sequence_length": 64}, 2_048),
    "dqn_gru": (CARTPOLE, {"recurrent": "gru", "learning_starts": 1_000}, 1),
    # behavioral cloning from a dataset of HalfCheetah's shapes (random pairs, written when measured)
    "bc": (HALF_CHEETAH, {"expert": None}, 1),
    # meta-learners on 2-D navigation (the MAML paper's first task family), settings of
    # tests/test_meta.py's learning tests; a MAML epoch is at most 10 tasks x 10 episodes x 2 x 100 steps
    "maml_trpo": (POINT_NAV, {"meta_batch_size": 10, "episodes_per_task": 10, "num_envs": 10, "hidden_sizes": [32, 32]}, 1),
    "pearl": (
        POINT_NAV,
        {
            "num_train_tasks": 10,
            "latent_dim": 2,
            "encoder_hidden_sizes": [64, 64],
            "hidden_sizes": [64, 64],
            "meta_batch_size": 5,
            "num_steps_per_epoch": 100,
            "num_initial_steps": 200,
            "num_tasks_sample": 5,
            "num_steps_prior": 100,
            "num_extra_rl_steps_posterior": 100,
            "batch_size": 64,
            "embedding_batch_size": 64,
            "buffer_size": 10_000,
        },
        1,
    ),
}
"""Cases measured in the batched rows only (no peer comparison): the environment, our
hyperparameters on top of the published defaults (the suites' settings) and the env steps of
one rollout at those defaults (measurements cover whole rollouts). A name with a suffix
(``ppo_gru``) is a variant of the algorithm before it (``BATCHED_ALGORITHMS``)."""
BATCHED_ALGORITHMS = {"ppo_gru": "ppo", "dqn_gru": "dqn"}
"""Batched case -> the registered algorithm it trains, where the two names differ."""
BATCHED_CASES = (*CASES, *BATCHED_EXTRA)
BATCHED_STEPS = {
    "ppo": 4_096,
    "sac": 600,
    "td3": 600,
    "dqn": 10_000,
    "a2c": 8_000,
    "vpg": 8_000,
    "reinforce": 8_000,
    "ppo_kl": 4_096,
    "trpo": 4_096,
    "mpo": 600,
    "ppo_gru": 4_096,
    "dqn_gru": 3_000,
    "bc": 1_000_000,
    "maml_trpo": 100_000,
    "pearl": 20_000,
}
"""Env steps per seed of a batched measurement (SAC, TD3 and MPO update from step 100 on; the
on-policy counts are whole rollouts of their defaults; BC's are expert pairs consumed by its
updates; MAML-TRPO about five epochs, PEARL about twenty, each ending at the first epoch past
the count)."""
GRAPHS_CASES = ("sac", "td3")
"""The cases measured with their gradient steps captured as CUDA graphs against without."""
GRAPHS_CAPABLE = tuple(name for name in ("sac", "td3", "ddpg") if name in (*CASES, *BATCHED_EXTRA))
"""The batched cases whose algorithms capture their gradient steps (``capturable_update``)."""
GRAPHS_STEPS = 2_000
GRAPHS_TARGET = ("sac", 2.0)
"""The issue's aim: a single SAC run with CUDA graphs at least 2x the same run without."""
BATCHED_GPU_TARGET = ("sac", 10, 5.0)
"""The issue's aim on a GPU: SAC, 10 seeds in one process, 5x the aggregate rate of 10 separate processes."""


def batched_setting(name: str) -> tuple[str, dict[str, Any]]:
    """The environment and our hyperparameters of batched case ``name``."""
    if name in CASES:
        return CASES[name].env_id, CASES[name].ours
    env_id, ours, _ = BATCHED_EXTRA[name]
    return env_id, ours
