"""Behavioral cloning: supervised learning of an expert's actions.

Ho, Gupta, Ermon (2016), "Model-Free Imitation Learning with Policy Optimization" (the
reference of garage's BC), as garage runs it:

    repeat (one epoch):
        batch = batch_size (observation, expert action) pairs:
            expert policy: the expert acts in the training envs (the benchmark's collector)
            dataset:       drawn uniformly from the transitions on disk
        split the batch into minibatches_per_epoch minibatches; for each, one optimizer step on
            log_prob: -mean log pi(a_expert | s)            (a stochastic learner)
            mse:      mean |mu(s) - a_expert|^2             (the deterministic output, or the mean)

The expert (``expert`` hyperparameter) is a policy checkpoint of this suite's runs, an ``.npz``
dataset of transitions or a local Minari dataset (``agents.experts``).

Defaults are garage's BC (learning rate 1e-3 with Adam, 16 minibatches per epoch, log_prob).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from agents.algos.seeds import SeedBatch, per_seed_logs
from agents.api import Acted, Algorithm, Transitions, batched_by, set_gradients
from agents.configs.bc import OPTIMIZER_NAMES, BCConfig
from agents.envs import EnvSpec
from agents.experts import ExpertPolicy, is_dataset, load_dataset, load_expert_checkpoint
from agents.nets.distributions import Categorical, DiagGaussian
from agents.nets.mlp import mlp
from agents.nets.stacked import StackedMLP, stack_parameters
from agents.optim import adam

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {"adam": adam, "sgd": torch.optim.SGD, "rmsprop": torch.optim.RMSprop}
assert tuple(OPTIMIZERS) == OPTIMIZER_NAMES, "BCConfig offers the optimizers built here"


class LearnerNetwork(nn.Module):
    """The cloned policy: logits, a Gaussian mean with a state-independent log-std, or an action."""

    def __init__(self, spec: EnvSpec, config: BCConfig):
        super().__init__()
        self.discrete = spec.discrete
        obs_dim = int(np.prod(spec.observation_shape))
        self.body = mlp(obs_dim, config.hidden_sizes, spec.num_actions, config.activation)
        stochastic_gaussian = not spec.discrete and config.policy == "stochastic"
        self.log_std = nn.Parameter(torch.full((spec.num_actions,), config.initial_log_std)) if stochastic_gaussian else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits (B, n), mean (B, d) or action (B, d)."""
        return self.body(obs.flatten(1))

    def seeded(self, obs: torch.Tensor) -> torch.Tensor:
        """This one network as a batch of one seed: (1, B, *obs_shape) -> (1, B, out)."""
        return self.body(obs.flatten(2))

    def distribution(self, output: torch.Tensor) -> Categorical | DiagGaussian:
        """Over (..., B, out) outputs; the (d,) log-std broadcasts."""
        return policy_distribution(self.discrete, output, self.log_std)


class StackedLearnerNetwork(nn.Module):
    """N seeds' ``LearnerNetwork`` as one: (N, B, *obs_shape) -> (N, B, out); each copy's
    parameters become views of its slice (``agents.nets.stacked``)."""

    def __init__(self, copies: Sequence[LearnerNetwork]):
        super().__init__()
        self.discrete = copies[0].discrete
        self.body = StackedMLP([copy.body for copy in copies])
        log_stds = [copy.log_std for copy in copies if copy.log_std is not None]
        self.log_std = stack_parameters([[log_std] for log_std in log_stds])[0] if log_stds else None

    def seeded(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(obs.flatten(2))

    def distribution(self, output: torch.Tensor) -> Categorical | DiagGaussian:
        """Each seed's (N, 1, d) log-std broadcast over its batch."""
        return policy_distribution(self.discrete, output, None if self.log_std is None else self.log_std.unsqueeze(1))


def policy_distribution(discrete: bool, output: torch.Tensor, log_std: torch.Tensor | None) -> Categorical | DiagGaussian:
    """The cloned policy's distribution: logits, or a Gaussian mean with ``log_std`` broadcast."""
    if discrete:
        return Categorical(output)
    assert log_std is not None, "a deterministic policy has no distribution"
    return DiagGaussian(output, log_std)


class BC(Algorithm):
    """Behavioral cloning of an expert policy (acting in the training envs) or a dataset."""

    seed_batch = batched_by("BCSeedBatch")

    name = "bc"
    Config: ClassVar[type[BCConfig]] = BCConfig
    tunable_parameters = ("learning_rate",)
    config: BCConfig

    def __init__(self, spec: EnvSpec, config: BCConfig, total_steps: int, device: torch.device | str = "cpu", seed: int = 0):
        self.check_env_spec(spec)
        self.check_config(config, spec)
        self.spec, self.config, self.device = spec, config, torch.device(device)
        self.network = LearnerNetwork(spec, config).to(self.device)
        self.parameters = list(self.network.parameters())
        self.optimizer = OPTIMIZERS[config.optimizer](self.parameters, lr=config.learning_rate)
        self.generator = torch.Generator().manual_seed(seed)
        self.expert: ExpertPolicy | None = None
        self.dataset: tuple[torch.Tensor, torch.Tensor] | None = None
        source = config.expert
        assert source is not None  # check_config refused a missing expert
        if is_dataset(source):
            observations, actions = load_dataset(source, spec)
            self.dataset = (torch.as_tensor(observations, device=self.device), torch.as_tensor(actions, device=self.device))
            self.collects_experience = False
            self.samples_per_update = config.batch_size
        else:
            self.expert = ExpertPolicy(load_expert_checkpoint(source, spec), self.device, config.expert_deterministic)
        # the epoch's batch of expert pairs, filled num_envs at a time (rounded up to a multiple)
        capacity = math.ceil(config.batch_size / config.num_envs) * config.num_envs
        action_dtype = torch.long if spec.discrete else torch.float32
        self.observations = torch.zeros((capacity, *spec.observation_shape), device=self.device)
        self.actions = torch.zeros((capacity, *spec.action_shape), dtype=action_dtype, device=self.device)
        self.filled = 0
        if not spec.discrete:
            self._low = np.asarray(spec.action_low, np.float32)
            self._high = np.asarray(spec.action_high, np.float32)

    # -- acting: the learner; collecting: the expert -----------------------------------------

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, state: Any = None, deterministic: bool = False) -> Acted:
        """The learner's actions (the cloned policy)."""
        output = self.network(obs)
        if self.config.policy == "deterministic":
            actions = output
        else:
            dist = self.network.distribution(output)
            actions = dist.mode() if deterministic else dist.sample()
        env_actions = actions.cpu().numpy()
        if not self.spec.discrete:
            env_actions = np.clip(env_actions, self._low, self._high)
        return Acted(actions, env_actions, state)

    def behavior_act(self, obs: torch.Tensor, state: Any = None) -> Acted:
        """The expert acts in the training envs: its observations and actions are the data."""
        assert self.expert is not None, "a dataset learner collects nothing"
        acted = self.expert.act(obs)
        actions = torch.as_tensor(np.asarray(acted.env_actions), device=self.device)  # what the env received
        return Acted(actions, acted.env_actions, state)

    def observe(self, transitions: Transitions) -> None:
        count = transitions.obs.shape[0]
        end = min(self.filled + count, len(self.observations))
        self.observations[self.filled : end] = transitions.obs[: end - self.filled]
        self.actions[self.filled : end] = transitions.acted.actions[: end - self.filled].to(self.actions.dtype)
        self.filled = end

    def ready_to_update(self) -> bool:
        return self.dataset is not None or self.filled >= self.config.batch_size

    # -- learning ------------------------------------------------------------------------------

    def epoch_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dataset is not None:
            observations, actions = self.dataset
            indices = torch.randint(len(observations), (self.config.batch_size,), generator=self.generator).to(self.device)
            return observations[indices], actions[indices]
        return self.observations[: self.filled], self.actions[: self.filled]

    def seeds_loss(self, network: LearnerNetwork | StackedLearnerNetwork, observations: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The cloning loss of each seed's minibatch: observations (S, B, *obs_shape), expert
        actions (S, B, *action_shape) -> (S,)."""
        output = network.seeded(observations)
        if self.config.loss == "log_prob":
            return -network.distribution(output).log_prob(actions).mean(-1)
        return (output - actions).pow(2).sum(-1).mean(-1)  # the deterministic output, or the Gaussian's mean

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """This run's loss on one minibatch (observations, expert actions)."""
        observations, actions = batch
        return self.seeds_loss(self.network, observations.unsqueeze(0), actions.unsqueeze(0))[0]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.parameters

    def gradient_list(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        loss = self.loss(batch)
        gradients = torch.autograd.grad(loss, self.parameters, allow_unused=True)
        return list(gradients), {"loss": loss.item()}

    def apply_gradient_list(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        if gradients is not None:
            set_gradients(self.parameters, gradients)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _step_alone(self, losses: torch.Tensor) -> None:
        self.apply_gradient_list(list(torch.autograd.grad(losses[0], self.parameters, allow_unused=True)))

    def update(self) -> dict[str, float]:
        """One epoch of this run (the update of a batch of one seed)."""
        return self._epoch([self], self.network, self._step_alone)[0]

    @staticmethod
    def _epoch(members: Sequence[BC], network: LearnerNetwork | StackedLearnerNetwork, step: Callable[[torch.Tensor], None]) -> list[dict[str, float]]:
        """One epoch of every seed (Ho et al. 2016, as garage runs it): each seed's batch of
        expert pairs, shuffled by its own generator into ``minibatches_per_epoch`` minibatches,
        each one optimizer step on the seeds' (S,) losses (``step``). Each seed's logs."""
        config = members[0].config
        batches = [member.epoch_batch() for member in members]
        observations = torch.stack([batch[0] for batch in batches])  # (S, N, *obs_shape)
        actions = torch.stack([batch[1] for batch in batches])
        orders = torch.stack([torch.randperm(observations.shape[1], generator=member.generator) for member in members]).to(observations.device)
        seeds = torch.arange(len(members), device=observations.device).unsqueeze(1)
        losses = []
        for indices in orders.tensor_split(config.minibatches_per_epoch, dim=1):  # (S, m)
            loss = members[0].seeds_loss(network, observations[seeds, indices], actions[seeds, indices])
            step(loss)
            losses.append(loss.detach())
        logs = {"loss": torch.stack(losses).double().mean(0)}
        if network.log_std is not None:
            logs["policy_std"] = network.log_std.detach().exp().reshape(len(members), -1).mean(1)
        for member in members:
            member.filled = 0
        return per_seed_logs(logs, len(members))

    def _on_parameter_updated(self, name: str) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.learning_rate

    # -- state -----------------------------------------------------------------------------------

    def modules(self) -> dict[str, nn.Module]:
        return {"policy": self.network}

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "batch": {"observations": self.observations[: self.filled].cpu(), "actions": self.actions[: self.filled].cpu()},
            "config": self.config.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.network.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.filled = len(state["batch"]["observations"])
        self.observations[: self.filled] = state["batch"]["observations"].to(self.device)
        self.actions[: self.filled] = state["batch"]["actions"].to(self.device)
        self.config = self.Config.from_dict(self.Config.from_stored(state["config"]))  # saved under the names of its version
        self._on_parameter_updated("learning_rate")


class BCSeedBatch(SeedBatch):
    """N seeds of one cloning configuration: each seed's expert collects its own data (or each
    draws from the dataset with its own generator); one stacked network and optimizer train
    them all with the loss written once (``BC.seeds_loss``)."""

    members: list[BC]  # type: ignore[assignment]

    def __init__(self, members: Sequence[BC]):
        super().__init__(members)
        self.network = StackedLearnerNetwork([member.network for member in self.members])
        self.stacked_parameters = list(self.network.parameters())
        self.optimizers = self._stack_optimizers({"policy": ([member.optimizer for member in self.members], self.stacked_parameters)})

    def act(self, obs: Sequence[torch.Tensor], states: Sequence[Any] | None = None) -> list[Acted]:
        """Each seed's expert acts for its envs (the experts are not trained: nothing to batch)."""
        return [member.behavior_act(member_obs) for member, member_obs in zip(self.members, obs, strict=True)]

    def _step(self, losses: torch.Tensor) -> None:
        optimizer = self.optimizers["policy"]
        losses.sum().backward()  # seeds share no parameter: each gets its own loss's gradient
        optimizer.step()
        optimizer.optimizer.zero_grad(set_to_none=True)

    def update(self) -> list[dict[str, float]]:
        self.optimizers["policy"].lr = self.members[0].optimizer.param_groups[0]["lr"]
        return BC._epoch(self.members, self.network, self._step)
