"""parity: our algorithm against Stable-Baselines3 at one setting (statistics, record, the real CLI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

import agents
from agents.batches import RolloutBatch
from benchmark.analysis import parity_records
from benchmark.cli.app import EXIT_CONFIG_ERROR, EXIT_TERMINATED, main
from benchmark.perf import parity, sb3_names


def test_reproduced_needs_the_90_percent_interval_inside_the_normalized_margin():
    """TOST by hand: difference 30, Welch's 90% interval from scipy; the margin 0.2 of Hopper-v5's
    fixed normalizer (3,304.75 - 16.67 = 3,288.08): ±657.6."""
    ours, peer = [1010.0, 1050.0, 1030.0, 1040.0, 1020.0], [1000.0, 990.0, 1010.0, 995.0, 1005.0]
    found = parity_records.compare(ours, peer, env_id="Hopper-v5")
    interval = stats.ttest_ind(ours, peer, equal_var=False).confidence_interval(0.90)
    assert found["difference"] == pytest.approx(30.0) and found["margin"] == pytest.approx(0.2 * (3304.75 - 16.6688))
    assert found["difference_ci90"] == pytest.approx([interval.low, interval.high])
    assert found["welch_p"] == pytest.approx(stats.ttest_ind(ours, peer, equal_var=False).pvalue)
    assert found["verdict"] == "above" and found["verdict_text"] == "above, within the margin"  # equivalent at ±658, yet +30 is shown
    assert found["margin_text"] == "±0.2 normalized (±658)"
    close = parity_records.compare(ours, [1010.0, 1060.0, 1000.0, 1045.0, 1020.0], env_id="Hopper-v5")
    assert close["verdict"] == "reproduced"
    tight = parity_records.compare(ours, peer, margin=0.003, env_id="Hopper-v5")  # ±9.9: the interval [~13, ~47] is outside
    assert tight["verdict"] == "above" and tight["verdict_text"] == "above, beyond the margin"


def test_a_clear_shortfall_is_below_and_noise_is_inconclusive_with_the_seeds_a_side():
    within = parity_records.compare([500.0, 520.0, 510.0], [1000.0, 1020.0, 990.0], env_id="Hopper-v5")  # -493, inside ±658
    assert within["verdict_text"] == "below, within the margin"
    assert parity_records.compare([500.0, 520.0, 510.0], [2000.0, 2020.0, 1990.0], env_id="Hopper-v5")["verdict"] == "below"
    noisy = parity_records.compare([100.0, 3000.0, 1500.0], [2000.0, 200.0, 1200.0], env_id="Hopper-v5")
    assert noisy["verdict"] == "inconclusive" and noisy["welch_p"] > 0.05
    assert noisy["verdict_text"] == f"inconclusive (needs {noisy['seeds_needed']})" and noisy["seeds_needed"] > 3
    assert parity_records.compare([3000.0], [2900.0], env_id="Hopper-v5")["verdict"] == "too few seeds"


def test_constant_returns_on_both_sides_are_compared_exactly():
    same = parity_records.compare([1500.0] * 5, [1500.0] * 5, env_id="Hopper-v5")
    assert same["verdict"] == "reproduced" and same["welch_p"] == 1.0 and same["difference_ci90"] == [0.0, 0.0]
    assert parity_records.compare([300.0] * 3, [1500.0] * 3, env_id="Hopper-v5")["verdict"] == "below"


def test_a_capped_task_is_compared_as_success_rates():
    """CartPole-v1: a seed succeeds when its final return reaches 475 (gymnasium's reward_threshold)."""
    found = parity_records.compare([500.0, 500.0, 120.0, 500.0, 90.0], [500.0, 480.0, 500.0, 500.0, 60.0], env_id="CartPole-v1")
    assert found["rates"] and found["margin_text"] == "±0.2 of the success rate"
    assert found["welch_p"] == pytest.approx(stats.fisher_exact([[3, 2], [4, 1]]).pvalue)
    assert found["verdict"] == "inconclusive"


def test_means_carry_student_t_intervals():
    found = parity_records.side_summary([1.0, 2.0, 3.0, 4.0])
    half = stats.t.ppf(0.975, 3) * np.std([1, 2, 3, 4], ddof=1) / 2
    assert found["mean"] == 2.5 and found["ci95"] == pytest.approx([2.5 - half, 2.5 + half])


def test_every_setting_is_a_valid_configuration_of_ours_and_names_the_same_sizes():
    """Each of our settings resolves; the network sizes, learning rates and value-loss weights match the peer's."""
    for name, setting in parity.SETTINGS.items():
        config = agents.resolve_config(name, setting.ours)
        arch = setting.peer["policy_kwargs"]["net_arch"]
        sizes = arch["pi"] if isinstance(arch, dict) else arch
        assert list(config.hidden_sizes) == sizes, name
        rate = setting.peer["learning_rate"]
        assert all(getattr(config, key) == rate for key in ("learning_rate", "actor_lr", "critic_lr") if hasattr(config, key)), name
        assert config.gamma == setting.peer["gamma"], name
        assert config.normalize_observations == setting.peer.get("normalize", False), name
        if "vf_coef" in setting.peer:  # the same weight on the value loss, written in each library's scale
            assert config.value_coef == sb3_names.VALUE_COEF_PER_SB3_VF_COEF * setting.peer["vf_coef"], name


def test_trpo_takes_sb3_contribs_step_on_the_same_data_and_weights():
    """One TRPO update of sb3-contrib on Hopper-v5 (3 action dimensions; a 2048-step rollout, no
    normalization) and ours from the same weights on the same batch, with the parity setting for
    Hopper (max KL and damping times 3: sb3-contrib averages the KL over action dimensions):
    the same policy step. At the paper's values (0.01, 0.1) ours is a different step."""
    import copy

    import torch

    sb3_contrib = pytest.importorskip("sb3_contrib")
    from stable_baselines3.common.env_util import make_vec_env

    from agents.algos.onpolicy import OneSeed
    from agents.algos.seeds import seed_axis
    from agents.envs import env_spec

    setting = parity.SETTINGS["trpo"]
    peer = {key: value for key, value in setting.peer.items() if key not in ("n_envs", "normalize", "policy_kwargs")}
    policy_kwargs = {**setting.peer["policy_kwargs"], "activation_fn": torch.nn.Tanh}
    model = sb3_contrib.TRPO("MlpPolicy", make_vec_env("Hopper-v5", n_envs=1, seed=0), seed=0, device="cpu", policy_kwargs=policy_kwargs, **peer)
    seen = {}
    train = model.train

    def train_once():
        buffer = model.rollout_buffer
        seen["before"] = copy.deepcopy(model.policy.state_dict())
        seen["batch"] = {
            key: torch.as_tensor(getattr(buffer, field), dtype=torch.float32).flatten(0, 1)
            for key, field in (("obs", "observations"), ("actions", "actions"), ("log_probs", "log_probs"), ("advantages", "advantages"))
        }
        train()
        seen["after"] = model.policy.state_dict()

    model.train = train_once
    model.learn(total_timesteps=2048)
    prefixes = {"actor.0": "mlp_extractor.policy_net.0", "actor.2": "mlp_extractor.policy_net.2", "actor.4": "action_net"}

    def peer_name(name: str) -> str:
        prefix, _, leaf = name.rpartition(".")
        return name if name == "log_std" else f"{prefixes[prefix]}.{leaf}"

    policy = [
        name
        for name in dict(agents.make("trpo", env_spec("Hopper-v5"), setting.ours, total_steps=1).actor_critic.named_parameters())
        if not name.startswith("critic")
    ]

    def our_step(settings: dict) -> torch.Tensor:
        ours = agents.make("trpo", env_spec("Hopper-v5"), {**settings, "normalize_observations": False, "normalize_rewards": False}, total_steps=2048)
        named = dict(ours.actor_critic.named_parameters())
        with torch.no_grad():
            for name in policy:
                named[name].copy_(seen["before"][peer_name(name)])
            dist_params = ours.actor_critic.policy_params(seen["batch"]["obs"])
        unread = torch.zeros(len(dist_params))  # the value fields: the policy's step does not read them
        batch = RolloutBatch(**seen["batch"], dist_params=dist_params, values=unread, returns=unread, complete=unread.bool())
        seeds, seeded = OneSeed(ours), seed_axis(batch)
        full_step, surrogate, _ = ours.search_direction(seeds, seeded)
        step, _ = ours.line_search(seeds, seeded, full_step, surrogate)
        return step[0]

    theirs = torch.cat([(seen["after"][peer_name(name)] - seen["before"][peer_name(name)]).flatten() for name in policy])
    matched, paper = our_step(setting.ours_for("Hopper-v5")), our_step(setting.ours)
    assert torch.allclose(matched, theirs, rtol=1e-3, atol=1e-5), float((matched - theirs).abs().max())
    assert float(torch.nn.functional.cosine_similarity(paper, theirs, dim=0)) < 0.99


def _stub_sides(monkeypatch, returns):
    calls = []

    def fake(job, timeout=0):
        calls.append((job["side"], job["seed"]))
        value = returns[(job["side"], job["seed"])]
        return {"returns": [value, value], "lengths": [10, 10], "seconds": 1.0, "version": f"{job['side']} 1.0"}

    monkeypatch.setattr(parity, "run_side", fake)
    return calls


def test_a_rerun_trains_only_the_missing_seeds_and_force_trains_again(monkeypatch, tmp_path):
    returns = {("ours", 0): 10.0, ("peer", 0): 11.0, ("ours", 1): 12.0, ("peer", 1): 13.0}
    calls = _stub_sides(monkeypatch, returns)
    path, record = parity.run("dqn", steps=100, seeds=[0], directory=tmp_path)
    assert path == tmp_path / "dqn-CartPole-v1-100.json" and sorted(calls) == [("ours", 0), ("peer", 0)]
    calls.clear()
    _, record = parity.run("dqn", steps=100, seeds=[0, 1], directory=tmp_path)
    assert sorted(calls) == [("ours", 1), ("peer", 1)] and len(record["runs"]) == 4
    returns[("ours", 0)] = 20.0
    calls.clear()
    _, record = parity.run("dqn", steps=100, seeds=[0], directory=tmp_path, force=True)
    assert sorted(calls) == [("ours", 0), ("peer", 0)] and len(record["runs"]) == 4
    summary = parity_records.summarize(record)
    assert summary["seeds"] == [0, 1] and summary["ours"]["mean"] == 16.0 and summary["peer_version"] == "peer 1.0"


def test_a_failed_side_keeps_what_finished(monkeypatch, tmp_path):
    returns = {("ours", 0): 10.0, ("peer", 0): 11.0}

    def fake(job, timeout=0):
        if job["side"] == "peer":
            raise RuntimeError("parity peer dqn CartPole-v1 seed 0 failed (exit 1)")
        return {"returns": [returns[("ours", 0)]], "lengths": [9], "seconds": 1.0, "version": "ours"}

    monkeypatch.setattr(parity, "run_side", fake)
    with pytest.raises(RuntimeError, match="peer dqn"):
        parity.run("dqn", steps=100, seeds=[0], directory=tmp_path)
    record = json.loads((tmp_path / "dqn-CartPole-v1-100.json").read_text())
    assert [(r["side"], r["seed"]) for r in record["runs"]] == [("ours", 0)]


def test_a_corrupt_record_or_another_setting_is_refused_and_left_alone(monkeypatch, tmp_path, capsys):
    _stub_sides(monkeypatch, {("ours", 0): 1.0, ("peer", 0): 1.0})
    path = tmp_path / "dqn-CartPole-v1-100.json"
    path.write_text("{not json")
    assert main(["parity", "--algo", "dqn", "--steps", "100", "--seeds", "0", "--output-dir", str(tmp_path)]) == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert "is not a parity record" in err and len(err.strip().splitlines()) == 1 and path.read_text() == "{not json"
    parity.run("dqn", steps=100, seeds=[0], directory=tmp_path / "other")
    held = tmp_path / "other" / "dqn-CartPole-v1-100.json"
    record = json.loads(held.read_text())
    record["setting"]["ours"]["learning_rate"] = 1.0
    held.write_text(json.dumps(record))
    before = held.read_text()
    assert main(["parity", "--algo", "dqn", "--steps", "100", "--seeds", "0", "--output-dir", str(tmp_path / "other")]) == EXIT_CONFIG_ERROR
    assert "holds another setting" in capsys.readouterr().err and held.read_text() == before


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--algo", "mpo"], "parity has no setting for 'mpo'"),
        (["--algo", "dqn", "--seeds", "1", "1"], "--seeds must be distinct"),
        (["--algo", "dqn", "--env", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
        (["--algo", "dqn", "--steps", "0"], "--steps must be >= 1"),
        (["--algo", "dqn", "--device", "tpu"], "--device must be one of cpu, cuda"),
        pytest.param(
            ["--algo", "dqn", "--device", "cuda"],
            "--device cuda: torch sees no CUDA device here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present"),
        ),
        ([], "parity needs --algo"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(arguments, message, tmp_path, capsys):
    assert main(["parity", *arguments, "--output-dir", str(tmp_path)]) == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("margin", ["-0.5", "0", "nan", "a lot"])
def test_a_margin_that_is_not_a_positive_number_exits_2_with_one_line(margin, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["parity", "--algo", "dqn", "--margin", margin, "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert stopped.value.code == EXIT_CONFIG_ERROR and "--margin: expected a positive number of normalized units" in err
    assert len(err.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def test_parity_end_to_end_on_cartpole(tmp_path, capsys):
    """The real command: our DQN and SB3's, 1,500 steps on CartPole-v1, two seeds each, scored by
    one protocol; the record, the tables and a rerun that trains nothing."""
    arguments = ["parity", "--algo", "dqn", "--steps", "1500", "--seeds", "0", "1", "--episodes", "3", "--workers", "2", "--output-dir", str(tmp_path)]
    assert main(arguments) == 0
    out = capsys.readouterr().out
    assert "seed 0 ours" in out and "seed 1 peer" in out and "stable-baselines3" in out
    record = json.loads((tmp_path / "dqn-CartPole-v1-1500.json").read_text())
    assert sorted((r["side"], r["seed"]) for r in record["runs"]) == [("ours", 0), ("ours", 1), ("peer", 0), ("peer", 1)]
    for run in record["runs"]:
        assert len(run["returns"]) == 3 and all(1 <= length <= 500 for length in run["lengths"])
        assert run["final_return"] == pytest.approx(np.mean(run["returns"])) and run["device"] == "cpu"
    assert record["setting"]["peer"]["train_freq"] == 256 and record["setting"]["episodes"] == 3
    table = (tmp_path / "parity.md").read_text().splitlines()
    assert len(table) == 3 and "| dqn | CartPole-v1 | 1,500 | 2 |" in table[2]
    rows = (tmp_path / "parity.csv").read_text().splitlines()
    assert rows[0].startswith("algo,env_id,steps") and len(rows) == 2
    assert main(arguments) == 0
    assert "seed 0 ours" not in capsys.readouterr().out  # nothing left to train
    assert main(["parity", "--table", "--output-dir", str(tmp_path), "--format", "csv"]) == 0
    assert 'dqn,CartPole-v1,"1,500",2,' in capsys.readouterr().out


def _children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in (task / "children").read_text().split()]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_sigterm_stops_the_training_processes_and_keeps_the_record(tmp_path):
    """A scheduler's SIGTERM while both sides train: exit 143 with one line saying what is kept,
    the training processes killed (not left running for hours), no record written."""
    argv = ["benchmark", "parity", "--algo", "dqn", "--steps", "10000000", "--seeds", "0", "--workers", "2", "--output-dir", str(tmp_path)]
    launcher = f"import runpy, sys; sys.argv = {argv!r}; runpy.run_module('benchmark', run_name='__main__')"
    process = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline, sides = time.monotonic() + 120, []
        while len(sides) < 2 and time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read()
            sides = _children(process.pid)
            time.sleep(0.2)
        assert len(sides) == 2
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == EXIT_TERMINATED
        err = process.stderr.read()
        assert err.strip() == "interrupted: the record keeps every finished side; a rerun trains the others"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    deadline = time.monotonic() + 20
    while any(map(_running, sides)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(_running, sides))
    assert not any(tmp_path.glob("*.json"))
