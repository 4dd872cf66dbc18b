"""Hyperparameters of behavioral cloning (the algorithm: ``agents.algos.bc``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.errors import ConfigError
from agents.hyperparameters import Hyperparameters, hp

OPTIMIZER_NAMES = ("adam", "sgd", "rmsprop")


@dataclass
class BCConfig(Hyperparameters):
    """Behavioral cloning; garage's BC defaults."""

    expert: str | None = hp(None)
    """A policy checkpoint of this suite (.pt), a dataset (.npz) or minari:<dataset id>."""
    loss: str = hp("log_prob", choices=("log_prob", "mse"))
    """log_prob: maximize the learner's likelihood of the expert's actions; mse: regress them."""
    policy: str = hp("stochastic", choices=("stochastic", "deterministic"))
    """stochastic: categorical or Gaussian (state-independent log-std); deterministic: an MLP
    giving the action (continuous actions only)."""
    batch_size: int = hp(1000, ge=1)
    """Expert transitions per epoch."""
    minibatches_per_epoch: int = hp(16, ge=1)
    """Optimizer steps per epoch, each on a 1/minibatches_per_epoch share of the batch."""
    optimizer: str = hp("adam", choices=OPTIMIZER_NAMES)
    """The policy's optimizer."""
    learning_rate: float = hp(1e-3, gt=0.0, le=1.0)
    """Its step size."""
    hidden_sizes: tuple[int, ...] = hp((64, 64), ge=1)
    """Learner hidden layers."""
    activation: str = hp("tanh", choices=("tanh", "relu", "elu", "gelu"))
    """Learner hidden activation."""
    initial_log_std: float = hp(0.0)
    """Initial log-std of a Gaussian learner."""
    expert_deterministic: bool = hp(True)
    """An expert policy acts with its deterministic action (the behaviour it is scored on)."""

    def check_settings(self, spec: Any, algorithm: str) -> None:
        """The expert must exist and match the env; the learner must be able to clone its actions.
        Reading the expert (a torch checkpoint or a dataset) is the one check that loads torch."""
        if self.expert is None:
            raise ConfigError("bc needs an expert: a policy checkpoint (.pt) of this suite, a dataset (.npz) or minari:<dataset id>")
        if not self.expert.startswith("minari:") and not Path(self.expert).is_file():
            raise ConfigError(f"bc expert {self.expert!r} does not exist")
        if not self.expert.startswith("minari:") and not self.expert.endswith((".pt", ".npz")):
            raise ConfigError(f"bc expert {self.expert!r} is neither a checkpoint (.pt) nor a dataset (.npz)")
        if self.loss == "log_prob" and self.policy == "deterministic":
            raise ConfigError("loss log_prob needs a stochastic learner (policy: stochastic); a deterministic one clones with loss mse")
        if spec.discrete and (self.loss == "mse" or self.policy == "deterministic"):
            raise ConfigError(f"{spec.env_id} has discrete actions: bc clones them with policy stochastic and loss log_prob")
        if spec.multi_discrete:
            raise ConfigError(f"bc cannot clone {spec.env_id}'s {spec.action_space_name} actions")
        if self.normalize_observations or self.normalize_rewards:
            raise ConfigError(
                "bc learns on raw observations (an expert normalizes with its own statistics): set normalize_observations and normalize_rewards to false"
            )
        if self.minibatches_per_epoch > self.batch_size:
            raise ConfigError(f"minibatches_per_epoch {self.minibatches_per_epoch} exceeds batch_size {self.batch_size}")
        from agents.experts import check_expert

        check_expert(self.expert, spec)
