"""What a suite will cost before it starts: core-hours per run and the wall time with the workers given.

A run's cost is keyed by what sets its work per env step (``work_key``): the algorithm, the
environment (its kwargs and wrappers), the hyperparameters that change how much is computed
(rollout and batch sizes, network sizes, epochs, update ratio...: every setting but those in
``NO_WORK_SETTINGS``, which change what is learned, not how much), the seeds trained in one
process and the device. The CPU model is preferred, not required. Each run's time comes, best
first, from:

1. finished runs of the same configuration, then of the same work key, in the tracking store or
   in bundles (the checkout's committed record always among them), on this CPU model: core-seconds
   per env step, evaluations included, a run trained in a batch of N seeds counting 1/N of its
   process's time: the median of their processes' CPU times where recorded, else the least of
   their wall times (a wall time counts waiting for a core as well: ``seconds_per_step``), or
   the calibrated figure of 2. on this CPU model where that is lower (the record's PPO Ant-v5
   runs took 2.05 h of wall each beside other work; a 50k-step run timed by its CPU gives
   0.44 h per 1M steps, and calibrate 0.45-0.51 h);
2. the committed throughput table ``results/perf/throughput.csv`` (``python -m benchmark
   calibrate`` measures it: training and evaluation rates of one work key on one core, over
   whole update cycles, CPU time): ``updating steps / train rate + (warm-up steps + evaluation
   steps) / evaluation rate`` (random warm-up actions cost about what evaluation steps do; an
   evaluation's episodes are as long as finished runs of the algorithm on the env evaluated them,
   on average, else the episode cap: ``eval_length``);
3. the same, measured on another CPU model (named);
4. the table's rows of the same algorithm and environment with other settings, then of the same
   algorithm on other environments (marked rough).

A run with none of these is "unknown" and named, so the user can calibrate it. The wall time
deals the runs longest first to ``parallel`` slots, each to the first slot free; the local pool
takes them in suite order instead, so a suite that lists its longest runs first (as the ci
suite does) ends close to this figure. Seeds batched in one process count as one job of their
summed time.
"""

from __future__ import annotations

import csv
import datetime
import functools
import hashlib
import heapq
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agents.errors import ConfigError
from benchmark import provenance
from benchmark.config import PROJECT_ROOT, RunSpec
from benchmark.tables import plural

THROUGHPUT_FILE = PROJECT_ROOT / "results" / "perf" / "throughput.csv"
THROUGHPUT_COLUMNS = (
    "algo",
    "env_id",
    "work_key",
    "seeds_per_process",
    "settings",
    "train_steps_per_second",
    "eval_steps_per_second",
    "cpu_model",
    "torch",
    "steps",
    "measured",
)

NO_WORK_SETTINGS = frozenset(
    {
        # learning rates, discounts, coefficients, clips, noise scales, schedules: what is learned,
        # not how much is computed per step (an unknown setting counts as work: a plug-in's too)
        *("learning_rate", "actor_lr", "critic_lr", "alpha_lr", "value_lr", "context_lr", "dual_lr", "inner_lr", "outer_lr"),
        *("gamma", "gae_lambda", "tau", "alpha", "initial_alpha", "target_entropy", "reward_scale", "entropy_coef", "value_coef"),
        *("clip_range", "value_clip_range", "lr_clip_range", "anneal_lr", "anneal_clip_range", "max_grad_norm", "max_kl", "cg_damping"),
        *("line_search_shrink", "kl_penalty", "kl_target", "kl_lambda", "center_adv", "positive_adv", "stop_entropy_gradient"),
        *("entropy_method", "use_softplus_entropy", "baseline_reg_coef", "critic_weight_decay", "initial_log_std", "activation"),
        *("clip_observations", "clip_rewards", "normalize_observations", "normalize_rewards", "rmsprop_alpha", "rmsprop_eps"),
        *("epsilon", "epsilon_mean", "epsilon_stddev", "epsilon_start", "epsilon_final", "exploration_fraction", "exploration_noise"),
        *("noise_sigma", "ou_theta", "target_policy_noise", "target_noise_clip", "per_alpha", "per_beta", "per_eps", "huber"),
        *("initial_alpha_mean", "initial_alpha_stddev", "initial_temperature", "buffer_size", "ere_eta", "ere_c_min", "ere_anneal"),
        *("policy_mean_reg_coef", "policy_std_reg_coef", "policy_pre_activation_coef"),
        # warm-up steps: priced apart (they act at random and do not update)
        "learning_starts",
        "start_steps",
    }
)
WARM_UP_SETTINGS = ("learning_starts", "start_steps")


@dataclass(frozen=True)
class Throughput:
    """One calibrated work key on one core: env steps per core-second of each run (a batch of N
    seeds in one process: N runs' steps per second of the process's CPU)."""

    algo: str
    env_id: str
    train_steps_per_second: float
    eval_steps_per_second: float
    cpu_model: str = ""
    torch: str = ""
    steps: int = 0
    measured: str = ""
    work_key: str = ""
    """``work_key`` of the calibrated settings ('' : the algorithm's defaults, one seed per process)."""
    seeds_per_process: int = 1
    settings: str = ""
    """The work settings that differ from the algorithm's defaults, for a reader (JSON)."""

    @property
    def row_key(self) -> tuple[str, str]:
        """Its identity in the table: a work key on a CPU model."""
        return (self.work_key, self.cpu_model)


@dataclass(frozen=True)
class PastRun:
    """What a finished run tells about speed: its configuration and core-seconds per env step."""

    algo: str
    env_id: str
    config_key: str
    """Hyperparameters and budget (not the seed): runs of one configuration share it."""
    seconds_per_step: float
    """Per run: its process's CPU seconds (else wall seconds) / seeds in the process / env steps."""
    work_key: str = ""
    cpu_model: str = ""
    timed_by: str = "wall"
    """'cpu' where the process's CPU time was recorded, else 'wall'."""
    eval_length: float | None = None
    """The mean length of its evaluation episodes (env steps), where recorded."""


@dataclass(frozen=True)
class RunEstimate:
    spec: RunSpec
    seconds: float | None
    """Core-seconds (a CPU run uses one core) or GPU-seconds; None when unknown."""
    basis: str
    """Where the figure comes from: 'finished runs (n, same configuration)', 'calibrated', ..."""


@dataclass
class Estimate:
    runs: list[RunEstimate] = field(default_factory=list)
    parallel: int = 1
    wall_seconds: float = 0.0
    """With ``parallel`` slots, longest job first, over the runs with a known time."""

    @property
    def known_seconds(self) -> float:
        return sum(r.seconds for r in self.runs if r.seconds is not None)

    @property
    def unknown(self) -> list[RunEstimate]:
        return [r for r in self.runs if r.seconds is None]

    @property
    def gpu(self) -> bool:
        return any(r.spec.device.startswith("cuda") for r in self.runs)


def config_key(params: dict[str, object]) -> str:
    """What runs of one configuration share, from their MLflow params (``tracking.child_params``:
    the algorithm, environment, budget and hyperparameters) without the seed and suite; the
    hyperparameters in the form run keys hash (``settings_as_keyed``), values compared as text."""
    kept = {key: str(value) for key, value in params.items() if key not in ("seed", "suite") and not key.startswith("hp.")}
    kept.update({f"hp.{key}": value for key, value in settings_as_keyed(params).items()})
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def settings_as_keyed(params: dict[str, object], leave_out: frozenset[str] = frozenset()) -> dict[str, str]:
    """The ``hp.*`` params as run keys hash them (``config.key_form``: stable across renames and
    respellings), as text, without the settings named in ``leave_out`` (this version's names) and
    without those at the algorithm's default: a run recorded before a setting was added (at the
    default it then had implicitly) matches one made now."""
    from benchmark.config import key_form, stored_hyperparameters

    algo = str(params.get("algo"))
    current = stored_hyperparameters(algo, {key[3:]: value for key, value in params.items() if key.startswith("hp.")})
    keyed = {key: str(value) for key, value in key_form(algo, {k: v for k, v in current.items() if k not in leave_out}).items()}
    defaults = _default_settings(algo)
    return {key: value for key, value in keyed.items() if defaults.get(key) != value}


def work_settings(params: dict[str, object]) -> dict[str, str]:
    """The hyperparameters that set the work per env step (every one but ``NO_WORK_SETTINGS``),
    as run keys hash them, where they differ from the algorithm's defaults."""
    return settings_as_keyed(params, NO_WORK_SETTINGS)


@functools.lru_cache(maxsize=64)
def _default_settings(algo: str) -> dict[str, str]:
    """``algo``'s default settings as run keys hash them, as text ({} for an algorithm this
    installation does not have, or a plug-in Config with required fields)."""
    from agents.registry import known_config
    from benchmark.config import key_form

    config = known_config(algo)
    try:
        return {} if config is None else {key: str(value) for key, value in key_form(algo, config().to_dict()).items()}
    except Exception:  # noqa: BLE001 - a plug-in Config that cannot be built without arguments
        return {}


def work_key(params: dict[str, object], seeds_per_process: int, device: str) -> str:
    """What sets a run's core-seconds per env step, from its MLflow params (see the module
    docstring): runs that share it cost the same per step on one CPU model."""
    kept = {
        "algo": str(params.get("algo")),
        "env_id": str(params.get("env_id")),
        "env": {key: str(value) for key, value in params.items() if key.startswith("env.")},
        "settings": work_settings(params),
        "seeds_per_process": max(int(seeds_per_process), 1),
        "device": device_class(device),
    }
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def device_class(device: str | None) -> str:
    """'cuda' for any CUDA device, else 'cpu' ('auto' is priced as a CPU run)."""
    return "cuda" if (device or "").startswith("cuda") else "cpu"


def load_throughput(path: Path = THROUGHPUT_FILE) -> dict[tuple[str, str], Throughput]:
    """(work key, CPU model) -> calibrated throughput; {} when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return {}
    return _load_throughput(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _load_throughput(path: Path, modified: int) -> dict[tuple[str, str], Throughput]:
    table = {}
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in THROUGHPUT_COLUMNS[:7] if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path} lacks the column(s) {', '.join(missing)}; restore it with git checkout or re-run calibrate")
        for number, row in enumerate(reader, start=2):
            try:
                entry = Throughput(
                    row["algo"],
                    row["env_id"],
                    float(row["train_steps_per_second"]),
                    float(row["eval_steps_per_second"]),
                    row.get("cpu_model", ""),
                    row.get("torch", ""),
                    int(row.get("steps") or 0),
                    row.get("measured", ""),
                    row["work_key"],
                    int(row["seeds_per_process"] or 1),
                    row["settings"],
                )
            except (TypeError, ValueError) as error:
                raise ConfigError(f"{path}, row {number}: {error}; restore it with git checkout or re-run calibrate") from None
            if entry.train_steps_per_second <= 0 or entry.eval_steps_per_second <= 0:
                raise ConfigError(f"{path}, row {number}: steps per second must be positive")
            table[entry.row_key] = entry
    return table


def save_throughput(entries: Iterable[Throughput], path: Path = THROUGHPUT_FILE) -> None:
    """Insert or replace rows by (work key, CPU model); rows stay sorted by algorithm and
    environment; the file is replaced atomically."""
    path = Path(path)
    table = dict(load_throughput(path)) if path.exists() else {}
    for entry in entries:
        table[entry.row_key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(THROUGHPUT_COLUMNS)
        for e in sorted(table.values(), key=lambda e: (e.algo, e.env_id, e.seeds_per_process, e.settings, e.cpu_model)):
            writer.writerow(
                [
                    e.algo,
                    e.env_id,
                    e.work_key,
                    e.seeds_per_process,
                    e.settings,
                    f"{e.train_steps_per_second:.1f}",
                    f"{e.eval_steps_per_second:.1f}",
                    e.cpu_model,
                    e.torch,
                    e.steps,
                    e.measured or datetime.date.today().isoformat(),
                ]
            )
    temporary.replace(path)


@functools.lru_cache(maxsize=64)
def episode_cap(env_id: str) -> int:
    """The env's time limit (steps per episode at most); 1000 when gymnasium does not say."""
    import gymnasium as gym

    from agents.envs import registered_id

    try:
        return int(gym.spec(registered_id(env_id)).max_episode_steps or 1000)
    except Exception:  # noqa: BLE001 - an id gymnasium does not know (a task family): a generous guess
        return 1000


def evaluation_steps(spec: RunSpec, length: float | None = None) -> int:
    """Env steps the evaluations take: (total // every + 1) evaluations x episodes x ``length``
    (the mean episode length finished runs evaluated, ``eval_length``), at most the cap (the
    suite's ``env_kwargs`` may set it), which is taken when no length is known."""
    evaluations = spec.budget.total_steps // spec.budget.eval_every + 1
    cap = spec.env_kwargs.get("max_episode_steps")
    cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else episode_cap(spec.env_id)
    return round(evaluations * spec.budget.eval_episodes * (cap if length is None else min(length, cap)))


def eval_length(spec: RunSpec, past: list[PastRun]) -> float | None:
    """The median of the mean evaluation episode lengths that finished runs of ``spec``'s
    algorithm on its environment recorded, whatever their settings and CPU (None: none did).
    Episodes that end early (a Hopper falling) make evaluations far cheaper than the cap says:
    PPO's on Humanoid-v5 averaged 102 steps over the record's runs (the cap: 1,000)."""
    lengths = [p.eval_length for p in past if p.algo == spec.algo and p.env_id == spec.env_id and p.eval_length]
    return statistics.median(lengths) if lengths else None


def warm_up_steps(spec: RunSpec) -> int:
    """Env steps of random actions before the first update (off-policy learners), within the budget."""
    steps = max((int(spec.hyperparameters.get(name) or 0) for name in WARM_UP_SETTINGS), default=0)
    return min(steps, spec.budget.total_steps)


def seconds_from_throughput(spec: RunSpec, rate: Throughput, length: float | None = None) -> float:
    """Core-seconds of one run at ``rate``: updating steps at the training rate, warm-up and
    evaluation steps (episodes of ``length``, else the cap) at the evaluation rate."""
    warm_up = warm_up_steps(spec)
    evaluated = evaluation_steps(spec, length)
    return (spec.budget.total_steps - warm_up) / rate.train_steps_per_second + (warm_up + evaluated) / rate.eval_steps_per_second


@dataclass(frozen=True)
class Keys:
    """What a planned run is matched on: its configuration, its work key, the CPU it will run on."""

    config: str = ""
    work: str = ""
    cpu_model: str = ""


def keys_of(spec: RunSpec, seeds_per_process: int = 1, cpu_model: str | None = None) -> Keys:
    """The keys of ``spec`` trained ``seeds_per_process`` to a process on ``cpu_model`` (this machine's by default)."""
    from benchmark import tracking

    params = tracking.child_params(spec)
    return Keys(config_key(params), work_key(params, seeds_per_process, spec.device), provenance.cpu_model() if cpu_model is None else cpu_model)


def seconds_per_step(runs: list[PastRun]) -> tuple[float, str]:
    """Core-seconds per env step of runs that share a work key, and how it was taken: the median
    of those timed by their process's CPU where there are any; else the least wall time, since a
    wall time counts waiting for a core as well and each is an upper bound of the work (runs of
    one record cell trained beside other work took from 1 to 18 times the least)."""
    timed = [p.seconds_per_step for p in runs if p.timed_by == "cpu"]
    if timed:
        return statistics.median(timed), "CPU time"
    return min(p.seconds_per_step for p in runs), "least wall time"


def estimate_run(spec: RunSpec, past: list[PastRun], table: dict[tuple[str, str], Throughput], keys: Keys | None = None) -> RunEstimate:
    """One run's core-seconds, from the best source available (see the module docstring)."""
    keys = keys or Keys()
    steps = spec.budget.total_steps
    here = [p for p in past if p.cpu_model == keys.cpu_model]
    calibrated = sorted((r for r in table.values() if keys.work and r.work_key == keys.work), key=lambda r: r.cpu_model != keys.cpu_model)
    length = eval_length(spec, past)
    for runs, what in (
        ([p for p in here if keys.config and p.config_key == keys.config and p.work_key == keys.work], "of this configuration"),
        ([p for p in here if keys.work and p.work_key == keys.work], "with this work per step"),
    ):
        if runs:
            per_step, how = seconds_per_step(runs)
            found = f"{len(runs)} finished {plural(len(runs), 'run')} {what}"
            if how != "CPU time" and calibrated and calibrated[0].cpu_model == keys.cpu_model:
                # wall times only bound the work from above: a measurement of it that is lower wins
                rate = calibrated[0]
                measured = seconds_from_throughput(spec, rate, length)
                if measured < per_step * steps:
                    return RunEstimate(spec, measured, f"calibrated {rate.measured}, below the least wall time of {found}")
            return RunEstimate(spec, per_step * steps, f"{found} ({how})")
    if calibrated:  # this CPU's row first
        rate = calibrated[0]
        where = "" if rate.cpu_model == keys.cpu_model else f" on {rate.cpu_model or 'another CPU'}"
        return RunEstimate(spec, seconds_from_throughput(spec, rate, length), f"calibrated{where} {rate.measured}".strip())
    elsewhere = [p for p in past if keys.work and p.work_key == keys.work]
    if elsewhere:
        models = sorted({p.cpu_model or "unknown CPU" for p in elsewhere})
        per_step, how = seconds_per_step(elsewhere)
        return RunEstimate(spec, per_step * steps, f"{len(elsewhere)} finished {plural(len(elsewhere), 'run')} on {', '.join(models)} ({how})")
    pair = [r for r in table.values() if r.algo == spec.algo and r.env_id == spec.env_id]
    if pair:
        rate = min(pair, key=lambda r: (r.cpu_model != keys.cpu_model, r.seeds_per_process, len(r.settings)))
        return RunEstimate(spec, seconds_from_throughput(spec, rate, length), f"rough: {spec.algo} on {spec.env_id} calibrated with other settings")
    others = [r for r in table.values() if r.algo == spec.algo and not r.settings and r.seeds_per_process == 1]
    if others:
        train = statistics.median(r.train_steps_per_second for r in others)
        evaluation = statistics.median(r.eval_steps_per_second for r in others)
        rough = Throughput(spec.algo, spec.env_id, train, evaluation)
        envs = len({r.env_id for r in others})
        return RunEstimate(spec, seconds_from_throughput(spec, rough, length), f"rough: {spec.algo} on {envs} other {plural(envs, 'env')}")
    return RunEstimate(spec, None, "unknown")


def makespan(jobs: list[float], parallel: int) -> float:
    """Wall time of ``jobs`` (seconds) on ``parallel`` slots, longest first to the freest slot."""
    if not jobs:
        return 0.0
    slots = [0.0] * max(1, min(parallel, len(jobs)))
    for job in sorted(jobs, reverse=True):
        heapq.heappush(slots, heapq.heappop(slots) + job)
    return max(slots)


def estimate(
    processes: list[list[RunSpec]],
    parallel: int,
    past: list[PastRun],
    table: dict[tuple[str, str], Throughput] | None = None,
    remaining: dict[str, float] | None = None,
    cpu_model: str | None = None,
) -> Estimate:
    """The estimate for training ``processes`` (the runner's plan: seeds batched in one process
    form one job, priced as batches of that size) with ``parallel`` processes at once on
    ``cpu_model`` (this machine's by default). ``remaining``: run key -> the share of its steps
    still to train (a run resuming halfway: 0.5)."""
    table = load_throughput() if table is None else table
    remaining = remaining or {}
    cpu_model = provenance.cpu_model() if cpu_model is None else cpu_model
    result = Estimate(parallel=parallel)
    jobs = []
    for group in processes:
        estimates = []
        for spec in group:
            found = estimate_run(spec, past, table, keys_of(spec, len(group), cpu_model))
            share = remaining.get(spec.run_key, 1.0)
            if found.seconds is not None and share != 1.0:
                found = RunEstimate(spec, found.seconds * share, found.basis)
            estimates.append(found)
        result.runs += estimates
        known = [e.seconds for e in estimates if e.seconds is not None]
        if known:
            jobs.append(sum(known))
    result.wall_seconds = makespan(jobs, parallel)
    return result


def hours(seconds: float) -> str:
    """'3.2 h', '45 min', '20 s', '12.5 days'."""
    if seconds >= 48 * 3600:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
