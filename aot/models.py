"""Build the eager model a recipe names, offline and reproducibly.

Three sources: an inline transformers config (weights from the recipe's
seed), a local pretrained directory, or a ``package.module:function``
factory. The hub is never contacted: this tool runs in release jobs that must
not depend on the network.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from typing import Any

import torch

from aot.recipe import LoadedRecipe, pretrained_directory

log = logging.getLogger(__name__)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def load_model(loaded: LoadedRecipe) -> torch.nn.Module:
    spec = loaded.recipe.model
    torch.manual_seed(spec.seed)
    if spec.factory is not None:
        model = _from_factory(loaded)
    elif spec.config is not None:
        model = _from_config(loaded)
    else:
        model = _from_pretrained(loaded)
    model = model.to(device=_available_device(loaded), dtype=getattr(torch, spec.dtype)).eval()
    log.info("loaded %s with %d parameters", type(model).__name__, sum(p.numel() for p in model.parameters()))
    return model


def _available_device(loaded: LoadedRecipe) -> torch.device:
    try:
        device = torch.device(loaded.recipe.model.device)
    except RuntimeError as error:
        raise loaded.error(("model", "device"), f"'{loaded.recipe.model.device}' is no torch device: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise loaded.error(("model", "device"), f"'{device}' is asked for, but this machine's torch sees no CUDA device")
    return device


def load_tokenizer(loaded: LoadedRecipe) -> Any:
    if loaded.recipe.model.pretrained is None:
        raise loaded.error(("inputs", "texts"), "texts need a pretrained model directory that holds a tokenizer")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(pretrained_directory(loaded)), local_files_only=True)
    except (OSError, ValueError) as error:
        raise loaded.error(("model", "pretrained"), f"cannot load its tokenizer: {_first_line(error)}") from None


def forward_parameters(model: torch.nn.Module) -> list[str]:
    """Named parameters of ``forward`` that an input may bind to (``**kwargs`` excluded)."""
    signature = inspect.signature(model.forward)
    return [
        name
        for name, parameter in signature.parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    ]


def _from_factory(loaded: LoadedRecipe) -> torch.nn.Module:
    spec = loaded.recipe.model
    module_name, _, function_name = spec.factory.partition(":")
    if not function_name:
        raise loaded.error(("model", "factory"), f"'{spec.factory}' is not of the form package.module:function")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise loaded.error(("model", "factory"), f"cannot import '{spec.factory}': {_first_line(error)}") from None
    model = function(**spec.factory_kwargs)
    if not isinstance(model, torch.nn.Module):
        raise loaded.error(("model", "factory"), f"'{spec.factory}' returned {type(model).__name__}, not an nn.Module")
    return model


def _model_class(loaded: LoadedRecipe) -> Any:
    import transformers

    name = loaded.recipe.model.model_class or "AutoModel"
    cls = getattr(transformers, name, None)
    if cls is None:
        raise loaded.error(("model", "class"), f"transformers has no class '{name}'")
    return cls


def _attention_kwargs(loaded: LoadedRecipe) -> dict[str, Any]:
    implementation = loaded.recipe.model.attn_implementation
    return {"attn_implementation": implementation} if implementation else {}


def _from_config(loaded: LoadedRecipe) -> torch.nn.Module:
    from transformers import AutoConfig

    overrides = dict(loaded.recipe.model.config)
    model_type = overrides.pop("model_type")
    try:
        defaults = AutoConfig.for_model(model_type)
    except ValueError:
        raise loaded.error(("model", "config", "model_type"), f"unknown transformers model_type '{model_type}'") from None
    known = set(defaults.to_dict()) | set(getattr(defaults, "attribute_map", {}))
    for key in overrides:
        if key not in known and not hasattr(defaults, key):
            raise loaded.error(("model", "config", key), f"unknown {type(defaults).__name__} key")
    config = AutoConfig.for_model(model_type, **overrides)
    cls = _model_class(loaded)
    try:
        if hasattr(cls, "from_config"):
            return cls.from_config(config, **_attention_kwargs(loaded))
        return cls._from_config(config, **_attention_kwargs(loaded))
    except (ValueError, TypeError) as error:
        raise loaded.error(("model", "class"), f"cannot build {cls.__name__} from this config: {_first_line(error)}") from None


def _from_pretrained(loaded: LoadedRecipe) -> torch.nn.Module:
    cls = _model_class(loaded)
    directory = pretrained_directory(loaded)
    try:
        return cls.from_pretrained(str(directory), local_files_only=True, **_attention_kwargs(loaded))
    except (OSError, ValueError) as error:
        raise loaded.error(("model", "pretrained"), f"cannot load {directory}: {_first_line(error)}") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
