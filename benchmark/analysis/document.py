"""A report as blocks rendered twice, as Markdown and as one self-contained HTML page, so both say
exactly the same.

The HTML page needs no network: images are inlined as data URIs, interactive plots are Plotly
figures whose library (plotly.js, from the ``plotly`` package) is inlined once; every figure and
plot enlarges to the whole window when clicked (again, or Escape, to close); a table's long
columns can be folded into a "details" cell, so that the table fits a 1280 px screen and reads on a
phone. The Markdown shows each plot's PNG twin.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import Any

URL = re.compile(r"https?://[^\s<>\"'`)\]]+[^\s<>\"'`)\].,;:]")
LINK = re.compile(r"\[([^\]]+)\]\((https?://[^)\s]+)\)")

STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;line-height:1.4}"
    ".scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;margin:1em 0}"
    "table{border-collapse:collapse;font-size:0.9em}"
    "th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}"
    "td{white-space:nowrap}td:last-child{white-space:normal;min-width:12em}td.long{white-space:normal;min-width:14em;max-width:26em}"
    "details summary{cursor:pointer;color:#0550ae}details dl{margin:0.3em 0;white-space:normal;max-width:40em}"
    "details dt{font-weight:bold}details dd{margin:0 0 0.4em 0}"
    "p,figcaption{overflow-wrap:anywhere}"
    "img{max-width:100%;height:auto}figure{margin:1em 0;cursor:zoom-in}figcaption{font-size:0.85em;color:#555}"
    ".plot{width:100%;height:560px}"
    "figure.enlarged{position:fixed;inset:0;margin:0;padding:1em;background:#fff;z-index:10;overflow:auto;cursor:zoom-out}"
    "figure.enlarged img{max-width:none;width:auto;max-height:none}figure.enlarged .plot{height:calc(100vh - 5em) !important}"
    "@media (max-width:600px){body{margin:1em auto;padding:0 0.6em}table{font-size:0.8em}.plot{height:420px}}"
)

# Click a figure to fill the window with it, click again (or Escape) to put it back; a plot redraws at its new size.
ENLARGE = """
document.addEventListener("click", (event) => {
  if (event.target.closest(".modebar, .legend, .updatemenu-container, .slider-container")) return;
  const figure = event.target.closest("figure");
  if (!figure) return;
  figure.classList.toggle("enlarged");
  figure.querySelectorAll(".plot").forEach((plot) => window.Plotly && Plotly.Plots.resize(plot));
});
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  document.querySelectorAll("figure.enlarged").forEach((figure) => {
    figure.classList.remove("enlarged");
    figure.querySelectorAll(".plot").forEach((plot) => window.Plotly && Plotly.Plots.resize(plot));
  });
});
"""


def inline(text: str) -> str:
    """``text`` escaped for HTML, with its markdown links ``[text](url)`` and bare URLs as links."""
    parts, last = [], 0
    for match in re.finditer(f"{LINK.pattern}|{URL.pattern}", text):
        parts.append(html.escape(text[last : match.start()]))
        label, url = (match.group(1), match.group(2)) if match.group(1) else (match.group(0), match.group(0))
        parts.append(f'<a href="{html.escape(url, quote=True)}">{html.escape(label)}</a>')
        last = match.end()
    parts.append(html.escape(text[last:]))
    return "".join(parts)


def plotly_js() -> str:
    """plotly.js, minified, as the installed ``plotly`` package ships it."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


class Document:
    """Headings, paragraphs, tables, images and interactive plots, in order."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("heading", (level, text)))

    def paragraph(self, text: str) -> None:
        self.blocks.append(("paragraph", text))

    def table(self, headers: list[str], rows: list[list[str]], fold: int | None = None) -> None:
        """A table; in HTML the columns from index ``fold`` on are folded into one last 'details'
        cell per row (header: value pairs, opened on a click). Markdown shows every column."""
        self.blocks.append(("table", (headers, rows, fold)))

    def image(self, relative_path: str, caption: str) -> None:
        self.blocks.append(("image", (relative_path, caption)))

    def plot(self, figure: dict[str, Any], relative_png: str, caption: str, height: int | None = None) -> None:
        """An interactive Plotly figure (``{"data": [...], "layout": {...}}``) in HTML, ``height``
        pixels tall (default: the stylesheet's); its PNG twin at ``relative_png`` in Markdown."""
        self.blocks.append(("plot", (figure, relative_png, caption, height)))

    def markdown(self) -> str:
        out = []
        for kind, content in self.blocks:
            if kind == "heading":
                out.append("#" * content[0] + " " + content[1])
            elif kind == "paragraph":
                out.append(content)
            elif kind == "table":
                headers, rows, _ = content
                cell = lambda text: " ".join(str(text).split()).replace("|", "\\|")  # noqa: E731
                lines = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "---|" * len(headers)]
                lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
                out.append("\n".join(lines))
            elif kind == "plot":
                out.append(f"![{content[2]}]({content[1]})")
            else:
                out.append(f"![{content[1]}]({content[0]})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str, base: Path | None = None) -> str:
        """One self-contained page (images inlined as data URIs from ``base``, plotly.js inlined
        when there is a plot, so it can be mailed or attached), links clickable, tables that
        scroll sideways on a narrow screen, figures that enlarge when clicked."""
        body, plots = [], 0
        for kind, content in self.blocks:
            if kind == "heading":
                body.append(f"<h{content[0]}>{html.escape(content[1])}</h{content[0]}>")
            elif kind == "paragraph":
                text = inline(content)
                text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
                text = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)
                body.append(f"<p>{text}</p>")
            elif kind == "table":
                body.append(_table_html(*content))
            elif kind == "plot":
                figure, _, caption, height = content
                plots += 1
                spec = json.dumps(figure, separators=(",", ":")).replace("</", "<\\/")
                size = f' style="height:{height}px"' if height else ""
                legend = "click the legend to show or hide a line; " if figure["layout"].get("showlegend", True) else ""
                body.append(
                    f'<figure><div class="plot" id="plot{plots}"{size}></div><figcaption>{html.escape(caption)} (hover for values; '
                    f"{legend}click the figure to enlarge it)</figcaption></figure>"
                    f'<script>(() => {{ const figure = {spec}; Plotly.newPlot("plot{plots}", figure.data, figure.layout, '
                    f"{{responsive: true, displaylogo: false}}); }})();</script>"
                )
            else:
                path, caption = content
                source = html.escape(path, quote=True)
                if base is not None and (base / path).is_file():
                    source = "data:image/png;base64," + base64.b64encode((base / path).read_bytes()).decode("ascii")
                caption = html.escape(caption, quote=True)
                body.append(f'<figure><img src="{source}" alt="{caption}"><figcaption>{caption}</figcaption></figure>')
        library = f"<script>{plotly_js()}</script>" if plots else ""
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style>{library}</head><body>\n"
            + "\n".join(body)
            + f"\n<script>{ENLARGE}</script>\n</body></html>\n"
        )


LONG_CELL = 48
"""Characters above which a cell's text wraps (the others stay on one line)."""
LONG = ' class="long"'


def _table_html(headers: list[str], rows: list[list[str]], fold: int | None) -> str:
    shown = headers if fold is None else [*headers[:fold], "details"]
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in shown)
    lines = []
    for row in rows:
        # a long cell wraps in a column of reading width, so that the table fits a 1280 px screen
        cells = [f"<td{LONG if len(str(c)) > LONG_CELL else ''}>{inline(str(c))}</td>" for c in (row if fold is None else row[:fold])]
        if fold is not None:
            pairs = "".join(f"<dt>{html.escape(str(h))}</dt><dd>{inline(str(c))}</dd>" for h, c in zip(headers[fold:], row[fold:]) if str(c).strip())
            cells.append(f"<td><details><summary>more</summary><dl>{pairs}</dl></details></td>" if pairs else "<td></td>")
        lines.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(lines)}</tbody></table></div>'
