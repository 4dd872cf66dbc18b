"""Reading the YAML that users write (suite files, search spaces): the document in a file, and
checks of its mappings, each problem in one line naming the file, line and column, or field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agents.errors import ConfigError, suggest


def read_yaml(path: Path, what: str = "suite file") -> Any:
    """The YAML document in ``path``; ConfigError in one line naming the file (and the line and
    column of a syntax error) when it cannot be read, is not UTF-8 text or is not YAML."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        raise ConfigError(f"{path}:{line}:{column}: not UTF-8 text (byte 0x{raw[error.start]:02x}); save the {what} as UTF-8") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        problem = " ".join(str(getattr(error, "problem", None) or error).split())
        context = getattr(error, "context", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        opened = getattr(error, "context_mark", None)
        if context and opened is not None and mark is not None and opened.line != mark.line:
            context += f" opened at line {opened.line + 1}"
        raise ConfigError(f"{where}: YAML syntax error: {problem}" + (f" ({' '.join(context.split())})" if context else "")) from None


def as_mapping(value: Any, where: str) -> dict[str, Any]:
    """``value`` as a dict ({} for None); ConfigError naming ``where`` when it is not a mapping."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}: {value!r}")
    return dict(value)


def check_keys(data: dict[str, Any], valid: set[str], what: str) -> None:
    """ConfigError naming the first key of ``data`` not in ``valid``, a close match and the valid ones."""
    for key in data:
        if key not in valid:
            raise ConfigError(f"unknown {what} key {key!r}{suggest(str(key), valid)}; valid: {', '.join(sorted(valid))}")


OLD_KEY_NAMES = {"seeds_in_process": "seeds_per_process"}
"""Suite and experiment keys under their older names, still read: old -> current."""


def renamed_keys(section: dict[str, Any], old_names: dict[str, str]) -> dict[str, Any]:
    """``section`` with each key of ``old_names`` under its current name; ConfigError when both
    names are given (one setting twice)."""
    for old, new in old_names.items():
        if old in section:
            if new in section:
                raise ConfigError(f"{new} and {old} are one setting (its current and older names): give one")
            section = {(new if key == old else key): value for key, value in section.items()}
    return section
