"""The transformation API: ``Transformation``, ``ReversibleTransformation`` and ``PassResult``.

Same names and semantics as ``optimum.fx.optimization``: a transformation is a
callable taking a ``torch.fx.GraphModule`` and returning the transformed one,
``__call__(graph_module, lint_and_recompile=True)``, with ``transform`` doing the
work. On top of that:

- ``apply`` returns a :class:`PassResult` that says truthfully what happened:
  ``modified`` is computed by comparing the graph and the identity of its
  tensors before and after, never assumed; ``matched``/``changed`` are the
  pass's own counts; ``notes`` give the reason for each miss.
- Marks live in ``node.meta`` as JSON values, never as node attributes, so a
  GraphModule saved and reloaded with its ``node.meta`` can still be reversed:
  ``node.meta["aot_transforms"]`` lists the signatures of the passes that
  transformed the node and ``node.meta["aot_reverse"][signature]`` holds what
  ``reverse`` needs.
- Marks belong to a transformation with its options and attributes, as Optimum
  keeps them per ``signature`` (class and attributes): ``signature`` is the pass's
  name, followed, as JSON, by the options that differ from their defaults and the
  attributes the instance was made with (``merge_linears``,
  ``merge_linears({"min_group_size":3})``; Optimum's style, an ``__init__`` that
  sets ``self.some_argument`` and never calls ``super().__init__()``:
  ``mark_linears({"some_argument":"test"})``). A pass with other options or
  attributes does not take another's marks for its own; an equal one (after a save
  and load, in another process) does: the text is stable, never Python's ``hash``.
- Options are a pydantic model (``Options``) declared per pass; unknown keys are
  rejected.
- A pass that raises, returns something else than a GraphModule or leaves an
  invalid graph ends in a :class:`PassFailure` naming it; the pipeline adds the
  step it was and the passes before it.

Passes that rewrite patterns build on ``rule.py``'s ``RewriteRule``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import logging
import re
import types
from abc import ABCMeta, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch.fx import GraphModule, Node

from aot.errors import AotError, PassError

logger = logging.getLogger(__name__)

TRANSFORMS_KEY = "aot_transforms"
REVERSE_KEY = "aot_reverse"
#: graph_module.meta key of the inputs a pass that calibrates runs the graph on: keyword dicts, as the graph is called
CALIBRATION_KEY = "aot_calibration_inputs"
#: graph_module.meta key of the recipe's fidelity gate, for a pass that keeps it: {"kl_mean", "kl_max", "top1_agreement"}
FIDELITY_TARGET_KEY = "aot_fidelity_target"


class PassFailure(PassError):
    """A pass failed: which one, what went wrong and, in a pipeline, at which step.

    ``at_step`` places it in a pipeline, in the spirit of torch.fx's pass manager
    ("after the following passes: [...]"), on one line:
    ``pass 'remove_dropout' (step 2, after passes [merge_linears]) failed: ...``.
    """

    def __init__(self, pass_name: str, detail: str, step: int | None = None, before: tuple[str, ...] = ()) -> None:
        self.pass_name, self.detail, self.step, self.before = pass_name, detail, step, tuple(before)
        super().__init__(f"pass '{pass_name}'{self._where()} failed: {detail}")

    def _where(self) -> str:
        if self.step is None:
            return ""
        if not self.before:
            return f" (step {self.step}, the first pass)"
        return f" (step {self.step}, after passes [{', '.join(self.before)}])"

    def at_step(self, step: int, before: list[str] | tuple[str, ...]) -> PassFailure:
        """The same failure, placed at ``step`` (counted from 1) after the passes ``before``."""
        return PassFailure(self.pass_name, self.detail, step, tuple(before))


@dataclass
class PassResult:
    """What one application of a pass did.

    ``modified`` is False when the graph, its modules and tensors are exactly as
    they were; ``matched`` counts the candidate sites the pass looked at,
    ``changed`` those it rewrote, and ``notes`` say why each other site, and
    each near miss, was left alone (the reasons of ``rule.Match.fail``, like
    onnxscript's ``MatchResult.fail``).
    """

    graph_module: GraphModule
    modified: bool
    matched: int = 0
    changed: int = 0
    notes: list[str] = field(default_factory=list)
    findings: dict[str, Any] = field(default_factory=dict)  # what the pass measured and chose (JSON), for the manifest


@dataclass
class _Report:
    matched: int = 0
    changed: int = 0
    notes: list[str] = field(default_factory=list)
    findings: dict[str, Any] = field(default_factory=dict)


def _snake_case(name: str) -> str:
    name = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return name.lower()


def graph_fingerprint(graph_module: GraphModule) -> tuple:
    """A value that changes whenever the graph or the tensors it runs on change.

    Tensors are compared by identity: passes never edit a tensor in place (it may
    be shared with the caller's model), they register a new one.
    """
    nodes = tuple((n.name, n.op, str(n.target), repr(n.args), repr(n.kwargs)) for n in graph_module.graph.nodes)
    modules = tuple((name, id(module)) for name, module in graph_module.named_modules(remove_duplicate=False))
    tensors = tuple(
        (name, id(tensor))
        for name, tensor in list(graph_module.named_parameters(remove_duplicate=False))
        + list(graph_module.named_buffers(remove_duplicate=False))
    )
    return nodes, modules, tensors


#: instance attribute: the names of the attributes the instance had once made, which its signature reads
_SIGNED_NAMES_KEY = "_signed_attribute_names"
# The base's own bookkeeping, and instance values of what the class declares: never part of a signature (the name
# already leads it; preserves_computation and frontends follow from the rest).
_UNSIGNED = frozenset({"options", "_report", "signature", _SIGNED_NAMES_KEY, "name", "preserves_computation", "frontends"})


class _Unsigned(Exception):
    """A value without a stable text: ``where`` says which part of the attribute holds it."""

    def __init__(self, where: str, value: Any) -> None:
        super().__init__(where, value)
        self.where, self.value = where, value


def _signed_value(value: Any, where: str) -> Any:
    """``value`` as JSON data that is the same in every process for equal values (never ``id`` or ``hash``)."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Transformation):
        return value.signature
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, torch.Tensor):
        try:
            data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        except Exception:  # a fake, meta or sparse tensor: no contents to read
            raise _Unsigned(where, value) from None
        return {"tensor": str(value.dtype), "shape": list(value.shape), "sha256": hashlib.sha256(data).hexdigest()}
    if isinstance(value, (list, tuple)):
        return [_signed_value(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return sorted((_signed_value(item, f"{where} item") for item in value), key=json.dumps)
    if isinstance(value, Mapping):
        items = [(_signed_value(key, f"{where} key"), _signed_value(item, f"{where}[{key!r}]")) for key, item in value.items()]
        if all(isinstance(key, str) for key, _ in items):
            return dict(items)
        return sorted(([key, item] for key, item in items), key=lambda pair: json.dumps(pair[0]))
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return f"{value.__module__}.{value.__qualname__}"
    if dataclasses.is_dataclass(value):
        return {"__dataclass__": type(value).__qualname__,
                **{f.name: _signed_value(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}}
    raise _Unsigned(where, value)


class _TransformationType(ABCMeta):
    """Notes, once an instance is made, which attributes it has: those its signature reads.

    Attributes set afterwards (state a transform keeps while it runs) leave the signature as it was, whenever it is
    first read; the subclass's ``__init__`` need not call ``super().__init__()``.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__call__(*args, **kwargs)
        if isinstance(instance, Transformation):
            instance.__dict__.setdefault(_SIGNED_NAMES_KEY, tuple(sorted(set(vars(instance)) - _UNSIGNED)))
        return instance


class Transformation(metaclass=_TransformationType):
    """A torch.fx graph transformation.

    Subclasses implement :meth:`transform` and are used as callables. Set
    ``preserves_computation = True`` when the transformed graph computes the same
    outputs as the original one (up to floating-point rounding).
    """

    preserves_computation: ClassVar[bool] = False
    #: Registered name; ``register_pass`` sets it, otherwise it is the class name in snake_case.
    name: ClassVar[str] = ""
    #: Graph flavours the pass understands; ``register_pass`` sets it.
    frontends: ClassVar[frozenset[str]] = frozenset({"fx", "export"})

    class Options(BaseModel):
        """No options."""

        model_config = ConfigDict(extra="forbid")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = _snake_case(cls.__name__)

    def __init__(self, **options: Any) -> None:
        self.options = type(self).Options.model_validate(options)
        self._report: _Report | None = None

    def __getattr__(self, name: str) -> Any:
        # Optimum's transformations may define an __init__ that never calls super().__init__(); such an
        # instance has the default options (signature, marks and reverse read them), or says which it lacks.
        if name != "options":
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        try:
            options = type(self).Options.model_validate({})
        except ValidationError as error:
            missing = ", ".join(str(item["loc"][0]) for item in error.errors())
            raise PassFailure(self.name, f"its __init__ did not call super().__init__(), and its options {missing} have no default") from None
        self.__dict__["options"] = options
        return options

    # -- the reference API -------------------------------------------------------------

    @functools.cached_property
    def signature(self) -> str:
        """This transformation with its options and attributes, as stable text.

        Its name, then, as JSON with sorted keys, the options that differ from their defaults and every
        attribute the instance was made with (whether or not its ``__init__`` called ``super().__init__()``),
        at their values when the signature is first read; ``__init__`` defaults included, so
        ``DummyTransformation()`` and ``DummyTransformation(some_argument=1)`` differ, as in Optimum. The base's
        own bookkeeping (``options``, ``_report``) is not an attribute here, so a pass that keeps no state of
        its own is signed by its name and options alone. Computed once, as Optimum's is: every mark test
        reads it, once a node.
        """
        fields = type(self.options).model_fields
        dumped = self.options.model_dump(mode="json")
        signed = {
            name: dumped[name]
            for name, spec in fields.items()
            if spec.is_required() or getattr(self.options, name) != spec.get_default(call_default_factory=True)
        }
        names = self.__dict__.get(_SIGNED_NAMES_KEY)
        if names is None:  # not made through the class (copy.copy of an old instance, object.__new__): all it has now
            names = sorted(set(vars(self)) - _UNSIGNED)
        for name in names:
            if name not in self.__dict__:
                continue  # deleted since
            if name in fields:
                raise PassFailure(self.name, f"its attribute '{name}' has the name of one of its options: the signature "
                                             "that keys its marks would hold two values under one name; rename the attribute")
            try:
                signed[name] = _signed_value(self.__dict__[name], name)
            except _Unsigned as error:
                raise PassFailure(
                    self.name,
                    f"its attribute {error.where} holds a {type(error.value).__qualname__}, which has no text that is the same "
                    "in every process, and the signature that keys its marks is made of its attributes: keep plain values "
                    "(numbers, strings, lists, dicts, enums, dtypes, tensors, other transformations), or set it once the "
                    "transformation is made (state a transform keeps while it runs is not signed)",
                ) from None
        return f"{self.name}({json.dumps(signed, sort_keys=True, separators=(',', ':'))})" if signed else self.name

    def needs_calibration(self) -> bool:
        """Whether this pass, with its options, runs the graph on calibration inputs (``graph_module.meta[CALIBRATION_KEY]``,
        which the build gives it from the recipe's ``generation.calibration``)."""
        return False

    def needs_fidelity_target(self) -> bool:
        """Whether this pass, with its options, keeps the recipe's fidelity gate while it works
        (``graph_module.meta[FIDELITY_TARGET_KEY]``, from ``generation.fidelity``)."""
        return False

    @abstractmethod
    def transform(self, graph_module: GraphModule) -> GraphModule:
        """Transforms ``graph_module`` (in place where possible) and returns it."""

    def __call__(self, graph_module: GraphModule, lint_and_recompile: bool = True) -> GraphModule:
        return self.apply(graph_module, lint_and_recompile=lint_and_recompile).graph_module

    def mark_as_transformed(self, node: Node) -> None:
        """Marks ``node`` as transformed by this transformation (in ``node.meta``)."""
        marks = node.meta.setdefault(TRANSFORMS_KEY, [])
        if self.signature not in marks:
            marks.append(self.signature)

    def transformed(self, node: Node) -> bool:
        """Whether ``node`` was transformed by this transformation."""
        return self.signature in node.meta.get(TRANSFORMS_KEY, ())

    def get_transformed_nodes(self, graph_module: GraphModule) -> list[Node]:
        """The nodes of ``graph_module`` this transformation has transformed."""
        return [node for node in graph_module.graph.nodes if self.transformed(node)]

    # -- results -----------------------------------------------------------------------

    def apply(self, graph_module: GraphModule, lint_and_recompile: bool = True) -> PassResult:
        """Runs :meth:`transform` and reports what it did."""
        return self._run(self.transform, graph_module, lint_and_recompile)

    @property
    def report(self) -> _Report:
        """Counters of the running application; a throwaway one when ``transform`` is called directly."""
        if getattr(self, "_report", None) is None:
            self._report = _Report()
        return self._report

    def note(self, message: str) -> None:
        """Records why a site was left alone; ``rule.RewriteRule`` calls it with each ``Match.fail`` reason."""
        self.report.notes.append(message)
        logger.debug("%s: %s", self.name, message)

    def _run(self, step: Callable[[GraphModule], GraphModule], graph_module: GraphModule, lint_and_recompile: bool) -> PassResult:
        before = graph_fingerprint(graph_module)
        self._report = _Report()
        try:
            result = step(graph_module)
        except AotError:
            raise
        except Exception as error:
            raise PassFailure(self.name, f"{type(error).__name__}: {error}") from error
        finally:
            report, self._report = self._report, None
        if not isinstance(result, GraphModule):
            raise PassFailure(self.name, f"it returned {type(result).__name__}, not a GraphModule")
        if lint_and_recompile:
            lint_and_recompile_graph(result, self.name)
        modified = result is not graph_module or graph_fingerprint(result) != before
        return PassResult(result, modified, report.matched, report.changed, list(report.notes), dict(report.findings))

    # -- reverse bookkeeping ----------------------------------------------------------

    def save_reverse_info(self, node: Node, info: dict[str, Any]) -> None:
        """Stores what ``reverse`` needs on ``node``; it must survive a JSON round trip."""
        try:
            json.dumps(info)
        except TypeError as error:
            raise PassFailure(self.name, f"it tried to store non-JSON reverse data on node '{node.name}': {error}") from error
        node.meta.setdefault(REVERSE_KEY, {})[self.signature] = info

    def reverse_info(self, node: Node) -> dict[str, Any]:
        info = node.meta.get(REVERSE_KEY, {}).get(self.signature)
        if info is None:
            raise PassFailure(self.name, f"node '{node.name}' is marked as transformed by it but holds no reverse data")
        return info

    def __repr__(self) -> str:
        options = self.options.model_dump() if hasattr(self, "options") else {}
        args = ", ".join(f"{key}={value!r}" for key, value in options.items())
        return f"{type(self).__name__}({args})"


class ReversibleTransformation(Transformation):
    """A torch.fx graph transformation that can be undone.

    Subclasses implement :meth:`transform` and :meth:`reverse`.
    """

    @abstractmethod
    def reverse(self, graph_module: GraphModule) -> GraphModule:
        """Undoes :meth:`transform` on the nodes it marked, and returns the module."""

    def __call__(self, graph_module: GraphModule, lint_and_recompile: bool = True, reverse: bool = False) -> GraphModule:
        return self.apply(graph_module, lint_and_recompile=lint_and_recompile, reverse=reverse).graph_module

    def apply(self, graph_module: GraphModule, lint_and_recompile: bool = True, reverse: bool = False) -> PassResult:
        if reverse:
            self._check_marks_are_ours(graph_module)
        return self._run(self.reverse if reverse else self.transform, graph_module, lint_and_recompile)

    def _check_marks_are_ours(self, graph_module: GraphModule) -> None:
        """A reverse that would find nothing because the marks are another instance's says so."""
        if self.get_transformed_nodes(graph_module):
            return
        others = sorted({mark for node in graph_module.graph.nodes for mark in node.meta.get(TRANSFORMS_KEY, ())
                         if mark.startswith(f"{self.name}(") or mark == self.name})
        if others:
            raise PassFailure(self.name, f"no node carries the marks of {self.signature}, but some carry those of "
                                         f"{', '.join(others)}: reverse with the options the graph was transformed with")

    def mark_as_restored(self, node: Node) -> None:
        """Marks ``node`` as restored to its original state: drops this pass's mark and reverse data."""
        marks = node.meta.get(TRANSFORMS_KEY, [])
        if self.signature not in marks:
            raise ValueError(f"node '{node.name}' was not transformed by '{self.signature}'")
        marks.remove(self.signature)
        if not marks:
            del node.meta[TRANSFORMS_KEY]
        reverse = node.meta.get(REVERSE_KEY, {})
        reverse.pop(self.signature, None)
        if REVERSE_KEY in node.meta and not reverse:
            del node.meta[REVERSE_KEY]


def lint_and_recompile_graph(graph_module: GraphModule, culprit: str) -> None:
    """Lints and recompiles, naming the pass that left the graph broken."""
    try:
        graph_module.graph.lint()
    except Exception as error:
        raise PassFailure(culprit, f"it left an invalid graph: {error}") from error
    graph_module.recompile()
