"""A study's invocation: create or resume the study in its storage, open its MLflow parent run,
and run the trials as tasks on an executor (``benchmark.execution``: the local pool, Ray or
Slurm), at most ``workers`` at once; a trial whose worker dies is marked FAIL at once.

- Seeds: trial ``n`` trains seeds ``TRIAL_SEED_BASE + seed + n * S + i`` (i < S): fixed per
  trial number, different across trials, and never the seeds a suite runs (0, 1, ...), so an
  exported setting is evaluated on seeds the tuner did not select it on.
- The sampler is seeded per trial (study seed, trial number, worker): one worker repeats a study
  exactly; a resumed study draws new trials; trials started at once draw different settings.
- Storage: any Optuna storage; the study's setting is stored in its user attributes, so that
  re-running the same study name resumes it and other machines can join it with the same
  command (with a database server as the storage: the documented way for many nodes).
- MLflow: experiment ``tune-<study>``, one parent run per study (reopened on resume), one
  child run per trial with its parameters, per-seed curves, intermediate values, objective
  and state (tag ``trial_state``; status FINISHED, KILLED when pruned, FAILED)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock
from rich.console import Console
from rich.markup import escape

import agents
from agents.envs import check_env_id
from agents.errors import ConfigError
from benchmark import config, provenance, tracking
from benchmark.execution import claims
from benchmark.execution.base import Executor
from benchmark.execution.local import LocalExecutor
from benchmark.execution.messages import Sink, TrialStarted, send
from benchmark.results_layout import ResultsDir
from benchmark.tracking import redact
from benchmark.tuning.inspect import best_trial
from benchmark.tuning.objective import Objective, TrialFailed, ignore_further_stop_signals, make_pruner, make_sampler, raise_interrupt, sampler_seed
from benchmark.tuning.search_space import SearchSpace, load_search_space, space_from_dict
from benchmark.tuning.settings import OBJECTIVE_NAME, PRUNERS, SAMPLERS, SETTINGS_ATTR, StudySettings, base_setting, make_settings, resumed_settings
from benchmark.tuning.storage import open_storage, quiet_optuna, shared_storage, study_exists, study_settings


def prepare(
    algo: str,
    env_id: str,
    study_name: str,
    storage_url: str,
    default_url: str,
    given: dict[str, Any],
    space_path: Path | None = None,
) -> tuple[StudySettings, SearchSpace]:
    """The setting and search space of study ``study_name``: the stored ones when it exists
    (checked against the options ``given`` and ``space_path``), else new ones from ``given``
    (option -> value or None). Every check runs before anything is written."""
    import optuna

    space = load_search_space(algo, space_path)  # (an unknown algorithm is named first)
    check_env_id(env_id)  # (its spaces are checked against the algorithm as the base suite makes the env)
    base_suite = given.get("suite")  # a name or a path: settings keep the suite's name
    if base_suite not in (None, "none"):
        given = {**given, "suite": config.load_suite(base_suite).name}
    if study_exists(storage_url, study_name, default_url):
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
        settings = resumed_settings(study_settings(study), algo, env_id, given)
        if base_suite not in (None, "none"):  # the suite as it is now must still be the one the study started from
            _, _, fixed, options = base_setting(algo, env_id, base_suite)
            made_now = {"hyperparameters": fixed, **options}
            made_then = {"hyperparameters": settings.base_hyperparameters, "env_kwargs": settings.env_kwargs, "wrappers": settings.wrappers}
            if {key: value for key, value in made_then.items() if value or key == "hyperparameters"} != made_now:
                raise ConfigError(
                    f"study {study_name!r} started from suite {settings.base_suite!r} with other fixed hyperparameters or env settings than "
                    f"{base_suite} has now; leave out --suite to resume it as it was, or choose another --study name"
                )
        if space_path is not None and space.to_dict() != settings.space:
            raise ConfigError(
                f"study {study_name!r} searches the space it was created with, not {space_path}; leave out --space to resume it, or choose another --study name"
            )
        return settings, space_from_dict(settings.space)
    seeds_per_trial, seed = given.get("seeds_per_trial"), given.get("seed")
    settings = make_settings(
        algo,
        env_id,
        space,
        budget_steps=given.get("budget"),
        seeds_per_trial=1 if seeds_per_trial is None else seeds_per_trial,
        base_suite=base_suite,
        reference_score=given.get("reference"),
        random_score=given.get("random"),
        seed=0 if seed is None else seed,
    )
    return settings, space


@dataclass(frozen=True)
class TrialJob:
    """What every trial of one invocation needs (picklable: it travels to the executor's workers)."""

    study_name: str
    storage_url: str
    settings: dict[str, Any]
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    sampler: str
    pruner: str
    pruner_startup_trials: int
    pruner_warmup_steps: int | None
    deadline: float | None
    """time.time() after which no new trial starts (--timeout)."""
    seeds_per_process: int = 1
    workers: int = 1
    """Trials at once: task i counts as worker i mod workers in the sampler's seed."""


@dataclass(frozen=True)
class TrialReport:
    """What a trial task sends back: the trial's number and state, and the line the launch prints."""

    number: int
    state: str
    line: str


@dataclass(frozen=True)
class TrialTask:
    """One trial, as a task for any executor (``benchmark.execution.base``): load the study,
    seed the sampler for the trial about to start, run it on the assigned device. Returns its
    TrialReport, or None when the invocation's deadline passed before it started."""

    job: TrialJob
    index: int
    """This task's place in the invocation: its worker (index mod workers) seeds the sampler,
    with the study seed and the trial number, so that trials started at once draw different settings."""

    def __call__(self, messages: Sink | None, device: str, where: str) -> TrialReport | None:
        import optuna

        job = self.job
        if job.deadline is not None and time.time() >= job.deadline:
            return None
        quiet_optuna()
        settings = StudySettings.from_dict(job.settings)
        space = space_from_dict(settings.space)  # the study's own space, whatever the files say now
        study = optuna.load_study(
            study_name=job.study_name,
            storage=open_storage(job.storage_url),
            pruner=make_pruner(job.pruner, settings, job.pruner_startup_trials, job.pruner_warmup_steps),
        )
        objective = Objective(
            job.study_name,
            settings,
            space,
            job.tracking_uri,
            job.experiment_id,
            job.parent_run_id,
            device,
            lambda number: send(messages, TrialStarted(self.index, number, where)),
            job.seeds_per_process,
        )
        host = socket.gethostname() if shared_storage(job.storage_url) else ""
        next_number = len(study.get_trials(deepcopy=False))  # (another worker may take it first: no matter)
        study.sampler = make_sampler(job.sampler, sampler_seed(settings.seed, next_number, self.index % job.workers, host))
        ended: list[Any] = []
        with _StopOnTerm():
            study.optimize(objective, n_trials=1, catch=(TrialFailed,), callbacks=[lambda _, trial: ended.append(trial)])
        trial = ended[-1]
        return TrialReport(trial.number, trial.state.name, trial_line(trial))


class _StopOnTerm:
    """While a trial runs, SIGTERM (an executor cancelling it) stops it like Ctrl-C: the trial is
    marked FAIL and its MLflow run KILLED (the training loop's own handler checkpoints first)."""

    def __enter__(self) -> _StopOnTerm:
        self._previous = signal.signal(signal.SIGTERM, raise_interrupt) if threading.current_thread() is threading.main_thread() else None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def trial_line(trial: Any) -> str:
    """How the launch reports a finished trial."""
    state = trial.state.name
    seconds = trial.duration.total_seconds() if trial.duration else 0.0
    if state == "COMPLETE":
        outcome = f"normalized {trial.value:.3f} (final returns {', '.join(f'{r:.1f}' for r in trial.user_attrs.get('final_returns', []))})"
    elif state == "PRUNED":
        last = trial.last_step
        outcome = f"at step {last:,} (intermediate {trial.intermediate_values[last]:.3f})" if last is not None else ""
    else:
        outcome = trial.user_attrs.get("error", "")
    params = ", ".join(f"{name}={_short(value)}" for name, value in trial.user_attrs.get("tuned", trial.params).items())
    return f"trial {trial.number} {state} {outcome} in {seconds:.0f} s: {params}"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass
class StudyRun:
    study_name: str
    parent_run_id: str
    trials_before: int
    trials_after: int
    counts: dict[str, int]
    best_trial: Any | None
    worker_errors: list[str]


def check_options(
    *,
    trials: int,
    workers: int,
    sampler: str,
    pruner: str,
    pruner_startup_trials: int,
    pruner_warmup_steps: int | None,
    timeout: float | None,
    device: str,
    runs_per_gpu: int | None,
    seeds_per_process: int = 1,
    local: bool = True,
) -> list[Any]:
    """ConfigError for any option out of range (before anything is written); the device slots
    of the local workers (see benchmark.execution.devices; none for an executor elsewhere)."""
    from benchmark.execution import devices

    if trials < 1 or workers < 1:
        raise ConfigError(f"--trials and --workers must be >= 1, got {trials} and {workers}")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {timeout}")
    if sampler not in SAMPLERS or pruner not in PRUNERS:
        raise ConfigError(f"--sampler must be one of {', '.join(SAMPLERS)} and --pruner one of {', '.join(PRUNERS)}")
    if pruner_startup_trials < 0 or (pruner_warmup_steps is not None and pruner_warmup_steps < 0):
        raise ConfigError("--pruner-startup-trials and --pruner-warmup-steps must be >= 0")
    if isinstance(seeds_per_process, bool) or not isinstance(seeds_per_process, int) or seeds_per_process < 1:
        raise ConfigError(f"--seeds-per-process must be >= 1, got {seeds_per_process}")
    if not local:
        return []
    # plan_slots checks the device's name too, without torch (the trials load it in the workers)
    slots = devices.plan_slots(device, devices.visible_gpus(devices.gpu_count()) if device != "cpu" else [], runs_per_gpu, workers)
    if len(slots) < workers:
        raise ConfigError(f"--workers {workers} is more than the GPUs times --runs-per-gpu ({len(slots)} slots)")
    return slots[:workers]


def run_study(
    settings: StudySettings,
    *,
    study_name: str,
    storage_url: str,
    trials: int,
    workers: int,
    tracking_uri: str,
    results_dir: Path,
    sampler: str = "tpe",
    pruner: str = "median",
    pruner_startup_trials: int = 5,
    pruner_warmup_steps: int | None = None,
    timeout: float | None = None,
    device: str = "auto",
    runs_per_gpu: int | None = None,
    seeds_per_process: int = 1,
    console: Console | None = None,
    executor: Executor | None = None,
) -> StudyRun:
    """Create ``study_name`` with ``settings``, or resume it (``settings`` are then the stored
    ones: see ``prepare``), and run ``trials`` more trials, each a task on ``executor`` (default:
    a local pool of ``workers`` processes), each training a trial's seeds ``seeds_per_process``
    at a time as one batched model."""
    import optuna

    console = console or Console(stderr=True, soft_wrap=True, highlight=False)
    quiet_optuna()
    slots = check_options(
        trials=trials,
        workers=workers,
        sampler=sampler,
        pruner=pruner,
        pruner_startup_trials=pruner_startup_trials,
        pruner_warmup_steps=pruner_warmup_steps,
        timeout=timeout,
        device=device,
        runs_per_gpu=runs_per_gpu,
        seeds_per_process=seeds_per_process,
        local=executor is None,
    )
    if seeds_per_process > 1 and agents.algorithm_class(settings.algo).seed_batch is None:
        console.print(f"{settings.algo} has no batched training of seeds: each trial trains its seeds one after another")
    storage = open_storage(storage_url)
    # (another machine may create the same study at this moment: the first setting stored wins)
    study = optuna.create_study(study_name=study_name, storage=storage, direction="maximize", load_if_exists=True)
    if not study.metric_names:  # optuna-dashboard names the objective by it
        study.set_metric_names([OBJECTIVE_NAME])
    if SETTINGS_ATTR not in study.user_attrs:
        study.set_user_attr(SETTINGS_ATTR, settings.to_dict())
        study.set_user_attr("created", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    if study_settings(optuna.load_study(study_name=study_name, storage=storage)) != settings:
        raise ConfigError(f"study {study_name!r} was just created elsewhere with another setting; run the command again to join it")
    optuna.storages.fail_stale_trials(study)
    trials_before = len(study.trials)

    experiment_name = f"tune-{study_name}"
    experiment = tracking.experiment_id(tracking_uri, experiment_name, ResultsDir(results_dir).artifacts)
    claims.directory(results_dir).mkdir(parents=True, exist_ok=True)
    with FileLock(claims.directory(results_dir) / f"study-{study_name}.lock", timeout=120):  # one parent run per study
        parent = _parent_run(tracking_uri, experiment, study_name, settings, storage_url)
    _close_orphaned_trials(tracking_uri, experiment, study)
    parent.set_tags({"sampler": sampler, "pruner": pruner, "workers": workers})  # the latest invocation's
    console.print(
        f"study {study_name!r}: {settings.algo} on {settings.env.describe()}, {trials} more trial(s) after {trials_before}, "
        f"{workers} worker(s), {settings.seeds_per_trial} seed(s) x {settings.budget.total_steps:,} steps per trial "
        + (f"({min(seeds_per_process, settings.seeds_per_trial)} at a time, batched) " if seeds_per_process > 1 else "")
        + f"(base: {settings.base_suite or 'published defaults'}); normalized by random {settings.random_score:.1f} "
        f"and reference {settings.reference_score:.1f}; storage {redact(storage_url)}; MLflow experiment {experiment_name!r}"
    )
    job = TrialJob(
        study_name,
        storage_url,
        settings.to_dict(),
        tracking_uri,
        experiment,
        parent.run_id,
        sampler,
        pruner,
        pruner_startup_trials,
        pruner_warmup_steps,
        time.time() + timeout if timeout else None,
        seeds_per_process,
        workers,
    )
    executor = executor or LocalExecutor(slots)
    running: dict[int, int] = {}  # task -> the trial it runs
    errors: list[str] = []
    submission = executor.submit([TrialTask(job, index) for index in range(trials)], lambda line: console.print(escape(line)))
    try:
        while not submission.done:
            ended = submission.wait(0.5)
            for message in submission.messages():
                if isinstance(message, TrialStarted):
                    running[message.task] = message.trial_number
            for index, result in ended:
                if isinstance(result, BaseException):  # its worker died, or the trial could not start
                    error = f"{type(result).__name__}: {str(result).strip()[-300:]}"
                    errors.append(f"trial task {index}: {error}")
                    _fail_abandoned_trial(storage, study_name, running.get(index), f"its worker ended: {error}")
                elif result is not None:
                    console.print(escape(result.line))
                running.pop(index, None)
    except BaseException as error:
        ignore_further_stop_signals()
        submission.cancel()
        for number in running.values():
            _fail_abandoned_trial(storage, study_name, number, "the invocation was interrupted")
        _close_orphaned_trials(tracking_uri, experiment, optuna.load_study(study_name=study_name, storage=storage))
        parent.fail(error)
        raise
    finally:
        submission.close()
    study = optuna.load_study(study_name=study_name, storage=storage)
    _close_orphaned_trials(tracking_uri, experiment, study)
    counts = {state.name: 0 for state in optuna.trial.TrialState}
    for trial in study.trials:
        counts[trial.state.name] += 1
    best = best_trial(study)
    metrics: dict[str, float] = {f"trials_{state.lower()}": count for state, count in counts.items() if count}
    if best is not None:
        metrics.update({"best_value": best.value, "best_trial": best.number})
        parent.set_tags({"best_trial": best.number, "best_mlflow_run_id": best.user_attrs.get("mlflow_run_id", "")})
    parent.log_metrics(metrics, len(study.trials))
    parent.finish("FAILED" if errors else "FINISHED")
    return StudyRun(study_name, parent.run_id, trials_before, len(study.trials), counts, best, errors)


def _fail_abandoned_trial(storage: Any, study_name: str, number: int | None, why: str) -> None:
    """A worker that died inside a trial (killed, out of memory, cancelled) left it RUNNING:
    mark it FAIL now rather than after the storage's heartbeat grace period (journal files have none)."""
    import optuna

    if number is None:
        return
    study_id = storage.get_study_id_from_name(study_name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    if storage.get_trial(trial_id).state == optuna.trial.TrialState.RUNNING:
        storage.set_trial_user_attr(trial_id, "error", why[:2000])
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)


def _parent_run(tracking_uri: str, experiment: str, study_name: str, settings: StudySettings, storage_url: str) -> tracking.MlflowTracker:
    """The study's parent run in this tracking store: reopened if an earlier invocation made it."""
    client = tracking.client(tracking_uri)
    query = f"tags.kind = 'study' and tags.study = '{study_name}'"
    found = tracking.search_all_runs(client, experiment, query, ["attributes.start_time ASC"])
    if found:
        run_id = found[0].info.run_id
        tracking.retry(lambda: client.update_run(run_id, status="RUNNING"))
        parent = tracking.MlflowTracker(tracking_uri, run_id)
        parent.set_tags({"command": provenance.command_line(), "host": socket.gethostname(), "pid": os.getpid()})
        return parent
    parent = tracking.start_parent_run(tracking_uri, experiment, study_name, {"kind": "study", "study": study_name})
    params = {
        "algo": settings.algo,
        "env_id": settings.env_id,
        "seeds_per_trial": settings.seeds_per_trial,
        "base_suite": settings.base_suite,
        "random_score": settings.random_score,
        "reference_score": settings.reference_score,
        "storage": redact(storage_url),
        "seed": settings.seed,
        **{f"budget.{key}": value for key, value in dataclasses.asdict(settings.budget).items()},
        **{f"base.{key}": value for key, value in settings.base_hyperparameters.items()},
    }
    parent.log_params(params)
    parent.log_text(yaml.safe_dump(settings.space, sort_keys=False), "search_space.yaml")
    parent.set_tags({"reference_source": settings.reference_source[:5000]})
    return parent


def _close_orphaned_trials(tracking_uri: str, experiment: str, study: Any) -> None:
    """Trial runs left RUNNING in MLflow whose trial is no longer running (its worker died):
    marked KILLED with the trial's state."""
    client = tracking.client(tracking_uri)
    states = {trial.number: trial.state.name for trial in study.trials}
    query = f"tags.kind = 'trial' and tags.study = '{study.study_name}' and attributes.status = 'RUNNING'"
    for run in tracking.search_all_runs(client, experiment, query):
        state = states.get(int(run.data.tags.get("trial_number", -1)))
        if state is not None and state != "RUNNING":
            tracker = tracking.MlflowTracker(tracking_uri, run.info.run_id)
            tracker.set_tags({"trial_state": state})
            tracker.finish("KILLED")
