"""Regression checks: store a suite's final scores as a baseline, rerun it later, compare.

A rerun uses new seeds (the baseline's shifted by ``SEED_OFFSET``), so the check sees the same
seed-to-seed noise a user would; re-using the baseline's seeds on the same machine would give
identical numbers and hide it. Each (algorithm configuration, environment) is judged by the
verdict rule (``verdict_rule``) against the baseline's seeds, the margin (``min_effect``, in
normalized units) stated in advance: equivalent (the 90% interval of the difference inside the
margin), above / below (Welch's two-sided test rejects after Holm's correction over every row of
the check, so that the family-wise false-alarm rate stays at ``alpha`` however many rows the
suite has), or inconclusive. A **regression** is a row judged *below* whose drop is at least the
margin (so that a tiny but consistent shift does not fail a build).

A configuration whose runs fail (or finish fewer than two seeds) is a regression too.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.errors import ConfigError
from benchmark import provenance
from benchmark.analysis import normalizers, stats, verdict_rule
from benchmark.analysis.records import RunRecord
from benchmark.analysis.report import Group, group_records
from benchmark.config import PROJECT_ROOT, key_form

BASELINE_DIR = PROJECT_ROOT / "results" / "baselines"
BASELINE_FORMAT = 1
SEED_OFFSET = 100
DEFAULT_ALPHA = 0.05
DEFAULT_MIN_EFFECT = 0.1


def group_key(group: Group) -> str:
    return f"{group.label} @ {group.env_id}"


def baseline_payload(suite_name: str, records: list[RunRecord], parent_run_id: str | None = None) -> dict[str, Any]:
    """What ``make baseline`` stores: per configuration, each seed's final return, with the
    code version and package versions that produced them."""
    groups = []
    for group in group_records(records):
        spec = group.records[0].spec
        groups.append(
            {
                "key": group_key(group),
                "algo": group.algo,
                "env_id": group.env_id,
                "seeds": [r.spec.seed for r in group.records if r.finished],
                "scores": [r.final_return for r in group.records if r.finished],
                "failed": [r.spec.seed for r in group.records if not r.finished],
                "run_keys": [r.spec.run_key for r in group.records],
                "hyperparameters": spec.hyperparameters,
                "budget": spec.budget.__dict__,
            }
        )
    return {
        "format": BASELINE_FORMAT,
        "suite": suite_name,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "code": provenance.code_version(),
        "versions": provenance.environment_tags(),
        "mlflow_parent_run": parent_run_id,
        "groups": groups,
    }


def write_baseline(payload: dict[str, Any], path: Path) -> None:
    """Refuses a baseline with failed runs: it would make every later check meaningless."""
    failed = [f"{g['key']} seeds {g['failed']}" for g in payload["groups"] if g["failed"]]
    if failed:
        raise ConfigError("not writing a baseline with unfinished runs: " + "; ".join(failed))
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    temporary.replace(path)


def load_baseline(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"no baseline at {path}; create it with `make baseline` (python -m benchmark baseline)")
    try:
        payload = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as error:
        raise ConfigError(f"cannot read the baseline {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text, so not a reprorl baseline") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}") from None
    if not isinstance(payload, dict) or payload.get("format") != BASELINE_FORMAT or "groups" not in payload:
        raise ConfigError(f"{path}: not a reprorl baseline (format {BASELINE_FORMAT})")
    return payload


def regress_seeds(payload: dict[str, Any], offset: int = SEED_OFFSET) -> list[int]:
    """The baseline's seeds shifted by ``offset``: fresh seeds, as many as the baseline had."""
    seeds = sorted({seed for group in payload["groups"] for seed in group["seeds"]})
    return [seed + offset for seed in seeds]


@dataclass
class BaselineComparison:
    """One configuration of the check: its current seeds' scores against its baseline's, with the
    verdict rule's decision (``analysis.verdicts.Verdict`` is a configuration against a
    published score)."""

    key: str
    env_id: str
    baseline: list[float]
    current: list[float]
    scale: float
    """Return units per normalized unit: reference - random (or the baseline's distance from random)."""
    welch: stats.WelchResult | None = None
    decision: verdict_rule.Decision | None = None
    """The verdict rule's decision of the row (``welch`` holds the same test's figures)."""
    improvement: stats.Interval | None = None
    """P(current > baseline): a seed of the current code beating a seed of the baseline."""
    regressed: bool = False
    improved: bool = False
    note: str = ""

    @property
    def normalized_difference(self) -> float | None:
        return None if self.welch is None else self.welch.difference / self.scale

    def describe(self) -> str:
        baseline = f"{np.mean(self.baseline):.1f}" if self.baseline else "—"
        current = f"{np.mean(self.current):.1f}" if self.current else "—"
        if self.welch is None:
            return f"{self.key}: {self.note}"
        w = self.welch
        rule = f"; {self.decision.text}: {self.decision.explanation()}" if self.decision is not None else ""
        return (
            f"{self.key}: final return {baseline} -> {current} ({w.difference:+.1f}, {self.normalized_difference:+.2f} normalized; "
            f"95% CI of the difference [{w.low:+.1f}, {w.high:+.1f}]; P(current > baseline) = {self.improvement}{rule}){self.note}"
        )


def _scale(env_id: str, baseline: np.ndarray) -> float:
    normalizer = normalizers.normalizer(env_id)
    if normalizer.available:
        assert normalizer.reference is not None and normalizer.random is not None  # available: both known
        return abs(normalizer.reference.mean - normalizer.random.mean)
    if normalizer.random is not None and abs(baseline.mean() - normalizer.random.mean) > 0:
        return abs(baseline.mean() - normalizer.random.mean)
    return max(abs(float(baseline.mean())), 1.0)


def compare(
    payload: dict[str, Any],
    records: list[RunRecord],
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
    algos: list[str] | None = None,
    envs: list[str] | None = None,
) -> list[BaselineComparison]:
    """One verdict per configuration of the current runs, against the baseline's same key; and
    one per baseline configuration (of ``algos`` on ``envs``, None: all) that the current runs
    did not cover, which counts as a regression: a check that silently compares nothing (after
    a configuration was renamed or dropped, say) must not pass."""
    if not 0 < alpha < 1:
        raise ConfigError(f"--alpha must be in (0, 1), got {alpha}")
    if min_effect < 0:
        raise ConfigError(f"--min-effect must be >= 0, got {min_effect}")
    baseline_groups = {group["key"]: group for group in payload["groups"]}
    verdicts: list[BaselineComparison] = []
    for group in group_records(records):
        key = group_key(group)
        current = [float(s) for s in group.scores]
        base = baseline_groups.get(key)
        if base is None:
            verdicts.append(BaselineComparison(key, group.env_id, [], current, 1.0, note="not in the baseline (not compared)"))
            continue
        baseline = np.asarray(base["scores"], dtype=float)
        verdict = BaselineComparison(key, group.env_id, baseline.tolist(), current, _scale(group.env_id, baseline))
        unfinished = [r.spec.seed for r in group.records if not r.finished]
        spec = group.records[0].spec
        # both in the form run keys hash: a field renamed since the baseline is not a changed setting
        current_settings = {**key_form(spec.algo, spec.hyperparameters), **{f"budget.{k}": v for k, v in spec.budget.__dict__.items()}}
        baseline_settings = {**key_form(spec.algo, base["hyperparameters"]), **{f"budget.{k}": v for k, v in base["budget"].items()}}
        changed = sorted(k for k, v in current_settings.items() if baseline_settings.get(k) != v)
        if changed:
            verdict.note = (
                " [settings differ from the baseline's: " + ", ".join(f"{k} {baseline_settings.get(k)!r} -> {current_settings[k]!r}" for k in changed) + "]"
            )
        if unfinished:
            verdict.regressed = True
            verdict.note = f"runs did not finish (seeds {unfinished}: {group.status_counts})" + verdict.note
        if len(current) >= 2 and len(baseline) >= 2:
            verdict.welch = stats.welch_two_sided(current, baseline)
            verdict.improvement = stats.probability_of_improvement_interval({key: current}, {key: baseline.tolist()})
        elif not unfinished:
            verdict.note = "fewer than two seeds on one side (not compared)" + verdict.note
        verdicts.append(verdict)

    compared = {v.key for v in verdicts}
    for key, base in baseline_groups.items():
        selected = (algos is None or base["algo"] in algos) and (envs is None or base["env_id"] in envs)
        if selected and key not in compared:
            verdicts.append(
                BaselineComparison(
                    key,
                    base["env_id"],
                    list(base["scores"]),
                    [],
                    1.0,
                    regressed=True,
                    note="in the baseline but not run now (renamed or removed? re-create the baseline with make baseline)",
                )
            )

    tested = [v for v in verdicts if v.welch is not None]
    margin = max(min_effect, 1e-9)  # a margin of 0 (any significant drop counts) is the smallest positive one
    rows = [
        verdict_rule.Row(verdict_rule.Sample.of(v.current), verdict_rule.Sample.of(v.baseline), verdict_rule.Margin(margin, v.scale), reference_fixed=False)
        for v in tested
    ]
    for verdict, decision in zip(tested, verdict_rule.decide(rows, alpha)):
        verdict.decision = decision
        effect = decision.evidence.difference / verdict.scale if decision.evidence is not None else 0.0
        verdict.regressed = verdict.regressed or (decision.label == verdict_rule.BELOW and -effect >= min_effect)
        verdict.improved = not verdict.regressed and decision.label == verdict_rule.ABOVE and effect >= min_effect
    return verdicts
