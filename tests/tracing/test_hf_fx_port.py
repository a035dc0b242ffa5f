"""transformers' own torch.fx tests, ported onto aot's tracer: ``test_torch_fx`` and ``test_torch_fx_output_loss``.

Ported from ``ModelTesterMixin._create_and_check_torch_fx_tracing`` in transformers' tests/test_modeling_common.py of the
4.4x line (the 4.47-era file: Hiera's ``noise``, the KV-cache branch for ``_FX_SUPPORTED_MODELS_WITH_KV_CACHE``), with
the pickle round trip of its earlier releases and of T5's override of the same era. For every class of a test class with
``fx_compatible = True`` (tests/tracing/hf_fx_models.py), and for each input set the check makes:

1. the input names: the tester's inputs among a fixed list (encoder-decoders: the encoder and decoder ids, masks,
   features or values; others: ids, masks, token types, boxes, pixels, features, values, embeddings, visual features,
   Hiera's noise), plus ``labels`` / ``start_positions`` / ``end_positions`` where ``output_loss`` made them;
2. the input sets: the tester's inputs; for Llama and OPT also an empty ``past_key_values`` cache on the first set and
   a second set with a cache of 9 past tokens (its mask widened to match); for a decoder or encoder whose forward takes
   both ``input_ids`` and ``inputs_embeds``, a last set with random ``inputs_embeds`` in place of the ids;
3. sequence classifiers get ``problem_type = "single_label_classification"``, and ``config.use_cache`` is whether a
   cache is an input (encoder-decoders: off);
4. ``symbolic_trace(model, names)``; every tensor of the traced outputs, flattened in order, equals eager's;
5. the GraphModule survives ``pickle`` and its outputs still equal eager's.

Departures, each deliberate:

- models keep their seeded default initialisation, not transformers' ``_config_zero_init`` (weights of 1e-10 make every
  output close to zero, which any graph would match), so the absolute tolerance is 1e-6, not 1e-8 (see
  ``_assert_outputs_match``);
- ``config.return_dict`` keeps its default (transformers 5's heads break in eager without it); a ``ModelOutput`` is
  flattened as its ``to_tuple()``, the tuple ``return_dict=False`` returned;
- an input a class's forward no longer takes in transformers 5 is left out of its names (``_input_names``);
- each call gets its own copy of the inputs (the model updates a cache input in place); a cache is traced on the test's
  own inputs, since aot makes no dummy cache;
- the number of outputs must agree too;
- the check goes on past GPT2DoubleHeadsModel's folded ids, which have no embeddings variant, where transformers skipped
  the rest of the test;
- tests transformers skipped run here: Bloom's with labels ("Bloom currently has issues"), and wav2vec2's and HuBERT's
  ("torch 2.1 breaks torch fx tests for wav2vec2/hubert": torch refuses to pickle their weight_norm convolution, which
  aot's GraphModule holds in a form that pickles, :mod:`aot.tracing.parametrized_leaves`).
"""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Mapping

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES

from aot.tracing import symbolic_trace
from aot.tracing.dummy_inputs import forward_parameters
from aot.tracing.input_names import forward_keyword
from tests.tracing.hf_fx_models import (
    ARCHITECTURES,
    BATCH,
    GONE,
    KV_CACHE_MODEL_TYPES,
    build,
    floats,
    is_sequence_classifier,
    model_class,
    prepared,
)

ENCODER_DECODER_INPUTS = ("attention_mask", "decoder_attention_mask", "decoder_input_ids", "input_features", "input_ids",
                          "input_values")
OTHER_INPUTS = ("attention_mask", "bbox", "input_features", "input_ids", "input_values", "inputs_embeds", "pixel_values",
                "pixel_values_videos", "token_type_ids", "visual_feats", "visual_pos", "noise")
LOSS_INPUTS = ("labels", "start_positions", "end_positions")
PAST = 9  # tokens in the non-empty cache

# The 4.47-era utils/fx.py: _REGULAR_SUPPORTED_MODEL_NAMES_AND_TASKS (its model types) and the model types of
# _SPECIAL_SUPPORTED_MODELS' classes; UMT5's test class set fx_compatible too.
HF_FX_MODEL_TYPES = (
    "altclip", "albert", "bart", "bert", "blenderbot", "blenderbot-small", "bloom", "clip", "convnext", "deberta",
    "deberta-v2", "dinov2", "distilbert", "donut-swin", "electra", "glm", "gpt2", "gpt_neo", "gptj", "hiera", "hubert",
    "layoutlm", "llama", "cohere", "lxmert", "m2m_100", "marian", "mbart", "megatron-bert", "mistral", "mixtral",
    "mobilebert", "mt5", "nezha", "opt", "pegasus", "plbart", "qwen2", "qwen2_moe", "resnet", "roberta", "segformer",
    "speech_to_text", "speech_to_text_2", "swin", "t5", "trocr", "vit", "xglm", "wav2vec2", "umt5",
)

# The fast tier's share, a few seconds: an encoder-decoder with labels, a decoder with its embeddings variant and a vision
# model, two small classes each (tests/tracing/test_parametrized_leaves.py pickles a weight_norm leaf, wav2vec2's case). The other cases, up to 30 traces each (6 to 16 minutes together on 2 shared cores), are
# a zoo: they run with tests/tracing/test_fx_zoo.py's, in the full tier.
FAST = (("marian", True), ("xglm", False), ("clip_vision", False))


def _cases():
    for name in ARCHITECTURES:
        for output_loss in (False, True):
            marks = [] if (name, output_loss) in FAST else [pytest.mark.full]
            yield pytest.param(name, output_loss, marks=marks, id=f"{name}-{'output_loss' if output_loss else 'plain'}")


def test_the_registry_is_transformers_4_fx_list_less_what_transformers_5_removed():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    # CLIP's and AltCLIP's text and vision tests build from their sub-configs (clip_text_model...): CLIP's model type
    model_types = {type(entry.config()).model_type.removesuffix("_text_model").removesuffix("_vision_model")
                   for entry in ARCHITECTURES.values()}
    assert set(GONE) <= set(HF_FX_MODEL_TYPES) and not set(GONE) & set(CONFIG_MAPPING_NAMES), "precondition: gone in 5"
    assert model_types == set(HF_FX_MODEL_TYPES) - set(GONE), sorted(model_types ^ (set(HF_FX_MODEL_TYPES) - set(GONE)))
    assert all(set(entry.skipped) < set(entry.classes) for entry in ARCHITECTURES.values())
    assert {name for name, _ in FAST} < set(ARCHITECTURES)


def _input_names(model, inputs: dict, output_loss: bool) -> list[str]:
    """The fx test's input names for ``model``: the tester's inputs among its list, in the tester's order.

    An input the class's forward no longer takes in transformers 5 (GPT-J's sequence classifier's token_type_ids) is
    left out: aot refuses a name that binds to no parameter, where transformers 4's forward still took it.
    """
    if model.config.is_encoder_decoder:
        wanted = [*ENCODER_DECODER_INPUTS, *(["labels"] if "labels" in inputs else [])]
    else:
        wanted = [*OTHER_INPUTS, *(name for name in LOSS_INPUTS if name in inputs)]
        if model.config.model_type in KV_CACHE_MODEL_TYPES:
            wanted.append("past_key_values")
    if not output_loss:
        assert not set(LOSS_INPUTS) & set(inputs), "precondition: no labels without output_loss"
    parameters = forward_parameters(model)
    return [name for name in inputs if name in wanted and forward_keyword(name, parameters) is not None]


def _cache(config, past: int) -> DynamicCache:
    """A cache of ``past`` random tokens a layer, ``num_attention_heads`` heads of ``hidden_size / heads``."""
    cache = DynamicCache(config=config)
    heads = config.num_attention_heads
    shape = (BATCH, heads, past, config.hidden_size // heads)
    generator = torch.Generator().manual_seed(past)
    for layer in range(config.num_hidden_layers if past else 0):
        cache.update(floats(shape, generator), floats(shape, generator), layer)
    return cache


def _input_sets(model, inputs: dict) -> list[dict]:
    """The tester's inputs, then the cache and embeddings variants the fx test adds (decoders and encoders only)."""
    sets = [inputs]
    config = model.config
    if config.is_encoder_decoder:
        return sets
    if config.model_type in KV_CACHE_MODEL_TYPES:
        with_past = dict(inputs, past_key_values=_cache(config, PAST))
        past_mask = torch.ones(BATCH, PAST, dtype=torch.float)  # a float mask, as transformers' test makes it
        with_past["attention_mask"] = torch.cat((past_mask, inputs["attention_mask"]), dim=1)
        inputs["past_key_values"] = _cache(config, 0)
        sets.append(with_past)
    parameters = inspect.signature(model.forward).parameters
    if "input_ids" in parameters and "inputs_embeds" in parameters:
        embedding_size = config.hidden_size
        if getattr(config, "embedding_size", None) is not None and config.model_type != "megatron-bert":
            embedding_size = config.embedding_size
        ids = inputs["input_ids"]
        multiple_choice = MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES.get(config.model_type) == type(model).__name__
        if multiple_choice or ids.ndim == 2:  # GPT2DoubleHeadsModel's folded ids (3 dims) have no variant
            embeds = dict(inputs)
            del embeds["input_ids"]
            embeds["inputs_embeds"] = floats((*ids.shape, embedding_size), torch.Generator().manual_seed(2))
            sets.append(embeds)
    return sets


def _flat_tensors(output) -> list[torch.Tensor]:
    """The tensors of an output, depth first; anything else (a cache, None) is left out, as transformers does.

    A ModelOutput (eager) or dict (the graph) stands for the tuple of its fields in order, what ``return_dict=False``
    returned: its ``to_tuple()``.
    """
    flat = []
    for item in output.values() if isinstance(output, Mapping) else output:
        if isinstance(item, (tuple, list)):
            flat += _flat_tensors(item)
        elif isinstance(item, Mapping):
            flat += _flat_tensors(item)
        elif isinstance(item, torch.Tensor):
            flat.append(item)
    return flat


def _assert_outputs_match(expected: list[torch.Tensor], actual, what: str) -> None:
    actual = _flat_tensors(actual)
    assert len(actual) == len(expected), f"{what}: {len(actual)} tensors, eager {len(expected)}"
    for index, (value, reference) in enumerate(zip(actual, expected)):
        # torch.allclose's rtol, as transformers' test compares; its atol (1e-8) suits outputs of 1e-10 weights, these
        # have seeded ones, whose float rounding in a reordered sum (aot's batched MoE experts) reaches 2e-8.
        torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}, output {index}: {m}")


def _check(architecture: str, class_name: str, output_loss: bool) -> list[list[str]]:
    """The fx test for one class; returns the input names of each input set it traced."""
    model, common = build(architecture, class_name)
    inputs = prepared(architecture, class_name, common, model.config, return_labels=output_loss)
    if model.config.is_encoder_decoder:
        model.config.use_cache = False
    sets = _input_sets(model, inputs)
    parameters = forward_parameters(model)
    traced_names = []
    for number, input_set in enumerate(sets):
        names = _input_names(model, input_set, output_loss)
        filtered = {name: input_set[name] for name in names}
        what = f"{class_name}, input set {number} ({', '.join(names)})"
        if is_sequence_classifier(class_name) and getattr(model.config, "problem_type", None) is None:
            model.config.problem_type = "single_label_classification"
        model.config.use_cache = "past_key_values" in names

        # Traced on the dummy inputs aot makes, as transformers' symbolic_trace made its own, so the graph is checked at
        # the tester's shapes, not the traced ones; a cache, which aot makes no dummy of, is traced on the test's own.
        dummies = copy.deepcopy(filtered) if "past_key_values" in names else None
        graph_module = symbolic_trace(model, names, dummy_inputs=dummies)
        placeholders = [node.target for node in graph_module.graph.nodes if node.op == "placeholder"]
        assert placeholders == names, f"{what}: placeholders {placeholders}"  # precondition: traced on these inputs
        with torch.no_grad():
            traced = graph_module(**copy.deepcopy(filtered))
            # The model is called under its forward's own spelling of each input (`cache` for `past_key_values`).
            eager = model(**{forward_keyword(name, parameters): value for name, value in copy.deepcopy(filtered).items()})
        expected = _flat_tensors(eager)
        assert expected, f"{what}: eager returned no tensor"  # precondition: something to compare
        _assert_outputs_match(expected, traced, f"{what}, traced")

        restored = pickle.loads(pickle.dumps(graph_module))
        with torch.no_grad():
            _assert_outputs_match(expected, restored(**copy.deepcopy(filtered)), f"{what}, after pickling")
        traced_names.append(names)
    return traced_names


@pytest.mark.parametrize(("architecture", "output_loss"), list(_cases()))
def test_torch_fx(architecture, output_loss):
    entry = ARCHITECTURES[architecture]
    classes = [name for name in entry.classes if name not in entry.skipped]
    # precondition: every class the test names is still a transformers model
    assert classes and all(issubclass(model_class(architecture, name), PreTrainedModel) for name in classes), classes
    traced = {name: _check(architecture, name, output_loss) for name in classes}
    labelled = [name for name, sets in traced.items() if set(LOSS_INPUTS) & set(sets[0])]
    assert bool(labelled) <= output_loss, labelled  # labels only where output_loss asked for them


# The inputs aot could not make a dummy of, or made in the wrong shape, before this port (aot/tracing/dummy_inputs.py),
# with the shape each should have at batch 2.
DUMMY_CASES = [
    ("layoutlm", "LayoutLMModel", "bbox", (2, 16, 4)),  # a box per token
    ("hiera", "HieraForPreTraining", "noise", (2, 16)),  # (64 / 4 / 4)^2 masked units
    ("lxmert", "LxmertForQuestionAnswering", "labels", (2,)),  # one answer per example
    ("segformer", "SegformerForSemanticSegmentation", "labels", (2, 64, 64)),  # a class per pixel
]


@pytest.mark.parametrize(("architecture", "class_name", "name", "shape"), DUMMY_CASES,
                         ids=[f"{name}-{class_name}" for _, class_name, name, _ in DUMMY_CASES])
def test_aot_makes_the_dummy_inputs_these_tests_need(architecture, class_name, name, shape):
    from aot.tracing.dummy_inputs import make_dummy_inputs

    model, _ = build(architecture, class_name)
    assert name in forward_parameters(model)  # precondition: the forward takes it
    value = make_dummy_inputs(model, [name], batch=2)[name]
    assert tuple(value.shape) == shape, value.shape
    if name == "bbox":
        x0, y0, x1, y1 = value.unbind(-1)
        assert bool((x0 <= x1).all() and (y0 <= y1).all()) and int(value.max()) < model.config.max_2d_position_embeddings
    if name == "labels":
        assert value.dtype == torch.long and int(value.max()) < model.config.num_labels
