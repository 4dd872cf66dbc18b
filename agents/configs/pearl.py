"""Hyperparameters of PEARL (the algorithm: ``agents.algos.pearl``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.errors import ConfigError
from agents.hyperparameters import Hyperparameters, hp


@dataclass
class PEARLConfig(Hyperparameters):
    """PEARL; the authors' default configuration (Rakelly et al. 2019)."""

    supports_discrete: ClassVar[bool] = False
    meta_learning: ClassVar[bool] = True
    #: garage's PEARL names, accepted for parity with it; run keys keep them
    aliases: ClassVar[Mapping[str, str]] = {
        "policy_lr": "actor_lr",
        "qf_lr": "critic_lr",
        "vf_lr": "value_lr",
        "policy_mean_reg_coeff": "policy_mean_reg_coef",
        "policy_std_reg_coeff": "policy_std_reg_coef",
        "policy_pre_activation_coeff": "policy_pre_activation_coef",
        "soft_target_tau": "tau",
        "replay_buffer_size": "buffer_size",
    }
    key_names: ClassVar[Mapping[str, str]] = {
        "actor_lr": "policy_lr",
        "critic_lr": "qf_lr",
        "value_lr": "vf_lr",
        "policy_mean_reg_coef": "policy_mean_reg_coeff",
        "policy_std_reg_coef": "policy_std_reg_coeff",
        "policy_pre_activation_coef": "policy_pre_activation_coeff",
        "tau": "soft_target_tau",
        "buffer_size": "replay_buffer_size",
    }

    num_train_tasks: int = hp(100, ge=1)
    """The fixed set of training tasks (HalfCheetah-Vel: 100)."""
    latent_dim: int = hp(5, ge=1)
    """Size of the task variable z."""
    encoder_hidden_sizes: tuple[int, ...] = hp((200, 200, 200), ge=1)
    """Context encoder hidden layers."""
    hidden_sizes: tuple[int, ...] = hp((300, 300, 300), ge=1)
    """Hidden layers of the policy, Q-functions and value function."""
    actor_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the policy."""
    critic_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the Q-functions."""
    value_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the value function."""
    context_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the context encoder."""
    policy_mean_reg_coef: float = hp(1e-3, ge=0.0)
    """Weight of the policy's mean^2 penalty."""
    policy_std_reg_coef: float = hp(1e-3, ge=0.0)
    """Weight of the policy's log-std^2 penalty."""
    policy_pre_activation_coef: float = hp(0.0, ge=0.0)
    """Weight of the policy's pre-tanh^2 penalty."""
    tau: float = hp(0.005, gt=0.0, le=1.0)
    """Polyak rate of the target value function."""
    kl_lambda: float = hp(0.1, ge=0.0)
    """Weight of KL(q(z|c) || N(0, I)) in the encoder's loss."""
    use_information_bottleneck: bool = hp(True)
    """A Gaussian posterior with the KL term; false: z is the mean of the encoder's outputs."""
    use_next_obs_in_context: bool = hp(False)
    """Context transitions include the next observation."""
    meta_batch_size: int = hp(16, ge=1)
    """Training tasks per gradient step."""
    num_steps_per_epoch: int = hp(2000, ge=1)
    """Gradient steps per epoch."""
    num_initial_steps: int = hp(2000, ge=0)
    """Env steps per training task, z ~ prior, before the first gradient step."""
    num_tasks_sample: int = hp(5, ge=1)
    """Training tasks that collect data each epoch."""
    num_steps_prior: int = hp(400, ge=0)
    """Env steps per sampled task with z ~ prior (to both buffers)."""
    num_steps_posterior: int = hp(0, ge=0)
    """Env steps per sampled task with z ~ posterior (to both buffers)."""
    num_extra_rl_steps_posterior: int = hp(400, ge=0)
    """Env steps per sampled task with z ~ posterior (to the RL buffer only)."""
    batch_size: int = hp(256, ge=1)
    """RL transitions per task per gradient step."""
    embedding_batch_size: int = hp(64, ge=1)
    """Context transitions per task per gradient step."""
    buffer_size: int = hp(1_000_000, ge=1)
    """Transitions kept per task (RL and encoder buffers each)."""
    reward_scale: float = hp(5.0, gt=0.0)
    """Rewards are multiplied by this in the Q targets (the entropy weight is 1)."""
    update_post_train: int = hp(1, ge=1)
    """Episodes between posterior resamples while collecting with z ~ posterior."""
    meta_test_context_episodes: int = hp(1, ge=1)
    """Meta-test: episodes that gather context (the first with z ~ prior) before the adapted
    policy is scored."""
    meta_test_episodes: int = hp(1, ge=1)
    """Meta-test: episodes of the adapted policy scored per task."""

    def check_settings(self, spec: Any, algorithm: str) -> None:
        if self.normalize_observations or self.normalize_rewards:
            raise ConfigError("pearl does not normalize observations or rewards (set normalize_observations and normalize_rewards to false)")
        if self.num_steps_prior + self.num_steps_posterior == 0:
            raise ConfigError(
                "pearl refills no encoder buffer: num_steps_prior and num_steps_posterior are both 0, but each "
                "epoch clears the encoder buffer of every task it collects on"
            )
        if self.num_envs != 1:
            raise ConfigError(f"pearl collects one episode at a time (one z per episode): num_envs must be 1, got {self.num_envs}")
