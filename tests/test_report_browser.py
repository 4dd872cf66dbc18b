"""report.html in a real headless browser (Chromium from the OS packages) at desktop and phone
width: self-contained (every image inlined and decoded), links clickable, nothing wider than
the screen (wide tables scroll inside their own box), no local path in the text.

``make report-check`` installs Chromium when it is missing and runs this file, keeping the
screenshots under results/reports/screenshots (look at them); without Chromium it is skipped.
"""

import html
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from benchmark.analysis import report
from benchmark.analysis.records import RunRecord
from benchmark.config import load_suite

CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (make report-check installs it)")

SUITE = """\
name: browser
description: two algorithms, a grid and a task without a reference score
seeds: [0, 1, 2]
budget: {total_steps: 20000, eval_every: 5000, eval_episodes: 2}
experiments:
  - algo: ppo
    envs: [CartPole-v1, HalfCheetah-v5]
    grid: {learning_rate: [0.0003, 0.001]}
  - algo: sac
    envs: [HalfCheetah-v5]
"""

PROBE = """
<script>
// Move the mouse over the middle point of a plot's first trace that has a hover text, as a user
// would (a mousemove on the subplot, at that point's pixel), and read the label Plotly draws.
function hover(plot, view) {
  const data = plot._fullData || [];
  const trace = data.find((t) => t.visible === true && t.hovertemplate && t.hoverinfo !== "skip");
  if (!trace) return {rendered: !!plot.querySelector(".main-svg"), traces: data.length, hover: ""};
  const layout = plot._fullLayout;
  const xaxis = layout[trace.xaxis.replace("x", "xaxis")], yaxis = layout[trace.yaxis.replace("y", "yaxis")];
  const middle = Math.floor(trace.x.length / 2);
  const x = xaxis._offset + xaxis.l2p(xaxis.d2l(trace.x[middle])), y = yaxis._offset + yaxis.l2p(yaxis.d2l(trace.y[middle]));
  const drag = plot.querySelector(`.draglayer .${trace.xaxis}${trace.yaxis} .nsewdrag`);
  const box = plot.getBoundingClientRect();
  drag.dispatchEvent(new view.MouseEvent("mousemove", {clientX: box.left + x, clientY: box.top + y, bubbles: true}));
  const label = plot.querySelector(".hoverlayer .hovertext");
  return {rendered: !!plot.querySelector(".main-svg"), traces: data.length, hover: label ? label.textContent : ""};
}
const frame = document.getElementById("page");
frame.addEventListener("load", () => {
  const doc = frame.contentDocument, view = frame.contentWindow;
  const images = [...doc.images];
  const result = {
    width: view.innerWidth,
    scroll_width: doc.documentElement.scrollWidth,
    viewport_meta: !!doc.querySelector('meta[name="viewport"]'),
    images: images.length,
    decoded: images.filter((image) => image.complete && image.naturalWidth > 0).length,
    inline: images.filter((image) => image.src.startsWith("data:image/png;base64,")).length,
    widest_image: Math.max(0, ...images.map((image) => image.getBoundingClientRect().width)),
    links: [...doc.querySelectorAll("a[href]")].map((link) => link.href),
    tables: doc.querySelectorAll("table").length,
    tables_in_scroll_boxes: doc.querySelectorAll(".scroll > table").length,
    widest_box: Math.max(0, ...[...doc.querySelectorAll(".scroll")].map((box) => box.getBoundingClientRect().width)),
    tables_scrolling: [...doc.querySelectorAll(".scroll")].filter((box) => box.scrollWidth > box.clientWidth + 1).length,
    text: doc.body.innerText,
    plots: [...doc.querySelectorAll(".plot")].map((plot) => hover(plot, view)),
  };
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>
"""


def chromium(*args: str) -> str:
    completed = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1", "--virtual-time-budget=10000", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return completed.stdout


def look(page: Path, width: int, height: int, screenshot: Path) -> dict:
    """What the page looks like in a ``width`` x ``height`` viewport (an iframe of that size:
    headless Chromium's window is at least 500 pixels wide), and a screenshot of it."""
    wrapper = page.with_name(f"probe-{width}.html")
    wrapper.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">'
        f'<iframe id="page" style="border:0;width:{width}px;height:{height}px" srcdoc="{html.escape(page.read_text(), quote=True)}">'
        f"</iframe>{PROBE}</body></html>"
    )
    dom = chromium("--window-size=1400,1000", "--dump-dom", wrapper.as_uri())
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    found = json.loads(html.unescape(dom[start : dom.index("</pre>", start)]))
    chromium(f"--window-size={max(width, 500)},{height}", f"--screenshot={screenshot}", wrapper.as_uri())
    return found


def looked_at(page: Path, width: int, height: int, name: str) -> tuple[dict, Path]:
    """``look`` at ``page``, its screenshot kept in $REPORT_SCREENSHOTS (else beside the page)."""
    keep = os.environ.get("REPORT_SCREENSHOTS")
    shots = Path(keep) if keep else page.parent
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / f"{name}-{width}px.png"
    return look(page, width, height, shot), shot


@pytest.fixture(scope="module")
def written_report(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("browser")
    (directory / "browser.yaml").write_text(SUITE)
    suite = load_suite(str(directory / "browser.yaml"))
    rng = np.random.default_rng(0)
    records = []
    for spec in suite.specs:
        final = float(rng.uniform(100, 500) if spec.env_id == "CartPole-v1" else rng.uniform(1000, 6000))
        curve = [(step, final * step / 20000 + float(rng.normal(0, 30))) for step in range(5000, 20001, 5000)]
        records.append(
            RunRecord(
                spec,
                "FINISHED",
                run_id=f"run{len(records)}",
                final_return=final,
                steps_per_second=1234.0,
                wall_seconds=321.0,
                curve=curve,
                git_sha="0123456789abcdef",
                attempts=1,
            )
        )
    records[-1].status, records[-1].final_return, records[-1].error = "FAILED", None, "NonFiniteLoss: loss is nan at step 5,000"
    from benchmark.training.playback import write_strip  # a filmed episode's strip, as evaluate --video keeps it

    strip = directory / "out" / "plots" / f"video-{records[0].spec.run_key}.png"
    strip.parent.mkdir(parents=True)
    write_strip([np.full((480, 480, 3), shade, dtype=np.uint8) for shade in range(0, 240, 20)], strip)
    report.write_report(suite, records, directory / "out", "mlflow.db", strips={records[0].spec.run_key: strip})
    return directory / "out" / "report.html"


@pytest.fixture(scope="module")
def written_comparison(tmp_path_factory) -> Path:
    """A comparison of two tasks against two baselines, one read off its curve."""
    from benchmark.analysis import compare
    from benchmark.config import Budget, RunSpec

    rng = np.random.default_rng(1)
    records = []
    for algo, budget, level in (("my_package.learners:MySAC", 20000, 1.0), ("sac", 100000, 0.8), ("td3", 20000, 0.9)):
        for env_id in ("HalfCheetah-v5", "Hopper-v5"):
            for seed in range(3):
                final = float(level * rng.uniform(1000, 3000))
                spec = RunSpec("browser", algo, env_id, seed, {"hidden_sizes": [8]}, Budget(budget, 5000, 10))
                records.append(RunRecord(spec, "FINISHED", f"{algo}{env_id}{seed}", final, curve=[(20000, final), (budget, final * 1.5)]))
    candidate = [record for record in records if record.spec.algo.startswith("my_package")]
    pairs = compare.compare(candidate, [record for record in records if record not in candidate])
    directory = tmp_path_factory.mktemp("comparison")
    return compare.write(pairs, directory / "out", "Comparison: mine against the record", "Candidate: `mine`.").with_suffix(".html")


@pytest.mark.parametrize("width,height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
def test_the_report_reads_well_in_a_browser(written_report, width, height):
    found, shot = looked_at(written_report, width, height, "report")

    assert found["width"] == width and found["viewport_meta"]
    assert found["images"] >= 1 and found["decoded"] == found["images"] == found["inline"]  # self-contained (the filmed strip)
    assert found["scroll_width"] <= width, "the page is wider than the screen"
    assert found["widest_image"] <= width and found["widest_box"] <= width
    assert found["tables"] >= 4 and found["tables_in_scroll_boxes"] == found["tables"]  # wide tables scroll in place
    if width >= 1280:
        assert found["tables_scrolling"] == 0, "a table scrolls sideways at desktop width (fold its long columns)"
    assert any(link.startswith("https://") for link in found["links"])  # source URLs are links
    assert str(written_report.parent) not in found["text"] and "/tmp/" not in found["text"]  # no local paths
    assert shot.stat().st_size > 10_000
    assert "Filmed episodes" in found["text"]
    # the learning curves and the aggregates are interactive: drawn, and a hover shows a value
    assert len(found["plots"]) >= 3 and all(plot["rendered"] and plot["traces"] for plot in found["plots"])
    for plot in found["plots"]:
        assert any(ch.isdigit() for ch in plot["hover"]), f"hovering a plot shows no value: {plot}"


@pytest.mark.parametrize("width,height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
def test_a_comparison_reads_well_in_a_browser(written_comparison, width, height):
    found, _ = looked_at(written_comparison, width, height, "comparison")
    assert found["images"] >= 4 and found["decoded"] == found["images"] == found["inline"]  # aggregates and profiles, inlined
    assert found["scroll_width"] <= width and found["widest_box"] <= width and found["widest_image"] <= width
    assert found["tables"] >= 3 and found["tables_in_scroll_boxes"] == found["tables"]
    assert "better" in found["text"] or "no difference" in found["text"] or "worse" in found["text"]
    assert "evaluation at 20,000 of its 100,000 steps" in found["text"] and str(written_comparison.parent) not in found["text"]
