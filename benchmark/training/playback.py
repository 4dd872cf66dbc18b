"""A trained policy played back from a run's final checkpoint (``final.pt``): its return over N
episodes, acting deterministically on the normalization statistics it ended with (frozen), and
one episode filmed: an MP4 and a PNG strip of a few of its frames.

MuJoCo draws offscreen through OpenGL; with no display, ``headless_gl`` picks the backend that
works on this machine (EGL, then OSMesa) before MuJoCo is imported. MP4s are encoded by the
ffmpeg that imageio-ffmpeg ships; the strip is drawn with Pillow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

import agents
from agents.api import Algorithm
from agents.env_setup import EnvSetup
from agents.envs import env_spec, freeze_normalization, load_normalization_state, make_vector_env
from agents.errors import ConfigError
from agents.hyperparameters import Hyperparameters
from agents.policy_file import TrainedPolicy
from benchmark.config import RunSpec
from benchmark.training.evaluate import EVAL_SEED_OFFSET, evaluate
from benchmark.training.results import Evaluation

GL_BACKENDS = ("egl", "osmesa")
"""MuJoCo's offscreen OpenGL backends, in the order tried (EGL: Mesa's libEGL, or a GPU's)."""
GL_PACKAGES = "libegl1 and libgl1-mesa-dri (EGL), or libosmesa6 (OSMesa)"
"""What a Debian or Ubuntu machine installs for them (docs/commands.md says so too)."""
STRIP_FRAMES = 6
STRIP_HEIGHT = 160


@dataclass
class Trained:
    """A finished run's policy, ready to act: its spec, algorithm and normalization statistics."""

    spec: RunSpec
    config: Hyperparameters
    algo: Algorithm
    normalization: dict[str, dict[str, np.ndarray]]
    device: torch.device


@dataclass
class Film:
    """One filmed episode."""

    frames: int
    fps: float
    episode_return: float
    length: int
    video: Path
    strip: Path


def load_trained(payload: dict[str, Any], device: str = "cpu") -> Trained:
    """The policy a ``final.pt`` payload holds; ConfigError when it cannot act alone."""
    trained = TrainedPolicy.read(payload)
    spec = RunSpec.from_dict(trained.spec)
    if agents.is_meta(spec.algo):
        raise ConfigError(f"{spec.algo} is a meta-learner: it adapts to each task first (its meta-test is in its run's evaluations)")
    config = agents.resolve_config(spec.algo, spec.hyperparameters)
    algo = agents.make(spec.algo, env_spec(spec.env), config, total_steps=spec.budget.total_steps, device=device, seed=spec.seed)
    assert isinstance(algo, Algorithm)  # not a meta-learner
    algo.load_state_dict(trained.algorithm)
    return Trained(spec, config, algo, trained.statistics(), torch.device(device))


def _envs(trained: Trained, num_envs: int, setup: EnvSetup, autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP) -> Any:
    envs = make_vector_env(
        setup,
        num_envs,
        normalize_observations=trained.config.normalize_observations,
        clip_observations=trained.config.clip_observations,
        autoreset_mode=autoreset_mode,
    )
    load_normalization_state(envs, trained.normalization)
    freeze_normalization(envs)
    return envs


def evaluate_trained(trained: Trained, episodes: int, seed: int | None = None) -> Evaluation:
    """``episodes`` episodes, one per sub-env, seeded as the run's own evaluations were (``seed``
    overrides): with the run's evaluation count, the same returns as its final evaluation."""
    envs = _envs(trained, episodes, trained.spec.env)
    try:
        seed = trained.spec.seed + EVAL_SEED_OFFSET if seed is None else seed
        return evaluate(trained.algo, envs, envs, seed, trained.device, int(trained.spec.budget.total_steps))
    finally:
        envs.close()


def film(trained: Trained, video: Path, seed: int | None = None) -> Film:
    """One deterministic episode to ``video`` (MP4, at the env's frame rate): its first frame and
    one after each step, so ``length + 1`` frames; a strip of STRIP_FRAMES of them beside it
    (``<video>.png``)."""
    import imageio.v2 as imageio

    setup = trained.spec.env
    rendering = EnvSetup(setup.env_id, {**setup.kwargs, "render_mode": "rgb_array"}, setup.wrappers)
    try:
        envs = _envs(trained, 1, rendering, AutoresetMode.NEXT_STEP)  # the last frame shows how the episode ended
    except ConfigError as error:
        raise ConfigError(f"cannot film {setup.env_id}: made with render_mode='rgb_array' it fails ({error})") from None
    try:
        obs, _ = envs.reset(seed=trained.spec.seed + EVAL_SEED_OFFSET if seed is None else seed)
        frames, total, state = [_frame(envs, setup)], 0.0, None
        while True:
            acted = trained.algo.act(torch.as_tensor(obs, dtype=torch.float32, device=trained.device), state, deterministic=True)
            obs, rewards, terminated, truncated, _ = envs.step(acted.env_actions)
            state = acted.state
            total += float(rewards[0])
            frames.append(_frame(envs, setup))
            if terminated[0] or truncated[0]:
                break
        fps = float(envs.metadata.get("render_fps") or 30)
    finally:
        envs.close()
    video.parent.mkdir(parents=True, exist_ok=True)
    partial = video.with_name(f".{video.name}.partial.mp4")  # a crash leaves no half video at PATH
    # yuv420p needs even sides: a block of 2 pads at most one row or column
    try:
        imageio.mimwrite(partial, list[Any](frames), fps=fps, codec="libx264", macro_block_size=2)
        partial.replace(video)
    finally:
        partial.unlink(missing_ok=True)  # (gone already once renamed)
    strip = video.with_suffix(".png")
    write_strip(frames, strip)
    return Film(len(frames), fps, total, len(frames) - 1, video, strip)


def _frame(envs: Any, setup: EnvSetup) -> np.ndarray:
    try:
        frame = envs.render()[0]
    except Exception as error:  # noqa: BLE001 - the renderer's own error types, in one line
        backend = os.environ.get("MUJOCO_GL")
        hint = f" (MUJOCO_GL={backend}; a machine without a display needs {GL_PACKAGES})" if backend or "mujoco" in sys.modules else ""
        raise ConfigError(f"cannot render {setup.env_id}: {type(error).__name__}: {error}{hint}") from None
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        raise ConfigError(f"{setup.env_id} renders no RGB image in rgb_array mode (got {type(frame).__name__})")
    return frame


def write_strip(frames: list[np.ndarray], path: Path, count: int = STRIP_FRAMES, height: int = STRIP_HEIGHT) -> None:
    """``count`` frames evenly spaced from first to last, side by side, each ``height`` pixels high (PNG)."""
    from PIL import Image

    chosen = [frames[int(round(i))] for i in np.linspace(0, len(frames) - 1, min(count, len(frames)))]
    images = [Image.fromarray(np.ascontiguousarray(frame[..., :3])) for frame in chosen]
    images = [image.resize((max(1, round(image.width * height / image.height)), height)) for image in images]
    strip = Image.new("RGB", (sum(image.width for image in images), height), "white")
    left = 0
    for image in images:
        strip.paste(image, (left, 0))
        left += image.width
    partial = path.with_name(f".{path.name}.partial.png")
    try:
        strip.save(partial)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def _runtime_directory() -> None:
    """Mesa's EGL prints "XDG_RUNTIME_DIR is invalid or not set" on a machine without a login
    session (a container, a batch job): give it a private directory of its own when there is none."""
    current = os.environ.get("XDG_RUNTIME_DIR")
    if current and os.path.isdir(current) and os.access(current, os.W_OK):
        return
    import tempfile

    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="reprorl-runtime-")  # mode 0700, as the spec asks


def headless_gl(env_id: str) -> str | None:
    """Before MuJoCo is imported: where ``MUJOCO_GL`` is unset and there is no display, set it to
    the first offscreen backend that makes a context here (each tried in a child process);
    the backend chosen, or None where nothing was set."""
    from agents.envs import check_env_id, registered_id

    if os.environ.get("MUJOCO_GL") or os.environ.get("DISPLAY") or "mujoco" in sys.modules:
        return None
    _runtime_directory()
    import gymnasium as gym

    check_env_id(env_id)
    entry_point = gym.spec(registered_id(env_id)).entry_point
    mujoco_named = isinstance(entry_point, str) and "mujoco" in entry_point.lower()
    if isinstance(entry_point, str) and not mujoco_named:
        return None
    probe = "import mujoco; context = mujoco.GLContext(8, 8); context.make_current(); context.free()"
    for backend in GL_BACKENDS:
        environment = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
        try:
            works = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, timeout=120).returncode == 0
        except subprocess.TimeoutExpired:  # a driver that hangs counts as not working
            works = False
        if works:
            os.environ.update(MUJOCO_GL=backend, PYOPENGL_PLATFORM=backend)
            return backend
    if not mujoco_named:  # a callable entry point may not draw with MuJoCo at all: let it try
        return None
    raise ConfigError(f"no offscreen OpenGL backend works here for MuJoCo (tried {', '.join(GL_BACKENDS)}): install {GL_PACKAGES}")
