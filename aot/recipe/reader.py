"""Read and parse a recipe file within fixed limits, keeping the line of every key.

A release job builds whatever recipe a commit holds, so the file is untrusted
input. YAML aliases let a few hundred bytes stand for billions of nodes ("billion
laughs"), an alias inside its own anchor (``&a [*a]``) makes a value without end,
and a huge or deeply nested file costs minutes and stack before anything useful
can be said. The limits below stop each of these early, with one line naming
the file and the line; the shipped recipes stay far below them (at most 1.3 KiB,
117 nodes and 6 levels).

The file is parsed once: the composed node tree gives the line of every key and
list item, and the data is constructed from that same, checked tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.resolver import Resolver

from aot.errors import RecipeError

# Limits on a recipe file: ten (depth) to eight hundred (bytes) times what a shipped recipe uses.
MAX_RECIPE_BYTES = 1 << 20
"""Largest recipe file, in bytes (1 MiB). No more than this many bytes + 1 are ever read."""

MAX_RECIPE_NODES = 20_000
"""Most YAML nodes (mappings, lists, keys and values) once aliases are expanded: an alias counts
the whole value it repeats, each time it is used."""

MAX_RECIPE_DEPTH = 64
"""Deepest nesting of mappings and lists, aliases expanded."""

Location = tuple[str | int, ...]

if yaml.__with_libyaml__:
    # libyaml's scanner and parser emit the same events, line marks included, several times faster.
    from yaml.cyaml import CParser as _EventSource
else:
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _EventSource(Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


class _LimitExceeded(yaml.MarkedYAMLError):
    """The YAML is well formed but over one of the limits above."""


class _Extent(NamedTuple):
    """How much an anchored value weighs each time an alias repeats it."""

    nodes: int
    levels: int


class _BoundedComposer(Composer):
    """PyYAML's composer, counting nodes and levels as aliases expand them.

    PyYAML composes an alias as a second reference to the anchored node, so the
    tree stays small while what it stands for (and what everything downstream
    walks) can be exponential, or cyclic. The counts here are those of the
    expanded tree, taken while composing, so a bomb stops at the budget.
    """

    def __init__(self) -> None:
        super().__init__()
        self._nodes = 0
        self._depth = 0
        self._deepest = 0  # deepest level reached inside the value being composed
        self._extents: dict[str, _Extent] = {}
        self._open_anchors: set[str] = set()

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self._count_alias(event)
            return super().compose_node(parent, index)
        nodes_before, deepest_outside = self._nodes, self._deepest
        self._depth += 1
        self._deepest = self._depth
        self._grow(1, self._depth, event.start_mark)
        if event.anchor is not None:
            self._open_anchors.add(event.anchor)
        node = super().compose_node(parent, index)
        if event.anchor is not None:
            self._open_anchors.discard(event.anchor)
            self._extents[event.anchor] = _Extent(self._nodes - nodes_before, self._deepest - self._depth + 1)
        self._depth -= 1
        self._deepest = max(deepest_outside, self._deepest)
        return node

    def _count_alias(self, event: AliasEvent) -> None:
        if event.anchor in self._open_anchors:
            raise _LimitExceeded(
                problem=f"alias *{event.anchor} is used inside its own anchor &{event.anchor}: a recursive value never ends",
                problem_mark=event.start_mark,
            )
        extent = self._extents.get(event.anchor)
        if extent is not None:  # an undefined alias is left to PyYAML, which names it
            self._grow(extent.nodes, self._depth + extent.levels, event.start_mark)

    def _grow(self, nodes: int, depth: int, mark: yaml.Mark) -> None:
        self._nodes += nodes
        self._deepest = max(self._deepest, depth)
        if self._nodes > MAX_RECIPE_NODES:
            raise _LimitExceeded(
                problem=f"more than {MAX_RECIPE_NODES} YAML nodes once aliases are expanded (the node budget: an alias "
                "counts the whole value it repeats)",
                problem_mark=mark,
            )
        if depth > MAX_RECIPE_DEPTH:
            raise _LimitExceeded(
                problem=f"nested deeper than {MAX_RECIPE_DEPTH} levels once aliases are expanded (the depth limit)",
                problem_mark=mark,
            )


class _RecipeLoader(_BoundedComposer, _EventSource, SafeConstructor, Resolver):
    def __init__(self, text: str) -> None:
        _EventSource.__init__(self, text)
        _BoundedComposer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


def read_recipe_text(path: Path) -> str:
    """The file's text, read no further than :data:`MAX_RECIPE_BYTES` + 1 bytes."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_RECIPE_BYTES + 1)
    except FileNotFoundError:
        raise RecipeError(f"{path}: recipe file not found") from None
    except IsADirectoryError:
        raise RecipeError(f"{path}: is a directory, not a recipe file") from None
    except OSError as error:
        raise RecipeError(f"{path}: cannot read recipe: {error.strerror}") from None
    if len(raw) > MAX_RECIPE_BYTES:
        raise RecipeError(f"{path}: recipe file is larger than {MAX_RECIPE_BYTES} bytes, the most aot reads")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise RecipeError(f"{path}:{line}: not UTF-8 at byte {error.start}") from None
    # Universal newlines, as text-mode reading gives: the recipe's hash does not depend on line endings.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def parse_recipe_yaml(path: Path, text: str) -> tuple[Any, dict[Location, int]]:
    """The recipe's data, and the line of every key and list item in it."""
    loader = _RecipeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise RecipeError(f"{path}:1: the recipe is empty")
        lines: dict[Location, int] = {}
        # Lines first: constructing rewrites merge keys (`<<: *base`) in place.
        _index_lines(path, root, (), lines)
        return loader.construct_document(root), lines
    except _LimitExceeded as error:
        raise RecipeError(f"{path}:{error.problem_mark.line + 1}: {error.problem}") from None
    except yaml.YAMLError as error:
        raise RecipeError(f"{path}:{_error_line(error, text)}: malformed YAML: {_problem(error)}") from None
    finally:
        loader.dispose()


def parse_yaml_value(where: str, text: str) -> Any:
    """One YAML value written on a line (a ``--set`` override's: ``2``, ``true``, ``[a, b]``, ``{k: v}``), within the
    limits a recipe file is read under; empty text is null, as an empty value in a file is. ``where`` starts any error."""
    loader = _RecipeLoader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else loader.construct_document(node)
    except _LimitExceeded as error:
        raise RecipeError(f"{where}: {error.problem}") from None
    except yaml.YAMLError as error:
        raise RecipeError(f"{where}: malformed YAML value: {_problem(error)}") from None
    finally:
        loader.dispose()


def _error_line(error: yaml.YAMLError, text: str) -> int:
    mark = getattr(error, "problem_mark", None)
    if mark is not None:
        return mark.line + 1
    position = getattr(error, "position", None)  # a ReaderError (a character YAML forbids) has only an offset
    return text.count("\n", 0, position) + 1 if isinstance(position, int) else 1


def _problem(error: yaml.YAMLError) -> str:
    return getattr(error, "problem", None) or str(error).splitlines()[0]


def _index_lines(path: Path, node: yaml.Node, location: Location, lines: dict[Location, int]) -> None:
    lines[location] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a list or mapping as key: the constructor rejects it as unhashable
            key = key_node.value
            if key in seen:
                raise RecipeError(f"{path}:{key_node.start_mark.line + 1}: {dotted(location + (key,))}: duplicate key")
            seen.add(key)
            _index_lines(path, value_node, location + (key,), lines)
            # The key's own line, not the value's: that is where a user looks for it.
            lines[location + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(path, item, location + (index,), lines)


def dotted(location: Location) -> str:
    """``model.config.hidden_size``, ``passes[2]``: a location as the user would spell it."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
