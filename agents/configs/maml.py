"""Hyperparameters of MAML with VPG, PPO and TRPO (the algorithms: ``agents.algos.maml``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.configs.onpolicy import PolicyGradientOptions
from agents.errors import ConfigError
from agents.hyperparameters import hp


@dataclass
class MAMLConfig(PolicyGradientOptions):
    """Shared by the three variants; Finn et al. (2017), Sec. 5.3 and App. A.2, and garage.
    The advantage and entropy options are the on-policy family's (garage's names)."""

    meta_learning: ClassVar[bool] = True
    key_names: ClassVar[Mapping[str, str]] = {**PolicyGradientOptions.key_names, "baseline_reg_coef": "baseline_reg_coeff"}

    num_envs: int = hp(20, ge=1)
    """Sub-envs collecting a task's episodes in parallel (at most episodes_per_task are used)."""
    meta_batch_size: int = hp(20, ge=1)
    """Tasks per meta-update (20 for 2-D navigation in the paper; 40 for locomotion)."""
    episodes_per_task: int = hp(20, ge=1)
    """Episodes per task for each inner step and for the validation batch (K = 20)."""
    inner_lr: float = hp(0.1, gt=0.0)
    """alpha: step size of the inner (adaptation) gradient step."""
    outer_lr: float = hp(1e-3, gt=0.0, le=1.0)
    """Adam step size of the meta-update (VPG, PPO); unused by TRPO."""
    num_grad_updates: int = hp(1, ge=1)
    """Inner gradient steps, each on fresh episodes of the adapted policy."""
    first_order: bool = hp(False)
    """Drop the second-order term: treat d theta_i / d theta as the identity (FOMAML)."""
    gae_lambda: float = hp(1.0, ge=0.0, le=1.0)
    """GAE lambda over the linear baseline (1: returns minus the baseline, as in the paper)."""
    hidden_sizes: tuple[int, ...] = hp((100, 100), ge=1)
    """Policy hidden layers (two of 100 units in the paper)."""
    activation: str = hp("relu", choices=("tanh", "relu", "elu", "gelu"))
    """Hidden activation (ReLU in the paper)."""
    initial_log_std: float = hp(0.0)
    """Initial log standard deviation of the Gaussian policy (state-independent)."""
    baseline_reg_coef: float = hp(1e-5, gt=0.0)
    """Ridge coefficient of the linear baseline (raised x10 while the solve is not finite)."""

    def check_settings(self, spec: Any, algorithm: str) -> None:
        if self.normalize_observations or self.normalize_rewards:
            raise ConfigError(f"{algorithm} does not normalize observations or rewards (set normalize_observations and normalize_rewards to false)")


@dataclass
class MAMLVPGConfig(MAMLConfig):
    """MAML-VPG: garage's MAMLVPG defaults (inner_lr 0.1, outer_lr 1e-3, meta_batch_size 20)."""


@dataclass
class MAMLPPOConfig(MAMLConfig):
    """MAML-PPO: garage's MAMLPPO defaults (lr_clip_range 0.5, one Adam step per epoch)."""

    lr_clip_range: float = hp(0.5, gt=0.0)
    """epsilon of the clipped likelihood ratio."""
    outer_iterations: int = hp(1, ge=1)
    """Adam steps on each meta-batch (garage: 1; ProMP uses 5, where clipping starts to bind)."""


@dataclass
class MAMLTRPOConfig(MAMLConfig):
    """MAML-TRPO, the paper's locomotion setting: meta_batch_size 40, KL step 0.01; the
    conjugate-gradient settings of garage's ConjugateGradientOptimizer."""

    meta_batch_size: int = hp(40, ge=1)
    max_kl: float = hp(0.01, gt=0.0)
    """The largest mean KL between the adapted policies before and after a meta-update."""
    cg_iterations: int = hp(10, ge=1)
    """Conjugate-gradient iterations for the search direction."""
    cg_damping: float = hp(1e-5, ge=0.0)
    """Added to the Fisher matrix's diagonal."""
    line_search_shrink: float = hp(0.8, gt=0.0, lt=1.0)
    """Backtracking factor of the step."""
    line_search_max_steps: int = hp(15, ge=1)
    """Step sizes tried before the meta-update is rejected."""
