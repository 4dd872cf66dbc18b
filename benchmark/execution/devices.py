"""Which device each run process gets: GPU slots from ``--device`` and ``--runs-per-gpu``.

A slot is one place a run can train: a GPU (its id in ``CUDA_VISIBLE_DEVICES``) or the CPU.
With ``--device auto`` or ``cuda`` and several visible GPUs the slots go round-robin over
them, ``runs_per_gpu`` deep (default: ``--workers`` spread over the GPUs), so runs spread
over the GPUs first and then pack. A run process
sets ``CUDA_VISIBLE_DEVICES`` to its slot's GPU before CUDA starts, so it sees that GPU
alone, as ``cuda:0``; CPU slots hide every GPU.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agents.errors import ConfigError


@dataclass(frozen=True)
class Slot:
    visible_devices: str
    """The CUDA_VISIBLE_DEVICES value of a run process in this slot ('' hides every GPU)."""
    device: str
    """What the run asks torch for inside that process: 'cpu' or 'cuda:0'."""

    @property
    def is_gpu(self) -> bool:
        """Whether a run in this slot trains on a GPU."""
        return self.device != "cpu"

    def describe(self) -> str:
        """'GPU 3' or 'CPU', for progress lines."""
        return f"GPU {self.visible_devices}" if self.is_gpu else "CPU"


CPU = Slot("", "cpu")


def visible_gpus(count: int, environ: Mapping[str, str] | None = None) -> list[str]:
    """Ids of the ``count`` GPUs this process sees, as a child's CUDA_VISIBLE_DEVICES must name
    them: this process's own CUDA_VISIBLE_DEVICES entries when set (ids or UUIDs), else 0..count-1."""
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(index) for index in range(count)]
    entries = [entry.strip() for entry in listed.split(",") if entry.strip()]
    return entries[:count]


def gpu_count() -> int:
    """CUDA devices visible to this process (0 without CUDA). On Linux without a GPU driver's
    device files the answer is 0 without importing torch, which would cost a launch seconds
    when its runs train in other processes anyway."""
    if sys.platform == "linux" and not gpu_driver_present():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_driver_present(dev: Path = Path("/dev")) -> bool:
    """Whether a GPU torch could use has its driver's device files here: NVIDIA's
    (``/dev/nvidia0``...), ROCm's (``/dev/kfd``) or WSL's (``/dev/dxg``)."""
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists() or (dev / "dxg").exists()


def plan_slots(requested: str, gpus: list[str], runs_per_gpu: int | None = None, workers: int = 1) -> list[Slot]:
    """The slots runs are trained in, at most as many at once as there are slots.

    ``requested``: 'auto' (every visible GPU, else the CPU), 'cpu', 'cuda' (every visible GPU;
    an error without one) or 'cuda:N' (the N-th visible GPU only). GPU slots: each GPU
    ``runs_per_gpu`` times, round-robin (default: as many as spread ``workers`` runs over the
    GPUs); CPU slots: ``workers`` of them.
    """
    if runs_per_gpu is not None and runs_per_gpu < 1:
        raise ConfigError(f"--runs-per-gpu must be >= 1, got {runs_per_gpu}")
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if requested == "cpu" or (requested == "auto" and not gpus):
        return [CPU] * workers
    if requested in ("auto", "cuda"):
        if not gpus:
            raise ConfigError("--device cuda: no CUDA device is visible here; use --device auto or cpu")
        depth = runs_per_gpu or -(-workers // len(gpus))
        return [Slot(gpu, "cuda:0") for _ in range(depth) for gpu in gpus]
    if requested.startswith("cuda:"):
        index_text = requested.split(":", 1)[1]
        if not index_text.isdigit():
            raise ConfigError(f"unknown device {requested!r}; use auto, cpu, cuda or cuda:i")
        index = int(index_text)
        if index >= len(gpus):
            raise ConfigError(f"device {requested!r}: only {len(gpus)} CUDA device(s) are visible here")
        return [Slot(gpus[index], "cuda:0")] * (runs_per_gpu or workers)
    raise ConfigError(f"unknown device {requested!r}; use auto, cpu, cuda or cuda:i")


def enter_slot(slot: Slot) -> None:
    """In a fresh run process, before CUDA starts: see only the slot's GPU (or none)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = slot.visible_devices
