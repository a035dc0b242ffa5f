"""Where a recipe's keys are written: the file and the line of each, without their values.

A value resolved from a recipe (a directory, a data file, a dim) can turn out wrong long
after the recipe was read: a tokenizer that does not load, a text the tokenizer cannot
give an input for. The error must still name the recipe's file and line, so each section
of the build plan carries a :class:`RecipeLocator` beside the values it resolved, and no
stage needs the recipe itself to say where a key came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aot.errors import RecipeError
from aot.recipe.reader import Location, dotted


@dataclass(frozen=True)
class RecipeLocator:
    path: Path
    lines: Mapping[Location, int] = field(repr=False, compare=False)
    # Keys whose values a ``--set`` gave (and mappings one created), with that override as given: they have no line.
    overridden: Mapping[Location, str] = field(default_factory=dict, repr=False, compare=False)

    def where(self, *location: str | int) -> str:
        """``file:line`` of the deepest part of ``location`` the file spells out; ``--set KEY`` for a value a ``--set`` gave."""
        if self.override_of(location) is not None:
            return f"--set {dotted(location)}"
        return f"{self.path}:{line_for(self.lines, location)}"

    def override_of(self, location: Location) -> str | None:
        """The ``--set`` (as given) that gave the value at ``location``, or one that holds it; None if the file did."""
        for cut in range(len(location), 0, -1):
            if location[:cut] in self.overridden:
                return self.overridden[location[:cut]]
        return None

    def error(self, location: Location, message: str) -> RecipeError:
        """A recipe error naming the file, the line and the key: ``recipe.yaml:7: model.pretrained: ...``, or
        ``--set model.confg: ...`` for a key a ``--set`` gave, which has no line."""
        key = dotted(location)
        if self.override_of(location) is not None:
            return RecipeError(f"--set {key}: {message}")
        inside = [text for overridden, text in self.overridden.items() if location and overridden[: len(location)] == location]
        if inside:  # the file's mapping, as a --set changed it
            message += f" (with {', '.join(f'--set {text}' for text in dict.fromkeys(inside))})"
        return RecipeError(f"{self.where(*location)}: {key}: {message}" if key else f"{self.where()}: {message}")


@dataclass(frozen=True)
class Located:
    """A resolved path with the recipe key it was resolved from (``key``), to name that key in an error."""

    path: Path
    key: Location
    locator: RecipeLocator

    def error(self, message: str, key: Location | None = None) -> RecipeError:
        return self.locator.error(self.key if key is None else key, message)


def line_for(lines: Mapping[Location, int], location: Location) -> int:
    for cut in range(len(location), -1, -1):
        if location[:cut] in lines:
            return lines[location[:cut]]
    return 1
