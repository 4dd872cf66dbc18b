"""Replay, warm-up, network and recurrence settings shared by DDPG, TD3, SAC, DQN and MPO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agents.errors import ConfigError
from agents.hyperparameters import Hyperparameters, hp

ANNEAL_SCHEDULES = ("performance", "linear", "none")
"""How ERE's eta moves toward 1 (``agents.buffers.recent``)."""


@dataclass
class OffPolicyConfig(Hyperparameters):
    """Replay, warm-up and network settings shared by DDPG, TD3, SAC, DQN and MPO."""

    #: whether it has a recurrent variant (``recurrent: gru | lstm``): sequence replay with burn-in
    supports_recurrent: ClassVar[bool] = False

    buffer_size: int = hp(1_000_000, ge=1)
    """Replay capacity in transitions."""
    batch_size: int = hp(256, ge=1)
    """Transitions per gradient step."""
    start_steps: int = hp(0, ge=0)
    """Env steps of uniform-random actions at the start of training."""
    learning_starts: int = hp(0, ge=0)
    """Env steps collected before the first gradient step (warm-up)."""
    update_every: int = hp(1, ge=1)
    """Env steps between updates."""
    gradient_steps: int = hp(1, ge=1)
    """Gradient steps per update (per update_every env steps)."""
    reward_scale: float = hp(1.0, gt=0.0)
    """Rewards are multiplied by this before storage."""
    n_step: int = hp(1, ge=1)
    """Length of multi-step returns (cut at episode ends)."""
    prioritized: bool = hp(False)
    """Prioritized experience replay (Schaul et al. 2016)."""
    per_alpha: float = hp(0.6, ge=0.0)
    """How much prioritization is used (0 = uniform)."""
    per_beta: float = hp(0.4, ge=0.0, le=1.0)
    """Initial importance-sampling exponent, annealed to 1 over training."""
    per_eps: float = hp(1e-6, gt=0.0)
    """Added to |TD error| so no transition gets zero priority."""
    emphasize_recent: bool = hp(False)
    """Emphasizing recent experience (Wang & Ross 2019)."""
    ere_eta: float = hp(0.996, gt=0.0, le=1.0)
    """ERE's initial eta (1 = uniform)."""
    ere_c_min: int = hp(5_000, ge=1)
    """ERE's smallest window, in transitions."""
    ere_anneal: str = hp("performance", choices=ANNEAL_SCHEDULES)
    """How eta moves toward 1: by recent improvement, linearly in time, or not at all."""
    her_strategy: str = hp("none", choices=("none", "future", "final", "episode"))
    """Hindsight relabeling of goals (goal envs only); none disables it."""
    her_k: int = hp(4, ge=0)
    """HER relabel ratio: k relabeled transitions per original one (fraction k / (k + 1))."""
    hidden_sizes: tuple[int, ...] = hp((256, 256), ge=1)
    """Widths of the common trunk of every network."""
    activation: str = hp("relu", choices=("tanh", "relu", "elu", "gelu"))
    """Hidden activation."""
    obs_extractor_sizes: tuple[int, ...] = hp((), ge=1)
    """Observation feature extractor widths (empty: identity)."""
    act_extractor_sizes: tuple[int, ...] = hp((), ge=1)
    """Action feature extractor widths of the critics (empty: identity)."""
    recurrent: str = hp("none", choices=("none", "gru", "lstm"))
    """Recurrent encoder in front of every network (dqn and sac); none for feed-forward."""
    recurrent_size: int = hp(128, ge=1)
    """Hidden units of the recurrent cell."""
    sequence_length: int = hp(80, ge=1)
    """Steps per replayed sequence that the loss covers (R2D2: 80)."""
    burn_in: int = hp(40, ge=0)
    """Steps before each sequence that only recompute the hidden state (R2D2: 40)."""
    sequence_overlap: float = hp(0.5, ge=0.0, lt=1.0)
    """Fraction of a sequence shared with the next one of the same env (R2D2: 0.5)."""

    def refill_size(self, capacity: int | None = None) -> int:
        """Transitions a learner restored without its replay buffer stores again before updating,
        in a buffer of ``capacity`` (default ``buffer_size``; the learner's is rounded to its envs)."""
        return min(max(self.learning_starts, self.batch_size), (capacity or self.buffer_size) - 1)

    def first_update(self, refilling: bool = False) -> tuple[int, str]:
        # (``OffPolicyLearner``: steps count toward an update only past the warm-up, or the refill)
        if refilling:
            refill = self.refill_size()
            return (
                refill + self.update_every,
                f"the replay buffer refilled to {refill:,} transitions (max of learning_starts and batch_size), then update_every {self.update_every:,}",
            )
        return self.learning_starts + self.update_every, f"learning_starts {self.learning_starts:,} + update_every {self.update_every:,}"

    def budget_schedules(self) -> list[str]:
        """PER's beta annealed to 1 over the budget, ERE's linear eta schedule, where on."""
        schedules = ["per_beta"] if self.prioritized else []
        return schedules + (["ere_anneal"] if self.emphasize_recent and self.ere_anneal == "linear" else [])

    def check_settings(self, spec: Any, algorithm: str) -> None:
        """The replay options must fit the env and each other."""
        if self.her_strategy != "none":
            if spec.goal is None:
                raise ConfigError(f"her_strategy={self.her_strategy!r} needs a goal env; {spec.env_id} has no desired_goal")
            if self.n_step > 1:
                raise ConfigError("her_strategy cannot be combined with n_step > 1 (relabeling recomputes one-step rewards)")
            if self.normalize_observations or self.normalize_rewards:
                raise ConfigError("her_strategy needs raw observations and rewards: set normalize_observations and normalize_rewards to false")
        if self.recurrent != "none":
            if not self.supports_recurrent:
                raise ConfigError(f"{algorithm} has no recurrent variant; recurrent={self.recurrent!r} works with dqn and sac")
            combined = [
                name
                for name, on in (
                    ("prioritized", self.prioritized),
                    ("emphasize_recent", self.emphasize_recent),
                    ("her_strategy", self.her_strategy != "none"),
                    ("n_step > 1", self.n_step > 1),
                )
                if on
            ]
            if combined:
                raise ConfigError(f"recurrent sequence replay cannot be combined with {', '.join(combined)}")
