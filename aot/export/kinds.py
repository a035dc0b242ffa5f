"""Artifact kinds: each kind of file a build ships is one unit, found here by name.

A kind owns, in its own module: its recipe section's meaning (``export.<name>``), its writer, what the manifest
records of it, how the build checks it against eager (:meth:`ArtifactKind.checked_runner`), and the one
:meth:`ArtifactKind.open` that ``aot run``, ``aot.load``, the bench's worker and ``aot validate`` use. The spine,
the checks and the runners loop over :func:`artifact_kinds`; none of them names a kind.

A kind is registered as a dotted path (``"module:attribute"``), imported only when first asked for, so a kind's
heavy dependencies (ONNX Runtime, Inductor) load only for its users. To add a kind: one module with an
:class:`ArtifactKind` subclass instance, and one line in :data:`ARTIFACT_KINDS` (or :func:`register_artifact_kind`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

# Name -> where its unit lives. The order is the order users are offered them (``aot bench``'s columns, the runtimes),
# and the build writes them; :func:`in_check_order` is the order they are checked in.
ARTIFACT_KINDS: dict[str, str] = {
    "graph_module": "aot.export.graph_module_artifact:GRAPH_MODULE",
    "onnx": "aot.export.onnx_artifact:ONNX",
    "aoti": "aot.export.aoti_package:AOTI",
}
_loaded: dict[str, ArtifactKind] = {}


class Runnable(Protocol):
    """An opened artifact: ``{input name: tensor}`` in, ``{output name: tensor}`` out (the one naming of outputs)."""

    runtime: str

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 eos_token_id: int | list[int] | None, pad_token_id: int | None) -> torch.Tensor: ...


@dataclass(frozen=True)
class OpenOptions:
    """What opening an artifact may take from its caller beside the directory."""

    manifest: dict[str, Any]
    sha256_of: Callable[[str], str | None]  # the manifest's digest of a file: code runs only from the bytes hashed
    decoder: bool = False  # a decoder step: the artifact also generates
    threads: int | None = None  # the runtime's intra-op threads (unless the kind's ``fixed_threads`` says why not)
    device: str = "cpu"


@dataclass(frozen=True)
class WriteContext:
    """What a kind's writer may take beside the graph."""

    directory: Path  # the build's staging directory; the kind writes its own files under it
    example_inputs: dict[str, torch.Tensor]  # the trace's inputs
    dynamic_dims: dict[str, dict[int, str]]  # {input: {axis: dim name}} kept dynamic
    dim_ranges: dict[str, tuple[int | None, int | None]] | None  # {dim name: (min, max)}


class ArtifactKind:
    """One kind of artifact. Subclasses set the class attributes and implement the methods."""

    title: ClassVar[str]  # what messages call it ("ONNX model")
    name: ClassVar[str]  # the recipe section (``export.<name>``), the check's and the bench's runner name
    runtime: ClassVar[str]  # what ``aot run --runtime`` and ``aot.load(runtime=...)`` call it
    main_file: ClassVar[str]  # relative to the build directory: present when the kind was built
    runs_code: ClassVar[bool]  # opening it executes code from the directory: consent first (aot.directory.consent)
    generates: ClassVar[bool] = True  # a decoder build's artifact of this kind can generate
    written_beside: ClassVar[bool] = False  # written by a forked child beside the other stages (aot.builder.onnx_stage)
    manifest_key: ClassVar[str | None] = None  # the manifest's key for what :meth:`manifest_section` records
    fixed_threads: ClassVar[str | None] = None  # why :meth:`open` cannot take ``OpenOptions.threads``; None: it takes them

    def write(self, graph: Any, context: WriteContext) -> Any:
        """Write the kind's files under ``context.directory``; what it returns goes to :meth:`manifest_section`."""
        raise NotImplementedError

    tolerance: ClassVar[str] = "tolerance"  # the validation plan's field that holds its outputs' atol/rtol

    def manifest_section(self, written: Any) -> dict[str, Any] | None:
        """What the manifest records under :attr:`manifest_key`, from what the writer returned (None: not built)."""
        return None

    def deployment_notes(self, directory: Path) -> dict[str, str]:
        """Lines for the manifest's deployment section, read from what the kind wrote in ``directory`` (a kind
        written by a forked child cannot hand back what the child decided, so it is read from the files)."""
        return {}

    def open(self, directory: Path, options: OpenOptions) -> Runnable:
        raise NotImplementedError

    def checked_runner(self, directory: Path, options: OpenOptions, input_names: dict[str, str]
                       ) -> AbstractContextManager[tuple[Callable[[dict[str, Any]], Any], Callable[[dict[str, Any]], Any], str]]:
        """For the build's checks, loaded as users load it, held open while the context lasts: ``(run, run_batch,
        what ran)``. ``run(inputs)`` gives ``{output name: tensor}``; ``run_batch(batch)`` what the accuracy gate
        scores (the artifact's own outputs). ``input_names``: ``{case input: this kind's name}`` where they differ."""
        raise NotImplementedError


def artifact_kind(name: str) -> ArtifactKind:
    """The kind registered as ``name`` (imported on first use)."""
    if name not in _loaded:
        if name not in ARTIFACT_KINDS:
            raise KeyError(f"no artifact kind '{name}' (known: {', '.join(ARTIFACT_KINDS)})")
        module, attribute = ARTIFACT_KINDS[name].split(":")
        kind = getattr(importlib.import_module(module), attribute)
        if not isinstance(kind, ArtifactKind) or kind.name != name:
            raise TypeError(f"{ARTIFACT_KINDS[name]} is not the ArtifactKind '{name}'")
        _loaded[name] = kind
    return _loaded[name]


def artifact_kinds() -> Iterator[ArtifactKind]:
    """Every registered kind, in the registry's order."""
    return (artifact_kind(name) for name in ARTIFACT_KINDS)


def in_check_order() -> list[ArtifactKind]:
    """The kinds in the order they are checked: one written beside the build first (its files are hashed while it is
    checked), then the others in the registry's order."""
    return sorted(artifact_kinds(), key=lambda kind: not kind.written_beside)


def enabled_kinds(export_plan: Any) -> list[ArtifactKind]:
    """The kinds the plan's ``export`` section asks for (``export.<name>.enabled``), in the registry's order."""
    return [kind for kind in artifact_kinds() if getattr(export_plan, kind.name).enabled]


def kind_of_runtime(runtime: str) -> ArtifactKind:
    """The kind ``aot run --runtime RUNTIME`` opens."""
    for kind in artifact_kinds():
        if kind.runtime == runtime:
            return kind
    raise KeyError(runtime)


def runtimes() -> list[str]:
    """The runtime names users may choose, in the registry's order."""
    return [kind.runtime for kind in artifact_kinds()]


def register_artifact_kind(name: str, location: str) -> None:
    """Add a kind (``"package.module:ATTRIBUTE"``); a name taken already is an error, never a silent replacement."""
    if name in ARTIFACT_KINDS:
        raise ValueError(f"artifact kind '{name}' is registered already ({ARTIFACT_KINDS[name]})")
    if location.count(":") != 1:
        raise ValueError(f"artifact kind '{name}': '{location}' is not 'module:attribute'")
    ARTIFACT_KINDS[name] = location
