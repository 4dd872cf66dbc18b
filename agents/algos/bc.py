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

The expert (``expert`` hyperparameter) is either
- a policy checkpoint written by this suite's runs (``final.pt`` or ``latest.pt``: the keys
  ``spec`` (algo, env_id, hyperparameters), ``algorithm`` and ``normalization`` are read; the
  expert sees observations normalized with its own frozen statistics);
- a dataset of transitions: ``.npz`` with arrays ``observations`` (N, *obs_shape) and
  ``actions`` (N, *action_shape); or ``minari:<dataset id>`` for a Minari dataset stored
  locally (needs the ``minari`` package).

Defaults are garage's BC (learning rate 1e-3 with Adam, 16 minibatches per epoch, log_prob).
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from agents.algos.seeds import SeedBatch, per_seed_logs
from agents.api import Acted, Algorithm, ConfigError, Learner, Transitions, set_gradients
from agents.configs.bc import OPTIMIZER_NAMES, BCConfig
from agents.env_setup import EnvSetup, setup_of
from agents.envs import EnvSpec, env_spec
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


def load_expert_checkpoint(path: str, spec: EnvSpec) -> dict[str, Any]:
    """A policy checkpoint of this suite, checked against ``spec``; ConfigError otherwise."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        recorded = payload["spec"]
        algo, env_id, hyperparameters = recorded["algo"], recorded["env_id"], recorded["hyperparameters"]
        payload["algorithm"]
    except (KeyError, TypeError):
        raise ConfigError(f"bc expert {path}: not a checkpoint of this suite (it needs spec with algo, env_id, hyperparameters, and algorithm)") from None
    except Exception as error:  # torch raises several types for a file it cannot read
        raise ConfigError(f"bc expert {path}: cannot read it as a checkpoint ({type(error).__name__}: {error})") from None
    expert_spec = env_spec(recorded_env(recorded))
    if (expert_spec.observation_shape, expert_spec.action_shape, expert_spec.discrete) != (spec.observation_shape, spec.action_shape, spec.discrete):
        raise ConfigError(f"the expert was trained on {env_id}, whose spaces differ from {spec.env_id}'s")
    if hyperparameters.get("recurrent") not in (None, "none"):
        raise ConfigError(f"the expert {algo} is recurrent; bc clones feed-forward experts only")
    return payload


def recorded_env(recorded: Mapping[str, Any]) -> EnvSetup:
    """The env the expert trained on, as its spec recorded it (with its env_kwargs and wrappers)."""
    return setup_of(recorded["env_id"], recorded.get("env_kwargs") or {}, recorded.get("wrappers") or [])


class ExpertPolicy:
    """A trained policy of this suite, restored from its checkpoint, acting on raw observations."""

    def __init__(self, payload: Mapping[str, Any], device: torch.device, deterministic: bool):
        import agents  # the registry imports this module

        recorded = payload["spec"]
        algo, hyperparameters = recorded["algo"], dict(recorded["hyperparameters"])
        if "buffer_size" in hyperparameters:  # acting needs no replay buffer: keep its allocation small
            hyperparameters["buffer_size"] = max(int(hyperparameters.get("batch_size", 1)), 1)
        self.algorithm: Learner = agents.make(algo, env_spec(recorded_env(recorded)), hyperparameters, total_steps=1, device=device)
        self.algorithm.load_state_dict(payload["algorithm"])
        statistics = (payload.get("normalization") or {}).get("obs_rms")
        self.clip = float(hyperparameters.get("clip_observations", 10.0))
        self.mean = self.std = None
        if statistics is not None:
            self.mean = torch.as_tensor(np.asarray(statistics["mean"]), dtype=torch.float32, device=device)
            self.std = torch.sqrt(torch.as_tensor(np.asarray(statistics["var"]), dtype=torch.float32, device=device) + 1e-8)
        self.deterministic = deterministic
        self.name = algo

    def act(self, obs: torch.Tensor) -> Acted:
        if self.mean is not None and self.std is not None:
            obs = ((obs - self.mean) / self.std).clamp(-self.clip, self.clip)
        return self.algorithm.act(obs, None, deterministic=self.deterministic)


def _check_dataset_shapes(source: str, observations: tuple[int, ...], actions: tuple[int, ...], spec: EnvSpec) -> None:
    if observations[1:] != spec.observation_shape or observations[0] != actions[0]:
        raise ConfigError(
            f"expert dataset {source}: observations {observations} and actions {actions} do not fit "
            f"{spec.env_id} (observations (N, {', '.join(map(str, spec.observation_shape))}))"
        )
    if actions[1:] != spec.action_shape:
        raise ConfigError(f"expert dataset {source}: actions have shape {actions[1:]}, {spec.env_id} takes {spec.action_shape}")
    if observations[0] == 0:
        raise ConfigError(f"expert dataset {source} is empty")


def check_dataset(source: str, spec: EnvSpec) -> None:
    """ConfigError unless ``source`` is a readable dataset of ``spec``'s shapes (reads only the
    npz headers, or the Minari store's list of datasets)."""
    if source.startswith("minari:"):
        try:
            import minari
        except ImportError:
            raise ConfigError(f"expert {source} needs the minari package (pip install minari, or the imitation extra)") from None
        dataset_id = source.removeprefix("minari:")
        if dataset_id not in minari.list_local_datasets():
            raise ConfigError(f"Minari dataset {dataset_id!r} is not in the local Minari store ({minari.storage.get_dataset_path()})")
        return
    shapes = {}
    try:
        with zipfile.ZipFile(source) as archive:
            for name in ("observations", "actions"):
                if f"{name}.npy" not in archive.namelist():
                    raise ConfigError(f"expert dataset {source} lacks {name!r}; it has {sorted(n.removesuffix('.npy') for n in archive.namelist())}")
                with archive.open(f"{name}.npy") as file:
                    version = np.lib.format.read_magic(file)
                    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                    shapes[name] = reader(file)[0]
    except (zipfile.BadZipFile, ValueError, OSError) as error:
        raise ConfigError(f"expert dataset {source}: not a readable npz file ({error})") from None
    _check_dataset_shapes(source, tuple(shapes["observations"]), tuple(shapes["actions"]), spec)


def load_dataset(source: str, spec: EnvSpec) -> tuple[np.ndarray, np.ndarray]:
    """(observations (N, *obs_shape), actions (N, *action_shape)) from an .npz file or a
    local Minari dataset; ConfigError naming what does not fit ``spec``."""
    check_dataset(source, spec)
    if source.startswith("minari:"):
        observations, actions = _load_minari(source.removeprefix("minari:"))
    else:
        with np.load(source) as data:
            observations, actions = data["observations"], data["actions"]
    _check_dataset_shapes(source, observations.shape, actions.shape, spec)
    return observations.astype(np.float32), actions


def _load_minari(dataset_id: str) -> tuple[np.ndarray, np.ndarray]:
    import minari

    try:
        dataset = minari.load_dataset(dataset_id)
    except Exception as error:  # minari raises several types for a dataset it cannot read
        raise ConfigError(f"cannot load Minari dataset {dataset_id!r}: {error}") from None
    observations, actions = [], []
    for episode in dataset.iterate_episodes():
        if isinstance(episode.observations, dict):
            raise ConfigError(f"Minari dataset {dataset_id!r} has dict observations ({sorted(episode.observations)}); bc clones Box observations")
        observations.append(np.asarray(episode.observations)[:-1])  # the last observation has no action
        actions.append(np.asarray(episode.actions))
    if not observations:
        raise ConfigError(f"Minari dataset {dataset_id!r} has no episodes")
    return np.concatenate(observations), np.concatenate(actions)


def _is_dataset(source: str) -> bool:
    return source.startswith("minari:") or source.endswith(".npz")


def check_expert(source: str, spec: EnvSpec) -> None:
    """ConfigError unless ``source`` (a checkpoint, a dataset or a minari id) holds an expert for ``spec``."""
    if _is_dataset(source):
        check_dataset(source, spec)
    else:
        load_expert_checkpoint(source, spec)


class BC(Algorithm):
    """Behavioral cloning of an expert policy (acting in the training envs) or a dataset."""

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
        if _is_dataset(source):
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

    def _epoch_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
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
        batches = [member._epoch_batch() for member in members]
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


BC.seed_batch = BCSeedBatch
