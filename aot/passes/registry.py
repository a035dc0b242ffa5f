"""The pass registry: every pass under one snake_case name, with typed options.

Recipes refer to passes by name::

    passes:
      - merge_linears
      - {name: change_true_div_to_mul_by_inverse, options: {exact_only: true}}

``register_pass`` files a class under its name and says which graph flavours it
understands (``fx``: module-level graphs from ``aot.tracing``; ``export``:
ATen-level graphs from ``torch.export``), so that a recipe using a pass on the
wrong frontend is rejected when it is loaded. A duplicate name is an error,
not a warning.
"""

from __future__ import annotations

import inspect
import sys
import typing

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from aot.errors import did_you_mean

from .base import Transformation

FRONTENDS = frozenset({"fx", "export"})

_PASSES: dict[str, PassInfo] = {}


@dataclass(frozen=True)
class PassInfo:
    """A registered pass: its name, class, options model and documentation."""

    name: str
    cls: type[Transformation]
    options: type[BaseModel]
    frontends: frozenset[str]
    summary: str
    doc: str

    @property
    def reversible(self) -> bool:
        from .base import ReversibleTransformation

        return issubclass(self.cls, ReversibleTransformation)

    @property
    def preserves_computation(self) -> bool:
        return bool(self.cls.preserves_computation)

    def create(self, options: Mapping[str, Any] | None = None) -> Transformation:
        """An instance configured with ``options``; raises pydantic's ValidationError on bad options."""
        return self.cls(**dict(options or {}))

    def supports(self, frontend: str) -> bool:
        return frontend in self.frontends

    @property
    def option_docs(self) -> list[OptionDoc]:
        """Each option as ``aot passes`` and docs/passes.md show it, in the order the Options model declares them."""
        return [OptionDoc(name, _type_text(field.annotation), _recipe_text(field.default), field.description or "")
                for name, field in self.options.model_fields.items()]


@dataclass(frozen=True)
class OptionDoc:
    """A pass option for a reader: its recipe key, its type, its default as a recipe spells it, what it does."""

    name: str
    type: str
    default: str
    description: str


def _type_text(annotation: Any) -> str:
    """``bool``, ``list[str]``, ``Literal['a', 'b']``: a class by its name, anything else as typing prints it; an options
    model as the mapping a recipe writes (``{bits: Literal[4, 8], ...}``), not as a private class's dotted path."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "{" + ", ".join(f"{name}: {_type_text(field.annotation)}" for name, field in annotation.model_fields.items()) + "}"
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, dict, tuple) and any(isinstance(argument, type) and issubclass(argument, BaseModel) for argument in arguments):
        return f"{origin.__name__}[{', '.join(_type_text(argument) for argument in arguments)}]"
    plain = isinstance(annotation, type) and not getattr(annotation, "__args__", None)
    return annotation.__name__ if plain else str(annotation).replace("typing.", "")


def _recipe_text(value: Any) -> str:
    """A default as a recipe spells it, in YAML's flow style: ``true``, ``null``, ``[a, b]``, ``{bits: 8}``."""
    import yaml
    from pydantic_core import to_jsonable_python

    value = to_jsonable_python(value, exclude_none=True)  # a default made of option models (auto_grids) as a recipe writes it
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False).strip().removesuffix("...").strip()


def register_pass(name: str, *, frontends: Iterable[str] = ("fx", "export")) -> Callable[[type[Transformation]], type[Transformation]]:
    """Class decorator filing a :class:`Transformation` subclass under ``name``."""
    frontend_set = frozenset(frontends)
    unknown = frontend_set - FRONTENDS
    if unknown or not frontend_set:
        raise ValueError(f"pass '{name}': frontends must be a non-empty subset of {sorted(FRONTENDS)}, got {sorted(frontend_set)}")
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"pass name '{name}' must be a snake_case identifier")

    def decorate(cls: type[Transformation]) -> type[Transformation]:
        if name in _PASSES:
            raise ValueError(f"pass name '{name}' is already registered by {_PASSES[name].cls.__qualname__}")
        if not (isinstance(cls, type) and issubclass(cls, Transformation)):
            raise TypeError(f"pass '{name}': {cls!r} is not a Transformation subclass")
        _check_options(name, cls.Options)
        doc = _dedent_doc(cls)
        cls.name = name
        cls.frontends = frontend_set
        _PASSES[name] = PassInfo(
            name=name,
            cls=cls,
            options=cls.Options,
            frontends=frontend_set,
            summary=doc.strip().splitlines()[0] if doc.strip() else "",
            doc=doc,
        )
        return cls

    return decorate


def get(name: str) -> PassInfo:
    """The pass registered under ``name``; KeyError lists the known names."""
    try:
        return _PASSES[name]
    except KeyError:
        raise KeyError(f"unknown pass '{name}'{did_you_mean(name, _PASSES) or ' (`aot passes` lists them)'}") from None


def all_passes() -> list[PassInfo]:
    """Every registered pass, sorted by name."""
    return [_PASSES[name] for name in sorted(_PASSES)]


def _check_options(name: str, options: Any) -> None:
    if not (isinstance(options, type) and issubclass(options, BaseModel)):
        raise TypeError(f"pass '{name}': Options must be a pydantic BaseModel subclass")
    if options.model_config.get("extra") != "forbid":
        raise TypeError(f"pass '{name}': Options must set model_config = ConfigDict(extra='forbid')")
    for field_name, info in options.model_fields.items():
        if not info.description:
            raise TypeError(f"pass '{name}': option '{field_name}' needs Field(description=...)")
        if info.is_required():
            raise TypeError(f"pass '{name}': option '{field_name}' needs a default")


def _dedent_doc(cls: type) -> str:
    """The class docstring, then its module's docstring (the graph before/after and the math)."""
    class_doc = inspect.cleandoc(cls.__doc__ or "")
    module = sys.modules.get(cls.__module__)
    module_doc = inspect.cleandoc(module.__doc__ or "") if module is not None else ""
    if module_doc and module_doc not in class_doc:
        return f"{class_doc}\n\n{module_doc}" if class_doc else module_doc
    return class_doc
