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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.errors import ConfigError
from benchmark.perf.cases import (  # the settings measured: re-exported for the command and the tests
    BATCHED_ALGORITHMS,
    BATCHED_CASES,
    BATCHED_COUNTS,
    BATCHED_EXTRA,
    BATCHED_GPU_TARGET,
    BATCHED_STEPS,
    CASES,
    ENV_STEPS,
    FLOOR_UPDATES,
    HALF_CHEETAH,
    PAIRS_DEFAULT,
    REPLAY_CAPACITY,
    REPLAY_TARGET,
    Case,
    batched_setting,
)


@dataclass
class Measured:
    """One case's measurements, one entry per pair."""

    case: Case
    steps: int
    """Env steps (updates, for a floor) of each of our and SB3's measurements."""
    ours: list[dict[str, Any]] = field(default_factory=list)
    sb3: list[dict[str, Any]] = field(default_factory=list)
    sbx: list[dict[str, Any]] = field(default_factory=list)
    bound: list[dict[str, Any]] = field(default_factory=list)
    stacked_floor: list[dict[str, Any]] = field(default_factory=list)
    """The update floor with the twin critics stacked into one network (floor cases only)."""

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
        if self.stacked_floor:
            stacked = self.rates("stacked_floor")
            out["stacked_floor_steps_per_second"] = statistics.median(stacked)
            out["fraction_of_stacked_floor"] = statistics.median(o / b for o, b in zip(ours, stacked))
        for side, ratio in (("sb3", "ratio"), ("sbx", "sbx_ratio")):  # SB3's ratio keeps its first name
            measured = getattr(self, side)
            if measured:
                ratios = [o / p for o, p in zip(ours, self.rates(side))]
                out[f"{side}_steps_per_second"] = statistics.median(self.rates(side))
                out[f"{side}_peak_rss_mb"] = max(m["peak_rss_mb"] for m in measured)
                out[ratio], out[f"{ratio}_per_pair"] = statistics.median(ratios), ratios
        if sb3:
            out["target_met"] = out["ratio"] >= self.case.target and (self.case.bound_target is None or out["fraction_of_bound"] >= self.case.bound_target)
        if self.sbx:
            out["sbx_target_ratio"] = self.case.sbx_target
            out["target_met"] = out.get("target_met", True) and out["sbx_ratio"] >= self.case.sbx_target
        return out


def run_job(job: dict[str, Any], timeout: float = 1800.0) -> dict[str, Any]:
    """Run one measurement in a fresh Python process; its result dict."""
    with tempfile.TemporaryDirectory(prefix="reprorl-perf-") as directory:
        output = Path(directory) / "result.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(job.get("threads", 1)), "MKL_NUM_THREADS": str(job.get("threads", 1))}
        completed = subprocess.run(
            [sys.executable, "-m", "benchmark.perf.worker", json.dumps(job), str(output)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
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
            processes.append(
                (
                    subprocess.Popen(
                        [sys.executable, "-m", "benchmark.perf.worker", arguments, str(output)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                        env=env,
                    ),
                    output,
                )
            )
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
    jobs = {
        "ours": {**common, "kind": "ours", "hyperparameters": case.ours},
        "sb3": {**common, "kind": "sb3", "hyperparameters": case.sb3},
        "sbx": {**common, "kind": "sbx", "hyperparameters": case.sb3, "absent": list(case.sbx_absent)},
    }
    if case.bound == "env":
        jobs["bound"] = {"kind": "env", "env_id": case.env_id, "steps": max(int(ENV_STEPS[case.env_id] * scale), 100), "seed": seed, "threads": threads}
    else:
        from agents.envs import env_spec

        spec = env_spec(case.env_id)
        jobs["bound"] = {
            "kind": "floor",
            "algo": case.name,
            "steps": max(int(FLOOR_UPDATES * scale), 10),
            "threads": threads,
            "seed": seed,
            "obs_dim": spec.observation_shape[0],
            "action_dim": spec.num_actions,
            **case.floor,
        }
        jobs["stacked_floor"] = {**jobs["bound"], "stacked": True}
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


def check_sbx() -> str:
    """SBX's version; ConfigError when the compare-jax extra is not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("sbx-rl")
    except PackageNotFoundError:
        raise ConfigError(
            "Stable Baselines Jax (sbx-rl) is not installed: `make perf` installs it (the compare-jax extra), or "
            "pip install -e '.[compare-jax]'; --no-jax leaves it out"
        ) from None


def measure(
    cases: list[str],
    pairs: int = PAIRS_DEFAULT,
    scale: float = 1.0,
    threads: int = 1,
    compare: bool = True,
    on_measurement: Callable[[str, str, int, dict[str, Any]], None] | None = None,
    jax: bool = False,
) -> dict[str, Measured]:
    """``pairs`` alternating rounds per case (ours, SB3[, SBX with ``jax``], then the reverse
    order, ...) with the bound beside each."""
    check_arguments(cases, pairs, scale, threads)
    results = {name: Measured(CASES[name], _jobs(CASES[name], scale, threads, 0)["ours"]["steps"]) for name in cases}
    sides = ["ours", *(["sb3"] if compare else []), *(["sbx"] if compare and jax else [])]
    for pair in range(pairs):
        for name in cases:
            jobs = _jobs(CASES[name], scale, threads, seed=pair)
            order = sides if pair % 2 == 0 else sides[::-1]
            for side in [*order, "bound", *(["stacked_floor"] if "stacked_floor" in jobs else [])]:
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
    cuda_graphs: bool = False,
) -> dict[str, Any]:
    """For each case and N in ``counts``: the aggregate steps/s (summed over seeds) of

    * ``separate``: N runs of one seed each in their own processes, ``min(N, cores)`` of them at
      once (what the runner's pool sustains: more processes than cores only share them);
    * ``one_process``: the N seeds as one batched model in one process;
    * ``per_core``: the N seeds dealt over ``min(N, cores)`` batched processes at once (when N > cores).

    Medians over ``repeats``; ratios are against ``separate``. With ``cuda_graphs`` every run,
    separate and batched alike, captures its gradient steps (like against like)."""
    cores = cores or os.cpu_count() or 1
    rows: dict[str, list[dict[str, Any]]] = {}
    settings = {name: batched_setting(name) for name in cases}
    with tempfile.TemporaryDirectory(prefix="reprorl-perf-") as scratch:
        for name, (env_id, ours) in settings.items():
            if BATCHED_ALGORITHMS.get(name, name) == "bc" and ours.get("expert") is None:
                settings[name] = (env_id, {**ours, "expert": expert_dataset(env_id, Path(scratch))})
        measured = _measure_batched(cases, settings, counts, repeats, scale, threads, device, cores, rows, on_measurement, cuda_graphs)
    for name, case in measured["cases"].items():
        if BATCHED_ALGORITHMS.get(name, name) == "bc" and batched_setting(name)[1].get("expert") is None:
            case["hyperparameters"]["expert"] = f"random pairs of {case['env_id']}'s shapes (generated for the measurement)"
    return measured


def expert_dataset(env_id: str, directory: Path, pairs: int = 10_000) -> str:
    """A dataset of ``pairs`` random (observation, action) pairs of ``env_id``'s shapes for BC
    to clone (its speed, not what it learns, is measured); the file's path."""
    import numpy as np

    from agents.envs import env_spec

    spec, rng = env_spec(env_id), np.random.default_rng(0)
    actions = rng.integers(0, spec.num_actions, pairs) if spec.discrete else rng.uniform(-1, 1, (pairs, *spec.action_shape)).astype(np.float32)
    path = directory / f"{env_id}-random.npz"
    np.savez(path, observations=rng.normal(size=(pairs, *spec.observation_shape)).astype(np.float32), actions=actions)
    return str(path)


def _measure_batched(
    cases: list[str],
    settings: dict[str, tuple[str, dict[str, Any]]],
    counts: Sequence[int],
    repeats: int,
    scale: float,
    threads: int,
    device: str,
    cores: int,
    rows: dict[str, list[dict[str, Any]]],
    on_measurement: Callable[[str, int, str, dict[str, Any]], None] | None,
    cuda_graphs: bool,
) -> dict[str, Any]:
    for name in cases:
        env_id, ours = settings[name]
        steps = max(int(BATCHED_STEPS[name] * scale), 1)
        rollout = BATCHED_EXTRA[name][2] if name in BATCHED_EXTRA else ours.get("num_steps", 1) * ours.get("num_envs", 1) if name == "ppo" else 1
        steps = max(steps // rollout, 1) * rollout
        algo = BATCHED_ALGORITHMS.get(name, name)
        common = {"kind": "seeds", "algo": algo, "env_id": env_id, "steps": steps, "threads": threads, "hyperparameters": ours, "device": device}
        if cuda_graphs:
            common["cuda_graphs"] = True
        measured: dict[tuple[str, int], list[dict[str, Any]]] = {}

        def measure(mode: str, count: int, groups: list[list[int]]) -> None:
            for _ in range(repeats):
                results = run_concurrently([{**common, "seeds": group} for group in groups])
                entry = {
                    "steps_per_second": sum(result["steps_per_second"] for result in results),
                    "processes": len(groups),
                    "seeds_per_process": [len(group) for group in groups],
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
            separate = median_entry(measured[("separate", min(count, cores))])
            row: dict[str, Any] = {
                "seeds": count,
                "steps": steps,
                "separate": {**separate, "runs": count, "at_once": min(count, cores)},
                "one_process": median_entry(measured[("one_process", count)]) if count > 1 else separate,
            }
            if count > cores:
                row["per_core"] = median_entry(measured[("per_core", count)])
            for mode in ("one_process", "per_core"):
                if mode in row:
                    row[f"{mode}_ratio"] = row[mode]["steps_per_second"] / separate["steps_per_second"]
            if device.startswith("cuda") and (name, count) == BATCHED_GPU_TARGET[:2]:
                row["target_ratio"] = BATCHED_GPU_TARGET[2]
                row["target_met"] = row["one_process_ratio"] >= BATCHED_GPU_TARGET[2]
            case_rows.append(row)
        rows[name] = case_rows
    return {
        "created": now(),
        "machine": machine(),
        "settings": {
            "cases": cases,
            "counts": list(counts),
            "repeats": repeats,
            "scale": scale,
            "threads": threads,
            "device": device,
            "cores": cores,
            "cuda_graphs": cuda_graphs,
        },
        "cases": {name: {"env_id": settings[name][0], "hyperparameters": settings[name][1], "rows": rows[name]} for name in cases},
    }


def median_entry(entries: list[dict[str, Any]]) -> dict[str, Any]:
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
    for package in ("stable_baselines3", "sbx-rl", "jax"):
        try:
            info[package.replace("-", "_")] = version(package)
        except PackageNotFoundError:
            pass
    return info


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


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
                "measurements": {side: getattr(measured, side) for side in ("ours", "sb3", "sbx", "bound", "stacked_floor")},
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
