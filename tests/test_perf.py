"""The side-by-side throughput benchmark (`python -m benchmark perf`): its plumbing, not its speed.

Rates are measured by `make perf`, never asserted here; these tests check that the
measurements run, that both libraries get the same setting, and that the accounting adds up.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli_in_process

import agents
from benchmark.cli.app import EXIT_CONFIG_ERROR, main
from benchmark.perf import sb3_names
from benchmark.perf import throughput as perf
from benchmark.perf.worker import SectionTimers, run_floor, run_memory

ROOT = Path(__file__).resolve().parent.parent

# our hyperparameter -> SB3 argument that must hold the same value in every case that sets it
SAME_VALUE = {
    "batch_size": "batch_size",
    "learning_starts": "learning_starts",
    "gradient_steps": "gradient_steps",
    "tau": "tau",
    "gamma": "gamma",
    "buffer_size": "buffer_size",
    "num_epochs": "n_epochs",
    "num_steps": "n_steps",
    "gae_lambda": "gae_lambda",
    "clip_range": "clip_range",
    "max_grad_norm": "max_grad_norm",
    "policy_delay": "policy_delay",
    "target_policy_noise": "target_policy_noise",
    "target_noise_clip": "target_noise_clip",
    "exploration_fraction": "exploration_fraction",
    "epsilon_start": "exploration_initial_eps",
    "epsilon_final": "exploration_final_eps",
    "update_every": "train_freq",
    "noise_sigma": "action_noise_sigma",
}


@pytest.mark.parametrize("name", list(perf.CASES))
def test_both_libraries_get_the_same_setting(name):
    case = perf.CASES[name]
    config = agents.resolve_config(name, case.ours)  # every override is a valid hyperparameter
    checked = 0
    for ours, theirs in SAME_VALUE.items():
        if theirs in case.sb3 and hasattr(config, ours):
            assert getattr(config, ours) == case.sb3[theirs], f"{name}: {ours} {getattr(config, ours)} != SB3 {theirs} {case.sb3[theirs]}"
            checked += 1
    assert checked >= 5
    rates = [getattr(config, key) for key in ("learning_rate", "actor_lr", "critic_lr") if hasattr(config, key)]
    assert rates and all(rate == case.sb3["learning_rate"] for rate in rates)
    net_arch = case.sb3["policy_kwargs"]["net_arch"]
    sizes = net_arch["pi"] if isinstance(net_arch, dict) else net_arch
    assert tuple(sizes) == tuple(config.hidden_sizes)
    assert case.sb3["policy_kwargs"]["activation_fn"] == config.activation
    assert config.num_envs == 1 and not config.normalize_observations and not config.normalize_rewards
    if "vf_coef" in case.sb3:  # the same weight on the value loss, written in each library's scale
        assert config.value_coef == sb3_names.VALUE_COEF_PER_SB3_VF_COEF * case.sb3["vf_coef"]
    if name == "dqn":  # SB3 counts the target period in env steps, ours in gradient steps
        assert config.target_update_every * config.update_every == case.sb3["target_update_interval"]
        assert config.double_q is False  # SB3's DQN bootstraps from max_a Q'(s', a)


def test_section_timers_count_exclusive_time(monkeypatch):
    clock = [100.0]  # a fake perf_counter: the work below advances it, so the sums are exact on any machine
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def work(seconds: float) -> None:
        clock[0] += seconds

    timers = SectionTimers()
    inner = timers.wrap("buffer", lambda: work(0.02))

    def outer_work():
        work(0.01)
        inner()

    timers.wrap("update", outer_work)()
    assert timers.seconds["buffer"] == pytest.approx(0.02)
    assert timers.seconds["update"] == pytest.approx(0.01)  # the buffer's time is not counted twice
    assert timers.calls == {"update": 1, "buffer": 1}
    batches = list(timers.wrap_iterator("buffer", lambda: iter([1, 2, 3]))())
    assert batches == [1, 2, 3] and timers.calls["buffer"] == 5  # one per item, one for the end


def test_replay_buffer_memory_is_close_to_its_raw_fields():
    measured = run_memory({"env_id": "HalfCheetah-v5", "capacity": 50_000})
    assert measured["raw_bytes"] == 50_000 * (4 * (17 + 17 + 6 + 1) + 2)
    assert measured["tensor_bytes"] / measured["raw_bytes"] <= perf.REPLAY_TARGET


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_update_floor_runs(algo, stacked):
    job = {"algo": algo, "obs_dim": 5, "action_dim": 2, "hidden_sizes": [16, 16], "batch_size": 8, "steps": 3, "threads": 1, "seed": 0, "stacked": stacked}
    result = run_floor(job)
    assert result["steps_per_second"] > 0


def test_unknown_case_and_bad_counts_exit_2(capsys):
    assert main(["perf", "--cases", "ppo", "a2c", "--no-compare"]) == EXIT_CONFIG_ERROR
    assert "unknown perf case(s) a2c; choose from ppo, sac, td3, dqn (a2c: batched rows only, with --batched-only)" in capsys.readouterr().err
    assert main(["perf", "--pairs", "0", "--no-compare"]) == EXIT_CONFIG_ERROR
    assert "--pairs must be >= 1" in capsys.readouterr().err


def test_missing_sb3_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)  # import fails as if not installed
    assert main(["perf", "--cases", "dqn"]) == EXIT_CONFIG_ERROR
    error = capsys.readouterr().err
    assert "Stable-Baselines3 is not installed" in error and "compare" in error


def test_perf_cli_writes_the_table_and_json(tmp_path):
    """The command (in this process; each measurement in a process of its own as always), ours
    only, at a tiny scale: one pair of DQN, its bound and its profile."""
    output = tmp_path / "perf.json"
    completed = run_cli_in_process(
        "perf", "--cases", "dqn", "--pairs", "1", "--scale", "0.02", "--no-compare", "--no-memory", "--no-batched", "--profile", "--output", str(output)
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "env only" in completed.stdout and "where the time goes" in completed.stdout
    data = json.loads(output.read_text())
    summary = data["cases"]["dqn"]["summary"]
    assert summary["ours_steps_per_second"] > 0 and summary["bound_steps_per_second"] > 0
    assert data["cases"]["dqn"]["steps"] == 400 and len(data["cases"]["dqn"]["measurements"]["ours"]) == 1
    profile = data["profiles"]["dqn"]
    parts = profile["microseconds_per_step"]
    assert {"env", "acting", "buffer", "update", "logging", "other"} <= set(parts)
    # the parts add up to the whole loop's time per step
    assert sum(parts.values()) == pytest.approx(1e6 / profile["steps_per_second"], rel=0.05)
    assert profile["calls"]["env"] == 400 and "ncalls" in profile["top_functions"]


def test_missing_sbx_names_the_extra_and_no_jax_leaves_it_out(monkeypatch, capsys):
    from importlib import metadata

    real = metadata.version

    def version(name):
        if name == "sbx-rl":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    assert main(["perf", "--cases", "dqn"]) == EXIT_CONFIG_ERROR
    error = capsys.readouterr().err
    assert "Stable Baselines Jax (sbx-rl) is not installed" in error and "compare-jax" in error and "--no-jax" in error


@pytest.mark.parametrize("name", list(perf.CASES))
def test_sbx_takes_the_sb3_setting_but_what_it_lacks(name):
    """Every SB3 argument of a case reaches SBX's constructor, except those the case names as
    absent there (which SB3 does take): the peers train the same setting."""
    sbx = pytest.importorskip("sbx")
    import inspect

    case = perf.CASES[name]
    algorithm = {"ppo": sbx.PPO, "sac": sbx.SAC, "td3": sbx.TD3, "dqn": sbx.DQN}[name]
    accepted = set(inspect.signature(algorithm.__init__).parameters) | {"action_noise_sigma"}  # the noise object is built from it
    assert set(case.sbx_absent) <= set(case.sb3)
    assert {key for key in case.sb3 if key not in accepted} == set(case.sbx_absent)


def test_perf_cli_measures_both_peers_side_by_side(tmp_path):
    """DQN at a tiny scale, one round: ours, SB3 and SBX each measured once, each process kept on
    one core; the table shows both ratios with their targets, and the JSON holds them."""
    pytest.importorskip("sbx")
    output = tmp_path / "perf.json"
    completed = run_cli_in_process("perf", "--cases", "dqn", "--pairs", "1", "--scale", "0.02", "--no-memory", "--no-batched", "--output", str(output))
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "ours/SBX" in completed.stdout and "Stable Baselines Jax" in completed.stdout
    data = json.loads(output.read_text())
    measured = data["cases"]["dqn"]["measurements"]
    assert [len(measured[side]) for side in ("ours", "sb3", "sbx")] == [1, 1, 1]
    assert all(len(measured[side][0]["cores"]) == 1 for side in ("ours", "sb3", "sbx", "bound"))  # one core each, JAX's threads included
    summary = data["cases"]["dqn"]["summary"]
    assert summary["sbx_ratio"] == pytest.approx(summary["ours_steps_per_second"] / summary["sbx_steps_per_second"])
    assert summary["sbx_target_ratio"] == 1.2 and data["machine"]["sbx_rl"]


def test_seeds_are_dealt_over_processes_evenly():
    assert perf.split_seeds(list(range(10)), 2) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert perf.split_seeds(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert perf.split_seeds([7], 4) == [[7]]


def test_batched_rows_compare_one_process_with_separate_processes(tmp_path):
    """The real command at a tiny scale: DQN, N = 1 and 3 on 2 cores: separate runs (1, then 2
    processes at once), 3 seeds in one batched process and dealt over 2 batched processes."""
    output = tmp_path / "batched.json"
    completed = run_cli_in_process("perf", "--batched-only", "--cases", "dqn", "a2c", "--batched-seeds", "1", "3", "--scale", "0.03", "--output", str(output))
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "N seeds: aggregate env steps/s" in completed.stdout
    data = json.loads(output.read_text())
    cores = data["settings"]["cores"]
    one, three = data["cases"]["dqn"]["rows"]
    assert one["seeds"] == 1 and one["one_process"]["steps_per_second"] == one["separate"]["steps_per_second"] and one["one_process_ratio"] == 1.0
    assert three["one_process"]["seeds_per_process"] == [3] and three["separate"]["processes"] == min(3, cores)
    assert three["one_process_ratio"] == pytest.approx(three["one_process"]["steps_per_second"] / three["separate"]["steps_per_second"])
    if cores < 3:
        assert three["per_core"]["seeds_per_process"] == [len(group) for group in perf.split_seeds([0, 1, 2], cores)]
    assert all(row["steps"] == 300 for row in (one, three))
    # a case of the batched rows only, at its defaults, over whole rollouts (16 envs x 5 steps)
    assert data["cases"]["a2c"]["env_id"] == "HalfCheetah-v5" and [row["steps"] for row in data["cases"]["a2c"]["rows"]] == [240, 240]


def test_batched_arguments_are_checked(capsys):
    assert main(["perf", "--batched-only", "--no-batched"]) == EXIT_CONFIG_ERROR
    assert "contradict" in capsys.readouterr().err
    assert main(["perf", "--batched-only", "--batched-seeds", "0", "4"]) == EXIT_CONFIG_ERROR
    assert "--batched-seeds must be distinct positive counts" in capsys.readouterr().err


# make test-all only: the perf harness's rows of BC and PEARL (make perf), not training code; ~40 s of a CI core
@pytest.mark.extended
def test_batched_rows_of_bc_and_the_meta_learners_run_on_generated_data(tmp_path):
    """BC clones a dataset the harness writes for the measurement (and records as such); the
    meta-learners' rows train epochs over their task family."""
    output = tmp_path / "batched.json"
    completed = run_cli_in_process("perf", "--batched-only", "--cases", "bc", "pearl", "--batched-seeds", "2", "--scale", "0.01", "--output", str(output))
    assert completed.returncode == 0, completed.stderr[-2000:]
    data = json.loads(output.read_text())
    assert data["cases"]["bc"]["hyperparameters"]["expert"].startswith("random pairs of HalfCheetah-v5's shapes")
    for case in ("bc", "pearl"):
        rows = data["cases"][case]["rows"]
        assert [row["seeds"] for row in rows] == [2] and rows[0]["one_process"]["seeds_per_process"] == [2]


def test_the_cuda_graph_rows_need_a_gpu_device(capsys):
    assert main(["perf", "--graphs-only"]) == EXIT_CONFIG_ERROR
    assert capsys.readouterr().err.strip().splitlines() == ["error: --graphs-only needs --device cuda (CUDA graphs run on a GPU), got cpu"]


def test_the_cuda_graph_rows_alternate_eager_and_captured_runs_and_mark_the_target(monkeypatch):
    """The measurement's bookkeeping, with the run jobs answered here (the real ones need a GPU)."""
    jobs: list[dict] = []

    def answer(job, timeout=0.0):
        jobs.append(job)
        return {"steps_per_second": 300.0 if job["cuda_graphs"] else 100.0, "peak_rss_mb": 1.0}

    from benchmark.perf import graphs

    monkeypatch.setattr(graphs, "run_job", answer)
    data = graphs.measure_graphs(("sac", "td3"), pairs=2, scale=0.5, device="cuda")
    assert [(job["algo"], job["cuda_graphs"]) for job in jobs] == [
        ("sac", False),
        ("sac", True),
        ("sac", True),
        ("sac", False),
        ("td3", False),
        ("td3", True),
        ("td3", True),
        ("td3", False),
    ]
    assert all(job["seeds"] == [0] and job["device"] == "cuda" and job["steps"] == 1000 for job in jobs)
    sac = data["cases"]["sac"]
    assert sac["ratio"] == 3.0 and sac["target_ratio"] == 2.0 and sac["target_met"]
    assert "target_ratio" not in data["cases"]["td3"]


def test_batched_graph_rows_capture_every_run_and_need_a_gpu_and_capturable_cases(monkeypatch, capsys):
    """``--batched-graphs`` compares like with like: the separate runs capture as the batch does."""
    assert main(["perf", "--batched-only", "--batched-graphs", "--cases", "sac"]) == EXIT_CONFIG_ERROR
    assert capsys.readouterr().err.strip().splitlines() == ["error: --batched-graphs needs --device cuda and cases among sac, td3, got cpu and sac"]
    assert main(["perf", "--batched-only", "--batched-graphs", "--cases", "sac", "ppo", "--device", "cuda"]) == EXIT_CONFIG_ERROR
    assert "cases among sac, td3, got cuda and sac, ppo" in capsys.readouterr().err
    jobs: list[dict] = []

    def answer(batch, timeout=0.0):
        jobs.extend(batch)
        return [{"steps_per_second": 10.0 * len(job["seeds"]), "peak_rss_mb": 1.0} for job in batch]

    monkeypatch.setattr(perf, "run_concurrently", answer)
    data = perf.measure_batched(["sac"], [1, 4], device="cuda", cores=16, cuda_graphs=True)
    assert jobs and all(job["cuda_graphs"] is True and job["device"] == "cuda" for job in jobs)
    assert sorted(len(job["seeds"]) for job in jobs) == [1, 1, 1, 1, 1, 4]  # N = 1 alone, N = 4 apart, N = 4 batched
    assert data["settings"]["cuda_graphs"] is True
    jobs.clear()
    perf.measure_batched(["sac"], [1], device="cuda", cores=16)
    assert jobs and all("cuda_graphs" not in job for job in jobs)
