"""Published reference scores, random-policy scores, and the normalized score built from them.

``results/reference/scores.csv`` holds every published number with its source (built from
the shared reference table, every source column kept) plus four derived columns:

- ``env``: the task without its version (``HalfCheetah-v3`` -> ``HalfCheetah``), since the
  sources used gym v1-v4 and we run Gymnasium v5; the report names the version compared.
- ``algorithm``: our registry name when the row is one of our algorithms (``ppo``, ``sac``...).
- ``protocol``: how the number was measured, in our order of preference for a reference:
  ``final_eval`` (a deterministic evaluation of the final policy: ours), ``training_return``
  (episodes of the training policy near the end), ``max_eval`` (the best evaluation during
  training: optimistic), ``approx_plot`` (read off a plot), and ``random`` / ``expert`` rows.
- ``approximate``: ``true`` where the source marked the value ``~``.

``results/reference/additions.csv`` holds the published numbers this project added to the shared
table (the source columns, each row with its source and address: e.g. Tianshou's per-seed
curves read at 300k steps, for the reduced-budget off-policy record); ``reference build``
appends them.

``results/reference/per_seed.csv`` holds the per-seed values behind some published rows (one
row per source row, env step and seed: Tianshou's per-seed curves around 300k steps), so that
a verdict resamples the source's seeds instead of assuming a normal spread.

``results/reference/random.csv`` holds uniform-random-policy returns measured by this suite on
the exact environment versions it runs (``python -m benchmark reference random``).

A normalized score is ``(score - random) / (reference - random)``: 0 is the random policy,
1 the reference. One reference per task serves every algorithm, so aggregates across
algorithms compare like with like (as rliable does with one human score per Atari game):
the best published score of the most comparable tier: multi-seed final evaluations, then
multi-seed training returns, then single-agent final evaluations, then maxima over training,
then plot readings (see ``_rank``).
"""

from __future__ import annotations

import csv
import datetime
import functools
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from agents.errors import ConfigError
from benchmark.config import PROJECT_ROOT

REFERENCE_DIR = PROJECT_ROOT / "results" / "reference"
SHARED_SCORES = PROJECT_ROOT.parent / "shared" / "reference" / "scores.csv"
ADDED_SCORES = REFERENCE_DIR / "additions.csv"
SOURCE_COLUMNS = ("source", "source_url", "algo", "env_id", "budget_steps", "metric", "mean", "spread", "spread_kind", "n_seeds", "notes")
DERIVED_COLUMNS = ("env", "env_version", "algorithm", "protocol", "approximate")
RANDOM_COLUMNS = ("env_id", "episodes", "mean", "std", "seed", "gymnasium", "mujoco", "measured")
PROTOCOL_PREFERENCE = ("final_eval", "training_return", "max_eval", "approx_plot")

# Published algorithm names (the text before any parenthesis) -> our registry names.
_ALGORITHMS = {"A2C": "a2c", "DDPG": "ddpg", "DQN": "dqn", "PPO": "ppo", "SAC": "sac", "TD3": "td3", "TRPO": "trpo", "REINFORCE": "reinforce"}


@dataclass(frozen=True)
class ReferenceScore:
    """One published number."""

    source: str
    source_url: str
    algo: str
    env_id: str
    budget_steps: int | None
    metric: str
    mean: float
    spread: float | None
    n_seeds: int | None
    env: str
    env_version: str
    algorithm: str
    protocol: str
    approximate: bool
    spread_kind: str = ""
    """What ``spread`` is, as the source says: 'std across seeds (numpy, ddof=0)', 'std over evaluation episodes (one agent)'..."""

    @property
    def multi_seed(self) -> bool:
        """Aggregated over at least 3 independent runs (the SB3 Zoo rows are one trained agent)."""
        return (self.n_seeds or 0) >= 3 or ">=3 seeds" in self.metric

    @property
    def citation(self) -> str:
        """Short form for tables: value, source, env version, protocol."""
        approx = "~" if self.approximate else ""
        budget = f", {self.budget_steps / 1e6:g}M steps" if self.budget_steps else ""
        seeds = f", {self.n_seeds} seed{'s' if self.n_seeds != 1 else ''}" if self.n_seeds else ""
        return f"{approx}{self.mean:.1f} ({self.source}; {self.algo}, {self.env_id}{budget}{seeds}; {self.protocol})"


@dataclass(frozen=True)
class RandomScore:
    env_id: str
    episodes: int
    mean: float
    std: float
    seed: int


@dataclass(frozen=True)
class Normalizer:
    """(score - random) / (reference - random) for one environment; either part may be missing."""

    env_id: str
    random: RandomScore | None
    reference: ReferenceScore | None
    provisional: bool = False
    """Not (yet) fixed in ``normalizers.csv``: the rule's current choice, which a published score
    added later may move (``benchmark.analysis.normalizers``)."""

    @property
    def available(self) -> bool:
        return self.random is not None and self.reference is not None and self.reference.mean != self.random.mean

    def __call__(self, scores: np.ndarray | float) -> np.ndarray:
        if not self.available:
            raise ValueError(f"no normalization for {self.env_id}: {self.missing}")
        assert self.random is not None and self.reference is not None  # available: both known
        return (np.asarray(scores, dtype=float) - self.random.mean) / (self.reference.mean - self.random.mean)

    @property
    def missing(self) -> str:
        parts = []
        if self.reference is None:
            parts.append("no published reference score")
        if self.random is None:
            parts.append(f"no random score (python -m benchmark reference random --env {self.env_id})")
        return "; ".join(parts) or "reference equals random"


# ------------------------------------------------------------------------------------ derived


def env_family(env_id: str) -> str:
    """The task without version or annotation: 'HalfCheetah-v5' and 'HalfCheetah (gym -v2 class...)' -> 'HalfCheetah'."""
    name = env_id.split(" (")[0].strip()
    return re.sub(r"-v\d+$", "", name)


def env_version(env_id: str) -> str:
    match = re.search(r"-(v\d+)", env_id)
    return match.group(1) if match else ""


def algorithm_of(published: str) -> str:
    """Our registry name for a published algorithm label ('' when we do not implement it)."""
    if published.lower().startswith("random"):
        return "random"
    if published.lower().startswith("expert"):
        return "expert"
    head = published.split(" (")[0].strip()
    if "Spinning Up (VPG" in published:
        return "vpg"
    return _ALGORITHMS.get(head, "")


def protocol_of(metric: str, algorithm: str) -> str:
    text = metric.lower()
    if algorithm in ("random", "expert"):
        return algorithm
    if "approx" in text:
        return "approx_plot"
    if "max" in text:
        return "max_eval"
    if "deterministic" in text or "last 10 evaluations" in text or "final logged step" in text:
        return "final_eval"
    return "training_return"  # CleanRL, openrlbenchmark and the CleanRL paper: training episodes


def build(source: Path = SHARED_SCORES, destination: Path = REFERENCE_DIR / "scores.csv", additions: Path | None = ADDED_SCORES) -> int:
    """Write ``destination`` from the shared table and then our ``additions`` (when the file
    exists): every source column, plus the derived ones. The number of rows written.

    Every row is checked before anything is written, and the file is replaced atomically, so a
    malformed source never damages the table already there."""
    fields, rows = _source_rows(source, require_rows=True)
    if additions is not None and additions.exists():
        added_fields, added = _source_rows(additions, require_rows=False)
        if added_fields != fields:
            raise ConfigError(f"{additions}: its columns must be the shared table's ({', '.join(fields)}), got {', '.join(added_fields)}")
        for line, row in enumerate(added, start=2):
            if not row["source"] or not row["source_url"].startswith("http"):
                raise ConfigError(f"{additions}:{line}: every added score names its source and its address (http...)")
        rows += added
    destination.parent.mkdir(parents=True, exist_ok=True)
    temporary = destination.with_suffix(".tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*fields, *DERIVED_COLUMNS])
        writer.writeheader()
        for row in rows:
            algorithm = algorithm_of(row["algo"])
            approximate = "approx" in row["metric"].lower() or "approx" in row["notes"].lower()
            writer.writerow(
                {
                    **row,
                    "env": env_family(row["env_id"]),
                    "env_version": env_version(row["env_id"]),
                    "algorithm": algorithm,
                    "protocol": protocol_of(row["metric"], algorithm),
                    "approximate": str(approximate).lower(),
                }
            )
    temporary.replace(destination)
    return len(rows)


def _source_rows(path: Path, require_rows: bool) -> tuple[list[str], list[dict[str, str]]]:
    """A published-scores table's columns and rows, each row checked (its field count, a numeric mean)."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    missing = [column for column in SOURCE_COLUMNS if column not in fields]
    if missing:
        raise ConfigError(f"{path}: missing columns {', '.join(missing)}; expected {', '.join(SOURCE_COLUMNS)}")
    if require_rows and not rows:
        raise ConfigError(f"{path}: no rows")
    for line, row in enumerate(rows, start=2):
        if None in row or any(value is None for value in row.values()):
            raise ConfigError(f"{path}:{line}: expected {len(fields)} fields, the row has a different number")
        if _number(row["mean"]) is None:
            raise ConfigError(f"{path}:{line}: mean {row['mean']!r} is not a number")
    return fields, rows


# ------------------------------------------------------------------------------------ loading


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def load_scores(path: Path = REFERENCE_DIR / "scores.csv") -> tuple[ReferenceScore, ...]:
    """Every published score with a numeric mean (cached until the file changes)."""
    if not path.exists():
        raise ConfigError(f"{path} does not exist; build it with: python -m benchmark reference build")
    return _load_scores(path, path.stat().st_mtime_ns)


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV table; ConfigError naming the file when it cannot be read as one."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ConfigError(f"cannot read {path} as a CSV table ({type(error).__name__}: {error}); restore it with git checkout") from None


def _malformed(path: Path, row_number: int, error: Exception) -> ConfigError:
    missing = f"no column {error}" if isinstance(error, KeyError) else str(error)
    return ConfigError(f"{path}, row {row_number}: {missing}; restore the file with git checkout")


@functools.lru_cache(maxsize=4)
def _load_scores(path: Path, modified: int) -> tuple[ReferenceScore, ...]:
    scores = []
    for number, row in enumerate(read_rows(path), start=2):
        try:
            mean = _number(row["mean"])
            if mean is None:
                continue
            budget, seeds = _number(row["budget_steps"]), _number(row["n_seeds"])
            scores.append(
                ReferenceScore(
                    source=row["source"],
                    source_url=row["source_url"],
                    algo=row["algo"],
                    env_id=row["env_id"],
                    budget_steps=int(budget) if budget else None,
                    metric=row["metric"],
                    mean=mean,
                    spread=_number(row["spread"]),
                    n_seeds=int(seeds) if seeds else None,
                    env=row["env"],
                    env_version=row["env_version"],
                    algorithm=row["algorithm"],
                    protocol=row["protocol"],
                    approximate=row["approximate"] == "true",
                    spread_kind=row.get("spread_kind", ""),
                )
            )
        except (KeyError, TypeError, ValueError) as error:
            raise _malformed(path, number, error) from None
    return tuple(scores)


PerSeed = dict[int, list[tuple[int, float]]]
"""Seed -> [(env step, return)] of one source row, sorted by step."""


def load_per_seed(path: Path = REFERENCE_DIR / "per_seed.csv") -> dict[tuple[str, str, str, int], PerSeed]:
    """(source, algo, env id, budget) of a published row -> its seeds' values ({} without the file)."""
    if not path.exists():
        return {}
    found: dict[tuple[str, str, str, int], PerSeed] = {}
    for number, row in enumerate(read_rows(path), start=2):
        try:
            key = (row["source"], row["algo"], row["env_id"], int(row["budget_steps"]))
            found.setdefault(key, {}).setdefault(int(row["seed"]), []).append((int(row["env_step"]), float(row["return"])))
        except (KeyError, TypeError, ValueError) as error:
            raise _malformed(path, number, error) from None
    for seeds in found.values():
        for values in seeds.values():
            values.sort()
    return found


def per_seed_of(score: ReferenceScore, table: dict[tuple[str, str, str, int], PerSeed] | None = None) -> PerSeed | None:
    """The seeds' values behind a published row, where ``per_seed.csv`` holds them."""
    table = load_per_seed() if table is None else table
    return table.get((score.source, score.algo, score.env_id, score.budget_steps or 0))


def load_random(path: Path = REFERENCE_DIR / "random.csv") -> dict[str, RandomScore]:
    """env id -> the measured random-policy score ({} when the file does not exist yet)."""
    if not path.exists():
        return {}
    scores = {}
    for number, row in enumerate(read_rows(path), start=2):
        try:
            scores[row["env_id"]] = RandomScore(row["env_id"], int(row["episodes"]), float(row["mean"]), float(row["std"]), int(row["seed"]))
        except (KeyError, TypeError, ValueError) as error:
            raise _malformed(path, number, error) from None
    return scores


def _rank(score: ReferenceScore) -> int:
    """Comparability tiers: a final evaluation over >= 3 seeds (as we measure), training
    returns over >= 3 seeds, a final evaluation of one agent (SB3 Zoo), the best evaluation
    during training (optimistic), values read off plots."""
    if score.protocol == "approx_plot" or score.approximate:
        return 4
    if score.protocol == "max_eval":
        return 3
    if score.protocol == "final_eval":
        return 0 if score.multi_seed else 2
    return 1 if score.multi_seed else 2


def _best(candidates: list[ReferenceScore]) -> ReferenceScore | None:
    """The most comparable tier first (see ``_rank``), then the highest score within it."""
    ranked = [score for score in candidates if score.protocol in PROTOCOL_PREFERENCE]
    if not ranked:
        return None
    return min(ranked, key=lambda s: (_rank(s), -s.mean))


def env_reference(env_id: str, scores: tuple[ReferenceScore, ...] | None = None) -> ReferenceScore | None:
    """The task's reference for normalization: the best published score of the most
    comparable tier (see ``_rank``), over every algorithm, any env version."""
    scores = load_scores() if scores is None else scores
    return _best([score for score in scores if score.env == env_family(env_id)])


def published_score(algo: str, env_id: str, scores: tuple[ReferenceScore, ...] | None = None) -> ReferenceScore | None:
    """The algorithm's own published score on the task, chosen by the same rule (None if no source has one)."""
    scores = load_scores() if scores is None else scores
    return _best([score for score in scores if score.env == env_family(env_id) and score.algorithm == algo])


def normalizer(env_id: str, reference_dir: Path = REFERENCE_DIR) -> Normalizer:
    random = load_random(reference_dir / "random.csv").get(env_id)
    return Normalizer(env_id, random, env_reference(env_id, load_scores(reference_dir / "scores.csv")))


# ------------------------------------------------------------------------------------ random policy


def measure_random(env_id: str, episodes: int = 100, seed: int = 0) -> RandomScore:
    """Return of uniformly random actions (``action_space.sample()``), ``episodes`` episodes,
    on the environment exactly as the suite makes it (same id, same time limit). On a meta-RL
    task family, episode i runs on held-out test task i (cycled): the meta-test's tasks."""
    import gymnasium as gym

    from agents.envs import check_env_id
    from agents.tasks import TaskSampler, is_task_family

    check_env_id(env_id)
    if episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {episodes}")
    env = gym.make(env_id)
    env.action_space.seed(seed)
    tasks = TaskSampler(env_id).test_tasks(episodes) if is_task_family(env) else []
    returns = []
    try:
        for episode in range(episodes):
            if tasks:
                cast(Any, env.unwrapped).set_task(tasks[episode % len(tasks)])  # a task family (is_task_family)
            env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return RandomScore(env_id, episodes, float(np.mean(returns)), float(np.std(returns)), seed)


def save_random(score: RandomScore, path: Path = REFERENCE_DIR / "random.csv") -> None:
    """Insert or replace the row of ``score.env_id``; rows stay sorted by env id."""
    rows: dict[str, dict[str, str]] = {}
    if path.exists():
        with path.open(newline="") as handle:
            rows = {row["env_id"]: row for row in csv.DictReader(handle)}

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return ""

    rows[score.env_id] = {
        "env_id": score.env_id,
        "episodes": str(score.episodes),
        "mean": f"{score.mean:.4f}",
        "std": f"{score.std:.4f}",
        "seed": str(score.seed),
        "gymnasium": version("gymnasium"),
        "mujoco": version("mujoco"),
        "measured": datetime.date.today().isoformat(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=RANDOM_COLUMNS)
        writer.writeheader()
        writer.writerows(rows[key] for key in sorted(rows))
    temporary.replace(path)
