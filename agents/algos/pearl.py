"""PEARL: Probabilistic Embeddings for Actor-critic RL.

Rakelly, Zhou, Quillen, Finn, Levine (2019), "Efficient Off-Policy Meta-Reinforcement Learning
via Probabilistic Context Variables", Algorithms 1 and 2:

    c     = transitions (s, a, r[, s']) of one task (its context)
    q(z|c) = prod_n N(mu(c_n), sigma^2(c_n))           the encoder's factors, multiplied
                                                       (the information bottleneck)
    meta-training, one epoch:
        [first epoch] collect num_initial_steps on every training task with z ~ prior
        for num_tasks_sample random training tasks i:
            clear task i's encoder buffer
            num_steps_prior steps with z ~ N(0, I)                      -> RL and encoder buffers
            num_steps_posterior steps, z ~ q(z | c_i)                   -> RL and encoder buffers
            num_extra_rl_steps_posterior steps, z ~ q(z | c_i)          -> RL buffer only
            (as in the authors' code, each posterior phase starts with z ~ prior and draws z from
            q(z | c), c from task i's encoder buffer, after every update_post_train episodes)
        num_steps_per_epoch gradient steps, each on meta_batch_size training tasks:
            c_i ~ encoder buffer i (embedding_batch_size), z_i ~ q(z | c_i) (reparameterized)
            (s, a, r, s', d) ~ RL buffer i (batch_size)
            L_KL = kl_lambda * sum_i KL(q(z|c_i) || N(0, I))
            L_Q  = mean (Q_j(s, a, z) - (reward_scale r + gamma (1 - d) V_target(s', z)))^2, j = 1, 2
                   the encoder learns from L_KL + L_Q (z is detached everywhere else)
            L_V  = mean (V(s, z) - (min_j Q_j(s, a~pi, z) - log pi(a~|s, z)))^2
            L_pi = mean (log pi(a~|s, z) - min_j Q_j(s, a~, z)) + mean/std/pre-activation regularizers
            V_target <- (1 - tau) V_target + tau V
    meta-test on a task: act with z ~ prior, then z ~ q(z | context collected so far) (posterior
        sampling); score the episodes of the adapted policy; every meta-test episode takes the
        policy's deterministic action, as in the authors' evaluation

All losses are computed at the same parameters, then every optimizer steps, so the gradients
can be computed on one process and applied on another; the authors' code steps the
Q-functions before computing the value and policy losses. Defaults are the authors' default
configuration (their rlkit-based code, configs/default.py); garage's PEARL names the options.

The losses are written once over a leading seed dimension (``seeds_losses``): a run evaluates
them with its own networks (S = 1), ``PEARLSeedBatch`` with N seeds' networks stacked. Every
draw (latent samples, actions, replay indices, task choices) comes from the run's own
generators, so a batched seed is its run alone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agents.algos.offpolicy_losses import one_seed
from agents.algos.seeds import MetaSeedBatch, StackedOptimizer, per_seed_logs, seed_axis, stack_batches, stacked_noise
from agents.api import Acted, batched_by, parameters_of, set_gradients
from agents.batches import TensorBatch
from agents.buffers import TaskBuffer
from agents.configs.pearl import PEARLConfig
from agents.envs import EnvSpec
from agents.meta import Episodes, MetaAlgorithm, PolicyOutput, TaskEnvs
from agents.nets.distributions import TanhGaussian, standard_normal
from agents.nets.mlp import mlp, polyak_update
from agents.nets.stacked import StackedMLP
from agents.optim import adam
from agents.tasks import Task

TASK_STREAM = 1  # the task-choice RNG is seeded by SeedSequence([seed, TASK_STREAM])


class ContextEncoder(nn.Module):
    """The MLP ``body`` maps each context transition to (mu, raw) of one Gaussian factor of
    q(z | c), sigma^2 = softplus(raw) (``PEARL.posterior`` applies it, for one seed or many)."""

    def __init__(self, in_features: int, hidden_sizes: tuple[int, ...], latent_dim: int):
        super().__init__()
        self.latent_dim = latent_dim
        self.body = mlp(in_features, hidden_sizes, 2 * latent_dim, "relu")


def product_of_gaussians(mu: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (normalized) product of N Gaussian factors along dim -2: (..., N, L) -> (..., L)."""
    precision = 1.0 / var
    posterior_var = 1.0 / precision.sum(dim=-2)
    return posterior_var * (mu * precision).sum(dim=-2), posterior_var


def gaussian_kl_to_unit(mu: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, var) || N(0, I)) summed over the latent dimensions: (..., L) -> (...,)."""
    return 0.5 * (var + mu**2 - 1.0 - var.log()).sum(dim=-1)


class ContextPolicy:
    """pi(a | s, z) for one sampled z, and the context it was inferred from."""

    def __init__(self, algo: PEARL, context: torch.Tensor | None, z: torch.Tensor):
        self.algo, self.context, self.z = algo, context, z

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> PolicyOutput:
        with torch.no_grad():
            dist = self.algo.policy_distribution(obs, self.z.expand(obs.shape[0], -1))
            actions = dist.mode() if deterministic else dist.sample(dist.draw_noise(self.algo.generator))
        return PolicyOutput(actions, self.algo.to_env_actions(actions))


Network = Callable[[torch.Tensor], torch.Tensor]


@dataclass(eq=False)
class PEARLBatch(TensorBatch):
    """One gradient step's data of T training tasks: B RL transitions (T, B, ...) and N context
    transitions (T, N, C) of each; a leading seed dimension (S, ...) where the losses read it."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor
    context: torch.Tensor


@dataclass
class PEARLNetworks:
    """What the losses run on, each (S, B, in) -> (S, B, out): one run's networks seen as S = 1
    (``PEARL.networks``) or N seeds' stacked (``PEARLSeedBatch``)."""

    encoder: Network
    policy: Network
    qfs: Network
    """The twin Q-functions: (S, B, in) -> (S, 2, B, 1)."""
    vf: Network
    target_vf: Network
    qfs_frozen: Network
    """``qfs`` with their parameters detached (the policy's loss must not train them)."""


class PEARL(MetaAlgorithm[ContextPolicy]):
    """SAC with a learned task variable z inferred from context, trained on per-task buffers."""

    seed_batch = batched_by("PEARLSeedBatch")

    name = "pearl"
    critic_ensemble = True
    Config: ClassVar[type[PEARLConfig]] = PEARLConfig
    has_replay_buffer = True
    tunable_parameters = ("kl_lambda", "reward_scale", "actor_lr", "critic_lr", "value_lr", "context_lr")
    meta_test_exploration_episodes = 1
    meta_test_deterministic = True
    config: PEARLConfig

    def __init__(self, env_spec: EnvSpec, config: PEARLConfig, total_steps: int, device: torch.device | str = "cpu", seed: int = 0):
        self.check_env_spec(env_spec)
        self.check_config(config, env_spec)
        self.spec, self.config, self.device = env_spec, config, torch.device(device)
        obs_dim, action_dim, latent = int(np.prod(env_spec.observation_shape)), env_spec.num_actions, config.latent_dim
        self.obs_dim, self.action_dim = obs_dim, action_dim
        context_dim = obs_dim + action_dim + 1 + (obs_dim if config.use_next_obs_in_context else 0)
        hidden = config.hidden_sizes
        self.encoder = ContextEncoder(context_dim, config.encoder_hidden_sizes, latent).to(self.device)
        self.policy = mlp(obs_dim + latent, hidden, 2 * action_dim, "relu").to(self.device)
        self.qf1 = mlp(obs_dim + action_dim + latent, hidden, 1, "relu").to(self.device)
        self.qf2 = mlp(obs_dim + action_dim + latent, hidden, 1, "relu").to(self.device)
        self.vf = mlp(obs_dim + latent, hidden, 1, "relu").to(self.device)
        self.target_vf = copy.deepcopy(self.vf).requires_grad_(False)
        self.optimizers = {
            "policy": adam(self.policy.parameters(), lr=config.actor_lr),
            "qf1": adam(self.qf1.parameters(), lr=config.critic_lr),
            "qf2": adam(self.qf2.parameters(), lr=config.critic_lr),
            "vf": adam(self.vf.parameters(), lr=config.value_lr),
            "context": adam(self.encoder.parameters(), lr=config.context_lr),
        }
        self.parameters = parameters_of(self.encoder, self.policy, self.qf1, self.qf2, self.vf)
        self.rl_buffers = [TaskBuffer(obs_dim, action_dim, config.buffer_size, self.device) for _ in range(config.num_train_tasks)]
        self.encoder_buffers = [TaskBuffer(obs_dim, action_dim, config.buffer_size, self.device) for _ in range(config.num_train_tasks)]
        self.train_tasks: list[Task] | None = None
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, TASK_STREAM]))
        self.generator = torch.Generator().manual_seed(seed)  # every torch draw: z samples, actions, replay indices
        self.epochs = 0
        self._low = torch.as_tensor(env_spec.action_low, dtype=torch.float32, device=self.device)
        self._high = torch.as_tensor(env_spec.action_high, dtype=torch.float32, device=self.device)

    # -- the meta-test protocol ---------------------------------------------------------------

    @property
    def meta_test_adaptation_rounds(self) -> int:  # type: ignore[override]
        return self.config.meta_test_context_episodes

    @property
    def meta_test_episodes(self) -> int:  # type: ignore[override]
        return self.config.meta_test_episodes

    # -- acting ---------------------------------------------------------------------------------

    def to_env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """tanh-space actions in (-1, 1) rescaled to the env's bounds."""
        return (self._low + (actions + 1.0) * 0.5 * (self._high - self._low)).cpu().numpy()

    def policy_distribution(self, obs: torch.Tensor, z: torch.Tensor) -> TanhGaussian:
        mean, log_std = self.policy(torch.cat([obs.flatten(1), z], dim=-1)).split(self.action_dim, dim=-1)
        return TanhGaussian(mean, log_std.clamp(-20.0, 2.0))

    def prior_z(self) -> torch.Tensor:
        """z ~ N(0, I) (1, latent)."""
        return standard_normal((1, self.config.latent_dim), self.generator, self.device)

    def posterior(self, encoder: Network, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(z | c) of each seed's context (S, T, N, C) by its encoder: means and variances (S, T, latent)."""
        seeds, tasks, count, _ = context.shape
        latent = self.config.latent_dim
        mu, raw = encoder(context.flatten(1, 2)).view(seeds, tasks, count, 2 * latent).split(latent, dim=-1)
        if self.config.use_information_bottleneck:
            return product_of_gaussians(mu, F.softplus(raw).clamp_min(1e-7))
        return mu.mean(dim=-2), torch.zeros_like(mu[:, :, 0])

    def sample_posterior(self, context: torch.Tensor) -> torch.Tensor:
        """One z (1, latent) from q(z | context (N, C)), without gradients."""
        with torch.no_grad():
            mean, var = self.posterior(one_seed(self.encoder.body), context[None, None])
            return mean[0] + var[0].sqrt() * standard_normal(tuple(mean[0].shape), self.generator, self.device)

    def act(self, obs: torch.Tensor, state: Any = None, deterministic: bool = False) -> Acted:
        """The policy before any context: z drawn from the prior, or (deterministic) the
        prior's mean z = 0 and the policy's mode."""
        z = torch.zeros(1, self.config.latent_dim, device=self.device) if deterministic else self.prior_z()
        out = ContextPolicy(self, None, z).act(obs, deterministic)
        return Acted(out.actions, out.env_actions, state)

    def get_exploration_policy(self) -> ContextPolicy:
        return ContextPolicy(self, None, self.prior_z())

    def adapt_policy(self, exploration_policy: ContextPolicy, episodes: Episodes) -> ContextPolicy:
        """Add ``episodes`` to the policy's context and sample z from the posterior over all of it."""
        context = self.context_of(episodes)
        if exploration_policy.context is not None:
            context = torch.cat([exploration_policy.context, context])
        return ContextPolicy(self, context, self.sample_posterior(context))

    def context_of(self, episodes: Episodes) -> torch.Tensor:
        """The context transitions (N, C) of the valid steps of ``episodes``."""
        return self._context(self._transitions(episodes))

    def _context(self, transitions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        parts = [transitions["obs"], transitions["actions"], transitions["rewards"].unsqueeze(-1)]
        if self.config.use_next_obs_in_context:
            parts.append(transitions["next_obs"])
        return torch.cat(parts, dim=-1)

    @staticmethod
    def _transitions(episodes: Episodes) -> dict[str, torch.Tensor]:
        return {
            "obs": episodes.valid(episodes.observations).flatten(1),
            "actions": episodes.valid(episodes.actions),
            "rewards": episodes.valid(episodes.rewards),
            "next_obs": episodes.valid(episodes.next_observations).flatten(1),
            "terminated": episodes.valid(episodes.terminated).float(),
        }

    # -- meta-training --------------------------------------------------------------------------

    def collect(self, task_envs: TaskEnvs, index: int, steps: int, posterior: bool, to_encoder: bool) -> tuple[list[float], list[float]]:
        """At least ``steps`` env steps on training task ``index``, one episode at a time, with
        z ~ prior, or (posterior) z ~ q(z | c) drawn after every update_post_train episodes
        from context of the task's encoder buffer. The returns of the episodes acted with a
        prior z and with a posterior z."""
        assert self.train_tasks is not None
        z, from_posterior, collected, episodes_since = self.prior_z(), False, 0, 0
        prior_returns: list[float] = []
        posterior_returns: list[float] = []
        while collected < steps:
            episodes = task_envs.collect(self.train_tasks[index], ContextPolicy(self, None, z), 1)
            transitions = self._transitions(episodes)
            self.rl_buffers[index].add(transitions)
            if to_encoder:
                self.encoder_buffers[index].add(transitions)
            collected += episodes.num_steps
            (posterior_returns if from_posterior else prior_returns).append(float(episodes.returns.sum()))
            episodes_since += 1
            if posterior and episodes_since >= self.config.update_post_train and self.encoder_buffers[index].size:
                context = self._context(self.encoder_buffers[index].sample(self.config.embedding_batch_size, self.generator))
                z, from_posterior, episodes_since = self.sample_posterior(context), True, 0
            elif not posterior:
                z = self.prior_z()  # a fresh prior draw for every episode
        return prior_returns, posterior_returns

    def train_epoch(self, task_envs: TaskEnvs) -> dict[str, float]:
        logs = self.train_seeds(OneSeed(self), [task_envs])[0]
        if isinstance(logs, Exception):
            raise logs
        return logs

    def train_seeds(self, seeds: Seeds, task_envs: Sequence[TaskEnvs]) -> list[dict[str, float] | Exception]:
        """``train_epoch`` of every seed: each collects through its own ``task_envs[s]`` (a seed
        whose envs fail gets its exception in its place and leaves the epoch), then
        num_steps_per_epoch gradient steps of the others, batched. Each seed's logs."""
        returns: list[tuple[list[float], list[float]] | Exception] = []
        for member, envs in zip(seeds.members, task_envs, strict=True):
            try:
                returns.append(member.collect_epoch(envs))
            except Exception as error:  # noqa: BLE001 - this seed's outcome; the others go on
                returns.append(error)
        alive = [index for index, outcome in enumerate(returns) if not isinstance(outcome, Exception)]
        if len(alive) < seeds.num_seeds:
            if not alive:
                return cast("list[dict[str, float] | Exception]", returns)
            seeds = seeds.subset(alive)
        logs: dict[str, list[torch.Tensor]] = {}
        for _ in range(self.config.num_steps_per_epoch):
            for key, value in self.update_seeds(seeds, seeds.sample_batch()).items():
                logs.setdefault(key, []).append(value)
        means = iter(per_seed_logs({key: torch.stack(values).mean(dim=0) for key, values in logs.items()}, seeds.num_seeds))
        outcomes: list[dict[str, float] | Exception] = []
        for outcome in returns:
            if isinstance(outcome, Exception):
                outcomes.append(outcome)
                continue
            summary = next(means)
            prior_returns, posterior_returns = outcome
            if prior_returns:
                summary["pre_adaptation_return"] = float(np.mean(prior_returns))  # z ~ prior
            if posterior_returns:
                summary["post_adaptation_return"] = float(np.mean(posterior_returns))  # z ~ posterior
            outcomes.append(summary)
        for member in seeds.members:
            member.epochs += 1
        return outcomes

    def collect_epoch(self, task_envs: TaskEnvs) -> tuple[list[float], list[float]]:
        """One epoch's collection on the training tasks; the returns of the episodes acted
        with a prior z and with a posterior z."""
        config = self.config
        if self.train_tasks is None:
            self.train_tasks = task_envs.sampler.train_tasks(config.num_train_tasks)
        prior_returns: list[float] = []
        posterior_returns: list[float] = []

        def collect(index: int, steps: int, posterior: bool, to_encoder: bool) -> None:
            prior, post = self.collect(task_envs, index, steps, posterior, to_encoder)
            prior_returns.extend(prior)
            posterior_returns.extend(post)

        for index in range(config.num_train_tasks):
            # the first epoch, or a resume without the buffers: fill every task's buffers first
            if self.rl_buffers[index].size == 0 or self.encoder_buffers[index].size == 0:
                collect(index, config.num_initial_steps or config.num_steps_prior + config.num_steps_posterior, False, True)
        for index in self.rng.integers(config.num_train_tasks, size=config.num_tasks_sample):
            self.encoder_buffers[index].clear()
            if config.num_steps_prior:
                collect(index, config.num_steps_prior, False, True)
            if config.num_steps_posterior:
                collect(index, config.num_steps_posterior, True, True)
            if config.num_extra_rl_steps_posterior:
                collect(index, config.num_extra_rl_steps_posterior, True, False)
        return prior_returns, posterior_returns

    def sample_batch(self) -> PEARLBatch:
        """meta_batch_size training tasks: RL transitions (T, B, .) and context (T, N, C)."""
        config = self.config
        indices = self.rng.choice(config.num_train_tasks, size=config.meta_batch_size, replace=config.meta_batch_size > config.num_train_tasks)
        rl = [self.rl_buffers[i].sample(config.batch_size, self.generator) for i in indices]
        context = [self._context(self.encoder_buffers[i].sample(config.embedding_batch_size, self.generator)) for i in indices]
        return PEARLBatch(**{key: torch.stack([sample[key] for sample in rl]) for key in rl[0]}, context=torch.stack(context))

    def networks(self) -> PEARLNetworks:
        """This run's networks seen with a seed dimension of 1."""

        def frozen(module: nn.Module) -> Network:
            return lambda inputs: torch.func.functional_call(module, {k: v.detach() for k, v in module.named_parameters()}, (inputs,))

        def twins(qf1: Network, qf2: Network) -> Network:
            return lambda inputs: torch.stack([qf1(inputs[0]), qf2(inputs[0])]).unsqueeze(0)

        return PEARLNetworks(
            encoder=one_seed(self.encoder.body),
            policy=one_seed(self.policy),
            qfs=twins(self.qf1, self.qf2),
            vf=one_seed(self.vf),
            target_vf=one_seed(self.target_vf),
            qfs_frozen=twins(frozen(self.qf1), frozen(self.qf2)),
        )

    def seeds_losses(
        self, networks: PEARLNetworks, batch: PEARLBatch, noise: Callable[[Sequence[int]], torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Every loss per seed (S,) at the current parameters, each differentiable only where it
        trains. ``batch``: RL transitions (S, T, B, ...) and context (S, T, N, C) of T tasks;
        ``noise(shape)``: each seed's standard-normal draws (S, *shape) from its generator."""
        config = self.config
        seeds, tasks, per_task = batch.obs.shape[:3]
        # z_i ~ q(z | c_i), reparameterized
        mean, var = self.posterior(networks.encoder, batch.context)  # (S, T, L)
        task_z = mean + var.sqrt() * noise((tasks, config.latent_dim)) if config.use_information_bottleneck else mean
        z = task_z.unsqueeze(2).expand(seeds, tasks, per_task, -1).flatten(1, 2)  # (S, T * B, L)
        obs, actions = batch.obs.flatten(1, 2), batch.actions.flatten(1, 2)
        rewards, next_obs, terminated = batch.rewards.flatten(1), batch.next_obs.flatten(1, 2), batch.terminated.flatten(1)

        # L_KL and L_Q (they train the encoder)
        kl = gaussian_kl_to_unit(mean, var).sum(dim=-1) if config.use_information_bottleneck else mean.new_zeros(seeds)
        q1, q2 = networks.qfs(torch.cat([obs, actions, z], dim=-1)).squeeze(-1).unbind(1)
        with torch.no_grad():
            target_v = networks.target_vf(torch.cat([next_obs, z], dim=-1)).squeeze(-1)
            q_target = config.reward_scale * rewards + (1.0 - terminated) * config.gamma * target_v
        qf_loss = (q1 - q_target).pow(2).mean(dim=-1) + (q2 - q_target).pow(2).mean(dim=-1)

        # L_V and L_pi on z detached
        z = z.detach()
        policy_mean, policy_log_std = networks.policy(torch.cat([obs, z], dim=-1)).split(self.action_dim, dim=-1)
        policy_log_std = policy_log_std.clamp(-20.0, 2.0)
        new_actions, log_pi, pre_tanh = TanhGaussian(policy_mean, policy_log_std).rsample_with_pre_tanh(noise((tasks * per_task, self.action_dim)))
        new_inputs = torch.cat([obs, new_actions, z], dim=-1)
        min_q_new = networks.qfs_frozen(new_inputs).min(dim=1).values.squeeze(-1)
        v = networks.vf(torch.cat([obs, z], dim=-1)).squeeze(-1)
        vf_loss = (v - (min_q_new - log_pi).detach()).pow(2).mean(dim=-1)
        policy_loss = (
            (log_pi - min_q_new).mean(dim=-1)
            + config.policy_mean_reg_coef * policy_mean.pow(2).mean(dim=(1, 2))
            + config.policy_std_reg_coef * policy_log_std.pow(2).mean(dim=(1, 2))
            + config.policy_pre_activation_coef * pre_tanh.pow(2).sum(-1).mean(dim=-1)
        )
        losses = {"context": config.kl_lambda * kl + qf_loss, "qf": qf_loss, "vf": vf_loss, "policy": policy_loss}
        logs = {
            "qf_loss": qf_loss,
            "vf_loss": vf_loss,
            "policy_loss": policy_loss,
            "kl": kl,
            "q_mean": q1.mean(dim=-1),
            "z_mean_abs": mean.abs().mean(dim=(1, 2)),
            "z_var": var.mean(dim=(1, 2)),
            "log_pi": log_pi.mean(dim=-1),
        }
        return losses, {key: value.detach() for key, value in logs.items()}

    def seeds_gradients(self, seeds: Seeds, batch: PEARLBatch) -> tuple[list[torch.Tensor | None], dict[str, torch.Tensor]]:
        """Gradients in ``seeds.parameters`` order: the encoder's from L_KL + L_Q, the
        Q-functions' from L_Q, the value function's from L_V, the policy's from L_pi; logs (S,)."""
        losses, logs = self.seeds_losses(seeds.networks(), batch, seeds.noise)
        gradients: dict[int, torch.Tensor | None] = {}
        for name, params in seeds.groups().items():
            grads = torch.autograd.grad(losses[name].sum(), params, retain_graph=True, allow_unused=True)
            gradients.update({id(p): g for p, g in zip(params, grads)})
        return [gradients[id(p)] for p in seeds.parameters], logs

    def update_seeds(self, seeds: Seeds, batch: PEARLBatch) -> dict[str, torch.Tensor]:
        """One gradient step of every seed: all losses at the same parameters, then every
        optimizer steps and the target value functions move toward V."""
        gradients, logs = self.seeds_gradients(seeds, batch)
        seeds.apply(gradients)
        return logs

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.parameters

    def gradient_list(self, batch: PEARLBatch | Mapping[str, torch.Tensor]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Gradients in ``self.parameters`` order (``seeds_gradients`` of this run alone)."""
        typed = batch if isinstance(batch, PEARLBatch) else PEARLBatch(**batch)
        gradients, logs = self.seeds_gradients(OneSeed(self), seed_axis(typed))
        return gradients, per_seed_logs(logs, 1)[0]

    def apply_gradient_list(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """Every optimizer steps; then the target value function moves toward V."""
        if gradients is not None:
            set_gradients(self.parameters, gradients)
        for optimizer in self.optimizers.values():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        polyak_update(self.target_vf, self.vf, self.config.tau)

    def update(self, batch: PEARLBatch | None = None) -> dict[str, float]:
        gradients, logs = self.gradient_list(self.sample_batch() if batch is None else batch)
        self.apply_gradient_list(gradients)
        return logs

    def groups(self) -> dict[str, list[torch.Tensor]]:
        """The parameters each loss trains."""
        return {
            "context": list(self.encoder.parameters()),
            "policy": list(self.policy.parameters()),
            "qf": [*self.qf1.parameters(), *self.qf2.parameters()],
            "vf": list(self.vf.parameters()),
        }

    #: each optimizer's learning-rate hyperparameter
    learning_rates: ClassVar[dict[str, str]] = {"policy": "actor_lr", "qf1": "critic_lr", "qf2": "critic_lr", "vf": "value_lr", "context": "context_lr"}

    def _on_parameter_updated(self, name: str) -> None:
        for optimizer_name, field in self.learning_rates.items():
            for group in self.optimizers[optimizer_name].param_groups:
                group["lr"] = getattr(self.config, field)

    # -- state ------------------------------------------------------------------------------------

    def modules(self) -> dict[str, nn.Module]:
        return {"encoder": self.encoder, "policy": self.policy, "qf1": self.qf1, "qf2": self.qf2, "vf": self.vf, "target_vf": self.target_vf}

    def state_dict(self) -> dict[str, Any]:
        return {
            "modules": {name: module.state_dict() for name, module in self.modules().items()},
            "optimizers": {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()},
            "rng": self.rng.bit_generator.state,
            "generator": self.generator.get_state(),
            "epochs": self.epochs,
            "train_tasks": self.train_tasks,
            "config": self.config.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, module in self.modules().items():
            module.load_state_dict(state["modules"][name])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        self.rng.bit_generator.state = state["rng"]
        self.generator.set_state(state["generator"])
        self.epochs = int(state["epochs"])
        self.train_tasks = state["train_tasks"]
        self.config = self.Config.from_dict(self.Config.from_stored(state["config"]))  # saved under the names of its version
        self._on_parameter_updated("actor_lr")

    def replay_state_dict(self) -> dict[str, Any]:
        return {"rl": [b.state_dict() for b in self.rl_buffers], "encoder": [b.state_dict() for b in self.encoder_buffers]}

    def load_replay_state_dict(self, state: Mapping[str, Any]) -> None:
        for buffer, saved in zip(self.rl_buffers, state["rl"]):
            buffer.load_state_dict(saved)
        for buffer, saved in zip(self.encoder_buffers, state["encoder"]):
            buffer.load_state_dict(saved)


# --------------------------------------------------------------------------------------------
# The seeds an update works on
# --------------------------------------------------------------------------------------------


class OneSeed:
    """A run's own networks, optimizers and draws as a batch of one seed (S = 1)."""

    num_seeds = 1

    def __init__(self, algorithm: PEARL):
        self.members = [algorithm]
        self.parameters = algorithm.parameters

    def networks(self) -> PEARLNetworks:
        return self.members[0].networks()

    def groups(self) -> dict[str, list[torch.Tensor]]:
        return self.members[0].groups()

    def noise(self, shape: Sequence[int]) -> torch.Tensor:
        member = self.members[0]
        return standard_normal((1, *shape), member.generator, member.device)

    def sample_batch(self) -> PEARLBatch:
        return seed_axis(self.members[0].sample_batch())

    def apply(self, gradients: list[torch.Tensor | None]) -> None:
        self.members[0].apply_gradient_list(gradients)

    def subset(self, indices: Sequence[int]) -> OneSeed:
        return self


class PEARLSeedBatch(MetaSeedBatch):
    """N seeds of one PEARL configuration: their encoders, policies and value functions stacked
    (N, ...), their twin Q-functions as one stack (2N, ...: seed s's two at rows 2s, 2s + 1),
    each member's parameters views of its slices, and their five Adams stacked. Every
    seed collects with its own draws into its own per-task buffers and samples its own
    batches; a seed whose envs fail leaves the epoch without disturbing the others."""

    isolates_failures = True

    def __init__(self, members: Sequence[PEARL]):
        super().__init__(members)
        self.members: list[PEARL] = list(members)
        self.device = self.members[0].device
        self.stacks = {
            name: StackedMLP([cast(nn.Module, getattr(member, name) if name != "encoder" else member.encoder.body) for member in self.members])
            for name in ("encoder", "policy", "vf", "target_vf")
        }
        self.stacks["qfs"] = StackedMLP([qf for member in self.members for qf in (member.qf1, member.qf2)])
        module_of = {"context": "encoder", "policy": "policy", "vf": "vf"}
        self.optimizers.update(
            {
                name: StackedOptimizer([member.optimizers[name] for member in self.members], list(self.stacks[module].parameters()))
                for name, module in module_of.items()
            }
        )
        twin_optimizers = [member.optimizers[name] for member in self.members for name in ("qf1", "qf2")]
        self.optimizers["qfs"] = StackedOptimizer(twin_optimizers, list(self.stacks["qfs"].parameters()))
        self.parameters = [parameter for name in ("encoder", "policy", "qfs", "vf") for parameter in self.stacks[name].parameters()]
        self.learning_rates = {**PEARL.learning_rates, "qfs": "critic_lr"}

    def networks(self) -> PEARLNetworks:
        stacks = self.stacks
        return PEARLNetworks(
            encoder=stacks["encoder"],
            policy=stacks["policy"],
            qfs=lambda inputs: self.twins(inputs, frozen=False),
            vf=stacks["vf"],
            target_vf=stacks["target_vf"],
            qfs_frozen=lambda inputs: self.twins(inputs, frozen=True),
        )

    def twins(self, inputs: torch.Tensor, frozen: bool) -> torch.Tensor:
        """Every seed's two Q-functions at its inputs (N, B, in) -> (N, 2, B, 1)."""
        values = self.stacks["qfs"](inputs.repeat_interleave(2, dim=0), frozen=frozen)
        return values.view(inputs.shape[0], 2, *values.shape[1:])

    def groups(self) -> dict[str, list[torch.Tensor]]:
        stacks = self.stacks
        return {
            "context": list(stacks["encoder"].parameters()),
            "policy": list(stacks["policy"].parameters()),
            "qf": list(stacks["qfs"].parameters()),
            "vf": list(stacks["vf"].parameters()),
        }

    def noise(self, shape: Sequence[int]) -> torch.Tensor:
        return stacked_noise(standard_normal, shape, [member.generator for member in self.members], self.device)

    def sample_batch(self) -> PEARLBatch:
        return stack_batches([member.sample_batch() for member in self.members])

    def apply(self, gradients: list[torch.Tensor | None]) -> None:
        set_gradients(self.parameters, gradients)
        config = self.members[0].config
        for name, optimizer in self.optimizers.items():
            optimizer.lr = getattr(config, self.learning_rates[name])
            optimizer.step()
        for parameter in self.parameters:
            parameter.grad = None
        with torch.no_grad():
            torch._foreach_lerp_(list(self.stacks["target_vf"].parameters()), list(self.stacks["vf"].parameters()), config.tau)

    def subset(self, indices: Sequence[int]) -> PEARLSeedBatch:
        """This batch narrowed to the members at ``indices`` (stacked anew from their state)."""
        self.sync_members()
        self.__init__([self.members[index] for index in indices])  # type: ignore[misc]
        return self

    def train_epoch(self, task_envs: Sequence[TaskEnvs]) -> list[dict[str, float] | Exception]:
        return self.members[0].train_seeds(self, task_envs)


Seeds = OneSeed | PEARLSeedBatch
