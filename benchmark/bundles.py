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

The rows' columns and their schema versions: ``benchmark.bundle_rows``.

Plain CSV rather than MLflow's own formats: ``mlflow-export-import`` writes one directory of
JSON per run with MLflow's internal ids (400 runs: thousands of files, re-imported only
through MLflow), and MLflow has no export of its own beyond ``search_runs`` to a DataFrame.
A bundle is read with nothing but the standard library, diffs row by row in a pull request,
and holds exactly what the report and the verdicts need: see docs/results.md, "Result bundles".

A bundle may also carry its runs' trained agents (``export --with-weights``): each run's final
checkpoint (``final.pt``: networks, optimizer state, frozen observation normalization and the
run's spec; tensors and primitives only, read with ``weights_only``) as
``weights/<run_key>.pt``, listed with its SHA-256 under the manifest's ``weights``. Readers that
do not know the key ignore it, so the schema version stays; a weights file is checked against
its digest when it is used (``weights_bytes``) rather than on every read of the bundle, whose
reports never open it.

Floats are written with ``repr`` (shortest round-trip form), so a report built from a bundle
has the same numbers as one built from the store it was exported from.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmark.bundle_rows import (
    CURVE_COLUMNS,
    CURVES_FILE,
    PROVENANCE,
    READERS,
    RUN_COLUMNS,
    RUNS_FILE,
    SCHEMA_VERSION,
    BundledRun,
    BundleError,
    Evaluation,
    decode,
    encode,
)
from benchmark.results_layout import ResultsDir

__all__ = [
    "CURVE_COLUMNS",
    "CURVES_FILE",
    "FORMAT",
    "MANIFEST",
    "PROVENANCE",
    "RUN_COLUMNS",
    "RUNS_FILE",
    "SCHEMA_VERSION",
    "WEIGHTS_DIR",
    "Bundle",
    "BundledRun",
    "BundleError",
    "Evaluation",
    "Weights",
    "is_bundle",
    "merge",
    "merged_weights",
    "published_bundle",
    "published_directory",
    "read",
    "read_all",
    "sources",
    "weights_bytes",
    "weights_file",
    "write",
]

FORMAT = "reprorl-bundle"
MANIFEST = "manifest.json"
WEIGHTS_DIR = "weights"


@dataclass(frozen=True)
class Weights:
    """One run's final checkpoint file, as a bundle carries it (or as it is about to)."""

    path: Path
    sha256: str = ""
    """Its digest as the manifest records it ('' for a file not yet in a bundle)."""


@dataclass
class Bundle:
    suite: str
    runs: dict[str, BundledRun]
    """Run key -> run."""
    created: str = ""
    schema_version: int = SCHEMA_VERSION
    origin: str = ""
    weights: dict[str, Weights] = field(default_factory=dict)
    """Run key -> its final checkpoint, for the runs whose trained agent the bundle carries."""


# ------------------------------------------------------------------------------------ writing


def weights_file(run_key: str) -> str:
    """Where a run's weights lie inside a bundle."""
    return f"{WEIGHTS_DIR}/{run_key}.pt"


def write(bundle: Bundle, directory: Path) -> Path:
    """Write ``bundle`` to ``directory``, replacing what was there as a whole: the files are
    written beside it and swapped in, so a crash leaves the old bundle or the new one. Weights
    are copied from where ``bundle.weights`` says (which may be the bundle being replaced);
    one whose digest is known and no longer matches is refused."""
    runs = [bundle.runs[key] for key in sorted(bundle.runs)]
    files = encode(runs)
    digests = {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in files.items()}
    weights = {key: bundle.weights[key] for key in sorted(bundle.weights) if key in bundle.runs}
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; a bundle is for sharing
    try:
        listed = {}
        for key, source in weights.items():
            data = weights_bytes(source, key)
            listed[key] = {"file": weights_file(key), "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            files[weights_file(key)] = data
        manifest = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "suite": bundle.suite,
            "created": bundle.created or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "runs": len(runs),
            "files": digests,
            **({"weights": listed} if listed else {}),
        }
        files[MANIFEST] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        if listed:
            (staging / WEIGHTS_DIR).mkdir(mode=0o777 & ~umask)
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


def weights_bytes(weights: Weights, run_key: str) -> bytes:
    """The bytes of a run's weights file, checked against the digest its bundle recorded
    (BundleError, one line, when it was changed, cut short or cannot be read)."""
    try:
        data = Path(weights.path).read_bytes()
    except OSError as error:
        raise BundleError(f"the weights of run key {run_key} ({weights.path}) cannot be read: {error.strerror or error}") from None
    if weights.sha256 and hashlib.sha256(data).hexdigest() != weights.sha256:
        raise BundleError(f"bundle file {weights.path} does not match the checksum in its manifest: it was changed or cut short")
    return data


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
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(entry, dict) and isinstance(entry.get("sha256"), str) for entry in files.values()):
        raise BundleError(f"{manifest_path}: 'files' must map each data file's name to its {{\"sha256\": ...}} (it is {_shown(files)})")
    data = {}
    for name, expected in files.items():
        if name not in (RUNS_FILE, CURVES_FILE):
            raise BundleError(f"{manifest_path} lists {name!r} under 'files': a bundle's data files are {RUNS_FILE} and {CURVES_FILE}")
        path = directory / name
        try:
            data[name] = path.read_bytes()
        except OSError as error:
            raise BundleError(f"bundle file {path} cannot be read: {error.strerror or error}") from None
        if hashlib.sha256(data[name]).hexdigest() != expected["sha256"]:
            raise BundleError(f"bundle file {path} does not match the checksum in its manifest: it was changed or cut short")
    runs = decode(directory, data, version)
    if not isinstance(manifest.get("runs"), int) or len(runs) != manifest["runs"]:
        raise BundleError(f"bundle {directory}: the manifest says {manifest.get('runs')!r} runs, {RUNS_FILE} holds {len(runs)}")
    suite = manifest.get("suite")
    if not isinstance(suite, str) or not suite:
        raise BundleError(f"{manifest_path}: 'suite' must name the suite of its runs (it is {_shown(suite)})")
    strays = sorted({run.spec.suite for run in runs} - {suite})
    if strays:
        raise BundleError(f"bundle {directory}: its manifest names suite {suite!r}, but {RUNS_FILE} holds runs of suite {', '.join(map(repr, strays))}")
    keys = {run.run_key for run in runs}
    weights = _weights_listed(directory, manifest_path, manifest.get("weights", {}), keys)
    return Bundle(suite, {run.run_key: replace(run, origin=str(directory)) for run in runs}, str(manifest.get("created", "")), version, str(directory), weights)


def _shown(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _weights_listed(directory: Path, manifest_path: Path, listed: object, run_keys: set[str]) -> dict[str, Weights]:
    """The manifest's ``weights``, each entry checked for its form, its run and its file's size
    (the digest is checked when the file is used)."""
    if not isinstance(listed, dict):
        raise BundleError(f"{manifest_path}: 'weights' must map run keys to their weights file (it is {_shown(listed)})")
    weights = {}
    for key, entry in listed.items():
        if key not in run_keys:
            raise BundleError(f"{manifest_path} lists weights of run key {key!r}, which {RUNS_FILE} does not hold")
        formed = isinstance(entry, dict) and entry.get("file") == weights_file(key) and isinstance(entry.get("sha256"), str)
        if not (formed and isinstance(entry.get("bytes"), int)):
            raise BundleError(f'{manifest_path}: the weights of run key {key} must be {{"file": "{weights_file(key)}", "sha256": ..., "bytes": ...}}')
        path = directory / weights_file(key)
        size = path.stat().st_size if path.is_file() else None
        if size != entry["bytes"]:
            found = "is missing" if size is None else f"holds {size:,} bytes, the manifest says {entry['bytes']:,}"
            raise BundleError(f"bundle file {path} {found}: it was removed, changed or cut short")
        weights[key] = Weights(path, entry["sha256"])
    return weights


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


def merged_weights(bundles: Iterable[Bundle], run_keys: Iterable[str]) -> dict[str, Weights]:
    """For each of ``run_keys``, the weights of the first of ``bundles`` that carries them."""
    chosen: dict[str, Weights] = {}
    for bundle in bundles:
        for key, weights in bundle.weights.items():
            chosen.setdefault(key, weights)
    keys = set(run_keys)
    return {key: weights for key, weights in chosen.items() if key in keys}


def read_all(directories: Iterable[Path]) -> dict[str, BundledRun]:
    """Every run of the bundles in ``directories``, merged (see ``merge``)."""
    return merge(read(directory).runs.values() for directory in directories)


def published_directory(results_dir: Path, suite_name: str) -> Path:
    return ResultsDir(results_dir).bundle(suite_name)


def published_bundle(results_dir: Path, suite_name: str) -> Path | None:
    """The suite's published bundle as every command reads it: ``<results-dir>/published/<suite>``
    when it holds one, else the checkout's committed record (``results/published/<suite>``, so a
    ``--results-dir`` elsewhere still sees it), else None. Writers (``export``) keep to the
    results directory."""
    from benchmark.config import PROJECT_ROOT

    for directory in (published_directory(results_dir, suite_name), published_directory(PROJECT_ROOT / "results", suite_name)):
        if is_bundle(directory):
            return directory
    return None


def sources(results_dir: Path, suite_name: str, from_dirs: list[Path] | None, published: bool = True) -> list[Path]:
    """The bundles a command reads: ``--from`` ones, plus the suite's published bundle
    (``published_bundle``) when there is one (and ``published``)."""
    chosen = [Path(d) for d in from_dirs or []]
    default = published_bundle(results_dir, suite_name) if published else None
    if default is not None and all(d.resolve() != default.resolve() for d in chosen if d.exists()):
        chosen.append(default)
    return chosen
