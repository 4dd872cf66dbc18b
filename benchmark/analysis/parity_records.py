"""Parity records: the files ``python -m benchmark parity`` writes, their statistics and tables.

A record (``results/parity/<algo>-<env>-<steps>.json``) holds one comparison's setting (both
libraries' arguments, the env, the budget, the evaluation episodes) and one entry per side and
seed (final return, per-episode returns, wall time, versions, machine). The comparison over the
seeds both sides finished:

* each side's mean with its 95% Student t interval over seeds;
* Welch's t-test of the difference (two-sided);
* an equivalence verdict by two one-sided tests (TOST, 5% each): "equivalent" when the 90%
  interval of the difference of means lies inside +-``margin`` x |peer's mean| (default 20%);
  otherwise "ours higher" / "ours lower" when Welch's p < 0.05, else "inconclusive" (the data
  cannot tell: too few seeds for the spread).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# ConfigError (agents.api) is imported in the functions that raise it: importing agents starts torch,
# and the command line's parser reads this module (--help must not wait for torch).

PARITY_DIR = Path("results/parity")
MARGIN = 0.2
SIDES = ("ours", "peer")


# ---------------------------------------------------------------- statistics


def side_summary(returns: Sequence[float]) -> dict[str, Any]:
    """Mean, standard deviation and 95% t interval of one side's per-seed final returns."""
    from benchmark.analysis.stats import t_interval

    interval = t_interval(list(returns))
    return {"n": len(returns), "mean": interval.estimate, "std": statistics.stdev(returns) if len(returns) > 1 else 0.0, "ci95": [interval.low, interval.high]}


def compare(ours: Sequence[float], peer: Sequence[float], margin: float = MARGIN) -> dict[str, Any]:
    """Welch's test and the TOST equivalence verdict of ``ours`` against ``peer`` (per-seed
    final returns); the margin is ``margin`` x |mean of peer|."""
    out: dict[str, Any] = {"ours": side_summary(ours), "peer": side_summary(peer), "margin_fraction": margin}
    difference = out["ours"]["mean"] - out["peer"]["mean"]
    bound = margin * abs(out["peer"]["mean"])
    out.update(difference=difference, margin=bound)
    if len(ours) < 2 or len(peer) < 2:
        return {**out, "welch_p": None, "difference_ci90": None, "verdict": "too few seeds"}
    variance = statistics.variance(ours) / len(ours) + statistics.variance(peer) / len(peer)
    if variance == 0.0:
        p_value, low, high = (1.0 if difference == 0 else 0.0), difference, difference
    else:
        from scipy import stats

        standard_error = math.sqrt(variance)
        df = variance**2 / ((statistics.variance(ours) / len(ours)) ** 2 / (len(ours) - 1) + (statistics.variance(peer) / len(peer)) ** 2 / (len(peer) - 1))
        p_value = float(2 * stats.t.sf(abs(difference) / standard_error, df))
        half = float(stats.t.ppf(0.95, df)) * standard_error
        low, high = difference - half, difference + half
    if -bound < low and high < bound:
        verdict = "equivalent"
    elif p_value < 0.05:
        verdict = "ours higher" if difference > 0 else "ours lower"
    else:
        verdict = "inconclusive"
    return {**out, "welch_p": p_value, "difference_ci90": [low, high], "verdict": verdict}


# ---------------------------------------------------------------- the record on disk


def record_path(directory: Path, algo: str, env_id: str, steps: int) -> Path:
    return directory / f"{algo}-{env_id}-{steps}.json"


def load_record(path: Path) -> dict[str, Any] | None:
    """A comparison file, or None when there is none; ConfigError naming a corrupt one."""
    from agents.errors import ConfigError

    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("setting"), dict) or not isinstance(record.get("runs"), list):
            raise ValueError("no setting or runs")
        return record
    except (ValueError, OSError) as error:
        raise ConfigError(f"{path} is not a parity record ({error}); move it away to start over") from None


def save_run(path: Path, setting: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """Add (or replace) one side's seed in the record at ``path`` under a lock, atomically."""
    from filelock import FileLock

    from agents.errors import ConfigError

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        record = load_record(path) or {"setting": setting, "runs": []}
        if record["setting"] != setting:
            raise ConfigError(f"{path} holds another setting of {setting['algo']} on {setting['env_id']}; move it away to start over")
        record["runs"] = [r for r in record["runs"] if (r["side"], r["seed"]) != (run["side"], run["seed"])] + [run]
        record["runs"].sort(key=lambda r: (r["side"], r["seed"]))
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(temporary, path)
    return record


def summarize(record: dict[str, Any], margin: float = MARGIN) -> dict[str, Any]:
    """The comparison over the seeds both sides have finished."""
    by_side = {side: {r["seed"]: r["final_return"] for r in record["runs"] if r["side"] == side} for side in SIDES}
    seeds = sorted(set(by_side["ours"]) & set(by_side["peer"]))
    versions = sorted({r["version"] for r in record["runs"] if r["side"] == "peer"})
    head = {**{key: record["setting"][key] for key in ("algo", "env_id", "steps", "episodes")}, "seeds": seeds, "peer_version": ", ".join(versions)}
    if not seeds:
        return {**head, "verdict": "no seed finished on both sides"}
    return {**head, **compare([by_side["ours"][s] for s in seeds], [by_side["peer"][s] for s in seeds], margin)}


# ---------------------------------------------------------------- the table


TABLE_COLUMNS = (
    "algorithm",
    "environment",
    "steps",
    "seeds",
    "ours mean [95% CI]",
    "peer mean [95% CI]",
    "peer",
    "difference [90% CI]",
    "Welch p",
    "margin",
    "verdict",
)


def table_rows(directory: Path = PARITY_DIR, margin: float = MARGIN) -> list[dict[str, Any]]:
    """One summary per record file under ``directory`` (sorted by file name)."""
    return [summarize(load_record(path), margin) for path in sorted(directory.glob("*.json"))]  # type: ignore[arg-type]


def _interval(low_high: list[float] | None, mean: float | None = None) -> str:
    if low_high is None:
        return "—"
    low, high = low_high
    return f"{mean:,.0f} [{low:,.0f}, {high:,.0f}]" if mean is not None else f"[{low:,.0f}, {high:,.0f}]"


def row_cells(summary: dict[str, Any]) -> list[str]:
    p = summary["welch_p"]
    return [
        summary["algo"],
        summary["env_id"],
        f"{summary['steps']:,}",
        str(len(summary["seeds"])),
        _interval(summary["ours"]["ci95"], summary["ours"]["mean"]) if summary["seeds"] else "—",
        _interval(summary["peer"]["ci95"], summary["peer"]["mean"]) if summary["seeds"] else "—",
        summary["peer_version"],
        f"{summary['difference']:+,.0f} {_interval(summary['difference_ci90'])}" if summary["difference_ci90"] else "—",
        "—" if p is None else f"{p:.3f}",
        f"±{summary['margin']:,.0f} ({summary['margin_fraction']:.0%})",
        summary["verdict"],
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(row_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def csv_text(rows: list[dict[str, Any]]) -> str:
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(
        [
            "algo",
            "env_id",
            "steps",
            "episodes",
            "seeds",
            "ours_mean",
            "ours_ci_low",
            "ours_ci_high",
            "peer_mean",
            "peer_ci_low",
            "peer_ci_high",
            "peer",
            "difference",
            "difference_ci90_low",
            "difference_ci90_high",
            "welch_p",
            "margin",
            "verdict",
        ]
    )
    for row in rows:
        difference_ci = row["difference_ci90"] or [None, None]
        writer.writerow(
            [
                row["algo"],
                row["env_id"],
                row["steps"],
                row["episodes"],
                " ".join(map(str, row["seeds"])),
                row["ours"]["mean"],
                *row["ours"]["ci95"],
                row["peer"]["mean"],
                *row["peer"]["ci95"],
                row["peer_version"],
                row["difference"],
                *difference_ci,
                row["welch_p"],
                row["margin"],
                row["verdict"],
            ]
        )
    return stream.getvalue()


def write_tables(directory: Path = PARITY_DIR, margin: float = MARGIN) -> list[dict[str, Any]]:
    """Rewrite ``parity.md`` and ``parity.csv`` under ``directory`` from its records; the rows."""
    rows = [row for row in table_rows(directory, margin) if row["seeds"]]
    for name, text in (("parity.md", markdown(rows)), ("parity.csv", csv_text(rows))):
        temporary = directory / (name + ".tmp")
        temporary.write_text(text)
        os.replace(temporary, directory / name)
    return rows
