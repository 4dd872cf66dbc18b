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
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

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
        spec = RunSpec.from_dict(json.loads(Path(config_path).read_text()))
    recorded = sorted((int(m.step), float(m.value)) for m in tracking.retry(lambda: client.get_metric_history(run_id, metric_names.EVAL_RETURN_MEAN)))
    batch_seeds = [int(seed) for seed in run.data.tags.get("batch_seeds", "").split()]
    return _train_again(run_id, spec, recorded, batch_seeds, dict(run.data.tags), checkpoint_dir)


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
