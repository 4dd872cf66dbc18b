"""Before a suite runs: what state each run is in and what the rest will cost.

``run --dry-run`` prints it all; ``run`` prints the per-experiment lines and the total first,
and asks before starting an invocation estimated above ``--max-hours``. A run is:

- ``finished``: a FINISHED run in the tracking store, or held by a result bundle (named);
- ``resumes``: a checkpoint of an interrupted attempt exists; it resumes from that step;
- ``claimed``: another live launch is training it now (who, since when);
- ``to train``: none of these.

Nothing is created or changed: the store is only read when it exists.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark import bundles, metric_names, tracking
from benchmark.bundles import BundledRun
from benchmark.config import PROJECT_ROOT, RunSpec, configurations
from benchmark.execution import claims, estimate
from benchmark.results_layout import ResultsDir
from benchmark.tables import TableData, compact_steps, plural
from benchmark.training import checkpoint_paths


@dataclass(frozen=True)
class RunState:
    spec: RunSpec
    status: str
    """finished | resumes | claimed | to train"""
    detail: str = ""
    """Where it finished (store, a bundle), the step it resumes from, or who holds it."""
    resume_step: int = 0


def run_states(
    specs: list[RunSpec], tracking_uri: str | None, suite_name: str, bundled: dict[str, BundledRun], results_dir: Path, force: bool = False
) -> list[RunState]:
    """The state of each spec, in order (see the module docstring); with ``force`` nothing
    counts as finished and nothing resumes (``run --force`` trains every run afresh)."""
    keys = {spec.run_key for spec in specs}
    in_store = tracking.finished_child_runs(tracking_uri, suite_name, keys) if tracking_uri and not force else {}
    bundled = {} if force else bundled
    claims_dir = claims.directory(results_dir)
    states = []
    for spec in specs:
        key = spec.run_key
        if key in in_store:
            states.append(RunState(spec, "finished", "store"))
        elif key in bundled:
            states.append(RunState(spec, "finished", f"bundle {bundled[key].origin}"))
        elif claims_dir.is_dir() and (holder := claims.holder(claims_dir, key)) is not None:
            states.append(RunState(spec, "claimed", holder.describe()))
        else:
            step = None if force else _checkpoint_step(ResultsDir(results_dir).checkpoints, key)
            if step:
                states.append(RunState(spec, "resumes", f"from step {step:,}", step))
            else:
                states.append(RunState(spec, "to train"))
    return states


def _checkpoint_step(checkpoints: Path, run_key: str) -> int | None:
    """The env step of the run's latest checkpoint, if it has one (reading one loads torch, so a
    run without a checkpoint answers without it)."""
    latest = checkpoint_paths.latest(checkpoints, run_key)
    if not latest.exists():
        return None
    from benchmark.training import checkpoint

    return checkpoint.step_of(latest)


def past_runs(tracking_uri: str | None, bundled: dict[str, BundledRun]) -> list[estimate.PastRun]:
    """The speed of every finished run in the store (every experiment), in ``bundled`` and in the
    checkout's committed record (``results/published``: read for its timings whatever the
    results directory; not of continued runs: their time covers only the steps after the run
    they continue)."""
    found: dict[str, estimate.PastRun] = {}
    for run in [*bundled.values(), *committed_runs()]:
        if run.wall_seconds and run.spec.continued_from is None:
            found.setdefault(run.mlflow_run_id or run.run_key, _bundled_past_run(run))
    if tracking_uri is None:
        return list(found.values())
    client = tracking.client(tracking_uri)
    for experiment in tracking.retry(lambda: client.search_experiments()):
        query = "attributes.status = 'FINISHED' and tags.run_key != ''"
        for run in tracking.search_all_runs(client, experiment.experiment_id, query):
            stored = _past_run(run)
            if stored is not None:
                found.setdefault(run.data.tags.get("original_run_id", run.info.run_id), stored)
    return list(found.values())


def committed_runs() -> list[BundledRun]:
    """Every run of the checkout's committed bundles (``results/published/*``); a bundle that
    cannot be read is left out (the commands that read it as a record name the problem)."""
    published = ResultsDir(PROJECT_ROOT / "results").published
    directories = [d for d in sorted(published.iterdir()) if bundles.is_bundle(d)] if published.is_dir() else []
    return list(_committed_runs(tuple((d, (d / bundles.MANIFEST).stat().st_mtime_ns) for d in directories)))


@functools.lru_cache(maxsize=2)
def _committed_runs(directories: tuple[tuple[Path, int], ...]) -> tuple[BundledRun, ...]:
    runs: list[BundledRun] = []
    for directory, _ in directories:
        try:
            runs += bundles.read(directory).runs.values()
        except bundles.BundleError:
            continue
    return tuple(runs)


def _timing(wall: float, cpu: float | None, batch: int, steps: int) -> tuple[float, str]:
    """Core-seconds per env step of one run of a process that trained ``batch`` seeds, and what timed it."""
    seconds, timed_by = (cpu, "cpu") if cpu else (wall, "wall")
    return seconds / max(batch, 1) / steps, timed_by


def _bundled_past_run(run: BundledRun) -> estimate.PastRun:
    params = tracking.child_params(run.spec)
    batch = max(len(run.batch_seeds), 1)
    assert run.wall_seconds is not None
    per_step, timed_by = _timing(run.wall_seconds, run.cpu_seconds, batch, run.spec.budget.total_steps)
    return estimate.PastRun(
        run.spec.algo,
        run.spec.env_id,
        estimate.config_key(params),
        per_step,
        estimate.work_key(params, batch, run.device or run.spec.device),
        run.provenance.get("cpu_model", ""),
        timed_by,
        _mean_length(run.curve),
    )


def _mean_length(curve: Any) -> float | None:
    """The mean length of a run's evaluation episodes over its evaluations (None: none recorded)."""
    means = [sum(point.lengths) / len(point.lengths) for point in curve if point.lengths]
    return sum(means) / len(means) if means else None


def _past_run(run: Any) -> estimate.PastRun | None:
    params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
    wall = metrics.get(metric_names.FINAL_WALL_SECONDS)
    try:
        steps = int(params["budget.total_steps"])
    except (KeyError, ValueError):
        return None
    if not wall or steps <= 0 or "algo" not in params or "env_id" not in params or tags.get("continued_from"):
        return None
    batch = max(len(tags.get("batch_seeds", "").split()), 1)
    per_step, timed_by = _timing(wall, metrics.get(metric_names.FINAL_CPU_SECONDS), batch, steps)
    return estimate.PastRun(
        params["algo"],
        params["env_id"],
        estimate.config_key(params),
        per_step,
        estimate.work_key(params, batch, tags.get("device", "cpu")),
        tags.get("cpu_model", ""),
        timed_by,
        metrics.get(metric_names.EVAL_LENGTH_MEAN),  # the last evaluation's: the store keeps its history apart
    )


@dataclass
class Plan:
    states: list[RunState]
    cost: estimate.Estimate
    """Of the runs left to train (to train, resumes)."""
    processes: dict[str, int]
    """Run key -> the process it trains in (seeds batched together share one)."""

    @property
    def left(self) -> list[RunState]:
        return [s for s in self.states if s.status in ("to train", "resumes")]

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for state in self.states:
            counts[state.status] = counts.get(state.status, 0) + 1
        return counts


def make_plan(
    specs: list[RunSpec],
    tracking_uri: str | None,
    suite_name: str,
    bundled: dict[str, BundledRun],
    results_dir: Path,
    parallel: int,
    table: dict | None = None,
    force: bool = False,
) -> Plan:
    states = run_states(specs, tracking_uri, suite_name, bundled, results_dir, force)
    left = [s for s in states if s.status in ("to train", "resumes")]
    groups, _ = plan_processes([s.spec for s in left])
    remaining = {s.spec.run_key: max(0.0, 1 - s.resume_step / s.spec.budget.total_steps) for s in left if s.resume_step}
    cost = estimate.estimate(groups, parallel, past_runs(tracking_uri, bundled), table, remaining)
    processes = {spec.run_key: index for index, group in enumerate(groups) for spec in group}
    return Plan(states, cost, processes)


def _steps_left(state: RunState) -> int:
    return max(state.spec.budget.total_steps - state.resume_step, 0) if state.status in ("to train", "resumes") else 0


def unit(plan: Plan) -> str:
    return "GPU-hours" if plan.cost.gpu else "core-hours"


def experiments_table(plan: Plan, title: str) -> TableData:
    """One row per experiment (a configuration of an algorithm on an environment): runs by state,
    env steps left, estimated hours left and what the estimate rests on."""
    by_key = {e.spec.run_key: e for e in plan.cost.runs}
    state_of = {s.spec.run_key: s for s in plan.states}
    table = TableData(
        title,
        ["algo", "env", "runs", "done", "left", "steps left", "hours", "estimated from"],
        names={"env"},
        lists={"algo"},
        right={"runs", "done", "left", "steps left", "hours"},
        caption=f"algo: with the settings its suite gives it beyond the published defaults; steps left: env steps; hours: estimated {unit(plan)} left",
    )
    for label, members in configurations([s.spec for s in plan.states]):
        states = [state_of[spec.run_key] for spec in members]
        left = [s for s in states if s.status in ("to train", "resumes")]
        estimates = [by_key[s.spec.run_key] for s in left]
        seconds = [e.seconds for e in estimates if e.seconds is not None]
        hours = (f"{sum(seconds) / 3600:.2f}" if seconds else "—") + ("+?" if len(seconds) < len(estimates) and seconds else "")
        bases = sorted({e.basis for e in estimates})
        table.add(
            label,
            members[0].env_id,
            len(states),
            sum(s.status == "finished" for s in states),
            len(left),
            f"{sum(_steps_left(s) for s in left):,}",
            hours if estimates else "0",
            "; ".join(bases),
        )
    return table


def runs_table(plan: Plan, title: str) -> TableData:
    """One row per run: its state and, for runs left, its estimated core-hours (its settings are
    its experiment's, in the per-experiment table); short headers, explained in the caption."""
    by_key = {e.spec.run_key: e for e in plan.cost.runs}
    table = TableData(
        title,
        ["run key", "algo", "env", "seed", "steps", "status", "proc", "hours"],
        names={"run key", "algo", "env", "status"},
        right={"seed", "steps", "proc", "hours"},
    )
    elsewhere: dict[str, set[str]] = {"bundle": set(), "claimed": set()}
    for state in plan.states:
        spec = state.spec
        found = by_key.get(spec.run_key)
        hours = f"{found.seconds / 3600:.2f}" if found is not None and found.seconds is not None else ("?" if found else "")
        status = state.status
        if state.status == "resumes":
            status = f"resumes at {compact_steps(state.resume_step)}"
        elif state.detail.startswith("bundle "):
            status = "in bundle"
            elsewhere["bundle"].add(state.detail.removeprefix("bundle "))
        elif state.status == "claimed":
            elsewhere["claimed"].add(state.detail)
        table.add(spec.run_key, spec.algo, spec.env_id, spec.seed, compact_steps(spec.budget.total_steps), status, plan.processes.get(spec.run_key, ""), hours)
    notes = ["proc: the process that trains it (one process trains its runs as one batch of seeds)", f"hours: estimated {unit(plan)} left"]
    if elsewhere["bundle"]:
        notes.append(f"in bundle: finished in {', '.join(sorted(elsewhere['bundle']))}")
    if elsewhere["claimed"]:
        notes.append(f"claimed: another launch trains it ({'; '.join(sorted(elsewhere['claimed']))})")
    table.caption = "; ".join(notes)
    return table


def total_line(plan: Plan, workers_text: str) -> str:
    """The bottom line: runs by state, steps and hours left, wall time with the workers."""
    counts = plan.counts()
    cost = plan.cost
    parts = [
        f"{len(plan.states)} {plural(len(plan.states), 'run')}: "
        + ", ".join(f"{counts[s]} {s}" for s in ("finished", "resumes", "claimed", "to train") if counts.get(s))
    ]
    left = plan.left
    if left:
        steps = sum(_steps_left(s) for s in left)
        if len(cost.unknown) < len(cost.runs):
            at_least = "at least " if cost.unknown else "about "
            parts.append(
                f"{steps:,} env steps left, {at_least}{cost.known_seconds / 3600:.{2 if cost.known_seconds < 36_000 else 1}f} {unit(plan)}"
                f" and {estimate.hours(cost.wall_seconds)} of wall time with {workers_text}"
            )
        else:
            parts.append(f"{steps:,} env steps left")
        if cost.unknown:
            names = sorted({f"{e.spec.algo} on {e.spec.env_id}" for e in cost.unknown})
            parts.append(
                f"{len(cost.unknown)} {plural(len(cost.unknown), 'run')} not estimated, with no finished run or throughput data for "
                f"{', '.join(names[:6])}{' ...' if len(names) > 6 else ''} (python -m benchmark calibrate --algos ... --envs ...)"
            )
    else:
        parts.append("nothing left to train")
    return "; ".join(parts)


def default_bundles(results_dir: Path, suite_name: str, from_dirs: list[Path] | None, published: bool) -> dict[str, BundledRun]:
    """The runs of the bundles a command reads (``--from`` ones and the suite's published one)."""
    return bundles.read_all(bundles.sources(results_dir, suite_name, from_dirs, published))


def plan_processes(specs: list[RunSpec]) -> tuple[list[list[RunSpec]], list[str]]:
    """The specs in process groups, in suite order: specs that differ only by seed and ask for
    ``seeds_per_process`` N > 1 go N at a time (trained as one batched model); every other spec
    alone. Also one notice per configuration that asked for batching but cannot have it (its
    seeds then train one per process)."""
    groups: list[list[RunSpec]] = []
    filling: dict[str, list[RunSpec]] = {}
    reasons: dict[str, str | None] = {}
    notices: list[str] = []
    for spec in specs:
        if spec.seeds_per_process > 1:
            from benchmark.training import loop as training_loop  # whether a learner batches seeds: torch

            key = training_loop.batch_key(spec)
            if key not in reasons:
                reasons[key] = training_loop.batchable(spec)
                if reasons[key]:
                    notices.append(f"{spec.algo} on {spec.env_id}: one seed per process ({reasons[key]})")
            if reasons[key] is None:
                group = filling.get(key)
                if group is None or len(group) >= spec.seeds_per_process:
                    group = filling[key] = []
                    groups.append(group)
                group.append(spec)
                continue
        groups.append([spec])
    return groups, notices


def no_update_problem(spec: Any, steps: int, refilling: bool = False) -> tuple[str, int] | None:
    """Where ``steps`` env steps of ``spec`` end before its first gradient step (a run that
    trains nothing): (what to say, the steps it needs), else None."""
    import agents

    needed, why = agents.resolve_config(spec.algo, spec.hyperparameters).first_update(refilling)
    if steps >= needed:
        return None
    return f"{spec.algo} on {spec.env_id}: {steps:,} env steps end before the first gradient step, at env step {needed:,} ({why})", needed
