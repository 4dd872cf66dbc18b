"""The record's learning-curve grids: smoothing and the band over seeds against hand-computed
values, panels per budget, and the figure written as PNG and SVG."""

import numpy as np
import pytest

from benchmark.analysis import curve_grid


def test_the_centered_moving_average_shrinks_at_the_ends():
    smoothed = curve_grid.smooth(np.array([[0.0, 3.0, 6.0, 9.0, 12.0], [1.0, 1.0, 1.0, 1.0, 1.0]]), window=3)
    # ends: the mean of two points; inside: of three
    assert smoothed[0].tolist() == pytest.approx([1.5, 3.0, 6.0, 9.0, 10.5])
    assert smoothed[1].tolist() == pytest.approx([1.0] * 5)
    assert curve_grid.smooth(np.array([5.0, 7.0]), window=5).tolist() == pytest.approx([6.0, 6.0])


def test_the_line_is_the_mean_of_the_smoothed_seeds_at_their_common_steps():
    seeds = [[(10, 0.0), (20, 2.0), (30, 4.0)], [(10, 2.0), (20, 4.0), (30, 6.0), (40, 8.0)]]
    drawn = curve_grid.line(seeds, window=1, reps=500)
    assert drawn is not None and drawn.seeds == 2
    assert drawn.steps.tolist() == [10, 20, 30]  # step 40: only one seed reached it
    assert drawn.mean.tolist() == pytest.approx([1.0, 3.0, 5.0])
    # resampling two seeds: the mean lies between the seeds; the band reaches each seed's value
    assert drawn.low.tolist() == pytest.approx([0.0, 2.0, 4.0]) and drawn.high.tolist() == pytest.approx([2.0, 4.0, 6.0])
    assert curve_grid.line([]) is None and curve_grid.line([[(10, 1.0)], [(20, 1.0)]]) is None


def test_identical_seeds_give_a_band_of_zero_width():
    drawn = curve_grid.line([[(1, 3.0), (2, 5.0)]] * 4, window=5, reps=200)
    assert drawn is not None
    assert drawn.low.tolist() == pytest.approx(drawn.mean.tolist()) and drawn.high.tolist() == pytest.approx(drawn.mean.tolist())


def test_a_grid_is_written_as_png_and_svg(tmp_path):
    rng = np.random.default_rng(0)
    line = curve_grid.line([[(step, float(rng.normal(step, 5))) for step in range(10, 110, 10)] for _ in range(3)])
    assert line is not None
    panels = [curve_grid.Panel("A-v5", {"ppo": line, "trpo": line}, {"ppo": (100, 90.0, 10.0, "somewhere")}), curve_grid.Panel("B-v5", {"ppo": line})]
    from benchmark.analysis import plots

    path = plots.curve_grid("a title", panels, tmp_path / "curves_0.1k.png")
    assert path.stat().st_size > 10_000 and path.with_suffix(".svg").stat().st_size > 10_000


def test_a_published_whole_curve_is_read_and_cut_at_the_budget(tmp_path):
    from types import SimpleNamespace

    path = tmp_path / "curves.csv"
    path.write_text(
        "source,source_url,algo,env_id,seeds,env_step,mean,std\n"
        + "".join(f"S,https://x/sac.csv,SAC,Hopper-v3,10,{step},{step / 1000},1.0\n" for step in (200_000, 100_000, 300_000, 400_000))
    )
    curves = curve_grid.published_curves(path)
    assert curves["https://x/sac.csv"][0].tolist() == [100_000, 200_000, 300_000, 400_000]  # sorted by step
    published = SimpleNamespace(source_url="https://x/sac.csv", mean=300.0, spread=1.0, multi_seed=True, budget_steps=300_000, source="S (x)")
    verdict = SimpleNamespace(published=published, published_value=300.0, reference_sample=None, decision=SimpleNamespace(evidence=object()))
    at, mean = curve_grid.compared_curve(verdict, 300_000, curves)
    assert at.tolist() == [100_000, 200_000, 300_000] and mean.tolist() == [100.0, 200.0, 300.0]
    verdict.decision = SimpleNamespace(evidence=None)  # not compared: no curve drawn
    assert curve_grid.compared_curve(verdict, 300_000, curves) is None
    assert curve_grid.published_curves(tmp_path / "none.csv") == {}
