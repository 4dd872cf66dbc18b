"""Settings every on-policy algorithm shares: the advantage and entropy options of garage's
policy-gradient family (also MAML's), rollouts, optimizers, networks and recurrence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.errors import ConfigError
from agents.hyperparameters import Hyperparameters, hp

ENTROPY_METHODS = ("no_entropy", "regularized", "max")


@dataclass
class PolicyGradientOptions(Hyperparameters):
    """The advantage and entropy options of garage's policy-gradient family, shared by the
    on-policy algorithms and MAML (``agents.algos.onpolicy`` applies them to advantages and
    entropies)."""

    aliases: ClassVar[Mapping[str, str]] = {"policy_ent_coeff": "entropy_coef"}  # garage's name
    key_names: ClassVar[Mapping[str, str]] = {"entropy_coef": "policy_ent_coeff"}

    gae_lambda: float = hp(0.95, ge=0.0, le=1.0)
    """GAE lambda (1: Monte-Carlo returns minus the baseline; 0: one-step TD errors)."""
    center_adv: bool = hp(True)
    """Standardize advantages to mean 0, std 1 over the batch the loss sees."""
    positive_adv: bool = hp(False)
    """Shift advantages to be positive (after centering, if both)."""
    entropy_method: str = hp("no_entropy", choices=ENTROPY_METHODS)
    """no_entropy; regularized: entropy bonus in the objective; max: entropy added to every reward."""
    entropy_coef: float = hp(0.0, ge=0.0)
    """Weight of the policy entropy under regularized or max."""
    use_softplus_entropy: bool = hp(False)
    """Pass the entropy through softplus, so the bonus never turns negative (Gaussian policies)."""
    stop_entropy_gradient: bool = hp(False)
    """Treat the regularized entropy bonus as a constant (no gradient through it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.entropy_method == "no_entropy" and self.entropy_coef > 0:
            raise ConfigError(
                f"entropy_coef is {self.entropy_coef} but entropy_method is 'no_entropy'; set entropy_method to 'regularized' or 'max', or entropy_coef to 0"
            )


@dataclass
class OnPolicyConfig(PolicyGradientOptions):
    """Options every on-policy algorithm accepts; each algorithm sets its published defaults."""

    supports_multi_discrete: ClassVar[bool] = True

    num_steps: int = hp(2048, ge=1)
    """Steps collected per env between updates (the horizon T)."""
    learning_rate: float = hp(3e-4, gt=0.0, le=1.0)
    """Step size of the policy optimizer (of the value function's for TRPO)."""
    anneal_lr: bool = hp(False)
    """Decay the learning rates linearly to 0 over the run."""
    value_coef: float = hp(0.5, ge=0.0)
    """Weight of the value loss where policy and value are optimized as one loss."""
    value_clip_range: float | None = hp(None, gt=0.0)
    """Clip the value update to old value +- this (ppo2); None: plain squared error."""
    max_grad_norm: float | None = hp(None, gt=0.0)
    """Clip the global gradient norm of each optimizer's parameters (None: no clipping)."""
    shared_network: bool = hp(False)
    """One trunk with policy and value heads, instead of two networks."""
    hidden_sizes: tuple[int, ...] = hp((64, 64), ge=1)
    """Hidden layer widths."""
    activation: str = hp("tanh", choices=("tanh", "relu", "elu", "gelu"))
    """Hidden activation."""
    initial_log_std: float = hp(0.0)
    """Initial log standard deviation of the Gaussian policy (Box actions)."""
    recurrent: str = hp("none", choices=("none", "gru", "lstm"))
    """A GRU or LSTM cell in front of each network; none: feed-forward (YAML null is read as none)."""
    recurrent_size: int = hp(64, ge=1)
    """Width of the recurrent state (per network)."""
    sequence_length: int | None = hp(None, ge=1)
    """Length of the replayed sequences of a recurrent policy; must divide num_steps (None: num_steps)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sequence_length is not None and self.num_steps % self.sequence_length:
            raise ConfigError(f"sequence_length {self.sequence_length} must divide num_steps {self.num_steps}")

    @classmethod
    def canonical(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        translated = super().canonical(values)
        if "recurrent" in translated and translated["recurrent"] is None:  # null: the earlier spelling of none
            translated["recurrent"] = "none"
        return translated

    @classmethod
    def key_form(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        keyed = super().key_form(values)
        if keyed.get("recurrent") == "none":  # run keys were first recorded with null
            keyed["recurrent"] = None
        return keyed

    @property
    def num_sequences(self) -> int:
        """Sequences per rollout for a recurrent policy."""
        return self.num_envs * (self.num_steps // (self.sequence_length or self.num_steps))

    def first_update(self, refilling: bool = False) -> tuple[int, str]:
        """One whole rollout precedes each update."""
        return self.num_envs * self.num_steps, f"one rollout: num_envs {self.num_envs:,} x num_steps {self.num_steps:,}"

    def budget_schedules(self) -> list[str]:
        """The learning rate (and PPO's clip range) annealed to 0 over the budget, where on."""
        return [name for name in ("anneal_lr", "anneal_clip_range") if getattr(self, name, False)]

    def check_minibatches(self, name: str, count: int) -> None:
        """ConfigError if a rollout cannot be split into ``count`` minibatches."""
        available = self.num_sequences if self.recurrent != "none" else self.num_envs * self.num_steps
        unit = "sequences (num_envs x num_steps / sequence_length)" if self.recurrent != "none" else "samples (num_envs x num_steps)"
        if count > available:
            raise ConfigError(f"{name} is {count} but a rollout has only {available} {unit}")

    def check_settings(self, spec: Any, algorithm: str) -> None:
        if self.recurrent == "none" and self.sequence_length is not None:
            raise ConfigError("sequence_length applies only to recurrent policies; set recurrent to gru or lstm")
