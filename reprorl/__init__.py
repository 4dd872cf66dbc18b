"""reprorl from Python: a trained agent, loaded from a result bundle exported ``--with-weights``
(or from a run's ``final.pt``) to act in a gymnasium env. The command line is ``reprorl`` (or
``python -m benchmark``); the packages behind it are ``agents`` (the algorithms) and
``benchmark`` (suites, runner, tracking, reports)."""

from benchmark.training.policy import Policy, load_policy

__all__ = ["Policy", "load_policy"]
