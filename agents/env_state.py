"""Snapshots of a vector env's full state, so a checkpointed run continues the same episodes.

A snapshot walks every layer of a vector env built by ``make_vector_env``: the vector
wrappers (episode statistics, normalization), the sync vector env, and in each sub-env every
wrapper (time limit, ...) down to the unwrapped env. From each object it keeps the attributes
that are plain data (numbers, strings, arrays, tuples, lists and dicts of them), the state of
NumPy random generators, running mean/std statistics and, for MuJoCo envs, the physics:
``mj_getState`` (positions, velocities, activations, controls, warm-start accelerations, time)
plus every fixed-size array of ``MjData``, so quantities an env reads before it steps (body
positions, contact forces) are the ones it would have read.

Snapshots hold only tensors and primitives: they load with ``torch.load(weights_only=True)``.
An object with an attribute of an unknown kind (a Box2D world, say) cannot be captured;
``vector_env_state`` then returns None and a resumed run has to restart its episodes.
"""

from __future__ import annotations

import collections
import enum
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.wrappers.utils import RunningMeanStd

try:  # MuJoCo is a dependency, but the classic-control envs work without it
    import mujoco
except ImportError:  # pragma: no cover
    mujoco = None


class NotCapturable(Exception):
    """An env holds state this module cannot serialize."""


# attributes that are configuration or bookkeeping rebuilt by construction, never state
_SKIP = {
    "env",
    "envs",
    "env_fns",
    "spec",
    "metadata",
    "_saved_kwargs",
    "_ezpickle_args",
    "_ezpickle_kwargs",
    "_cached_spec",
    "_metadata",
    "model",
    "mujoco_renderer",
    "render_mode",
    "screen",
    "clock",
    "isopen",
    "viewer",
    "_previous_data",
    "time_queue",
    "return_queue",
    "length_queue",
    "episode_start_times",
    "_np_random_seed",
}
# kinds of values that describe structure (spaces, specs, modes), not state
_STRUCTURAL = (
    gym.Space,
    gym.envs.registration.EnvSpec,
    enum.Enum,
    collections.deque,
    gym.Env,
    gym.vector.VectorEnv,
    gym.vector.VectorWrapper,
)

_NUMERIC_KINDS = "biuf"  # bool, signed, unsigned, float: what a tensor holds exactly

_MUJOCO_SIGNATURE = mujoco.mjtState.mjSTATE_INTEGRATION if mujoco is not None else 0


def vector_env_state(envs: gym.vector.VectorEnv) -> dict[str, Any] | None:
    """The state of every layer of ``envs`` (tensors and primitives), or None when some
    object holds state that cannot be captured."""
    try:
        layers, sub_envs = _layers(envs)
        return {
            "layers": [_capture(layer) for layer in layers],
            "sub_envs": [[_capture(obj) for obj in _chain(env)] for env in sub_envs],
        }
    except NotCapturable:
        return None


def load_vector_env_state(envs: gym.vector.VectorEnv, state: dict[str, Any]) -> None:
    """Restore a ``vector_env_state`` snapshot into an env built the same way."""
    layers, sub_envs = _layers(envs)
    if len(layers) != len(state["layers"]) or len(sub_envs) != len(state["sub_envs"]):
        raise ValueError("the snapshot was taken from a vector env with different layers or number of envs")
    for layer, saved in zip(layers, state["layers"]):
        _restore(layer, saved)
    for env, saved_chain in zip(sub_envs, state["sub_envs"]):
        chain = _chain(env)
        if len(chain) != len(saved_chain):
            raise ValueError("the snapshot was taken from an env with different wrappers")
        for obj, saved in zip(chain, saved_chain):
            _restore(obj, saved)


def _layers(envs: gym.vector.VectorEnv) -> tuple[list[Any], list[gym.Env]]:
    layers: list[Any] = []
    layer: Any = envs
    while isinstance(layer, gym.vector.VectorWrapper):
        layers.append(layer)
        layer = layer.env
    layers.append(layer)
    if not hasattr(layer, "envs"):
        raise NotCapturable(f"{type(layer).__name__} keeps its envs out of process")
    return layers, list(layer.envs)


def _chain(env: gym.Env) -> list[Any]:
    chain = [env]
    while isinstance(chain[-1], gym.Wrapper):
        chain.append(chain[-1].env)
    return chain


def _capture(obj: Any) -> dict[str, Any]:
    """{"type": class name, "attributes": {name: encoded value}} for one object."""
    attributes = {}
    for name, value in vars(obj).items():
        if name in _SKIP or callable(value) or isinstance(value, _STRUCTURAL):
            continue
        attributes[name] = _encode(value, obj, f"{type(obj).__name__}.{name}")
    return {"type": type(obj).__name__, "attributes": attributes}


def _encode(value: Any, owner: Any, where: str) -> Any:
    if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
        if value.dtype.kind not in _NUMERIC_KINDS:
            raise NotCapturable(f"{where} is a {value.dtype} scalar")
        return {"__scalar__": value.item(), "dtype": value.dtype.str}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _NUMERIC_KINDS:
            raise NotCapturable(f"{where} is a {value.dtype} array")
        # torch has no uint16/uint32/uint64 of every op; store those widened, restore the dtype
        stored = value.astype(np.int64) if value.dtype.kind == "u" and value.dtype.itemsize > 1 else value.copy()
        return {"__ndarray__": torch.from_numpy(stored), "dtype": value.dtype.str}
    if isinstance(value, tuple):
        return tuple(_encode(item, owner, where) for item in value)
    if isinstance(value, list):
        return [_encode(item, owner, where) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise NotCapturable(where)
        return {key: _encode(item, owner, where) for key, item in value.items()}
    if isinstance(value, np.random.Generator):
        return {"__generator__": value.bit_generator.state}
    if isinstance(value, RunningMeanStd):
        return {"__rms__": {name: _encode(getattr(value, name), owner, where) for name in ("mean", "var", "count")}}
    if mujoco is not None and isinstance(value, mujoco.MjData):
        if not isinstance(getattr(owner, "model", None), mujoco.MjModel):
            raise NotCapturable(f"{where}: MjData without its MjModel beside it")
        return {"__mjdata__": _mujoco_state(owner.model, value)}
    raise NotCapturable(f"{where} is a {type(value).__name__}")


def _decode(value: Any, current: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_decode(item, None) for item in value)
    if isinstance(value, list):
        return [_decode(item, None) for item in value]
    if not isinstance(value, dict):
        return value
    if "__ndarray__" in value:
        return value["__ndarray__"].numpy().astype(np.dtype(value["dtype"]), copy=True)
    if "__scalar__" in value:
        return np.dtype(value["dtype"]).type(value["__scalar__"])
    if "__generator__" in value:
        generator = current if isinstance(current, np.random.Generator) else np.random.default_rng()
        generator.bit_generator.state = value["__generator__"]
        return generator
    if "__rms__" in value:
        rms = current if isinstance(current, RunningMeanStd) else RunningMeanStd()
        for name, item in value["__rms__"].items():
            setattr(rms, name, _decode(item, None))
        return rms
    return {key: _decode(item, None) for key, item in value.items()}


def _restore(obj: Any, saved: dict[str, Any]) -> None:
    if type(obj).__name__ != saved["type"]:
        raise ValueError(f"the snapshot has a {saved['type']} where this env has a {type(obj).__name__}")
    for name, value in saved["attributes"].items():
        current = getattr(obj, name, None)
        if isinstance(value, dict) and "__mjdata__" in value:
            _load_mujoco_state(obj.model, current, value["__mjdata__"])
        else:
            setattr(obj, name, _decode(value, current))


def _mujoco_state(model: Any, data: Any) -> dict[str, Any]:
    """The integration state and every array of MjData (tensors, by field name)."""
    integration = np.empty(mujoco.mj_stateSize(model, _MUJOCO_SIGNATURE))
    mujoco.mj_getState(model, data, integration, _MUJOCO_SIGNATURE)
    arrays = {}
    for name in dir(data):
        if name.startswith("_"):
            continue
        value = getattr(data, name, None)
        if isinstance(value, np.ndarray) and value.dtype != object:
            arrays[name] = torch.from_numpy(value.copy())
    return {"integration": torch.from_numpy(integration), "arrays": arrays}


def _load_mujoco_state(model: Any, data: Any, saved: dict[str, Any]) -> None:
    mujoco.mj_setState(model, data, saved["integration"].numpy().copy(), _MUJOCO_SIGNATURE)
    # derived quantities (body positions, contact forces): fixed-size arrays are copied back;
    # arrays sized by the current constraints (efc_*) are recomputed by the next step anyway
    for name, tensor in saved["arrays"].items():
        target = getattr(data, name, None)
        if isinstance(target, np.ndarray) and target.shape == tuple(tensor.shape):
            target[...] = tensor.numpy()
