"""What a deployment needs beside the artifacts, shipped in the build directory and checked.

A build directory holds, next to ``graph_module/`` and ``model.onnx``, the files a deployment
would otherwise fetch from the model it started from, laid out as transformers' ``save_pretrained``
lays them out (Optimum's ONNX directories do the same), so ``AutoTokenizer.from_pretrained(DIR)``
and ``AutoConfig.from_pretrained(DIR)`` read them:

- ``config.json``: the model's config (labels, special token ids, sizes);
- the tokenizer's files (``tokenizer.json``, ``tokenizer_config.json``, ...) wherever the build
  has a tokenizer: ``validate.accuracy.tokenizer``'s, a decoder's ``generation.tokenizer``, or the pretrained
  directory's (``LoadedRecipe.tokenizer``, carried by ``DeploymentPlan.tokenizer``);
- the image processor's ``preprocessor_config.json``: the recipe's ``model.image_processor``, else the
  pretrained directory's; loaded alone, it must give ``pixel_values`` of the shape the build takes;
- ``generation_config.json`` for a decoder (``generation.cache``).

The manifest lists and hashes them like every file, and says under ``deployment`` which is which,
and why one is missing (a model built from a config has no tokenizer of its own).

**The shipped tokenizer is the one validated:** loaded alone from the build directory, it must
encode every text the build used (``inputs.texts`` and the gate's data) to exactly the ids the
build's own tokenizer gave. ``aot validate`` repeats the check against the recipe's tokenizer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aot.errors import ValidationError
from aot.recipe.locator import Located
from aot.recipe.plan import DeploymentPlan

log = logging.getLogger(__name__)

DEPLOYMENT_KEY = "deployment"
PROCESSOR_FILE = "preprocessor_config.json"


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


def task_of(plan: DeploymentPlan, model: Any) -> str:
    """What ``aot run`` prints for this model: ``decoder``, ``classifier``, ``vision`` or ``encoder``."""
    if plan.decoder_step:
        return "decoder"
    inner = transformers_model(model)
    name = type(inner).__name__ if inner is not None else ""
    if name.endswith(("ForSequenceClassification", "ForImageClassification")):
        return "vision" if takes_pixels(plan) else "classifier"
    return "vision" if takes_pixels(plan) else "encoder"


def takes_pixels(plan: DeploymentPlan) -> bool:
    """Whether the build's inputs are images (a ``pixel_values`` input)."""
    return plan.pixel_values is not None


def write_deployment_files(plan: DeploymentPlan, model: Any, directory: Path) -> Deployment:
    """Write config, tokenizer, processor and generation config into ``directory``; check the tokenizer."""
    deployment = Deployment(task=task_of(plan, model))
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
    _write_tokenizer(plan, directory, deployment, inner)
    _write_processor(plan, directory, deployment)
    return deployment


def _write_tokenizer(plan: DeploymentPlan, directory: Path, deployment: Deployment, inner: Any) -> None:
    source = plan.tokenizer
    if source is None:
        if deployment.task != "vision":  # a vision model reads pixels: no tokenizer is missing
            deployment.missing["tokenizer"] = "the model is built from a config and the recipe names no tokenizer"
        return
    from aot.models import load_tokenizer

    key = source.key
    tokenizer = load_tokenizer(source)
    if inner is not None:
        check_tokenizer_fits(source, tokenizer, inner.config)
    before = {path.name for path in directory.iterdir()}
    tokenizer.save_pretrained(str(directory))
    deployment.tokenizer = sorted(path.name for path in directory.iterdir() if path.name not in before)
    deployment.tokenizer_source = ".".join(map(str, key[:-1]))  # a recipe key: no machine's path
    deployment.texts_checked = check_shipped_tokenizer(plan, directory, tokenizer)


def check_tokenizer_fits(source: Located, tokenizer: Any, config: Any) -> None:
    """Every id ``tokenizer`` (loaded from ``source``) gives indexes the model's embedding: it has no more tokens than
    ``config``'s text vocab_size (``aot check`` and the build ask the same)."""
    vocabulary = getattr(config.get_text_config(), "vocab_size", None)
    if vocabulary is not None and len(tokenizer) > vocabulary:
        raise source.error(f"its tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size {vocabulary}", source.key[:-1])


def _write_processor(plan: DeploymentPlan, directory: Path, deployment: Deployment) -> None:
    """The recipe's ``model.image_processor``, else the pretrained directory's processor files; checked."""
    if _place_processor(plan, directory):
        deployment.processor.append(PROCESSOR_FILE)
    elif deployment.task == "vision":
        deployment.missing["processor"] = "the model is built from a config and the recipe names no model.image_processor"
    if deployment.processor and takes_pixels(plan):
        check_shipped_processor(plan, directory, _processor_source(plan))


def _place_processor(plan: DeploymentPlan, directory: Path) -> bool:
    """Write the processor the build ships into ``directory`` (:data:`PROCESSOR_FILE`); whether it has one."""
    settings = plan.image_processor
    if settings is not None:
        kind = settings.get("image_processor_type")
        if not isinstance(kind, str):
            raise plan.locator.error(("model", "image_processor"), "needs an `image_processor_type` (e.g. ConvNextImageProcessor)")
        import transformers

        if not isinstance(getattr(transformers, kind, None), type):  # transformers' own error lists every model type
            raise plan.locator.error(("model", "image_processor", "image_processor_type"), f"transformers has no class '{kind}'")
        (directory / PROCESSOR_FILE).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
        return True
    if plan.pretrained is not None and (source := plan.pretrained / PROCESSOR_FILE).is_file():
        (directory / PROCESSOR_FILE).write_bytes(source.read_bytes())
        return True
    return False


def check_deployment_files(plan: DeploymentPlan, config: Any) -> None:
    """What :func:`write_deployment_files` checks of the tokenizer and image processor the build would ship, checked
    without a build (``aot check``): the tokenizer fits the vocabulary of ``config``, and the processor, in a directory
    of its own, turns an image into ``pixel_values`` the build takes."""
    if plan.tokenizer is not None:
        from aot.models import load_tokenizer

        check_tokenizer_fits(plan.tokenizer, load_tokenizer(plan.tokenizer), config)
    if takes_pixels(plan):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="aot-check-") as directory:
            # The build's directory holds config.json beside the processor: a processor config naming no type is read
            # by the model type there, as transformers does.
            config.save_pretrained(directory)
            if _place_processor(plan, Path(directory)):
                check_shipped_processor(plan, Path(directory), _processor_source(plan))


def _processor_source(plan: DeploymentPlan) -> str:
    """What a fault of the processor a build ships is about: the recipe's key, or the pretrained directory's file."""
    if plan.image_processor is not None:
        return f"{plan.locator.where('model', 'image_processor')}: model.image_processor"
    return str(plan.pretrained / PROCESSOR_FILE)


def load_image_processor(directory: Path) -> Any:
    """The image processor shipped in ``directory``, loaded alone (transformers' own backend choice)."""
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(directory), local_files_only=True)


def probe_image() -> Any:
    """A fixed 97x131 RGB image (gradients and a square) that is no size any processor targets."""
    import numpy as np

    rows, columns = np.mgrid[0:97, 0:131]
    image = np.stack([rows * 255 // 96, columns * 255 // 130, (rows + columns) % 256], axis=-1).astype(np.uint8)
    image[30:60, 40:80] = (250, 20, 120)
    return image


def check_shipped_processor(plan: DeploymentPlan, directory: Path, source: str | None = None) -> None:
    """The shipped processor, loaded alone, turns an image into ``pixel_values`` of the shape the build takes.

    A processor that does not load is a recipe error naming ``model.image_processor`` (exit 2); one whose
    pixels the artifacts cannot take is a validation failure (exit 5) naming both shapes and ``source``, where the
    processor came from (by default ``directory``).
    """
    source = source or str(directory)
    try:
        processor = load_image_processor(directory)
        pixels = processor(images=[probe_image()], return_tensors="pt")["pixel_values"]
    except (OSError, ValueError, KeyError, TypeError, ImportError) as error:
        reason = f"the shipped image processor does not run: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
        if plan.image_processor is not None:
            raise plan.locator.error(("model", "image_processor"), reason) from None
        raise ValidationError(f"{source}: {reason}") from None
    tensor = plan.pixel_values
    for axis, (wanted, size) in enumerate(zip(tensor.shape[1:], pixels.shape[1:]), 1):
        if not _admits(plan, wanted, int(size)):
            raise ValidationError(
                f"{source}: the shipped image processor gives pixel_values of shape {list(pixels.shape)}, "
                f"but the build takes {tensor.shape} (axis {axis}: {size})"
            )
    log.info("the shipped image processor gives pixel_values %s", list(pixels.shape))


def _admits(plan: DeploymentPlan, wanted: int | str, size: int) -> bool:
    """Whether an axis declared as ``wanted`` (a size, or a dim's name) takes ``size``."""
    if isinstance(wanted, int):
        return wanted == size
    dim = plan.dims[wanted]
    if not dim.dynamic:
        return dim.size == size
    return (dim.min or 1) <= size <= (dim.max or size)


# Checked besides the build's own texts, so that every shipped tokenizer is held to something: cases,
# punctuation, digits, accents, a word split into pieces, and characters outside Latin script.
PROBE_TEXTS = (
    "Hello, world! Ahead-of-time builds make deployments reproducible.",
    "The 3 quick brown foxes jumped over 12.5 lazy dogs; naïve café, résumé.",
    "Tokenization splits uncharacteristically long words into pieces.",
    "日本語のテキストと emoji 🙂 mixed in.",
)


def texts_used(plan: DeploymentPlan) -> list[str]:
    """Every text the build tokenised (``inputs.texts``, then the accuracy gate's text data), then the probes."""
    texts = list(plan.texts)
    gate = plan.gate
    if gate is not None and gate.data_path is not None and gate.data_path.suffix != ".safetensors":
        from aot.gates.accuracy import read_texts

        texts += read_texts(gate)
    return list(dict.fromkeys([*texts, *PROBE_TEXTS]))


def check_shipped_tokenizer(plan: DeploymentPlan, directory: Path, reference: Any) -> int:
    """The tokenizer in ``directory``, loaded alone, encodes every text as ``reference`` does; the count checked.

    A difference is a validation failure (exit 5) naming the text and the first position that differs.
    """
    from transformers import AutoTokenizer

    try:
        shipped = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValidationError(f"{directory}: the shipped tokenizer does not load: {error}") from None
    texts = texts_used(plan)
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
