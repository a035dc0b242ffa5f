"""Dummy inputs per head: labels one per example or one per token, QA positions, ALBERT's narrow inputs_embeds."""

from __future__ import annotations

import pytest
import torch
import transformers

from aot.tracing import symbolic_trace
from aot.tracing.dummy_inputs import make_dummy_inputs
from aot.tracing.outputs import flatten_outputs

BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128)
SHAPES = [(1, 5), (2, 7), (3, 16)]


def _model(cls, config):
    torch.manual_seed(0)
    return cls(config).eval()


CASES = {
    "sequence-classification": (
        transformers.DistilBertForSequenceClassification,
        transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=128, num_labels=3),
        ["input_ids", "attention_mask", "labels"],
        lambda batch, sequence, g: {"labels": torch.randint(0, 3, (batch,), generator=g)},
    ),
    "question-answering": (
        transformers.BertForQuestionAnswering,
        transformers.BertConfig(**BERT),
        ["input_ids", "attention_mask", "start_positions", "end_positions"],
        lambda batch, sequence, g: {
            "start_positions": torch.randint(0, sequence, (batch,), generator=g),
            "end_positions": torch.randint(0, sequence, (batch,), generator=g),
        },
    ),
    "token-classification": (
        transformers.BertForTokenClassification,
        transformers.BertConfig(**BERT, num_labels=5),
        ["input_ids", "attention_mask", "labels"],
        lambda batch, sequence, g: {"labels": torch.randint(0, 5, (batch, sequence), generator=g)},
    ),
}


@pytest.mark.parametrize("cls", [transformers.BertForMultipleChoice, transformers.RobertaForMultipleChoice])
def test_multiple_choice_heads_get_three_dimensional_inputs_and_match_eager(cls):
    config_class = transformers.BertConfig if cls is transformers.BertForMultipleChoice else transformers.RobertaConfig
    model = _model(cls, config_class(**BERT))
    names = ["input_ids", "attention_mask", "labels"]
    dummies = make_dummy_inputs(model, names)
    assert dummies["input_ids"].shape == (2, 2, 16) and dummies["labels"].shape == (2,), {k: v.shape for k, v in dummies.items()}
    assert int(dummies["labels"].max()) < 2, "a label is a choice"
    graph_module = symbolic_trace(model, input_names=names)  # checked at a second shape, (3, 2, 11), as well
    with torch.no_grad():
        for batch, sequence in SHAPES:
            g = torch.Generator().manual_seed(batch + sequence)
            inputs = {"input_ids": torch.randint(2, 128, (batch, 3, sequence), generator=g),
                      "attention_mask": torch.ones(batch, 3, sequence, dtype=torch.int64),
                      "labels": torch.randint(0, 3, (batch,), generator=g)}
            got, want = graph_module(**inputs), model(**inputs)
            torch.testing.assert_close(got["logits"], want.logits)
            torch.testing.assert_close(got["loss"], want.loss)


@pytest.mark.parametrize("case", sorted(CASES))
def test_heads_trace_with_their_own_dummy_labels_and_match_eager(case):
    cls, config, names, labels = CASES[case]
    model = _model(cls, config)
    dummies = make_dummy_inputs(model, names)
    assert set(dummies) == set(names)
    graph_module = symbolic_trace(model, input_names=names)
    with torch.no_grad():
        for batch, sequence in SHAPES:
            g = torch.Generator().manual_seed(batch + sequence)
            inputs = {"input_ids": torch.randint(0, 128, (batch, sequence), generator=g),
                      "attention_mask": torch.ones(batch, sequence, dtype=torch.int64), **labels(batch, sequence, g)}
            got, want = graph_module(**inputs), model(**inputs)
            torch.testing.assert_close(got["loss"], want.loss)


def test_one_label_per_example_for_classifiers_and_one_per_token_for_token_classifiers():
    sequence = make_dummy_inputs(_model(*CASES["sequence-classification"][:2]), ["input_ids", "labels"])
    tokens = make_dummy_inputs(_model(*CASES["token-classification"][:2]), ["input_ids", "labels"])
    assert sequence["labels"].dim() == 1 and sequence["labels"].max() < 3
    assert tokens["labels"].shape == tokens["input_ids"].shape and tokens["labels"].max() < 5


def test_albert_inputs_embeds_have_its_embedding_size():
    config = transformers.AlbertConfig(hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, vocab_size=128)
    model = _model(transformers.AlbertModel, config)
    assert make_dummy_inputs(model, ["inputs_embeds"])["inputs_embeds"].shape[-1] == 16
    graph_module = symbolic_trace(model, input_names=["inputs_embeds"])
    embeds = torch.randn(2, 7, 16)
    with torch.no_grad():
        torch.testing.assert_close(graph_module(inputs_embeds=embeds)["last_hidden_state"], model(inputs_embeds=embeds).last_hidden_state)


@pytest.mark.artifact
def test_a_dual_encoder_gets_images_beside_its_text():
    from aot.tracing.dummy_inputs import default_input_names

    config = transformers.CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, vocab_size=99, max_position_embeddings=64),
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8),
    )
    model = _model(transformers.CLIPModel, config)
    names = default_input_names(model)
    assert names == ["input_ids", "attention_mask", "pixel_values"]
    inputs = make_dummy_inputs(model, names)
    assert inputs["pixel_values"].shape == (2, 3, 32, 32)
    gm = symbolic_trace(model)
    with torch.no_grad():
        assert torch.allclose(gm(**inputs)["logits_per_image"], model(**inputs).logits_per_image, atol=1e-5)


def test_raw_audio_is_long_enough_for_as_many_frames_as_tokens():
    config = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                                         conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_feat_extract_layers=2)
    model = _model(transformers.Wav2Vec2Model, config)
    for sequence in (5, 16):
        inputs = make_dummy_inputs(model, ["input_values"], sequence=sequence)
        with torch.no_grad():
            assert model(**inputs).last_hidden_state.shape[1] == sequence  # not one frame, which specialises a trace


@pytest.mark.artifact
def test_speech2text_features_are_frames_by_features():
    config = transformers.Speech2TextConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                                            decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=99,
                                            input_feat_per_channel=20, conv_channels=16, max_source_positions=64, max_target_positions=64)
    model = _model(transformers.Speech2TextModel, config)
    inputs = make_dummy_inputs(model, ["input_features", "attention_mask", "decoder_input_ids"], sequence=8)
    assert inputs["input_features"].shape == (2, 32, 20)  # (batch, frames: two stride-2 convolutions down to 8, features)
    gm = symbolic_trace(model, ["input_features", "decoder_input_ids"])
    with torch.no_grad():
        given = {k: inputs[k] for k in ("input_features", "decoder_input_ids")}
        assert torch.allclose(gm(**given)["last_hidden_state"], model(**given).last_hidden_state, atol=1e-5)


@pytest.mark.artifact
def test_a_head_that_passes_kwargs_to_its_decoder_traces_without_a_cache():
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=99, max_position_embeddings=64)
    model = _model(transformers.LlamaForQuestionAnswering, config)
    assert "use_cache" not in __import__("inspect").signature(model.forward).parameters and config.use_cache, "precondition"
    gm = symbolic_trace(model)
    assert "traced with config.use_cache=False" in gm.meta["trace_report"]["notes"]
    assert config.use_cache, "the config is as it was"
    inputs = make_dummy_inputs(model, ["input_ids", "attention_mask"], batch=3, sequence=9)
    with torch.no_grad():
        assert torch.allclose(gm(**inputs)["start_logits"], model(**inputs).start_logits, atol=1e-5)


@pytest.mark.artifact
@pytest.mark.parametrize("cls,config_class", [(transformers.BartForSequenceClassification, transformers.BartConfig),
                                              (transformers.MBartForSequenceClassification, transformers.MBartConfig)])
def test_an_encoder_decoder_classifier_gets_one_eos_per_row_and_no_decoder_inputs_and_exports(cls, config_class):
    from aot.tracing import export_trace
    from aot.tracing.dummy_inputs import default_input_names

    config = config_class(vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64, num_labels=3)
    model = _model(cls, config)
    names = default_input_names(model)
    assert names == ["input_ids", "attention_mask"], "the head shifts input_ids into its decoder inputs itself"
    inputs = make_dummy_inputs(model, names, batch=2, sequence=16)
    eos = inputs["input_ids"] == config.eos_token_id
    assert eos.sum(1).tolist() == [1, 1] and eos[:, -1].all(), "one EOS per row, at its end"

    dims = {name: {0: "batch", 1: "sequence"} for name in names}
    graph_module = export_trace(model, inputs, dims)

    for batch, sequence in SHAPES:
        case = make_dummy_inputs(model, names, batch=max(batch, 2), sequence=sequence)
        with torch.no_grad():
            torch.testing.assert_close(graph_module(**case)["logits"], model(**case).logits)


@pytest.mark.artifact
def test_lxmert_gets_region_features_and_boxes_beside_its_text_and_traces():
    from aot.tracing.dummy_inputs import default_input_names

    config = transformers.LxmertConfig(vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37, l_layers=1, x_layers=1,
                                       r_layers=1, visual_feat_dim=16, visual_pos_dim=4, num_qa_labels=3)
    model = _model(transformers.LxmertModel, config)
    names = default_input_names(model)
    assert names[:2] == ["input_ids", "attention_mask"] and names[-2:] == ["visual_feats", "visual_pos"]
    inputs = make_dummy_inputs(model, names, batch=2, sequence=16)
    boxes = inputs["visual_pos"]
    assert inputs["visual_feats"].shape[-1] == 16 and boxes.shape[-1] == 4
    assert bool(((boxes >= 0) & (boxes <= 1)).all() and (boxes[..., 2:] >= boxes[..., :2]).all()), "boxes are (x0, y0, x1, y1) in [0, 1]"

    graph_module = symbolic_trace(model, names)

    for batch, sequence in SHAPES:
        case = make_dummy_inputs(model, names, batch=max(batch, 2), sequence=sequence)
        with torch.no_grad():
            expected, actual = model(**case), graph_module(**case)
        torch.testing.assert_close(actual["pooled_output"], expected.pooled_output)


def test_a_video_model_gets_one_clip_of_its_frames():
    config = transformers.VJEPA2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, mlp_ratio=2, crop_size=32, patch_size=16,
                                       frames_per_clip=4, tubelet_size=2, pred_hidden_size=32, pred_num_hidden_layers=1,
                                       pred_num_attention_heads=4, num_pooler_layers=1, num_labels=3)
    model = _model(transformers.VJEPA2ForVideoClassification, config)
    inputs = make_dummy_inputs(model, ["pixel_values_videos"], batch=2)
    assert inputs["pixel_values_videos"].shape == (2, 4, 3, 32, 32)

    graph_module = symbolic_trace(model, ["pixel_values_videos"])

    case = make_dummy_inputs(model, ["pixel_values_videos"], batch=3)
    with torch.no_grad():
        torch.testing.assert_close(graph_module(**case)["logits"], model(**case).logits)


@pytest.mark.artifact
def test_the_video_base_model_traces_its_predictor_masks_of_data_dependent_size_on_fx():
    config = transformers.VJEPA2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, mlp_ratio=2, crop_size=32, patch_size=16,
                                       frames_per_clip=4, tubelet_size=2, pred_hidden_size=32, pred_num_hidden_layers=1,
                                       pred_num_attention_heads=4)
    model = _model(transformers.VJEPA2Model, config)

    graph_module = symbolic_trace(model, ["pixel_values_videos"])

    unbacked = [node for node in graph_module.graph.nodes
                if isinstance(node.meta.get("val"), torch.Tensor) and any(not isinstance(size, int) for size in node.meta["val"].shape)]
    assert unbacked, "precondition: the predictor's masks have sizes that depend on data"
    for batch in (1, 2, 3):
        case = {"pixel_values_videos": torch.randn(batch, 4, 3, 32, 32)}
        with torch.no_grad():
            expected, actual = flatten_outputs(model(**case)), flatten_outputs(graph_module(**case))
        assert "predictor_output.last_hidden_state" in expected and set(actual) == set(expected)
        for name, value in expected.items():
            torch.testing.assert_close(actual[name], value, msg=name)


def test_a_kv_cache_input_name_points_to_the_flat_cache_step():
    from aot.compat.transformers_cache import cache_argument
    from aot.errors import TraceError

    config = transformers.LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    model = _model(transformers.LlamaForCausalLM, config)
    name = cache_argument(model.forward)  # `cache` from transformers 5.24, `past_key_values` before
    assert name is not None
    with pytest.raises(TraceError, match=rf"input '{name}' of LlamaForCausalLM.*FlatCacheDecoder"):
        symbolic_trace(model, ["input_ids", name])


@pytest.mark.artifact
def test_a_decision_head_gets_its_marked_questions_and_traces_on_both_frontends():
    from transformers.models.jev.configuration_jev import JevConfig
    from transformers.models.jev.modeling_jev import JevForDecision

    from aot.tracing import export_trace
    from aot.tracing.dummy_inputs import default_input_names

    text = transformers.Qwen2Config(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=64)
    model = _model(JevForDecision, JevConfig(text_config=text.to_dict(), hidden_size=32))
    names = default_input_names(model)
    assert names[0] == "input_ids" and set(names[1:]) >= {"marks", "num_options", "question_type_ids"}, names
    inputs = make_dummy_inputs(model, names, batch=2, sequence=16)
    assert inputs["marks"][0].tolist() == [8, 16], "each question's mark, the last at the prompt's end"

    dims = {name: {0: "batch", 1: "sequence" if name in ("input_ids", "attention_mask") else "questions"} for name in names}
    graphs = {"fx": symbolic_trace(model), "export": export_trace(model, inputs, dims)}

    for batch, sequence in SHAPES:
        case = make_dummy_inputs(model, names, batch=max(batch, 2), sequence=sequence)
        with torch.no_grad():
            expected = model(**case)
            assert expected.shape == (4,), "two questions of two options each, scored"
            for frontend, graph_module in graphs.items():
                actual = graph_module(**case)
                torch.testing.assert_close(actual if isinstance(actual, torch.Tensor) else next(iter(actual.values())), expected, msg=frontend)


SEQ2SEQ = dict(vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
               encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64)


@pytest.mark.parametrize("cls, config", [
    (transformers.T5ForConditionalGeneration, transformers.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=1, num_heads=4)),
    (transformers.BartForConditionalGeneration, transformers.BartConfig(**SEQ2SEQ)),
])
def test_sequence_to_sequence_labels_follow_the_decoder_length_and_the_loss_traces(cls, config):
    model = _model(cls, config)
    names = ["input_ids", "attention_mask", "decoder_input_ids", "labels"]
    dummies = make_dummy_inputs(model, names)
    assert dummies["input_ids"].shape[1] != dummies["decoder_input_ids"].shape[1], "the precondition: two lengths"
    assert dummies["labels"].shape == dummies["decoder_input_ids"].shape
    graph_module = symbolic_trace(model, input_names=names)
    with torch.no_grad():
        expected = flatten_outputs(model(**dummies, use_cache=False))  # traced as use_cache=False: no cache object out
        actual = flatten_outputs(graph_module(**dummies))
    assert "loss" in expected and torch.isfinite(expected["loss"])
    torch.testing.assert_close(actual["loss"], expected["loss"])


def test_an_eos_pooling_classifier_gets_decoder_inputs_as_long_as_input_ids():
    config = transformers.BartConfig(**SEQ2SEQ, num_labels=3)
    model = _model(transformers.BartForSequenceClassification, config)
    names = ["input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask"]
    dummies = make_dummy_inputs(model, names)
    assert (dummies["input_ids"] == config.eos_token_id).sum(dim=1).tolist() == [1, 1], "the precondition: one EOS a row"
    assert dummies["decoder_input_ids"].shape == dummies["input_ids"].shape
    graph_module = symbolic_trace(model, input_names=names)
    with torch.no_grad():
        torch.testing.assert_close(graph_module(**dummies)["logits"], model(**dummies).logits)


@pytest.mark.parametrize("image_size", [32, 48])
def test_masked_image_pre_training_draws_noise_for_the_patches_of_the_images_it_is_given(image_size):
    # ViT-MAE's shuffle takes one noise value per patch of pixel_values: both must come from the same image size
    config = transformers.ViTMAEConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                       decoder_hidden_size=32, decoder_num_hidden_layers=1, decoder_num_attention_heads=4,
                                       decoder_intermediate_size=64, image_size=image_size, patch_size=8)
    model = _model(transformers.ViTMAEForPreTraining, config)
    inputs = make_dummy_inputs(model, ["pixel_values", "noise"], batch=2)
    assert tuple(inputs["pixel_values"].shape) == (2, 3, image_size, image_size), "precondition: images of the config's size"
    assert tuple(inputs["noise"].shape) == (2, (image_size // 8) ** 2)
    traced = symbolic_trace(model, input_names=["pixel_values", "noise"])
    with torch.no_grad():
        torch.testing.assert_close(flatten_outputs(traced(**inputs))["logits"], model(**inputs).logits)
