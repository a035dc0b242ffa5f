"""The model test classes transformers 4.x ran its torch.fx test on, at tiny size, for tests/tracing/test_hf_fx_port.py.

transformers 4.x ran ``test_torch_fx`` and ``test_torch_fx_output_loss`` on every model test class with
``fx_compatible = True``: the architectures of ``_SUPPORTED_MODELS`` in its ``src/transformers/utils/fx.py`` (the
4.47-era list, which also names the special classes CLIPTextModel, CLIPVisionModel..., GPT2DoubleHeadsModel,
TrOCRDecoder), and UMT5, whose test sets the flag too. ``ARCHITECTURES`` holds one entry per such test class whose classes transformers 5
still has (``GONE`` lists the rest): its tiny config, its ``all_model_classes``, and the inputs its model tester's
``prepare_config_and_inputs_for_common`` makes, at ``BATCH`` x ``SEQUENCE`` (the tester's 13 x 7, with a smaller batch).

``prepared(...)`` is ``ModelTesterMixin._prepare_for_class(..., return_labels)``: it folds a multiple-choice head's
inputs into ``(batch, choices, ...)``, gives Hiera's pre-training head its ``noise``, and adds the labels of a class
(with the overrides of the test classes that have one: BERT-style pre-training heads, LXMERT, GPT2DoubleHeadsModel).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers as tf

VOCAB = 99
BATCH = 3
SEQUENCE = 7
NUM_CHOICES = 4
TYPE_VOCAB = 16
IMAGE = 30  # ViT, DINOv2 and CLIP's testers: 30-pixel images in 2-pixel patches
AUDIO_SAMPLES = 1024  # wav2vec2's tester: three strided convolutions make 14 frames of it

Inputs = dict[str, Any]


@dataclass(frozen=True)
class Architecture:
    """One of transformers 4.x's fx-compatible model test classes.

    ``config``: a tiny config (seeded models are built from it); ``classes``: the test's ``all_model_classes``;
    ``inputs``: its tester's common inputs, made from the config and a seeded generator; ``skipped``: classes the
    test's own ``_create_and_check_torch_fx_tracing`` override leaves out (T5's sequence classifier).
    """

    config: Callable[[], tf.PretrainedConfig]
    classes: tuple[str, ...]
    inputs: Callable[[tf.PretrainedConfig, torch.Generator], Inputs]
    skipped: tuple[str, ...] = ()


# What the 4.47-era utils/fx.py listed and transformers 5 removed: nothing of theirs is left to trace.
GONE = {"nezha": "removed in transformers 5", "speech_to_text_2": "removed in transformers 5 (Speech2Text2Decoder too)"}


# ---- the testers' random tensors (ids_tensor, random_attention_mask, floats_tensor), seeded ----

def ids(shape, vocab: int, generator: torch.Generator, low: int = 0) -> torch.Tensor:
    return torch.randint(low, vocab, shape, generator=generator)


def random_mask(shape, generator: torch.Generator) -> torch.Tensor:
    """0/1 at random, the last position always 1, so that every row attends somewhere."""
    mask = ids(shape, 2, generator)
    mask[:, -1] = 1
    return mask


def floats(shape, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=generator)


def causal_mask() -> torch.Tensor:
    """The decoder-only testers' mask (Llama's and the models copied from it): ``tril(ones_like(input_ids))``."""
    return torch.tril(torch.ones(BATCH, SEQUENCE, dtype=torch.long))


# ---- inputs, one function per tester family ----

def encoder_inputs(config, generator) -> Inputs:
    """BERT and the encoders tested like it: ids, token types, a random mask."""
    return {"input_ids": ids((BATCH, SEQUENCE), VOCAB, generator),
            "token_type_ids": ids((BATCH, SEQUENCE), TYPE_VOCAB, generator),
            "attention_mask": random_mask((BATCH, SEQUENCE), generator)}


def ids_and_mask(config, generator) -> Inputs:
    return {"input_ids": ids((BATCH, SEQUENCE), VOCAB, generator),
            "attention_mask": random_mask((BATCH, SEQUENCE), generator)}


def ids_and_causal_mask(config, generator) -> Inputs:
    return {"input_ids": ids((BATCH, SEQUENCE), VOCAB, generator), "attention_mask": causal_mask()}


def ids_and_token_types(config, generator) -> Inputs:
    """GPT-2, GPT-Neo, GPT-J: no mask (their head mask is not an fx input)."""
    return {"input_ids": ids((BATCH, SEQUENCE), VOCAB, generator),
            "token_type_ids": ids((BATCH, SEQUENCE), TYPE_VOCAB, generator)}


def ids_only(config, generator) -> Inputs:
    return {"input_ids": ids((BATCH, SEQUENCE), VOCAB, generator)}


def ids_ending_in_eos(config, generator) -> torch.Tensor:
    """Ids past the special tokens, each row ending in one EOS (the BART testers' ``clamp(3)``, then EOS)."""
    tokens = ids((BATCH, SEQUENCE), VOCAB, generator, low=3)
    tokens[:, -1] = config.eos_token_id
    return tokens


def opt_inputs(config, generator) -> Inputs:
    """OPT's tester: EOS-ended ids and ``input_ids.ne(pad)`` as the mask (a bool tensor)."""
    tokens = ids_ending_in_eos(config, generator)
    return {"input_ids": tokens, "attention_mask": tokens.ne(config.pad_token_id)}


def seq2seq_inputs(config, generator) -> Inputs:
    """The BART family's ``prepare_*_inputs_dict``: both masks are ``ids.ne(pad)``, bool tensors."""
    tokens, decoder = ids_ending_in_eos(config, generator), ids((BATCH, SEQUENCE), VOCAB, generator, low=3)
    return {"input_ids": tokens, "decoder_input_ids": decoder, "attention_mask": tokens.ne(config.pad_token_id),
            "decoder_attention_mask": decoder.ne(config.pad_token_id)}


def t5_inputs(config, generator) -> Inputs:
    """T5's tester: random 0/1 masks (``ids_tensor(..., vocab_size=2)``) on both sides."""
    return {"input_ids": ids_ending_in_eos(config, generator), "attention_mask": ids((BATCH, SEQUENCE), 2, generator),
            "decoder_input_ids": ids((BATCH, SEQUENCE), VOCAB, generator),
            "decoder_attention_mask": ids((BATCH, SEQUENCE), 2, generator)}


def speech_to_text_inputs(config, generator) -> Inputs:
    frames = 4 * SEQUENCE  # two stride-2 convolutions: SEQUENCE encoder positions
    features = floats((BATCH, frames, config.input_feat_per_channel), generator)
    decoder = ids((BATCH, SEQUENCE), VOCAB, generator, low=3)
    return {"input_features": features, "decoder_input_ids": decoder,
            "attention_mask": torch.ones(BATCH, frames, dtype=torch.long),
            "decoder_attention_mask": decoder.ne(config.pad_token_id)}


def layoutlm_inputs(config, generator) -> Inputs:
    """BERT's inputs and a box per token, (x0, y0, x1, y1) with x0 <= x1 and y0 <= y1, as the tester orders them."""
    corners = ids((BATCH, SEQUENCE, 2, 2), 1000, generator).sort(dim=-2).values  # [[x0, y0], [x1, y1]] after sorting
    inputs = encoder_inputs(config, generator)
    return {"input_ids": inputs["input_ids"], "bbox": corners.flatten(-2), "token_type_ids": inputs["token_type_ids"],
            "attention_mask": inputs["attention_mask"]}


LXMERT_REGIONS = 10


def lxmert_inputs(config, generator) -> Inputs:
    inputs = encoder_inputs(config, generator)
    return {"input_ids": inputs["input_ids"],
            "visual_feats": floats((BATCH, LXMERT_REGIONS, config.visual_feat_dim), generator),
            "visual_pos": floats((BATCH, LXMERT_REGIONS, config.visual_pos_dim), generator),
            "token_type_ids": ids((BATCH, SEQUENCE), config.type_vocab_size, generator),
            "attention_mask": inputs["attention_mask"]}


def clip_text_inputs(config, generator) -> Inputs:
    """CLIP's text tester: each row's mask is ones up to a random point, zeros after."""
    ends = ids((BATCH,), SEQUENCE, generator, low=1)
    mask = (torch.arange(SEQUENCE) < ends[:, None]).long()
    return {"input_ids": ids((BATCH, SEQUENCE), VOCAB, generator), "attention_mask": mask}


def pixels(size: int, channels: int = 3):
    def make(config, generator) -> Inputs:
        return {"pixel_values": floats((BATCH, channels, size, size), generator)}

    return make


def clip_inputs(config, generator) -> Inputs:
    # The tester also passes return_loss=True, which is not among the fx test's input names.
    return {**clip_text_inputs(config, generator), **pixels(IMAGE)(config, generator), "return_loss": True}


def speech_inputs(config, generator) -> Inputs:
    return {"input_values": floats((BATCH, AUDIO_SAMPLES), generator),
            "attention_mask": random_mask((BATCH, AUDIO_SAMPLES), generator)}


# ---- tiny configs ----

TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)
DECODER = dict(TEXT, num_key_value_heads=2, pad_token_id=0)  # Llama-style; grouped-query attention
SEQ2SEQ = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
               pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
T5 = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
          eos_token_id=1, pad_token_id=0, decoder_start_token_id=0)
VISION = dict(image_size=IMAGE, patch_size=2, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=37)
# Two stages of one block each (the tracing zoo's); Swin's 4-pixel patches make 8 x 8 tokens, windows of 4.
STAGES = dict(hidden_sizes=[16, 32], depths=[1, 1])
SWIN = dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4)
SPEECH = dict(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=20,
              conv_dim=(32, 32, 32), conv_stride=(4, 4, 4), conv_kernel=(8, 8, 8), conv_bias=False,
              num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
# Mixture-of-experts feed-forwards a multiple of 4 wide: grouped GEMMs want 16-byte strides.
MOE = dict(DECODER, intermediate_size=48)

# The KV-cache branch of the fx test (the 4.47-era _FX_SUPPORTED_MODELS_WITH_KV_CACHE) makes its cache with
# num_attention_heads heads, so these two have no grouped-query attention.
KV_CACHE_MODEL_TYPES = ("llama", "opt")


def _config(cls: type, **values) -> Callable[[], tf.PretrainedConfig]:
    return lambda: cls(**values)


def _clip() -> tf.PretrainedConfig:
    text = dict(TEXT, projection_dim=32)
    vision = dict(VISION, projection_dim=32)
    return tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=64)


def _heads(prefix: str, *heads: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{head}" for head in heads)


BERT_HEADS = ("Model", "LMHeadModel", "ForMaskedLM", "ForMultipleChoice", "ForNextSentencePrediction", "ForPreTraining",
              "ForQuestionAnswering", "ForSequenceClassification", "ForTokenClassification")
DECODER_HEADS = ("Model", "ForCausalLM", "ForSequenceClassification", "ForQuestionAnswering", "ForTokenClassification")

ARCHITECTURES: dict[str, Architecture] = {
    # -- encoders --
    "albert": Architecture(
        _config(tf.AlbertConfig, **TEXT, embedding_size=16, type_vocab_size=TYPE_VOCAB),
        _heads("Albert", "Model", "ForPreTraining", "ForMaskedLM", "ForMultipleChoice", "ForSequenceClassification",
               "ForTokenClassification", "ForQuestionAnswering"), encoder_inputs),
    "bert": Architecture(_config(tf.BertConfig, **TEXT, type_vocab_size=TYPE_VOCAB), _heads("Bert", *BERT_HEADS),
                         encoder_inputs),
    # DeBERTa's with its disentangled relative attention on, as its checkpoints have it (the testers leave it off).
    "deberta": Architecture(
        _config(tf.DebertaConfig, **TEXT, type_vocab_size=TYPE_VOCAB, relative_attention=True, pos_att_type=["c2p", "p2c"]),
        _heads("Deberta", "Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
               "ForQuestionAnswering"), encoder_inputs),
    "deberta-v2": Architecture(
        _config(tf.DebertaV2Config, **TEXT, type_vocab_size=TYPE_VOCAB, relative_attention=True,
                pos_att_type=["c2p", "p2c"]),
        _heads("DebertaV2", "Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
               "ForQuestionAnswering", "ForMultipleChoice"), encoder_inputs),
    "distilbert": Architecture(
        _config(tf.DistilBertConfig, vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                max_position_embeddings=64),
        _heads("DistilBert", "Model", "ForMaskedLM", "ForMultipleChoice", "ForQuestionAnswering",
               "ForSequenceClassification", "ForTokenClassification"), ids_and_mask),
    "electra": Architecture(
        _config(tf.ElectraConfig, **TEXT, embedding_size=16, type_vocab_size=TYPE_VOCAB),
        _heads("Electra", "Model", "ForPreTraining", "ForMaskedLM", "ForCausalLM", "ForMultipleChoice",
               "ForTokenClassification", "ForSequenceClassification", "ForQuestionAnswering"), encoder_inputs),
    "layoutlm": Architecture(
        _config(tf.LayoutLMConfig, **TEXT, type_vocab_size=TYPE_VOCAB),
        _heads("LayoutLM", "Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
               "ForQuestionAnswering"), layoutlm_inputs),
    "megatron-bert": Architecture(
        _config(tf.MegatronBertConfig, **TEXT, type_vocab_size=TYPE_VOCAB),
        _heads("MegatronBert", "Model", "ForMaskedLM", "ForCausalLM", "ForMultipleChoice", "ForNextSentencePrediction",
               "ForPreTraining", "ForQuestionAnswering", "ForSequenceClassification", "ForTokenClassification"),
        encoder_inputs),
    "mobilebert": Architecture(
        _config(tf.MobileBertConfig, **dict(TEXT, hidden_size=64), embedding_size=32, intra_bottleneck_size=32,
                type_vocab_size=TYPE_VOCAB),
        _heads("MobileBert", "Model", "ForMaskedLM", "ForMultipleChoice", "ForNextSentencePrediction", "ForPreTraining",
               "ForQuestionAnswering", "ForSequenceClassification", "ForTokenClassification"), encoder_inputs),
    "roberta": Architecture(
        _config(tf.RobertaConfig, **TEXT, type_vocab_size=TYPE_VOCAB, pad_token_id=1),
        _heads("Roberta", "Model", "ForCausalLM", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
               "ForMultipleChoice", "ForQuestionAnswering"), encoder_inputs),
    "lxmert": Architecture(
        _config(tf.LxmertConfig, vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, intermediate_size=37,
                l_layers=2, x_layers=1, r_layers=1, max_position_embeddings=64, type_vocab_size=2, visual_feat_dim=128,
                visual_pos_dim=4, num_qa_labels=30, num_object_labels=16, num_attr_labels=4,
                task_obj_predict=False),  # the tester's common config: no object labels, so no object prediction
        ("LxmertModel", "LxmertForPreTraining", "LxmertForQuestionAnswering"), lxmert_inputs),
    "clip_text": Architecture(_config(tf.CLIPTextConfig, **TEXT, projection_dim=32),
                              ("CLIPTextModel", "CLIPTextModelWithProjection"), clip_text_inputs),
    "altclip_text": Architecture(
        _config(tf.AltCLIPTextConfig, **TEXT, project_dim=32, type_vocab_size=1, pad_token_id=1),
        ("AltCLIPTextModel",), clip_text_inputs),
    # -- decoders --
    "bloom": Architecture(_config(tf.BloomConfig, vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, pad_token_id=3),
                          _heads("Bloom", "Model", "ForCausalLM", "ForSequenceClassification", "ForTokenClassification",
                                 "ForQuestionAnswering"), ids_only),
    "cohere": Architecture(_config(tf.CohereConfig, **DECODER), ("CohereModel", "CohereForCausalLM"), ids_and_causal_mask),
    "glm": Architecture(_config(tf.GlmConfig, **DECODER, head_dim=8),
                        _heads("Glm", "Model", "ForCausalLM", "ForSequenceClassification", "ForTokenClassification"),
                        ids_and_causal_mask),
    "gpt2": Architecture(
        _config(tf.GPT2Config, vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_inner=37, n_positions=64,
                bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 1),
        _heads("GPT2", "Model", "LMHeadModel", "DoubleHeadsModel", "ForQuestionAnswering", "ForSequenceClassification",
               "ForTokenClassification"), ids_and_token_types),
    "gpt_neo": Architecture(
        _config(tf.GPTNeoConfig, vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=37,
                attention_types=[[["global", "local"], 1]], window_size=7, max_position_embeddings=64,
                bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 1),
        _heads("GPTNeo", "Model", "ForCausalLM", "ForQuestionAnswering", "ForSequenceClassification",
               "ForTokenClassification"), ids_and_token_types),
    "gptj": Architecture(
        _config(tf.GPTJConfig, vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=37,
                n_positions=64, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 1),
        _heads("GPTJ", "Model", "ForCausalLM", "ForSequenceClassification", "ForQuestionAnswering"),
        ids_and_token_types),
    "llama": Architecture(_config(tf.LlamaConfig, **dict(DECODER, num_key_value_heads=4)), _heads("Llama", *DECODER_HEADS),
                          ids_and_causal_mask),
    "mistral": Architecture(_config(tf.MistralConfig, **DECODER), _heads("Mistral", *DECODER_HEADS), ids_and_causal_mask),
    "mixtral": Architecture(_config(tf.MixtralConfig, **MOE, num_local_experts=4, num_experts_per_tok=2),
                            _heads("Mixtral", *DECODER_HEADS), ids_and_causal_mask),
    "opt": Architecture(
        _config(tf.OPTConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=37,
                word_embed_proj_dim=32, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2),
        _heads("OPT", "Model", "ForCausalLM", "ForSequenceClassification", "ForQuestionAnswering"), opt_inputs),
    "qwen2": Architecture(_config(tf.Qwen2Config, **DECODER), _heads("Qwen2", *DECODER_HEADS), ids_and_causal_mask),
    "qwen2_moe": Architecture(
        _config(tf.Qwen2MoeConfig, **MOE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
                shared_expert_intermediate_size=36),
        _heads("Qwen2Moe", *DECODER_HEADS), ids_and_causal_mask),
    "trocr": Architecture(
        _config(tf.TrOCRConfig, vocab_size=VOCAB, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                decoder_ffn_dim=37, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2),
        ("TrOCRDecoder", "TrOCRForCausalLM"), ids_and_mask),
    "xglm": Architecture(
        _config(tf.XGLMConfig, vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4, ffn_dim=37,
                max_position_embeddings=64),
        ("XGLMModel", "XGLMForCausalLM"), ids_only),
    # -- encoder-decoders --
    "bart": Architecture(_config(tf.BartConfig, **SEQ2SEQ),
                         _heads("Bart", "Model", "ForConditionalGeneration", "ForSequenceClassification",
                                "ForQuestionAnswering"), seq2seq_inputs),
    "blenderbot": Architecture(_config(tf.BlenderbotConfig, **SEQ2SEQ),
                               ("BlenderbotModel", "BlenderbotForConditionalGeneration"), seq2seq_inputs),
    "blenderbot-small": Architecture(_config(tf.BlenderbotSmallConfig, **SEQ2SEQ),
                                     ("BlenderbotSmallModel", "BlenderbotSmallForConditionalGeneration"), seq2seq_inputs),
    "m2m_100": Architecture(_config(tf.M2M100Config, **SEQ2SEQ), ("M2M100Model", "M2M100ForConditionalGeneration"),
                            seq2seq_inputs),
    "marian": Architecture(_config(tf.MarianConfig, **SEQ2SEQ), ("MarianModel", "MarianMTModel"), seq2seq_inputs),
    "mbart": Architecture(_config(tf.MBartConfig, **SEQ2SEQ),
                          _heads("MBart", "Model", "ForConditionalGeneration", "ForSequenceClassification",
                                 "ForQuestionAnswering"), seq2seq_inputs),
    "pegasus": Architecture(_config(tf.PegasusConfig, **SEQ2SEQ), ("PegasusModel", "PegasusForConditionalGeneration"),
                            seq2seq_inputs),
    "plbart": Architecture(_config(tf.PLBartConfig, **SEQ2SEQ),
                           _heads("PLBart", "Model", "ForConditionalGeneration", "ForSequenceClassification"),
                           seq2seq_inputs),
    # T5's test (and MT5's and UMT5's, copied from it) overrides the fx check only to skip the sequence classifier.
    "t5": Architecture(_config(tf.T5Config, **T5),
                       _heads("T5", "Model", "ForConditionalGeneration", "ForSequenceClassification", "ForQuestionAnswering"),
                       t5_inputs, skipped=("T5ForSequenceClassification",)),
    "mt5": Architecture(_config(tf.MT5Config, **T5),
                        _heads("MT5", "Model", "ForConditionalGeneration", "ForSequenceClassification",
                               "ForQuestionAnswering"), t5_inputs, skipped=("MT5ForSequenceClassification",)),
    "umt5": Architecture(_config(tf.UMT5Config, **T5),
                         _heads("UMT5", "Model", "ForConditionalGeneration", "ForSequenceClassification",
                                "ForQuestionAnswering"), t5_inputs, skipped=("UMT5ForSequenceClassification",)),
    "speech_to_text": Architecture(
        _config(tf.Speech2TextConfig, **dict(SEQ2SEQ, max_source_positions=64, max_target_positions=64),
                input_feat_per_channel=24, num_conv_layers=2, conv_kernel_sizes=(5, 5), conv_channels=32),
        ("Speech2TextModel", "Speech2TextForConditionalGeneration"), speech_to_text_inputs),
    # -- vision --
    "clip_vision": Architecture(_config(tf.CLIPVisionConfig, **VISION, projection_dim=32),
                                ("CLIPVisionModel", "CLIPVisionModelWithProjection"), pixels(IMAGE)),
    "clip": Architecture(_clip, ("CLIPModel",), clip_inputs),
    "convnext": Architecture(_config(tf.ConvNextConfig, num_stages=2, **STAGES, image_size=32),
                             ("ConvNextModel", "ConvNextForImageClassification", "ConvNextBackbone"), pixels(32)),
    "dinov2": Architecture(_config(tf.Dinov2Config, **VISION),
                           ("Dinov2Model", "Dinov2ForImageClassification", "Dinov2Backbone"), pixels(IMAGE)),
    "donut-swin": Architecture(_config(tf.DonutSwinConfig, **SWIN), ("DonutSwinModel", "DonutSwinForImageClassification"),
                               pixels(32)),
    # Two poolings between three stages over 4 x 4 masked units: 64 pixels in strides of 4 (scripts/coverage's sizes).
    "hiera": Architecture(
        _config(tf.HieraConfig, image_size=[64, 64], embed_dim=16, depths=[1, 1, 1], num_heads=[1, 2, 2],
                num_query_pool=2, masked_unit_size=[4, 4], masked_unit_attention=[True, True, False],
                decoder_hidden_size=32, decoder_depth=1, decoder_num_heads=2),
        ("HieraModel", "HieraBackbone", "HieraForImageClassification", "HieraForPreTraining"), pixels(64)),
    "resnet": Architecture(_config(tf.ResNetConfig, embedding_size=16, **STAGES),
                           ("ResNetModel", "ResNetForImageClassification", "ResNetBackbone"), pixels(32)),
    "segformer": Architecture(
        _config(tf.SegformerConfig, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                decoder_hidden_size=32),
        ("SegformerModel", "SegformerForSemanticSegmentation", "SegformerForImageClassification"), pixels(32)),
    "swin": Architecture(_config(tf.SwinConfig, **SWIN, encoder_stride=8),
                         ("SwinModel", "SwinBackbone", "SwinForImageClassification", "SwinForMaskedImageModeling"),
                         pixels(32)),
    "vit": Architecture(_config(tf.ViTConfig, **VISION, encoder_stride=2),
                        ("ViTModel", "ViTForImageClassification", "ViTForMaskedImageModeling"), pixels(IMAGE)),
    # -- audio --
    "hubert": Architecture(_config(tf.HubertConfig, **SPEECH),
                           ("HubertModel", "HubertForCTC", "HubertForSequenceClassification"), speech_inputs),
    "wav2vec2": Architecture(_config(tf.Wav2Vec2Config, **SPEECH),
                             ("Wav2Vec2Model", "Wav2Vec2ForCTC", "Wav2Vec2ForSequenceClassification",
                              "Wav2Vec2ForPreTraining"), speech_inputs),
}


def model_class(architecture: str, name: str) -> type:
    """``transformers.<name>``, else the class in the architecture's modeling module (TrOCRDecoder is only there)."""
    found = getattr(tf, name, None)
    if isinstance(found, type):
        return found
    config_class = type(ARCHITECTURES[architecture].config())
    module = importlib.import_module(config_class.__module__.replace(".configuration_", ".modeling_"))
    return getattr(module, name)


def build(architecture: str, name: str) -> tuple[torch.nn.Module, Inputs]:
    """A seeded ``name`` of ``architecture`` (eval mode), with its tester's common inputs."""
    entry = ARCHITECTURES[architecture]
    config = entry.config()
    # The fx test sets config.return_dict = False, for tuple outputs. transformers 5's heads read their base model's
    # output by attribute, which that breaks in eager ('tuple' object has no attribute 'last_hidden_state'): the config
    # keeps its default, and the outputs' fields are compared in order instead (the tuple return_dict=False made).
    torch.manual_seed(0)
    model = model_class(architecture, name)(config).eval()
    return model, entry.inputs(model.config, torch.Generator().manual_seed(0))


# ---- _prepare_for_class ----

def _mapped(name: str, *heads: str) -> bool:
    """Whether transformers maps class ``name`` under one of ``heads`` (``MODEL_FOR_<head>_MAPPING_NAMES``)."""
    from transformers.models.auto import modeling_auto

    for head in heads:
        for value in getattr(modeling_auto, f"MODEL_FOR_{head}_MAPPING_NAMES", {}).values():
            if name in ((value,) if isinstance(value, str) else value):
                return True
    return False


def is_multiple_choice(name: str) -> bool:
    return _mapped(name, "MULTIPLE_CHOICE")


def is_sequence_classifier(name: str) -> bool:
    return _mapped(name, "SEQUENCE_CLASSIFICATION")


# Pre-training heads whose test overrides _prepare_for_class to add token labels (BERT's and those copied from it);
# the second label each adds (next_sentence_label, sentence_order_label) is not among the fx test's input names.
_TOKEN_LABELLED_PRETRAINING = ("BertForPreTraining", "AlbertForPreTraining", "MegatronBertForPreTraining",
                               "MobileBertForPreTraining", "ElectraForPreTraining", "LxmertForPreTraining")


def prepared(architecture: str, name: str, inputs: Inputs, config, return_labels: bool) -> Inputs:
    """``_prepare_for_class(inputs, class, return_labels)``: choices folded in, Hiera's noise, and the labels."""
    long = dict(dtype=torch.long)
    inputs = dict(inputs)
    if is_multiple_choice(name):
        inputs = {key: value.unsqueeze(1).expand(-1, NUM_CHOICES, -1).contiguous()
                  if isinstance(value, torch.Tensor) and value.ndim > 1 else value for key, value in inputs.items()}
    if name == "HieraForPreTraining":  # one noise value per masked unit, so that the masking is reproducible
        sides = zip(config.image_size, config.patch_stride, config.masked_unit_size)
        units = [size // stride // unit for size, stride, unit in sides]
        inputs["noise"] = floats((BATCH, units[0] * units[1]), torch.Generator().manual_seed(1))
    if not return_labels:
        return inputs
    if architecture == "lxmert":  # LXMERT's own override: one answer per example, token labels for pre-training
        if name == "LxmertForQuestionAnswering":
            inputs["labels"] = torch.zeros(BATCH, **long)
        elif name == "LxmertForPreTraining":
            inputs["labels"] = torch.zeros(BATCH, SEQUENCE, **long)
        return inputs
    if name == "GPT2DoubleHeadsModel":  # GPT-2's override: the choices are folded by hand, with one label per example
        inputs["labels"] = torch.zeros(BATCH, NUM_CHOICES, SEQUENCE, **long)
        inputs["input_ids"] = inputs["token_type_ids"] = inputs["labels"]
        inputs["mc_token_ids"] = torch.zeros(BATCH, NUM_CHOICES, **long)
        inputs["mc_labels"] = torch.zeros(BATCH, **long)
        return inputs
    if name in _TOKEN_LABELLED_PRETRAINING:
        inputs["labels"] = torch.zeros(BATCH, SEQUENCE, **long)
    elif is_multiple_choice(name):
        inputs["labels"] = torch.ones(BATCH, **long)
    elif _mapped(name, "QUESTION_ANSWERING", "DOCUMENT_QUESTION_ANSWERING"):
        inputs["start_positions"] = torch.zeros(BATCH, **long)
        inputs["end_positions"] = torch.zeros(BATCH, **long)
    elif _mapped(name, "SEQUENCE_CLASSIFICATION", "NEXT_SENTENCE_PREDICTION", "IMAGE_CLASSIFICATION",
                 "VIDEO_CLASSIFICATION", "AUDIO_CLASSIFICATION"):
        inputs["labels"] = torch.zeros(BATCH, **long)
    elif _mapped(name, "TOKEN_CLASSIFICATION", "CAUSAL_LM", "CAUSAL_IMAGE_MODELING", "MASKED_LM", "SEQ_TO_SEQ_CAUSAL_LM",
                 "VISION_2_SEQ", "IMAGE_TEXT_TO_TEXT"):
        inputs["labels"] = torch.zeros(BATCH, SEQUENCE, **long)
    elif _mapped(name, "MASKED_IMAGE_MODELING"):
        patches = config.image_size // config.patch_size
        inputs["bool_masked_pos"] = torch.zeros(BATCH, patches**2, **long)
    elif _mapped(name, "SEMANTIC_SEGMENTATION"):
        height, width = inputs["pixel_values"].shape[-2:]
        inputs["labels"] = torch.zeros(BATCH, height, width, **long)
    return inputs
