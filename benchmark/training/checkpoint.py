"""Checkpoint files: written atomically, read without executing code.

A run keeps ``<checkpoint_dir>/<run_key>/latest.pt`` (``checkpoint_paths``) while it trains (replaced every
``checkpoint_every`` env steps and when the run is stopped by SIGTERM) and ``final.pt`` when it
finishes. Payloads hold tensors and primitives only, so ``torch.load(weights_only=True)``
reads them: a checkpoint file never runs code.
"""

from __future__ import annotations

import math
import os
import random
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, cast

import gymnasium as gym
import numpy as np
import torch

from agents import policy_file
from agents.envs import normalization_state
from benchmark.config import RunSpec, key_form, stored_hyperparameters
from benchmark.training.checkpoint_paths import FINAL, LATEST, run_directory  # noqa: F401 - the file names, re-exported
from benchmark.training.results import Evaluation, RunResult

FORMAT = 1


def remove_partial_writes(directory: Path) -> None:
    """Delete temporary files a killed ``write_atomic`` left behind (they can be GBs)."""
    for leftover in Path(directory).glob(".*.tmp"):
        leftover.unlink(missing_ok=True)


def write_atomic(payload: dict[str, Any], path: Path) -> Path:
    """torch.save to a temporary file in the same directory, fsync it, rename it over ``path``
    and fsync the directory: a crash at any moment leaves either the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, 0o644)  # mkstemp makes 0600 files; checkpoints are shared results
        with os.fdopen(handle, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def load(source: Path | BinaryIO) -> dict[str, Any]:
    """Read a checkpoint (a file, or its bytes in a file object) on CPU; only tensors and
    primitives are accepted (weights_only)."""
    return torch.load(source, map_location="cpu", weights_only=True)


def step_of(path: Path) -> int | None:
    """The env step a checkpoint was written at, without reading its tensors (memory-mapped);
    None when the file cannot be read as a checkpoint."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(payload["loop"]["step"])
    except Exception:  # noqa: BLE001 - a partial or foreign file: the run simply starts over
        return None


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's global and torch's (CPU and every initialized CUDA device) RNG states."""
    # the legacy tuple, numpy's default (its stubs give the no-argument call the dict form)
    kind, keys, position, has_gauss, cached_gaussian = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned."""
    random.setstate(state["python"])
    saved = state["numpy"]
    np.random.set_state((saved["kind"], saved["keys"].numpy().astype(np.uint32), saved["position"], saved["has_gauss"], saved["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        # one state per visible GPU; a run resumed with other GPUs visible gets what matches
        for index, generator_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(generator_state, index)


def policy_payload(algo: Any, train_envs: gym.vector.VectorEnv | None, spec: RunSpec) -> dict[str, Any]:
    """The trained policy as ``final.pt`` holds it (``agents.policy_file``: the spec, the
    algorithm's state, the normalization statistics)."""
    normalization = normalization_tensors(train_envs) if train_envs is not None else {}
    return policy_file.policy_payload(spec.to_dict(), algo.state_dict(), normalization)


def restore_learner(payload: dict[str, Any], algo: Any, counters: Any, result: RunResult, spec: RunSpec, kind: str | None = None) -> None:
    """What every resume restores: after checking the payload's format (and ``kind``) and that
    it belongs to ``spec``, the algorithm (with its replay buffer when saved), the loop's
    counters and the evaluations so far."""
    if payload.get("format") != FORMAT or payload.get("kind") != kind:
        raise ValueError(f"checkpoint format {payload.get('format')!r} ({payload.get('kind') or 'online'}) is not {FORMAT} ({kind or 'online'})")
    if payload["spec"].get("run_key") != spec.run_key:
        raise ValueError(f"the checkpoint belongs to run key {payload['spec'].get('run_key')}, not {spec.run_key}")
    algo.load_state_dict(payload["algorithm"])
    if payload.get("replay") is not None:
        algo.load_replay_state_dict(payload["replay"])
    for name, value in payload["loop"].items():
        setattr(counters, name, value)
    if "cpu_seconds" not in payload["loop"]:  # a checkpoint from before CPU time was counted
        counters.cpu_seconds = math.nan
    result.evaluations = [Evaluation(**evaluation) for evaluation in payload["evaluations"]]


def continue_learner(payload: dict[str, Any], algo: Any, counters: Any, spec: RunSpec) -> int:
    """What a run that continues a finished one takes from that run's ``final.pt``: the
    algorithm as it ended (without a replay buffer: an off-policy learner refills it before it
    updates again) and the env step it ended at, where the loop's counters start; returns that
    step. ValueError when ``payload`` is not the final checkpoint of the run ``spec`` continues."""
    origin = payload.get("spec") or {}
    if origin.get("run_key") != spec.continued_from:
        raise ValueError(f"the checkpoint belongs to run key {origin.get('run_key')}, not {spec.continued_from}")
    for name in ("algo", "env_id", "seed", "env_kwargs", "wrappers"):
        if origin.get(name, {} if name == "env_kwargs" else [] if name == "wrappers" else None) != getattr(spec, name):
            raise ValueError(f"its {name} is {origin.get(name)!r}, this run's {getattr(spec, name)!r}")
    if key_form(spec.algo, stored_hyperparameters(spec.algo, origin["hyperparameters"])) != key_form(spec.algo, spec.hyperparameters):
        raise ValueError("its hyperparameters differ from this run's (a continued run keeps them)")
    step = int(payload.get("step", origin["budget"]["total_steps"]))  # final checkpoints before continuation held no step
    if step >= spec.budget.total_steps:
        raise ValueError(f"it ended at env step {step:,}, and this run's budget is {spec.budget.total_steps:,}: nothing to train")
    algo.load_state_dict(payload["algorithm"])
    counters.step = counters.first_step = counters.next_progress = step
    counters.next_eval = step + spec.budget.eval_every
    counters.next_checkpoint = step + spec.checkpoint_interval
    return step


def normalization_tensors(train_envs: gym.vector.VectorEnv) -> dict[str, dict[str, Any]]:
    """The envs' running normalization statistics as tensors (what a payload may hold)."""
    return {name: {key: torch.as_tensor(value) for key, value in stats.items()} for name, stats in normalization_state(train_envs).items()}


def own_storage(state: Any) -> Any:
    """``state`` with every tensor copied into storage of its own: a batched member's
    parameters are views of the whole batch's, which saving would otherwise write out whole."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone() if state.untyped_storage().nbytes() > state.nbytes else state
    if isinstance(state, dict):
        return {key: own_storage(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(own_storage(value) for value in state)
    return state


def to_cpu(state: Any) -> Any:
    """A recurrent state (tensor or nested tuples of tensors) on CPU, for a payload."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, (tuple, list)):
        return type(state)(to_cpu(item) for item in state)
    return state


def to_device(state: Any, device: torch.device) -> Any:
    """A payload's recurrent state back on ``device``."""
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, (tuple, list)):
        return type(state)(to_device(item, device) for item in state)
    return state
