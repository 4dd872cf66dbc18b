"""A trained policy as its file holds it (a run's ``final.pt``, a bundle's weights): defined once
here, written by ``benchmark``'s training, read by behavioral cloning's expert, ``evaluate``,
playback and ``reprorl.load_policy``.

    {"spec":          the run's spec as a mapping: algo, env_id, hyperparameters, and
                      env_kwargs, wrappers, run_key, seed, budget where the run had them
     "algorithm":     the learner's ``state_dict()``
     "normalization": the training envs' running statistics ({}, or absent, when it did not normalize):
                      obs_rms and return_rms, each {mean, var, count}}

Tensors and primitives only, so that ``torch.load(weights_only=True)`` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

SPEC, ALGORITHM, NORMALIZATION = "spec", "algorithm", "normalization"
SPEC_KEYS = ("algo", "env_id", "hyperparameters")
"""What every policy file's spec names (the rest is the run's, where it had it)."""


def policy_payload(spec: Mapping[str, Any], algorithm_state: Mapping[str, Any], normalization: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A policy file's contents: the run's ``spec`` mapping, the learner's state, the statistics."""
    return {SPEC: dict(spec), ALGORITHM: dict(algorithm_state), NORMALIZATION: {name: dict(stats) for name, stats in normalization.items()}}


@dataclass(frozen=True)
class TrainedPolicy:
    """A policy file's contents, checked (``read``)."""

    spec: dict[str, Any]
    algorithm: dict[str, Any]
    normalization: dict[str, dict[str, Any]]

    @classmethod
    def read(cls, payload: Any) -> TrainedPolicy:
        """The contents of a loaded policy file; ValueError naming what is missing otherwise."""
        if not isinstance(payload, Mapping) or not {SPEC, ALGORITHM} <= payload.keys():
            raise ValueError(f"not a trained policy's file (it needs {SPEC} and {ALGORITHM})")
        spec = payload[SPEC]
        missing = [key for key in SPEC_KEYS if not isinstance(spec, Mapping) or key not in spec]
        if missing:
            raise ValueError(f"its {SPEC} lacks {', '.join(missing)}")
        normalization = payload.get(NORMALIZATION) or {}  # none: a policy that acts on raw observations
        return cls(dict(spec), dict(payload[ALGORITHM]), {name: dict(stats) for name, stats in normalization.items()})

    @property
    def algo(self) -> str:
        return str(self.spec["algo"])

    @property
    def hyperparameters(self) -> dict[str, Any]:
        return dict(self.spec["hyperparameters"])

    def statistics(self) -> dict[str, dict[str, np.ndarray]]:
        """The running statistics as arrays, as ``agents.envs.load_normalization_state`` takes them."""
        return {name: {key: np.asarray(value) for key, value in stats.items()} for name, stats in self.normalization.items()}
