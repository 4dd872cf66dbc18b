"""The record's figures across tasks (rliable style): which algorithms and tasks a budget compares,
the sample-efficiency IQM on hand-computed curves, the improvement probabilities, and bytes that
do not change between two draws."""

import numpy as np
import pytest

from benchmark.analysis import aggregate_figures as figures
from benchmark.analysis import stats


def test_the_common_cover_keeps_the_most_cells():
    # 1M: PPO ran five tasks, TRPO and A2C three of them: 3 algorithms x 3 tasks (9) beats PPO alone x 5
    algos, tasks = figures.common_cover({"ppo": {"A", "B", "C", "D", "E"}, "trpo": {"A", "B", "C"}, "a2c": {"A", "B", "C"}})
    assert (algos, tasks) == (["ppo", "trpo", "a2c"], ["A", "B", "C"])
    # 300k: DDPG ran one task: SAC and TD3 on three (6) beat all three on one (3)
    algos, tasks = figures.common_cover({"sac": {"A", "B", "C"}, "td3": {"A", "B", "C"}, "ddpg": {"B"}})
    assert (algos, tasks) == (["sac", "td3"], ["A", "B", "C"])
    # a tie in cells (2 x 2 against 4 x 1) goes to more tasks
    algos, tasks = figures.common_cover({"x": {"A", "B"}, "y": {"A", "B"}, "z": {"C"}, "w": {"C"}})
    assert (algos, tasks) == (["x", "y"], ["A", "B"])
    assert figures.common_cover({"x": {"A"}}) == (["x"], ["A"])
    assert figures.common_cover({}) == ([], [])


def _budget(curves: dict[str, dict[str, list[list[tuple[int, float]]]]], steps: int = 100) -> figures.Budget:
    scores = {algo: {task: np.array([curve[-1][1] for curve in runs]) for task, runs in per_task.items()} for algo, per_task in curves.items()}
    return figures.Budget(steps, sorted(next(iter(curves.values()))), scores, curves)


def test_sample_efficiency_takes_each_runs_latest_evaluation_and_the_iqm():
    # two tasks, four runs each; evaluations at steps 50 and 100 (run 0 of task A also at 75)
    a = [[(50, 0.0), (75, 9.0), (100, 1.0)], [(50, 0.1), (100, 1.1)], [(50, 0.2), (100, 1.2)], [(50, 0.3), (100, 1.3)]]
    b = [[(50, 0.4), (100, 2.0)], [(50, 0.5), (100, 2.1)], [(50, 0.6), (100, 2.2)], [(50, 0.7), (100, 2.3)]]
    found = figures.sample_efficiency(_budget({"algo": {"A": a, "B": b}}), points=4, reps=200)
    steps, iqm, low, high = found["algo"]
    assert steps.tolist() == [50, 75, 100]  # step 25: no run has an evaluation yet, so it is skipped
    # step 50: the 8 values 0.0..0.7; the IQM is the mean of the middle half, 0.2..0.5
    assert iqm[0] == pytest.approx(0.35)
    # step 75: run 0 of task A has 9.0, the others still their step-50 value
    assert iqm[1] == pytest.approx(stats.aggregate_iqm({"A": [9.0, 0.1, 0.2, 0.3], "B": [0.4, 0.5, 0.6, 0.7]}))
    assert iqm[2] == pytest.approx(np.mean([1.2, 1.3, 2.0, 2.1]))
    assert np.all(low <= iqm) and np.all(iqm <= high)


def test_improvement_between_algorithms_and_against_the_published_scores():
    budget = _budget({"x": {"A": [[(1, 2.0)], [(1, 3.0)]]}, "y": {"A": [[(1, 0.0)], [(1, 1.0)]]}, "z": {"A": [[(1, 2.0)], [(1, 3.0)]]}})
    budget.references = {"x": (stats.Interval(0.25, 0.1, 0.4), 3)}
    found = figures.improvements(budget, reps=200)
    assert list(found) == ["x > y", "x > z", "y > z", "x > published (3 tasks)"]
    assert found["x > y"].estimate == 1.0 and found["y > z"].estimate == 0.0
    assert found["x > z"].estimate == 0.5  # the same runs: every pair but the ties splits, ties count half
    assert found["x > published (3 tasks)"] == stats.Interval(0.25, 0.1, 0.4)


def test_the_figures_are_the_same_bytes_twice(tmp_path):
    rng = np.random.default_rng(3)
    curves = {
        algo: {task: [[(step, float(rng.normal(step / 100, 0.3))) for step in (25, 50, 75, 100)] for _ in range(4)] for task in ("A", "B")}
        for algo in ("ppo", "trpo")
    }
    budget = _budget(curves)
    first = figures.draw([budget], tmp_path / "one")
    figures.draw([budget], tmp_path / "two")
    assert [path.name for path in first] == [path.name for path in figures.paths([budget], tmp_path / "one")]
    names = sorted(path.name for path in (tmp_path / "one").iterdir())
    assert len(names) == 8 and sum(name.endswith(".svg") for name in names) == 4
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert all(b"<dc:date>" not in (tmp_path / "one" / name).read_bytes() for name in names if name.endswith(".svg"))
