"""``--set KEY=VALUE``: recipe keys given on the command line, applied to the recipe's data before it is validated.

``model.config.num_hidden_layers=2`` builds a recipe at another size without a copy of it: the key is
dotted through mappings (those absent are created), and the value is read as YAML on one line, as the
file would spell it (``2``, ``true``, ``bfloat16``, ``[a, b]``, ``{size: 4, dynamic: true}``). The
overridden data then goes through every check the file's own data does, so an unknown or mistyped key
is still reported; having no line in the file, it is reported as ``--set model.confg: unknown key``.

The file itself is never written: the build keeps it as it is, with its hash, and records the overrides
beside it, in order (the manifest's ``recipe.overrides``), so the recipe plus the overrides gives the build.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aot.errors import RecipeError
from aot.recipe.reader import Location, dotted, parse_yaml_value


@dataclass(frozen=True)
class Override:
    """One ``--set``: the text as given, the key it sets and the value, parsed."""

    text: str
    location: tuple[str, ...]
    value: Any

    @property
    def key(self) -> str:
        return dotted(self.location)


def parse_override(text: str) -> Override:
    """``"model.config.num_hidden_layers=2"`` parsed; a :class:`RecipeError` naming the override when malformed."""
    key, equals, value = text.partition("=")
    where = f"--set {text}"
    if not equals:
        raise RecipeError(f"{where}: not KEY=VALUE (e.g. --set model.config.num_hidden_layers=2)")
    key = key.strip()
    if not key:
        raise RecipeError(f"{where}: empty key before '='")
    parts = tuple(part.strip() for part in key.split("."))
    if not all(parts):
        raise RecipeError(f"{where}: empty part in key '{key}' (keys are dotted: model.config.num_hidden_layers)")
    if "[" in key or "]" in key:
        raise RecipeError(f"{where}: list items are not set one by one: set the whole list (KEY=[a, b])")
    return Override(text, parts, parse_yaml_value(where, value))


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> tuple[dict[str, Any], dict[Location, str]]:
    """``data`` with ``overrides`` applied in order (a later one wins), and where each value set came from.

    ``data`` is not changed: every mapping on an override's path is copied before it is written, since a
    YAML alias can share one mapping between two places of the file. The second result maps the location
    of each key set, and of each mapping created on the way to one, to the override (as given) that set it.
    """
    data = dict(data)
    origins: dict[Location, str] = {}
    for text in overrides:
        override = parse_override(text)
        mapping = data
        for depth, part in enumerate(override.location[:-1], start=1):
            child = mapping.get(part)
            if child is None:  # absent, or a key left empty in the file (`config:`)
                child = {}
                origins[override.location[:depth]] = text
            elif isinstance(child, dict):
                child = dict(child)
            else:
                raise RecipeError(f"--set {text}: {_not_a_mapping(override.location[:depth], child)}")
            mapping[part] = child
            mapping = child
        mapping[override.location[-1]] = override.value
        for location in [location for location in origins if location[: len(override.location)] == override.location]:
            del origins[location]  # whatever an earlier override set under this key is gone
        origins[override.location] = text
    return data, origins


def _not_a_mapping(location: tuple[str, ...], value: Any) -> str:
    key = dotted(location)
    if isinstance(value, list):
        return f"{key} is a list, not a mapping (--set replaces a whole list: {key}=[a, b])"
    shown = repr(value)
    return f"{key} is {shown if len(shown) <= 40 else shown[:37] + '...'} (a {type(value).__name__}), not a mapping"
