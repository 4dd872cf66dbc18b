"""Result bundles: a suite's finished runs as plain files that travel beyond one machine.

A bundle is a directory (committed ones live in ``results/published/<suite>/``):

- ``manifest.json``: format name, schema version, suite, when it was written, the runs it
  holds, and the SHA-256 of each data file (a file edited or cut short is refused);
- ``runs.csv``: one row per run, sorted by run key: the run key, algorithm, environment, seed,
  budget, every resolved hyperparameter (JSON), the final evaluation, wall time, steps/s,
  device, CPU/GPU model, git sha, package versions, and the MLflow run it came from;
- ``curves.csv.gz``: one row per evaluation (run key, env step, mean, std, every episode's
  return and length, space-separated, and the mean return and number of the training episodes
  that ended since the previous evaluation), sorted by run key and step; gzip without a
  timestamp, so the same runs always give the same bytes.

Schema versions: 1 had no training returns; 2 adds ``train_return_mean`` and
``train_episodes`` to the curves; 3 adds the runs' ``env_kwargs`` and ``wrappers`` (JSON, empty
where the env is made from its id alone) and ``continued_from`` (the run key a run continued,
empty for most); 4 adds ``train_return_last100`` and ``train_episodes_last100`` (the mean return
of the run's last 100 training episodes and how many there were: CleanRL's score; empty where
the run did not record them) and ``fingerprint`` (the behaviour fingerprint of the code that
trained the run, ``benchmark.training.fingerprint``; empty where unknown). Every version's
reader stays (``READERS``).

Plain CSV rather than MLflow's own formats: ``mlflow-export-import`` writes one directory of
JSON per run with MLflow's internal ids (400 runs: thousands of files, re-imported only
through MLflow), and MLflow has no export of its own beyond ``search_runs`` to a DataFrame.
A bundle is read with nothing but the standard library, diffs row by row in a pull request,
and holds exactly what the report and the verdicts need: see docs/results.md, "Result bundles".

Floats are written with ``repr`` (shortest round-trip form), so a report built from a bundle
has the same numbers as one built from the store it was exported from.
"""

from __future__ import annotations

import csv
import datetime
import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from agents.env_setup import parse_env_kwargs, parse_wrappers
from agents.errors import ConfigError
from benchmark.config import Budget, RunSpec, stored_hyperparameters

FORMAT = "reprorl-bundle"
SCHEMA_VERSION = 4
MANIFEST, RUNS_FILE, CURVES_FILE = "manifest.json", "runs.csv", "curves.csv.gz"
PUBLISHED_DIR = "published"
"""Under the results directory: ``published/<suite>/`` is read by default."""

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
)
RUN_COLUMNS_V3 = RUN_COLUMNS[:-3]
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


@dataclass
class Bundle:
    suite: str
    runs: dict[str, BundledRun]
    """Run key -> run."""
    created: str = ""
    schema_version: int = SCHEMA_VERSION
    origin: str = ""


# ------------------------------------------------------------------------------------ writing


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


def write(bundle: Bundle, directory: Path) -> Path:
    """Write ``bundle`` to ``directory``, replacing what was there as a whole: the files are
    written beside it and swapped in, so a crash leaves the old bundle or the new one."""
    runs = [bundle.runs[key] for key in sorted(bundle.runs)]
    files = {
        RUNS_FILE: _csv_text(RUN_COLUMNS, (_run_row(run) for run in runs)).encode(),
        CURVES_FILE: _gzip(_csv_text(CURVE_COLUMNS, (row for run in runs for row in _curve_rows(run))).encode()),
    }
    manifest = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "suite": bundle.suite,
        "created": bundle.created or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "runs": len(runs),
        "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in files.items()},
    }
    files[MANIFEST] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; a bundle is for sharing
    try:
        for name, data in files.items():
            (staging / name).write_bytes(data)
            with open(staging / name, "rb") as handle:
                os.fsync(handle.fileno())
        old = None
        if directory.exists():
            old = directory.parent / f".{directory.name}.old-{os.getpid()}"
            directory.rename(old)
        staging.rename(directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


# ------------------------------------------------------------------------------------ reading


def is_bundle(directory: Path) -> bool:
    return (Path(directory) / MANIFEST).is_file()


def read(directory: Path) -> Bundle:
    """The bundle in ``directory``; BundleError (one line naming the file) when it is not one,
    is damaged, or was written by a newer schema than this version reads."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BundleError(f"bundle {directory} does not exist (or is not a directory)")
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise BundleError(f"{directory} is not a result bundle: it has no {MANIFEST}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"bundle manifest {manifest_path} cannot be read: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{manifest_path} is not a reprorl bundle manifest (format {FORMAT!r} expected)")
    version = manifest.get("schema_version")
    if version not in READERS:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        raise BundleError(
            f"bundle {directory} has schema version {version!r}, "
            + ("newer than this reprorl reads: update reprorl" if newer else f"which this reprorl does not know (it reads {sorted(READERS)})")
        )
    data = {}
    for name, expected in dict(manifest.get("files") or {}).items():
        path = directory / name
        try:
            data[name] = path.read_bytes()
        except OSError as error:
            raise BundleError(f"bundle file {path} cannot be read: {error.strerror or error}") from None
        if hashlib.sha256(data[name]).hexdigest() != expected.get("sha256"):
            raise BundleError(f"bundle file {path} does not match the checksum in its manifest: it was changed or cut short")
    runs = READERS[version](directory, data)
    if len(runs) != manifest.get("runs"):
        raise BundleError(f"bundle {directory}: the manifest says {manifest.get('runs')} runs, {RUNS_FILE} holds {len(runs)}")
    suite = str(manifest.get("suite", ""))
    return Bundle(suite, {run.run_key: replace(run, origin=str(directory)) for run in runs}, str(manifest.get("created", "")), version, str(directory))


def _optional_float(text: str) -> float | None:
    return float(text) if text != "" else None


def _read_v1(directory: Path, data: dict[str, bytes]) -> list[BundledRun]:
    return _read_runs(directory, data, CURVE_COLUMNS_V1, RUN_COLUMNS_V2)


def _read_v2(directory: Path, data: dict[str, bytes]) -> list[BundledRun]:
    return _read_runs(directory, data, CURVE_COLUMNS, RUN_COLUMNS_V2)


def _read_v3(directory: Path, data: dict[str, bytes]) -> list[BundledRun]:
    return _read_runs(directory, data, CURVE_COLUMNS, RUN_COLUMNS_V3)


def _read_v4(directory: Path, data: dict[str, bytes]) -> list[BundledRun]:
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
    for number, row in enumerate(_dict_rows(data[RUNS_FILE].decode(), run_columns, directory / RUNS_FILE), start=2):
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
            runs.append(
                BundledRun(
                    spec,
                    float(row["final_return"]),
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
    missing = [name for name in columns if name not in (reader.fieldnames or [])]
    if missing:
        raise BundleError(f"{path} lacks the column(s) {', '.join(missing)}")
    return list(reader)


READERS = {1: _read_v1, 2: _read_v2, 3: _read_v3, 4: _read_v4}
"""Schema version -> reader; a reader stays when the schema moves on, so old bundles still read."""


# ------------------------------------------------------------------------------------ merging


def merge(runs_by_bundle: Iterable[Iterable[BundledRun]]) -> dict[str, BundledRun]:
    """The union by run key; the same run key with different results is refused, naming both."""
    merged: dict[str, BundledRun] = {}
    for runs in runs_by_bundle:
        for run in runs:
            known = merged.get(run.run_key)
            if known is None:
                merged[run.run_key] = run
            elif not known.same_result(run):
                raise BundleError(
                    f"run key {run.run_key} ({run.spec.label}) has different results in {known.describe()} "
                    f"and in {run.describe()}: keep one (export --replace, or remove the row from one bundle)"
                )
    return merged


def read_all(directories: Iterable[Path]) -> dict[str, BundledRun]:
    """Every run of the bundles in ``directories``, merged (see ``merge``)."""
    return merge(read(directory).runs.values() for directory in directories)


def published_directory(results_dir: Path, suite_name: str) -> Path:
    return Path(results_dir) / PUBLISHED_DIR / suite_name


def sources(results_dir: Path, suite_name: str, from_dirs: list[Path] | None, published: bool = True) -> list[Path]:
    """The bundles a command reads: ``--from`` ones, plus the suite's published bundle when it exists (and ``published``)."""
    chosen = [Path(d) for d in from_dirs or []]
    default = published_directory(results_dir, suite_name)
    if published and is_bundle(default) and all(d.resolve() != default.resolve() for d in chosen if d.exists()):
        chosen.append(default)
    return chosen
