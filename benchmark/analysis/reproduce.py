"""``python -m benchmark reproduce RUN_ID``: train a recorded run again from its recorded config
and compare the numbers.

The child run's ``config.json`` artifact is the complete RunSpec (algorithm, environment,
seed, every resolved hyperparameter, budget), so the run is repeated exactly. On the same CPU
with the same package versions every evaluation must match bit for bit; otherwise the
differences are listed, beside the recorded and current versions that may explain them.

A run a result bundle holds (named by its run key or MLflow run id) is trained again from the
bundle's row and compared with the bundle's evaluations.

A run trained in a batch of seeds (tag ``batch_seeds``) is trained again in the same batch:
batched matrix products round differently from single ones, so only the same batch repeats
its numbers bit for bit.

Bit-exactness holds on one CPU type at one commit. So a reproduction says two things:

- **at today's code** (the default): bit-identical, or, when not, whether the new final score is
  *consistent with the record*: inside the 95% prediction interval of one run drawn like the
  cell's seeds (``mean ± t(0.975, n-1) · s · sqrt(1 + 1/n)``), with the behaviour fingerprint
  (``benchmark.training.fingerprint``) saying whether the algorithm's code still behaves as the
  code that trained the run;
- **at the recorded commit** (``--at-recorded-commit``): the run trained again by its own commit's
  code in a temporary git worktree (``replay_at_commit.py``), the recorded package versions and
  CPU model compared with this machine's and every difference named: bit-identical is expected
  only where they agree.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.errors import ConfigError
from benchmark import metric_names, provenance, tracking
from benchmark.bundles import BundledRun
from benchmark.config import RunSpec
from benchmark.training.checkpoint_paths import FINAL

PROVENANCE_TAGS = ("git_sha", "git_dirty", "python_version", "platform", "cpu_model", "gpu_model")


@dataclass
class Reproduction:
    run_id: str
    spec: RunSpec
    recorded: list[tuple[int, float]]
    """(env steps, mean evaluation return) as logged by the original run."""
    now: list[tuple[int, float]]
    """The same, from training the spec again now."""
    environment_changes: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Provenance tags that differ: name -> (recorded, now)."""
    batch_seeds: list[int] = field(default_factory=list)
    """The seeds it was trained with as one batched model (and is trained with again); [] alone."""

    @property
    def differences(self) -> list[str]:
        return compare_evaluations(self.recorded, self.now)

    @property
    def matches(self) -> bool:
        return not self.differences


def compare_evaluations(recorded: list[tuple[int, float]], now: list[tuple[int, float]]) -> list[str]:
    """One line per evaluation step whose value (or presence) differs; [] when bit-identical."""
    recorded_by_step, now_by_step = dict(recorded), dict(now)
    lines = []
    for step in sorted(set(recorded_by_step) | set(now_by_step)):
        before, after = recorded_by_step.get(step), now_by_step.get(step)
        if before is None or after is None:
            lines.append(f"step {step:,}: evaluated {'only now' if before is None else 'only in the recorded run'}")
        elif before != after:
            lines.append(f"step {step:,}: recorded {before!r}, now {after!r} (difference {after - before:+.6g})")
    return lines


def reproduce(run_id: str, tracking_uri: str, checkpoint_dir: Path | None = None) -> Reproduction:
    """Train the recorded spec of ``run_id`` again (no tracking, no checkpoint of its own) and
    compare; a continued run starts again from the final checkpoint in ``checkpoint_dir`` of
    the run it continues."""
    client, run, spec = _finished_run(run_id, tracking_uri)
    recorded = sorted((int(m.step), float(m.value)) for m in tracking.retry(lambda: client.get_metric_history(run_id, metric_names.EVAL_RETURN_MEAN)))
    batch_seeds = [int(seed) for seed in run.data.tags.get("batch_seeds", "").split()]
    return _train_again(run_id, spec, recorded, batch_seeds, dict(run.data.tags), checkpoint_dir)


def _finished_run(run_id: str, tracking_uri: str) -> tuple[Any, Any, RunSpec]:
    """The store's client, the FINISHED child run ``run_id`` and its recorded spec; ConfigError
    naming what is wrong otherwise."""
    client = tracking.client(tracking_uri)
    try:
        run = tracking.retry(lambda: client.get_run(run_id))
    except Exception as error:  # noqa: BLE001 - MLflow raises its own exception types for a bad id
        raise ConfigError(f"no MLflow run {run_id!r} in {tracking_uri}: {error}") from None
    if run.info.status != "FINISHED":
        raise ConfigError(f"run {run_id} is {run.info.status}, not FINISHED: there is nothing to compare against")
    with tempfile.TemporaryDirectory() as scratch:
        try:
            config_path = client.download_artifacts(run_id, "config.json", scratch)
        except Exception:  # noqa: BLE001
            raise ConfigError(f"run {run_id} has no config.json artifact: it is not a reprorl child run") from None
        return client, run, RunSpec.from_dict(json.loads(Path(config_path).read_text()))


def find_bundled(identifier: str, bundled: dict[str, BundledRun]) -> BundledRun | None:
    """The bundled run with this run key or MLflow run id."""
    if identifier in bundled:
        return bundled[identifier]
    return next((run for run in bundled.values() if run.mlflow_run_id == identifier), None)


def reproduce_bundled(run: BundledRun, checkpoint_dir: Path | None = None) -> Reproduction:
    """Train a bundled run's spec again and compare with the bundle's evaluations."""
    tags = {**run.provenance, **{f"version.{name}": version for name, version in run.versions.items()}}
    recorded = [(evaluation.step, evaluation.mean) for evaluation in run.curve]
    return _train_again(run.mlflow_run_id or run.run_key, run.spec, recorded, list(run.batch_seeds), tags, checkpoint_dir)


def _train_again(
    run_id: str, spec: RunSpec, recorded: list[tuple[int, float]], batch_seeds: list[int], tags: dict[str, str], checkpoint_dir: Path | None
) -> Reproduction:
    if spec.continued_from is None:
        return _train_again_in(None, run_id, spec, recorded, batch_seeds, tags)
    origin = Path(checkpoint_dir or "") / spec.continued_from
    if checkpoint_dir is None or not (origin / FINAL).is_file():
        raise ConfigError(f"run {run_id} continues run key {spec.continued_from}: reproducing it needs that run's final checkpoint, not at {origin}")
    with tempfile.TemporaryDirectory(prefix="reprorl-reproduce-") as scratch:  # its own checkpoints go here; the old run's is linked
        (Path(scratch) / spec.continued_from).symlink_to(origin.resolve(), target_is_directory=True)
        return _train_again_in(Path(scratch), run_id, spec, recorded, batch_seeds, tags)


def _train_again_in(
    checkpoint_dir: Path | None, run_id: str, spec: RunSpec, recorded: list[tuple[int, float]], batch_seeds: list[int], tags: dict[str, str]
) -> Reproduction:
    from benchmark.training import loop as training_loop

    if len(batch_seeds) > 1:
        jobs = [training_loop.SeedJob(dataclasses.replace(spec, seed=seed)) for seed in batch_seeds]
        outcome = training_loop.run_seeds(jobs, checkpoint_dir)[batch_seeds.index(spec.seed)]
        if isinstance(outcome, BaseException):
            raise outcome
        result = outcome
    else:
        result = training_loop.run(spec, checkpoint_dir=checkpoint_dir)
    now = [(evaluation.step, evaluation.mean) for evaluation in result.evaluations]
    current = {**provenance.code_version(), **provenance.environment_tags()}
    changes = {
        name: (tags.get(name, ""), str(current.get(name, "")))
        for name in sorted({*PROVENANCE_TAGS, *(t for t in tags if t.startswith("version."))})
        if tags.get(name, "") != str(current.get(name, ""))
    }
    return Reproduction(run_id, spec, recorded, now, changes, batch_seeds if len(batch_seeds) > 1 else [])


# ------------------------------------------------------------------------------------ judged


@dataclass(frozen=True)
class CellJudgement:
    """Today's final score of a run against its cell's seeds."""

    score: float
    low: float
    high: float
    seeds: int
    """The cell's finished seeds the interval comes from."""

    @property
    def consistent(self) -> bool:
        return self.low <= self.score <= self.high

    def text(self) -> str:
        word = "consistent with the record" if self.consistent else "NOT consistent with the record"
        return (
            f"{word}: final return {self.score:,.1f} against the 95% prediction interval of one run from the cell's {self.seeds} seeds "
            f"[{self.low:,.1f}, {self.high:,.1f}]"
        )


def judge_against_cell(score: float, cell: list[float]) -> CellJudgement | None:
    """``score`` against the 95% prediction interval of one new run from ``cell`` (None: fewer than 2 seeds)."""
    from scipy import stats as scipy_stats

    if len(cell) < 2:
        return None
    mean = sum(cell) / len(cell)
    sd = math.sqrt(sum((value - mean) ** 2 for value in cell) / (len(cell) - 1))
    half = float(scipy_stats.t.ppf(0.975, len(cell) - 1)) * sd * math.sqrt(1 + 1 / len(cell))
    return CellJudgement(score, mean - half, mean + half, len(cell))


def cell_scores(spec: RunSpec, runs: list[BundledRun]) -> list[float]:
    """The final returns of the runs of ``spec``'s configuration (every seed, the run's own included)."""
    same = dataclasses.replace(spec, seed=0).run_key
    return [run.final_return for run in runs if dataclasses.replace(run.spec, seed=0).run_key == same]


def behaviour_text(algo: str, recorded: str, commit: str) -> str:
    """Whether ``algo``'s code here behaves as the code that trained the run (its fingerprint)."""
    from benchmark.training import fingerprint

    now = fingerprint.recorded(algo)
    if not now:
        return f"behaviour: {algo}'s fingerprint cannot be computed here"
    if not recorded:
        return f"behaviour: the run has no fingerprint (python -m benchmark fingerprint --algo {algo} --at {commit[:7] or 'COMMIT'} computes its commit's)"
    if fingerprint.same_behaviour(recorded, now):
        return f"behaviour: {algo}'s code here behaves as the code that trained the run (same fingerprint)"
    return f"behaviour: {algo}'s code has CHANGED since the run was trained at {commit[:7] or '?'} (its fingerprint differs)"


# ------------------------------------------------------------------------------------ at its commit


@dataclass
class AtCommit:
    commit: str
    differences: list[str]
    """What differs between the run's machine and code and this one (bit-exactness needs none)."""
    recorded: list[tuple[int, float]]
    now: list[tuple[int, float]]
    read_as: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> list[str]:
        return compare_evaluations(self.recorded, self.now)


def expected_differences(provenance_tags: dict[str, str], versions: dict[str, str]) -> list[str]:
    """The recorded CPU model and package versions that differ from this machine's (each breaks bit-exactness)."""
    here = provenance.environment_tags()
    found = []
    recorded_cpu = provenance_tags.get("cpu_model", "")
    if recorded_cpu and here["cpu_model"].startswith(f"{recorded_cpu} ("):
        found.append(
            f"CPU: the run recorded only the model name {recorded_cpu!r}, which can stand for more than one CPU;"
            f" this is {here['cpu_model']} (another CPU's float kernels differ in the last bits)"
        )
    elif recorded_cpu and recorded_cpu != here["cpu_model"]:
        found.append(f"CPU: the run was trained on {recorded_cpu}, this is {here['cpu_model']} (float kernels differ in the last bits)")
    for package in provenance.PACKAGES:
        before, after = versions.get(package, ""), here.get(f"version.{package}", "")
        if before and before != after:
            found.append(f"{package} {before} recorded, {after} here")
    if provenance_tags.get("git_dirty") == "true":
        found.append("the run was trained from a tree with uncommitted changes: its exact code is not in git")
    return found


def at_recorded_commit(run: BundledRun, timeout: float | None = None) -> AtCommit:
    """Train ``run`` again with its recorded commit's code (a temporary worktree) and compare."""
    from agents.registry import known_config

    sha = run.provenance.get("git_sha", "")
    if not sha or sha == "unknown":
        raise ConfigError(f"run {run.run_key} recorded no git commit: it cannot be trained at its commit")
    repository = provenance.repository()
    commit = provenance.commit(repository, sha)
    differences = expected_differences(run.provenance, run.versions)
    current = run.spec.to_dict()
    config = known_config(run.spec.algo)
    recorded_names = {**current, "hyperparameters": config.key_form(run.spec.hyperparameters) if config is not None else run.spec.hyperparameters}
    candidates = [_plain(data) for data in (current, recorded_names)]
    batch = list(run.batch_seeds) if len(run.batch_seeds) > 1 else [run.spec.seed]
    script = Path(__file__).with_name("replay_at_commit.py")
    with provenance.worktree(repository, commit) as tree, tempfile.TemporaryDirectory(prefix="reprorl-replay-") as scratch:
        output = Path(scratch) / "result.json"
        environment = {**os.environ, "PYTHONPATH": str(tree), "MLFLOW_TRACKING_URI": f"sqlite:///{scratch}/mlflow.db"}
        command = [sys.executable, "-P", str(script), json.dumps(candidates), json.dumps(batch), run.run_key, str(output)]
        completed = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True, timeout=timeout, check=False)
        if not output.exists():
            tail = " ".join(completed.stderr.strip().splitlines()[-1:]) or f"exit {completed.returncode}"
            raise ConfigError(f"the code of {commit[:7]} could not train run {run.run_key}: {tail}")
        result = json.loads(output.read_text())
    if not result["run_key"]:
        raise ConfigError(f"the code of {commit[:7]} reads this run's settings under another run key ({'; '.join(result['read_as'])}), not {run.run_key}")
    recorded = [(evaluation.step, evaluation.mean) for evaluation in run.curve]
    return AtCommit(commit, differences, recorded, [(int(step), float(mean)) for step, mean in result["evaluations"]], result["read_as"])


CORE_FIELDS = ("suite", "algo", "env_id", "seed", "hyperparameters", "budget", "overrides")
"""What every commit's RunSpec holds; the run key hashes these (fields added later only where set)."""


def _plain(data: dict) -> dict:
    """A spec dict as every commit's ``RunSpec.from_dict`` takes it: the core fields, and those
    added since only where they hold more than their defaults (so an older RunSpec refuses a run
    that needs them rather than training another one)."""
    kept = {key: data[key] for key in CORE_FIELDS if key in data}
    for name, empty in (("env_kwargs", {}), ("wrappers", []), ("continued_from", None)):
        if data.get(name, empty) != empty:
            kept[name] = data[name]
    return kept


def bundled_from_store(run_id: str, tracking_uri: str) -> BundledRun:
    """A finished run of the tracking store as a bundled run (its spec, curve, provenance and
    versions): what ``--at-recorded-commit`` and the cell judgement read."""
    client, run, spec = _finished_run(run_id, tracking_uri)
    from benchmark import bundles
    from benchmark.bundles import Evaluation

    history = tracking.retry(lambda: client.get_metric_history(run_id, metric_names.EVAL_RETURN_MEAN))
    tags = run.data.tags
    return BundledRun(
        spec,
        float(run.data.metrics.get(metric_names.FINAL_RETURN_MEAN, float("nan"))),
        run.data.metrics.get(metric_names.FINAL_RETURN_STD),
        tuple(Evaluation(int(m.step), float(m.value), float("nan")) for m in sorted(history, key=lambda m: int(m.step))),
        provenance={name: tags.get(name, "") for name in bundles.PROVENANCE},
        versions={name.split(".", 1)[1]: value for name, value in tags.items() if name.startswith("version.")},
        batch_seeds=tuple(int(seed) for seed in tags.get("batch_seeds", "").split()),
        mlflow_run_id=run_id,
        fingerprint=tags.get(metric_names.FINGERPRINT_TAG, ""),
    )


def store_cell_scores(spec: RunSpec, tracking_uri: str) -> list[float]:
    """The final returns of the finished runs of ``spec``'s configuration in the store, where its
    suite file names them (every seed the suite lists, and ``spec``'s)."""
    from benchmark import config

    try:
        suite = config.load_suite(spec.suite)
    except ConfigError:
        return []
    same = dataclasses.replace(spec, seed=0).run_key
    keys = {s.run_key for s in suite.specs if dataclasses.replace(s, seed=0).run_key == same} | {spec.run_key}
    found = tracking.finished_child_runs(tracking_uri, spec.suite, keys)
    values = [run.data.metrics.get(metric_names.FINAL_RETURN_MEAN) for run in found.values()]
    return [float(value) for value in values if value is not None and math.isfinite(value)]
