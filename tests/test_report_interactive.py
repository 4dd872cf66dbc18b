"""The report's interactive parts: the learning-curve figure (every smoothing window the slider
offers equals curve_grid's line; the seed buttons show exactly the seeds' traces), the folded
columns of a table, links in cells, the commit links, and the page in headless Chromium (a hover
shows a value, a click enlarges a figure)."""

import html
import json
import subprocess

import numpy as np
import pytest

from benchmark import provenance
from benchmark.analysis import curve_grid, interactive
from benchmark.analysis.document import Document, inline


def _cells() -> list[curve_grid.Cell]:
    rng = np.random.default_rng(4)
    cells = []
    for task in ("Hopper-v5", "Walker2d-v5"):
        for algo, level in (("ppo", 1.0), ("trpo", 0.7)):
            curves = [[(step, float(level * step + rng.normal(0, 50))) for step in range(100, 1100, 100)] for _ in range(3)]
            cells.append(curve_grid.Cell(1000, task, algo, curves, (1000, 900.0, 80.0, "somewhere") if algo == "ppo" else None))
    return cells


def test_every_smoothing_window_of_the_slider_is_curve_grids_line():
    cells = _cells()
    figure = interactive.figure(cells, 1000)
    slider = figure["layout"]["sliders"][0]
    assert [step["label"] for step in slider["steps"]] == ["none", "3 evaluations", "5 evaluations", "9 evaluations"]
    assert slider["active"] == interactive.WINDOWS.index(curve_grid.WINDOW)
    for window, step in zip(interactive.WINDOWS, slider["steps"]):
        (values, indices) = step["args"]
        drawn = {i: np.asarray(y) for i, y in zip(indices, values["y"])}
        for cell in cells:
            line = curve_grid.line(cell.curves, window=window)
            axis = "x" if cell.task == "Hopper-v5" else "x2"
            mean = next(i for i, trace in enumerate(figure["data"]) if trace["xaxis"] == axis and trace.get("hovertemplate", "").startswith(f"{cell.label}:"))
            assert np.allclose(drawn[mean], line.mean)  # the mean trace of this cell, at this window
            assert np.allclose(drawn[mean - 1], line.low) and np.allclose(drawn[mean - 2], line.high)  # its band


def test_the_seed_buttons_show_and_hide_every_seed_and_nothing_else():
    cells = _cells()
    figure = interactive.figure(cells, 1000)
    hide, show = figure["layout"]["updatemenus"][0]["buttons"]
    seeds = [i for i, trace in enumerate(figure["data"]) if " seed run " in trace.get("name", "")]
    assert len(seeds) == 3 * len(cells) and hide["args"][1] == seeds == show["args"][1]
    assert hide["args"][0] == {"visible": False} and show["args"][0] == {"visible": True}
    assert all(figure["data"][i]["visible"] is False for i in seeds)  # hidden until asked for
    legend = [trace["name"] for trace in figure["data"] if trace.get("showlegend")]
    assert legend == ["ppo", "trpo"]  # one entry per algorithm, toggling it in every panel (legendgroup)
    stars = [trace for trace in figure["data"] if trace.get("marker", {}).get("symbol") == "star"]
    assert len(stars) == 2 and stars[0]["error_y"]["array"] == [80.0]


def test_a_table_folds_its_long_columns_into_details_in_html_only():
    doc = Document()
    doc.table(["algo", "score", "test", "note"], [["ppo", "1.0", "Welch p = 0.3", "see [the paper](https://arxiv.org/abs/1707.06347)"]], fold=2)
    page, markdown = doc.html("t"), doc.markdown()
    assert "<th>algo</th><th>score</th><th>details</th>" in page
    assert "<details><summary>more</summary><dl><dt>test</dt><dd>Welch p = 0.3</dd><dt>note</dt>" in page
    assert '<a href="https://arxiv.org/abs/1707.06347">the paper</a>' in page
    assert "| algo | score | test | note |" in markdown and "[the paper](https://arxiv.org/abs/1707.06347)" in markdown
    assert inline("x <b> https://example.org/a.") == 'x &lt;b&gt; <a href="https://example.org/a">https://example.org/a</a>.'


def test_a_plot_is_its_png_in_markdown_and_plotly_inlined_once_in_html():
    doc = Document()
    figure = interactive.figure(_cells(), 1000)
    doc.plot(figure, "plots/curves_1k.png", "learning curves")
    doc.plot(figure, "plots/curves_1k.png", "again")
    assert "![learning curves](plots/curves_1k.png)" in doc.markdown()
    page = doc.html("t")
    assert page.count("Plotly.newPlot(") == 2 and page.count("<script>") == 4  # the library once, two plots, the click handler
    assert "cdn" not in page.split("<script>")[1][:200].lower() and "<script src=" not in page


def test_a_commit_links_to_the_web_page_of_its_origin(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert provenance.commit_url_template(tmp_path) is None  # no remote: the commit is named, not linked
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", "git@github.com:someone/reprorl.git"], check=True)
    assert provenance.commit_url_template(tmp_path) == "https://github.com/someone/reprorl/commit/{sha}"
    subprocess.run(["git", "-C", str(tmp_path), "remote", "set-url", "origin", "https://gitlab.example.org/group/reprorl"], check=True)
    assert provenance.commit_url_template(tmp_path) == "https://gitlab.example.org/group/reprorl/commit/{sha}"
    subprocess.run(["git", "-C", str(tmp_path), "remote", "set-url", "origin", "/srv/git/reprorl.git"], check=True)
    assert provenance.commit_url_template(tmp_path) is None


PROBE = """
<script>
window.addEventListener("load", () => setTimeout(() => {
  const plot = document.querySelector(".plot");
  const box = plot.querySelector(".nsewdrag").getBoundingClientRect();
  const at = {clientX: box.left + box.width * 0.5, clientY: box.top + box.height * 0.5, bubbles: true};
  plot.querySelector(".nsewdrag").dispatchEvent(new MouseEvent("mousemove", at));
  setTimeout(() => {
    const hover = document.querySelectorAll(".hoverlayer .hovertext").length;
    plot.closest("figure").querySelector("figcaption").click();
    const out = document.createElement("pre");
    out.id = "found";
    out.hidden = true;
    out.textContent = JSON.stringify({hover, enlarged: plot.closest("figure").classList.contains("enlarged"), traces: plot.data.length});
    document.body.appendChild(out);
  }, 500);
}, 500));
</script>
"""


def test_the_plot_answers_a_hover_and_a_click_in_a_browser(tmp_path):
    from test_report_browser import CHROMIUM, chromium

    if CHROMIUM is None:
        pytest.skip("no Chromium (make report-check installs it)")
    doc = Document()
    doc.plot(interactive.figure(_cells(), 1000), "plots/curves_1k.png", "learning curves")
    page = tmp_path / "page.html"
    page.write_text(doc.html("t").replace("</body>", PROBE + "</body>"))
    dom = chromium("--window-size=1280,900", "--dump-dom", page.as_uri())
    start = dom.index('<pre id="found" hidden="">') + len('<pre id="found" hidden="">')
    found = json.loads(html.unescape(dom[start : dom.index("</pre>", start)]))
    assert found["traces"] > 10 and found["hover"] >= 1, found
    assert found["enlarged"], found


def test_the_aggregate_figures_carry_the_intervals_and_profiles_they_are_given():
    from benchmark.analysis.stats import Interval

    intervals = {
        "ppo": {"IQM": Interval(0.6, 0.5, 0.7), "optimality gap": Interval(0.4, 0.3, 0.5)},
        "sac": {"IQM": Interval(0.9, 0.9, 0.9), "optimality gap": Interval(0.1, 0.05, 0.2)},
    }
    figure = interactive.aggregate_intervals(intervals)
    points = {(trace["y"][0], trace["xaxis"]): trace for trace in figure["data"]}
    assert len(points) == 4
    gap = points["ppo", "x2"]  # second metric, second panel
    assert gap["x"] == [0.4] and gap["error_x"]["array"] == [pytest.approx(0.1)] and gap["error_x"]["arrayminus"] == [pytest.approx(0.1)]
    assert points["sac", "x"]["error_x"]["array"] == [0.0]  # a zero-width interval still has its diamond
    assert "optimality gap" in gap["hovertemplate"] and [a["text"] for a in figure["layout"]["annotations"]] == ["IQM", "optimality gap"]

    thresholds = np.linspace(0, 1, 5)
    profile = (np.array([1.0, 0.8, 0.5, 0.2, 0.0]), np.array([1.0, 0.6, 0.3, 0.0, 0.0]), np.array([1.0, 1.0, 0.7, 0.4, 0.1]))
    figure = interactive.performance_profiles({"ppo": profile}, thresholds)
    high, low, mean = figure["data"]
    assert mean["y"] == profile[0].tolist() and low["y"] == profile[1].tolist() and high["y"] == profile[2].tolist()
    assert low["fill"] == "tonexty" and mean["line"]["shape"] == "hv" and mean["customdata"][1] == [0.6, 1.0]
