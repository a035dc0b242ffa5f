"""A tiny config for any architecture: its class's defaults, shrunk.

The shrinking goes by the config's own parameter names: 2 layers, width 32 in 4 heads
(head size 8, 2 key-value heads), feed-forward 48 (unlike any other size, so a shape
mixed up with another shows; a multiple of 4 floats, as the grouped GEMMs of mixture-of-
experts layers need 16-byte strides, which the tracing zoo's 37 breaks), vocabulary 99,
64 positions, 32-pixel images in patches of at most 8, windows of 8 tokens. Token ids
the defaults place beyond the vocabulary move to its top. Only parameters the config
class takes are given, so what the class derives from them (Swin's hidden size, the
layer types of a 2-layer Qwen2) follows by itself.

What the names cannot say, mostly the per-stage lists of vision models, is in
``OVERRIDES``, each with its reason. The result is a plain JSON dict of overrides, so
one dict makes both the model the table traces and the recipe it builds.
"""

from __future__ import annotations

import inspect
from typing import Any

LAYERS = 2
WIDTH = 32
NARROW = 16  # embeddings and bottlenecks that models keep narrower than their hidden layers
HEADS = 4
KV_HEADS = 2
HEAD_DIM = WIDTH // HEADS
FEED_FORWARD = 48
VOCAB = 99
POSITIONS = 64
IMAGE = 32
PATCH = 8
WINDOW = 8
EXPERTS = 4
FEW = 10  # LXMERT's answer, object and attribute label counts

_BY_NAME: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers", "pred_num_hidden_layers", "l_layers", "x_layers", "r_layers"), LAYERS),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "word_embed_proj_dim", "pooler_hidden_size",
                     "pooler_output_size", "output_hidden_size", "pred_hidden_size", "projection_dim", "project_dim",
                     "projection_size", "decoder_hidden_size", "classifier_proj_size", "codevector_dim",
                     "proj_codevector_dim", "xvector_output_dim", "conv_channels", "visual_feat_dim"), WIDTH),
    **dict.fromkeys(("embedding_size", "intra_bottleneck_size"), NARROW),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "attention_heads", "pred_num_attention_heads"), HEADS),
    "num_key_value_heads": KV_HEADS,
    **dict.fromkeys(("head_dim", "d_kv", "query_pre_attn_scalar"), HEAD_DIM),
    "rotary_dim": HEAD_DIM // 2,
    **dict.fromkeys(("intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner",
                     "hidden_dim", "moe_intermediate_size", "shared_expert_intermediate_size"), FEED_FORWARD),
    **dict.fromkeys(("vocab_size", "decoder_vocab_size"), VOCAB),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_target_positions", "max_source_positions",
                     "original_max_position_embeddings", "max_2d_position_embeddings"), POSITIONS),
    **dict.fromkeys(("sliding_window", "window_size", "local_attention"), WINDOW),
    **dict.fromkeys(("image_size", "crop_size"), IMAGE),
    **dict.fromkeys(("num_local_experts", "num_experts"), EXPERTS),
    "num_experts_per_tok": 2,
    **dict.fromkeys(("num_qa_labels", "num_object_labels", "num_attr_labels"), FEW),
}

# Per architecture, applied after the names above; a key the config class does not take is an error.
OVERRIDES: dict[str, dict[str, Any]] = {
    # GPT-Neo lists its layers' attention kinds as [[kinds, repeats]]: one global and one local layer.
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # Two layers of Gemma 3's default pattern (five sliding to one full) would all be sliding.
    "gemma3_text": {"layer_types": ["sliding_attention", "full_attention"]},
    # Per-stage lists must agree in length: two stages of one block each (as the tracing zoo's).
    "convnext": {"num_stages": 2, "hidden_sizes": [16, 32], "depths": [1, 1]},
    "resnet": {"hidden_sizes": [16, 32], "depths": [1, 1]},
    # Two stages; 4-pixel patches make 8 x 8 tokens of a 32-pixel image: 2 x 2 windows of 4, then one.
    # The masked-image head upsamples by encoder_stride, the total stride: 4 x 2.
    "swin": {"embed_dim": 16, "depths": [1, 1], "num_heads": [2, 4], "window_size": 4, "patch_size": 4, "encoder_stride": 8},
    "donut-swin": {"embed_dim": 16, "depths": [1, 1], "num_heads": [2, 4], "window_size": 4, "patch_size": 4},
    # Hiera pools queries between stages over masked units: 64 pixels in strides of 4 are 16 x 16
    # tokens, 4 x 4 units of 4 x 4; two poolings between its three stages. (With two stages and one
    # pooling, its pretraining head fails in eager: the decoder's unit shape assumes more poolings.)
    # Its pretraining head's decoder has no default size.
    "hiera": {"image_size": [64, 64], "embed_dim": 16, "depths": [1, 1, 1], "num_heads": [1, 2, 2], "num_query_pool": 2,
              "masked_unit_size": [4, 4], "masked_unit_attention": [True, True, False], "decoder_hidden_size": 32,
              "decoder_depth": 1, "decoder_num_heads": 2},
    # Two encoder blocks, every per-block list cut to two.
    "segformer": {"num_encoder_blocks": 2, "depths": [1, 1], "sr_ratios": [2, 1], "hidden_sizes": [16, 32],
                  "patch_sizes": [7, 3], "strides": [4, 2], "num_attention_heads": [1, 2], "mlp_ratios": [2, 2]},
    # MobileViT's five stages are fixed; it downsamples 32 times, so 64 pixels leave a 2 x 2 map.
    # Its transformer widths must divide by the heads.
    "mobilevit": {"image_size": 64, "hidden_sizes": [16, 24, 32], "neck_hidden_sizes": [8, 8, 16, 16, 24, 24, 48],
                  "aspp_out_channels": 16},
    # The speech encoders' feature extractor: two convolutions (their three lists agree in length),
    # a narrow positional convolution, and a small x-vector head and codebook. The x-vector's TDNN is undilated:
    # with its default dilations (1, 2, 3) it reads 15 frames, more than the table's shortest input (11).
    "wav2vec2": {"conv_dim": [16, 16], "conv_stride": [5, 2], "conv_kernel": [10, 3], "num_conv_pos_embeddings": 16,
                 "num_conv_pos_embedding_groups": 2, "tdnn_dim": [16, 16, 16, 16, 32], "tdnn_dilation": [1, 1, 1, 1, 1],
                 "num_codevectors_per_group": 8},
    "hubert": {"conv_dim": [16, 16], "conv_stride": [5, 2], "conv_kernel": [10, 3], "num_conv_pos_embeddings": 16,
               "num_conv_pos_embedding_groups": 2},
    # T5's checkpoints start the decoder at the pad token (decoder_start_token_id: 0), which transformers 5's
    # T5Config no longer sets itself; the sequence classifier shifts input_ids with it.
    "t5": {"decoder_start_token_id": 0},
    # Four frames in tubelets of two; one layer in the attentive pooler.
    "vjepa2": {"frames_per_clip": 4, "num_pooler_layers": 1},
}


def _kept(config_class: type, key: str, value: Any) -> bool:
    """Whether the config keeps a key its signature does not name (one its checkpoints carry, taken by **kwargs)."""
    return getattr(config_class(**{key: value}), key, _UNSET) == value


_UNSET = object()


def _parameters(config_class: type) -> set[str]:
    return set(inspect.signature(config_class.__init__).parameters) - {"self"}


def shrunk(config_class: type) -> dict[str, Any]:
    """Overrides that make ``config_class``'s defaults tiny (sub-configs, such as CLIP's, as nested dicts)."""
    defaults = config_class().to_dict()
    takes = _parameters(config_class)
    sub_configs = getattr(config_class, "sub_configs", {}) or {}
    overrides: dict[str, Any] = {}
    for key, value in defaults.items():
        if key not in takes:
            continue
        if key in sub_configs and isinstance(value, dict):
            overrides[key] = shrunk(sub_configs[key])
        elif key in _BY_NAME and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            overrides[key] = _BY_NAME[key]
        elif key == "patch_size" and isinstance(value, int):
            overrides[key] = min(value, PATCH)
    if "pad_token_id" in takes and defaults.get("pad_token_id") is None:
        # Sequence classifiers pool the last token that is not padding: without a padding id they refuse batches above 1.
        overrides["pad_token_id"] = 0
    overrides.update(_token_ids_in_vocab({**defaults, **overrides}, takes))
    return overrides


def _token_ids_in_vocab(config: dict[str, Any], takes: set[str]) -> dict[str, int]:
    """Special token ids past the tiny vocabulary, moved to its top (one id each, in order)."""
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int):
        return {}
    keys = [k for k in sorted(takes) if k.endswith("_token_id") and isinstance(config.get(k), int) and config[k] >= vocab]
    beyond = sorted({config[k] for k in keys})
    top = {old: vocab - 1 - index for index, old in enumerate(beyond)}
    return {key: top[config[key]] for key in keys}


def tiny_overrides(model_type: str) -> dict[str, Any]:
    """The overrides of ``model_type``'s config: ``AutoConfig.for_model(model_type, **overrides)`` is tiny."""
    from transformers import AutoConfig

    config_class = type(AutoConfig.for_model(model_type))
    overrides = shrunk(config_class)
    extra = OVERRIDES.get(model_type, {})
    unknown = sorted(key for key in set(extra) - _parameters(config_class) if not _kept(config_class, key, extra[key]))
    if unknown:
        raise KeyError(f"OVERRIDES['{model_type}'] names keys {config_class.__name__} does not take: {', '.join(unknown)}")
    overrides.update(extra)
    return overrides


def model_config(model_type: str, model_class: type | None = None) -> dict[str, Any]:
    """A recipe's ``model.config`` for ``model_class`` (default: the base class) of ``model_type``, tiny.

    A class built from a sub-config (CLIPTextModel from CLIP's text config) gets that
    sub-config's own model type and tiny overrides.
    """
    from transformers import AutoConfig

    overrides = tiny_overrides(model_type)
    config_class = type(AutoConfig.for_model(model_type))
    wanted = getattr(model_class, "config_class", None)
    for key, sub_class in (getattr(config_class, "sub_configs", {}) or {}).items():
        if wanted is not None and sub_class is wanted and wanted is not config_class:
            return {"model_type": wanted.model_type, **overrides.get(key, {})}
    if wanted is not None and wanted is not config_class and "text_config" in (getattr(wanted, "sub_configs", {}) or {}):
        # A head whose config wraps this architecture's as its text model (qwen2's JevForDecision, a JevConfig),
        # as wide as it.
        text = {"model_type": model_type, **overrides}
        width = text.get("hidden_size") or getattr(AutoConfig.for_model(model_type, **overrides), "hidden_size")
        return {"model_type": wanted.model_type, "text_config": text, "hidden_size": width}
    return {"model_type": model_type, **overrides}


def tiny_config(model_type: str, model_class: type | None = None) -> Any:
    """The tiny config ``model_class`` (default: the base class) of ``model_type`` is built from."""
    from transformers import AutoConfig

    spec = model_config(model_type, model_class)
    return AutoConfig.for_model(spec.pop("model_type"), **spec)
