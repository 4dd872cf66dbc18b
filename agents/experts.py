"""Where behavioral cloning's expert comes from (``agents.algos.bc``): a policy checkpoint written
by this suite's runs (``agents.policy_file``: the expert sees observations normalized with its
own frozen statistics), an
``.npz`` dataset of ``observations`` (N, *obs_shape) and ``actions`` (N, *action_shape), or
``minari:<dataset id>`` for a Minari dataset stored locally (needs the ``minari`` package).

``check_expert`` is what ``BCConfig`` checks before a run starts (the one configuration check
that reads a file with torch); the learner loads the expert through the rest.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from agents.api import Acted, Learner
from agents.env_setup import EnvSetup, setup_of
from agents.envs import EnvSpec, env_spec
from agents.errors import ConfigError
from agents.policy_file import TrainedPolicy


def load_expert_checkpoint(path: str, spec: EnvSpec) -> TrainedPolicy:
    """A policy file of this suite (``agents.policy_file``), checked against ``spec``; ConfigError otherwise."""
    try:
        expert = TrainedPolicy.read(torch.load(path, map_location="cpu", weights_only=True))
    except ValueError as error:
        raise ConfigError(f"bc expert {path}: {error}") from None
    except Exception as error:  # torch raises several types for a file it cannot read
        raise ConfigError(f"bc expert {path}: cannot read it as a checkpoint ({type(error).__name__}: {error})") from None
    expert_spec = env_spec(recorded_env(expert.spec))
    if (expert_spec.observation_shape, expert_spec.action_shape, expert_spec.discrete) != (spec.observation_shape, spec.action_shape, spec.discrete):
        raise ConfigError(f"the expert was trained on {expert.spec['env_id']}, whose spaces differ from {spec.env_id}'s")
    if expert.hyperparameters.get("recurrent") not in (None, "none"):
        raise ConfigError(f"the expert {expert.algo} is recurrent; bc clones feed-forward experts only")
    return expert


def recorded_env(recorded: Mapping[str, Any]) -> EnvSetup:
    """The env the expert trained on, as its spec recorded it (with its env_kwargs and wrappers)."""
    return setup_of(recorded["env_id"], recorded.get("env_kwargs") or {}, recorded.get("wrappers") or [])


class ExpertPolicy:
    """A trained policy of this suite, restored from its checkpoint, acting on raw observations."""

    def __init__(self, expert: TrainedPolicy, device: torch.device, deterministic: bool):
        import agents  # the registry imports this module

        algo, hyperparameters = expert.algo, expert.hyperparameters
        if "buffer_size" in hyperparameters:  # acting needs no replay buffer: keep its allocation small
            hyperparameters["buffer_size"] = max(int(hyperparameters.get("batch_size", 1)), 1)
        self.algorithm: Learner = agents.make(algo, env_spec(recorded_env(expert.spec)), hyperparameters, total_steps=1, device=device)
        self.algorithm.load_state_dict(expert.algorithm)
        statistics = expert.normalization.get("obs_rms")
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


def is_dataset(source: str) -> bool:
    return source.startswith("minari:") or source.endswith(".npz")


def check_expert(source: str, spec: EnvSpec) -> None:
    """ConfigError unless ``source`` (a checkpoint, a dataset or a minari id) holds an expert for ``spec``."""
    if is_dataset(source):
        check_dataset(source, spec)
    else:
        load_expert_checkpoint(source, spec)
