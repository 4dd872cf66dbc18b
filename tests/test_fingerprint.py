"""The behaviour fingerprint of an algorithm's code: the same twice and under either float
kernel, changed by a change of behaviour, harmless to the process that computes it (global RNGs,
a run trained after it), the same at a commit as in process, and filled into bundles with
nothing else changed."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT
from conftest import run_cli_in_process as run_cli
from test_bundles import fake_run
from test_determinism import SPECS, make_spec, numbers

import agents.algos.sac
from agents.configs.ddpg import TD3Config
from agents.hyperparameters import hp
from agents.nets import gemm
from agents.registry import REGISTRY
from benchmark import bundles
from benchmark.cli import fingerprint as fingerprint_command
from benchmark.training import fingerprint

ALGO = "td3"
"""The quickest of the algorithms with layers wide enough for oneDNN (0.15 s)."""


@pytest.fixture(scope="module")
def td3() -> str:
    return fingerprint.fingerprint(ALGO)


def head_sha() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def test_the_same_code_gives_the_same_fingerprint_twice(td3):
    assert td3.startswith(f"{fingerprint.VERSION} ") and len(td3.split()) > 5
    assert fingerprint.fingerprint(ALGO) == td3
    assert fingerprint.same_behaviour(td3, td3)


def test_the_other_float_kernel_keeps_the_fingerprint(monkeypatch, td3):
    """oneDNN and MKL differ in the last bits of SAC's and TD3's products: the fingerprints match."""
    if not gemm._onednn_available():
        pytest.skip("this torch has no oneDNN linear")
    found = {}
    try:
        for kernel in ("onednn", "mkl"):
            monkeypatch.setenv("REPRORL_CPU_GEMM", kernel)
            gemm.kernel.cache_clear()
            assert gemm.kernel() == kernel
            found[kernel] = fingerprint.fingerprint("sac")
    finally:
        monkeypatch.undo()
        gemm.kernel.cache_clear()
    assert fingerprint.same_behaviour(found["onednn"], found["mkl"]), found


def test_a_changed_default_or_loss_changes_the_fingerprint(monkeypatch, td3):
    @dataclasses.dataclass
    class Discounted(TD3Config):
        gamma: float = hp(0.98, ge=0.0, le=1.0)

    monkeypatch.setitem(REGISTRY, ALGO, (Discounted, REGISTRY[ALGO][1]))
    assert not fingerprint.same_behaviour(fingerprint.fingerprint(ALGO), td3)
    monkeypatch.undo()

    sac = fingerprint.fingerprint("sac")

    def absolute_error(predictions, targets, weights):  # L1 instead of the squared TD error
        return ((predictions - targets.unsqueeze(1)).abs() * weights.unsqueeze(1)).mean(dim=-1).sum(dim=-1)

    monkeypatch.setattr(agents.algos.sac, "per_seed_weighted_mse", absolute_error)
    assert not fingerprint.same_behaviour(fingerprint.fingerprint("sac"), sac)


def test_tolerance_and_classes():
    base = "v1 1.00000e+00 -2.00000e-01 0.00000e+00"
    assert fingerprint.same_behaviour(base, "v1 1.00010e+00 -2.00001e-01 1.00000e-07")  # last-bit noise
    assert not fingerprint.same_behaviour(base, "v1 1.01000e+00 -2.00000e-01 0.00000e+00")  # 1%
    assert not fingerprint.same_behaviour(base, "v1 1.00000e+00 -2.00000e-01")  # another length
    assert not fingerprint.same_behaviour(base, "v2 1.00000e+00 -2.00000e-01 0.00000e+00")  # another version
    assert not fingerprint.same_behaviour("", "")  # unknown matches nothing
    other = "v1 2.00000e+00 -2.00000e-01 0.00000e+00"
    assert fingerprint.classes([base, other, "", base.replace("1.00000e+00", "1.00001e+00"), other]) == [[0, 3], [1, 4]]


def test_the_global_random_states_are_left_as_they_were():
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    threads = torch.get_num_threads()
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    fingerprint.fingerprint("ppo")
    assert random.getstate() == before[0]
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert torch.equal(torch.get_rng_state(), before[2])
    assert torch.get_num_threads() == threads


def test_a_run_trained_after_it_has_the_same_numbers():
    """As a worker does: the fingerprint first, then the run, bit for bit as without it."""
    spec = make_spec(*SPECS["td3-ou-noise"])
    alone = numbers(spec)
    fingerprint.fingerprint(ALGO)
    assert numbers(spec) == alone


def test_algorithms_the_run_cannot_drive_have_none():
    assert fingerprint.fingerprint("maml_vpg") == ""  # a meta-learner
    assert fingerprint.fingerprint("bc") == ""  # needs an expert
    assert fingerprint.recorded("no_such_algorithm") == ""  # what a run records never raises


def test_at_head_is_the_fingerprint_in_process(td3):
    """The worktree of HEAD, this checkout's fingerprint file run there as a script."""
    if subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "agents"]).returncode != 0:
        pytest.skip("agents/ has uncommitted changes: HEAD's code is not this process's")
    done = subprocess.run([sys.executable, "-m", "benchmark", "fingerprint", "--algo", ALGO, "--at", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert fingerprint.same_behaviour(done.stdout.strip(), td3), (done.stdout, td3)
    worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert "reprorl-fingerprint-" not in worktrees  # removed


@pytest.mark.parametrize(
    "args,message",
    [
        (["--algo", "no_such_algo"], "unknown algorithm 'no_such_algo'"),
        (["--algo", ALGO, "--at", "no-such-commit"], "unknown commit 'no-such-commit'"),
        (["--backfill", "nowhere", "--at", "HEAD"], "--at goes with --algo"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    done = run_cli("fingerprint", *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_backfill_fills_empty_fingerprints_and_changes_nothing_else(tmp_path, monkeypatch):
    sha = head_sha()
    runs = [fake_run(seed, algo=ALGO) for seed in (0, 1)] + [fake_run(2, algo="dqn"), fake_run(3, algo=ALGO)]
    runs = [dataclasses.replace(run, provenance={**run.provenance, "git_sha": sha}) for run in runs]
    runs[3] = dataclasses.replace(runs[3], fingerprint="v1 1.00000e+00", provenance={**runs[3].provenance, "git_sha": "0" * 40})
    bundles.write(bundles.Bundle("synthetic", {run.run_key: run for run in runs}, created="2026-11-28"), tmp_path / "bundle")
    before = bundles.read(tmp_path / "bundle")
    asked = []

    def measured(repository, commit, algos):  # (the real one: test_at_head_is_the_fingerprint_in_process)
        asked.append((commit, tuple(algos)))
        return {algo: {"fingerprint": f"v1 {len(algo)}.00000e+00"} for algo in algos}

    monkeypatch.setattr(fingerprint_command, "fingerprints_at", measured)
    done = run_cli("fingerprint", "--backfill", str(tmp_path / "bundle"))
    assert done.returncode == 0, done.stderr
    assert asked == [(sha, ("dqn", ALGO))]  # once per commit, each algorithm once
    after = bundles.read(tmp_path / "bundle")
    assert after.created == before.created and set(after.runs) == set(before.runs)
    for key, run in before.runs.items():
        filled = after.runs[key]
        expected = run.fingerprint or f"v1 {len(run.spec.algo)}.00000e+00"
        assert filled.fingerprint == expected
        assert dataclasses.replace(filled, fingerprint="") == dataclasses.replace(run, fingerprint="")
    assert ALGO in done.stdout and "dqn" in done.stdout
