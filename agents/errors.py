"""The error every layer raises for input a user can fix, and its "did you mean" helper.

Nothing here imports torch, so that a command refusing its arguments answers in a fraction of
a second instead of first loading the deep-learning stack (about 3 s of CPU).
"""

from __future__ import annotations

import difflib
import typing


class ConfigError(ValueError):
    """A configuration problem a user can fix: unknown name, bad type, value out of range."""


def suggest(name: str, choices: typing.Iterable[str]) -> str:
    """' (did you mean X?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
