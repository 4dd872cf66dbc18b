"""N seeds of one off-policy configuration trained as one batched model (``agents.algos.seeds``):
warm-up, acting and the update loop of ``OffPolicyAlgorithm`` with each seed's replay buffer and
generator; each algorithm's subclass stacks its networks."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from agents.algos.graphs import CapturedActing, CapturedSteps
from agents.algos.offpolicy import OffPolicyAlgorithm
from agents.algos.offpolicy_losses import SeedTools
from agents.algos.seeds import SeedBatch, clip_per_seed, per_seed_logs, stack_batches, stacked_noise
from agents.api import Acted
from agents.batches import ReplayBatch
from agents.configs.offpolicy import OffPolicyConfig
from agents.errors import ConfigError
from agents.nets import polyak_update
from agents.nets.recurrent import RecurrentEncoder
from agents.nets.stacked import StackedEncoder


class OffPolicySeedBatch(SeedBatch):
    """N seeds of one off-policy configuration: warm-up, acting and the update loop of
    ``OffPolicyAlgorithm``, with each seed's replay buffer and generator; subclasses stack the
    networks and write the batched losses.

    Every gradient step samples each seed's batch from its own buffer with its own generator,
    then draws the loss's noise seed by seed: the order of draws within a seed is its run's."""

    members: list[OffPolicyAlgorithm]  # type: ignore[assignment]
    config: OffPolicyConfig

    def __init__(self, members: Sequence[OffPolicyAlgorithm]):
        super().__init__(members)
        self.td_errors: torch.Tensor | None = None  # (N, B) of the last batch, for PER
        self.captured: CapturedSteps | None = None  # the gradient steps as CUDA graphs (``capture_steps``)
        self.captured_acting: CapturedActing | None = None  # and the exploring actions, where they can be
        self.networks: Any = None  # the stacked networks, as the members' ``networks()`` gives one seed's
        self.encoder_parameters = self.stack_encoders()  # recurrent: in the group of the loss that trains them
        self.tools = SeedTools(
            noise=lambda draw, shape: stacked_noise(draw, shape, self.generators, self.device),
            clip=lambda gradients, max_norm: clip_per_seed(gradients, self.num_seeds, max_norm),
            parameters=lambda group: self.optimizers[group].parameters,
        )

    def stack_encoders(self) -> list[torch.nn.Parameter]:
        """Recurrent members: their online and target encoders stacked (``self.encoder``,
        ``self.encoder_target``); the online one's stacked parameters (for its optimizer group)."""
        self.encoder: StackedEncoder | None = None
        self.encoder_target: StackedEncoder | None = None
        if self.members[0].encoder is None:
            return []
        self.encoder = StackedEncoder([cast(RecurrentEncoder, member.encoder) for member in self.members])
        self.encoder_target = StackedEncoder([cast(RecurrentEncoder, member.encoder_target) for member in self.members])
        return list(self.encoder.parameters())

    def update_encoder_target(self, tau: float) -> None:
        if self.encoder is not None and self.encoder_target is not None:
            polyak_update(self.encoder_target, self.encoder, tau)

    def act(self, obs: Sequence[torch.Tensor], states: Sequence[Any] | None = None) -> list[Acted]:
        """Each seed's exploring actions (uniform during warm-up) from its observations and, when
        recurrent, its encoder state (a fresh one at the start)."""
        members = self.members
        with torch.inference_mode():
            stacked_obs = torch.stack([member_obs.to(self.device) for member_obs in obs])
            features, hidden, next_hidden = stacked_obs, None, None
            if self.encoder is not None:
                hidden = torch.stack(
                    [
                        cast(RecurrentEncoder, member.encoder).initial_state(len(member_obs), self.device) if state is None else state
                        for member, member_obs, state in zip(members, obs, states or [None] * len(members), strict=True)
                    ]
                )
                features, next_hidden = self.encoder.step(stacked_obs, hidden)
            if members[0].env_steps < self.config.start_steps:  # warm-up: each seed's uniform actions
                actions = [member.random_actions(len(member_obs)) for member, member_obs in zip(members, obs, strict=True)]
            else:
                actions = list(self.captured_acting.actions(features) if self.captured_acting is not None else self.policy_actions(features))
        return [
            Acted(
                seed_actions,
                member.env_actions(seed_actions),
                None if next_hidden is None else next_hidden[seed],
                {} if hidden is None else {"hidden": hidden[seed]},
            )
            for seed, (member, seed_actions) in enumerate(zip(members, actions, strict=True))
        ]

    @abc.abstractmethod
    def policy_actions(self, obs: torch.Tensor) -> torch.Tensor:
        """Every seed's exploring actions (N, E, ...) for observations (N, E, *obs_shape)."""

    def capture_steps(self, emulate: bool = False) -> None:
        """From now on, take the gradient steps as CUDA graphs (``agents.algos.graphs``;
        ``emulate``: the same bookkeeping on any device, for tests)."""
        if not type(self.members[0]).capturable_update:
            raise ConfigError(f"cuda_graphs: {self.members[0].name}'s gradient steps cannot be captured (sac, td3 and ddpg's can)")
        if self.encoder is not None:
            raise ConfigError("cuda_graphs: a recurrent encoder's gradient steps cannot be captured")
        self.captured = CapturedSteps(self, emulate)
        if type(self.members[0]).capturable_acting:
            self.captured_acting = CapturedActing(self, emulate)

    def compute_gradients(self, batch: ReplayBatch) -> tuple[dict[str, Sequence[torch.Tensor | None]], dict[str, torch.Tensor]]:
        """The members' ``seeds_gradients`` on the stacked networks: the gradients of each
        optimizer's stacked parameters (None where a group does not step) and each log (N,),
        on a batch with a leading seed dimension."""
        encoded = self.members[0].encode(self.encoder, self.encoder_target, batch)
        gradients, logs, self.td_errors = self.members[0].seeds_gradients(self.networks, encoded, self.tools)
        return {name: gradients.get(name) or [None] * len(optimizer.parameters) for name, optimizer in self.optimizers.items()}, logs

    def update_targets(self) -> None:
        """Move the stacked target networks (the members' ``num_updates`` already counts this step)."""

    def update(self) -> list[dict[str, float]]:
        members, config = self.members, self.config
        counts = {divmod(member.steps_since_update, config.update_every) for member in members}
        if len(counts) != 1:
            raise RuntimeError("the seeds of a batch fell out of step")
        updates, remainder = counts.pop()
        for member in members:
            member.steps_since_update = remainder
        for name, optimizer in self.optimizers.items():  # a schedule may have moved the members' rates
            member_optimizer = members[0].groups[name][1]
            if member_optimizer is not None:
                optimizer.lr = member_optimizer.param_groups[0]["lr"]
        logs: dict[str, list[torch.Tensor]] = {}
        for _ in range(updates * config.gradient_steps):
            batch = stack_batches([member.buffer.sample(config.batch_size, member.generator) for member in members])
            if self.captured is not None:
                info, self.td_errors = self.captured.step(batch)
            else:
                gradients, info = self.compute_gradients(batch)
                self.apply_gradients(gradients)
            if config.prioritized and self.td_errors is not None:
                for seed, member in enumerate(members):
                    member.buffer.update_priorities(batch["indices"][seed], self.td_errors[seed])
            for key, value in info.items():
                logs.setdefault(key, []).append(value)
        return per_seed_logs({key: torch.stack(values).mean(dim=0) for key, values in logs.items()}, self.num_seeds)

    def apply_gradients(self, gradients: Mapping[str, Sequence[torch.Tensor | None]]) -> None:
        """Step each stacked optimizer that has gradients, count the update, move the targets."""
        for name, group_gradients in gradients.items():
            optimizer = self.optimizers[name]
            if any(gradient is None for gradient in group_gradients):
                continue
            for parameter, gradient in zip(optimizer.parameters, group_gradients, strict=True):
                parameter.grad = gradient
            optimizer.step()
        for member in self.members:
            member.num_updates += 1
        self.update_targets()
