"""Example inputs made from a model's config, for tracing when the caller gives none.

Shapes default to batch 2, text length 16, decoder length 8 (``symbolic_trace``
checks the traced graph at a second shape, batch 3 and text length 11), and values
come from a generator seeded with 0, so two runs trace the same thing. The tracer
never specialises on these values; they only give the fake tensors their shapes
and dtypes.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch

from aot.compat.transformers_cache import is_cache_argument
from aot.errors import TraceError

BATCH = 2
SEQUENCE = 16
DECODER_SEQUENCE = 8
DEFAULT_IMAGE_SIZE = 64
NUM_CHOICES = 2  # multiple-choice heads: the choices of an example are an axis of their own
VISUAL_REGIONS = 6  # LXMERT's detected regions per image: a fixed count, not the text's length


def forward_parameters(model: torch.nn.Module | type[torch.nn.Module]) -> list[str]:
    """Parameters of ``forward`` that an input may bind to by name (``*args`` and ``**kwargs`` excluded).

    ``model`` is a module, or a module class (whose unbound ``forward`` also takes ``self``):
    the build checks a recipe's input names against the class before any weight exists.

    The one definition: :mod:`aot.models` re-exports it for the build. It lives here, in the
    lower layer, so that importing :mod:`aot.tracing` pulls in neither the recipe machinery
    nor :mod:`aot.models`' offline defaults for the Hugging Face hub.
    """
    return [parameter.name for parameter in _named_parameters(model)]


def _named_parameters(model: torch.nn.Module | type[torch.nn.Module]) -> list[inspect.Parameter]:
    parameters = list(inspect.signature(model.forward).parameters.values())
    if isinstance(model, type):
        parameters = parameters[1:]  # self
    return [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def default_input_names(model: torch.nn.Module) -> list[str]:
    declared = _named_parameters(model)
    parameters = [p.name for p in declared]
    config = getattr(model, "config", None)
    main = getattr(model, "main_input_name", None) or parameters[0]
    names = [main]
    if main == "input_ids":
        if "attention_mask" in parameters:
            names.append("attention_mask")
        if "token_type_ids" in parameters and getattr(config, "type_vocab_size", 0) > 1:
            names.append("token_type_ids")
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in parameters and not pools_at_eos(model):
        names.append("decoder_input_ids")
    if main == "input_ids" and "pixel_values" in parameters and getattr(config, "vision_config", None) is not None:
        names.append("pixel_values")  # a dual encoder (CLIP, SigLIP): its forward embeds text and images both
    if main == "input_ids" and "visual_feats" in parameters and getattr(config, "visual_feat_dim", None):
        names += ["visual_feats", "visual_pos"]  # LXMERT: region features and boxes beside the text, both required
    # Any other input the forward cannot do without (a decision head's marks and question types).
    names += [p.name for p in declared if p.default is p.empty and p.name not in names]
    return names


def _audio_samples(config, frames: int) -> int:
    """Raw audio samples from which a wav2vec2-style convolutional feature encoder makes ``frames`` frames."""
    kernels = list(getattr(config, "conv_kernel", None) or [10, 3, 3, 3, 3, 2, 2])
    strides = list(getattr(config, "conv_stride", None) or [5, 2, 2, 2, 2, 2, 2])
    receptive_field, hop = 1, 1
    for kernel, stride in zip(kernels, strides):
        receptive_field += (kernel - 1) * hop
        hop *= stride
    return receptive_field + (frames - 1) * hop


def _image_size(config) -> int:
    """The side of the square images made for ``pixel_values``: the vision config's ``image_size``, else a default."""
    size = getattr(_sub_config(config, "vision_config"), "image_size", None) or DEFAULT_IMAGE_SIZE
    return size if isinstance(size, int) else size[0]


def _maskable_units(config) -> int:
    """How many units masked image pre-training draws ``noise`` for, on the images ``pixel_values`` gets (squares of
    :func:`_image_size`, from the same config): Hiera's masked units, else ViT-MAE's patches."""
    sizes = [_image_size(config)] * 2
    vision = _sub_config(config, "vision_config")
    unit = getattr(vision, "masked_unit_size", None)
    if unit is not None:  # Hiera: patch strides, then units of masked_unit_size strides each
        return math.prod(side // stride // cells for side, stride, cells in zip(sizes, vision.patch_stride, unit))
    patch = getattr(vision, "patch_size", 16)
    patches = [patch, patch] if isinstance(patch, int) else list(patch)
    return math.prod(side // step for side, step in zip(sizes, patches))


def _sub_config(config, *names: str):
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None:
            return sub
    return config


# Heads whose labels are one class per example (HFTracer's list, by transformers' own auto mappings). A question-answering
# head takes start and end positions; the one that takes labels instead (LXMERT's) classifies the answer, one per example.
_ONE_LABEL_PER_EXAMPLE = ("SEQUENCE_CLASSIFICATION", "IMAGE_CLASSIFICATION", "AUDIO_CLASSIFICATION", "NEXT_SENTENCE_PREDICTION",
                          "MULTIPLE_CHOICE", "VIDEO_CLASSIFICATION", "QUESTION_ANSWERING")


def _is_head(model: torch.nn.Module, *heads: str) -> bool:
    """Whether ``model``'s class is one transformers maps under one of ``heads`` (e.g. SEQUENCE_CLASSIFICATION)."""
    from transformers.models.auto import modeling_auto

    name = type(model).__name__
    for head in heads:
        mapping = getattr(modeling_auto, f"MODEL_FOR_{head}_MAPPING_NAMES", {})
        if any(name == value or (isinstance(value, tuple) and name in value) for value in mapping.values()):
            return True
    return False


def _labels_one_per_example(model: torch.nn.Module) -> bool:
    return _is_head(model, *_ONE_LABEL_PER_EXAMPLE)


_DECISION_INPUTS = ("marks", "num_options", "question_type_ids")
_DECISION_QUESTIONS = 2


def _decision_input(name: str, config: Any, batch: int, sequence: int, generator: torch.Generator) -> torch.Tensor:
    """One of a decision head's per-question inputs, ``(batch, _DECISION_QUESTIONS)``.

    ``marks``: the 1-based position of the mark that ends each question (the head reads the token
    before it), ascending, the last at the end of the prompt; ``num_options``: two per question,
    which every question type's rows hold; ``question_type_ids``: a type each, among the
    config's ``offsets`` (the first row of each type's options).
    """
    if name == "marks":
        ends = torch.linspace(max(sequence // _DECISION_QUESTIONS, 1), sequence, _DECISION_QUESTIONS).round().long()
        return ends.expand(batch, _DECISION_QUESTIONS).clone()
    if name == "num_options":
        return torch.full((batch, _DECISION_QUESTIONS), 2, dtype=torch.long)
    types = len(getattr(config, "offsets", None) or {0: 0})
    return torch.randint(0, types, (batch, _DECISION_QUESTIONS), generator=generator)


def pools_at_eos(model: torch.nn.Module) -> bool:
    """An encoder-decoder's sequence classifier (BART, mBART, PLBART, T5, MT5): it classifies the decoder state at
    each row's last EOS token of ``input_ids``, and makes its decoder inputs from ``input_ids`` itself, so the
    two lengths agree; every row needs the same number of EOS tokens."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False)) and _is_head(model, "SEQUENCE_CLASSIFICATION")


def _with_one_eos_per_row(ids: torch.Tensor, eos: int, vocab: int) -> torch.Tensor:
    """``ids`` with the EOS token at the end of every row and nowhere else."""
    ids = ids.masked_fill(ids == eos, (eos + 1) % vocab)
    ids[:, -1] = eos
    return ids


def make_dummy_inputs(
    model: torch.nn.Module, input_names: Sequence[str], batch: int = BATCH, sequence: int = SEQUENCE
) -> dict[str, torch.Tensor]:
    """Inputs for ``input_names`` at ``batch`` x ``sequence`` (decoder inputs at half the length); batch >= 2.

    A multiple-choice head takes ``(batch, choices, sequence)`` token inputs and one label, a
    choice, per example: the rows are made for ``batch x choices`` and then folded.
    """
    config = getattr(model, "config", None)
    # An EOS-pooling classifier indexes the decoder's states with input_ids' EOS mask: the two lengths agree.
    decoder_length = sequence if pools_at_eos(model) else DECODER_SEQUENCE * sequence // SEQUENCE or 1
    choices = NUM_CHOICES if _is_head(model, "MULTIPLE_CHOICE") else 1
    examples, batch = batch, batch * choices
    if config is None:
        raise TraceError(f"{type(model).__name__} has no config to make dummy inputs from; pass dummy_inputs")
    generator = torch.Generator().manual_seed(0)
    text = _sub_config(config, "text_config")
    vocab = getattr(text, "vocab_size", None) or 2
    inputs: dict[str, torch.Tensor] = {}
    for name in input_names:
        length = decoder_length if name.startswith("decoder_") else sequence
        if name in ("input_ids", "decoder_input_ids"):
            inputs[name] = torch.randint(0, vocab, (batch, length), generator=generator)
            if name == "input_ids" and pools_at_eos(model) and isinstance(getattr(config, "eos_token_id", None), int):
                inputs[name] = _with_one_eos_per_row(inputs[name], config.eos_token_id, vocab)
        elif name == "labels" and _is_head(model, "SEMANTIC_SEGMENTATION"):  # a class per pixel of the image
            classes = max(getattr(config, "num_labels", 2) or 2, 1)
            size = _image_size(config)
            inputs[name] = torch.randint(0, classes, (batch, size, size), generator=generator)
        elif name == "labels" and _labels_one_per_example(model):
            classes = max(getattr(config, "num_labels", 2) or 2, 1)
            inputs[name] = torch.randint(0, classes, (batch,), generator=generator)
        elif name == "labels":  # language modelling and token classification: one per token
            classes = vocab if not _is_head(model, "TOKEN_CLASSIFICATION") else max(getattr(config, "num_labels", 2) or 2, 1)
            # A sequence-to-sequence LM's labels are the decoder's targets, as long as decoder_input_ids.
            length = decoder_length if getattr(config, "is_encoder_decoder", False) else sequence
            inputs[name] = torch.randint(0, classes, (batch, length), generator=generator)
        elif name in ("start_positions", "end_positions"):  # question answering: a token index per example
            inputs[name] = torch.randint(0, sequence, (batch,), generator=generator)
        elif name in ("attention_mask", "decoder_attention_mask"):
            mask = torch.ones(batch, length, dtype=torch.long)
            mask[1, length - 4:] = 0  # the second row is padded
            inputs[name] = mask
        elif name == "token_type_ids":
            types = max(getattr(text, "type_vocab_size", 1) or 1, 1)
            inputs[name] = torch.randint(0, types, (batch, sequence), generator=generator)
        elif name in ("position_ids", "decoder_position_ids"):
            inputs[name] = torch.arange(length).expand(batch, length).clone()
        elif name == "pixel_values":
            vision = _sub_config(config, "vision_config")
            size = _image_size(config)
            channels = getattr(vision, "num_channels", 3)
            inputs[name] = torch.randn(batch, channels, size, size, generator=generator)
        elif name == "bbox":  # LayoutLM: a box per token, (x0, y0, x1, y1) with x0 <= x1 and y0 <= y1
            limit = getattr(text, "max_2d_position_embeddings", None) or 1024
            corners = torch.randint(0, limit, (batch, sequence, 2, 2), generator=generator)
            inputs[name] = corners.sort(dim=-2).values.flatten(-2)  # [[x0, y0], [x1, y1]], each coordinate sorted
        elif name == "noise":  # masked image pre-training (Hiera, ViT-MAE): the random number that ranks each unit
            inputs[name] = torch.rand(batch, _maskable_units(config), generator=generator)
        elif name == "visual_feats":  # LXMERT: one feature vector per detected region
            inputs[name] = torch.randn(batch, VISUAL_REGIONS, config.visual_feat_dim, generator=generator)
        elif name == "visual_pos":  # and its box, (x0, y0, x1, y1) in [0, 1]
            xs, ys = (torch.rand(batch, VISUAL_REGIONS, 2, generator=generator).sort(dim=-1).values for _ in range(2))
            boxes = torch.stack([xs[..., 0], ys[..., 0], xs[..., 1], ys[..., 1]], dim=-1)
            inputs[name] = boxes[..., : getattr(config, "visual_pos_dim", 4)]
        elif name == "pixel_values_videos":  # V-JEPA 2: (batch, frames, channels, height, width), one clip
            size = getattr(config, "crop_size", None) or getattr(config, "image_size", None) or DEFAULT_IMAGE_SIZE
            frames = getattr(config, "frames_per_clip", None) or 2 * getattr(config, "tubelet_size", 1)
            channels = getattr(config, "in_chans", None) or getattr(config, "num_channels", 3)
            inputs[name] = torch.randn(batch, frames, channels, size, size, generator=generator)
        elif name == "input_features" and getattr(config, "input_feat_per_channel", None):
            # Speech2Text: (batch, frames, features), its convolutions halving the frames each
            features = config.input_feat_per_channel * getattr(config, "input_channels", 1)
            inputs[name] = torch.randn(batch, 2 ** getattr(config, "num_conv_layers", 2) * sequence, features, generator=generator)
        elif name == "input_features":  # Whisper: (batch, mel bins, frames), exactly twice its source positions
            mel_bins = getattr(config, "num_mel_bins", 80)
            frames = 2 * getattr(config, "max_source_positions", 1500)
            inputs[name] = torch.randn(batch, mel_bins, frames, generator=generator)
        elif name == "input_values":  # raw audio whose feature encoder makes `sequence` frames (not one: see shape_check)
            inputs[name] = torch.randn(batch, _audio_samples(config, sequence), generator=generator)
        elif name in ("inputs_embeds", "decoder_inputs_embeds", "encoder_hidden_states"):
            # ALBERT's embeddings are narrower than its hidden layers: inputs_embeds has embedding_size.
            width = "embedding_size" if name != "encoder_hidden_states" and getattr(text, "embedding_size", None) else "hidden_size"
            hidden = getattr(text, width, None) or getattr(text, "d_model")
            inputs[name] = torch.randn(batch, length, hidden, generator=generator)
        elif name in _DECISION_INPUTS:  # a decision head (JevForDecision) scores the questions marked in row 0's prompt
            inputs[name] = _decision_input(name, config, batch, sequence, generator)
        elif is_cache_argument(name):
            raise TraceError(
                f"input '{name}' of {type(model).__name__}: a KV cache is an object, not a tensor a graph can take; "
                "trace the flat cache step instead (aot.decoding.FlatCacheDecoder(model), or a recipe's `generation: {cache: true}`)"
            )
        else:
            raise TraceError(f"cannot make a dummy value for input '{name}' of {type(model).__name__}; pass dummy_inputs")
    if choices > 1:
        for name, value in inputs.items():
            folded = torch.randint(0, choices, (examples,), generator=generator) if name == "labels" else value.view(examples, choices, *value.shape[1:])
            inputs[name] = folded
    return inputs
