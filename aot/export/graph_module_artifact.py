"""Save a GraphModule as a directory that loads with torch alone; load it back into aot.

The directory holds three files, each written byte for byte the same by any
two saves of the same graph:

- ``module.py``: readable Python (torch and stdlib only) that rebuilds the module
  tree, runs the graph's code and loads the weights (:mod:`aot.export.module_writer`);
- ``weights.safetensors``: parameters, buffers and tensor constants, each stored once;
- ``meta.json``: the graph node by node with its meta (scope, pass marks, shapes),
  so :func:`load` restores the exact graph (:mod:`aot.export.graph_codec`).

No file is pickled. Files are written under temporary names and renamed, so an
error never leaves a half-written artifact behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import sys
import types
from pathlib import Path

import safetensors.torch
import torch
import torch.fx

from aot.errors import ExportError, IntegrityError

from .graph_codec import decode_graph, dumps, encode_graph
from .kinds import ArtifactKind, OpenOptions, WriteContext
from .node_meta import decode_meta
from .module_writer import WEIGHTS_FILE, write_module_source

logger = logging.getLogger(__name__)

FOLDER = "graph_module"  # the artifact's folder in a build directory
MODULE_FILE = "module.py"
META_FILE = "meta.json"


def save_graph_module(gm: torch.fx.GraphModule, directory: Path) -> list[Path]:
    """Write module.py, weights.safetensors and meta.json into ``directory``; return their paths."""
    directory = Path(directory)
    source, tree = write_module_source(gm)
    document = encode_graph(gm)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / MODULE_FILE, directory / WEIGHTS_FILE, directory / META_FILE]
    staged = [path.with_name(f".{path.name}.partial") for path in paths]
    try:
        staged[0].write_text(source, encoding="utf-8", newline="\n")
        safetensors.torch.save_file(_storable(tree.tensors), str(staged[1]), metadata={"format": "pt"})
        staged[2].write_text(dumps(document), encoding="utf-8", newline="\n")
        for temporary, final in zip(staged, paths):
            os.chmod(temporary, 0o644)  # safetensors creates its file private; artifacts are for sharing
            os.replace(temporary, final)
    except (OSError, safetensors.SafetensorError) as error:  # the library reports a full disk as its own error
        raise ExportError(f"cannot write the graph artifact in {directory}: {error}") from None
    finally:
        for temporary in staged:
            temporary.unlink(missing_ok=True)
    logger.info("saved graph module to %s (%d tensors)", directory, len(tree.tensors))
    return paths


def load_standalone(directory: Path, expected_sha256: str | None = None, *, keep_freed_memory: bool = True) -> torch.nn.Module:
    """Run ``module.py`` of a saved artifact as users do (``runpy.run_path(...)["load"](directory)``).

    ``keep_freed_memory``: what ``load`` does to this process's malloc (see ``module.py``); the
    build turns it off, so its own memory is returned as before.

    ``expected_sha256``: the digest the manifest recorded. The text is hashed as it is read and
    only that text runs, so no one can swap the file between the check and the execution.
    Like ``runpy``, nothing is written beside it (no ``__pycache__``): a build directory holds
    only what its manifest lists.
    """
    directory = Path(directory)
    module_path = directory / MODULE_FILE
    try:
        source = module_path.read_bytes()
    except OSError as error:
        raise ExportError(f"{module_path}: cannot read: {error.strerror}") from None
    if expected_sha256 is not None and hashlib.sha256(source).hexdigest() != expected_sha256:
        raise IntegrityError(f"{module_path}: sha256 differs from manifest.json (the file was modified after the build)")
    # Like runpy, the code runs as a module that sys.modules holds while it runs: dataclasses
    # (a decoder's generate helper has one) look their class's module up there.
    module = types.ModuleType("<run_path>")
    module.__file__ = str(module_path)
    namespace = module.__dict__
    try:
        with _registered(module):
            exec(compile(source, str(module_path), "exec"), namespace)  # noqa: S102 (checked above; what users run)
        load = namespace["load"]
        # module.py files written before keep_freed_memory existed take the directory alone
        takes_option = "keep_freed_memory" in inspect.signature(load).parameters
        return load(str(directory), keep_freed_memory=keep_freed_memory) if takes_option else load(str(directory))
    except Exception as error:
        raise ExportError(f"{module_path}: cannot load the saved model: {type(error).__name__}: {error}") from None


@contextlib.contextmanager
def _registered(module: types.ModuleType):
    previous = sys.modules.get(module.__name__)
    sys.modules[module.__name__] = module
    try:
        yield
    finally:
        if previous is None:
            sys.modules.pop(module.__name__, None)
        else:
            sys.modules[module.__name__] = previous


def load(directory: Path) -> torch.fx.GraphModule:
    """Rebuild the saved GraphModule: the module tree and weights from module.py, the graph and meta from meta.json."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    try:
        document = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ExportError(f"{meta_path}: cannot read: {error}") from None
    graph, attributes = decode_graph(document, str(meta_path))
    root = load_standalone(directory)
    gm = torch.fx.GraphModule(root, graph, class_name=document["class_name"])
    for name, value in attributes.items():
        setattr(gm, name, value)
    gm.meta.update(decode_meta(document.get("graph_meta", {})))
    training = {path for path, module in root.named_modules() if module.training}
    gm.train(False)
    for path in training:
        gm.get_submodule(path).training = True
    return gm


def _storable(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors that share no storage (safetensors refuses shared memory)."""
    storable: dict[str, torch.Tensor] = {}
    storages: set[tuple[int, int]] = set()
    for name, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.numel():
            key = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
            if key in storages or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
                tensor = tensor.clone()
                key = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
            storages.add(key)
        storable[name] = tensor
    return storable


class TorchRunnable:
    """``graph_module/module.py`` loaded as users load it, from the very bytes the manifest hashed."""

    runtime = "torch"

    def __init__(self, folder: Path, module_sha256: str | None):
        self.model = load_standalone(folder, module_sha256)
        self.input_names = _forward_names(self.model)

    @torch.no_grad()
    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from aot.tracing.outputs import flatten_outputs

        wanted = inputs if self.input_names is None else {name: value for name, value in inputs.items() if name in self.input_names}
        return flatten_outputs(self.model(**wanted))

    @torch.no_grad()
    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id=None, pad_token_id=None) -> torch.Tensor:
        return self.model.generate(input_ids, attention_mask, max_new_tokens, eos_token_id=eos_token_id, pad_token_id=pad_token_id)


def _forward_names(model: torch.nn.Module) -> list[str] | None:
    """The forward's parameter names; None where it takes any keyword (CUDA graph buckets pass all on)."""
    parameters = inspect.signature(model.forward).parameters
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()):
        return None
    return [name for name in parameters if name != "self"]


class GraphModuleKind(ArtifactKind):
    """The saved GraphModule (``export.graph_module``): torch-only ``module.py``, safetensors weights, ``meta.json``.

    Its one loader is ``module.py``'s own ``load`` (:func:`load_standalone`, from the bytes the manifest hashed);
    :func:`load` rebuilds the graph itself on top of it for aot's own use.
    """

    title = "GraphModule"
    name = "graph_module"
    runtime = "torch"
    main_file = f"{FOLDER}/{MODULE_FILE}"
    runs_code = True  # module.py

    def write(self, graph: torch.fx.GraphModule, context: WriteContext) -> list[Path]:
        return save_graph_module(graph, context.directory / FOLDER)

    def open(self, directory: Path, options: OpenOptions) -> TorchRunnable:
        if options.threads is not None:  # torch has one intra-op pool a process: the module runs on it
            torch.set_num_threads(options.threads)
        return TorchRunnable(directory / FOLDER, options.sha256_of(self.main_file))

    def open_module(self, directory: Path, sha256_of, *, keep_freed_memory: bool = True) -> torch.nn.Module:
        """The ``torch.nn.Module`` that ``module.py``'s ``load`` returns (a decoder's has ``generate``)."""
        return load_standalone(directory / FOLDER, sha256_of(self.main_file), keep_freed_memory=keep_freed_memory)

    @contextlib.contextmanager
    def checked_runner(self, directory: Path, options: OpenOptions, input_names: dict[str, str]):
        # The malloc setting module.py's load makes by default changes no result, only this process's memory.
        saved = self.open_module(directory, options.sha256_of, keep_freed_memory=False).to(options.device)

        def run(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            from aot.tracing.outputs import flatten_outputs

            with torch.no_grad():
                return flatten_outputs(saved(**inputs))

        try:
            yield run, lambda batch: saved(**batch), f"{self.main_file} load()"
        finally:
            del saved, run


GRAPH_MODULE = GraphModuleKind()

