"""The scores a run can be judged by, one per measurement protocol of the sources.

- ``final``: the final evaluation: the deterministic policy's mean return over its evaluation
  episodes after the last step (what RL Zoo's trained agents and our record report);
- ``late``: the mean of the evaluations over the last 10% of the budget (steps above 0.9 x the
  budget, the final one included): the same policy measured less noisily, read off the curve
  (Tianshou's per-seed curves give the same window for its seeds);
- ``train100``: the mean return of the last 100 training episodes (CleanRL and openrlbenchmark:
  ``charts/episodic_return``, per run). Runs log it at their end (``final/train_return_last100``);
  for older runs it is read from the curve's per-interval training returns, whole intervals back
  from the end until they hold at least 100 episodes (marked approximate, with the count).

A verdict uses the score that matches its source's protocol (``for_protocol``) and says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FINAL, LATE, TRAIN100 = "final", "late", "train100"
KINDS = (FINAL, LATE, TRAIN100)
LATE_FRACTION = 0.1
TRAIN_EPISODES = 100
NAMES = {
    FINAL: "final evaluation",
    LATE: "mean of the evaluations in the last 10% of the budget",
    TRAIN100: "mean of the last 100 training episodes",
}


@dataclass(frozen=True)
class TrainWindow:
    """A run's late training returns: their mean and how many episodes it covers."""

    mean: float
    episodes: int
    exact: bool
    """The last ``TRAIN_EPISODES`` episodes (or all a run had); False: whole evaluation intervals."""


def late(curve: Sequence[tuple[int, float]], budget: int) -> float | None:
    """The mean of the evaluations at steps above (1 - LATE_FRACTION) x ``budget`` (None: no curve there)."""
    window = [value for step, value in curve if step > (1 - LATE_FRACTION) * budget and step <= budget]
    return sum(window) / len(window) if window else None


def window_from_intervals(intervals: Sequence[tuple[int, float | None, int]]) -> TrainWindow | None:
    """The approximate ``train100`` of a run that did not log it: from (step, mean training return,
    episodes) per evaluation interval, whole intervals back from the last until they hold at
    least ``TRAIN_EPISODES`` episodes, weighted by their episodes."""
    total, episodes = 0.0, 0
    for _, mean, count in sorted(intervals, reverse=True):
        if mean is None or count <= 0:
            continue
        total += mean * count
        episodes += count
        if episodes >= TRAIN_EPISODES:
            break
    # whole intervals are contiguous: when they hold exactly the last TRAIN_EPISODES episodes, the window is exact
    return TrainWindow(total / episodes, episodes, exact=episodes == TRAIN_EPISODES) if episodes else None


def window_of(returns: Sequence[float]) -> TrainWindow | None:
    """The exact ``train100`` from a run's training-episode returns in order (the last 100)."""
    last = list(returns)[-TRAIN_EPISODES:]
    return TrainWindow(sum(last) / len(last), len(last), exact=True) if last else None


def for_protocol(protocol: str, reference_has_curves: bool) -> str:
    """The score that matches a source's protocol: its training returns for ``training_return``;
    the late window where the source's per-seed curves give it too; else the final evaluation."""
    if protocol == "training_return":
        return TRAIN100
    return LATE if reference_has_curves else FINAL


SUCCESS_THRESHOLDS = {"CartPole": 475.0, "InvertedPendulum": 950.0}
"""Tasks whose return is capped by the episode length (one reward per step): a seed succeeds
when its final return reaches gymnasium's ``reward_threshold`` for the task (CartPole-v1 475,
InvertedPendulum-v5 950), and two sides are compared as success rates."""


def success_threshold(env_id: str) -> float | None:
    """The success threshold of a capped task (None: the task's return is not capped)."""
    family = env_id.split("/")[-1].split(" (")[0].rsplit("-v", 1)[0]
    return SUCCESS_THRESHOLDS.get(family)
