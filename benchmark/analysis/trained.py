"""A trained run, found by its MLflow run id or its run key: its spec (the ``config.json`` the
worker logged) and its final checkpoint (the local ``final.pt``, else the copy in its MLflow
artifacts). ``continue`` and ``evaluate`` start from these."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agents.errors import ConfigError
from benchmark import tracking
from benchmark.config import RunSpec
from benchmark.training import checkpoint


def finished_run(identifier: str, tracking_uri: str) -> tuple[str, RunSpec]:
    """The FINISHED child run ``identifier`` names (an MLflow run id, a run key, or the parent run
    of a launch that trained one run) and its spec (its ``config.json``); ConfigError when there
    is none."""
    client = tracking.client(tracking_uri)
    if re.fullmatch(r"[0-9a-f]{16}", identifier):  # a run key: its latest FINISHED run in any experiment
        experiments = [experiment.experiment_id for experiment in tracking.retry(lambda: client.search_experiments())]
        query = f"tags.run_key = '{identifier}' and attributes.status = 'FINISHED'"
        found = tracking.retry(lambda: client.search_runs(experiments, query, max_results=1, order_by=["attributes.start_time DESC"])) if experiments else []
        if not found:
            raise ConfigError(f"no finished run with run key {identifier} in {tracking.describe_uri(tracking_uri)}")
        run = found[0]
    else:
        try:
            run = tracking.retry(lambda: client.get_run(identifier), attempts=1)
        except Exception:  # noqa: BLE001 - MLflow raises its own exception types for a bad id
            raise ConfigError(f"no MLflow run {identifier!r} in {tracking.describe_uri(tracking_uri)} (give a run id or a run key)") from None
        if run.info.status != "FINISHED":
            raise ConfigError(f"run {identifier} is {run.info.status}: it has not finished, so it has no final checkpoint")
        if "run_key" not in run.data.tags:  # a launch's parent run (what run and train print last)
            run = _only_child(client, run)
    run_id = run.info.run_id
    with tempfile.TemporaryDirectory() as scratch:
        try:
            config_path = client.download_artifacts(run_id, "config.json", scratch)
            spec = RunSpec.from_dict(json.loads(Path(config_path).read_text()))
        except ConfigError as error:
            raise ConfigError(f"run {run_id}'s config.json: {error}") from None
        except Exception:  # noqa: BLE001
            raise ConfigError(f"run {run_id} has no readable config.json artifact: it is not a reprorl training run") from None
    return run_id, spec


def _only_child(client: Any, parent: Any) -> Any:
    """The one finished run of the launch whose parent run is ``parent``; ConfigError naming the
    run keys to choose from when it trained several, or none."""
    query = f"tags.mlflow.parentRunId = '{parent.info.run_id}' and attributes.status = 'FINISHED'"
    children = [run for run in tracking.retry(lambda: client.search_runs([parent.info.experiment_id], query, max_results=50)) if "run_key" in run.data.tags]
    if len(children) == 1:
        return children[0]
    if not children:
        raise ConfigError(f"run {parent.info.run_id} is a launch's parent run with no finished run under it: give a run's id or run key")
    keys = sorted(run.data.tags["run_key"] for run in children)
    shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
    raise ConfigError(f"run {parent.info.run_id} is the parent run of a launch of {len(keys)} finished runs: give one of their run keys ({shown})")


def final_checkpoint(run_id: str, spec: RunSpec, tracking_uri: str, checkpoint_dir: Path) -> dict[str, Any]:
    """The run's ``final.pt`` payload, from the checkpoint directory, or else fetched there from
    its MLflow artifacts; ConfigError when neither holds it."""
    path = checkpoint.run_directory(checkpoint_dir, spec.run_key) / checkpoint.FINAL
    if not path.is_file():
        with tempfile.TemporaryDirectory() as scratch:
            try:
                fetched = Path(tracking.client(tracking_uri).download_artifacts(run_id, f"checkpoints/{checkpoint.FINAL}", scratch))
            except Exception:  # noqa: BLE001
                raise ConfigError(f"run {run_id} has no final checkpoint: not at {path}, nor in its MLflow artifacts") from None
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".fetched")
            shutil.copyfile(fetched, temporary)
            temporary.replace(path)
    return read_final(path, spec.run_key)


def read_final(path: Path, run_key: str) -> dict[str, Any]:
    """The payload of the final checkpoint ``path`` of run ``run_key`` (read without running
    code); ConfigError, one line, when it is damaged or another run's."""
    try:
        payload = checkpoint.load(path)
    except Exception as error:  # noqa: BLE001 - a damaged file, in one line
        raise ConfigError(f"cannot read {path}: {type(error).__name__}: {error}") from None
    if not isinstance(payload, dict) or (payload.get("spec") or {}).get("run_key") != run_key:
        raise ConfigError(f"{path} is not the final checkpoint of run key {run_key}")
    return payload
