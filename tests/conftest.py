import os
import textwrap
from pathlib import Path

import pytest
import torch

# One intra-op thread per test process, as every run of the suite uses (RunSpec.torch_threads):
# tests that drive an algorithm directly would otherwise take a thread per core each, and two
# xdist workers on two cores then oversubscribe them several times over.
torch.set_num_threads(1)



@pytest.fixture(autouse=True)
def _no_inherited_terminal_size():
    """A CLI the tests start writes as it does to any pipe: readline, once something imports it
    (pytest's debugger support does), exports COLUMNS=80 and LINES=24 into the process
    environment behind os.environ's back, and the CLI honours COLUMNS like a user's (its tables
    fit it). The tests of narrow terminals set COLUMNS themselves."""
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
        os.unsetenv(name)

TINY_SUITE = """
name: tiny
seeds: [0, 1]
budget: {total_steps: 512, eval_every: 256, eval_episodes: 2}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 2, num_steps: 64, num_minibatches: 2, num_epochs: 2, hidden_sizes: [16, 16]}
  - algo: sac
    envs: [Pendulum-v1]
    budget: {total_steps: 300, eval_every: 150}
    seeds: [0]
    hyperparameters: {learning_starts: 100, batch_size: 32, hidden_sizes: [16, 16], buffer_size: 1000}
"""


@pytest.fixture
def write_suite(tmp_path: Path):
    """Write YAML text to a suite file in tmp_path and return its path."""

    def write(text: str, name: str = "suite.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def tiny_suite(write_suite) -> Path:
    return write_suite(TINY_SUITE, "tiny.yaml")


def pytest_collection_modifyitems(config, items):
    """The minutes-long learning tests first: with pytest-xdist the last tests handed out then
    are the short ones, so both CI cores stay busy to the end instead of one waiting on a
    learning test that started last."""
    items.sort(key=lambda item: item.get_closest_marker("learning") is None)
