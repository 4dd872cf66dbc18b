"""Device slots (which GPU each run process sees) and the progress board, on CPU."""

import pytest
from rich.console import Console

from agents.api import ConfigError
from benchmark.execution import devices
from benchmark.execution.devices import CPU, Slot, plan_slots, visible_gpus
from benchmark.execution.progress import Board, format_duration


def test_auto_without_gpus_is_one_cpu_slot_per_worker():
    assert plan_slots("auto", [], workers=3) == [CPU, CPU, CPU]
    assert plan_slots("cpu", ["0", "1"], workers=2) == [CPU, CPU]


def test_gpus_are_dealt_round_robin_then_packed():
    slots = plan_slots("auto", ["0", "1", "2"], runs_per_gpu=2, workers=16)
    assert [slot.visible_devices for slot in slots] == ["0", "1", "2", "0", "1", "2"]
    assert {slot.device for slot in slots} == {"cuda:0"}  # each process sees its GPU alone, as cuda:0
    assert plan_slots("cuda", ["0", "1"], workers=1) == [Slot("0", "cuda:0"), Slot("1", "cuda:0")]


def test_workers_spread_over_the_gpus_by_default():
    assert [slot.visible_devices for slot in plan_slots("auto", ["0", "1"], workers=3)] == ["0", "1", "0", "1"]
    assert plan_slots("cuda:0", ["0"], workers=4) == [Slot("0", "cuda:0")] * 4


def test_one_pinned_gpu_takes_k_runs():
    assert plan_slots("cuda:1", ["4", "6"], runs_per_gpu=3) == [Slot("6", "cuda:0")] * 3


@pytest.mark.parametrize(
    "requested,gpus,message",
    [
        ("cuda", [], "no CUDA device is visible"),
        ("cuda:2", ["0", "1"], "only 2 CUDA device"),
        ("cuda:x", ["0"], "unknown device 'cuda:x'"),
        ("tpu", ["0"], "unknown device 'tpu'"),
    ],
)
def test_unusable_devices_are_clear_errors(requested, gpus, message):
    with pytest.raises(ConfigError, match=message):
        plan_slots(requested, gpus)


def test_runs_per_gpu_must_be_positive():
    with pytest.raises(ConfigError, match="--runs-per-gpu must be >= 1"):
        plan_slots("auto", ["0"], runs_per_gpu=0)


def test_visible_gpus_follow_the_parents_cuda_visible_devices():
    assert visible_gpus(2, {}) == ["0", "1"]
    assert visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "3,5"}) == ["3", "5"]
    assert visible_gpus(1, {"CUDA_VISIBLE_DEVICES": "GPU-1234abcd"}) == ["GPU-1234abcd"]


def test_a_gpu_driver_is_found_by_its_device_files(tmp_path):
    assert not devices.gpu_driver_present(tmp_path)
    for name in ("nvidia0", "kfd", "dxg"):
        (tmp_path / name).touch()
        assert devices.gpu_driver_present(tmp_path), name
        (tmp_path / name).unlink()
    (tmp_path / "nvidiactl").touch()  # the control device alone is no GPU
    assert not devices.gpu_driver_present(tmp_path)


def test_without_a_gpu_driver_counting_gpus_loads_no_torch(monkeypatch):
    """A launch's parent counts GPUs to plan its slots; on a machine without a driver it must not
    pay torch's import for it (its runs train in other processes)."""
    monkeypatch.setattr(devices.sys, "platform", "linux")
    monkeypatch.setattr(devices, "gpu_driver_present", lambda: False)
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # importing torch now raises
    assert devices.gpu_count() == 0


def test_entering_a_slot_sets_the_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    devices.enter_slot(Slot("2", "cuda:0"))
    assert devices.os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    devices.enter_slot(CPU)
    assert devices.os.environ["CUDA_VISIBLE_DEVICES"] == ""


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_board_counts_runs_and_estimates_the_time_left():
    clock, console = FakeClock(), Console(record=True, width=200, force_terminal=False)
    board = Board({"a": 1000, "b": 1000, "c": 2000}, console, live=False, status_every=10, clock=clock)
    with board:
        board.started("a", "ppo/CartPole-v1/seed0", "CPU")
        board.started("b", "ppo/CartPole-v1/seed1", "CPU", resumed_from=400)
        clock.now = 10.0
        board.progressed("a", 500, 20.5)
        board.progressed("b", 600, None)
        # 500 + 200 steps made in 10 s = 70/s; left: 500 + 400 + 2000 = 2900 -> ~41 s
        assert board.eta_seconds() == pytest.approx(2900 / 70)
        board.refresh()
        board.finished("a", "ppo/CartPole-v1/seed0", True, "finished ppo/CartPole-v1/seed0: final eval 500.0")
        board.finished("b", "ppo/CartPole-v1/seed1", False, "FAILED ppo/CartPole-v1/seed1: boom [x]")
    text = console.export_text()
    assert "started ppo/CartPole-v1/seed0 on CPU" in text
    assert "resuming ppo/CartPole-v1/seed1 from its checkpoint at env step 400 on CPU" in text
    assert "0/3 done (0 failed), 2 running, 1 waiting" in text
    assert "ppo/CartPole-v1/seed0 500/1,000" in text and "eval 20.5" in text
    assert "FAILED ppo/CartPole-v1/seed1: boom [x]" in text  # markup characters survive
    assert "2/3 done (1 failed), 0 running, 1 waiting" in text


def test_the_eta_starts_from_the_plan_and_is_re_estimated_from_measured_rates():
    """Two works (a: PPO-like, b: SAC-like, 50x slower per step): before anything runs the ETA is
    the plan's; once a's work is measured its runs use that rate, b keeps its share of the plan."""
    clock, console = FakeClock(), Console(record=True, width=200, force_terminal=False)
    groups = {"a1": "ppo", "a2": "ppo", "b1": "sac"}
    estimated = {"a1": 10.0, "a2": 10.0, "b1": 500.0}
    board = Board({"a1": 1000, "a2": 1000, "b1": 1000}, console, groups=groups, live=False, clock=clock, estimated=estimated, parallel=2)
    assert board.eta_seconds() == pytest.approx((10 + 10 + 500) / 2)
    with board:
        board.started("a1", "ppo/CartPole-v1/seed0")
        clock.now = 5.0
        board.progressed("a1", 250, None)  # 50 steps/s, five times slower than planned
        # a1: 750 / 50 = 15 s; a2: 1000 / 50 = 20 s; b1: its plan, 500 s (nothing of its work measured)
        assert board.eta_seconds() == pytest.approx((15 + 20 + 500) / 2)
        board.started("b1", "sac/Pendulum-v1/seed0")
        clock.now = 15.0
        board.progressed("b1", 100, None)  # 10 steps/s: 900 left -> 90 s
        assert board.eta_seconds() == pytest.approx((15 + 20 + 90) / 2)


def test_a_run_failing_before_it_starts_leaves_the_board_consistent():
    clock, console = FakeClock(), Console(record=True, width=200, force_terminal=False)
    board = Board({"a": 1000, "b": 1000}, console, live=False, clock=clock)
    with board:
        board.finished("a", "ppo/CartPole-v1/seed0", False, "FAILED ppo/CartPole-v1/seed0: no checkpoint")
        board.started("b", "ppo/CartPole-v1/seed1")
        clock.now = 10.0
        board.progressed("b", 100, None)
        assert board.eta_seconds() == pytest.approx(900 / 10)  # the failed run is no work left
        board.refresh()
    assert "1/2 done (1 failed)" in console.export_text()


def test_board_live_table_shows_running_runs():
    console = Console(record=True, width=200)
    board = Board({"a": 100}, console, live=False)
    board.started("a", "sac/Pendulum-v1/seed0", "GPU 0")
    board.progressed("a", 50, -400.0)
    console.print(board.table())
    text = console.export_text()
    assert "sac/Pendulum-v1/seed0" in text and "50/100" in text and "-400.0" in text and "GPU 0" in text


def test_format_duration():
    assert format_duration(59.6) == "1m00s" and format_duration(3725) == "1h02m"


# -- executors through the CLI ---------------------------------------------------------------


def test_address_without_ray_executor_is_a_clear_error(tiny_suite, tmp_path):
    from test_cli import run_cli

    completed = run_cli("run", "--suite", str(tiny_suite), "--address", "auto", "--results-dir", str(tmp_path / "results"), cwd=tmp_path)
    assert completed.returncode == 2 and "--address is for --executor ray" in completed.stderr
    assert not (tmp_path / "results").exists()
