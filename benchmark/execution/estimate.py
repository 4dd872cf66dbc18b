"""What a suite will cost before it starts: core-hours per run and the wall time with the workers given.

Each run's time comes, best first, from:

1. finished runs of the same configuration (algorithm, environment, hyperparameters), then of
   the same algorithm and environment, in the tracking store or in bundles: the median seconds
   per env step, evaluations included (a run trained in a batch of N seeds counts 1/N of its
   process's time);
2. the committed throughput table ``results/perf/throughput.csv`` (``python -m benchmark
   calibrate`` measures it: training steps/s and evaluation steps/s of each algorithm on each
   environment on one core): ``steps / train rate + evaluations x episodes x episode cap /
   evaluation rate`` (the episode cap bounds an evaluation from above);
3. the same algorithm on other environments in the table (marked rough).

A run with none of these is "unknown" and named, so the user can calibrate it. The wall time
deals the runs longest first to ``parallel`` slots, each to the first slot free; the local pool
takes them in suite order instead, so a suite that lists its longest runs first (as the ci
suite does) ends close to this figure. Seeds batched in one process count as one job of their
summed time.
"""

from __future__ import annotations

import csv
import datetime
import functools
import hashlib
import heapq
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agents.errors import ConfigError
from benchmark.config import PROJECT_ROOT, RunSpec
from benchmark.tables import plural

THROUGHPUT_FILE = PROJECT_ROOT / "results" / "perf" / "throughput.csv"
THROUGHPUT_COLUMNS = ("algo", "env_id", "train_steps_per_second", "eval_steps_per_second", "cpu_model", "torch", "steps", "measured")


@dataclass(frozen=True)
class Throughput:
    """One calibrated (algorithm, environment) pair on one core."""

    algo: str
    env_id: str
    train_steps_per_second: float
    eval_steps_per_second: float
    cpu_model: str = ""
    torch: str = ""
    steps: int = 0
    measured: str = ""


@dataclass(frozen=True)
class PastRun:
    """What a finished run tells about speed: its configuration and seconds per env step."""

    algo: str
    env_id: str
    config_key: str
    """Hyperparameters and budget (not the seed): runs of one configuration share it."""
    seconds_per_step: float


@dataclass(frozen=True)
class RunEstimate:
    spec: RunSpec
    seconds: float | None
    """Core-seconds (a CPU run uses one core) or GPU-seconds; None when unknown."""
    basis: str
    """Where the figure comes from: 'finished runs (n, same configuration)', 'calibrated', ..."""


@dataclass
class Estimate:
    runs: list[RunEstimate] = field(default_factory=list)
    parallel: int = 1
    wall_seconds: float = 0.0
    """With ``parallel`` slots, longest job first, over the runs with a known time."""

    @property
    def known_seconds(self) -> float:
        return sum(r.seconds for r in self.runs if r.seconds is not None)

    @property
    def unknown(self) -> list[RunEstimate]:
        return [r for r in self.runs if r.seconds is None]

    @property
    def gpu(self) -> bool:
        return any(r.spec.device.startswith("cuda") for r in self.runs)


def config_key(params: dict[str, object]) -> str:
    """What runs of one configuration share, from their MLflow params (``tracking.child_params``:
    the algorithm, environment, budget and hyperparameters) without the seed and suite; values
    compared as MLflow stores them, as text."""
    kept = {key: str(value) for key, value in params.items() if key not in ("seed", "suite")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def load_throughput(path: Path = THROUGHPUT_FILE) -> dict[tuple[str, str], Throughput]:
    """(algo, env_id) -> calibrated throughput; {} when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return {}
    return _load_throughput(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _load_throughput(path: Path, modified: int) -> dict[tuple[str, str], Throughput]:
    table = {}
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in THROUGHPUT_COLUMNS[:4] if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path} lacks the column(s) {', '.join(missing)}; restore it with git checkout or re-run calibrate")
        for number, row in enumerate(reader, start=2):
            try:
                entry = Throughput(
                    row["algo"],
                    row["env_id"],
                    float(row["train_steps_per_second"]),
                    float(row["eval_steps_per_second"]),
                    row.get("cpu_model", ""),
                    row.get("torch", ""),
                    int(row.get("steps") or 0),
                    row.get("measured", ""),
                )
            except (TypeError, ValueError) as error:
                raise ConfigError(f"{path}, row {number}: {error}; restore it with git checkout or re-run calibrate") from None
            if entry.train_steps_per_second <= 0 or entry.eval_steps_per_second <= 0:
                raise ConfigError(f"{path}, row {number}: steps per second must be positive")
            table[(entry.algo, entry.env_id)] = entry
    return table


def save_throughput(entries: Iterable[Throughput], path: Path = THROUGHPUT_FILE) -> None:
    """Insert or replace rows by (algo, env_id); rows stay sorted; the file is replaced atomically."""
    path = Path(path)
    table = dict(load_throughput(path)) if path.exists() else {}
    for entry in entries:
        table[(entry.algo, entry.env_id)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(THROUGHPUT_COLUMNS)
        for key in sorted(table):
            e = table[key]
            writer.writerow(
                [
                    e.algo,
                    e.env_id,
                    f"{e.train_steps_per_second:.1f}",
                    f"{e.eval_steps_per_second:.1f}",
                    e.cpu_model,
                    e.torch,
                    e.steps,
                    e.measured or datetime.date.today().isoformat(),
                ]
            )
    temporary.replace(path)


@functools.lru_cache(maxsize=64)
def episode_cap(env_id: str) -> int:
    """The env's time limit (steps per episode at most); 1000 when gymnasium does not say."""
    import gymnasium as gym

    from agents.envs import registered_id

    try:
        return int(gym.spec(registered_id(env_id)).max_episode_steps or 1000)
    except Exception:  # noqa: BLE001 - an id gymnasium does not know (a task family): a generous guess
        return 1000


def evaluation_steps(spec: RunSpec) -> int:
    """Env steps the evaluations take at most: (total // every + 1) evaluations x episodes x cap
    (the suite's ``env_kwargs`` may set the cap)."""
    evaluations = spec.budget.total_steps // spec.budget.eval_every + 1
    cap = spec.env_kwargs.get("max_episode_steps")
    cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else episode_cap(spec.env_id)
    return evaluations * spec.budget.eval_episodes * cap


def seconds_from_throughput(spec: RunSpec, rate: Throughput) -> float:
    return spec.budget.total_steps / rate.train_steps_per_second + evaluation_steps(spec) / rate.eval_steps_per_second


def estimate_run(spec: RunSpec, past: list[PastRun], table: dict[tuple[str, str], Throughput], key: str = "") -> RunEstimate:
    """One run's seconds, from the best source available (see the module docstring); ``key``:
    its ``config_key``."""
    same_config = [p.seconds_per_step for p in past if key and p.config_key == key]
    if same_config:
        return RunEstimate(
            spec,
            statistics.median(same_config) * spec.budget.total_steps,
            f"{len(same_config)} finished {plural(len(same_config), 'run')} of this configuration",
        )
    same_pair = [p.seconds_per_step for p in past if p.algo == spec.algo and p.env_id == spec.env_id]
    if same_pair:
        return RunEstimate(
            spec,
            statistics.median(same_pair) * spec.budget.total_steps,
            f"{len(same_pair)} finished {plural(len(same_pair), 'run')} of {spec.algo} on {spec.env_id}",
        )
    rate = table.get((spec.algo, spec.env_id))
    if rate is not None:
        return RunEstimate(spec, seconds_from_throughput(spec, rate), f"calibrated {rate.measured or ''}".strip())
    others = [r for (algo, _), r in table.items() if algo == spec.algo]
    if others:
        train = statistics.median(r.train_steps_per_second for r in others)
        evaluation = statistics.median(r.eval_steps_per_second for r in others)
        rough = Throughput(spec.algo, spec.env_id, train, evaluation)
        return RunEstimate(spec, seconds_from_throughput(spec, rough), f"rough: {spec.algo} on {len(others)} other {plural(len(others), 'env')}")
    return RunEstimate(spec, None, "unknown")


def makespan(jobs: list[float], parallel: int) -> float:
    """Wall time of ``jobs`` (seconds) on ``parallel`` slots, longest first to the freest slot."""
    if not jobs:
        return 0.0
    slots = [0.0] * max(1, min(parallel, len(jobs)))
    for job in sorted(jobs, reverse=True):
        heapq.heappush(slots, heapq.heappop(slots) + job)
    return max(slots)


def estimate(
    processes: list[list[RunSpec]],
    parallel: int,
    past: list[PastRun],
    table: dict[tuple[str, str], Throughput] | None = None,
    keys: dict[str, str] | None = None,
    remaining: dict[str, float] | None = None,
) -> Estimate:
    """The estimate for training ``processes`` (the runner's plan: seeds batched in one process
    form one job) with ``parallel`` processes at once. ``keys``: run key -> ``config_key``;
    ``remaining``: run key -> the share of its steps still to train (a run resuming halfway: 0.5)."""
    table = load_throughput() if table is None else table
    keys, remaining = keys or {}, remaining or {}
    result = Estimate(parallel=parallel)
    jobs = []
    for group in processes:
        estimates = []
        for spec in group:
            found = estimate_run(spec, past, table, keys.get(spec.run_key, ""))
            share = remaining.get(spec.run_key, 1.0)
            if found.seconds is not None and share != 1.0:
                found = RunEstimate(spec, found.seconds * share, found.basis)
            estimates.append(found)
        result.runs += estimates
        known = [e.seconds for e in estimates if e.seconds is not None]
        if known:
            jobs.append(sum(known))
    result.wall_seconds = makespan(jobs, parallel)
    return result


def hours(seconds: float) -> str:
    """'3.2 h', '45 min', '20 s', '12.5 days'."""
    if seconds >= 48 * 3600:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
