"""An on-policy learner's gradient steps taken elsewhere (``agents.api.StepStrategy``): a
minibatch's advantages centred here over the whole batch, each worker's share of its rows
differentiated on a copy, the shares' gradients applied as one step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from agents.algos.policy_gradient import process_advantages
from agents.api import Algorithm, Gradients, Hyperparameters, SharedStep, ShareGradients
from agents.batches import RolloutBatch
from agents.configs.onpolicy import OnPolicyConfig


class SharedRolloutSteps(Algorithm):
    """The learner interface's shared step for on-policy learners (``OnPolicyAlgorithm`` derives
    from it): the step is a minibatch (1, M, ...) and the loss parts to step."""

    # what the on-policy learner has (declared for type checkers)
    config: Any
    parameters: list[torch.nn.Parameter]
    actor_critic: Any

    if TYPE_CHECKING:

        def seeds_loss(self, network: Any, batch: RolloutBatch, parts: tuple[str, ...] = ...) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...

    @classmethod
    def rollout_length(cls, config: Hyperparameters) -> int | None:
        return int(cast(OnPolicyConfig, config).num_steps)

    @classmethod
    def replica_config(cls, config: Hyperparameters) -> Hyperparameters:
        """Advantages come centred by the learner, over the whole batch."""
        return config.replace(center_adv=False, positive_adv=False)

    @classmethod
    def unsplittable_steps(cls, config: Hyperparameters, device: str = "cpu") -> str | None:
        if not getattr(config, "baseline", True):
            return f"{cls.name}'s policy loss counts whole episodes over the batch (no baseline); gradient workers cannot split it"
        return None

    def shared_step(self, batch: tuple[RolloutBatch, tuple[str, ...]], asynchronous: bool = False) -> SharedStep:
        """``batch``: a minibatch (1, M, ...) and the loss parts to step; its advantages centred here."""
        rollout, parts = batch
        if "policy" in parts:
            rollout = rollout.replace(advantages=process_advantages(self.config, rollout.advantages))
        return SharedStep(rollout, int(rollout.advantages.shape[-1]), self.loss_state(), parts)

    def share_of(self, step: SharedStep, rows: slice) -> tuple[RolloutBatch, tuple[str, ...]]:
        return step.batch.apply(lambda tensor: tensor[:, rows].cpu()), step.tag

    def share_gradients(self, share: tuple[RolloutBatch, tuple[str, ...]], rows: slice, total: int) -> ShareGradients:
        batch, parts = share
        loss, info = self.seeds_loss(self.actor_critic, batch, parts)
        gradients = torch.autograd.grad(loss.sum(), self.parameters, allow_unused=True)
        return ShareGradients(dict(zip(self.parameter_names(), gradients, strict=True)), {key: value.detach() for key, value in info.items()})

    def apply_shared_step(
        self, step: SharedStep, gradients: Gradients, logs: Mapping[str, torch.Tensor], shares: Sequence[ShareGradients]
    ) -> dict[str, torch.Tensor]:
        self.apply_gradients(gradients)
        return dict(logs)
