"""A trained agent outside the suite: ``load_policy`` reads a run's final checkpoint from a result
bundle exported ``--with-weights`` (or a ``final.pt`` file) and returns a ``Policy`` that acts
in a plain gymnasium env, as rl-zoo3's ``enjoy`` or SB3's ``PPO.load(...).predict`` do::

    import reprorl

    policy = reprorl.load_policy("results/published/classic", "3f2a...")  # bundle, run key
    env = policy.make_env()  # the run's env: its id, kwargs and wrappers
    observation, _ = env.reset(seed=0)
    policy.reset()
    done = False
    while not done:
        observation, reward, terminated, truncated, _ = env.step(policy.act(observation))
        done = terminated or truncated

The policy acts deterministically (the evaluations' mode) on the observation normalization the
run ended with, frozen. The checkpoint is read with ``weights_only`` (no code runs) after its
bytes are checked against the bundle's digest.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from agents.envs import is_goal_space
from agents.errors import ConfigError
from agents.policy_file import TrainedPolicy
from benchmark import bundles
from benchmark.config import RunSpec
from benchmark.training import checkpoint, playback
from benchmark.training.results import Evaluation


class Policy:
    """A finished run's policy, acting on one observation at a time."""

    def __init__(self, trained: playback.Trained):
        self.trained = trained
        self.spec: RunSpec = trained.spec
        self._state: Any = None
        space = trained.spec.env.make().observation_space
        self._goal_space = space if is_goal_space(space) else None
        stats = trained.normalization.get("obs_rms") if trained.config.normalize_observations else None
        self._mean = None if stats is None else np.asarray(stats["mean"], dtype=np.float64)
        self._std = None if stats is None else np.sqrt(np.asarray(stats["var"], dtype=np.float64) + 1e-8)  # NormalizeObservation's epsilon

    def make_env(self, **kwargs: Any) -> gym.Env:
        """The run's environment as it trained (id, kwargs, wrappers); ``kwargs`` are added to
        its kwargs (``render_mode="human"`` to watch it)."""
        setup = self.spec.env
        return type(setup)(setup.env_id, {**setup.kwargs, **kwargs}, setup.wrappers).make()

    def reset(self) -> None:
        """Forget the recurrent state: call it at each episode's start (a no-op for feed-forward policies)."""
        self._state = None

    def act(self, observation: Any) -> Any:
        """The deterministic action for one observation of ``make_env()``'s env (a goal env's
        dict is flattened as in training, then normalized with the run's frozen statistics)."""
        if self._goal_space is not None:
            observation = gym.spaces.flatten(self._goal_space, observation)
        observation = np.asarray(observation)
        if self._mean is not None:
            clip = self.trained.config.clip_observations
            observation = np.clip((observation - self._mean) / self._std, -clip, clip).astype(np.float32)
        with torch.no_grad():
            acted = self.trained.algo.act(torch.as_tensor(observation[None], dtype=torch.float32, device=self.trained.device), self._state, deterministic=True)
        self._state = acted.state
        return acted.env_actions[0]

    __call__ = act

    def evaluate(self, episodes: int | None = None, seed: int | None = None) -> Evaluation:
        """``episodes`` episodes (default: the run's evaluation episodes) seeded as the run's own
        evaluations (``seed`` overrides): by default the returns of its final evaluation."""
        return playback.evaluate_trained(self.trained, episodes or self.spec.budget.eval_episodes, seed)


def load_policy(source: str | Path, run_key: str | None = None, device: str = "cpu") -> Policy:
    """The trained policy of run ``run_key`` in the bundle directory ``source`` (which may be left
    out when the bundle carries one run's weights), or in the ``final.pt`` file ``source``;
    ConfigError (one line) when there is none, or it cannot act alone (a meta-learner)."""
    path = Path(source)
    if path.is_file():
        payload = _payload(path.read_bytes(), str(path))
        if run_key is not None and (payload.get("spec") or {}).get("run_key") != run_key:
            raise ConfigError(f"{path} is the final checkpoint of run key {(payload.get('spec') or {}).get('run_key')}, not {run_key}")
    else:
        bundle = bundles.read(path)
        if not bundle.weights:
            raise ConfigError(f"bundle {path} carries no weights: export it with --with-weights")
        if run_key is None:
            if len(bundle.weights) > 1:
                shown = ", ".join(sorted(bundle.weights)[:4]) + (", ..." if len(bundle.weights) > 4 else "")
                raise ConfigError(f"bundle {path} carries the weights of {len(bundle.weights)} runs: name one run key ({shown})")
            run_key = next(iter(bundle.weights))
        if run_key not in bundle.weights:
            known = "holds no run" if run_key not in bundle.runs else "holds the run but not its weights"
            raise ConfigError(f"bundle {path} {known} with run key {run_key}")
        payload = _payload(bundles.weights_bytes(bundle.weights[run_key], run_key), str(bundle.weights[run_key].path))
        if (payload.get("spec") or {}).get("run_key") != run_key:
            raise ConfigError(f"{bundle.weights[run_key].path} is not the final checkpoint of run key {run_key}")
    return Policy(playback.load_trained(payload, device))


def _payload(data: bytes, where: str) -> dict[str, Any]:
    try:
        payload = checkpoint.load(io.BytesIO(data))
    except Exception as error:  # noqa: BLE001 - a damaged or foreign file, in one line
        raise ConfigError(f"cannot read {where} as a checkpoint: {type(error).__name__}: {error}") from None
    try:
        TrainedPolicy.read(payload)
    except ValueError as error:
        raise ConfigError(f"{where} is not a run's final checkpoint: {error}") from None
    return payload
