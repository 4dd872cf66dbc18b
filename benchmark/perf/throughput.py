"""Throughput side by side with Stable-Baselines3: ``make perf`` / ``python -m benchmark perf``.

For PPO, SAC and TD3 on HalfCheetah-v5 and DQN on CartPole-v1, one invocation alternates our
training loop and SB3's (the optional ``compare`` extra) at identical hyperparameters, network
sizes, env, torch threads and step counts. Every measurement is a fresh process, and pairs
alternate their order (ours first, then SB3 first, ...) so drift in the machine's speed
cancels. Each pair also measures the case's bound:

* ``env``: the env alone with pre-sampled random actions (PPO and DQN, whose networks are so
  small that the env and per-step overhead are the limit);
* ``floor``: the update's forward and backward passes in a bare loop at the same sizes (SAC
  and TD3, whose time is matrix products).

Reported: the medians over pairs of steps/s, our/SB3 ratio (median of the per-pair ratios),
our fraction of the bound, and peak resident memory; plus the bytes of a full 1M-transition
HalfCheetah replay buffer against the raw bytes of its fields. Written as JSON to
``results/perf/compare.json``. ``--profile`` adds where our time goes per env step.

Batched seeds (``measure_batched``, written to ``results/perf/batched.json``): for N seeds of
one setting, the aggregate env steps/s of N separate runs (one process each, as many at once as
the machine has cores, the steady state of the runner's pool) against the same N seeds trained
as one batched model in one process, and N split over one batched process per core.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from agents.errors import ConfigError

HALF_CHEETAH, CARTPOLE = "HalfCheetah-v5", "CartPole-v1"
PAIRS_DEFAULT = 3
REPLAY_CAPACITY = 1_000_000
REPLAY_TARGET = 1.2  # at most this times the raw bytes of a transition's fields


@dataclass(frozen=True)
class Case:
    """One algorithm's comparison: the same setting expressed for both libraries."""

    name: str
    env_id: str
    steps: int
    """Env steps per measurement (scaled by --scale)."""
    ours: dict[str, Any]
    """Our hyperparameters (on top of the algorithm's defaults)."""
    sb3: dict[str, Any]
    """Stable-Baselines3 constructor arguments."""
    bound: str
    """'env' or 'floor': what this case's rate is compared with."""
    target: float
    """Our/SB3 steps/s ratio aimed at."""
    bound_target: float | None = None
    """Smallest fraction of the bound's rate aimed at (None: none)."""
    floor: dict[str, Any] = field(default_factory=dict)
    """Sizes of the bare update loop (bound 'floor')."""


# SB3's own defaults (2.x) written out, and ours set to match them exactly.
CASES: dict[str, Case] = {
    "ppo": Case(
        "ppo", HALF_CHEETAH, 8_192,
        ours=dict(num_envs=1, num_steps=2048, num_minibatches=32, num_epochs=10, learning_rate=3e-4, gamma=0.99,
                  gae_lambda=0.95, clip_range=0.2, value_clip_range=None, value_coef=0.5, max_grad_norm=0.5,
                  entropy_method="no_entropy", policy_ent_coeff=0.0, hidden_sizes=(64, 64), activation="tanh",
                  initial_log_std=0.0, normalize_observations=False, normalize_rewards=False, anneal_lr=False),
        sb3=dict(n_steps=2048, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95,
                 clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                 policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn="tanh", log_std_init=0.0)),
        bound="env", target=1.5,
    ),
    "sac": Case(
        "sac", HALF_CHEETAH, 1_500,
        ours=dict(num_envs=1, buffer_size=1_000_000, batch_size=256, start_steps=100, learning_starts=100,
                  update_every=1, gradient_steps=1, actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4, tau=0.005,
                  gamma=0.99, initial_alpha=1.0, hidden_sizes=(256, 256), activation="relu"),
        sb3=dict(buffer_size=1_000_000, batch_size=256, learning_starts=100, train_freq=1, gradient_steps=1,
                 learning_rate=3e-4, tau=0.005, gamma=0.99, ent_coef="auto_1.0",
                 policy_kwargs=dict(net_arch=[256, 256], activation_fn="relu")),
        bound="floor", target=1.3, bound_target=1 / 1.5,
        floor=dict(hidden_sizes=(256, 256), batch_size=256),
    ),
    "td3": Case(
        "td3", HALF_CHEETAH, 1_500,
        ours=dict(num_envs=1, buffer_size=1_000_000, batch_size=256, start_steps=100, learning_starts=100,
                  update_every=1, gradient_steps=1, actor_lr=1e-3, critic_lr=1e-3, tau=0.005, gamma=0.99,
                  policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5, exploration_noise="gaussian",
                  noise_sigma=0.1, hidden_sizes=(400, 300), activation="relu"),
        sb3=dict(buffer_size=1_000_000, batch_size=256, learning_starts=100, train_freq=1, gradient_steps=1,
                 learning_rate=1e-3, tau=0.005, gamma=0.99, policy_delay=2, target_policy_noise=0.2,
                 target_noise_clip=0.5, action_noise_sigma=0.1, policy_kwargs=dict(net_arch=[400, 300], activation_fn="relu")),
        bound="floor", target=1.3, bound_target=1 / 1.5,
        floor=dict(hidden_sizes=(400, 300), batch_size=256),
    ),
    "dqn": Case(
        "dqn", CARTPOLE, 20_000,
        # SB3 counts target_update_interval in env steps (10,000); ours in gradient steps (every 4 env steps)
        ours=dict(num_envs=1, buffer_size=1_000_000, batch_size=32, learning_starts=100, update_every=4,
                  gradient_steps=1, learning_rate=1e-4, gamma=0.99, tau=1.0, target_update_every=2_500,
                  exploration_fraction=0.1, epsilon_start=1.0, epsilon_final=0.05, max_grad_norm=10.0,
                  double_q=False, dueling=False, huber=True, hidden_sizes=(64, 64), activation="relu"),
        sb3=dict(buffer_size=1_000_000, batch_size=32, learning_starts=100, train_freq=4, gradient_steps=1,
                 learning_rate=1e-4, gamma=0.99, tau=1.0, target_update_interval=10_000, exploration_fraction=0.1,
                 exploration_initial_eps=1.0, exploration_final_eps=0.05, max_grad_norm=10.0,
                 policy_kwargs=dict(net_arch=[64, 64], activation_fn="relu")),
        bound="env", target=1.5,
    ),
}
ENV_STEPS = {HALF_CHEETAH: 20_000, CARTPOLE: 50_000}
FLOOR_UPDATES = 300


@dataclass
class Measured:
    """One case's measurements, one entry per pair."""

    case: Case
    steps: int
    """Env steps (updates, for a floor) of each of our and SB3's measurements."""
    ours: list[dict[str, Any]] = field(default_factory=list)
    sb3: list[dict[str, Any]] = field(default_factory=list)
    bound: list[dict[str, Any]] = field(default_factory=list)

    def rates(self, side: str) -> list[float]:
        return [m["steps_per_second"] for m in getattr(self, side)]

    def summary(self) -> dict[str, Any]:
        ours, sb3, bound = self.rates("ours"), self.rates("sb3"), self.rates("bound")
        out: dict[str, Any] = {
            "ours_steps_per_second": statistics.median(ours),
            "ours_peak_rss_mb": max(m["peak_rss_mb"] for m in self.ours),
            "bound": self.case.bound,
            "bound_steps_per_second": statistics.median(bound),
            "fraction_of_bound": statistics.median(o / b for o, b in zip(ours, bound)),
            "target_ratio": self.case.target,
            "target_fraction_of_bound": self.case.bound_target,
        }
        if sb3:
            out.update(
                sb3_steps_per_second=statistics.median(sb3),
                sb3_peak_rss_mb=max(m["peak_rss_mb"] for m in self.sb3),
                ratio=statistics.median(o / s for o, s in zip(ours, sb3)),
                ratio_per_pair=[o / s for o, s in zip(ours, sb3)],
            )
            out["target_met"] = out["ratio"] >= self.case.target and (
                self.case.bound_target is None or out["fraction_of_bound"] >= self.case.bound_target
            )
        return out


def run_job(job: dict[str, Any], timeout: float = 1800.0) -> dict[str, Any]:
    """Run one measurement in a fresh Python process; its result dict."""
    with tempfile.TemporaryDirectory(prefix="reprorl-perf-") as directory:
        output = Path(directory) / "result.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(job.get("threads", 1)), "MKL_NUM_THREADS": str(job.get("threads", 1))}
        completed = subprocess.run(
            [sys.executable, "-m", "benchmark.perf.worker", json.dumps(job), str(output)],
            capture_output=True, text=True, timeout=timeout, env=env,
        )
        if completed.returncode != 0 or not output.exists():
            tail = "\n".join(completed.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"perf measurement {job['kind']} {job.get('algo', job.get('env_id'))} failed (exit {completed.returncode}):\n{tail}")
        return json.loads(output.read_text())


def run_concurrently(jobs: list[dict[str, Any]], timeout: float = 3600.0) -> list[dict[str, Any]]:
    """Run ``jobs`` in fresh processes that start training together (after every one of them has
    imported and reached the barrier); their results, in order."""
    with tempfile.TemporaryDirectory(prefix="reprorl-perf-") as directory:
        barrier = Path(directory)
        processes = []
        for index, job in enumerate(jobs):
            threads = str(job.get("threads", 1))
            env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
            arguments = json.dumps({**job, "barrier": str(barrier), "index": index})
            output = barrier / f"result-{index}.json"
            processes.append((subprocess.Popen([sys.executable, "-m", "benchmark.perf.worker", arguments, str(output)],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env), output))
        try:
            deadline = time.monotonic() + timeout
            while sum(1 for _ in barrier.glob("ready-*")) < len(jobs):
                if any(process.poll() is not None for process, _ in processes) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            (barrier / "go").touch()
            results = []
            for (process, output), job in zip(processes, jobs):
                _, errors = process.communicate(timeout=max(deadline - time.monotonic(), 1.0))
                if process.returncode != 0 or not output.exists():
                    tail = "\n".join(errors.strip().splitlines()[-15:])
                    raise RuntimeError(f"perf measurement {job['kind']} {job.get('algo')} seeds {job.get('seeds')} failed (exit {process.returncode}):\n{tail}")
                results.append(json.loads(output.read_text()))
            return results
        finally:
            for process, _ in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()


def _jobs(case: Case, scale: float, threads: int, seed: int) -> dict[str, dict[str, Any]]:
    steps = max(int(case.steps * scale), 1)
    if case.name == "ppo":  # whole rollouts: both libraries update only at rollout ends
        steps = max(steps // 2048, 1) * 2048
    common = {"algo": case.name, "env_id": case.env_id, "steps": steps, "threads": threads, "seed": seed}
    jobs = {"ours": {**common, "kind": "ours", "hyperparameters": case.ours}, "sb3": {**common, "kind": "sb3", "hyperparameters": case.sb3}}
    if case.bound == "env":
        jobs["bound"] = {"kind": "env", "env_id": case.env_id, "steps": max(int(ENV_STEPS[case.env_id] * scale), 100), "seed": seed, "threads": threads}
    else:
        from agents.envs import env_spec

        spec = env_spec(case.env_id)
        jobs["bound"] = {
            "kind": "floor", "algo": case.name, "steps": max(int(FLOOR_UPDATES * scale), 10), "threads": threads, "seed": seed,
            "obs_dim": spec.observation_shape[0], "action_dim": spec.num_actions, **case.floor,
        }
    return jobs


def check_arguments(cases: list[str], pairs: int, scale: float, threads: int, batched_only: bool = False) -> None:
    """ConfigError naming an unknown case or an out-of-range count (``BATCHED_EXTRA`` cases
    only with ``batched_only``: they have no peer comparison)."""
    known = BATCHED_CASES if batched_only else tuple(CASES)
    unknown = [name for name in cases if name not in known]
    if unknown:
        extra = [name for name in unknown if name in BATCHED_EXTRA]
        hint = f" ({', '.join(extra)}: batched rows only, with --batched-only)" if extra else ""
        raise ConfigError(f"unknown perf case(s) {', '.join(unknown)}; choose from {', '.join(known)}{hint}")
    if pairs < 1:
        raise ConfigError(f"--pairs must be >= 1, got {pairs}")
    if threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    if not scale > 0:
        raise ConfigError(f"--scale must be > 0, got {scale}")


def check_sb3() -> str:
    """SB3's version; ConfigError when the compare extra is not installed."""
    try:
        import stable_baselines3
    except ImportError:
        raise ConfigError(
            "Stable-Baselines3 is not installed: `make perf` installs it (the compare extra), or "
            "pip install -e '.[compare]'; --no-compare measures ours and the bounds only"
        ) from None
    return stable_baselines3.__version__


def measure(
    cases: list[str],
    pairs: int = PAIRS_DEFAULT,
    scale: float = 1.0,
    threads: int = 1,
    compare: bool = True,
    on_measurement: Callable[[str, str, int, dict[str, Any]], None] | None = None,
) -> dict[str, Measured]:
    """``pairs`` alternating pairs per case (ours/SB3, then SB3/ours, ...) with the bound beside each."""
    check_arguments(cases, pairs, scale, threads)
    results = {name: Measured(CASES[name], _jobs(CASES[name], scale, threads, 0)["ours"]["steps"]) for name in cases}
    for pair in range(pairs):
        for name in cases:
            jobs = _jobs(CASES[name], scale, threads, seed=pair)
            order = ["ours", "sb3"] if pair % 2 == 0 else ["sb3", "ours"]
            if not compare:
                order.remove("sb3")
            for side in [*order, "bound"]:
                measurement = run_job(jobs[side])
                getattr(results[name], side).append(measurement)
                if on_measurement is not None:
                    on_measurement(name, side, pair, measurement)
    return results


def profile(cases: list[str], scale: float = 1.0, threads: int = 1) -> dict[str, dict[str, Any]]:
    """Where our time goes per env step in each case, and cProfile's top functions (a second run)."""
    profiles = {}
    for name in cases:
        job = _jobs(CASES[name], scale, threads, seed=0)["ours"]
        sections = run_job({**job, "profile": True})
        functions = run_job({**job, "functions": True})
        profiles[name] = {
            "steps_per_second": sections["steps_per_second"],
            "microseconds_per_step": sections["profile"]["microseconds_per_step"],
            "calls": sections["profile"]["calls"],
            "top_functions": functions["top_functions"],
        }
    return profiles


BATCHED_COUNTS = (1, 4, 10)
BATCHED_EXTRA: dict[str, tuple[str, dict[str, Any], int]] = {
    "a2c": (HALF_CHEETAH, {}, 16 * 5),
    "vpg": (HALF_CHEETAH, {}, 4_000),
    "reinforce": (HALF_CHEETAH, {}, 4_000),
    "ppo_kl": (HALF_CHEETAH, {}, 2_048),
    "trpo": (HALF_CHEETAH, {}, 2_048),
    "mpo": (HALF_CHEETAH, {"start_steps": 100, "learning_starts": 100}, 1),
}
"""Cases measured in the batched rows only (no peer comparison): the environment, our
hyperparameters on top of the published defaults (the suites' settings) and the env steps of
one rollout at those defaults (measurements cover whole rollouts)."""
BATCHED_CASES = (*CASES, *BATCHED_EXTRA)
BATCHED_STEPS = {"ppo": 4_096, "sac": 600, "td3": 600, "dqn": 10_000, "a2c": 8_000, "vpg": 8_000, "reinforce": 8_000, "ppo_kl": 4_096,
                 "trpo": 4_096, "mpo": 600}
"""Env steps per seed of a batched measurement (SAC, TD3 and MPO update from step 100 on; the
on-policy counts are whole rollouts of their defaults)."""
BATCHED_GPU_TARGET = ("sac", 10, 5.0)
"""The issue's aim on a GPU: SAC, 10 seeds in one process, 5x the aggregate rate of 10 separate processes."""


def batched_setting(name: str) -> tuple[str, dict[str, Any]]:
    """The environment and our hyperparameters of batched case ``name``."""
    if name in CASES:
        return CASES[name].env_id, CASES[name].ours
    env_id, ours, _ = BATCHED_EXTRA[name]
    return env_id, ours


def split_seeds(seeds: Sequence[int], processes: int) -> list[list[int]]:
    """``seeds`` dealt into ``processes`` contiguous groups whose sizes differ by at most one."""
    count = min(processes, len(seeds))
    size, extra = divmod(len(seeds), count)
    groups, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        groups.append(list(seeds[start:end]))
        start = end
    return groups


def measure_batched(
    cases: list[str],
    counts: Sequence[int] = BATCHED_COUNTS,
    repeats: int = 1,
    scale: float = 1.0,
    threads: int = 1,
    device: str = "cpu",
    cores: int | None = None,
    on_measurement: Callable[[str, int, str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """For each case and N in ``counts``: the aggregate steps/s (summed over seeds) of

    * ``separate``: N runs of one seed each in their own processes, ``min(N, cores)`` of them at
      once (what the runner's pool sustains: more processes than cores only share them);
    * ``one_process``: the N seeds as one batched model in one process;
    * ``per_core``: the N seeds dealt over ``min(N, cores)`` batched processes at once (when N > cores).

    Medians over ``repeats``; ratios are against ``separate``."""
    cores = cores or os.cpu_count() or 1
    rows: dict[str, list[dict[str, Any]]] = {}
    settings = {name: batched_setting(name) for name in cases}
    for name in cases:
        env_id, ours = settings[name]
        steps = max(int(BATCHED_STEPS[name] * scale), 1)
        rollout = BATCHED_EXTRA[name][2] if name in BATCHED_EXTRA else ours.get("num_steps", 1) * ours.get("num_envs", 1) if name == "ppo" else 1
        steps = max(steps // rollout, 1) * rollout
        common = {"kind": "seeds", "algo": name, "env_id": env_id, "steps": steps, "threads": threads,
                  "hyperparameters": ours, "device": device}
        measured: dict[tuple[str, int], list[dict[str, Any]]] = {}

        def measure(mode: str, count: int, groups: list[list[int]]) -> None:
            for repeat in range(repeats):
                results = run_concurrently([{**common, "seeds": group} for group in groups])
                entry = {
                    "steps_per_second": sum(result["steps_per_second"] for result in results),
                    "processes": len(groups), "seeds_per_process": [len(group) for group in groups],
                    "peak_rss_mb": sum(result["peak_rss_mb"] for result in results),
                }
                measured.setdefault((mode, count), []).append(entry)
                if on_measurement is not None:
                    on_measurement(name, count, mode, entry)

        for concurrent in sorted({min(count, cores) for count in counts}):
            measure("separate", concurrent, [[seed] for seed in range(concurrent)])
        case_rows = []
        for count in counts:
            seeds = list(range(count))
            if count > 1:
                measure("one_process", count, [seeds])
            if count > cores:
                measure("per_core", count, split_seeds(seeds, cores))
            separate = _median_entry(measured[("separate", min(count, cores))])
            row: dict[str, Any] = {
                "seeds": count, "steps": steps,
                "separate": {**separate, "runs": count, "at_once": min(count, cores)},
                "one_process": _median_entry(measured[("one_process", count)]) if count > 1 else separate,
            }
            if count > cores:
                row["per_core"] = _median_entry(measured[("per_core", count)])
            for mode in ("one_process", "per_core"):
                if mode in row:
                    row[f"{mode}_ratio"] = row[mode]["steps_per_second"] / separate["steps_per_second"]
            if device.startswith("cuda") and (name, count) == BATCHED_GPU_TARGET[:2]:
                row["target_ratio"] = BATCHED_GPU_TARGET[2]
                row["target_met"] = row["one_process_ratio"] >= BATCHED_GPU_TARGET[2]
            case_rows.append(row)
        rows[name] = case_rows
    return {
        "created": now(), "machine": machine(),
        "settings": {"cases": cases, "counts": list(counts), "repeats": repeats, "scale": scale, "threads": threads,
                     "device": device, "cores": cores},
        "cases": {name: {"env_id": settings[name][0], "hyperparameters": settings[name][1], "rows": rows[name]} for name in cases},
    }


def _median_entry(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The entry with the median rate (the lower middle one for an even count), with every rate."""
    ordered = sorted(entries, key=lambda entry: entry["steps_per_second"])
    return {**ordered[(len(ordered) - 1) // 2], "all_steps_per_second": [entry["steps_per_second"] for entry in entries]}


def replay_memory(capacity: int = REPLAY_CAPACITY) -> dict[str, Any]:
    """Bytes of a full HalfCheetah replay buffer against the raw bytes of its fields."""
    measured = run_job({"kind": "memory", "env_id": HALF_CHEETAH, "capacity": capacity})
    measured["ratio"] = measured["tensor_bytes"] / measured["raw_bytes"]
    measured["rss_ratio"] = measured["rss_increase_bytes"] / measured["raw_bytes"]
    measured["target_ratio"] = REPLAY_TARGET
    return measured


def machine() -> dict[str, Any]:
    """The machine and the versions a measurement ran with (read from the installed packages'
    metadata: importing torch here would cost the measuring parent seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    from benchmark.provenance import code_version, cpu_model

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": cpu_model(),
        "cpus": os.cpu_count(),
        "torch": version("torch"),
        **code_version(),
    }
    try:
        info["stable_baselines3"] = version("stable_baselines3")
    except PackageNotFoundError:
        pass
    return info


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def report(
    results: dict[str, Measured],
    memory: dict[str, Any] | None,
    profiles: dict[str, dict[str, Any]] | None,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """Everything measured as one JSON-ready dict."""
    return {
        "created": now(),
        "machine": machine(),
        "settings": settings,
        "cases": {
            name: {
                "env_id": measured.case.env_id,
                "steps": measured.steps,
                "ours_hyperparameters": measured.case.ours,
                "sb3_hyperparameters": measured.case.sb3,
                "summary": measured.summary(),
                "measurements": {"ours": measured.ours, "sb3": measured.sb3, "bound": measured.bound},
            }
            for name, measured in results.items()
        },
        "replay_memory": memory,
        "profiles": profiles,
    }


def write(data: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=2, default=str) + "\n")
    temporary.replace(path)
    return path
