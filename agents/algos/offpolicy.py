"""What every off-policy algorithm shares: the replay configuration, warm-up and the update loop.

    for each vector env step:
        a = uniform random for the first start_steps env steps, else the policy's (with noise)
        store (s, a, reward_scale * r, s', terminated, truncated) in the replay buffer
        after learning_starts env steps, every update_every env steps:
            gradient_steps times: batch <- buffer; compute_gradients; apply_gradients;
                                  with PER, new priorities from the batch's TD errors

Step counts are env steps summed over parallel envs, so the ratio of gradient steps to
collected transitions does not depend on num_envs. Subclasses implement the policy
(``policy_actions``), the losses (``compute_gradients``) and the optimizer step.

Recurrent variants (``recurrent: gru | lstm``, for algorithms whose Config ``supports_recurrent``) put
a ``RecurrentEncoder`` in front of every head: the actor acts on its features and stores its
hidden state with each step; updates sample sequences, burn in the stored state over the
first ``burn_in`` steps without gradients (R2D2), and train on the rest. Losses read three
feature tensors from ``encode(batch)``: ``features`` (online encoder on obs, with gradients),
``next_features`` (online encoder on next_obs) and ``target_next_features`` (target encoder on
next_obs); without recurrence all three are just the observations.

Beside this file: ``offpolicy_losses`` (the seed tools and helpers of losses written over a seed
dimension), ``offpolicy_batch`` (N seeds as one batched model), ``offpolicy_shared`` (gradient
steps taken by gradient workers).
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Hashable, Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch

from agents.algos.offpolicy_losses import SeedTools
from agents.algos.offpolicy_shared import SharedReplaySteps
from agents.algos.seeds import per_seed_logs, seed_axis
from agents.api import Acted, Transitions, set_gradients
from agents.batches import EncodedBatch, ReplayBatch
from agents.buffers import HindsightRelabeler, PrioritizedSampler, RecentExperience, ReplayBuffer, SequenceReplayBuffer
from agents.configs.offpolicy import OffPolicyConfig
from agents.envs import EnvSpec, goal_functions
from agents.nets import polyak_update
from agents.nets.offpolicy import NetworkShape
from agents.nets.recurrent import OneSeedEncoder, RecurrentEncoder
from agents.optim import clip_gradients


class OffPolicyAlgorithm(SharedReplaySteps):
    """Acting with warm-up, storage in the configured replay buffer, the update loop, state."""

    #: hyperparameter -> the optimizer group whose learning rate it is (schedules and
    #: ``update_parameter`` change that optimizer's rate, and a seed batch's stacked one)
    learning_rates: ClassVar[Mapping[str, str]] = {}

    Config: ClassVar[type[OffPolicyConfig]]
    config: OffPolicyConfig
    has_replay_buffer: ClassVar[bool] = True

    def __init__(
        self,
        env_spec: EnvSpec,
        config: OffPolicyConfig,
        total_steps: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ):
        self.check_env_spec(env_spec)
        self.check_config(config, env_spec)
        self.spec, self.config, self.device = env_spec, config, torch.device(device)
        self.total_steps = max(1, total_steps)
        self.obs_dim = int(np.prod(env_spec.observation_shape))
        self.generator = torch.Generator().manual_seed(seed)
        self.env_steps = 0  # env steps observed, summed over envs
        self.num_updates = 0  # gradient steps applied
        self.steps_since_update = 0
        if not env_spec.discrete:
            low = torch.tensor(env_spec.action_low, dtype=torch.float32)
            high = torch.tensor(env_spec.action_high, dtype=torch.float32)
            self._action_scale, self._action_bias = (high - low) / 2, (high + low) / 2
        self.recurrent = config.recurrent != "none"
        self.encoder: RecurrentEncoder | None = None
        self.encoder_target: RecurrentEncoder | None = None
        self.feature_dim = self.obs_dim
        if self.recurrent:
            self.encoder = RecurrentEncoder(self.obs_dim, config.obs_extractor_sizes, config.activation, config.recurrent, config.recurrent_size).to(
                self.device
            )
            self.encoder_target = copy.deepcopy(self.encoder).requires_grad_(False)
            self.feature_dim = config.recurrent_size
        self.buffer = self.make_buffer()
        self.td_errors: torch.Tensor | None = None  # of the last batch, for PER
        # after a resume without the replay buffer: no updates until it holds more than this again
        self._refill_to = 0

    # -- storage ----------------------------------------------------------------------------

    def head_shape(self) -> NetworkShape:
        """Layer sizes of the networks after the encoder (its extractor is the encoder's when recurrent)."""
        shape = NetworkShape.of(self.config)
        return replace(shape, obs_extractor_sizes=()) if self.recurrent else shape

    def encoder_modules(self) -> dict[str, torch.nn.Module]:
        return {"encoder": self.encoder, "encoder_target": self.encoder_target} if self.encoder is not None and self.encoder_target is not None else {}

    def make_buffer(self) -> ReplayBuffer:
        """The replay buffer the config describes."""
        config, spec = self.config, self.spec
        if self.recurrent:
            assert self.encoder is not None
            return SequenceReplayBuffer(
                config.buffer_size,
                config.num_envs,
                spec.observation_shape,
                spec.action_shape,
                (self.encoder.state_size,),
                self.device,
                action_dtype=torch.long if spec.discrete else torch.float32,
                gamma=config.gamma,
                sequence_length=config.sequence_length,
                burn_in=config.burn_in,
                overlap=config.sequence_overlap,
            )
        sampler = (
            PrioritizedSampler(
                ReplayBuffer.rounded_capacity(config.buffer_size, config.num_envs),
                config.per_alpha,
                config.per_beta,
                config.per_eps,
                self.device,
            )
            if config.prioritized
            else None
        )
        recent = RecentExperience(config.ere_eta, config.ere_c_min, anneal=config.ere_anneal) if config.emphasize_recent else None
        relabeler = None
        if config.her_strategy != "none":
            assert spec.goal is not None  # check_settings: her_strategy needs a goal env
            compute_reward, compute_terminated = goal_functions(spec.setup or spec.env_id)
            relabeler = HindsightRelabeler(spec.goal, compute_reward, compute_terminated, config.her_strategy, config.her_k, config.reward_scale)
        return ReplayBuffer(
            config.buffer_size,
            config.num_envs,
            spec.observation_shape,
            spec.action_shape,
            self.device,
            action_dtype=torch.long if spec.discrete else torch.float32,
            gamma=config.gamma,
            n_step=config.n_step,
            sampler=sampler,
            recent=recent,
            relabeler=relabeler,
        )

    # -- acting and collecting --------------------------------------------------------------

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, state: Any = None, deterministic: bool = False) -> Acted:
        """Actions for obs (N, *obs_shape); recurrent agents take and return the hidden state
        (N, state_size) and report the one they acted with in ``extras["hidden"]``."""
        obs = obs.to(self.device)
        features, extras, next_state = obs, {}, state
        if self.encoder is not None:
            hidden = state if state is not None else self.encoder.initial_state(obs.shape[0], self.device)
            features, next_state = self.encoder.step(obs, hidden)
            extras = {"hidden": hidden}
        if not deterministic and self.env_steps < self.config.start_steps:
            actions = self.random_actions(obs.shape[0])
        else:
            actions = self.policy_actions(features, deterministic)
        return Acted(actions, self.env_actions(actions), next_state, extras)

    def acting_state(self) -> dict[str, Any]:
        return {**super().acting_state(), "env_steps": self.env_steps}  # warm-up and schedules read it

    def load_acting_state(self, state: Mapping[str, Any]) -> None:
        super().load_acting_state(state)
        self.env_steps = int(state["env_steps"])

    def reset_state(self, state: Any, episode_ended: torch.Tensor) -> Any:
        if state is None or self.encoder is None:
            return state
        return state.masked_fill(episode_ended.to(self.device, torch.bool)[:, None], 0.0)

    def random_actions(self, n: int) -> torch.Tensor:
        """Uniform actions: indices for Discrete, points of (-1, 1)^d (the policy's box) for Box."""
        if self.spec.discrete:
            return torch.randint(0, self.spec.num_actions, (n,), generator=self.generator).to(self.device)
        return (torch.rand((n, self.spec.num_actions), generator=self.generator) * 2 - 1).to(self.device)

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """Policy actions -> what the env receives (Box actions rescaled from (-1, 1) to its bounds)."""
        if self.spec.discrete:
            return actions.cpu().numpy()
        return (actions.cpu().clamp(-1.0, 1.0) * self._action_scale + self._action_bias).numpy()

    @abc.abstractmethod
    def policy_actions(self, features: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The policy's actions, with exploration unless deterministic, for observations
        (N, *obs_shape), or the encoder's features (N, recurrent_size) when recurrent."""

    def observe(self, transitions: Transitions) -> None:
        self.buffer.add(
            transitions.obs,
            transitions.acted.actions,
            transitions.rewards * self.config.reward_scale,
            transitions.next_obs,
            transitions.terminated,
            transitions.truncated,
            extras={"hidden": transitions.acted.extras["hidden"]} if self.recurrent else None,
        )
        previous = self.env_steps
        self.env_steps += transitions.obs.shape[0]
        # only steps after the warm-up count toward updates: no burst of updates when it ends
        self.steps_since_update += max(0, self.env_steps - max(previous, self.config.learning_starts))
        if self.recurrent and self.buffer.num_sequences() == 0:
            self.steps_since_update = 0  # nor when the first whole sequence is stored
        if len(self.buffer) <= self._refill_to:  # as after warm-up: the first update comes with the next step
            self.steps_since_update = 0
        self.buffer.set_progress(self.env_steps / self.total_steps)

    def prioritize_newest(self, td_errors: torch.Tensor) -> None:
        """Set the priorities of the vector step stored last from ``td_errors`` (num_envs,)
        (Ape-X: actors compute initial priorities, instead of the buffer's maximum)."""
        if self.config.prioritized:
            self.buffer.update_priorities(self.buffer.newest_indices(), td_errors)

    def ready_to_update(self) -> bool:
        if self.recurrent and self.buffer.num_sequences() == 0:
            return False
        return len(self.buffer) > 0 and self.steps_since_update >= self.config.update_every

    def encode(self, encoder: Any, encoder_target: Any, batch: ReplayBatch) -> EncodedBatch:
        """A training batch of S seeds (S, ...) with ``features``, ``next_features`` and
        ``target_next_features`` (S, M, ...), read by ``encoder`` and ``encoder_target`` (this
        run's as ``OneSeedEncoder``s, or a batch's ``StackedEncoder``s; None without recurrence).

        Recurrent: sequences (S, L, B) are burned in from their stored state (no gradients), then
        unrolled over the remaining T steps; the result has M = T * B rows per seed.
        """
        if encoder is None:
            assert batch.weights is not None  # a replay buffer's transitions carry them
            return EncodedBatch(
                obs=batch.obs,
                actions=batch.actions,
                rewards=batch.rewards,
                next_obs=batch.next_obs,
                terminated=batch.terminated,
                discounts=batch.discounts,
                weights=batch.weights,
                features=batch.obs,
                next_features=batch.next_obs,
                target_next_features=batch.next_obs,
            )
        burn_in = self.config.burn_in
        obs, next_obs, resets = batch.obs, batch.next_obs, batch.resets
        assert resets is not None and batch.initial_hidden is not None  # sequences carry them
        hidden = target_hidden = batch.initial_hidden
        with torch.no_grad():
            if burn_in > 0:
                hidden = encoder.unroll(obs[:, :burn_in], hidden, resets[:, :burn_in])[1][:, -1]
                target_hidden = encoder_target.unroll(obs[:, :burn_in], target_hidden, resets[:, :burn_in])[1][:, -1]
        features, states = encoder.unroll(obs[:, burn_in:], hidden, resets[:, burn_in:])
        seeds, steps, sequences = features.shape[:3]

        def flat(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(seeds, steps * sequences, *x.shape[3:])

        with torch.no_grad():
            target_states = encoder_target.unroll(obs[:, burn_in:], target_hidden, resets[:, burn_in:])[1]
            next_inputs = flat(next_obs[:, burn_in:])
            next_features = encoder.step(next_inputs, flat(states.detach()))[0]
            target_next_features = encoder_target.step(next_inputs, flat(target_states))[0]
        return EncodedBatch(
            **{key: flat(batch[key][:, burn_in:]) for key in ("obs", "actions", "rewards", "next_obs", "terminated", "discounts")},
            weights=torch.ones(seeds, steps * sequences, device=self.device),
            features=flat(features),
            next_features=next_features,
            target_next_features=target_next_features,
        )

    def seed_encoders(self) -> tuple[OneSeedEncoder | None, OneSeedEncoder | None]:
        """This run's online and target encoders with a seed dimension of 1 (None, None without recurrence)."""
        if self.encoder is None or self.encoder_target is None:
            return None, None
        return OneSeedEncoder(self.encoder), OneSeedEncoder(self.encoder_target)

    # -- losses: written once, over a leading seed dimension -------------------------------

    def networks(self) -> Any:
        """This run's networks as the losses call them, with a seed dimension of 1
        (``seeds_gradients``); a batch of seeds passes stacked ones."""
        raise NotImplementedError(f"{self.name} has no seed-dimension loss")

    def seeds_gradients(
        self, networks: Any, batch: EncodedBatch, tools: SeedTools
    ) -> tuple[dict[str, list[torch.Tensor]], dict[str, torch.Tensor], torch.Tensor | None]:
        """One gradient step's losses for every seed of ``batch`` (S, B, ...), differentiated:
        the gradients of each optimizer group that steps now, each log (S,), and the TD errors
        (S, B) when replay is prioritized."""
        raise NotImplementedError(f"{self.name} has no seed-dimension loss")

    def seed_tools(self) -> SeedTools:
        """Noise, clipping and parameters of this run, as a seed dimension of 1."""
        groups, generator, device = self.groups, self.generator, self.device
        return SeedTools(
            noise=lambda draw, shape: draw((1, *shape), generator, device),
            clip=lambda gradients, max_norm: clip_gradients(gradients, max_norm).reshape(1),
            parameters=lambda group: groups[group][0],
        )

    def gradient_list(self, batch: ReplayBatch | Mapping[str, torch.Tensor]) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """``seeds_gradients`` on one run's batch: every parameter's gradient in the order of
        ``parameter_groups`` (None for a group that does not step now), and the logs."""
        typed = batch if isinstance(batch, ReplayBatch) else ReplayBatch(**batch)
        gradients, logs, errors = self.seeds_gradients(self.networks(), self.encode(*self.seed_encoders(), seed_axis(typed)), self.seed_tools())
        self.td_errors = None if errors is None else errors[0]
        flat: list[torch.Tensor | None] = []
        for name, (parameters, _) in self.groups.items():
            flat += gradients.get(name) or [None] * len(parameters)
        return flat, per_seed_logs(logs, 1)[0]

    def update_encoder_target(self, tau: float) -> None:
        if self.encoder is not None and self.encoder_target is not None:
            polyak_update(self.encoder_target, self.encoder, tau)

    # -- learning ---------------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        updates, self.steps_since_update = divmod(self.steps_since_update, self.config.update_every)
        logs: dict[str, list[float]] = {}
        for _ in range(updates * self.config.gradient_steps):
            batch = self.buffer.sample(self.config.batch_size, self.generator)
            for key, value in self.gradient_step(batch).items():
                logs.setdefault(key, []).append(value)
        return {key: float(sum(values) / len(values)) for key, values in logs.items()}

    def gradient_step(self, batch: ReplayBatch) -> dict[str, float]:
        """One gradient step on ``batch``: differentiate, step, reprioritize; its logs. A
        distributed run's ``step_strategy`` (gradient workers) takes it instead."""
        if self.step_strategy is not None:
            logs: dict[str, float] = self.step_strategy.take(self, batch)
            return logs
        gradients, info = self.gradient_list(batch)
        self.apply_step(gradients, batch.indices, self.td_errors)
        return info

    def apply_step(self, gradients: list[torch.Tensor | None], indices: torch.Tensor | None, td_errors: torch.Tensor | None) -> None:
        """Step on ``gradients`` (``gradient_list``'s order), then set the priorities of the
        batch's rows ``indices`` (B,) from its ``td_errors`` (B,) under prioritized replay."""
        self.apply_gradient_list(gradients)
        if self.config.prioritized and td_errors is not None and indices is not None:
            self.buffer.update_priorities(indices, td_errors)

    #: whether its seed batch's gradient steps can be captured as CUDA graphs
    #: (``agents.algos.graphs``): the Python of a step depends on ``update_phase`` alone
    capturable_update: ClassVar[bool] = False
    #: whether its seed batch's exploring actions can be captured too: ``policy_actions`` draws
    #: its noise only through the seed tools (no per-member noise state, as DDPG's OU process)
    capturable_acting: ClassVar[bool] = False

    def update_phase(self) -> Hashable:
        """What decides the Python control flow of the next gradient step (which losses and
        targets step); a captured step is replayed only in its phase. One phase by default."""
        return None

    @abc.abstractmethod
    def parameter_groups(self) -> dict[str, tuple[list[torch.nn.Parameter], torch.optim.Optimizer | None]]:
        """Trainable parameters by optimizer, in the order ``gradient_list`` returns them."""

    @property
    def groups(self) -> dict[str, tuple[list[torch.nn.Parameter], torch.optim.Optimizer | None]]:
        """``parameter_groups()``, built once: loading weights keeps the same Parameter objects."""
        if not hasattr(self, "_groups"):
            self._groups = self.parameter_groups()
        return self._groups

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for parameters, _ in self.groups.values() for p in parameters]

    def apply_gradient_list(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """Set ``gradients`` (if given), step every optimizer, then the target networks."""
        if gradients is not None:
            set_gradients(self.trainable_parameters(), gradients)
        for parameters, optimizer in self.groups.values():
            if optimizer is not None and any(p.grad is not None for p in parameters):
                optimizer.step()
        self.num_updates += 1
        self.update_targets()

    def update_targets(self) -> None:
        """Move the target networks after a gradient step (Polyak or periodic copies)."""

    def _on_parameter_updated(self, name: str) -> None:
        """A learning rate reaches the optimizer that ``learning_rates`` declares for it."""
        if name in self.learning_rates:
            optimizer = self.groups[self.learning_rates[name]][1]
            if optimizer is not None:
                for group in optimizer.param_groups:
                    group["lr"] = getattr(self.config, name)

    # -- state ------------------------------------------------------------------------------

    def extra_state(self) -> dict[str, Any]:
        """Tensors besides modules and optimizers (e.g. a temperature); override to add."""
        return {}

    def loss_state(self) -> dict[str, Any]:
        """What the losses read besides the weights and the batch: the update count (delayed
        policy updates), the env-step count (schedules), the extra state (SAC's temperature)
        and the generator (their noise).
        A gradient worker's copy takes the learner's on before it differentiates."""
        return {"num_updates": self.num_updates, "env_steps": self.env_steps, "extra": self.extra_state(), "generator": self.generator.get_state()}

    def load_loss_state(self, state: Mapping[str, Any]) -> None:
        self.num_updates, self.env_steps = int(state["num_updates"]), int(state["env_steps"])
        self.load_extra_state(state["extra"])
        self.generator.set_state(state["generator"])

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, counters and RNG; the replay buffer has its own ``state_dict``."""
        return {
            "modules": {name: module.state_dict() for name, module in self.modules().items()},
            "optimizers": {name: optimizer.state_dict() for name, (_, optimizer) in self.groups.items() if optimizer is not None},
            "extra": self.extra_state(),
            "env_steps": self.env_steps,
            "num_updates": self.num_updates,
            "steps_since_update": self.steps_since_update,
            "generator": self.generator.get_state(),
            "config": self.config.to_dict(),
        }

    def replay_state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict()

    def load_replay_state_dict(self, state: Mapping[str, Any]) -> None:
        self.buffer.load_state_dict(dict(state))
        self._refill_to = 0

    def interrupt_episodes(self, final_obs: torch.Tensor, state: Any = None) -> None:
        """The newest stored step of every env becomes a truncation (its next_obs is already
        the true final observation), so episode bookkeeping (n-step, HER, sequences) ends there."""
        self.buffer.truncate_newest()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, module in self.modules().items():
            module.load_state_dict(state["modules"][name])
        for name, (_, optimizer) in self.groups.items():
            if optimizer is not None:
                optimizer.load_state_dict(state["optimizers"][name])
        self.load_extra_state(state["extra"])
        self.env_steps = int(state["env_steps"] if "env_steps" in state else state["num_steps"])  # the older checkpoints' key
        self.num_updates = int(state["num_updates"])
        self.steps_since_update = int(state["steps_since_update"])
        self.generator.set_state(state["generator"])
        # the buffer is not part of this state (see replay_state_dict): refill before updating
        self._refill_to = self.config.refill_size(self.buffer.capacity)
