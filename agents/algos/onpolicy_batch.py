"""N seeds of one on-policy configuration trained as one batched model (``agents.algos.seeds``):
one forward acts for every seed, each seed keeps its rollout, advantages and schedules, and the
algorithm's own ``optimize`` runs once on the batch as its ``Seeds`` (stacked network and
optimizers)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch

from agents.algos.onpolicy import OnPolicyAlgorithm
from agents.algos.policy_gradient import gradient_step
from agents.algos.seeds import SeedBatch, clip_per_seed, per_seed_logs, stack_batches, stacked_index, stacked_noise
from agents.api import Acted
from agents.batches import RolloutBatch
from agents.configs.onpolicy import OnPolicyConfig
from agents.nets.stacked import StackedActorCritic


class OnPolicySeedBatch(SeedBatch):
    """N seeds of one on-policy configuration (feed-forward or recurrent): one forward acts for
    every seed, from each seed's recurrent state; each seed keeps its rollout, advantages and schedules; the optimization is the algorithm's
    own ``optimize``, run once on this batch as its ``Seeds`` (stacked network and optimizers)."""

    members: list[OnPolicyAlgorithm]  # type: ignore[assignment]
    config: OnPolicyConfig

    def __init__(self, members: Sequence[OnPolicyAlgorithm]):
        super().__init__(members)
        first = self.members[0]
        self.network = StackedActorCritic([member.actor_critic for member in self.members])
        self.separate_feed_forward = first.actor_critic.separate_feed_forward
        self.stacked_parameters = list(self.network.parameters())
        self.optimizers = self._stack_optimizers(
            {name: ([member.optimizers[name] for member in self.members], self.stacked_parameters) for name in first.optimizers}
        )

    def act(self, obs: Sequence[torch.Tensor], states: Sequence[Any] | None = None) -> list[Acted]:
        members = self.members
        with torch.inference_mode():
            stacked_obs = torch.stack([member_obs.to(self.device) for member_obs in obs])
            acted_from = next_states = values = None
            if self.network.recurrent is not None:  # each seed from its state (a fresh one at the start)
                acted_from = torch.stack(
                    [
                        cast(torch.Tensor, member.actor_critic.initial_state(len(member_obs), self.device)) if state is None else state
                        for member, member_obs, state in zip(members, obs, states or [None] * len(members), strict=True)
                    ]
                )
                outputs, values, next_states = self.network.step(stacked_obs, acted_from)
            elif self.separate_feed_forward:  # V of the rollout comes in one pass at its end, as for one seed
                outputs = self.network.policy_outputs(stacked_obs)
            else:
                outputs, values = self.network.heads(stacked_obs)
            params = self.network.dist_params(outputs)
            dist = self.network.distribution(params)
            noise = stacked_noise(dist.draw, dist.noise_shape[1:], self.generators, self.device)
            actions, log_probs = dist.sample_with_log_prob(noise)
            entropies = dist.entropy() if self.config.entropy_method == "max" else None
        acted = []
        for seed, member in enumerate(members):
            extras = {"log_prob": log_probs[seed], "dist_params": params[seed]}
            if values is not None:
                extras["value"] = values[seed] if member.learns_value else torch.zeros_like(values[seed])
            if entropies is not None:
                extras["entropy"] = entropies[seed]
            if acted_from is not None:
                extras["state"] = acted_from[seed]
            acted.append(Acted(actions[seed], member.env_actions(actions[seed]), None if next_states is None else next_states[seed], extras))
        return acted

    def update(self) -> list[dict[str, float]]:
        members = self.members
        logs = [member.begin_update() for member in members]
        for name, optimizer in self.optimizers.items():
            optimizer.lr = members[0].optimizers[name].param_groups[0]["lr"]
        for seed_logs, optimized in zip(logs, per_seed_logs(members[0].optimize(self), self.num_seeds)):
            seed_logs.update(optimized)
        return [member.end_update(seed_logs) for member, seed_logs in zip(members, logs)]

    # -- the Seeds protocol ---------------------------------------------------------------

    def full_batch(self) -> RolloutBatch:
        return stack_batches([member.storage.full_batch(member.rollout_sequence_length()) for member in self.members])

    def minibatches(self, num_minibatches: int, active: torch.Tensor | None = None) -> Iterator[RolloutBatch]:
        epochs = [
            member.minibatches(num_minibatches) if active is None or active[seed] else self._filler(member, num_minibatches)
            for seed, member in enumerate(self.members)
        ]
        for minibatches in zip(*epochs, strict=True):
            yield stack_batches(minibatches)

    @staticmethod
    def _filler(member: OnPolicyAlgorithm, num_minibatches: int) -> Iterator[RolloutBatch]:
        """Minibatches of a seed that sits the epoch out: shaped as its own, drawn without its generator."""
        if member.config.recurrent != "none":
            return member.storage.sequence_minibatches(num_minibatches, member.sequence_length, torch.Generator())
        return member.storage.minibatches(num_minibatches, torch.Generator())

    gradient_step = gradient_step

    def finish(self) -> None:
        pass

    def step(self, loss: torch.Tensor, active: torch.Tensor | None = None) -> None:
        gradients = torch.autograd.grad(loss.sum(), self.stacked_parameters, allow_unused=True)
        for parameter, gradient in zip(self.stacked_parameters, gradients, strict=True):
            parameter.grad = gradient
        for optimizer in self.optimizers.values():
            with_gradients = [parameter.grad for parameter in optimizer.parameters if parameter.grad is not None]
            if not with_gradients:
                continue
            if self.config.max_grad_norm is not None:
                clip_per_seed(with_gradients, self.num_seeds, self.config.max_grad_norm)
            optimizer.step(active)
        for parameter in self.stacked_parameters:
            parameter.grad = None

    def policy_parameters(self) -> list[torch.Tensor]:
        index = stacked_index(self.stacked_parameters)
        homes: list[torch.Tensor] = []
        for parameter in self.members[0].actor_critic.policy_parameters():
            home = index[parameter.data_ptr()][0]
            if not any(home is known for known in homes):
                homes.append(home)
        return homes
