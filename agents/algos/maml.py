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

Every loss is written once over a leading seed dimension S: parameters are {name: (S, ...)}
and a task's batch is (S, M, ...) (each seed's episodes, padding masked out). A run evaluates
them with S = 1 (its own parameters, ``OneSeed``); ``MAMLSeedBatch`` trains N seeds with
their parameters stacked, each seed sampling its own tasks and acting with its own draws.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from agents.algos.policy_gradient import entropy_bonus, entropy_transform, process_advantages
from agents.algos.seeds import MetaSeedBatch, StackedOptimizer, per_seed_logs, seed_axis
from agents.api import Acted, batched_by, set_gradients
from agents.batches import TensorBatch
from agents.configs.maml import MAMLConfig, MAMLPPOConfig, MAMLTRPOConfig, MAMLVPGConfig
from agents.envs import EnvSpec
from agents.meta import Episodes, MetaAlgorithm, PolicyOutput, TaskEnvs
from agents.nets import gemm
from agents.nets.distributions import Categorical, DiagGaussian
from agents.nets.mlp import _FUNCTIONS, mlp
from agents.nets.stacked import stack_parameters
from agents.optim import adam, backtracking_line_search, flatten_seeds, split_seeds, subtract_gradients, trust_region_step
from agents.tasks import Task

Parameters = dict[str, torch.Tensor]
TASK_STREAM = 1  # the task-sampling RNG is seeded by SeedSequence([seed, TASK_STREAM])
ACTING_STREAM = 2  # the acting draws' generator by SeedSequence([seed, ACTING_STREAM])


# --------------------------------------------------------------------------------------------
# The policy, acting from any parameter set
# --------------------------------------------------------------------------------------------


class PolicyNetwork(nn.Module):
    """pi(a | s): an MLP giving logits (Discrete) or the mean of a Gaussian with a
    state-independent log-std (Box); evaluated at any parameters, one set or S stacked."""

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

    def seeded(self, parameters: Mapping[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        """``forward`` at S parameter sets {name: (S, ...)}: obs (S, B, *obs_shape) -> (S, B, P),
        seed s at its own parameters (one batched matmul per layer)."""
        out = obs.flatten(2)
        for index, layer in enumerate(self.body):
            if isinstance(layer, nn.Linear):
                weight, bias = parameters[f"body.{index}.weight"], parameters[f"body.{index}.bias"]
                out = gemm.stacked_linear(out, weight, bias)
            else:
                out = _FUNCTIONS[type(layer)](out)
        if self.log_std is not None:
            out = torch.cat([out, parameters["log_std"].unsqueeze(1).expand_as(out)], dim=-1)
        return out

    def distribution(self, params: torch.Tensor) -> Categorical | DiagGaussian:
        if self.discrete:
            return Categorical(params)
        mean, log_std = params.chunk(2, dim=-1)
        return DiagGaussian(mean, log_std)


class AdaptedPolicy:
    """The policy network at one parameter set (the meta-policy's, or a task's adapted one),
    drawing its actions from ``generator``."""

    def __init__(self, network: PolicyNetwork, parameters: Parameters, spec: EnvSpec, generator: torch.Generator):
        self.network, self.parameters, self.spec, self.generator = network, parameters, spec, generator

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> PolicyOutput:
        with torch.no_grad():
            params = functional_call(self.network, self.parameters, (obs,))
            dist = self.network.distribution(params)
            actions = dist.mode() if deterministic else dist.sample(dist.draw_noise(self.generator))
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


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each seed's mean over its valid steps: (S, M) -> (S,)."""
    weights = mask.to(values.dtype)
    return (values * weights).sum(dim=-1) / weights.sum(dim=-1).clamp_min(1.0)


@dataclass(eq=False)
class Batch(TensorBatch):
    """One task's episodes, the E x T steps flattened to M slots (padding masked out), with the
    (constant) advantages: what the inner and outer losses read, with a leading seed dimension
    (S, M, ...) (``TensorBatch.stack`` of the seeds' own)."""

    observations: torch.Tensor  # (M, *obs_shape)
    actions: torch.Tensor  # (M, *action_shape)
    mask: torch.Tensor  # (M,) bool: a valid step
    advantages: torch.Tensor  # (M,), 0 on padding
    log_probs: torch.Tensor  # (M,) of the collecting policy
    dist_params: torch.Tensor  # (M, P) of the collecting policy
    returns: torch.Tensor  # () mean undiscounted episode return

    def seed(self, index: int) -> Batch:
        """Seed ``index``'s part of a batch of seeds, as a batch of one (1, ...)."""
        return self.apply(lambda tensor: tensor[index : index + 1])


@dataclass
class TaskBatch:
    """What one task contributes to a meta-update: the inner batches, then the validation one."""

    inner: list[Batch]
    validation: Batch

    def seed(self, index: int) -> TaskBatch:
        return TaskBatch([batch.seed(index) for batch in self.inner], self.validation.seed(index))


# --------------------------------------------------------------------------------------------
# The seeds an update works on
# --------------------------------------------------------------------------------------------


class OneSeed:
    """A run's own parameters as a batch of one seed (S = 1)."""

    num_seeds = 1

    def __init__(self, algorithm: MAML):
        self.members: list[MAML] = [algorithm]
        self.leaves: list[torch.Tensor] = list(algorithm.parameters)

    def theta(self) -> Parameters:
        """theta {name: (1, ...)}: views of the run's parameters (the meta-gradient reaches them)."""
        return {name: parameter.unsqueeze(0) for name, parameter in zip(self.members[0].names, self.leaves)}

    def apply(self, gradients: Sequence[torch.Tensor | None]) -> None:
        self.members[0].apply_gradient_list(list(gradients))


class MAMLSeedBatch(MetaSeedBatch):
    """N seeds of one MAML configuration, their policy parameters stacked (N, ...) (each
    member's are views of its slice) and their Adam stacked; see ``MetaSeedBatch``."""

    def __init__(self, members: Sequence[MAML]):
        super().__init__(members)
        self.members: list[MAML] = list(members)
        first = self.members[0]
        self.names = first.names
        self.leaves: list[torch.Tensor] = list(stack_parameters([member.parameters for member in self.members]))
        if first.uses_optimizer:
            self.optimizers["outer"] = StackedOptimizer([cast(torch.optim.Optimizer, member.optimizer) for member in self.members], self.leaves)

    def theta(self) -> Parameters:
        return dict(zip(self.names, self.leaves))

    def apply(self, gradients: Sequence[torch.Tensor | None]) -> None:
        set_gradients(cast(list[nn.Parameter], self.leaves), list(gradients))
        if "outer" in self.optimizers:
            self.optimizers["outer"].lr = self.members[0].config.outer_lr
            self.optimizers["outer"].step()
            for leaf in self.leaves:
                leaf.grad = None
        else:
            subtract_gradients(cast(list[nn.Parameter], self.leaves))

    def train_epoch(self, task_envs: Sequence[TaskEnvs]) -> list[dict[str, float]]:
        return self.members[0].train_seeds(self, task_envs)


Seeds = OneSeed | MAMLSeedBatch


# --------------------------------------------------------------------------------------------
# MAML
# --------------------------------------------------------------------------------------------


class MAML(MetaAlgorithm[AdaptedPolicy]):
    """The inner loop and the meta-gradient; subclasses give the outer objective and step."""

    seed_batch = batched_by("MAMLSeedBatch")

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
        self.generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, ACTING_STREAM]).generate_state(1)[0]))
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

    def policy_at(self, parameters: Parameters) -> AdaptedPolicy:
        """The policy at one parameter set {name: (...)}, acting with this run's draws."""
        return AdaptedPolicy(self.network, parameters, self.spec, self.generator)

    def act(self, obs: torch.Tensor, state: Any = None, deterministic: bool = False) -> Acted:
        """The meta-policy (before adaptation)."""
        out = self.get_exploration_policy().act(obs, deterministic)
        return Acted(out.actions, out.env_actions, state, {"log_probs": cast(torch.Tensor, out.log_probs)})  # an AdaptedPolicy gives them

    def get_exploration_policy(self) -> AdaptedPolicy:
        return self.policy_at({k: v.detach().clone() for k, v in self.meta_parameters().items()})

    def adapt_policy(self, exploration_policy: AdaptedPolicy, episodes: Episodes) -> AdaptedPolicy:
        """One inner gradient step from the exploration policy's parameters on ``episodes``."""
        start = {k: v.unsqueeze(0) for k, v in exploration_policy.parameters.items()}
        adapted = self.inner_step(start, seed_axis(self.make_batch(episodes)))
        return self.policy_at({k: v[0] for k, v in adapted.items()})

    # -- the inner loop ---------------------------------------------------------------------

    def make_batch(self, episodes: Episodes) -> Batch:
        """This run's episodes of one task as a batch (no seed dimension), with advantages over
        a linear baseline fitted on them."""
        config = self.config
        rewards = episodes.rewards
        if config.entropy_method == "max" and episodes.dist_params is not None:
            entropy = self.network.distribution(episodes.dist_params.flatten(0, 1)).entropy().view_as(rewards)
            rewards = rewards + config.entropy_coef * entropy_transform(config, entropy).detach() * episodes.mask
        values = linear_baseline(episodes, rewards, config.gamma, config.baseline_reg_coef)
        mask = episodes.mask.flatten()
        advantages = episode_advantages(rewards, values, episodes.mask.float(), config.gamma, config.gae_lambda).flatten()
        assert episodes.log_probs is not None and episodes.dist_params is not None  # collected by an AdaptedPolicy
        return Batch(
            observations=episodes.observations.flatten(0, 1),
            actions=episodes.actions.flatten(0, 1),
            mask=mask,
            advantages=process_advantages(config, advantages, counted=mask),
            log_probs=episodes.log_probs.flatten(0, 1),
            dist_params=episodes.dist_params.flatten(0, 1),
            returns=episodes.returns.mean(),
        )

    def distribution(self, parameters: Parameters, batch: Batch) -> Categorical | DiagGaussian:
        """pi(. | s) at each seed's ``parameters`` (S, ...) for its steps of ``batch`` (S, M)."""
        return self.network.distribution(self.network.seeded(parameters, batch.observations))

    def entropy_bonus(self, dist: Categorical | DiagGaussian, batch: Batch) -> torch.Tensor:
        """entropy_coef * each seed's mean entropy (S,) under ``regularized``, else 0."""
        return entropy_bonus(self.config, dist.entropy(), counted=batch.mask)

    def inner_loss(self, parameters: Parameters, batch: Batch) -> torch.Tensor:
        """The adaptation loss per seed (S,): -mean(log pi(a|s) A) minus the entropy bonus."""
        dist = self.distribution(parameters, batch)
        return -masked_mean(dist.log_prob(batch.actions) * batch.advantages, batch.mask) - self.entropy_bonus(dist, batch)

    def adapt(self, parameters: Parameters, batch: Batch, create_graph: bool) -> Parameters:
        """One inner step theta' = theta - inner_lr * grad inner_loss(theta), every seed's own.

        With ``create_graph`` the step is part of the graph, so a loss at theta' differentiates
        back to theta through the Hessian of the inner loss; without it the gradient is a
        constant and d theta' / d theta = I (first order). The seeds share no parameter, so
        the gradient of their summed losses is each seed's own.
        """
        names = list(parameters)
        gradients = torch.autograd.grad(self.inner_loss(parameters, batch).sum(), [parameters[k] for k in names], create_graph=create_graph)
        return {k: parameters[k] - self.config.inner_lr * g for k, g in zip(names, gradients)}

    def inner_step(self, parameters: Parameters, batch: Batch) -> Parameters:
        """The parameters one inner step on from ``parameters`` (S, ...), as values (no graph)."""
        with torch.enable_grad():
            start = {k: v.detach().requires_grad_() for k, v in parameters.items()}
            adapted = self.adapt(start, batch, create_graph=False)
        return {k: v.detach() for k, v in adapted.items()}

    def adapted_parameters(self, theta: Parameters, task_batch: TaskBatch, second_order: bool | None = None) -> Parameters:
        """theta_i(theta): the inner steps replayed from ``theta``, through their Hessians when
        ``second_order`` (by default: unless first_order)."""
        second_order = not self.config.first_order if second_order is None else second_order
        parameters = theta
        for batch in task_batch.inner:
            parameters = self.adapt(parameters, batch, create_graph=second_order)
        return parameters

    def train_epoch(self, task_envs: TaskEnvs) -> dict[str, float]:
        """Sample tasks, adapt to each on fresh episodes, meta-update on the validation episodes."""
        return self.train_seeds(OneSeed(self), [task_envs])[0]

    def train_seeds(self, seeds: Seeds, task_envs: Sequence[TaskEnvs]) -> list[dict[str, float]]:
        """``train_epoch`` of every seed at once: each samples its tasks and collects through
        its own ``task_envs[s]``; the inner steps and the meta-update run batched. Each seed's logs."""
        config = self.config
        tasks = [envs.sampler.sample(config.meta_batch_size, member.rng) for member, envs in zip(seeds.members, task_envs, strict=True)]
        batch = []
        for index in range(config.meta_batch_size):
            seed_tasks = [member_tasks[index] for member_tasks in tasks]
            parameters = {k: v.detach() for k, v in seeds.theta().items()}
            inner = []
            for _ in range(config.num_grad_updates):
                inner.append(self.collect(seeds, task_envs, seed_tasks, parameters))
                parameters = self.inner_step(parameters, inner[-1])
            batch.append(TaskBatch(inner, self.collect(seeds, task_envs, seed_tasks, parameters)))
        for s, member in enumerate(seeds.members):  # what ``update()`` takes by default
            member.last_batch = [task_batch.seed(s) for task_batch in batch]
        logs = self.update_seeds(seeds, batch)
        logs["pre_adaptation_return"] = torch.stack([task_batch.inner[0].returns for task_batch in batch]).mean(dim=0)
        logs["post_adaptation_return"] = torch.stack([task_batch.validation.returns for task_batch in batch]).mean(dim=0)
        return per_seed_logs(logs, seeds.num_seeds)

    def collect(self, seeds: Seeds, task_envs: Sequence[TaskEnvs], tasks: Sequence[Task], parameters: Parameters) -> Batch:
        """episodes_per_task episodes of each seed's task by its policy at its ``parameters[s]``."""
        return Batch.stack(
            [
                member.make_batch(envs.collect(task, member.policy_at({k: v[s] for k, v in parameters.items()}), self.config.episodes_per_task))
                for s, (member, envs, task) in enumerate(zip(seeds.members, task_envs, tasks, strict=True))
            ]
        )

    # -- the outer step ---------------------------------------------------------------------

    @abc.abstractmethod
    def outer_loss(self, parameters: Parameters, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The outer algorithm's loss (S,) of the adapted policies on one task's validation batch."""

    def meta_loss(self, theta: Parameters, batch: list[TaskBatch]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """mean_i L_outer(theta_i(theta); D_i') per seed (S,), differentiable w.r.t. theta."""
        losses, logs = [], []
        for task_batch in batch:
            loss, info = self.outer_loss(self.adapted_parameters(theta, task_batch), task_batch.validation)
            losses.append(loss)
            logs.append(info)
        return torch.stack(losses).mean(dim=0), {k: torch.stack([info[k] for info in logs]).mean(dim=0) for k in logs[0]}

    def meta_gradients(self, seeds: Seeds, batch: list[TaskBatch]) -> tuple[list[torch.Tensor | None], dict[str, torch.Tensor]]:
        """The meta-gradient of every seed's parameters (the order of ``seeds.leaves``)."""
        loss, logs = self.meta_loss(seeds.theta(), batch)
        gradients = torch.autograd.grad(loss.sum(), seeds.leaves, allow_unused=True)
        present = [g if g is not None else torch.zeros_like(p) for g, p in zip(gradients, seeds.leaves)]
        logs["meta_loss"] = loss.detach()
        logs["meta_gradient_norm"] = flatten_seeds(present, seeds.num_seeds).norm(dim=1)
        return list(gradients), logs

    def update_seeds(self, seeds: Seeds, batch: list[TaskBatch]) -> dict[str, torch.Tensor]:
        """The meta-update of every seed on its meta-batch (one Adam step); logs (S,)."""
        gradients, logs = self.meta_gradients(seeds, batch)
        seeds.apply(gradients)
        return logs

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.parameters

    def gradient_list(self, batch: list[TaskBatch]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """The meta-gradient of every policy parameter (the order of ``self.parameters``)."""
        gradients, logs = self.meta_gradients(OneSeed(self), batch)
        return gradients, per_seed_logs(logs, 1)[0]

    def apply_gradient_list(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """An Adam step of the outer learning rate."""
        assert self.optimizer is not None
        if gradients is not None:
            set_gradients(self.parameters, gradients)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def update(self, batch: list[TaskBatch] | None = None) -> dict[str, float]:
        """The meta-update on ``batch`` (the last epoch's by default)."""
        return per_seed_logs(self.update_seeds(OneSeed(self), self._batch_or_last(batch)), 1)[0]

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
            "generator": self.generator.get_state(),
            "config": self.config.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.network.load_state_dict(state["policy"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        if "generator" in state:  # checkpoints before the acting draws had their own generator lack it
            self.generator.set_state(state["generator"])
        self.config = self.Config.from_dict(self.Config.from_stored(state["config"]))  # saved under the names of its version
        self._on_parameter_updated("outer_lr")


class MAMLVPG(MAML):
    """MAML with the vanilla policy gradient as the outer objective (Adam)."""

    name = "maml_vpg"
    Config: ClassVar[type[MAMLVPGConfig]] = MAMLVPGConfig

    def outer_loss(self, parameters: Parameters, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.inner_loss(parameters, batch), {}


class MAMLPPO(MAML):
    """MAML with PPO's clipped surrogate as the outer objective (Adam)."""

    name = "maml_ppo"
    Config: ClassVar[type[MAMLPPOConfig]] = MAMLPPOConfig
    tunable_parameters = (*MAML.tunable_parameters, "lr_clip_range")
    config: MAMLPPOConfig

    def outer_loss(self, parameters: Parameters, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        dist = self.distribution(parameters, batch)
        ratio = (dist.log_prob(batch.actions) - batch.log_probs).exp()
        clip = self.config.lr_clip_range
        surrogate = masked_mean(torch.min(ratio * batch.advantages, ratio.clamp(1 - clip, 1 + clip) * batch.advantages), batch.mask)
        clip_fraction = masked_mean(((ratio - 1).abs() > clip).float(), batch.mask).detach()
        return -surrogate - self.entropy_bonus(dist, batch), {"clip_fraction": clip_fraction}

    def update_seeds(self, seeds: Seeds, batch: list[TaskBatch]) -> dict[str, torch.Tensor]:
        """outer_iterations Adam steps on the meta-batch."""
        logs: dict[str, torch.Tensor] = {}
        for _ in range(self.config.outer_iterations):
            gradients, logs = self.meta_gradients(seeds, batch)
            seeds.apply(gradients)
        return logs


class MAMLTRPO(MAML):
    """MAML with TRPO's natural-gradient step as the meta-update, every seed its own
    conjugate gradient and line search."""

    name = "maml_trpo"
    Config: ClassVar[type[MAMLTRPOConfig]] = MAMLTRPOConfig
    tunable_parameters = (*MAML.tunable_parameters, "max_kl")
    uses_optimizer = False
    config: MAMLTRPOConfig

    def objective(self, theta: Parameters, batch: list[TaskBatch], second_order: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per seed (S,): the surrogate mean_i mean(r A) (+ entropy bonus) and the mean KL
        between each task's adapted policy at collection and now, as functions of theta."""
        surrogates, kls = [], []
        for task_batch in batch:
            parameters = self.adapted_parameters(theta, task_batch, second_order)
            validation = task_batch.validation
            loss, _ = self.outer_loss(parameters, validation)
            old = self.network.distribution(validation.dist_params)
            kls.append(masked_mean(old.kl(self.distribution(parameters, validation)), validation.mask))
            surrogates.append(-loss)
        return torch.stack(surrogates).mean(dim=0), torch.stack(kls).mean(dim=0)

    def outer_loss(self, parameters: Parameters, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        dist = self.distribution(parameters, batch)
        ratio = (dist.log_prob(batch.actions) - batch.log_probs).exp()
        return -masked_mean(ratio * batch.advantages, batch.mask) - self.entropy_bonus(dist, batch), {}

    def meta_gradients(self, seeds: Seeds, batch: list[TaskBatch]) -> tuple[list[torch.Tensor | None], dict[str, torch.Tensor]]:
        """Minus each seed's accepted trust-region step (so that theta - g takes it)."""
        config = self.config
        surrogate, mean_kl = self.objective(seeds.theta(), batch)
        full_step, gradient = trust_region_step(surrogate, mean_kl, seeds.leaves, config.max_kl, config.cg_iterations, config.cg_damping)
        step, logs = backtracking_line_search(
            seeds.leaves,
            lambda: self.objective(seeds.theta(), batch, second_order=False),  # scoring a candidate needs no graph to theta
            full_step,
            surrogate.detach(),
            config.max_kl,
            config.line_search_shrink,
            config.line_search_max_steps,
        )
        logs.update({"surrogate": surrogate.detach(), "meta_gradient_norm": gradient.norm(dim=-1)})
        return [-part for part in split_seeds(step, seeds.leaves)], logs

    def apply_gradient_list(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """theta <- theta - g: takes the trust-region step."""
        if gradients is not None:
            set_gradients(self.parameters, gradients)
        subtract_gradients(self.parameters)
