"""N seeds of one configuration trained in one process as one batched model.

Every batched algorithm writes its losses once, over a leading seed dimension (S, B, ...):
``seeds_loss`` and ``optimize(seeds)`` in ``agents.algos.onpolicy``, ``seeds_gradients`` in
``agents.algos.offpolicy``. A run evaluates them with its own networks (S = 1); a seed batch
only stacks the networks and optimizers they run on, and keeps the members' draws apart.

    members = [make(algo, spec, config, seed=s) for s in seeds]   # each built as its own run would be
    batch = SeedBatch(members)      # parameters stacked (N, ...); each member's are views of its slice
    loop:
        acted = batch.act(obs)      # one forward for all seeds; each seed's noise from its own generator
        step each seed's envs; batch.observe(transitions)   # into each member's own storage
        if batch.ready_to_update(): logs = batch.update()   # one loss and backward for all seeds

Independence is exact by construction, not by luck:

- every random draw a member's own run makes (replay indices, minibatch orders, action and
  target noise, exploration) is made from that member's generator, in the same order;
- the losses are per-seed means, and the backward pass runs on their sum: seeds share no
  parameter, so each seed's gradient is that of its own loss;
- gradient clipping takes each seed's own norm; Adam is elementwise, so one Adam (or RMSprop)
  over the stacked parameters is N of them (one step count, which the seeds share: they update
  together);
- storage, counters, schedules, temperatures, epsilon and normalization statistics stay the
  members' (the training loop keeps one vector env per seed).

A member's optimizer state is copied out of the stacked optimizer by ``sync_members`` (before
saving), so ``members[i].state_dict()`` is exactly what its run alone would save, and a batch
built from members that were loaded from such states continues them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from agents.api import Acted, Algorithm, BatchedSeeds, Learner, Transitions
from agents.batches import TensorBatch
from agents.meta import BatchedMetaSeeds
from agents.optim import adam

if TYPE_CHECKING:
    from agents.meta import MetaAlgorithm

BatchT = TypeVar("BatchT", bound=TensorBatch)


def stacked_index(stacked: Sequence[torch.Tensor]) -> dict[int, tuple[torch.Tensor, int]]:
    """Where each member tensor lives: its data pointer -> (stacked tensor, slice index)."""
    index = {}
    for tensor in stacked:
        for position in range(tensor.shape[0]):
            index[tensor.data[position].data_ptr()] = (tensor, position)
    return index


class StackedOptimizer:
    """One optimizer over stacked parameters standing for the members' (one per seed): Adam,
    RMSprop or SGD, whose steps are elementwise, so one step over (N, ...) tensors is N steps.

    Built with the members' hyperparameters (they must agree) and, when the members have
    already stepped (a resumed run), their state stacked: every state tensor of a parameter's
    shape is stacked, a step count (which the seeds share: they update together) is taken
    once. ``export`` writes the state back into each member's optimizer in its own format."""

    def __init__(self, member_optimizers: Sequence[torch.optim.Optimizer], stacked: Sequence[torch.Tensor]):
        self.members = list(member_optimizers)
        self.steps = torch.zeros(len(self.members))  # each seed's step count (they differ once a seed stops early)
        self._parted = False  # whether the counts differ: then every step runs per seed
        groups = [optimizer.param_groups for optimizer in self.members]
        if any(len(member_groups) != 1 for member_groups in groups):
            raise ValueError("stacked optimizers take members with one parameter group each")
        kinds = {type(optimizer) for optimizer in self.members}
        settings = [{key: value for key, value in group[0].items() if key != "params"} for group in groups]
        if len(kinds) != 1 or any(setting != settings[0] for setting in settings):
            raise ValueError(f"the members' optimizers differ: {settings}")
        self.index = stacked_index(stacked)
        self.parameters: list[torch.Tensor] = []
        for parameter in groups[0][0]["params"]:
            home, _ = self.index[parameter.data_ptr()]
            if not any(home is known for known in self.parameters):
                self.parameters.append(home)
        first, setting = self.members[0], settings[0]
        if isinstance(first, torch.optim.Adam):
            self.optimizer: torch.optim.Optimizer = adam(self.parameters, **{key: setting[key] for key in ("lr", "betas", "eps", "weight_decay")})
        elif isinstance(first, torch.optim.RMSprop):
            keys: tuple[str, ...] = ("lr", "alpha", "eps", "weight_decay", "momentum", "centered")
            self.optimizer = torch.optim.RMSprop(self.parameters, **{key: setting[key] for key in keys})
        elif isinstance(first, torch.optim.SGD):
            keys = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
            self.optimizer = torch.optim.SGD(self.parameters, **{key: setting[key] for key in keys})
        else:
            raise ValueError(f"cannot stack a {type(first).__name__} (Adam, RMSprop and SGD can be)")
        self._import()
        self._parted = bool((self.steps != self.steps[0]).any())

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        self.optimizer.param_groups[0]["lr"] = value

    def step(self, active: torch.Tensor | None = None) -> None:
        """One step of every seed, or of the seeds where ``active`` (N,) is true: the others'
        parameters, moments and step counts stay as they were (a seed whose epochs stopped
        early, as its run alone would). While the seeds' step counts agree and all step, the
        optimizer's own (fused) step serves them all; after they part, Adam's arithmetic runs
        here with each seed's own count and bias corrections."""
        if active is None and not self._parted:  # the common step: no per-seed bookkeeping
            self.optimizer.step()
            self.steps += 1
            return
        stepping = torch.ones(len(self.members), dtype=torch.bool) if active is None else active.cpu()
        if bool(stepping.all()) and not self._parted:
            self.optimizer.step()
        elif isinstance(self.optimizer, torch.optim.Adam):
            self._masked_adam(stepping)
        else:
            raise ValueError(f"{type(self.optimizer).__name__} cannot step part of its seeds (Adam can)")
        self.steps += stepping.float()
        self._parted = bool((self.steps != self.steps[0]).any())

    @torch.no_grad()
    def _masked_adam(self, stepping: torch.Tensor) -> None:
        """``torch.optim.Adam``'s step (no amsgrad) for the seeds in ``stepping``, each with its own count."""
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        counts = self.steps + stepping.float()  # the count of each stepping seed after this step
        for parameter in self.parameters:
            if parameter.grad is None:
                continue
            shape = (-1,) + (1,) * (parameter.dim() - 1)
            mask = stepping.to(parameter.device).view(shape)
            state = self.optimizer.state[parameter]
            if not state:
                state.update(step=torch.zeros((), device=parameter.device), exp_avg=torch.zeros_like(parameter), exp_avg_sq=torch.zeros_like(parameter))
            gradient = parameter.grad
            if group["weight_decay"]:
                gradient = gradient + group["weight_decay"] * parameter
            exp_avg = torch.where(mask, state["exp_avg"] * beta1 + gradient * (1 - beta1), state["exp_avg"])
            exp_avg_sq = torch.where(mask, state["exp_avg_sq"] * beta2 + gradient * gradient * (1 - beta2), state["exp_avg_sq"])
            count = counts.to(parameter.device).clamp_min(1).view(shape)
            step_size = group["lr"] / (1 - beta1**count)
            denom = exp_avg_sq.sqrt() / (1 - beta2**count).sqrt() + group["eps"]
            parameter.copy_(torch.where(mask, parameter - step_size * exp_avg / denom, parameter))
            state["exp_avg"].copy_(exp_avg)
            state["exp_avg_sq"].copy_(exp_avg_sq)

    def _pairs(self) -> list[tuple[torch.optim.Optimizer, torch.Tensor, torch.Tensor, int]]:
        """(member optimizer, member parameter, stacked parameter, slice) for every member parameter."""
        pairs = []
        for optimizer in self.members:
            for parameter in optimizer.param_groups[0]["params"]:
                home, position = self.index[parameter.data_ptr()]
                pairs.append((optimizer, parameter, home, position))
        return pairs

    def _import(self) -> None:
        pairs = self._pairs()
        stepped: list[Any] = [optimizer.state.get(parameter) for optimizer, parameter, _, _ in pairs]  # state dicts, or None before a step
        if not any(stepped):
            return
        if not all(stepped):
            raise ValueError("some members' optimizers have state and others none: they cannot train as one batch")
        for member_index, optimizer in enumerate(self.members):
            counts = {float(state["step"]) for (member, _, _, _), state in zip(pairs, stepped) if member is optimizer and "step" in state}
            if not counts:  # SGD keeps no count
                continue
            if len(counts) != 1:
                raise ValueError(f"a member's parameters are at different steps {sorted(counts)}")
            self.steps[member_index] = counts.pop()
        for home in self.parameters:
            parts = sorted(((position, state) for (_, _, stacked, position), state in zip(pairs, stepped) if stacked is home), key=lambda part: part[0])
            first = parts[0][1]
            imported = {}
            for key, value in first.items():
                if key != "step" and torch.is_tensor(value) and value.shape == home.shape[1:]:
                    imported[key] = torch.stack([state[key] for _, state in parts]).to(home.device)
                elif key == "step":  # the optimizer's own count: used while the seeds' counts agree
                    imported[key] = torch.as_tensor(value, dtype=torch.float32).clone().to(home.device)
                else:
                    imported[key] = value.clone() if torch.is_tensor(value) else value
            self.optimizer.state[home] = imported

    def export(self) -> None:
        """Each member optimizer gets its slice of the state, the step count and the learning rate."""
        member_index = {id(optimizer): index for index, optimizer in enumerate(self.members)}
        for optimizer, parameter, home, position in self._pairs():
            optimizer.param_groups[0]["lr"] = self.lr
            state = self.optimizer.state.get(home)
            if not state:
                continue
            exported = {
                key: (
                    value[position].clone()
                    if key != "step" and torch.is_tensor(value) and value.shape == home.shape
                    else value.clone()
                    if torch.is_tensor(value)
                    else value
                )
                for key, value in state.items()
            }
            if "step" in exported:
                exported["step"] = torch.as_tensor(float(self.steps[member_index[id(optimizer)]]), dtype=torch.float32).to(exported["step"].device)
            optimizer.state[parameter] = exported
        for optimizer in self.members:
            if hasattr(optimizer, "_tensor_lists"):
                optimizer._tensor_lists = None  # a FusedAdam gathers its (new) state tensors again


def clip_per_seed(gradients: Sequence[torch.Tensor], num_seeds: int, max_norm: float) -> torch.Tensor:
    """``agents.optim.clip_gradients`` for each seed on its own: gradients of stacked parameters
    (N * m, ...) are scaled in place so each seed's global norm is at most ``max_norm``;
    returns the norms before (N,)."""
    per_tensor = torch.stack([torch.linalg.vector_norm(gradient.reshape(num_seeds, -1), dim=1) for gradient in gradients])
    norms = torch.linalg.vector_norm(per_tensor, dim=0)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for gradient in gradients:  # (possibly not contiguous: the gradient of a transposed weight)
        rows = scale.repeat_interleave(gradient.shape[0] // num_seeds)  # each seed's m rows
        gradient.mul_(rows.view(-1, *[1] * (gradient.dim() - 1)))
    return norms


def seed_axis(batch: BatchT) -> BatchT:
    """One run's batch as a batch of one seed: a leading dimension of size 1 on every tensor."""
    return batch.apply(lambda tensor: tensor.unsqueeze(0))


def stack_batches(batches: Sequence[BatchT]) -> BatchT:
    """Per-seed batches with the same fields -> one batch with a leading seed dimension."""
    return type(batches[0]).stack(batches)


def stacked_noise(draw: Any, shape: Sequence[int], generators: Sequence[torch.Generator], device: torch.device) -> torch.Tensor:
    """Each seed's draws of ``shape`` from its own generator, stacked: (N, *shape) on ``device``."""
    return torch.stack([draw(tuple(shape), generator, torch.device("cpu")) for generator in generators]).to(device)


def per_seed_logs(logs: dict[str, torch.Tensor], num_seeds: int) -> list[dict[str, float]]:
    """{name: (N,) tensor} -> one {name: float} per seed, with one device transfer."""
    if not logs:
        return [{} for _ in range(num_seeds)]
    names = list(logs)
    device = logs[names[0]].device
    if num_seeds == 1 and device.type == "cpu":  # one run on the CPU: reading each value costs no transfer
        return [{name: logs[name].item() for name in names}]
    values = torch.stack([logs[name].detach().float().to(device).expand(num_seeds) for name in names]).cpu().tolist()
    return [{name: row[seed] for name, row in zip(names, values)} for seed in range(num_seeds)]


def check_members(batch: object, members: Sequence[Learner]) -> None:
    """ValueError unless ``members`` are learners of one class, batched by ``batch``'s class,
    with one configuration."""
    if not members:
        raise ValueError("a seed batch needs at least one member")
    classes = {type(member) for member in members}
    if len(classes) != 1 or classes.pop().seed_batch is not type(batch):
        raise ValueError(f"{type(batch).__name__} does not batch {sorted({type(m).name for m in members})}")
    if len({repr(member.config) for member in members}) != 1:
        raise ValueError("the members of a seed batch must share one configuration")


class SeedBatch(BatchedSeeds):
    """N members (algorithms of one class and configuration, built with their own seeds)
    trained as one batched model; see the module docstring."""

    def __init__(self, members: Sequence[Algorithm]):
        check_members(self, members)
        super().__init__(members)
        self.device = self.members[0].device
        self.generators = [member.generator for member in self.members]
        self.optimizers: dict[str, StackedOptimizer] = {}

    @property
    def config(self) -> Any:
        """The members' configuration as it is now (``update_parameter`` replaces theirs)."""
        return self.members[0].config

    # -- the loop's calls, per seed ----------------------------------------------------------

    @abc.abstractmethod
    def act(self, obs: Sequence[torch.Tensor], states: Sequence[Any] | None = None) -> list[Acted]:
        """Each seed's behavior actions for its observations obs[i] (E, *obs_shape), from its
        recurrent state states[i] (None: a fresh one; ``states`` None: every seed's fresh)."""

    def observe(self, transitions: Sequence[Transitions]) -> None:
        for member, member_transitions in zip(self.members, transitions, strict=True):
            member.observe(member_transitions)

    def ready_to_update(self) -> bool:
        ready = {member.ready_to_update() for member in self.members}
        if len(ready) != 1:
            raise RuntimeError("the seeds of a batch fell out of step")
        return ready.pop()

    @abc.abstractmethod
    def update(self) -> list[dict[str, float]]:
        """One update of every seed; each seed's logs, as its own ``update()`` returns them."""

    def sync_members(self) -> None:
        """Copy the stacked optimizers' state into the members (their parameters are views
        already): afterwards ``members[i].state_dict()`` is seed i's complete state."""
        for optimizer in self.optimizers.values():
            optimizer.export()

    @staticmethod
    def _stack_optimizers(pairs: Mapping[str, tuple[Sequence[torch.optim.Optimizer], Sequence[torch.Tensor]]]) -> dict[str, StackedOptimizer]:
        return {name: StackedOptimizer(optimizers, stacked) for name, (optimizers, stacked) in pairs.items()}


class MetaSeedBatch(BatchedMetaSeeds):
    """N seeds of one meta-learner's configuration trained as one batched model: every epoch
    each seed samples its own tasks and collects through its own task envs with its own
    draws, as its run alone would; the adaptation and meta-update steps of all seeds run as
    one over their stacked parameters. The members' parameters are views of the stacks, so
    they meta-test, save and load as alone; ``sync_members`` copies the stacked optimizers'
    state into them before a save."""

    def __init__(self, members: Sequence[MetaAlgorithm[Any]]):
        check_members(self, members)
        super().__init__(members)
        self.optimizers: dict[str, StackedOptimizer] = {}

    def sync_members(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.export()
