"""The command line's tables, as data rendered four ways: a terminal table, Markdown, CSV or JSON.

A terminal table fits the console's width (``COLUMNS`` when set): long cells wrap between
words, and the columns that name things (algorithms, environments, suites, run keys) or hold
numbers are never wrapped or cut; a table that cannot fit so is printed wider than the console,
for the terminal to wrap, rather than cut. ``--format md|csv|json`` writes the bare table to stdout, for pasting elsewhere or for
programs; the commands then send their other lines to stderr.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "md", "csv", "json")
LONGEST_UNBROKEN = 30
"""A word longer than this (a URL, say) may be broken across lines in a narrow table."""


@dataclass
class TableData:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    """Columns whose cells are never wrapped or cut (names someone will type or search for)."""
    right: set[str] = field(default_factory=set)
    """Right-aligned columns (numbers)."""
    lists: set[str] = field(default_factory=set)
    """Columns of comma-separated names: wrapped between names only."""
    caption: str = ""

    def add(self, *cells: Any) -> None:
        self.rows.append(["" if cell is None else str(cell) for cell in cells])

    def rich(self, width: int | None = None) -> Table:
        """A terminal table no wider than ``width`` when that is possible without cutting a token:
        name and number columns keep their longest cell, list columns their longest name, other
        columns their longest word (headers wrap between words only); the widest columns give way
        first. A table that cannot fit drops its vertical borders, and if it still cannot, it is
        made wider than ``width`` (print it with ``crop=False``: the terminal wraps its lines,
        nothing is cut)."""
        boxed = Table(title=self.title, caption=self.caption or None, caption_justify="left")
        compact = Table(
            title=self.title,
            caption=self.caption or None,
            caption_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
        widths: list[int | None] = [None] * len(self.headers)
        table = boxed
        if width:
            fitted = self._widths(width - (3 * len(self.headers) + 1))
            if sum(fitted) + 3 * len(self.headers) + 1 > width:  # without vertical borders: 2 characters between columns
                table, overhead = compact, 2 * len(self.headers) - 2
                fitted = self._widths(width - overhead)
                if sum(fitted) + overhead > width:
                    table.width = sum(fitted) + overhead
            widths = list(fitted)
        for header, column_width in zip(self.headers, widths):
            table.add_column(
                header,
                width=column_width,
                no_wrap=False,  # the widths hold every name and number whole; headers wrap between words
                justify="right" if header in self.right else "left",
                overflow="fold",
            )
        for row in self.rows:
            table.add_row(*(Text(cell) for cell in row))  # (no rich markup inside cells)
        return table

    def _widths(self, room: int) -> list[int]:
        """Column widths summing to at most ``room`` where each column's least allows it."""
        columns = list(zip(self.headers, *self.rows))
        natural = [max(len(line) for cell in column for line in cell.splitlines() or [""]) for column in columns]
        least = []
        for header, column in zip(self.headers, columns):
            header_word = max(map(len, header.split()), default=0)
            if header in self.names or header in self.right:  # whole: a name to paste, a number to read
                least.append(max(header_word, *(len(line) for cell in column[1:] for line in cell.splitlines() or [""]), 0))
            else:  # a cell wraps between words (list columns: between names, each with its comma)
                words = (
                    [len(item) + 1 for cell in column[1:] for item in cell.split(", ")]
                    if header in self.lists
                    else [len(word) for cell in column[1:] for word in cell.split()]
                )
                least.append(max(header_word, min(max(words, default=0), LONGEST_UNBROKEN)))
        widths = [max(w, floor) for w, floor in zip(natural, least)]
        while sum(widths) > room:
            shrinkable = [index for index, current in enumerate(widths) if current > least[index]]
            if not shrinkable:
                break
            widest = max(shrinkable, key=lambda index: widths[index])
            widths[widest] -= 1
        return widths

    def markdown(self) -> str:
        def cell(text: str) -> str:
            return " ".join(text.split()).replace("|", "\\|")

        aligns = ["---:" if header in self.right else "---" for header in self.headers]
        lines = [f"| {' | '.join(map(cell, self.headers))} |", f"|{'|'.join(aligns)}|"]
        lines += [f"| {' | '.join(map(cell, row))} |" for row in self.rows]
        return "\n".join(lines) + "\n" + (f"\n{self.caption}\n" if self.caption else "")

    def csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(self.headers)
        writer.writerows(self.rows)
        return buffer.getvalue()

    def json(self) -> str:
        document = {"title": self.title, "rows": [dict(zip(self.headers, row)) for row in self.rows]}
        return json.dumps({**document, "caption": self.caption} if self.caption else document, indent=2) + "\n"


def compact_steps(steps: int) -> str:
    """A step count short and exact: 1M, 2.5M, 300k, else with thousands separators (12,345)."""
    if steps >= 1_000_000 and steps % 100_000 == 0:
        return f"{steps / 1_000_000:g}M"
    if steps >= 1_000 and steps % 1_000 == 0:
        return f"{steps // 1_000}k"
    return f"{steps:,}"


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``singular`` for a count of one, else ``plural_form`` (default: ``singular`` + "s")."""
    return singular if count == 1 else plural_form or singular + "s"


def emit(tables: list[TableData], fmt: str, console: Console, out: TextIO | None = None) -> None:
    """Print ``tables``: on ``console`` as terminal tables, or to stdout in a machine format (one
    JSON document holding a list when there are several tables)."""
    if fmt == "table":
        for table in tables:
            console.print(table.rich(console.width), crop=False)
        return
    out = out or sys.stdout
    if fmt == "json":
        documents = [json.loads(table.json()) for table in tables]
        out.write(json.dumps(documents[0] if len(documents) == 1 else documents, indent=2) + "\n")
    elif fmt == "md":
        out.write("\n".join(f"### {table.title}\n\n{table.markdown()}" if len(tables) > 1 else table.markdown() for table in tables))
    else:
        out.write("\n".join(table.csv() for table in tables))
    out.flush()


def make_console(stderr: bool = False) -> Console:
    """A console of the terminal's width, else ``COLUMNS``, else 200 (logs and pipes)."""
    import os

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=200)


class Output:
    """A command's output: its tables (``table``) in the chosen format on stdout, and every other
    line (``print``) on stdout beside terminal tables, on stderr beside a machine format."""

    def __init__(self, fmt: str = "table"):
        self.format = fmt
        self.stdout = make_console()
        self.console = self.stdout if fmt == "table" else make_console(stderr=True)

    def print(self, *objects: Any, **options: Any) -> None:
        """A line of text: long lines are left to the terminal to wrap (never broken inside a word)."""
        self.console.print(*objects, **{"soft_wrap": True, **options})

    def table(self, *tables: TableData) -> None:
        emit(list(tables), self.format, self.stdout)
