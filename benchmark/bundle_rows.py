"""A bundle's rows: ``runs.csv`` (one row per run) and ``curves.csv.gz`` (one row per
evaluation), their columns in every schema version, and the runs they hold (``BundledRun``).
``benchmark.bundles`` puts them in a directory with their manifest.

Schema versions: 1 had no training returns; 2 adds ``train_return_mean`` and
``train_episodes`` to the curves; 3 adds the runs' ``env_kwargs`` and ``wrappers`` (JSON, empty
where the env is made from its id alone) and ``continued_from`` (the run key a run continued,
empty for most); 4 adds ``train_return_last100`` and ``train_episodes_last100`` (the mean return
of the run's last 100 training episodes and how many there were: CleanRL's score; empty where
the run did not record them) and ``fingerprint`` (the behaviour fingerprint of the code that
trained the run, ``benchmark.training.fingerprint``; empty where unknown); 5 adds
``cpu_seconds`` (CPU time of the process that trained the run, shared by a batch's seeds; empty
where not recorded: what cost estimates are checked against). Every version's reader stays
(``READERS``).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agents.env_setup import parse_env_kwargs, parse_wrappers
from agents.errors import ConfigError
from benchmark.config import Budget, RunSpec, stored_hyperparameters

SCHEMA_VERSION = 5
RUNS_FILE, CURVES_FILE = "runs.csv", "curves.csv.gz"

RUN_COLUMNS = (
    "run_key",
    "suite",
    "algo",
    "env_id",
    "seed",
    "total_steps",
    "eval_every",
    "eval_episodes",
    "final_return",
    "final_return_std",
    "pre_adaptation_return",
    "wall_seconds",
    "steps_per_second",
    "device",
    "cpu_model",
    "gpu_model",
    "git_sha",
    "git_dirty",
    "python_version",
    "platform",
    "versions",
    "batch_seeds",
    "mlflow_run_id",
    "started",
    "ended",
    "hyperparameters",
    "overrides",
    "env_kwargs",
    "wrappers",
    "continued_from",
    "train_return_last100",
    "train_episodes_last100",
    "fingerprint",
    "cpu_seconds",
)
RUN_COLUMNS_V4 = RUN_COLUMNS[:-1]
"""Schema 4: no CPU seconds."""
RUN_COLUMNS_V3 = RUN_COLUMNS_V4[:-3]
"""Schema 3: no training window or fingerprint."""
RUN_COLUMNS_V2 = RUN_COLUMNS_V3[:-3]
"""Schemas 1 and 2: no env_kwargs, wrappers or continued_from (envs made from the id alone, no run continued)."""
CURVE_COLUMNS = ("run_key", "step", "mean", "std", "returns", "lengths", "train_return_mean", "train_episodes")
CURVE_COLUMNS_V1 = CURVE_COLUMNS[:6]
PROVENANCE = ("cpu_model", "gpu_model", "git_sha", "git_dirty", "python_version", "platform")


class BundleError(ConfigError):
    """A bundle that cannot be read or merged as it is (bad input: nothing is changed)."""


@dataclass(frozen=True)
class Evaluation:
    """One deterministic evaluation of a run."""

    step: int
    """Env steps trained when it was made."""
    mean: float
    std: float
    returns: tuple[float, ...] = ()
    """Each episode's undiscounted return."""
    lengths: tuple[int, ...] = ()
    """Each episode's length in env steps."""
    train_return_mean: float | None = None
    """Mean return of the training episodes that ended since the previous evaluation (None: none
    did, or a schema-1 bundle)."""
    train_episodes: int = 0


@dataclass(frozen=True)
class BundledRun:
    """One finished run as a bundle holds it."""

    spec: RunSpec
    final_return: float
    final_return_std: float | None
    curve: tuple[Evaluation, ...]
    pre_adaptation_return: float | None = None
    wall_seconds: float | None = None
    steps_per_second: float | None = None
    device: str = ""
    provenance: dict[str, str] = field(default_factory=dict)
    """cpu_model, gpu_model, git_sha, git_dirty, python_version, platform."""
    versions: dict[str, str] = field(default_factory=dict)
    """Package -> version (torch, numpy, gymnasium, mujoco, mlflow, optuna)."""
    batch_seeds: tuple[int, ...] = ()
    """The seeds trained with it as one batched model; () when trained alone."""
    mlflow_run_id: str = ""
    started: str = ""
    ended: str = ""
    origin: str = ""
    """The bundle directory it was read from ('' when it came from a store)."""
    train_last100: tuple[float, int] | None = None
    """(mean return, episodes) of the run's last 100 training episodes, where it recorded them."""
    fingerprint: str = ""
    """The behaviour fingerprint of the code that trained it ('' unknown)."""
    cpu_seconds: float | None = None
    """CPU seconds of the process that trained it (shared by a batch's seeds); None where not recorded."""

    @property
    def run_key(self) -> str:
        return self.spec.run_key

    def same_result(self, other: BundledRun) -> bool:
        """The same numbers: final evaluation and every evaluation of the curve."""
        return self.final_return == other.final_return and [(e.step, e.mean, e.returns) for e in self.curve] == [
            (e.step, e.mean, e.returns) for e in other.curve
        ]

    def describe(self) -> str:
        where = self.origin or "the tracking store"
        return f"{where} (final {self.final_return!r}, MLflow run {self.mlflow_run_id or '?'})"


def encode(runs: list[BundledRun]) -> dict[str, bytes]:
    """The two data files of ``runs`` (in the order given), in the current schema."""
    return {
        RUNS_FILE: _csv_text(RUN_COLUMNS, (_run_row(run) for run in runs)).encode(),
        CURVES_FILE: _gzip(_csv_text(CURVE_COLUMNS, (row for run in runs for row in _curve_rows(run))).encode()),
    }


def _number(value: float | int | None) -> str:
    return "" if value is None else repr(value)


def _run_row(run: BundledRun) -> dict[str, str]:
    spec = run.spec
    return {
        "run_key": spec.run_key,
        "suite": spec.suite,
        "algo": spec.algo,
        "env_id": spec.env_id,
        "seed": str(spec.seed),
        "total_steps": str(spec.budget.total_steps),
        "eval_every": str(spec.budget.eval_every),
        "eval_episodes": str(spec.budget.eval_episodes),
        "final_return": _number(run.final_return),
        "final_return_std": _number(run.final_return_std),
        "pre_adaptation_return": _number(run.pre_adaptation_return),
        "wall_seconds": _number(run.wall_seconds),
        "steps_per_second": _number(run.steps_per_second),
        "device": run.device,
        **{name: run.provenance.get(name, "") for name in PROVENANCE},
        "versions": json.dumps(run.versions, sort_keys=True),
        "batch_seeds": " ".join(map(str, run.batch_seeds)),
        "mlflow_run_id": run.mlflow_run_id,
        "started": run.started,
        "ended": run.ended,
        "hyperparameters": json.dumps(spec.hyperparameters, sort_keys=True, separators=(",", ":")),
        "overrides": json.dumps(spec.overrides, sort_keys=True, separators=(",", ":")),
        "env_kwargs": json.dumps(spec.env_kwargs, sort_keys=True, separators=(",", ":")) if spec.env_kwargs else "",
        "wrappers": json.dumps(spec.wrappers, sort_keys=True, separators=(",", ":")) if spec.wrappers else "",
        "continued_from": spec.continued_from or "",
        "train_return_last100": _number(run.train_last100[0]) if run.train_last100 else "",
        "train_episodes_last100": str(run.train_last100[1]) if run.train_last100 else "",
        "fingerprint": run.fingerprint,
        "cpu_seconds": _number(run.cpu_seconds),
    }


def _csv_text(columns: tuple[str, ...], rows: Iterable[dict[str, str]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _curve_rows(run: BundledRun) -> Iterable[dict[str, str]]:
    for evaluation in run.curve:
        yield {
            "run_key": run.run_key,
            "step": str(evaluation.step),
            "mean": repr(evaluation.mean),
            "std": repr(evaluation.std),
            "returns": " ".join(map(repr, evaluation.returns)),
            "lengths": " ".join(map(str, evaluation.lengths)),
            "train_return_mean": _number(evaluation.train_return_mean),
            "train_episodes": str(evaluation.train_episodes),
        }


def _gzip(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as handle:
        handle.write(data)
    return buffer.getvalue()


def decode(directory: Path, data: dict[str, bytes], version: int) -> list[BundledRun]:
    """The runs of the two data files ``data`` holds, written in schema ``version`` (one of
    ``READERS``); BundleError naming the file and row of the first problem."""
    return READERS[version](directory, data)


def _optional_float(text: str) -> float | None:
    return float(text) if text != "" else None


def _read_v1(directory: Path, data: dict[str, bytes]) -> list[BundledRun]:
    return _read_runs(directory, data, CURVE_COLUMNS_V1, RUN_COLUMNS_V2)


def _read_v2(directory: Path, data: dict[str, bytes]) -> list[BundledRun]:
    return _read_runs(directory, data, CURVE_COLUMNS, RUN_COLUMNS_V2)


def _read_v3(directory: Path, data: dict[str, bytes]) -> list[BundledRun]:
    return _read_runs(directory, data, CURVE_COLUMNS, RUN_COLUMNS_V3)


def _read_v4(directory: Path, data: dict[str, bytes]) -> list[BundledRun]:
    return _read_runs(directory, data, CURVE_COLUMNS, RUN_COLUMNS_V4)


def _read_v5(directory: Path, data: dict[str, bytes]) -> list[BundledRun]:
    return _read_runs(directory, data, CURVE_COLUMNS, RUN_COLUMNS)


def _read_runs(directory: Path, data: dict[str, bytes], curve_columns: tuple[str, ...], run_columns: tuple[str, ...]) -> list[BundledRun]:
    for name in (RUNS_FILE, CURVES_FILE):
        if name not in data:
            raise BundleError(f"bundle {directory} lacks {name} in its manifest")
    curves: dict[str, list[Evaluation]] = {}
    try:
        text = gzip.decompress(data[CURVES_FILE]).decode()
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise BundleError(f"bundle file {directory / CURVES_FILE} is not gzip-compressed CSV: {error}") from None
    for number, row in enumerate(_dict_rows(text, curve_columns, directory / CURVES_FILE), start=2):
        try:
            curves.setdefault(row["run_key"], []).append(
                Evaluation(
                    int(row["step"]),
                    float(row["mean"]),
                    float(row["std"]),
                    tuple(float(v) for v in row["returns"].split()),
                    tuple(int(v) for v in row["lengths"].split()),
                    _optional_float(row.get("train_return_mean", "")),
                    int(row.get("train_episodes") or 0),
                )
            )
        except ValueError as error:
            raise BundleError(f"{directory / CURVES_FILE} row {number}: {error}") from None
    runs = []
    try:
        runs_text = data[RUNS_FILE].decode()
    except UnicodeDecodeError as error:
        raise BundleError(f"bundle file {directory / RUNS_FILE} is not UTF-8 text (byte {error.start})") from None
    for number, row in enumerate(_dict_rows(runs_text, run_columns, directory / RUNS_FILE), start=2):
        try:
            spec = RunSpec(
                suite=row["suite"],
                algo=row["algo"],
                env_id=row["env_id"],
                seed=int(row["seed"]),
                hyperparameters=stored_hyperparameters(row["algo"], json.loads(row["hyperparameters"])),
                budget=Budget(int(row["total_steps"]), int(row["eval_every"]), int(row["eval_episodes"])),
                overrides=json.loads(row["overrides"]),
                env_kwargs=parse_env_kwargs(json.loads(row.get("env_kwargs") or "{}")),
                wrappers=parse_wrappers(json.loads(row.get("wrappers") or "[]")),
                continued_from=row.get("continued_from") or None,
            )
            if spec.run_key != row["run_key"]:
                raise ValueError(
                    f"run key {row['run_key']} does not match the run's algorithm, environment, seed, "
                    f"hyperparameters and budget (they hash to {spec.run_key}): the row was edited"
                )
            final_return = float(row["final_return"])
            if not math.isfinite(final_return):
                raise ValueError(f"final_return is {row['final_return']!r}: a finished run's final evaluation is a finite number")
            runs.append(
                BundledRun(
                    spec,
                    final_return,
                    _optional_float(row["final_return_std"]),
                    tuple(sorted(curves.pop(row["run_key"], []), key=lambda e: e.step)),
                    _optional_float(row["pre_adaptation_return"]),
                    _optional_float(row["wall_seconds"]),
                    _optional_float(row["steps_per_second"]),
                    row["device"],
                    {name: row[name] for name in PROVENANCE},
                    json.loads(row["versions"]),
                    tuple(int(s) for s in row["batch_seeds"].split()),
                    row["mlflow_run_id"],
                    row["started"],
                    row["ended"],
                    train_last100=_train_window(row),
                    fingerprint=row.get("fingerprint") or "",
                    cpu_seconds=_optional_float(row.get("cpu_seconds") or ""),
                )
            )
        except (ValueError, TypeError, ConfigError) as error:
            raise BundleError(f"{directory / RUNS_FILE} row {number}: {error}") from None
    if curves:
        raise BundleError(f"{directory / CURVES_FILE} has evaluations of run key(s) not in {RUNS_FILE}: {', '.join(sorted(curves))}")
    return runs


def _train_window(row: dict[str, str]) -> tuple[float, int] | None:
    mean, episodes = row.get("train_return_last100") or "", row.get("train_episodes_last100") or ""
    return (float(mean), int(episodes)) if mean and episodes else None


def _dict_rows(text: str, columns: tuple[str, ...], path: Path) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    try:
        missing = [name for name in columns if name not in (reader.fieldnames or [])]
        if missing:
            raise BundleError(f"{path} lacks the column(s) {', '.join(missing)}")
        return list(reader)
    except csv.Error as error:
        raise BundleError(f"{path} is not valid CSV (line {reader.line_num}): {error}") from None


READERS = {1: _read_v1, 2: _read_v2, 3: _read_v3, 4: _read_v4, 5: _read_v5}
"""Schema version -> reader; a reader stays when the schema moves on, so old bundles still read."""
