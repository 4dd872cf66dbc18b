"""Experience storage: on-policy rollouts with GAE, uniform replay."""

from agents.buffers.replay import ReplayBuffer
from agents.buffers.rollout import RolloutStorage, compute_gae

#: name -> (class, one-line description), for `python -m benchmark list`
BUFFERS = {
    "rollout": (RolloutStorage, "on-policy T x N rollout storage with GAE(gamma, lambda) and truncation bootstrap"),
    "replay": (ReplayBuffer, "uniform experience replay, preallocated ring buffer"),
}

__all__ = ["BUFFERS", "ReplayBuffer", "RolloutStorage", "compute_gae"]
