"""The README as GitHub shows it, in headless Chromium at 1280 and 390 px: rendered as GitHub
flavoured markdown (markdown-it's CommonMark with GFM tables) inside a column styled like
GitHub's (its width, font and table rules: a wide table scrolls inside its own box), every
image found and decoded, the page no wider than the screen, and at 1280 px the pitch, the two
commands and the whole record table within the first two screens."""

import html
import json
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from test_report_browser import CHROMIUM, chromium

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (make report-check installs it)")

ROOT = Path(__file__).resolve().parent.parent
SCREEN = 800  # px: the height of one screen at 1280 x 800

# GitHub's markdown body, as far as layout goes: a centered column of at most 1012 px with 32 px
# padding (about 830 px of text at 1280 px once its file list sits beside it: the wider bound
# is the stricter test of overflow, the narrower of height), 16 px type, 1.5 line height, long words
# broken where they must (its word-wrap: break-word); tables
# are blocks that scroll sideways; cells padded 6 x 13 px; images at most the column's width.
STYLE = """
*, *::before, *::after { box-sizing: border-box; }
body { margin: 0; font: 16px/1.5 -apple-system, "Segoe UI", "Noto Sans", Helvetica, Arial, sans-serif; }
article { max-width: 878px; margin: 0 auto; padding: 32px; overflow-wrap: break-word; }
table { display: block; width: max-content; max-width: 100%; overflow: auto; border-spacing: 0; border-collapse: collapse; }
td, th { padding: 6px 13px; border: 1px solid #d1d9e0; }
img { max-width: 100%; box-sizing: content-box; }
pre { overflow: auto; padding: 16px; font-size: 85%; }
"""

PROBE = """
<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const heading = (words) => [...document.querySelectorAll("h2")].find((h) => h.textContent.includes(words));
  const record = [...document.querySelectorAll("table")][0]
  const result = {
    width: window.innerWidth,
    scroll_width: document.documentElement.scrollWidth,
    images: images.length,
    decoded: images.filter((image) => image.complete && image.naturalWidth > 0).length,
    widest_image: Math.max(0, ...images.map((image) => image.getBoundingClientRect().width)),
    two_commands_top: heading("Two commands").getBoundingClientRect().top + window.scrollY,
    record_table_bottom: record.getBoundingClientRect().bottom + window.scrollY,
    record_rows: record.querySelectorAll("tbody tr").length,
  };
  const out = document.createElement("pre");
  out.id = "probe";
  out.hidden = true;
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>
"""


def rendered_readme(directory: Path, text: str | None = None) -> Path:
    """The README (or ``text``) as an HTML page whose relative links resolve against the repository."""
    body = MarkdownIt("commonmark").enable("table").enable("strikethrough").render(text if text is not None else (ROOT / "README.md").read_text())
    page = directory / "readme.html"
    page.write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><base href="{ROOT.as_uri()}/">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>'
        f"<body><article>{body}</article>{PROBE}</body></html>"
    )
    return page


def look(page: Path, width: int, height: int) -> dict:
    """The probe's findings in a ``width`` x ``height`` iframe (headless windows are at least 500 px wide)."""
    wrapper = page.with_name(f"frame-{width}.html")
    wrapper.write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0"><iframe id="page" style="border:0;width:{width}px;height:{height}px" '
        f'srcdoc="{html.escape(page.read_text(), quote=True)}"></iframe><script>'
        'document.getElementById("page").addEventListener("load", () => setTimeout(() => {'
        'const inner = document.getElementById("page").contentDocument.getElementById("probe");'
        'const out = document.createElement("pre"); out.id = "found"; out.textContent = inner ? inner.textContent : "{}";'
        "document.body.appendChild(out);}, 0));</script></body></html>"
    )
    dom = chromium("--window-size=1400,1000", "--allow-file-access-from-files", "--dump-dom", wrapper.as_uri())
    start = dom.index('<pre id="found">') + len('<pre id="found">')
    return json.loads(html.unescape(dom[start : dom.index("</pre>", start)]))


@pytest.mark.parametrize("width,height", [(1280, SCREEN), (390, 844)], ids=["desktop", "phone"])
def test_the_readme_reads_well_on_github(tmp_path, width, height):
    found = look(rendered_readme(tmp_path), width, height)
    assert found["width"] == width
    assert found["images"] >= 1 and found["decoded"] == found["images"], "an image of the README is missing"
    assert found["scroll_width"] <= width, "the page is wider than the screen"
    assert found["widest_image"] <= width
    assert found["record_rows"] >= 18
    if width == 1280:
        assert found["two_commands_top"] < SCREEN, "the two commands start below the first screen"
        assert found["record_table_bottom"] <= 2 * SCREEN, f"the record table ends at {found['record_table_bottom']:.0f} px, past two screens"


def test_the_probe_sees_a_readme_that_breaks_the_rules(tmp_path):
    """A README whose record sits three screens down and whose image is wider than the page fails the checks above."""
    rows = "\n".join(f"| ppo | Task{i}-v5 | 1M | {'a long note ' * 30} |" for i in range(18))
    text = (
        "# title\n\n" + "A paragraph.\n\n" * 40 + "## Two commands\n\n```\nmake bench\n```\n\n"
        f"| algorithm | task | budget | note |\n|---|---|---|---|\n{rows}\n\n"
        '<img src="results/record/aggregate_overview.png" style="width:2000px;max-width:none">\n'
    )
    found = look(rendered_readme(tmp_path, text), 1280, SCREEN)
    assert found["two_commands_top"] > SCREEN and found["record_table_bottom"] > 2 * SCREEN
    assert found["scroll_width"] > 1280 and found["decoded"] == found["images"] == 1


SITE_PROBE = """
<script>
window.addEventListener("load", () => setTimeout(() => {
  const images = [...document.images];
  const out = document.createElement("pre");
  out.id = "probe";
  out.hidden = true;
  out.textContent = JSON.stringify({
    width: window.innerWidth,
    scroll_width: document.documentElement.scrollWidth,
    images: images.length,
    decoded: images.filter((image) => image.complete && image.naturalWidth > 0).length,
    equations: document.querySelectorAll("math[display=block]").length,
    drawn_equations: [...document.querySelectorAll("math[display=block]")].filter((m) => m.getBoundingClientRect().height > 10).length,
    broken_names: [...document.querySelectorAll("td:first-child code")].filter((c) => c.getClientRects().length > 1).length,
  });
  document.body.appendChild(out);
}, 300));
</script>
"""


@pytest.mark.parametrize("width,height", [(1280, SCREEN), (390, 844)], ids=["desktop", "phone"])
def test_an_algorithm_page_of_the_site_reads_well(tmp_path, width, height):
    """The built site's SAC page (make docs builds site/; CI builds it before the tests): equations
    drawn, figures decoded, no hyperparameter name broken over two lines, no page overflow."""
    built = ROOT / "site" / "algorithms" / "sac" / "index.html"
    if not built.is_file():
        pytest.skip("the site is not built (make docs)")
    page = built.with_name("probe.html")
    try:
        page.write_text(built.read_text().replace("</body>", SITE_PROBE + "</body>"))
        wrapper = tmp_path / f"frame-{width}.html"
        wrapper.write_text(
            f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0"><iframe id="page" src="{page.as_uri()}" '
            f'style="border:0;width:{width}px;height:{height}px"></iframe><script>'
            'document.getElementById("page").addEventListener("load", () => setTimeout(() => {'
            'const inner = document.getElementById("page").contentDocument.getElementById("probe");'
            'const out = document.createElement("pre"); out.id = "found"; out.textContent = inner ? inner.textContent : "{}";'
            "document.body.appendChild(out);}, 1000));</script></body></html>"
        )
        dom = chromium("--window-size=1400,1000", "--allow-file-access-from-files", "--dump-dom", wrapper.as_uri())
    finally:
        page.unlink(missing_ok=True)
    start = dom.index('<pre id="found">') + len('<pre id="found">')
    found = json.loads(html.unescape(dom[start : dom.index("</pre>", start)]))
    assert found["width"] == width
    assert found["equations"] >= 5 and found["drawn_equations"] == found["equations"], found
    assert found["images"] >= 1 and found["decoded"] == found["images"], found
    assert found["broken_names"] == 0, found
    assert found["scroll_width"] <= width, found
