"""``python -m benchmark evaluate RUN_ID [--episodes N] [--video PATH]``: a finished run's final
policy played back on its frozen normalization; an episode filmed to an MP4 of the right number
of frames (a MuJoCo task, drawn offscreen); the strip in the suite's report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_cli_in_process
from mlflow import MlflowClient


def trained_run(scratch: Path, algo: str, env: str, *settings: str, steps: int = 1024) -> tuple[Path, str, float]:
    """Train one run with ``train``; (results directory, its MLflow run id, its final evaluation)."""
    results = scratch / "results"
    arguments = ("train", "--algo", algo, "--env", env, "--steps", str(steps), "--eval-episodes", "3", "--published-defaults", "--results-dir", str(results))
    completed = run_cli_in_process(*arguments, *(("--set", *settings) if settings else ()), cwd=scratch)
    assert completed.returncode == 0, completed.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.run_key != ''")
    return results, run.info.run_id, run.data.metrics["final/eval_return_mean"]


def frames_in(video: Path) -> int:
    import imageio.v2 as imageio

    reader = imageio.get_reader(video, format="FFMPEG")
    try:
        return reader.count_frames()
    finally:
        reader.close()


def offscreen_backend() -> str | None:
    """The MuJoCo offscreen backend that works here (in a child process), or None."""
    for backend in ("egl", "osmesa"):
        probe = "import mujoco; c = mujoco.GLContext(8, 8); c.make_current(); c.free()"
        environment = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
        if subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, timeout=120).returncode == 0:
            return backend
    return None


def test_a_mujoco_episode_is_filmed_offscreen_with_one_frame_per_step(tmp_path):
    """In a fresh process, as a user runs it: MUJOCO_GL is chosen before MuJoCo is imported."""
    if offscreen_backend() is None:
        pytest.skip("no offscreen OpenGL for MuJoCo on this machine (neither EGL nor OSMesa): make install adds libegl1 and libgl1-mesa-dri where apt can")
    results, run_id, final = trained_run(tmp_path, "ppo", "InvertedPendulum-v5", "num_envs=2", "num_steps=64", "hidden_sizes=[16]", steps=512)
    video = tmp_path / "films" / "pendulum.mp4"
    # as in a container or a batch job: no display, and no login session's runtime directory
    environment = {key: value for key, value in os.environ.items() if key not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY", "XDG_RUNTIME_DIR")}
    completed = subprocess.run(
        [sys.executable, "-m", "benchmark", "evaluate", run_id, "--video", str(video), "--results-dir", str(results)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "XDG_RUNTIME_DIR" not in completed.stderr, completed.stderr  # Mesa's complaint, once printed on every video
    # the run's own evaluation episodes and seed: the same returns as its final evaluation
    assert f"return {final:.2f}" in completed.stdout and f"its final evaluation: {final:.2f}" in completed.stdout, completed.stdout
    filmed = re.search(r"(\d+) frames at ([\d.]+) fps, one episode of (\d+) steps", completed.stdout)
    assert filmed is not None, completed.stdout
    frames, length = int(filmed.group(1)), int(filmed.group(3))
    assert frames == length + 1 and frames_in(video) == frames  # the first frame, then one after each step
    assert video.with_suffix(".png").is_file() and "MUJOCO_GL=" in completed.stdout
    suite = next((results / "suites").glob("*.yaml"))
    report = run_cli_in_process("report", "--suite", str(suite), "--results-dir", str(results), "--output", str(tmp_path / "r"))
    assert report.returncode == 0, report.stderr
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "## Filmed episodes" in markdown and "plots/video-" in markdown
    assert "data:image/png;base64," in (tmp_path / "r" / "report.html").read_text().split("Filmed episodes")[1]


def test_evaluate_repeats_the_final_evaluation_and_films_a_classic_task(tmp_path):
    results, run_id, final = trained_run(tmp_path, "dqn", "CartPole-v1", "learning_starts=200", "hidden_sizes=[16]", steps=600)
    completed = run_cli_in_process("evaluate", run_id, "--results-dir", str(results), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert f"return {final:.2f}" in completed.stdout and "over 3 episodes" in completed.stdout
    more = run_cli_in_process("evaluate", run_id, "--episodes", "5", "--seed", "7", "--video", str(tmp_path / "cartpole.mp4"), "--results-dir", str(results))
    assert more.returncode == 0, more.stderr
    assert "over 5 episodes" in more.stdout
    frames = int(re.search(r"(\d+) frames", more.stdout).group(1))
    assert frames_in(tmp_path / "cartpole.mp4") == frames
    from PIL import Image

    strip = np.asarray(Image.open(tmp_path / "cartpole.png"))
    assert strip.shape[0] == 160 and strip.shape[1] > 160 and strip.std() > 0


def test_bad_input_is_one_line(tmp_path):
    results, run_id, _ = trained_run(tmp_path, "dqn", "CartPole-v1", "learning_starts=100", "hidden_sizes=[8]", steps=200)
    (tmp_path / "strip.png").mkdir()
    for arguments, message in (
        ((run_id, "--episodes", "0"), "--episodes must be a positive number"),
        ((run_id, "--video", str(tmp_path / "film.gif")), "give a path ending in .mp4"),
        (("nope", "--episodes", "2"), "no MLflow run 'nope'"),
        ((run_id, "--video", "/proc/no-such-dir/film.mp4"), "--video /proc/no-such-dir/film.mp4: cannot write under /proc"),
        ((run_id, "--video", str(tmp_path / "strip.mp4")), "strip.png is a directory"),
    ):
        completed = run_cli_in_process("evaluate", *arguments, "--results-dir", str(results), cwd=tmp_path)
        assert completed.returncode == 2 and len(completed.stderr.strip().splitlines()) == 1, completed.stderr
        assert message in completed.stderr, completed.stderr
    assert not (tmp_path / "film.gif").exists()


def test_the_offscreen_backend_is_probed_only_for_mujoco_and_a_missing_one_is_named():
    """In a fresh process (MuJoCo not imported yet, no display): a classic task needs no
    backend; a MuJoCo task where no backend works is refused in one line naming the packages."""
    script = (
        "import os, sys\n"
        "for name in ('MUJOCO_GL', 'PYOPENGL_PLATFORM', 'DISPLAY'): os.environ.pop(name, None)\n"
        "from agents.errors import ConfigError\n"
        "from benchmark.training import playback\n"
        "assert playback.headless_gl('CartPole-v1') is None and 'MUJOCO_GL' not in os.environ\n"
        "playback.GL_BACKENDS = ('no-such-backend',)\n"
        "try:\n"
        "    playback.headless_gl('Hopper-v5')\n"
        "except ConfigError as error:\n"
        "    print(error)\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "no offscreen OpenGL backend works here for MuJoCo (tried no-such-backend): install libegl1" in completed.stdout


def test_what_a_launch_prints_last_names_the_runs_for_the_next_command(tmp_path):
    """Each finished run's key and MLflow run id, then evaluate, continue and report lines that
    keep the store's options; evaluate takes either name, and the parent run of a one-run launch
    too, and names the run keys to choose from for a launch of several."""
    results = tmp_path / "results"
    arguments = ("train", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "200", "--eval-episodes", "2", "--published-defaults")
    arguments += ("--set", "learning_starts=100", "hidden_sizes=[8]", "--results-dir", str(results))
    one = run_cli_in_process(*arguments, cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-2000:]
    key, run_id = re.search(r"dqn/CartPole-v1/seed0: run key ([0-9a-f]{16}), MLflow run ([0-9a-f]{32})", one.stdout).groups()
    assert f"next: python -m benchmark evaluate {key} --results-dir {results}" in one.stdout
    assert f"python -m benchmark continue {key} --steps 200 --results-dir {results}" in one.stdout
    parent = re.search(r"parent run ([0-9a-f]{32})", one.stdout).group(1)
    evaluated = {name: run_cli_in_process("evaluate", name, "--results-dir", str(results), cwd=tmp_path) for name in (key, run_id, parent)}
    assert all(completed.returncode == 0 for completed in evaluated.values()), [completed.stderr for completed in evaluated.values()]
    assert len({re.search(r"return (-?[\d.]+)", completed.stdout).group(1) for completed in evaluated.values()}) == 1
    two = run_cli_in_process(*arguments, "--seeds", "1", "2", cwd=tmp_path)
    assert two.returncode == 0, two.stderr[-2000:]
    parent = re.search(r"parent run ([0-9a-f]{32})", two.stdout).group(1)
    refused = run_cli_in_process("evaluate", parent, "--results-dir", str(results), cwd=tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "is the parent run of a launch of 2 finished runs: give one of their run keys" in refused.stderr
