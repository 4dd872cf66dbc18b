"""A run alone with its critic ensemble as one stacked network (``REPRORL_CRITICS``): the choice,
and the same training as the separate critics through the whole loop."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import agents
from agents.envs import env_spec
from agents.errors import ConfigError
from agents.registry import REGISTRY
from benchmark.config import Budget, RunSpec
from benchmark.training import loop as training_loop
from tests.test_seeds import META_CASES, POINT, resolve

ENSEMBLES = sorted(name for name in REGISTRY if agents.algorithm_class(name).critic_ensemble)  # ours


def test_the_algorithms_with_a_critic_ensemble_are_the_ones_the_issue_names():
    assert ENSEMBLES == ["ddpg", "mpo", "pearl", "sac", "td3"]


@pytest.mark.parametrize(
    ("layout", "device", "algo", "stacked"),
    [
        ("stacked", "cpu", "sac", True),
        ("separate", "cpu", "sac", False),
        ("auto", "cpu", "td3", False),  # oneDNN multiplies a stack copy by copy: separate measured faster
        ("", "cpu", "mpo", False),
        ("stacked", "cpu", "dqn", False),  # no ensemble to stack
        ("stacked", "cpu", "ppo", False),
    ],
)
def test_the_layout_of_a_run_alone(monkeypatch, layout, device, algo, stacked):
    monkeypatch.setenv("REPRORL_CRITICS", layout)
    env = "CartPole-v1" if algo in ("dqn", "ppo") else "Pendulum-v1"
    learner = agents.make(algo, env_spec(env), agents.resolve_config(algo, {"hidden_sizes": [8]}), total_steps=100, device=device)
    assert learner.stacks_alone() is stacked


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: 'auto' stacks on CUDA only")
def test_auto_stacks_a_run_alone_on_a_gpu(monkeypatch):
    monkeypatch.delenv("REPRORL_CRITICS", raising=False)
    learner = agents.make("sac", env_spec("Pendulum-v1"), agents.resolve_config("sac", {"hidden_sizes": [8]}), total_steps=100, device="cuda")
    assert learner.stacks_alone()


def test_a_bad_layout_is_one_line_and_exit_2(monkeypatch, tmp_path):
    monkeypatch.setenv("REPRORL_CRITICS", "stacke")
    with pytest.raises(ConfigError, match="REPRORL_CRITICS must be one of auto, stacked, separate, not 'stacke'"):
        agents.make("sac", env_spec("Pendulum-v1"), agents.resolve_config("sac", {}), total_steps=10).stacks_alone()
    completed = subprocess.run([sys.executable, "-m", "benchmark", "list"], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == ["error: REPRORL_CRITICS must be one of auto, stacked, separate, not 'stacke' (did you mean 'stacked'?)"]


def _count_batches(monkeypatch, algo: str) -> list[int]:
    """How many members each seed batch of ``algo`` was built with, from now on."""
    cls = agents.algorithm_class(algo).seed_batch
    sizes: list[int] = []
    init = cls.__init__

    def counted(self, members):
        sizes.append(len(members))
        init(self, members)

    monkeypatch.setattr(cls, "__init__", counted)
    return sizes


@pytest.mark.parametrize("case", ["sac", "sac-discrete", "td3", "ddpg", "mpo"])
def test_a_run_alone_with_stacked_critics_trains_as_with_separate_ones(monkeypatch, case):
    """The whole loop twice, for one seed: the evaluations and the final parameters agree
    (stacked products round differently in the last bits, so not bit for bit)."""
    algo, env_id, overrides = resolve(case)
    config = agents.resolve_config(algo, overrides).to_dict()
    spec = RunSpec("t", algo, env_id, 1, config, Budget(160, 80, 2), device="cpu")
    results, weights = {}, {}
    for layout in ("separate", "stacked"):
        monkeypatch.setenv("REPRORL_CRITICS", layout)
        sizes = _count_batches(monkeypatch, algo)
        built = []
        monkeypatch.setattr(training_loop.SeedRun, "__init__", _keeping(training_loop.SeedRun.__init__, built))
        results[layout] = training_loop.run(spec)
        assert sizes == ([1] if layout == "stacked" else [])
        weights[layout] = [tensor.detach().clone() for module in built[0].algo.modules().values() for tensor in module.state_dict().values()]
    separate, stacked = results["separate"], results["stacked"]
    assert [e.step for e in separate.evaluations] == [e.step for e in stacked.evaluations] == [80, 160]
    for mine, theirs in zip(stacked.evaluations, separate.evaluations, strict=True):
        np.testing.assert_allclose(mine.returns, theirs.returns, rtol=1e-3, atol=1e-3)
    for mine, theirs in zip(weights["stacked"], weights["separate"], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-3, atol=1e-4)


def _keeping(init, built: list):
    def keep(self, *arguments, **options):
        init(self, *arguments, **options)
        built.append(self)

    return keep


def test_a_pearl_run_alone_with_its_twin_q_functions_stacked_meta_tests_as_with_separate_ones(monkeypatch):
    config = agents.resolve_config("pearl", META_CASES["pearl"]).to_dict()
    spec = RunSpec("t", "pearl", POINT, 0, config, Budget(3000, 1200, 2), device="cpu")
    results = {}
    for layout in ("separate", "stacked"):
        monkeypatch.setenv("REPRORL_CRITICS", layout)
        sizes = _count_batches(monkeypatch, "pearl")
        results[layout] = training_loop.run(spec)
        assert sizes == ([1] if layout == "stacked" else [])
    assert [e.step for e in results["stacked"].evaluations] == [e.step for e in results["separate"].evaluations]
    for mine, theirs in zip(results["stacked"].evaluations, results["separate"].evaluations, strict=True):
        np.testing.assert_allclose(mine.returns, theirs.returns, rtol=1e-4)
