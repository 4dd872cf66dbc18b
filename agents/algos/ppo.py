"""Proximal Policy Optimization with the clipped surrogate objective.

Schulman, Wolski, Dhariwal, Radford, Klimov (2017), "Proximal Policy Optimization Algorithms",
arXiv:1707.06347, Algorithm 1:

    for iteration = 1, 2, ...:
        run the policy for T steps in each of N envs; compute GAE advantages A_t
        for K epochs, over minibatches of the N*T samples:
            maximize  E[min(r_t A_t, clip(r_t, 1-eps, 1+eps) A_t)] - c1 L^VF + c2 H[pi]

Defaults are the paper's MuJoCo settings (Table 3: T=2048, Adam 3e-4, 10 epochs, minibatch
64, gamma 0.99, lambda 0.95, eps 0.2) with the implementation details of OpenAI baselines'
ppo2 that reproduce its scores (Huang et al. 2022, "The 37 Implementation Details of PPO"):
orthogonal init, separate 64x64 tanh networks, observation and reward normalization,
advantage normalization per minibatch, value clipping, gradient clipping at 0.5, linear
learning-rate annealing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from agents.api import Acted, Algorithm, Hyperparameters, Transitions, hp, parameters_of, set_gradients
from agents.buffers import RolloutStorage
from agents.envs import EnvSpec
from agents.nets import ActorCritic


@dataclass
class PPOConfig(Hyperparameters):
    """PPO hyperparameters; defaults from Schulman et al. (2017) Table 3 and baselines ppo2."""

    normalize_observations: bool = hp(True)
    """Running mean/std observation normalization (ppo2's VecNormalize)."""
    normalize_rewards: bool = hp(True)
    """Scale rewards by the running std of the discounted return (ppo2's VecNormalize)."""
    num_steps: int = hp(2048, ge=1)
    """Steps collected per env between updates (the horizon T)."""
    learning_rate: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size (initial value when annealed)."""
    anneal_lr: bool = hp(True)
    """Decay the learning rate linearly to 0 over the run."""
    num_epochs: int = hp(10, ge=1)
    """Passes over each rollout (K)."""
    num_minibatches: int = hp(32, ge=1)
    """Minibatches per epoch; 2048 / 32 = 64 samples each."""
    gae_lambda: float = hp(0.95, ge=0.0, le=1.0)
    """GAE lambda."""
    clip_range: float = hp(0.2, gt=0.0)
    """Clipping epsilon of the probability ratio."""
    clip_value_loss: bool = hp(True)
    """Clip the value update around the old values with the same epsilon (ppo2)."""
    normalize_advantages: bool = hp(True)
    """Standardize advantages within each minibatch."""
    entropy_coef: float = hp(0.0, ge=0.0)
    """Entropy bonus coefficient c2."""
    value_coef: float = hp(0.5, ge=0.0)
    """Value loss coefficient c1."""
    max_grad_norm: float = hp(0.5, gt=0.0)
    """Global gradient-norm clip."""
    target_kl: float | None = hp(None, gt=0.0)
    """Stop the epochs early once the approximate KL exceeds this (None: never)."""
    hidden_sizes: tuple[int, ...] = hp((64, 64), ge=1)
    """Hidden layer widths of the policy and of the value network."""
    activation: str = hp("tanh", choices=("tanh", "relu", "elu", "gelu"))
    """Hidden activation."""
    initial_log_std: float = hp(0.0)
    """Initial log standard deviation of the Gaussian policy (continuous actions)."""


class PPO(Algorithm):
    """PPO-clip for discrete and continuous action spaces."""

    name = "ppo"
    Config = PPOConfig
    tunable_parameters = ("learning_rate", "clip_range", "entropy_coef", "value_coef", "max_grad_norm", "target_kl")

    def __init__(
        self,
        env_spec: EnvSpec,
        config: PPOConfig,
        total_steps: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ):
        self.spec, self.config, self.device = env_spec, config, torch.device(device)
        self.actor_critic = ActorCritic(env_spec, config.hidden_sizes, config.activation, config.initial_log_std).to(self.device)
        self.parameters = parameters_of(self.actor_critic)
        self.optimizer = torch.optim.Adam(self.parameters, lr=config.learning_rate, eps=1e-5)
        self.storage = RolloutStorage(
            config.num_steps, config.num_envs, env_spec.observation_shape, env_spec.action_shape, self.device, env_spec.discrete
        )
        self.generator = torch.Generator().manual_seed(seed)
        self.num_updates_total = max(1, total_steps // (config.num_steps * config.num_envs))
        self.num_updates = 0
        self._last_next_obs: torch.Tensor | None = None
        if not env_spec.discrete:
            self._action_low = np.asarray(env_spec.action_low, dtype=np.float32)
            self._action_high = np.asarray(env_spec.action_high, dtype=np.float32)

    # -- acting and collecting --------------------------------------------------------------

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, state: Any = None, deterministic: bool = False) -> Acted:
        dist = self.actor_critic.distribution(obs)
        actions = dist.mode() if deterministic else dist.sample()
        extras = {"log_prob": dist.log_prob(actions), "value": self.actor_critic.value(obs)}
        env_actions = actions.cpu().numpy()
        if not self.spec.discrete:
            env_actions = np.clip(env_actions, self._action_low, self._action_high)
        return Acted(actions, env_actions, None, extras)

    def observe(self, transitions: Transitions) -> None:
        truncation_values = None
        if transitions.truncated.any():
            with torch.inference_mode():
                truncation_values = self.actor_critic.value(transitions.next_obs)
        extras = transitions.acted.extras
        self.storage.insert(
            transitions.obs,
            transitions.acted.actions,
            extras["log_prob"],
            extras["value"],
            transitions.rewards,
            transitions.terminated,
            transitions.truncated,
            truncation_values,
        )
        self._last_next_obs = transitions.next_obs

    def ready_to_update(self) -> bool:
        return self.storage.full

    # -- learning ---------------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        """Advantages for the full rollout, then K epochs of minibatch steps."""
        config = self.config
        with torch.no_grad():
            last_values = self.actor_critic.value(self._last_next_obs)
        self.storage.compute_returns(last_values, config.gamma, config.gae_lambda)
        if config.anneal_lr:
            fraction = 1.0 - self.num_updates / self.num_updates_total
            self._set_learning_rate(config.learning_rate * max(fraction, 0.0))

        logs: dict[str, list[float]] = {}
        for _ in range(config.num_epochs):
            for batch in self.storage.minibatches(config.num_minibatches, self.generator):
                gradients, info = self.compute_gradients(batch)
                self.apply_gradients(gradients)
                for key, value in info.items():
                    logs.setdefault(key, []).append(value)
            if config.target_kl is not None and np.mean(logs["approx_kl"][-config.num_minibatches :]) > config.target_kl:
                break

        values, returns = self.storage.values.flatten(), self.storage.returns.flatten()
        explained_variance = 1.0 - (returns - values).var() / returns.var().clamp_min(1e-8)
        self.storage.reset()
        self.num_updates += 1
        result = {key: float(np.mean(vals)) for key, vals in logs.items()}
        result["explained_variance"] = float(explained_variance)
        result["learning_rate"] = self.optimizer.param_groups[0]["lr"]
        return result

    def compute_gradients(self, batch: Mapping[str, torch.Tensor]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Clipped surrogate + value + entropy loss on one minibatch -> gradients."""
        config = self.config
        dist = self.actor_critic.distribution(batch["obs"])
        log_probs = dist.log_prob(batch["actions"])
        log_ratio = log_probs - batch["log_probs"]
        ratio = log_ratio.exp()

        advantages = batch["advantages"]
        if config.normalize_advantages and advantages.numel() > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy_loss = self._policy_loss(ratio, advantages)
        value_loss = self._value_loss(self.actor_critic.value(batch["obs"]), batch["values"], batch["returns"])
        entropy = dist.entropy().mean()
        loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy

        gradients = torch.autograd.grad(loss, self.parameters, allow_unused=True)
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()  # Schulman's low-variance KL estimator
            clip_fraction = ((ratio - 1).abs() > config.clip_range).float().mean()
        info = {
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy.item(),
            "approx_kl": approx_kl.item(),
            "clip_fraction": clip_fraction.item(),
        }
        return list(gradients), info

    def _policy_loss(self, ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        """-min(r A, clip(r, 1-eps, 1+eps) A), averaged."""
        clipped = ratio.clamp(1 - self.config.clip_range, 1 + self.config.clip_range)
        return -torch.min(ratio * advantages, clipped * advantages).mean()

    def _value_loss(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
        """0.5 (V - R)^2, optionally the max with the clipped update's error (ppo2)."""
        unclipped = (values - returns).pow(2)
        if not self.config.clip_value_loss:
            return 0.5 * unclipped.mean()
        eps = self.config.clip_range
        clipped_values = old_values + (values - old_values).clamp(-eps, eps)
        return 0.5 * torch.max(unclipped, (clipped_values - returns).pow(2)).mean()

    def apply_gradients(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        if gradients is not None:
            set_gradients(self.parameters, gradients)
        torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm)
        self.optimizer.step()

    def _set_learning_rate(self, learning_rate: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate

    def _on_parameter_updated(self, name: str) -> None:
        if name == "learning_rate":
            self._set_learning_rate(self.config.learning_rate)

    # -- weights and state ------------------------------------------------------------------

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"actor_critic": self.actor_critic}

    def state_dict(self) -> dict[str, Any]:
        return {
            "actor_critic": self.actor_critic.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "num_updates": self.num_updates,
            "generator": self.generator.get_state(),
            "config": self.config.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.actor_critic.load_state_dict(state["actor_critic"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_updates = int(state["num_updates"])
        self.generator.set_state(state["generator"])
