"""Parity records: the files ``python -m benchmark parity`` writes, their statistics and tables.

A record (``results/parity/<algo>-<env>-<steps>.json``) holds one comparison's setting (both
libraries' arguments, the env, the budget, the evaluation episodes) and one entry per side and
seed (final return, per-episode returns, wall time, versions, machine). The comparison over the
seeds both sides finished, decided by the verdict rule (``benchmark.analysis.verdict_rule``)
across the table's rows:

* each side's mean with its 95% Student t interval over seeds;
* the difference with its 90% interval (Welch), the margin stated in advance (default ±0.2 in
  the task's normalized units, ``normalizers.csv``);
* **reproduced** when the 90% interval lies inside the margin (TOST at 5% each side) and no
  difference is shown; **above** / **below** when Welch's two-sided test rejects after Holm's
  correction over the table (beyond, within or across the margin);
  otherwise **inconclusive (needs N)**, N seeds a side deciding with 80% power at the observed
  spreads;
* on a task whose return is capped (CartPole, InvertedPendulum: ``scores.SUCCESS_THRESHOLDS``)
  the sides are compared as success rates (a seed succeeds when its final return reaches the
  threshold): Newcombe's interval, Fisher's exact test, a margin of ±0.2 in the rate.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.errors import ConfigError

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


def rows_to_decide(summaries: Sequence[dict[str, Any]], margin: float = MARGIN) -> list[Any]:
    """The verdict rule's rows of the summaries (success rates on capped tasks), both sides growable."""
    from benchmark.analysis import verdict_rule, verdicts

    rows = []
    for summary in summaries:
        ours, peer = summary.get("_ours_values") or [], summary.get("_peer_values") or []
        if len(ours) < 2 or len(peer) < 2:
            rows.append(verdict_rule.Row(None, None, None, "too few seeds: both sides need 2", reference_fixed=False))
            continue
        rows.append(verdicts.seeds_row(summary["env_id"], ours, peer, margin))
    return rows


def decide(summaries: list[dict[str, Any]], margin: float = MARGIN) -> list[dict[str, Any]]:
    """Each summary with its verdict, the table decided at once (Holm over its tested rows)."""
    from benchmark.analysis import verdict_rule

    decisions = verdict_rule.decide(rows_to_decide(summaries, margin))
    for summary, decision in zip(summaries, decisions):
        evidence = decision.evidence
        summary.update(
            margin_fraction=margin,
            margin=decision.margin.absolute if decision.margin is not None else None,
            margin_text=decision.margin.text() if decision.margin is not None else "—",
            verdict=decision.label if evidence is not None else "too few seeds",
            verdict_text=decision.text if evidence is not None else "too few seeds",
            test=decision.explanation() if evidence is not None else "; ".join(decision.notes),
            welch_p=evidence.p_value if evidence is not None else None,
            holm_p=decision.adjusted_p,
            difference_ci90=[evidence.low, evidence.high] if evidence is not None else None,
            rates=evidence.rate if evidence is not None else False,
            seeds_needed=decision.seeds_needed,
            decision=decision,
        )
    return summaries


def compare(ours: Sequence[float], peer: Sequence[float], margin: float = MARGIN, env_id: str = "") -> dict[str, Any]:
    """One comparison decided alone (a table of one row): ``ours`` against ``peer`` (per-seed final returns)."""
    out: dict[str, Any] = {"env_id": env_id, "ours": side_summary(ours), "peer": side_summary(peer), "_ours_values": list(ours), "_peer_values": list(peer)}
    out["difference"] = out["ours"]["mean"] - out["peer"]["mean"]
    return decide([out], margin)[0]


# ---------------------------------------------------------------- the record on disk


def record_path(directory: Path, algo: str, env_id: str, steps: int) -> Path:
    return directory / f"{algo}-{env_id}-{steps}.json"


def load_record(path: Path) -> dict[str, Any] | None:
    """A comparison file, or None when there is none; ConfigError naming a corrupt one."""

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
    """The comparison over the seeds both sides have finished, decided alone (``table_rows``
    decides a whole table at once)."""
    summary = _summary(record)
    return decide([summary], margin)[0] if summary["seeds"] else summary


def _summary(record: dict[str, Any]) -> dict[str, Any]:
    by_side = {side: {r["seed"]: r["final_return"] for r in record["runs"] if r["side"] == side} for side in SIDES}
    seeds = sorted(set(by_side["ours"]) & set(by_side["peer"]))
    versions = sorted({r["version"] for r in record["runs"] if r["side"] == "peer"})
    commits = sorted({(r.get("machine") or {}).get("git_sha", "")[:7] for r in record["runs"] if r["side"] == "ours" and r["seed"] in seeds} - {""})
    head = {
        **{key: record["setting"][key] for key in ("algo", "env_id", "steps", "episodes")},
        "seeds": seeds,
        "peer_version": ", ".join(versions),
        "commits": commits,
    }
    if not seeds:
        return {**head, "verdict": "no seed finished on both sides", "verdict_text": "no seed finished on both sides"}
    ours, peer = [by_side["ours"][s] for s in seeds], [by_side["peer"][s] for s in seeds]
    out = {**head, "ours": side_summary(ours), "peer": side_summary(peer), "_ours_values": ours, "_peer_values": peer}
    out["difference"] = out["ours"]["mean"] - out["peer"]["mean"]
    seconds = {side: [r["seconds"] for r in record["runs"] if r["side"] == side and r.get("seconds")] for side in SIDES}
    out["_seconds"] = sum(statistics.mean(values) for values in seconds.values()) if all(seconds.values()) else None
    return out


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
    "p, Holm-adjusted",
    "margin",
    "verdict",
)


def table_rows(directory: Path = PARITY_DIR, margin: float = MARGIN) -> list[dict[str, Any]]:
    """One summary per record file under ``directory`` (sorted by file name), the rows with
    seeds on both sides decided as one table."""
    summaries = [_summary(load_record(path)) for path in sorted(directory.glob("*.json"))]  # type: ignore[arg-type]
    decide([summary for summary in summaries if summary["seeds"]], margin)
    return summaries


def _interval(low_high: list[float] | None, mean: float | None = None) -> str:
    if low_high is None:
        return "—"
    low, high = low_high
    return f"{mean:,.0f} [{low:,.0f}, {high:,.0f}]" if mean is not None else f"[{low:,.0f}, {high:,.0f}]"


def _success(summary: dict[str, Any], side: str) -> str:
    from benchmark.analysis import scores

    threshold = scores.success_threshold(summary["env_id"])
    if threshold is None:
        return ""
    values = summary[f"_{side}_values"]
    return f"; {sum(value >= threshold for value in values)}/{len(values)} reach {threshold:g}"


def row_cells(summary: dict[str, Any]) -> list[str]:
    p = summary.get("holm_p")
    seeds = bool(summary["seeds"])
    if summary.get("rates") and summary.get("difference_ci90"):
        low, high = summary["difference_ci90"]
        difference = f"{summary['decision'].evidence.difference:+.2f} [{low:+.2f}, {high:+.2f}] (success rate)"
    elif summary.get("difference_ci90"):
        difference = f"{summary['difference']:+,.0f} {_interval(summary['difference_ci90'])}"
    else:
        difference = "—"
    return [
        summary["algo"],
        summary["env_id"],
        f"{summary['steps']:,}",
        str(len(summary["seeds"])),
        _interval(summary["ours"]["ci95"], summary["ours"]["mean"]) + _success(summary, "ours") if seeds else "—",
        _interval(summary["peer"]["ci95"], summary["peer"]["mean"]) + _success(summary, "peer") if seeds else "—",
        summary["peer_version"],
        difference,
        "—" if p is None else ("< 0.001" if p < 0.001 else f"{p:.3f}"),
        summary.get("margin_text", "—"),
        summary.get("verdict_text", summary["verdict"]),
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
            "holm_p",
            "margin",
            "margin_text",
            "verdict",
            "verdict_text",
            "seeds_needed",
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
                row["holm_p"],
                row["margin"],
                row["margin_text"],
                row["verdict"],
                row["verdict_text"],
                "" if row["seeds_needed"] is None else row["seeds_needed"],
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
