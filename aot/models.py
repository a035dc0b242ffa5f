"""Build the eager model a recipe names, offline and reproducibly.

Three sources: an inline transformers config (weights from the recipe's
seed), a local pretrained directory, or a ``package.module:function``
factory. The hub is never contacted: this tool runs in release jobs that must
not depend on the network.

What the recipe got wrong about a transformers model is checked on its
blueprint (:mod:`aot.model_blueprint`) before any weight is built; a factory
that raises, or weights files that cannot be read, are the recipe's faults too
and are reported as such, naming the key or the file.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import pickle
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from aot.errors import AotError, first_line
from aot.model_blueprint import Blueprint, model_blueprint
from aot.recipe.locator import Located
from aot.recipe.plan import ModelPlan
from aot.tracing.dummy_inputs import forward_parameters  # re-exported: aot.inputs and aot.gates.compare use it from here
from aot.weights_dtype import keep_weights_narrow

log = logging.getLogger(__name__)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

WEIGHTS_SUFFIXES = (".safetensors", ".bin")


def load_model(
    plan: ModelPlan, while_weights_load: AbstractContextManager[Any] | None = None, narrow_weights: bool = True
) -> torch.nn.Module:
    """The recipe's eager model, in eval mode, on its device and dtype.

    ``narrow_weights=False`` ignores ``model.weights_dtype`` (every weight widened on load): the
    eager model as users run it, which a benchmark's baseline must be.

    ``while_weights_load`` is entered while a transformers model draws or reads its weights, once
    its class is imported (:func:`aot.process.imports_beside.imports_beside` imports the export stack
    there). A factory is the recipe's own code, and runs alone.
    """
    spec = plan.spec
    device = _available_device(plan)
    torch.manual_seed(spec.seed)
    if spec.factory is not None:
        model = _from_factory(plan)
    else:
        blueprint = model_blueprint(plan)  # checks config, input names and sizes before any weight exists
        with while_weights_load or nullcontext():
            model = _from_config(plan, blueprint) if spec.config is not None else _from_pretrained(plan, blueprint, narrow_weights)
    if spec.weights_dtype is None or not narrow_weights:
        model = model.to(device=device, dtype=getattr(torch, spec.dtype)).eval()
    else:  # loaded in the checkpoint's dtype: widened where used, not here
        keep_weights_narrow(model, getattr(torch, spec.dtype))
        model = model.to(device=device).eval()
    log.info("loaded %s with %d parameters", type(model).__name__, sum(p.numel() for p in model.parameters()))
    if plan.decoder_step:  # the build's model is then the KV-cache step around it
        from aot.decoding.keyword_step import DecoderStep

        try:
            model = DecoderStep(model, last_logits_only=plan.decoder_logits == "last").eval()
        except ValueError as error:
            raise plan.locator.error(("generation", "logits"), str(error)) from None
    return model


def _available_device(plan: ModelPlan) -> torch.device:
    try:
        device = torch.device(plan.spec.device)
    except RuntimeError as error:
        raise plan.locator.error(("model", "device"), f"'{plan.spec.device}' is no torch device: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise plan.locator.error(("model", "device"), f"'{device}' is asked for, but this machine's torch sees no CUDA device")
    return device


def load_tokenizer(source: Located) -> Any:
    """The tokenizer in ``source``'s directory; an error names the recipe key it came from."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source.path), local_files_only=True)
    except (OSError, ValueError) as error:
        raise source.error(f"cannot load its tokenizer: {first_line(error)}") from None


def _from_factory(plan: ModelPlan) -> torch.nn.Module:
    spec = plan.spec
    module_name, _, function_name = spec.factory.partition(":")
    if not function_name:
        raise plan.locator.error(("model", "factory"), f"'{spec.factory}' is not of the form package.module:function")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise plan.locator.error(("model", "factory"), f"cannot import '{spec.factory}': {first_line(error)}") from None
    _check_factory_kwargs(plan, function)
    try:
        model = function(**spec.factory_kwargs)
    except AotError:
        raise
    except Exception as error:  # the factory is the recipe's code: its failure is the recipe's
        raise plan.locator.error(("model", "factory"), f"'{spec.factory}' raised {type(error).__name__}: {first_line(error)}") from None
    if not isinstance(model, torch.nn.Module):
        raise plan.locator.error(("model", "factory"), f"'{spec.factory}' returned {type(model).__name__}, not an nn.Module")
    return model


def _check_factory_kwargs(plan: ModelPlan, function: Callable) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # no signature to check against (a builtin): calling it says what is wrong
    try:
        signature.bind(**plan.spec.factory_kwargs)
    except TypeError as error:
        # Names and defaults only: annotations may be unevaluated strings, and are noise here.
        bare = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        raise plan.locator.error(
            ("model", "factory_kwargs"), f"do not fit {plan.spec.factory}{bare}: {first_line(error)}"
        ) from None


def _attention_kwargs(plan: ModelPlan) -> dict[str, Any]:
    implementation = plan.spec.attn_implementation
    return {"attn_implementation": implementation} if implementation else {}


def _from_config(plan: ModelPlan, blueprint: Blueprint) -> torch.nn.Module:
    cls = blueprint.model_class
    try:
        if hasattr(cls, "from_config"):
            return cls.from_config(blueprint.config, **_attention_kwargs(plan))
        return cls._from_config(blueprint.config, **_attention_kwargs(plan))
    except (ValueError, TypeError) as error:
        raise plan.locator.error(("model", "class"), f"cannot build {cls.__name__} from this config: {first_line(error)}") from None


def _from_pretrained(plan: ModelPlan, blueprint: Blueprint, narrow_weights: bool = True) -> torch.nn.Module:
    directory = plan.pretrained
    weights = sorted(path for path in directory.iterdir() if path.suffix in WEIGHTS_SUFFIXES)
    for path in weights:
        if path.suffix == ".safetensors":
            _check_safetensors(plan, path)
    from transformers.utils import logging as transformers_logging

    # transformers draws a "Loading weights" bar on stderr, which is the error line's (aot's stages report progress).
    transformers_logging.disable_progress_bar()
    try:
        return blueprint.model_class.from_pretrained(str(directory), local_files_only=True, **_dtype_kwargs(plan, narrow_weights),
                                                     **_attention_kwargs(plan))
    except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        # Reading the user's files: a torch checkpoint truncated or not a checkpoint at all, shapes that do not match.
        names = ", ".join(path.name for path in weights) or "no weights file"
        raise plan.locator.error(("model", "pretrained"), f"cannot load {directory} ({names}): {first_line(error)}") from None


def _dtype_kwargs(plan: ModelPlan, narrow_weights: bool) -> dict[str, Any]:
    """The checkpoint's own dtype where the recipe keeps the weights narrow (transformers then maps the file)."""
    weights_dtype = plan.spec.weights_dtype
    return {"dtype": getattr(torch, weights_dtype)} if weights_dtype is not None and narrow_weights else {}


def _check_safetensors(plan: ModelPlan, path: Path) -> None:
    """Reads the header only: a truncated or garbled file fails here, named, rather than inside transformers."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt"):
            pass
    except (SafetensorError, OSError) as error:
        raise plan.locator.error(("model", "pretrained"), f"weights file {path} is corrupt or truncated: {first_line(error)}") from None
