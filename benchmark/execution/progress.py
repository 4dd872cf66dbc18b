"""The grid's progress: a live table on a terminal, plain log lines elsewhere (CI, files).

Both show runs done / running / failed / total, each running run's env steps, steps per
second and latest evaluation return, and an ETA, re-estimated as runs progress: each
unfinished run's remaining env steps at the steps per second measured for runs of its work
(``estimate.work_key``: same algorithm, environment and work per step), else its share of the
plan's estimate (``estimate``: finished runs, calibration), else the mean measured rate; summed
and shared among the runs that train at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from benchmark.tables import TableData


@dataclass
class RunView:
    """One running run as the board shows it."""

    label: str
    total_steps: int
    started_at: float
    where: str = ""
    started_step: int = 0
    step: int = 0
    last_eval: float | None = None

    def steps_per_second(self, now: float) -> float | None:
        """Env steps per second of this attempt (a resumed run counts from its checkpoint)."""
        elapsed = now - self.started_at
        done = self.step - self.started_step
        return done / elapsed if elapsed > 0 and done > 0 else None


def format_duration(seconds: float) -> str:
    """'4m05s' or '2h13m'."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


class Board:
    """Collects run events from the executors and shows them.

    ``live``: a rich Live table (default when the console is a terminal); otherwise a line per
    run start and end, and a status line every ``status_every`` seconds.
    """

    def __init__(
        self,
        budgets: dict[str, int],
        console: Console,
        groups: dict[str, str] | None = None,
        live: bool | None = None,
        status_every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        estimated: dict[str, float] | None = None,
        parallel: int = 1,
    ) -> None:
        self.budgets = dict(budgets)  # run key -> total env steps, for every run to train
        self.groups = dict(groups or {})  # run key -> what its speed is like (its work key)
        self.rates: dict[str, float] = {}  # run key -> the env steps per second it reached
        self.estimated = dict(estimated or {})  # run key -> the plan's seconds for its whole budget
        self.most_parallel = max(1, min(parallel, len(self.budgets) or 1))
        self.console = console
        self.live_mode = console.is_terminal if live is None else live
        self.status_every = status_every
        self.clock = clock
        self.running: dict[str, RunView] = {}
        self.progress_of: dict[str, int] = {}  # env steps reached, for every run that started
        self.done = 0
        self.failed = 0
        self.away: dict[str, str] = {}  # run key -> who trains it (another launch)
        self.started_at = clock()
        self.started_ms = int(time.time() * 1000)  # wall clock, comparable with the store's times
        self._last_status = self.started_at
        self._live: Live | None = None

    # -- events -------------------------------------------------------------------------------

    def started(self, run_key: str, label: str, where: str = "", resumed_from: int = 0) -> None:
        self.away.pop(run_key, None)  # (a run taken over from another launch)
        self.running[run_key] = RunView(label, self.budgets.get(run_key, 0), self.clock(), where, resumed_from, resumed_from)
        self.most_parallel = max(self.most_parallel, len(self.running))
        self.progress_of[run_key] = resumed_from
        on = f" on {where}" if where else ""
        if resumed_from:
            self.log(f"resuming {label} from its checkpoint at env step {resumed_from:,}{on}")
        else:
            self.log(f"started {label}{on}")

    def progressed(self, run_key: str, step: int, last_eval: float | None) -> None:
        view = self.running.get(run_key)
        if view is None:
            return
        view.step, view.last_eval = step, last_eval
        self.progress_of[run_key] = step
        rate = view.steps_per_second(self.clock())
        if rate:
            self.rates[run_key] = rate

    def elsewhere(self, run_key: str, label: str, holder: str) -> None:
        """Another launch trains this run (this one waits for it, or leaves it)."""
        self.running.pop(run_key, None)
        if run_key not in self.away:
            self.away[run_key] = holder
            self.log(f"{label} is being trained by another launch ({holder})")

    def finished(self, run_key: str, label: str, ok: bool, line: str) -> None:
        self.running.pop(run_key, None)
        self.away.pop(run_key, None)
        reached = self.progress_of.get(run_key, 0)
        if ok:
            self.progress_of[run_key] = self.budgets.get(run_key, 0)
        else:  # its remaining steps are no longer work to do
            self.budgets[run_key] = reached
        self.done += ok
        self.failed += not ok
        self.log(line, style=None if ok else "red")

    # -- display ------------------------------------------------------------------------------

    def log(self, line: str, style: str | None = None, limit: int = 400) -> None:
        """One line (an error's newlines folded, and cut after ``limit`` characters)."""
        line = " ".join(line.split())
        if len(line) > limit:
            line = line[: limit - 1] + "…"
        self.console.print(line, highlight=False, soft_wrap=True, markup=False, style=style)

    def eta_seconds(self) -> float | None:
        """Seconds until every run is done (see the module docstring); None while nothing is
        measured or estimated."""
        by_group: dict[str, list[float]] = {}
        for key, rate in self.rates.items():
            by_group.setdefault(self.groups.get(key, ""), []).append(rate)
        overall = sum(self.rates.values()) / len(self.rates) if self.rates else None
        seconds = 0.0
        for key, total in self.budgets.items():
            remaining = total - self.progress_of.get(key, 0)
            if remaining <= 0:
                continue
            rates = by_group.get(self.groups.get(key, ""))
            if rates:
                seconds += remaining / (sum(rates) / len(rates))
            elif self.estimated.get(key) and total:
                seconds += self.estimated[key] * remaining / total
            elif overall:
                seconds += remaining / overall
            else:
                return None
        return seconds / self.most_parallel

    def counts(self) -> str:
        total = len(self.budgets)
        eta = self.eta_seconds()
        away = f"{len(self.away)} in another launch, " if self.away else ""
        return (
            f"{self.done + self.failed}/{total} done ({self.failed} failed), {len(self.running)} running, {away}"
            f"{total - self.done - self.failed - len(self.running) - len(self.away)} waiting; "
            f"elapsed {format_duration(self.clock() - self.started_at)}, ETA {format_duration(eta) if eta is not None else '?'}"
        )

    def table(self) -> Table:
        """The live view: the counts, and a row per running run (run labels never cut)."""
        data = TableData(
            self.counts(), ["run", "on", "env steps", "%", "steps/s", "last eval"], names={"run"}, right={"env steps", "%", "steps/s", "last eval"}
        )
        for view in self.running.values():
            rate = view.steps_per_second(self.clock())
            data.add(
                view.label,
                view.where,
                f"{view.step:,}/{view.total_steps:,}",
                f"{100 * view.step / max(view.total_steps, 1):.0f}",
                f"{rate:,.0f}" if rate else "-",
                f"{view.last_eval:.1f}" if view.last_eval is not None else "-",
            )
        table = data.rich(self.console.width)
        table.title_justify = "left"
        return table

    def status_line(self) -> str:
        parts = [self.counts()]
        for view in self.running.values():
            rate = view.steps_per_second(self.clock())
            parts.append(
                f"{view.label} {view.step:,}/{view.total_steps:,}"
                + (f" {rate:,.0f} steps/s" if rate else "")
                + (f" eval {view.last_eval:.1f}" if view.last_eval is not None else "")
            )
        return "; ".join(parts)

    def refresh(self) -> None:
        """Redraw the live table, or print a status line when ``status_every`` has passed."""
        if self._live is not None:
            self._live.update(self.table())
        elif self.clock() - self._last_status >= self.status_every:
            self._last_status = self.clock()
            self.log(self.status_line())

    def __enter__(self) -> Board:
        if self.live_mode:
            self._live = Live(self.table(), console=self.console, refresh_per_second=2, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
        self.log(self.counts())
