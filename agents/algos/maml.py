"""Model-Agnostic Meta-Learning with VPG, PPO or TRPO as the outer optimizer.

Finn, Abbeel, Levine (2017), "Model-Agnostic Meta-Learning for Fast Adaptation of Deep
Networks", Algorithm 3 (reinforcement learning):

    repeat (one epoch):
        sample meta_batch_size tasks T_i
        for each task T_i:
            theta_i = theta
            for k = 1 .. num_grad_updates:
                D_ik = episodes_per_task episodes of pi(theta_i) on T_i
                A    = GAE(gamma, gae_lambda) with a linear baseline fitted on D_ik
                theta_i = theta_i - inner_lr * grad L_VPG(theta_i; D_ik)   (the inner step)
            D_i' = episodes of the adapted pi(theta_i) on T_i                 (validation)
        outer step on mean_i L_outer(theta_i(theta); D_i'): the gradient flows back through
        every inner step (second order) unless first_order, where d theta_i / d theta = I

The outer objective and step are the outer algorithm's:
    MAML-VPG   Adam on -mean(log pi(a|s) A)
    MAML-PPO   Adam on the clipped surrogate -mean(min(r A, clip(r, 1 -+ lr_clip_range) A)),
               r = pi(theta_i(theta)) / pi(theta_i at collection)
    MAML-TRPO  the natural-gradient step of mean(r A) with mean KL[pi(theta_i old) || pi(theta_i)]
               <= max_kl, the Fisher-vector products differentiating through the inner steps

The baseline is the linear feature baseline of Duan et al. (2016) (features obs, obs^2, t, t^2,
t^3, 1, refitted by ridge regression on each batch), the MAML paper's choice. Episodes end at
termination or the horizon without bootstrapping. Option names follow garage's MAMLVPG,
MAMLPPO and MAMLTRPO.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from agents.algos.onpolicy import entropy_bonus, entropy_transform, process_advantages
from agents.api import Acted, set_gradients
from agents.configs.maml import MAMLConfig, MAMLPPOConfig, MAMLTRPOConfig, MAMLVPGConfig
from agents.envs import EnvSpec
from agents.meta import Episodes, MetaAlgorithm, PolicyOutput, TaskEnvs
from agents.nets.distributions import Categorical, DiagGaussian
from agents.nets.mlp import mlp
from agents.optim import adam, backtracking_line_search, flatten, subtract_gradients, trust_region_step

Parameters = dict[str, torch.Tensor]
TASK_STREAM = 1  # the task-sampling RNG is seeded by SeedSequence([seed, TASK_STREAM])


# --------------------------------------------------------------------------------------------
# Hyperparameters
# --------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------
# The policy, acting from any parameter set
# --------------------------------------------------------------------------------------------


class PolicyNetwork(nn.Module):
    """pi(a | s): an MLP giving logits (Discrete) or the mean of a Gaussian with a
    state-independent log-std (Box); evaluated at any parameters with ``torch.func``."""

    def __init__(self, spec: EnvSpec, hidden_sizes: tuple[int, ...], activation: str, initial_log_std: float):
        super().__init__()
        self.discrete = spec.discrete
        self.body = mlp(int(np.prod(spec.observation_shape)), hidden_sizes, spec.num_actions, activation)
        self.log_std = None if spec.discrete else nn.Parameter(torch.full((spec.num_actions,), initial_log_std))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Distribution parameters (B, P): logits, or mean and log-std side by side."""
        out = self.body(obs.flatten(1))
        if self.log_std is not None:
            out = torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return out

    def distribution(self, params: torch.Tensor) -> Categorical | DiagGaussian:
        if self.discrete:
            return Categorical(params)
        mean, log_std = params.chunk(2, dim=-1)
        return DiagGaussian(mean, log_std)


class AdaptedPolicy:
    """The policy network at one parameter set (the meta-policy's, or a task's adapted one)."""

    def __init__(self, network: PolicyNetwork, parameters: Parameters, spec: EnvSpec):
        self.network, self.parameters, self.spec = network, parameters, spec

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> PolicyOutput:
        with torch.no_grad():
            params = functional_call(self.network, self.parameters, (obs,))
            dist = self.network.distribution(params)
            actions = dist.mode() if deterministic else dist.sample()
            log_probs = dist.log_prob(actions)
        env_actions = actions.cpu().numpy()
        if not self.spec.discrete:
            env_actions = np.clip(env_actions, self.spec.action_low, self.spec.action_high)
        return PolicyOutput(actions, env_actions, log_probs, params)


# --------------------------------------------------------------------------------------------
# Baseline and advantages
# --------------------------------------------------------------------------------------------


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Rewards-to-go sum_k gamma^k r_{t+k} within each episode; (E, T) -> (E, T), 0 on padding."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = (rewards[:, t] + gamma * running) * mask[:, t]
        returns[:, t] = running
    return returns


def linear_baseline(episodes: Episodes, rewards: torch.Tensor, gamma: float, reg_coeff: float) -> torch.Tensor:
    """Values (E, T) of the linear feature baseline fitted to these episodes' returns-to-go.

    Duan, Chen, Houthooft, Schulman, Abbeel (2016), "Benchmarking Deep RL for Continuous
    Control": features [o, o^2, t, t^2, t^3, 1] with o clipped to [-10, 10] and t in hundreds
    of steps; ridge regression, its coefficient raised tenfold while the solution is not finite.
    """
    obs = episodes.observations.flatten(2).double().clamp(-10.0, 10.0)
    num_episodes, horizon = episodes.mask.shape
    time = (torch.arange(horizon, device=obs.device, dtype=torch.float64) / 100.0).expand(num_episodes, horizon).unsqueeze(-1)
    features = torch.cat([obs, obs**2, time, time**2, time**3, torch.ones_like(time)], dim=-1)
    targets = discounted_returns(rewards.double(), episodes.mask, gamma)
    x, y = features[episodes.mask], targets[episodes.mask]
    gram, moment = x.T @ x, x.T @ y
    identity = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    for _ in range(5):
        weights = torch.linalg.lstsq(gram + reg_coeff * identity, moment.unsqueeze(-1)).solution.squeeze(-1)
        if torch.isfinite(weights).all():
            break
        reg_coeff *= 10
    return ((features @ weights) * episodes.mask).float()


def episode_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, gae_lambda: float) -> torch.Tensor:
    """GAE over padded episodes (E, T); an episode's last step bootstraps nothing."""
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:] * mask[:, 1:]
    deltas = (rewards + gamma * next_values - values) * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = (deltas[:, t] + gamma * gae_lambda * running) * mask[:, t]
        advantages[:, t] = running
    return advantages


@dataclass
class Batch:
    """Episodes of one task with their (constant) advantages at the valid steps (N,)."""

    episodes: Episodes
    advantages: torch.Tensor


@dataclass
class TaskBatch:
    """What one task contributes to a meta-update: the inner batches, then the validation one."""

    inner: list[Batch]
    validation: Batch


# --------------------------------------------------------------------------------------------
# MAML
# --------------------------------------------------------------------------------------------


class MAML(MetaAlgorithm[AdaptedPolicy]):
    """The inner loop and the meta-gradient; subclasses give the outer objective and step."""

    Config: ClassVar[type[MAMLConfig]] = MAMLConfig
    tunable_parameters: ClassVar[tuple[str, ...]] = ("inner_lr", "outer_lr", "entropy_coef", "gae_lambda")
    config: MAMLConfig

    def __init__(self, env_spec: EnvSpec, config: MAMLConfig, total_steps: int, device: torch.device | str = "cpu", seed: int = 0):
        self.check_env_spec(env_spec)
        self.check_config(config, env_spec)
        self.spec, self.config, self.device = env_spec, config, torch.device(device)
        self.network = PolicyNetwork(env_spec, config.hidden_sizes, config.activation, config.initial_log_std).to(self.device)
        self.parameters = [p for p in self.network.parameters()]
        self.names = [name for name, _ in self.network.named_parameters()]
        self.optimizer = adam(self.parameters, lr=config.outer_lr) if self.uses_optimizer else None
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, TASK_STREAM]))
        self.last_batch: list[TaskBatch] = []

    uses_optimizer: ClassVar[bool] = True

    # -- the meta-test protocol: one adaptation round per inner step ------------------------

    @property
    def collection_envs(self) -> int:  # type: ignore[override]
        return min(self.config.num_envs, self.config.episodes_per_task)

    @property
    def meta_test_exploration_episodes(self) -> int:  # type: ignore[override]
        return self.config.episodes_per_task

    @property
    def meta_test_adaptation_rounds(self) -> int:  # type: ignore[override]
        return self.config.num_grad_updates

    @property
    def meta_test_episodes(self) -> int:  # type: ignore[override]
        return self.config.episodes_per_task

    # -- acting -----------------------------------------------------------------------------

    def meta_parameters(self) -> Parameters:
        """theta, as live tensors (the meta-gradient reaches them)."""
        return dict(zip(self.names, self.parameters))

    def act(self, obs: torch.Tensor, state: Any = None, deterministic: bool = False) -> Acted:
        """The meta-policy (before adaptation)."""
        out = self.get_exploration_policy().act(obs, deterministic)
        return Acted(out.actions, out.env_actions, state, {"log_probs": cast(torch.Tensor, out.log_probs)})  # an AdaptedPolicy gives them

    def get_exploration_policy(self) -> AdaptedPolicy:
        return AdaptedPolicy(self.network, {k: v.detach().clone() for k, v in self.meta_parameters().items()}, self.spec)

    def adapt_policy(self, exploration_policy: AdaptedPolicy, episodes: Episodes) -> AdaptedPolicy:
        """One inner gradient step from the exploration policy's parameters on ``episodes``."""
        return self._step_policy(exploration_policy, self.make_batch(episodes))

    # -- the inner loop ---------------------------------------------------------------------

    def make_batch(self, episodes: Episodes) -> Batch:
        """Advantages of ``episodes`` over a linear baseline fitted on them."""
        config = self.config
        rewards = episodes.rewards
        if config.entropy_method == "max" and episodes.dist_params is not None:
            entropy = self.network.distribution(episodes.dist_params.flatten(0, 1)).entropy().view_as(rewards)
            rewards = rewards + config.entropy_coef * entropy_transform(config, entropy).detach() * episodes.mask
        values = linear_baseline(episodes, rewards, config.gamma, config.baseline_reg_coeff)
        advantages = episodes.valid(episode_advantages(rewards, values, episodes.mask.float(), config.gamma, config.gae_lambda))
        return Batch(episodes, process_advantages(config, advantages))

    def entropy_bonus(self, dist: Categorical | DiagGaussian) -> torch.Tensor:
        """entropy_coef * mean entropy under ``regularized``, else 0."""
        return entropy_bonus(self.config, dist.entropy())

    def distribution(self, parameters: Parameters, batch: Batch) -> Categorical | DiagGaussian:
        """pi(. | s) at ``parameters`` for the valid steps of ``batch``."""
        obs = batch.episodes.valid(batch.episodes.observations)
        return self.network.distribution(functional_call(self.network, parameters, (obs,)))

    def inner_loss(self, parameters: Parameters, batch: Batch) -> torch.Tensor:
        """The adaptation loss: -mean(log pi(a|s) A) minus the entropy bonus."""
        dist = self.distribution(parameters, batch)
        log_probs = dist.log_prob(batch.episodes.valid(batch.episodes.actions))
        return -(log_probs * batch.advantages).mean() - self.entropy_bonus(dist)

    def adapt(self, parameters: Parameters, batch: Batch, create_graph: bool) -> Parameters:
        """One inner step theta' = theta - inner_lr * grad inner_loss(theta).

        With ``create_graph`` the step is part of the graph, so a loss at theta' differentiates
        back to theta through the Hessian of the inner loss; without it the gradient is a
        constant and d theta' / d theta = I (first order).
        """
        names = list(parameters)
        gradients = torch.autograd.grad(self.inner_loss(parameters, batch), [parameters[k] for k in names], create_graph=create_graph)
        return {k: parameters[k] - self.config.inner_lr * g for k, g in zip(names, gradients)}

    def adapted_parameters(self, task_batch: TaskBatch, second_order: bool | None = None) -> Parameters:
        """theta_i(theta): the inner steps replayed from theta, through their Hessians when
        ``second_order`` (by default: unless first_order)."""
        second_order = not self.config.first_order if second_order is None else second_order
        parameters = self.meta_parameters()
        for batch in task_batch.inner:
            parameters = self.adapt(parameters, batch, create_graph=second_order)
        return parameters

    def train_epoch(self, task_envs: TaskEnvs) -> dict[str, float]:
        """Sample tasks, adapt to each on fresh episodes, meta-update on the validation episodes."""
        config = self.config
        tasks = task_envs.sampler.sample(config.meta_batch_size, self.rng)
        batch, pre_returns = [], []
        for task in tasks:
            policy = self.get_exploration_policy()
            inner = []
            for _ in range(config.num_grad_updates):
                episodes = task_envs.collect(task, policy, config.episodes_per_task)
                inner.append(self.make_batch(episodes))
                policy = self._step_policy(policy, inner[-1])
            validation = self.make_batch(task_envs.collect(task, policy, config.episodes_per_task))
            batch.append(TaskBatch(inner, validation))
            pre_returns.append(float(inner[0].episodes.returns.mean()))
        logs = self.update(batch)
        logs["pre_adaptation_return"] = float(np.mean(pre_returns))
        logs["post_adaptation_return"] = float(np.mean([float(b.validation.episodes.returns.mean()) for b in batch]))
        return logs

    def _step_policy(self, policy: AdaptedPolicy, batch: Batch) -> AdaptedPolicy:
        """The policy one inner step on from ``policy`` (values only: no graph to theta)."""
        with torch.enable_grad():
            start = {k: v.detach().requires_grad_() for k, v in policy.parameters.items()}
            adapted = self.adapt(start, batch, create_graph=False)
        return AdaptedPolicy(self.network, {k: v.detach() for k, v in adapted.items()}, self.spec)

    # -- the outer step ---------------------------------------------------------------------

    @abc.abstractmethod
    def outer_loss(self, parameters: Parameters, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The outer algorithm's loss of the adapted policy on one task's validation batch."""

    def meta_loss(self, batch: list[TaskBatch]) -> tuple[torch.Tensor, dict[str, float]]:
        """mean_i L_outer(theta_i(theta); D_i'), differentiable w.r.t. theta."""
        losses, logs = [], []
        for task_batch in batch:
            loss, info = self.outer_loss(self.adapted_parameters(task_batch), task_batch.validation)
            losses.append(loss)
            logs.append(info)
        keys = logs[0].keys() if logs else ()
        return torch.stack(losses).mean(), {k: float(np.mean([info[k] for info in logs])) for k in keys}

    def compute_gradients(self, batch: list[TaskBatch]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """The meta-gradient of every policy parameter (the order of ``self.parameters``)."""
        loss, logs = self.meta_loss(batch)
        gradients = torch.autograd.grad(loss, self.parameters, allow_unused=True)
        logs["meta_loss"] = loss.item()
        logs["meta_gradient_norm"] = flatten([g for g in gradients if g is not None]).norm().item()
        return list(gradients), logs

    def apply_gradients(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """An Adam step of the outer learning rate."""
        assert self.optimizer is not None
        if gradients is not None:
            set_gradients(self.parameters, gradients)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def update(self, batch: list[TaskBatch] | None = None) -> dict[str, float]:
        """The meta-update on ``batch`` (the last epoch's by default)."""
        batch = self._batch_or_last(batch)
        gradients, logs = self.compute_gradients(batch)
        self.apply_gradients(gradients)
        return logs

    def _batch_or_last(self, batch: list[TaskBatch] | None) -> list[TaskBatch]:
        if batch is None:
            if not self.last_batch:
                raise RuntimeError(f"{self.name} has no meta-batch to update on yet (train_epoch collects one; it is not checkpointed)")
            return self.last_batch
        self.last_batch = batch
        return batch

    def _on_parameter_updated(self, name: str) -> None:
        if name == "outer_lr" and self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.outer_lr

    # -- state --------------------------------------------------------------------------------

    def modules(self) -> dict[str, nn.Module]:
        return {"policy": self.network}

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.network.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "rng": self.rng.bit_generator.state,
            "config": self.config.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.network.load_state_dict(state["policy"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.config = self.Config.from_dict(state["config"])
        self._on_parameter_updated("outer_lr")


class MAMLVPG(MAML):
    """MAML with the vanilla policy gradient as the outer objective (Adam)."""

    name = "maml_vpg"
    Config: ClassVar[type[MAMLVPGConfig]] = MAMLVPGConfig

    def outer_loss(self, parameters: Parameters, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        dist = self.distribution(parameters, batch)
        log_probs = dist.log_prob(batch.episodes.valid(batch.episodes.actions))
        return -(log_probs * batch.advantages).mean() - self.entropy_bonus(dist), {}


class MAMLPPO(MAML):
    """MAML with PPO's clipped surrogate as the outer objective (Adam)."""

    name = "maml_ppo"
    Config: ClassVar[type[MAMLPPOConfig]] = MAMLPPOConfig
    tunable_parameters = (*MAML.tunable_parameters, "lr_clip_range")
    config: MAMLPPOConfig

    def outer_loss(self, parameters: Parameters, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        episodes = batch.episodes
        assert episodes.log_probs is not None  # collected by an AdaptedPolicy
        dist = self.distribution(parameters, batch)
        ratio = (dist.log_prob(episodes.valid(episodes.actions)) - episodes.valid(episodes.log_probs)).exp()
        clip = self.config.lr_clip_range
        surrogate = torch.min(ratio * batch.advantages, ratio.clamp(1 - clip, 1 + clip) * batch.advantages).mean()
        clip_fraction = ((ratio - 1).abs() > clip).float().mean().item()
        return -surrogate - self.entropy_bonus(dist), {"clip_fraction": clip_fraction}

    def update(self, batch: list[TaskBatch] | None = None) -> dict[str, float]:
        batch = self._batch_or_last(batch)
        logs: dict[str, float] = {}
        for _ in range(self.config.outer_iterations):
            gradients, logs = self.compute_gradients(batch)
            self.apply_gradients(gradients)
        return logs


class MAMLTRPO(MAML):
    """MAML with TRPO's natural-gradient step as the meta-update."""

    name = "maml_trpo"
    Config: ClassVar[type[MAMLTRPOConfig]] = MAMLTRPOConfig
    tunable_parameters = (*MAML.tunable_parameters, "max_kl")
    uses_optimizer = False
    config: MAMLTRPOConfig

    def objective(self, batch: list[TaskBatch], second_order: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Surrogate mean_i mean(r A) (+ entropy bonus) and the mean KL between each task's
        adapted policy at collection and now, both as functions of theta."""
        surrogates, kls = [], []
        for task_batch in batch:
            parameters = self.adapted_parameters(task_batch, second_order)
            validation = task_batch.validation
            loss, _ = self.outer_loss(parameters, validation)
            assert validation.episodes.dist_params is not None  # collected by an AdaptedPolicy
            old = self.network.distribution(validation.episodes.valid(validation.episodes.dist_params))
            kls.append(old.kl(self.distribution(parameters, validation)).mean())
            surrogates.append(-loss)
        return torch.stack(surrogates).mean(), torch.stack(kls).mean()

    def outer_loss(self, parameters: Parameters, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        episodes = batch.episodes
        assert episodes.log_probs is not None  # collected by an AdaptedPolicy
        dist = self.distribution(parameters, batch)
        ratio = (dist.log_prob(episodes.valid(episodes.actions)) - episodes.valid(episodes.log_probs)).exp()
        return -(ratio * batch.advantages).mean() - self.entropy_bonus(dist), {}

    def compute_gradients(self, batch: list[TaskBatch]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Minus the accepted trust-region step (so ``apply_gradients``' theta - g takes it)."""
        config = self.config
        surrogate, mean_kl = self.objective(batch)
        full_step, gradient = trust_region_step(surrogate, mean_kl, self.parameters, config.max_kl, config.cg_iterations, config.cg_damping)
        step, logs = backtracking_line_search(
            self.parameters,
            lambda: self.objective(batch, second_order=False),  # scoring a candidate needs no graph to theta
            full_step,
            surrogate.item(),
            config.max_kl,
            config.line_search_shrink,
            config.line_search_max_steps,
        )
        logs.update({"surrogate": surrogate.item(), "meta_gradient_norm": gradient.norm().item()})
        steps = step.split([p.numel() for p in self.parameters])
        return [-s.view_as(p) for s, p in zip(steps, self.parameters)], logs

    def apply_gradients(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """theta <- theta - g: takes the trust-region step."""
        if gradients is not None:
            set_gradients(self.parameters, gradients)
        subtract_gradients(self.parameters)
