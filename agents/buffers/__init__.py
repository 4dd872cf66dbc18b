"""Experience storage: on-policy rollouts with GAE; replay with n-step returns, prioritized and
emphasizing-recent sampling, hindsight relabeling and recurrent sequences."""

from agents.buffers.hindsight import HindsightRelabeler
from agents.buffers.prioritized import PrioritizedSampler, UniformSampler, Window
from agents.buffers.recent import RecentExperience
from agents.buffers.replay import ReplayBuffer
from agents.buffers.rollout import RolloutStorage, compute_gae
from agents.buffers.sequence import SequenceReplayBuffer
from agents.buffers.sumtree import SumTree
from agents.buffers.task import TaskBuffer

#: name -> (class, how to select it in an off-policy config), for `python -m benchmark list`
BUFFERS = {
    "rollout": (RolloutStorage, "on-policy T x N rollout storage with GAE(gamma, lambda) and truncation bootstrap"),
    "replay": (ReplayBuffer, "uniform replay on preallocated (time, env) tensors (default of every off-policy algorithm)"),
    "nstep": (ReplayBuffer, "n-step returns cut at termination, bootstrapped at truncation: n_step=N"),
    "per": (PrioritizedSampler, "prioritized replay, sum-tree (Schaul 2016): prioritized=true, per_alpha, per_beta, per_eps"),
    "ere": (RecentExperience, "emphasizing recent experience (Wang & Ross 2019): emphasize_recent=true, ere_eta, ere_c_min"),
    "her": (HindsightRelabeler, "hindsight relabeling for goal envs (Andrychowicz 2017): her_strategy=future|final|episode, her_k"),
    "sequence": (SequenceReplayBuffer, "recurrent sequences with overlap and R2D2 burn-in: recurrent=gru|lstm"),
    "task": (TaskBuffer, "one task's transitions, growing to capacity then overwriting the oldest (pearl: one per training task)"),
}

__all__ = [
    "BUFFERS",
    "HindsightRelabeler",
    "PrioritizedSampler",
    "RecentExperience",
    "ReplayBuffer",
    "RolloutStorage",
    "SequenceReplayBuffer",
    "TaskBuffer",
    "SumTree",
    "UniformSampler",
    "Window",
    "compute_gae",
]
