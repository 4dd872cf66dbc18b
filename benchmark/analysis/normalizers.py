"""One fixed normalizer per task: ``results/reference/normalizers.csv``.

A normalized score is ``(score - random) / (reference - random)``: 0 is the random policy, 1 the
task's reference. Both numbers are chosen once per task and written to the table with their
source, so that a published score added later (``reference build``) or a random score measured
again never moves a normalized number already reported. The normalizer is not the comparison
reference of a verdict: a verdict judges against the algorithm's own published score, chosen
like with like (``verdicts.choose_published``); the normalizer only fixes the units (and the
margin, 0.2 normalized by default).

The table's rows were chosen by ``reference.env_reference`` (the best published score of the
most comparable tier, over every algorithm) from the published table as it stood before the
300k-step Tianshou values were added (``additions.csv``), and the random-policy returns of
``random.csv``. ``reference build`` and ``reference random`` add a row for a task that has none
(chosen by the same rule then) and never change one; a task without a row is normalized by the
rule's current choice, marked provisional.
"""

from __future__ import annotations

import csv
import datetime
from dataclasses import dataclass
from pathlib import Path

from agents.errors import ConfigError
from benchmark.analysis import reference
from benchmark.analysis.reference import Normalizer, RandomScore, ReferenceScore

COLUMNS = (
    "env_id",
    "random",
    "random_episodes",
    "reference",
    "source",
    "source_url",
    "algo",
    "reference_env_id",
    "budget_steps",
    "protocol",
    "n_seeds",
    "chosen",
)
FILE_NAME = "normalizers.csv"


@dataclass(frozen=True)
class Fixed:
    """One task's fixed normalizer, as the table holds it."""

    env_id: str
    random: float
    random_episodes: int
    reference: ReferenceScore
    chosen: str


def load(reference_dir: Path = reference.REFERENCE_DIR) -> dict[str, Fixed]:
    """env id -> its fixed normalizer ({} when the table does not exist)."""
    path = reference_dir / FILE_NAME
    if not path.exists():
        return {}
    fixed = {}
    for number, row in enumerate(reference.read_rows(path), start=2):
        try:
            budget, seeds = row["budget_steps"], row["n_seeds"]
            score = ReferenceScore(
                source=row["source"],
                source_url=row["source_url"],
                algo=row["algo"],
                env_id=row["reference_env_id"],
                budget_steps=int(budget) if budget else None,
                metric="the task's fixed normalizer",
                mean=float(row["reference"]),
                spread=None,
                n_seeds=int(seeds) if seeds else None,
                env=reference.env_family(row["reference_env_id"]),
                env_version=reference.env_version(row["reference_env_id"]),
                algorithm=reference.algorithm_of(row["algo"]),
                protocol=row["protocol"],
                approximate=False,
            )
            fixed[row["env_id"]] = Fixed(row["env_id"], float(row["random"]), int(row["random_episodes"]), score, row["chosen"])
        except (KeyError, TypeError, ValueError) as error:
            missing = f"no column {error}" if isinstance(error, KeyError) else str(error)
            raise ConfigError(f"{path}, row {number}: {missing}; restore the file with git checkout") from None
    return fixed


def normalizer(env_id: str, reference_dir: Path = reference.REFERENCE_DIR) -> Normalizer:
    """The task's normalizer: its fixed row, else the rule's current choice (``provisional``)."""
    row = load(reference_dir).get(env_id)
    if row is not None:
        return Normalizer(env_id, RandomScore(env_id, row.random_episodes, row.random, 0.0, 0), row.reference)
    chosen = reference.normalizer(env_id, reference_dir)
    return Normalizer(chosen.env_id, chosen.random, chosen.reference, provisional=True)


def fix_missing(reference_dir: Path = reference.REFERENCE_DIR, today: str | None = None) -> list[str]:
    """Add a row for every task with a measured random score and a published reference but no
    row yet (existing rows are never changed); the env ids added."""
    path = reference_dir / FILE_NAME
    rows = {key: _row_of(value) for key, value in load(reference_dir).items()}
    scores = reference.load_scores(reference_dir / "scores.csv")
    added = []
    for env_id, random in sorted(reference.load_random(reference_dir / "random.csv").items()):
        chosen = reference.env_reference(env_id, scores)
        if env_id in rows or chosen is None or chosen.mean == random.mean:
            continue
        rows[env_id] = _row_of(Fixed(env_id, random.mean, random.episodes, chosen, today or datetime.date.today().isoformat()))
        added.append(env_id)
    if added:
        temporary = path.with_suffix(".tmp")
        with temporary.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows[key] for key in sorted(rows))
        temporary.replace(path)
    return added


def _row_of(fixed: Fixed) -> dict[str, str]:
    score = fixed.reference
    return {
        "env_id": fixed.env_id,
        "random": f"{fixed.random:.4f}",
        "random_episodes": str(fixed.random_episodes),
        "reference": f"{score.mean:g}",
        "source": score.source,
        "source_url": score.source_url,
        "algo": score.algo,
        "reference_env_id": score.env_id,
        "budget_steps": str(score.budget_steps or ""),
        "protocol": score.protocol,
        "n_seeds": str(score.n_seeds or ""),
        "chosen": fixed.chosen,
    }
