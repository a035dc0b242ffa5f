"""What a deployment needs beside the artifacts, shipped in the build directory and checked.

A build directory holds, next to ``graph_module/`` and ``model.onnx``, the files a deployment
would otherwise fetch from the model it started from, laid out as transformers' ``save_pretrained``
lays them out (Optimum's ONNX directories do the same), so ``AutoTokenizer.from_pretrained(DIR)``
and ``AutoConfig.from_pretrained(DIR)`` read them:

- ``config.json``: the model's config (labels, special token ids, sizes);
- the tokenizer's files (``tokenizer.json``, ``tokenizer_config.json``, ...) wherever the build
  has a tokenizer: ``validate.accuracy.tokenizer``'s, a decoder's ``generation.tokenizer``, or the pretrained
  directory's (``aot.recipe.tokenizer_source``);
- the processor's (``preprocessor_config.json``) where the pretrained directory has one;
- ``generation_config.json`` for a decoder (``generation.cache``).

The manifest lists and hashes them like every file, and says under ``deployment`` which is which,
and why one is missing (a model built from a config has no tokenizer of its own).

**The shipped tokenizer is the one validated:** loaded alone from the build directory, it must
encode every text the build used (``inputs.texts`` and the gate's data) to exactly the ids the
build's own tokenizer gave. ``aot validate`` repeats the check against the recipe's tokenizer.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aot.errors import ValidationError
from aot.recipe import LoadedRecipe, is_decoder_with_cache, pretrained_directory, tokenizer_source

log = logging.getLogger(__name__)

DEPLOYMENT_KEY = "deployment"
_PROCESSOR_FILES = ("preprocessor_config.json",)


@dataclass
class Deployment:
    """Which of the build directory's files serve a deployment, and why any is missing."""

    config: str | None = None
    tokenizer: list[str] = field(default_factory=list)
    tokenizer_source: str | None = None  # the recipe key it came from: model or validate.accuracy.tokenizer
    processor: list[str] = field(default_factory=list)
    generation_config: str | None = None
    task: str = "encoder"
    missing: dict[str, str] = field(default_factory=dict)
    texts_checked: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def transformers_model(model: Any) -> Any:
    """The transformers model inside the build's model (a decoder step wraps its causal LM), or None."""
    inner = getattr(model, "causal_lm", model)
    return inner if hasattr(getattr(inner, "config", None), "to_json_string") else None


def task_of(loaded: LoadedRecipe, model: Any) -> str:
    """What ``aot run`` prints for this model: ``decoder``, ``classifier``, ``vision`` or ``encoder``."""
    if is_decoder_with_cache(loaded):
        return "decoder"
    inner = transformers_model(model)
    name = type(inner).__name__ if inner is not None else ""
    names = {tensor.name for tensor in loaded.recipe.inputs.tensors}
    if name.endswith(("ForSequenceClassification", "ForImageClassification")):
        return "classifier" if "pixel_values" not in names else "vision"
    return "vision" if "pixel_values" in names else "encoder"


def write_deployment_files(loaded: LoadedRecipe, model: Any, directory: Path) -> Deployment:
    """Write config, tokenizer, processor and generation config into ``directory``; check the tokenizer."""
    deployment = Deployment(task=task_of(loaded, model))
    inner = transformers_model(model)
    if inner is None:
        deployment.missing["config"] = f"{type(model).__name__} is no transformers model: it has no config.json"
    else:
        inner.config.save_pretrained(str(directory))
        deployment.config = "config.json"
        if deployment.task == "decoder":
            generation = getattr(inner, "generation_config", None)
            if generation is not None:
                generation.save_pretrained(str(directory))
                deployment.generation_config = "generation_config.json"
    _write_tokenizer(loaded, directory, deployment, inner)
    _write_processor(loaded, directory, deployment)
    return deployment


def _write_tokenizer(loaded: LoadedRecipe, directory: Path, deployment: Deployment, inner: Any) -> None:
    source = tokenizer_source(loaded)
    if source is None:
        deployment.missing["tokenizer"] = "the model is built from a config and the recipe names no tokenizer"
        return
    from aot.models import load_tokenizer

    directory_of_source, key = source
    tokenizer = load_tokenizer(loaded, directory_of_source, key)
    vocabulary = getattr(inner.config.get_text_config(), "vocab_size", None) if inner is not None else None
    if vocabulary is not None and len(tokenizer) > vocabulary:
        raise loaded.error(key[:-1], f"its tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size {vocabulary}")
    before = {path.name for path in directory.iterdir()}
    tokenizer.save_pretrained(str(directory))
    deployment.tokenizer = sorted(path.name for path in directory.iterdir() if path.name not in before)
    deployment.tokenizer_source = ".".join(map(str, key[:-1]))  # a recipe key: no machine's path
    deployment.texts_checked = check_shipped_tokenizer(loaded, directory, tokenizer)


def _write_processor(loaded: LoadedRecipe, directory: Path, deployment: Deployment) -> None:
    if loaded.recipe.model.pretrained is None:
        return
    source = pretrained_directory(loaded)
    for name in _PROCESSOR_FILES:
        if (source / name).is_file():
            (directory / name).write_bytes((source / name).read_bytes())
            deployment.processor.append(name)


# Checked besides the build's own texts, so that every shipped tokenizer is held to something: cases,
# punctuation, digits, accents, a word split into pieces, and characters outside Latin script.
PROBE_TEXTS = (
    "Hello, world! Ahead-of-time builds make deployments reproducible.",
    "The 3 quick brown foxes jumped over 12.5 lazy dogs; naïve café, résumé.",
    "Tokenization splits uncharacteristically long words into pieces.",
    "日本語のテキストと emoji 🙂 mixed in.",
)


def texts_used(loaded: LoadedRecipe) -> list[str]:
    """Every text the build tokenised (``inputs.texts``, then the accuracy gate's text data), then the probes."""
    texts = list(loaded.recipe.inputs.texts or [])
    accuracy = loaded.recipe.validate_.accuracy
    if accuracy is not None and not accuracy.data.endswith(".safetensors") and accuracy.data != "texts":
        from aot.accuracy import read_texts

        texts += read_texts(loaded, accuracy)
    return list(dict.fromkeys([*texts, *PROBE_TEXTS]))


def check_shipped_tokenizer(loaded: LoadedRecipe, directory: Path, reference: Any) -> int:
    """The tokenizer in ``directory``, loaded alone, encodes every text as ``reference`` does; the count checked.

    A difference is a validation failure (exit 5) naming the text and the first position that differs.
    """
    from transformers import AutoTokenizer

    try:
        shipped = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValidationError(f"{directory}: the shipped tokenizer does not load: {error}") from None
    texts = texts_used(loaded)
    for text in texts:
        expected, actual = reference(text)["input_ids"], shipped(text)["input_ids"]
        if list(expected) != list(actual):
            position = next((i for i, (a, b) in enumerate(zip(expected, actual)) if a != b), min(len(expected), len(actual)))
            raise ValidationError(
                f"{directory}: the shipped tokenizer encodes {text[:60]!r} differently from the build's "
                f"(first at token {position}: {list(actual)[position:position + 1]} where the build has {list(expected)[position:position + 1]})"
            )
    log.info("the shipped tokenizer encodes the build's %d texts as the build did", len(texts))
    return len(texts)
