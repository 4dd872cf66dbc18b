"""Process-wide settings read from the environment. Nothing here imports torch, so that the
command line checks them in a fraction of a second, before it loads anything or stores a result."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from agents.errors import ConfigError, suggest

CPU_GEMM = "REPRORL_CPU_GEMM"
CPU_GEMM_KERNELS = ("auto", "onednn", "mkl")
"""The CPU kernels of the networks' large linear layers (``agents.nets.gemm``)."""

CRITICS = "REPRORL_CRITICS"
CRITIC_LAYOUTS = ("auto", "stacked", "separate")
"""How a run alone evaluates its critic ensemble (``agents.api.Learner.stacks_alone``)."""


def _choice(variable: str, choices: tuple[str, ...]) -> str:
    """The value of ``variable`` among ``choices`` (unset: the first); a ConfigError otherwise."""
    value = os.environ.get(variable, "").strip().lower() or choices[0]
    if value not in choices:
        raise ConfigError(f"{variable} must be one of {', '.join(choices)}, not {value!r}{suggest(value, choices)}")
    return value


def cpu_gemm() -> str:
    """The kernel ``REPRORL_CPU_GEMM`` asks for (default 'auto'); a ConfigError for another value."""
    return _choice(CPU_GEMM, CPU_GEMM_KERNELS)


def critic_layout() -> str:
    """The layout ``REPRORL_CRITICS`` asks for (default 'auto'); a ConfigError for another value."""
    return _choice(CRITICS, CRITIC_LAYOUTS)


def cpu_info(field: str) -> str:
    """A field of the first CPU in /proc/cpuinfo ('model name', 'vendor_id'); on other systems,
    or without it, ``platform.processor()`` ('' when unknown)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
