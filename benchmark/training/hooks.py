"""Explicit points where a caller instruments one run's loop (the perf harness times its parts
there). The loop hands each part to its hook once, when it is built, so the default hooks cost
nothing per step."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class LoopHooks:
    """The default: every part as it is. Subclass and override what you instrument."""

    def train_envs(self, envs: Any) -> Any:
        """The training vector env, once built (evaluation envs are not handed over)."""
        return envs

    def algorithm(self, algo: Any) -> Any:
        """The algorithm, once built (and restored, when the run resumes)."""
        return algo

    def logging(self, function: F) -> F:
        """Each of the loop's own bookkeeping functions (episode logging, non-finite checks)."""
        return function

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Around each evaluation (not training time)."""
        yield


NO_HOOKS = LoopHooks()
