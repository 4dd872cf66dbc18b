"""Where a run's checkpoints live: names only, no torch, so that a launching process can tell
which runs will resume without loading torch (``checkpoint`` reads and writes the files)."""

from __future__ import annotations

from pathlib import Path

LATEST = "latest.pt"
FINAL = "final.pt"


def run_directory(checkpoint_dir: Path, run_key: str) -> Path:
    """Where one run's checkpoints live."""
    return Path(checkpoint_dir) / run_key


def latest(checkpoint_dir: Path, run_key: str) -> Path:
    """The run's latest checkpoint file (it may not exist)."""
    return run_directory(checkpoint_dir, run_key) / LATEST
