"""What each hyperparameter means, read from the Config dataclasses themselves.

A field's meaning is the string literal under it (an attribute docstring, as Sphinx and
mkdocstrings read them); its range is the ``hp(...)`` metadata. ``benchmark list ALGO`` and the
documentation site's algorithm pages both print these, so docs and code cannot disagree.
Torch-free: ``ast`` over the classes' source.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

from agents.hyperparameters import Hyperparameters

_BOUND_WORDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


@dataclass(frozen=True)
class FieldDoc:
    """One hyperparameter as documented: name, type, default, range and meaning."""

    name: str
    type: str
    default: Any
    range: str
    meaning: str
    declared_in: str
    """The Config class that declares the field (a base class for shared fields)."""


@cache
def _attribute_docstrings(cls: type) -> dict[str, str]:
    """Field name -> the string literal right under its annotated assignment, in ``cls`` only."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen build): meanings are left empty
        return {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    found = {}
    for statement, following in zip(body.body, body.body[1:]):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[statement.target.id] = " ".join(following.value.value.split())
    return found


def _type_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def _range(metadata: typing.Mapping[str, Any], annotation: Any) -> str:
    """The bounds as words; a tuple's bounds hold for each item."""
    each = "each " if typing.get_origin(annotation) is tuple and metadata else ""
    if "choices" in metadata:
        return each + "one of " + ", ".join(map(repr, metadata["choices"]))
    return each + ", ".join(f"{word} {metadata[key]}" for key, word in _BOUND_WORDS if key in metadata)


def field_docs(config_class: type[Hyperparameters]) -> list[FieldDoc]:
    """Every field of ``config_class`` in declaration order (base classes' first), documented."""
    hints = typing.get_type_hints(config_class)
    defaults = config_class()
    owners = [cls for cls in reversed(config_class.__mro__) if dataclasses.is_dataclass(cls)]
    meanings: dict[str, tuple[str, str]] = {}
    for cls in owners:  # a subclass that restates a field (a new default) keeps the base's meaning unless it gives one
        own = set(cls.__dict__.get("__annotations__", {}))
        for name, text in _attribute_docstrings(cls).items():
            meanings[name] = (text, cls.__name__)
        for name in own:
            if name not in meanings:
                meanings[name] = ("", cls.__name__)
    return [
        FieldDoc(
            field.name,
            _type_name(hints[field.name]),
            getattr(defaults, field.name),
            _range(field.metadata, hints[field.name]),
            meanings.get(field.name, ("", config_class.__name__))[0],
            meanings.get(field.name, ("", config_class.__name__))[1],
        )
        for field in dataclasses.fields(config_class)
    ]
