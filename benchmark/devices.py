"""The device a run's learner trains on: its name checked without torch (suites, the command
line), then resolved where torch is loaded (training, the command line before a launch)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from agents.errors import ConfigError

if TYPE_CHECKING:
    import torch

DEVICE_NAMES = "auto, cpu, cuda or cuda:i"


def check_device_name(requested: str) -> str:
    """``requested`` if it names a device a run may ask for; ConfigError otherwise."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", requested):
        raise ConfigError(f"device {requested!r}: use {DEVICE_NAMES}")
    return requested


def resolve_device(requested: str) -> torch.device:
    """'auto' -> the first CUDA device when one is present, else CPU; ConfigError for anything
    unusable here (a bad name, CUDA on a machine without it)."""
    import torch

    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise ConfigError(f"unknown device {requested!r}; use {DEVICE_NAMES}") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {requested!r}; use {DEVICE_NAMES}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {requested!r} requested but CUDA is not available here; use --device auto or cpu")
    return device
