"""Side by side with a peer library at equal settings: ``python -m benchmark parity``.

For one algorithm and env, each seed trains our implementation and the same algorithm of
Stable-Baselines3 (sb3-contrib's for TRPO) with identical hyperparameters, network sizes,
normalization and step budget, each in a fresh process, and scores both by one protocol (our
final evaluation: deterministic policy, ``episodes`` episodes on seeded fresh envs, frozen
observation normalization). Every finished seed is written at once to the comparison's record
(``benchmark.analysis.parity_records``: the format, the statistics and the tables), so a killed
invocation loses nothing finished and a rerun trains only the seeds missing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agents.errors import ConfigError
from benchmark.analysis.parity_records import (
    PARITY_DIR,
    SIDES,
    load_record,
    record_path,
    save_run,
)
from benchmark.perf.parity_settings import PEERS, SETTINGS, Setting  # the settings compared (the command and tests read them here)

# ConfigError (agents.api) is imported in the functions that raise it: importing agents starts torch,
# and the command line's parser reads this module (--help must not wait for torch).

EPISODES = 10
DEVICES = ("cpu", "cuda")  # both sides train on the same one; each run records which


def _setting_record(setting: Setting, env_id: str, steps: int, episodes: int) -> dict[str, Any]:
    """The setting as a record stores it (tuples as lists)."""
    return json.loads(
        json.dumps(
            {
                "algo": setting.algo,
                "env_id": env_id,
                "steps": steps,
                "episodes": episodes,
                "source": setting.source,
                "ours": setting.ours_for(env_id),
                "peer": setting.peer,
            }
        )
    )


# ---------------------------------------------------------------- running


def check_arguments(
    algo: str, env_id: str | None, steps: int | None, seeds: Sequence[int], episodes: int, margin: float, workers: int, device: str = "cpu"
) -> None:
    """ConfigError naming the first bad argument."""
    from agents.envs import check_env_id

    if algo not in SETTINGS:
        raise ConfigError(f"parity has no setting for {algo!r}; choose from {', '.join(SETTINGS)}")
    if env_id is not None:
        check_env_id(env_id)
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ConfigError(f"--seeds must be distinct non-negative integers, got {list(seeds)}")
    if episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {episodes}")
    if not margin > 0.0:
        raise ConfigError(f"--margin must be a positive number of normalized units, got {margin}")
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if device not in DEVICES:
        raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no CUDA device here")


def check_peer(algo: str) -> str:
    """The peer library's version; ConfigError when it is not installed."""
    from importlib.util import find_spec

    module, _ = PEERS[algo]
    if find_spec(module) is None:  # found, not imported: it loads torch, which the training processes do
        raise ConfigError(f"{module} is not installed: pip install -e '.[compare]' (make install and make perf add it)")
    return f"{module.replace('_', '-')} {installed_version(module.replace('_', '-'))}"


def installed_version(distribution: str) -> str:
    """An installed distribution's version from its metadata (without importing it), or 'unknown'."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


_CHILDREN: set[subprocess.Popen] = set()
_CHILDREN_LOCK = threading.Lock()


def run_side(job: dict[str, Any], timeout: float = 12 * 3600) -> dict[str, Any]:
    """One side of one seed in a fresh process (one torch thread); its result."""
    with tempfile.TemporaryDirectory(prefix="reprorl-parity-") as directory:
        output = Path(directory) / "result.json"
        threads = str(job["threads"])
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        command = [sys.executable, "-m", "benchmark.perf.parity_worker", json.dumps(job), str(output)]
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        with _CHILDREN_LOCK:
            _CHILDREN.add(child)
        try:
            _, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            _, stderr = child.communicate()
        finally:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(child)
        if child.returncode != 0 or not output.exists():
            tail = "\n".join(stderr.strip().splitlines()[-12:])
            raise RuntimeError(f"parity {job['side']} {job['algo']} {job['env_id']} seed {job['seed']} failed (exit {child.returncode}):\n{tail}")
        return json.loads(output.read_text())


def stop_children() -> None:
    """Kill the training processes still running (an interrupted invocation: their seeds are
    unfinished, so nothing of the record is lost)."""
    with _CHILDREN_LOCK:
        children = list(_CHILDREN)
    for child in children:
        child.kill()


def finished_in_turn(futures: Sequence[Future], poll: float = 0.5) -> Iterator[Future]:
    """The futures as they finish. Polls with ``time.sleep`` instead of ``as_completed``: a
    SIGTERM handler that raises must not land inside a condition variable's wait, which leaves
    its lock inconsistent ("release unlocked lock") in place of the interruption."""
    waiting = list(futures)
    while waiting:
        done = [future for future in waiting if future.done()]
        if not done:
            time.sleep(poll)
            continue
        for future in done:
            waiting.remove(future)
            yield future


def run(
    algo: str,
    env_id: str | None = None,
    steps: int | None = None,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    episodes: int = EPISODES,
    workers: int = 1,
    directory: Path = PARITY_DIR,
    force: bool = False,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    device: str = "cpu",
) -> tuple[Path, dict[str, Any]]:
    """Train both sides on every seed not yet in the record (all with ``force``), ``workers``
    processes at once, on ``device`` (the processes share one GPU with "cuda"); each finished side
    is saved as it ends. The record's path and content."""
    from benchmark.perf.throughput import machine, now

    setting = SETTINGS[algo]
    env_id, steps = env_id or setting.env_id, steps or setting.steps
    path = record_path(directory, algo, env_id, steps)
    plain = _setting_record(setting, env_id, steps, episodes)
    record = load_record(path)
    if record is not None and record["setting"] != plain:
        raise ConfigError(f"{path} holds another setting of {algo} on {env_id} (the code's setting changed); move it away to start over")
    done = set() if force or record is None else {(r["side"], r["seed"]) for r in record["runs"]}
    jobs = [
        {
            "side": side,
            "algo": algo,
            "env_id": env_id,
            "steps": steps,
            "episodes": episodes,
            "seed": seed,
            "threads": 1,
            "device": device,
            "settings": setting.ours_for(env_id) if side == "ours" else setting.peer,
        }
        for seed in seeds
        for side in SIDES
        if (side, seed) not in done
    ]
    host = machine()
    failures = []
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        futures = {pool.submit(run_side, job): job for job in jobs}
        for future in finished_in_turn(list(futures)):
            job = futures[future]
            try:
                result = future.result()
            except Exception as error:  # one failed side fails alone; the others are kept
                failures.append(str(error))
                continue
            run_entry = {
                "side": job["side"],
                "seed": job["seed"],
                "final_return": statistics.fmean(result["returns"]),
                "returns": result["returns"],
                "lengths": result["lengths"],
                "seconds": result["seconds"],
                "version": result["version"],
                "created": now(),
                "machine": host,
                "device": device,
            }
            record = save_run(path, plain, run_entry)
            if on_run is not None:
                on_run(run_entry)
    except BaseException:  # Ctrl-C or SIGTERM: the queued sides never start, the running ones stop
        pool.shutdown(wait=False, cancel_futures=True)
        stop_children()
        raise
    pool.shutdown()
    if failures:
        raise RuntimeError("\n".join(failures))
    return path, load_record(path) or {"setting": plain, "runs": []}
