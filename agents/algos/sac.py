"""Soft Actor-Critic with twin Q-functions and automatic entropy tuning.

Haarnoja, Zhou, Hartikainen, Tucker, Ha, Tan, Kumar, Zhu, Gupta, Abbeel, Levine (2018),
"Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905, Algorithm 1:

    for each environment step: a ~ pi(.|s); store (s, a, r, s', terminated) in D
    for each gradient step, on a batch from D:
        y      = r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s')
        critic: minimize sum_i (Q_i(s, a) - y)^2
        actor:  minimize alpha log pi(a~|s) - min_i Q_i(s, a~), a~ ~ pi(.|s) reparameterized
        alpha:  minimize -log(alpha) (log pi(a~|s) + H_target), H_target = -dim(A)
        Q'_i <- tau Q_i + (1 - tau) Q'_i

Defaults are the paper's (Table 1: Adam 3e-4 for all losses, batch 256, buffer 1e6, two
hidden layers of 256 ReLU units, tau 0.005, gamma 0.99, one gradient step per env step,
target entropy -dim(A)); uniform-random warm-up for the first 5,000 steps as in CleanRL's
``sac_continuous_action.py``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from agents.api import Acted, Algorithm, Hyperparameters, Transitions, hp, parameters_of, set_gradients
from agents.buffers import ReplayBuffer
from agents.envs import EnvSpec
from agents.nets import QEnsemble, SquashedGaussianActor, polyak_update


@dataclass
class SACConfig(Hyperparameters):
    """SAC hyperparameters; defaults from Haarnoja et al. (2018b) Table 1."""

    buffer_size: int = hp(1_000_000, ge=1)
    """Replay capacity in transitions."""
    batch_size: int = hp(256, ge=1)
    """Transitions per gradient step."""
    learning_starts: int = hp(5_000, ge=0)
    """Env steps of uniform-random actions before learning starts."""
    policy_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the actor."""
    q_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of the critics."""
    alpha_lr: float = hp(3e-4, gt=0.0, le=1.0)
    """Adam step size of log(alpha) when tuned automatically."""
    tau: float = hp(0.005, gt=0.0, le=1.0)
    """Polyak coefficient of the target critics."""
    alpha: float | None = hp(None, gt=0.0)
    """Fixed entropy temperature; None tunes it automatically toward target_entropy."""
    initial_alpha: float = hp(1.0, gt=0.0)
    """Starting temperature when tuned automatically."""
    target_entropy: float | None = hp(None)
    """Entropy target; None means -dim(A)."""
    num_critics: int = hp(2, ge=1)
    """Q-functions; targets use the minimum (clipped double Q)."""
    update_every: int = hp(1, ge=1)
    """Env steps (summed over envs) between updates."""
    gradient_steps: int = hp(1, ge=1)
    """Gradient steps per update."""
    hidden_sizes: tuple[int, ...] = hp((256, 256), ge=1)
    """Hidden layer widths of the actor and of each critic."""
    activation: str = hp("relu", choices=("tanh", "relu", "elu", "gelu"))
    """Hidden activation."""


class SAC(Algorithm):
    """SAC for continuous (Box) action spaces; actions are tanh-squashed, then rescaled."""

    name = "sac"
    Config = SACConfig
    tunable_parameters = ("policy_lr", "q_lr", "alpha_lr", "tau", "batch_size", "gradient_steps")
    supports_discrete = False

    def __init__(
        self,
        env_spec: EnvSpec,
        config: SACConfig,
        total_steps: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ):
        self.check_env_spec(env_spec)
        self.spec, self.config, self.device = env_spec, config, torch.device(device)
        self.actor = SquashedGaussianActor(env_spec, config.hidden_sizes, config.activation).to(self.device)
        self.critic = QEnsemble(env_spec, config.num_critics, config.hidden_sizes, config.activation).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.auto_alpha = config.alpha is None
        initial = config.initial_alpha if self.auto_alpha else config.alpha
        self.log_alpha = torch.tensor(float(np.log(initial)), device=self.device, requires_grad=self.auto_alpha)
        self.target_entropy = config.target_entropy if config.target_entropy is not None else -float(env_spec.num_actions)

        self.critic_parameters = parameters_of(self.critic)
        self.actor_parameters = parameters_of(self.actor)
        self.alpha_parameters = [self.log_alpha] if self.auto_alpha else []
        self.critic_optimizer = torch.optim.Adam(self.critic_parameters, lr=config.q_lr)
        self.actor_optimizer = torch.optim.Adam(self.actor_parameters, lr=config.policy_lr)
        self.alpha_optimizer = torch.optim.Adam(self.alpha_parameters, lr=config.alpha_lr) if self.auto_alpha else None

        self.buffer = ReplayBuffer(config.buffer_size, env_spec.observation_shape, env_spec.action_shape, self.device)
        self.generator = torch.Generator().manual_seed(seed)
        self.num_steps = 0  # env steps observed, summed over envs
        self._steps_since_update = 0
        low = torch.tensor(env_spec.action_low, dtype=torch.float32)
        high = torch.tensor(env_spec.action_high, dtype=torch.float32)
        self._action_scale, self._action_bias = (high - low) / 2, (high + low) / 2

    # -- acting and collecting --------------------------------------------------------------

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, state: Any = None, deterministic: bool = False) -> Acted:
        if not deterministic and self.num_steps < self.config.learning_starts:
            shape = (obs.shape[0], self.spec.num_actions)
            actions = (torch.rand(shape, generator=self.generator) * 2 - 1).to(self.device)
        else:
            dist = self.actor(obs)
            actions = dist.mode() if deterministic else dist.sample()
        env_actions = (actions.cpu() * self._action_scale + self._action_bias).numpy()
        return Acted(actions, env_actions)

    def observe(self, transitions: Transitions) -> None:
        self.buffer.add(
            transitions.obs, transitions.acted.actions, transitions.rewards, transitions.next_obs, transitions.terminated
        )
        n = transitions.obs.shape[0]
        self.num_steps += n
        self._steps_since_update += n

    def ready_to_update(self) -> bool:
        return self.num_steps >= self.config.learning_starts and self._steps_since_update >= self.config.update_every

    # -- learning ---------------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        self._steps_since_update = 0
        logs: dict[str, list[float]] = {}
        for _ in range(self.config.gradient_steps):
            batch = self.buffer.sample(self.config.batch_size, self.generator)
            gradients, info = self.compute_gradients(batch)
            self.apply_gradients(gradients)
            for key, value in info.items():
                logs.setdefault(key, []).append(value)
        return {key: float(np.mean(values)) for key, values in logs.items()}

    def compute_gradients(self, batch: Mapping[str, torch.Tensor]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Critic, actor and temperature losses on one batch -> their gradients, in that order."""
        alpha = self.log_alpha.exp().detach()
        critic_loss, q_mean = self._critic_loss(batch, alpha)
        actor_loss, log_probs = self._actor_loss(batch["obs"], alpha)
        gradients = list(torch.autograd.grad(critic_loss, self.critic_parameters))
        gradients += torch.autograd.grad(actor_loss, self.actor_parameters)
        info = {
            "critic_loss": critic_loss.item(),
            "actor_loss": actor_loss.item(),
            "q_mean": q_mean,
            "alpha": alpha.item(),
            "entropy": -log_probs.mean().item(),
        }
        if self.auto_alpha:
            alpha_loss = self._temperature_loss(log_probs)
            gradients += torch.autograd.grad(alpha_loss, self.alpha_parameters)
            info["alpha_loss"] = alpha_loss.item()
        return gradients, info

    def _critic_loss(self, batch: Mapping[str, torch.Tensor], alpha: torch.Tensor) -> tuple[torch.Tensor, float]:
        with torch.no_grad():
            next_actions, next_log_probs = self.actor(batch["next_obs"]).rsample_with_log_prob()
            next_q = self.critic_target(batch["next_obs"], next_actions).min(dim=0).values
            soft_next_value = next_q - alpha * next_log_probs
            targets = batch["rewards"] + self.config.gamma * (1.0 - batch["terminated"]) * soft_next_value
        q_values = self.critic(batch["obs"], batch["actions"])  # (num_critics, B)
        loss = (q_values - targets).pow(2).mean(dim=1).sum()
        return loss, q_values.mean().item()

    def _actor_loss(self, obs: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actions, log_probs = self.actor(obs).rsample_with_log_prob()
        q_values = self.critic(obs, actions).min(dim=0).values
        return (alpha * log_probs - q_values).mean(), log_probs.detach()

    def _temperature_loss(self, log_probs: torch.Tensor) -> torch.Tensor:
        return -(self.log_alpha * (log_probs + self.target_entropy)).mean()

    def apply_gradients(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """Step the critic, actor and temperature optimizers, then move the target critics."""
        parameters = self.critic_parameters + self.actor_parameters + self.alpha_parameters
        if gradients is not None:
            set_gradients(parameters, gradients)
        self.critic_optimizer.step()
        self.actor_optimizer.step()
        if self.alpha_optimizer is not None:
            self.alpha_optimizer.step()
        polyak_update(self.critic_target, self.critic, self.config.tau)

    def _on_parameter_updated(self, name: str) -> None:
        optimizer = {"policy_lr": self.actor_optimizer, "q_lr": self.critic_optimizer, "alpha_lr": self.alpha_optimizer}.get(name)
        if optimizer is not None:
            for group in optimizer.param_groups:
                group["lr"] = getattr(self.config, name)

    # -- weights and state ------------------------------------------------------------------

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target}

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, temperature and counters (the replay buffer is not included)."""
        return {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha_optimizer": self.alpha_optimizer.state_dict() if self.alpha_optimizer else None,
            "num_steps": self.num_steps,
            "generator": self.generator.get_state(),
            "config": self.config.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if self.alpha_optimizer is not None and state["alpha_optimizer"] is not None:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.num_steps = int(state["num_steps"])
        self.generator.set_state(state["generator"])
