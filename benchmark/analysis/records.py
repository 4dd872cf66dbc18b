"""Read a suite's runs back from MLflow: one record per RunSpec, whatever state it is in.

The suite file decides which runs belong in a report (its run keys); MLflow says what became
of each. A run key can have several MLflow runs (re-launches): the latest FINISHED one counts,
otherwise the latest of any status, so a run that failed, was killed or is still going is
shown as such. A spec with no run at all is ``MISSING``.

Result bundles (``benchmark.bundles``) count as well: a run key with no FINISHED run in the
store takes the bundle's run, whose record names the bundle in ``source``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmark import metric_names, tracking
from benchmark.bundles import BundledRun
from benchmark.config import Suite
from benchmark.execution import outcomes
from benchmark.run_record import RunRecord, from_bundle, mark_unusable


def with_stored_seeds(suite: Suite, tracking_uri: str | None, bundled: dict[str, BundledRun] | None = None, seeds: list[int] | None = None) -> Suite:
    """``suite`` with a spec for each seed of its configurations that the store (a run in any
    state) or the bundles hold, beyond the suite's ``seeds:`` (``run --seeds`` trains any), each
    after its configuration's own seeds; with ``seeds``, only the specs of those seeds."""
    import dataclasses

    held: dict[str, int] = {key: run.spec.seed for key, run in (bundled or {}).items()}
    if tracking_uri is not None:
        client = tracking.client(tracking_uri)
        experiment = tracking.retry(lambda: client.get_experiment_by_name(suite.name))
        if experiment is not None:
            for run in tracking.search_all_runs(client, experiment.experiment_id, "tags.run_key != ''"):
                seed = run.data.tags.get("seed", "")
                if seed.isdigit():
                    held[run.data.tags["run_key"]] = int(seed)
    specs, known = [], {spec.run_key for spec in suite.specs}
    for spec in suite.specs:
        specs.append(spec)
        for seed in sorted(set(held.values()) - {spec.seed}):
            other = dataclasses.replace(spec, seed=seed)
            if other.run_key in held and other.run_key not in known:
                specs.append(other)
                known.add(other.run_key)
    order = {spec.run_key: index for index, spec in enumerate(specs)}
    first: dict[str, int] = {}  # a configuration's place: its first spec's
    for spec in specs:
        first.setdefault(dataclasses.replace(spec, seed=0).run_key, order[spec.run_key])
    specs.sort(key=lambda spec: (first[dataclasses.replace(spec, seed=0).run_key], spec.seed))
    if seeds is not None:
        specs = [spec for spec in specs if spec.seed in seeds]
    return dataclasses.replace(suite, specs=specs)


def collect(suite: Suite, tracking_uri: str | None, with_curves: bool = True, bundled: dict[str, BundledRun] | None = None) -> list[RunRecord]:
    """One record per spec of ``suite``, in suite order, from the experiment named after it
    (none when ``tracking_uri`` is None) and the ``bundled`` runs (run key -> run)."""
    records = [RunRecord(spec) for spec in suite.specs] if tracking_uri is None else _from_store(suite, tracking_uri, with_curves)
    for index, record in enumerate(records):
        run = (bundled or {}).get(record.spec.run_key)
        if run is not None and not record.finished:
            records[index] = from_bundle(record.spec, run)
            records[index].attempts += record.attempts
    return records


def _from_store(suite: Suite, tracking_uri: str, with_curves: bool) -> list[RunRecord]:
    client = tracking.client(tracking_uri)
    records = [RunRecord(spec) for spec in suite.specs]
    experiment = tracking.retry(lambda: client.get_experiment_by_name(suite.name))
    if experiment is None:
        return records
    by_key: dict[str, list[Any]] = defaultdict(list)
    for run in tracking.search_all_runs(client, experiment.experiment_id, "tags.run_key != ''"):
        by_key[run.data.tags.get("run_key", "")].append(run)
    for record in records:
        candidates = by_key.get(record.spec.run_key, [])
        record.attempts = len(candidates)
        if not candidates:
            continue
        candidates.sort(key=lambda run: run.info.start_time or 0, reverse=True)
        finished = [run for run in candidates if run.info.status == "FINISHED"]
        chosen = finished[0] if finished else candidates[0]
        metrics = chosen.data.metrics
        record.run_id = chosen.info.run_id
        record.experiment_id = experiment.experiment_id
        record.status = chosen.info.status
        if chosen is not candidates[0]:
            record.latest_status = candidates[0].info.status
        record.final_return = metrics.get(metric_names.FINAL_RETURN_MEAN) if record.status == "FINISHED" else None
        record.pre_adaptation_return = metrics.get(metric_names.PRE_ADAPTATION_RETURN) if record.status == "FINISHED" else None
        mark_unusable(record)
        record.steps_per_second = metrics.get(metric_names.FINAL_STEPS_PER_SECOND, metrics.get(metric_names.STEPS_PER_SECOND))
        record.wall_seconds = metrics.get(metric_names.FINAL_WALL_SECONDS)
        if record.wall_seconds is None and chosen.info.end_time and chosen.info.start_time:
            record.wall_seconds = (chosen.info.end_time - chosen.info.start_time) / 1000
        record.cpu_seconds = metrics.get(metric_names.FINAL_CPU_SECONDS)
        record.error = record.error or chosen.data.tags.get("error")
        record.git_sha = chosen.data.tags.get("git_sha")
        record.video_strip = chosen.data.tags.get(metric_names.VIDEO_STRIP_TAG)
        if record.status == "FINISHED":
            record.final_train_return = metrics.get(metric_names.TRAIN_RETURN)
            record.train_last100 = outcomes.train_last100(metrics)
        record.fingerprint = chosen.data.tags.get(metric_names.FINGERPRINT_TAG, "")
        if with_curves:
            history = tracking.retry(lambda: client.get_metric_history(chosen.info.run_id, metric_names.EVAL_RETURN_MEAN))
            record.curve = sorted((int(m.step), float(m.value)) for m in history)
            if record.status == "FINISHED" and record.train_last100 is None:  # made before the run logged it at its end
                record.train_last100 = last_training_returns(client, chosen.info.run_id)
            if record.status == "FINISHED" and record.final_train_return is None and record.curve:  # made before it was logged
                steps = [step for step, _ in record.curve]
                record.final_train_return = training_returns(client, chosen.info.run_id, steps)[steps[-1]][0]
    return records


def fetch_video_strips(records: list[RunRecord], tracking_uri: str | None, directory: Path) -> dict[str, Path]:
    """Run key -> the PNG strip of its filmed episode, downloaded into ``directory``, for the
    finished runs that have one (a strip that cannot be fetched is left out)."""
    strips: dict[str, Path] = {}
    if tracking_uri is None:
        return strips
    client = tracking.client(tracking_uri)
    for record in records:
        if not (record.finished and record.run_id and record.video_strip):
            continue
        run_id, artifact = record.run_id, record.video_strip
        with tempfile.TemporaryDirectory() as scratch:
            try:
                fetched = Path(tracking.retry(lambda: client.download_artifacts(run_id, artifact, scratch), attempts=2))
            except Exception:  # noqa: BLE001 - removed from the store since: the report goes on without it
                continue
            directory.mkdir(parents=True, exist_ok=True)
            target = directory / f"video-{record.spec.run_key}.png"
            partial = target.with_name(f".{target.name}.partial")
            shutil.copyfile(fetched, partial)
            partial.replace(target)
            strips[record.spec.run_key] = target
    return strips


def training_returns(mlflow_client: Any, run_id: str, steps: list[int]) -> dict[int, tuple[float | None, int]]:
    """Evaluation step -> (mean, count) of the run's logged training episodes (``train/episode_return``)
    that ended after the previous evaluation and at or before this one (``steps`` sorted): for
    runs made before the loop logged this itself at each evaluation."""
    import bisect

    history = tracking.retry(lambda: mlflow_client.get_metric_history(run_id, metric_names.TRAIN_EPISODE_RETURN))
    buckets: dict[int, list[float]] = {step: [] for step in steps}
    for metric in history:
        index = bisect.bisect_left(steps, int(metric.step))
        if index < len(steps):
            buckets[steps[index]].append(float(metric.value))
    return {step: ((sum(values) / len(values)) if values else None, len(values)) for step, values in buckets.items()}


def last_training_returns(mlflow_client: Any, run_id: str, count: int = 100) -> tuple[float, int] | None:
    """(mean, episodes) of the run's last ``count`` logged training episodes (``train/episode_return``,
    in the order they ended), for runs that did not log the figure at their end; None: none logged."""
    history = tracking.retry(lambda: mlflow_client.get_metric_history(run_id, metric_names.TRAIN_EPISODE_RETURN))
    ordered = [float(m.value) for m in sorted(history, key=lambda m: (int(m.step), int(m.timestamp)))][-count:]
    return (sum(ordered) / len(ordered), len(ordered)) if ordered else None
