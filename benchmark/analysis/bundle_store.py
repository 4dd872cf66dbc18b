"""Between bundles and the MLflow tracking store: export a suite's finished runs, import a bundle.

``export`` reads each run key's latest FINISHED child run of the suite's experiment: its final
metrics, the evaluation curve as logged (``eval/return_mean``, ``eval/return_std``), every
episode of every evaluation (the ``evaluations.json`` artifact) and the provenance tags.
``import_bundle`` writes each bundled run back as a FINISHED child run (same metrics, params,
tags and artifacts, tagged ``imported_from``) under one parent run of kind ``import``, so the
MLflow UI shows it beside runs trained here; where the bundle carries a run's weights, they
become its ``checkpoints/final.pt`` artifact, as a run trained here has, so ``evaluate`` and
``continue`` take it. ``plan_import`` checks a bundle against the store first, so that a
command importing several writes nothing until every one has passed.
"""

from __future__ import annotations

import datetime
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmark import bundles, metric_names, tracking
from benchmark.analysis import records
from benchmark.bundles import BundledRun, BundleError, Evaluation
from benchmark.config import Suite
from benchmark.execution import outcomes
from benchmark.results_layout import ResultsDir

IMPORTED_TAG = "imported_from"


def _iso(ms: int | None) -> str:
    if not ms:
        return ""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="seconds")


def _ms(text: str) -> int | None:
    return int(datetime.datetime.fromisoformat(text).timestamp() * 1000) if text else None


def from_store(suite: Suite, tracking_uri: str) -> list[BundledRun]:
    """The suite's run keys that have a FINISHED child run in its experiment, as bundled runs
    (in suite order); a run without a finite final evaluation is left out."""
    return [run for run, _ in _from_store(suite, tracking_uri)]


def _from_store(suite: Suite, tracking_uri: str) -> list[tuple[BundledRun, str]]:
    """``from_store``, each run with the id of the MLflow run it was read from."""
    import math

    specs = {spec.run_key: spec for spec in suite.specs}
    finished = tracking.finished_child_runs(tracking_uri, suite.name, set(specs))
    client = tracking.client(tracking_uri)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for key, spec in specs.items():
            run = finished.get(key)
            if run is None:
                continue
            metrics, tags = run.data.metrics, run.data.tags
            final = metrics.get(metric_names.FINAL_RETURN_MEAN)
            if final is None or not math.isfinite(final):
                continue
            run_id = run.info.run_id
            curve = _curve(client, run_id, Path(scratch))
            runs.append(
                (
                    BundledRun(
                        spec,
                        float(final),
                        metrics.get(metric_names.FINAL_RETURN_STD),
                        curve,
                        metrics.get(metric_names.PRE_ADAPTATION_RETURN),
                        metrics.get(metric_names.FINAL_WALL_SECONDS),
                        metrics.get(metric_names.FINAL_STEPS_PER_SECOND, metrics.get(metric_names.STEPS_PER_SECOND)),
                        tags.get("device", ""),
                        {name: tags.get(name, "") for name in bundles.PROVENANCE},
                        {name.split(".", 1)[1]: value for name, value in sorted(tags.items()) if name.startswith("version.")},
                        tuple(int(s) for s in tags.get("batch_seeds", "").split()) if len(tags.get("batch_seeds", "").split()) > 1 else (),
                        tags.get("original_run_id", run_id),
                        _iso(run.info.start_time),
                        _iso(run.info.end_time),
                        train_last100=outcomes.train_last100(metrics) or records.last_training_returns(client, run_id),
                        fingerprint=tags.get(metric_names.FINGERPRINT_TAG, ""),
                        cpu_seconds=metrics.get(metric_names.FINAL_CPU_SECONDS),
                    ),
                    run_id,
                )
            )
    return runs


def _curve(client: Any, run_id: str, scratch: Path) -> tuple[Evaluation, ...]:
    """Each evaluation: mean and std as logged; each episode's return and length, and the
    training episodes since the previous evaluation, from the ``evaluations.json`` artifact
    (runs made before it held training returns: from the ``train/episode_return`` history)."""
    means = {int(m.step): float(m.value) for m in tracking.retry(lambda: client.get_metric_history(run_id, metric_names.EVAL_RETURN_MEAN))}
    stds = {int(m.step): float(m.value) for m in tracking.retry(lambda: client.get_metric_history(run_id, metric_names.EVAL_RETURN_STD))}
    recorded: dict[int, dict[str, Any]] = {}
    try:
        path = client.download_artifacts(run_id, "evaluations.json", str(scratch / run_id))
        recorded = {int(evaluation["step"]): evaluation for evaluation in json.loads(Path(path).read_text())}
    except Exception:  # noqa: BLE001 - MLflow raises its own types for a missing artifact
        pass
    steps = sorted(means)
    training = records.training_returns(client, run_id, steps) if not any("train_episodes" in e for e in recorded.values()) else {}
    curve = []
    for step in steps:
        evaluation = recorded.get(step, {})
        train_mean, train_count = training.get(step, (evaluation.get("train_return_mean"), evaluation.get("train_episodes", 0)))
        curve.append(
            Evaluation(
                step,
                means[step],
                stds.get(step, float("nan")),
                tuple(map(float, evaluation.get("returns", ()))),
                tuple(map(int, evaluation.get("lengths", ()))),
                None if train_mean is None else float(train_mean),
                int(train_count or 0),
            )
        )
    return tuple(curve)


@dataclass
class Exported:
    """What ``export`` wrote."""

    bundle: bundles.Bundle
    added: int
    replaced: int
    without_weights: list[str] = field(default_factory=list)
    """With weights asked for: the labels of the exported runs that have no final checkpoint to carry."""


def export(suite: Suite, tracking_uri: str, output: Path, replace_runs: bool = False, checkpoint_dir: Path | None = None) -> Exported:
    """Write the suite's finished runs to the bundle at ``output``, merged with the runs a
    bundle there already holds (a grid split over machines grows one bundle). The same run key
    with different results is refused unless ``replace_runs`` (the store's run wins). With
    ``checkpoint_dir``, each exported run's final checkpoint goes in too (from there, else from
    its MLflow artifacts); weights the bundle already carries stay with their runs."""
    fresh = _from_store(suite, tracking_uri)
    existing = bundles.read(output) if bundles.is_bundle(output) else None
    if existing is not None and existing.suite != suite.name:
        raise BundleError(f"{output} holds a bundle of suite {existing.suite!r}, not {suite.name!r}: export to another --output")
    merged = dict(existing.runs) if existing else {}
    weights = dict(existing.weights) if existing else {}
    added = replaced = 0
    for run, _ in fresh:
        known = merged.get(run.run_key)
        if known is not None and not known.same_result(run):
            if not replace_runs:
                bundles.merge([[known], [run]])  # raises, naming both
            replaced += 1
            weights.pop(run.run_key, None)  # they trained the result being replaced
        elif known is None:
            added += 1
        if known is None or not known.same_result(run):
            merged[run.run_key] = run
    if not fresh and existing is None:
        raise BundleError(f"suite {suite.name!r} has no finished run in {tracking.describe_uri(tracking_uri)}: nothing to export")
    with tempfile.TemporaryDirectory() as scratch:
        without = []
        if checkpoint_dir is not None:
            for run, run_id in fresh:
                found = weights.get(run.run_key) or _final_checkpoint(run, run_id, tracking_uri, checkpoint_dir, Path(scratch))
                if found is None:
                    without.append(run.spec.label)
                else:
                    weights[run.run_key] = found
        bundle = bundles.Bundle(suite.name, merged, weights=weights)
        bundles.write(bundle, output)
    return Exported(bundles.read(output), added, replaced, without)


def _final_checkpoint(run: BundledRun, run_id: str, tracking_uri: str, checkpoint_dir: Path, scratch: Path) -> bundles.Weights | None:
    """The run's ``final.pt``, where it has one: the local file, else a copy of its MLflow
    artifact in ``scratch``; checked to load without code and to belong to the run."""
    from benchmark.analysis.trained import read_final  # (torch: only when weights are asked for)
    from benchmark.training import checkpoint

    path = checkpoint.run_directory(checkpoint_dir, run.run_key) / checkpoint.FINAL
    if not path.is_file():
        try:
            path = Path(tracking.client(tracking_uri).download_artifacts(run_id, f"checkpoints/{checkpoint.FINAL}", str(scratch / run_id)))
        except Exception:  # noqa: BLE001 - MLflow raises its own types for a missing artifact
            return None
    read_final(path, run.run_key)  # loads without running code, and is this run's
    return bundles.Weights(path)


@dataclass
class ImportPlan:
    """What importing one bundle would write, checked against the store before anything is."""

    bundle: bundles.Bundle
    to_import: list[BundledRun]
    present: dict[str, str]
    """Run key -> the store's MLflow run id, for the bundle's runs the store already has ('' for
    one an earlier bundle of the same command imports)."""


def plan_import(bundle: bundles.Bundle, tracking_uri: str, planned: set[str] | frozenset[str] = frozenset()) -> ImportPlan:
    """Check ``bundle`` against the store without writing: a run key the suite's experiment
    already has FINISHED with the same final evaluation will be left as it is; with a different
    one, BundleError naming both (the weights files' digests are checked by the caller, before
    the store is opened, and again as each file is logged). Run keys in ``planned`` (an earlier bundle's plan imports them) count as there already."""
    finished = tracking.finished_child_runs(tracking_uri, bundle.suite, set(bundle.runs))
    to_import, present = [], {}
    for key, run in sorted(bundle.runs.items()):
        known = finished.get(key)
        if known is None and key in planned:
            present[key] = ""
        elif known is None:
            to_import.append(run)
        elif known.data.metrics.get(metric_names.FINAL_RETURN_MEAN) != run.final_return:
            raise BundleError(
                f"run key {key} ({run.spec.label}) has final evaluation {known.data.metrics.get('final/eval_return_mean')!r} in "
                f"the tracking store (MLflow run {known.info.run_id}) and {run.final_return!r} in {run.describe()}: nothing imported"
            )
        else:
            present[key] = known.info.run_id
    return ImportPlan(bundle, to_import, present)


def import_bundle(plan: ImportPlan, tracking_uri: str, results_dir: Path) -> tuple[int, int, int]:
    """Load the runs ``plan`` found missing into the store's experiment named after the bundle's
    suite (under one parent run of kind ``import``), each with its weights where the bundle
    carries them; runs already there get the bundle's weights where they have no final
    checkpoint. Returns (imported, already there, weights added to runs already there)."""
    bundle = plan.bundle
    attached = 0
    client = tracking.client(tracking_uri)
    for key, run_id in sorted(plan.present.items()):
        if run_id and key in bundle.weights and not _has_final_checkpoint(client, run_id):
            _log_weights(client, run_id, bundle.weights[key], key)
            attached += 1
    if not plan.to_import:
        return 0, len(bundle.runs), attached
    experiment = tracking.experiment_id(tracking_uri, bundle.suite, ResultsDir(results_dir).artifacts)
    parent = tracking.start_parent_run(
        tracking_uri,
        experiment,
        f"import-{Path(bundle.origin).name}-{time.strftime('%Y%m%d-%H%M%S')}",
        {"suite": bundle.suite, "kind": "import", IMPORTED_TAG: bundle.origin},
    )
    try:
        for run in plan.to_import:
            _import_run(tracking_uri, experiment, parent.run_id, run, bundle.weights.get(run.run_key))
        parent.finish("FINISHED")
    except BaseException as error:
        parent.fail(error)
        raise
    return len(plan.to_import), len(plan.present), attached


def _has_final_checkpoint(client: Any, run_id: str) -> bool:
    from benchmark.training.checkpoint_paths import FINAL

    return any(Path(item.path).name == FINAL for item in tracking.retry(lambda: client.list_artifacts(run_id, "checkpoints")))


def _log_weights(client: Any, run_id: str, weights: bundles.Weights, run_key: str) -> None:
    """The bundle's weights file, checked again, as the run's ``checkpoints/final.pt`` artifact."""
    from benchmark.training.checkpoint_paths import FINAL

    data = bundles.weights_bytes(weights, run_key)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / FINAL
        path.write_bytes(data)
        tracking.retry(lambda: client.log_artifact(run_id, str(path), "checkpoints"))


def _import_run(tracking_uri: str, experiment: str, parent_run_id: str, run: BundledRun, weights: bundles.Weights | None) -> None:
    from mlflow.entities import Metric, Param

    client = tracking.client(tracking_uri)
    tags = {
        "run_key": run.run_key,
        "suite": run.spec.suite,
        "algo": run.spec.algo,
        "env_id": run.spec.env_id,
        "seed": run.spec.seed,
        "device": run.device,
        **run.provenance,
        **{f"version.{name}": v for name, v in run.versions.items()},
        IMPORTED_TAG: run.origin,
        "original_run_id": run.mlflow_run_id,
        "mlflow.parentRunId": parent_run_id,
        **({"batch_seeds": " ".join(map(str, run.batch_seeds))} if run.batch_seeds else {}),
        **({metric_names.FINGERPRINT_TAG: run.fingerprint} if run.fingerprint else {}),
    }
    created = tracking.retry(
        lambda: client.create_run(experiment, start_time=_ms(run.started), run_name=run.spec.label, tags={k: str(v) for k, v in tags.items()})
    )
    run_id = created.info.run_id
    ended = _ms(run.ended) or int(time.time() * 1000)
    metrics = [Metric(metric_names.EVAL_RETURN_MEAN, e.mean, ended, e.step) for e in run.curve]
    metrics += [Metric(metric_names.EVAL_RETURN_STD, e.std, ended, e.step) for e in run.curve]
    metrics += [Metric(metric_names.TRAIN_RETURN, e.train_return_mean, ended, e.step) for e in run.curve if e.train_return_mean is not None]
    last = run.curve[-1].step if run.curve else run.spec.budget.total_steps
    finals = {
        metric_names.FINAL_RETURN_MEAN: run.final_return,
        metric_names.FINAL_RETURN_STD: run.final_return_std,
        metric_names.FINAL_STEPS_PER_SECOND: run.steps_per_second,
        metric_names.FINAL_WALL_SECONDS: run.wall_seconds,
        metric_names.FINAL_CPU_SECONDS: run.cpu_seconds,
        metric_names.PRE_ADAPTATION_RETURN: run.pre_adaptation_return,
        metric_names.FINAL_TRAIN_RETURN_LAST100: run.train_last100[0] if run.train_last100 else None,
        metric_names.FINAL_TRAIN_EPISODES_LAST100: run.train_last100[1] if run.train_last100 else None,
    }
    metrics += [Metric(name, value, ended, last) for name, value in finals.items() if value is not None]
    params = [Param(k, str(v)[:6000]) for k, v in tracking.child_params(run.spec).items()]
    for start in range(0, len(metrics), 900):  # MLflow's log_batch takes at most 1000 metrics and 100 params
        tracking.retry(lambda: client.log_batch(run_id, metrics=metrics[start : start + 900]))
    for start in range(0, len(params), 90):
        tracking.retry(lambda: client.log_batch(run_id, params=params[start : start + 90]))
    evaluations = [
        {"step": e.step, "returns": list(e.returns), "lengths": list(e.lengths), "train_return_mean": e.train_return_mean, "train_episodes": e.train_episodes}
        for e in run.curve
    ]
    tracking.retry(lambda: client.log_text(run_id, json.dumps(evaluations), "evaluations.json"))
    tracking.retry(lambda: client.log_text(run_id, json.dumps(run.spec.to_dict(), indent=2, sort_keys=True), "config.json"))
    if weights is not None:
        _log_weights(client, run_id, weights, run.run_key)
    tracking.retry(lambda: client.set_terminated(run_id, "FINISHED", end_time=ended))
