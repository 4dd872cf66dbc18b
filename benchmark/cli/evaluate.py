"""``python -m benchmark evaluate RUN_ID [--episodes N] [--video PATH]``: a finished run's final
policy, played back (RL Baselines3 Zoo's ``enjoy``): its return over N episodes on its frozen
normalization, and with ``--video`` one episode filmed to an MP4, a PNG strip of its frames
beside it, both logged to the run so that its suite's report shows the strip."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark.cli.common import add_store_arguments, existing_store
from benchmark.results_layout import ResultsDir
from benchmark.tables import plural

if TYPE_CHECKING:
    from benchmark.tables import Output


def add_parser(commands: Any) -> None:
    evaluate = commands.add_parser("evaluate", help="a finished run's final policy over N episodes; --video films one episode (MP4)")
    evaluate.add_argument("run", metavar="RUN_ID", help="the finished run: its MLflow run id, or its run key")
    evaluate.add_argument("--episodes", type=int, metavar="N", help="episodes (default: the run's evaluation episodes, which repeat its final evaluation)")
    evaluate.add_argument("--video", type=Path, metavar="PATH", help="film one episode to this .mp4 (a .png strip of its frames beside it)")
    evaluate.add_argument("--seed", type=int, help="seed of the episodes (default: the seed of the run's own evaluations)")
    add_store_arguments(evaluate)


def command_evaluate(args: argparse.Namespace, console: Output) -> int:
    import agents

    if args.episodes is not None and args.episodes < 1:
        raise ConfigError(f"--episodes must be a positive number, got {args.episodes}")
    if args.video is not None and args.video.suffix.lower() != ".mp4":
        raise ConfigError(f"--video {args.video}: give a path ending in .mp4")
    if args.seed is not None and args.seed < 0:
        raise ConfigError(f"--seed must be a non-negative integer, got {args.seed}")
    if args.video is not None:  # named before anything is evaluated (nothing is created yet)
        check_video_path(args.video)
    tracking_uri = existing_store(args)
    from benchmark import metric_names, tracking
    from benchmark.analysis.trained import final_checkpoint, finished_run
    from benchmark.training import playback

    run_id, spec = finished_run(args.run, tracking_uri)
    if agents.is_meta(spec.algo):
        raise ConfigError(f"{spec.algo} is a meta-learner: it adapts to each task first (its meta-test is in its run's evaluations)")
    backend = playback.headless_gl(spec.env_id) if args.video is not None else None  # before MuJoCo is imported
    trained = playback.load_trained(final_checkpoint(run_id, spec, tracking_uri, ResultsDir(args.results_dir).checkpoints))
    evaluation = playback.evaluate_trained(trained, args.episodes or spec.budget.eval_episodes, args.seed)
    client = tracking.client(tracking_uri)
    recorded = tracking.retry(lambda: client.get_run(run_id)).data.metrics.get(metric_names.FINAL_RETURN_MEAN)
    lengths = evaluation.lengths
    episodes = f"{len(lengths)} {plural(len(lengths), 'episode')}"
    console.print(
        f"{spec.label} (run {run_id}, run key {spec.run_key}): return {evaluation.mean:.2f} ± {evaluation.std:.2f} over {episodes} "
        f"of {min(lengths)}-{max(lengths)} steps" + (f"; its final evaluation: {recorded:.2f}" if recorded is not None else ""),
        highlight=False,
        soft_wrap=True,
    )
    if args.video is not None:
        filmed = playback.film(trained, args.video, args.seed)
        tracking.retry(lambda: client.log_artifact(run_id, str(filmed.video), "videos"))
        tracking.retry(lambda: client.log_artifact(run_id, str(filmed.strip), "videos"))
        tracking.retry(lambda: client.set_tag(run_id, metric_names.VIDEO_STRIP_TAG, f"videos/{filmed.strip.name}"))
        console.print(
            f"video {filmed.video}: {filmed.frames} frames at {filmed.fps:g} fps, one episode of {filmed.length} steps, return {filmed.episode_return:.2f}"
            + (f" (MuJoCo drew offscreen with MUJOCO_GL={backend})" if backend else "")
            + f"; strip {filmed.strip}; both logged to the run",
            highlight=False,
            soft_wrap=True,
        )
    return 0


def check_video_path(video: Path) -> None:
    """ConfigError in one line when the MP4 or its PNG strip could not be written at ``video``."""

    for path in (video, video.with_suffix(".png")):
        if path.is_dir():
            raise ConfigError(f"--video {video}: {path} is a directory")
    existing = video.parent.absolute()
    while not existing.exists():
        existing = existing.parent
    try:  # a real write (access() says yes to root on a read-only or pseudo file system)
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ConfigError(f"--video {video}: cannot write under {existing} ({error.strerror or error})") from None


COMMANDS = {"evaluate": command_evaluate}
