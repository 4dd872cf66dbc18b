"""An off-policy learner's gradient steps taken elsewhere (``agents.api.StepStrategy``): a
sampled batch split by rows over gradient workers, each drawing the whole batch's noise and
keeping its rows; the learner clips the sum where the losses clip, takes on the generator
state the workers ended in and sets the priorities of the rows not stored again since."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from agents.algos.offpolicy_losses import SeedTools
from agents.algos.seeds import seed_axis
from agents.api import Algorithm, Gradients, Hyperparameters, SharedStep, ShareGradients, Transitions
from agents.batches import EncodedBatch, ReplayBatch
from agents.configs.offpolicy import OffPolicyConfig
from agents.errors import ConfigError
from agents.optim import clip_gradients


class SharedReplaySteps(Algorithm):
    """The learner interface's shared step for off-policy learners (``OffPolicyAlgorithm``
    derives from it): the step is a sampled batch (B, ...)."""

    # what the off-policy learner has (declared for type checkers)
    config: Any
    buffer: Any
    td_errors: torch.Tensor | None

    if TYPE_CHECKING:

        @property
        def groups(self) -> dict[str, tuple[list[torch.nn.Parameter], torch.optim.Optimizer | None]]: ...

        def networks(self) -> Any: ...

        def encode(self, encoder: Any, encoder_target: Any, batch: ReplayBatch) -> EncodedBatch: ...

        def seeds_gradients(
            self, networks: Any, batch: EncodedBatch, tools: SeedTools
        ) -> tuple[dict[str, list[torch.Tensor]], dict[str, torch.Tensor], torch.Tensor | None]: ...

        def gradient_list(self, batch: ReplayBatch | Mapping[str, torch.Tensor]) -> tuple[list[torch.Tensor | None], dict[str, float]]: ...

        def apply_step(self, gradients: list[torch.Tensor | None], indices: torch.Tensor | None, td_errors: torch.Tensor | None) -> None: ...

    # -- gradient steps elsewhere (agents.api.StepStrategy) ---------------------------------
    #
    # A worker evaluates the losses on rows [a, b) of the batch: each draw of noise per row is
    # made for all B rows, as the learner alone would make it, and the worker keeps its rows (a
    # draw whose first dimension is the share's rows is per row; any other is made as it is);
    # clipping inside the losses (DQN's) is left to the learner, which clips the sum.

    @classmethod
    def replica_config(cls, config: Hyperparameters) -> Hyperparameters:
        """No replay memory of its own."""
        return config.replace(buffer_size=max(int(cast(OffPolicyConfig, config).num_envs), 1))

    @classmethod
    def unsplittable_steps(cls, config: Hyperparameters, device: str = "cpu") -> str | None:
        if device.startswith("cuda"):
            return f"{cls.name}'s gradient workers draw the learner's noise on the CPU; with gradient workers its learner needs device cpu"
        return None

    def shared_step(self, batch: ReplayBatch, asynchronous: bool = False) -> SharedStep:
        loss_state = self.loss_state()
        if asynchronous:  # the worker's noise is its own: a seed drawn from the learner's generator
            seed = int(torch.randint(2**62, (1,), generator=self.generator, device=self.generator.device))
            loss_state["generator"] = torch.Generator().manual_seed(seed).get_state()
        # the rows' replay indices, and the buffer's count now: priorities go to the rows not stored again since
        return SharedStep(batch, int(batch.obs.shape[0]), loss_state, (batch.indices, self.buffer.rows_written, asynchronous))

    def share_of(self, step: SharedStep, rows: slice) -> ReplayBatch:
        batch: ReplayBatch = step.batch
        return batch.apply(lambda tensor: tensor[rows].cpu())

    def share_gradients(self, share: ReplayBatch, rows: slice, total: int) -> ShareGradients:
        """Outputs: the TD errors of its rows (m,) when prioritized, the generator state its
        draws ended in, the optimizer groups the losses asked to clip with their max norms."""
        generator, device, groups = self.generator, self.device, self.groups
        size = rows.stop - rows.start
        clipped: dict[int, float] = {}

        def noise(draw: Any, shape: Sequence[int]) -> torch.Tensor:
            if size != total and len(shape) > 0 and shape[0] == size:  # per row: the whole batch's draw, this share's rows
                return draw((1, total, *shape[1:]), generator, device)[:, rows]
            return draw((1, *shape), generator, device)

        def clip(gradients: list[torch.Tensor], max_norm: float) -> torch.Tensor:
            clipped[id(gradients)] = max_norm
            return torch.zeros(1)

        tools = SeedTools(noise=noise, clip=clip, parameters=lambda group: groups[group][0])
        by_group, logs, errors = self.seeds_gradients(self.networks(), self.encode(None, None, seed_axis(share)), tools)
        flat: list[torch.Tensor | None] = []
        for name, (parameters, _) in groups.items():
            values = by_group.get(name)
            flat += [None] * len(parameters) if values is None else [value.detach() for value in values]
        return ShareGradients(
            dict(zip(self.parameter_names(), flat, strict=True)),
            {key: value.detach() for key, value in logs.items()},
            {
                "td_errors": None if errors is None else errors[0].detach(),
                "generator": generator.get_state(),
                "clip": {name: clipped[id(values)] for name, values in by_group.items() if id(values) in clipped},
            },
        )

    def apply_shared_step(self, step: SharedStep, gradients: Gradients, logs: Mapping[str, torch.Tensor], shares: Sequence[ShareGradients]) -> dict[str, float]:
        """Clip where the losses clip, take on the generator state the workers' draws ended in
        (synchronous: all the same), step, and set the priorities of the batch's rows not stored
        again since it was sampled."""
        indices, written, asynchronous = step.tag
        if not asynchronous:
            states = [share.outputs["generator"] for share in shares]
            if any(not torch.equal(state, states[0]) for state in states):
                raise RuntimeError("the gradient workers' noise diverged: they did not draw from one state")
            self.generator.set_state(states[0])
        flat = [gradients.get(name) for name in self.parameter_names()]
        logs = dict(logs)
        clip = shares[0].outputs["clip"]
        start = 0
        for name, (parameters, _) in self.groups.items():
            values = [value for value in flat[start : start + len(parameters)] if value is not None]
            if name in clip and values:
                logs["grad_norm"] = clip_gradients(values, clip[name]).reshape(1)
            start += len(parameters)
        given = [share.outputs["td_errors"] for share in shares if share.outputs["td_errors"] is not None]
        errors = torch.cat(given) if given and len(given) == len(shares) else None
        if asynchronous and indices is not None and errors is not None:  # rows stored again since keep their new transitions' priorities
            kept = ~self.buffer.rewritten_since(indices, written)
            indices, errors = indices[kept], errors[kept]
        self.apply_step(flat, indices, errors)
        return {key: float(value.reshape(-1)[0]) for key, value in logs.items()}

    def initial_priorities(self, transitions: Transitions) -> torch.Tensor:
        """A gradient step's losses on the transitions, their gradients discarded."""
        config, count = self.config, int(transitions.obs.shape[0])
        self.gradient_list(
            ReplayBatch(
                obs=transitions.obs,
                actions=transitions.acted.actions,
                rewards=transitions.rewards * getattr(config, "reward_scale", 1.0),
                next_obs=transitions.next_obs,
                terminated=transitions.terminated.float(),
                discounts=torch.full((count,), float(getattr(config, "gamma", 0.99))),
                weights=torch.ones(count),
            )
        )
        if self.td_errors is None:
            raise ConfigError(f"{self.name} computes no TD errors: its replay is not prioritized")
        return self.td_errors.detach().abs().cpu()
