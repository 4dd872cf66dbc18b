"""The behaviour fingerprint of an algorithm's code: a few numbers from a short training run at
fixed settings, so that runs trained at different commits can be told apart by what their code
does, not by its text.

    v1 -3.60145e-02 5.65838e-01 8.24246e-02 2.82159e-04 -5.78469e-01 0.00000e+00 6.33478e-01 ...

A refactor, another float kernel (``REPRORL_CPU_GEMM``) or another CPU type keeps it: their
float32 results differ in the last bits only. A change of behaviour changes it: a loss, a
default, a target, a schedule, or the order of random draws (runs of one seed then differ as
runs of two seeds do). Each run records it (``metric_names.FINGERPRINT_TAG``, the bundles'
``fingerprint`` column) and a results table groups a cell's runs by it (``classes``).

The run: the algorithm's published defaults, on ``BOX_ENV`` when it takes Box actions, else on
CartPole-v1; seed 0 for the global RNGs, the learner and the envs; one CPU thread; schedules
sized for a ``BUDGET``-step run. What would keep a default run from updating within a few
hundred steps shrinks, the same for every commit (``SETTINGS``, ``shrunk``): an off-policy
learner's warm-up (``learning_starts`` 128, of which ``start_steps`` 64 uniform actions) and
replay capacity (10k, never reached), an on-policy learner's rollout (``num_steps`` 64 per env)
with its minibatch counts (their published size kept: PPO's 2048 / 32 = 64 rows make one
minibatch of the 64-step rollout). The loop drives the learner through the public interface
only (``behavior_act``, ``observe``, ``ready_to_update``, ``update``, ``act``), as the training
loop does, and ends with its ``UPDATES``-th update.

The values, to ``DIGITS`` significant digits: the mean and standard deviation of every action
the run took; those of the deterministic actions, after the last update, on the run's first
``PROBES`` observations; then each update's logged losses (the logs whose name holds "loss", in
the order of their names): the TD, policy, value and temperature losses, which read the
targets, the discount, the coefficients and the optimizers' first steps.

Robust: the run stops after a few updates from the start, before a last-bit difference can
grow. Measured on every online algorithm of the registry (an AMD EPYC), the most any value
moved: oneDNN against MKL, 3e-5 relative; every weight perturbed by 1e-6 relative, 9e-5; this
repository's history since the classic record (the oneDNN kernel, the seed-batched losses),
3e-5. ``same_behaviour`` allows ``RTOL`` relative plus ``ATOL`` absolute (values that cancel to
about 0). Of the logs only losses are read: a log added or renamed (a gradient norm, a learning rate)
changes nothing. Blind: what acts only later in a run (DQN's target network, copied every 10k
steps, so also double Q; a buffer's capacity; a schedule's end), what the defaults do not use
(recurrent policies, prioritized replay) and what moves only a sign-normalized first optimizer
step (A2C's entropy bonus: RMSprop's first steps are about lr * sign(gradient)).

Algorithms the run cannot drive have no fingerprint (``""``, unknown): meta-learners (epochs
over tasks) and learners that cannot be built from their defaults alone or learn offline
(behavioural cloning needs an expert).

This file also runs as a script against whatever ``agents`` package Python imports first:
``python -m benchmark fingerprint --at COMMIT`` runs it in a worktree of that commit. So it
imports only ``agents``, numpy, torch, gymnasium and the standard library (all but the standard
library on first use: comparing fingerprints loads none), and uses only the interface that
every commit of the published results has.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import random
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

VERSION = "v1"
"""The fingerprint's format and run: bump it when either changes (fingerprints of two versions
never match)."""
RTOL = 1e-3
"""Relative tolerance of ``same_behaviour``."""
ATOL = 1e-6
"""Absolute tolerance of ``same_behaviour`` (values that cancel to about 0)."""
DIGITS = 6
"""Significant digits written."""

BOX_ENV = "reprorl-fingerprint/MountainCarNearGoal-v0"
"""MountainCarContinuous with its goal at -0.45 (in the start's reach) and 50-step episodes:
rewards near 0 (-0.1 a^2) but 100 at the goal, so that the discount and the targets weigh in the
losses (on Pendulum, rewards of -16..0 drown them), and episodes that end both ways
(terminated at the goal, truncated at 50 steps) within the run."""
GOAL_POSITION = -0.45
EPISODE_STEPS = 50
ENVS = (BOX_ENV, "CartPole-v1")
"""The first one the algorithm can act in: Box actions, else Discrete."""
SEED = 0
UPDATES = 3
"""Updates the run takes; it ends with the last."""
BUDGET = 1_000
"""``total_steps`` the learner's schedules are sized for (PPO's annealed learning rate, DQN's
epsilon); a run that has not updated ``UPDATES`` times within it fails."""
PROBES = 16
"""Observations (the run's first) its deterministic actions are read on after the last update."""
SETTINGS = {"learning_starts": 128, "start_steps": 64, "num_steps": 64, "buffer_size": 10_000}
"""Each of these hyperparameters an algorithm has is capped at this value (its default where
smaller)."""
MINIBATCHES = ("num_minibatches", "value_num_minibatches")
"""Minibatch counts of a rollout, shrunk with ``num_steps`` so that a minibatch keeps its
published size."""


class NoFingerprint(Exception):
    """The algorithm is one the run cannot drive (its fingerprint is unknown)."""


def fingerprint(algo: str) -> str:
    """The behaviour fingerprint of algorithm ``algo`` (registry name or plug-in) as this
    process's ``agents`` implements it; ``""`` for one the run cannot drive. ConfigError for an
    unknown algorithm. The global RNGs (random, NumPy, torch) and torch's thread count are left
    as they were."""
    try:
        return text(values(algo))
    except NoFingerprint:
        return ""


@functools.cache
def recorded(algo: str) -> str:
    """What a run records: ``fingerprint(algo)``, computed once per process, ``""`` when it
    cannot be computed (never an error: a run does not fail for it)."""
    try:
        return fingerprint(algo)
    except Exception:  # noqa: BLE001 - whatever fails, the run goes on with the fingerprint unknown
        return ""


def text(labelled: Sequence[tuple[str, float]]) -> str:
    """``VERSION`` and the values, each to ``DIGITS`` significant digits."""
    return " ".join([VERSION, *(f"{value + 0.0:.{DIGITS - 1}e}" for _, value in labelled)])  # (+ 0.0: no -0)


def parse(fingerprint: str) -> tuple[str, list[float]] | None:
    """(version, values) of a fingerprint; None for an unknown (empty) or unreadable one."""
    parts = fingerprint.split()
    if not parts:
        return None
    try:
        return parts[0], [float(part) for part in parts[1:]]
    except ValueError:
        return None


def same_behaviour(a: str, b: str) -> bool:
    """Whether two fingerprints say the same behaviour: same version, as many values, each pair
    within ``RTOL`` relative plus ``ATOL`` absolute. An unknown fingerprint matches nothing."""
    first, second = parse(a), parse(b)
    if first is None or second is None or first[0] != second[0] or len(first[1]) != len(second[1]):
        return False
    return all(math.isclose(x, y, rel_tol=RTOL, abs_tol=ATOL) for x, y in zip(first[1], second[1], strict=True))


def classes(fingerprints: Sequence[str]) -> list[list[int]]:
    """The positions of ``fingerprints`` in groups of matching ones, in order of first
    appearance: each joins the first group whose first member it matches (``same_behaviour``).
    Unknown (empty) fingerprints are in no group."""
    groups: list[list[int]] = []
    for position, candidate in enumerate(fingerprints):
        if parse(candidate) is None:
            continue
        for group in groups:
            if same_behaviour(fingerprints[group[0]], candidate):
                group.append(position)
                break
        else:
            groups.append([position])
    return groups


# ------------------------------------------------------------------------------------ the run


def shrunk(defaults: Any) -> dict[str, Any]:
    """The hyperparameters the run overrides in ``defaults`` (an algorithm's published Config):
    ``SETTINGS`` where smaller, and the minibatch counts of a shortened rollout."""
    overrides: dict[str, Any] = {}
    names = {field.name for field in dataclasses.fields(defaults)}
    for name, cap in SETTINGS.items():
        if name in names and isinstance(getattr(defaults, name), int) and getattr(defaults, name) > cap:
            overrides[name] = cap
    if "num_steps" in overrides:
        for name in MINIBATCHES:
            if name in names and isinstance(getattr(defaults, name), int):
                overrides[name] = max(1, getattr(defaults, name) * overrides["num_steps"] // defaults.num_steps)
    return overrides


def values(algo: str) -> list[tuple[str, float]]:
    """The fingerprint's values, each with its label (``python fingerprint.py --algo A --explain``
    prints them); NoFingerprint for an algorithm the run cannot drive."""
    import torch

    import agents

    cls = agents.algorithm_class(algo)  # ConfigError for an unknown name
    if getattr(agents, "is_meta", lambda name: False)(algo):  # (commits before the meta-learners had none)
        raise NoFingerprint(f"{algo} is a meta-learner (trained by epochs over tasks)")
    with _global_state_kept(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
        return _run(algo, cls)


def _mountain_car_near_goal(**kwargs: Any) -> Any:
    from gymnasium.envs.classic_control.continuous_mountain_car import Continuous_MountainCarEnv

    env = Continuous_MountainCarEnv(**kwargs)
    env.goal_position = GOAL_POSITION
    return env


def _env_for(cls: Any) -> str:
    import gymnasium as gym

    import agents
    from agents.envs import env_spec

    if BOX_ENV not in gym.registry:
        # by name, not the function: an entry point that is a callable may be MuJoCo's (agents imports it then)
        gym.register(BOX_ENV, entry_point=f"{__name__}:{_mountain_car_near_goal.__name__}", max_episode_steps=EPISODE_STEPS)
    for env_id in ENVS:
        try:
            cls.check_env_spec(env_spec(env_id))
        except agents.ConfigError:
            continue
        return env_id
    raise NoFingerprint(f"{cls.name} acts in none of {', '.join(ENVS)}")


def _run(algo: str, cls: Any) -> list[tuple[str, float]]:
    import numpy as np
    import torch

    import agents
    from agents.api import Transitions
    from agents.envs import env_spec, make_vector_env, true_next_obs

    env_id = _env_for(cls)
    config = agents.resolve_config(algo, shrunk(agents.resolve_config(algo)))
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    envs = make_vector_env(
        env_id,
        config.num_envs,
        normalize_observations=config.normalize_observations,
        normalize_rewards=config.normalize_rewards,
        gamma=config.gamma,
        clip_observations=config.clip_observations,
        clip_rewards=config.clip_rewards,
    )
    try:
        try:
            learner: Any = agents.make(algo, env_spec(env_id), config, total_steps=BUDGET, device="cpu", seed=SEED)  # an online one (not meta)
        except agents.ConfigError as error:  # BC: its defaults name no expert
            raise NoFingerprint(f"{algo} cannot be built from its defaults alone ({error})") from None
        if not getattr(learner, "collects_experience", True):
            raise NoFingerprint(f"{algo} learns offline, from a dataset")
        behavior_act = getattr(learner, "behavior_act", learner.act)  # (commits before BC acted with act)
        obs, _ = envs.reset(seed=SEED)
        obs_tensor = torch.as_tensor(obs, dtype=torch.float32)
        probes: list[torch.Tensor] = [obs_tensor]
        actions: list[np.ndarray] = []
        updates: list[dict[str, float]] = []
        state, steps = None, 0
        while len(updates) < UPDATES:
            if steps >= BUDGET:
                raise RuntimeError(f"{algo} updated {len(updates)} times in {BUDGET} env steps ({UPDATES} expected)")
            acted = behavior_act(obs_tensor, state)
            next_obs, rewards, terminated, truncated, infos = envs.step(acted.env_actions)
            actions.append(np.asarray(acted.env_actions, dtype=np.float64).ravel())
            state = learner.reset_state(acted.state, torch.as_tensor(terminated | truncated)) if acted.state is not None else None
            final_obs = true_next_obs(next_obs, infos)
            next_tensor = torch.as_tensor(next_obs, dtype=torch.float32)
            learner.observe(
                Transitions(
                    obs_tensor,
                    acted,
                    torch.as_tensor(rewards, dtype=torch.float32),
                    next_tensor if final_obs is next_obs else torch.as_tensor(final_obs, dtype=torch.float32),
                    torch.as_tensor(terminated),
                    torch.as_tensor(truncated),
                )
            )
            obs_tensor, steps = next_tensor, steps + config.num_envs
            if sum(len(probe) for probe in probes) < PROBES:
                probes.append(obs_tensor)
            if learner.ready_to_update():
                updates.append(learner.update())
        taken = np.concatenate(actions)
        deterministic = np.asarray(learner.act(torch.cat(probes)[:PROBES], deterministic=True).env_actions, dtype=np.float64).ravel()
    finally:
        envs.close()
    labelled = [
        ("actions.mean", float(taken.mean())),
        ("actions.std", float(taken.std())),
        ("deterministic.mean", float(deterministic.mean())),
        ("deterministic.std", float(deterministic.std())),
    ]
    for number, logs in enumerate(updates, start=1):
        labelled += [(f"update{number}.{name}", float(logs[name])) for name in sorted(logs) if "loss" in name]
    return labelled


@contextlib.contextmanager
def _global_state_kept() -> Iterator[None]:
    """The global RNGs (random, NumPy, torch's CPU and initialized CUDA generators) and torch's
    thread count as they were on entry, whatever happens inside."""
    import numpy as np
    import torch

    python, numpy_state, torch_state, threads = random.getstate(), np.random.get_state(), torch.get_rng_state(), torch.get_num_threads()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------ as a script

EXIT_UNKNOWN = 2
"""The script's exit status for bad input (an unknown algorithm), as the CLI's."""


def main(argv: list[str] | None = None) -> int:
    """``python fingerprint.py --algo A [A ...] [--json] [--explain] [--agents-root DIR]``: the
    fingerprint of each, one a line (``--json``: {algo: {"fingerprint": ...} or {"error": ...,
    "bad_input": bool}}, for the CLI); ``--agents-root`` refuses to run when the ``agents``
    imported is not the one under DIR."""
    parser = argparse.ArgumentParser(prog="fingerprint.py", description="the behaviour fingerprint of algorithms' code")
    parser.add_argument("--algo", nargs="+", required=True)
    parser.add_argument("--json", action="store_true", help="one JSON object, errors included")
    parser.add_argument("--explain", action="store_true", help="each value with its label, on stderr")
    parser.add_argument("--agents-root", type=Path, help="the directory whose agents package must be the one imported")
    args = parser.parse_args(argv)
    import agents

    imported = Path(agents.__file__).resolve().parent.parent
    if args.agents_root is not None and imported != args.agents_root.resolve():
        sys.stderr.write(f"error: imported agents from {imported}, not from {args.agents_root}\n")
        return 1
    answers: dict[str, dict[str, Any]] = {}
    for algo in args.algo:
        try:
            labelled = values(algo)
            answers[algo] = {"fingerprint": text(labelled)}
            if args.explain:
                sys.stderr.write(f"{algo}: " + ", ".join(f"{label}={value:.6g}" for label, value in labelled) + "\n")
        except NoFingerprint as reason:
            answers[algo] = {"fingerprint": "", "note": str(reason)}
        except agents.ConfigError as error:
            answers[algo] = {"error": str(error), "bad_input": True}
        except Exception as error:  # noqa: BLE001 - reported per algorithm
            answers[algo] = {"error": f"{type(error).__name__}: {error}", "bad_input": False}
    if args.json:
        print(json.dumps(answers))
        return 0
    for answer in answers.values():
        if "error" in answer:
            sys.stderr.write(f"error: {answer['error']}\n")
            return EXIT_UNKNOWN if answer["bad_input"] else 1
        print(answer["fingerprint"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
