"""The llama.cpp peer's GGUF file: a Llama checkpoint's weights in Q4_0 under llama.cpp's names, read back with gguf."""

from __future__ import annotations

import json

import gguf  # the test extra installs it; llama-cpp-python, which builds llama.cpp from source, it does not
import numpy as np
import pytest
import torch
import transformers

from aot.bench.llama_cpp_peer import write_q4_0_gguf

_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=96, max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
               rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_CONFIG)).to(torch.bfloat16)
    directory = tmp_path_factory.mktemp("llama_checkpoint")
    model.save_pretrained(directory)
    return directory, {name: tensor.float().numpy() for name, tensor in model.state_dict().items()}


@pytest.fixture(scope="module")
def written(checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    write_q4_0_gguf(checkpoint[0], path)
    return gguf.GGUFReader(str(path))


def _dequantized(reader, name: str) -> np.ndarray:
    tensor = reader.get_tensor(next(i for i, t in enumerate(reader.tensors) if t.name == name))
    shape = tuple(int(size) for size in reversed(tensor.shape))  # GGUF lists the fastest-moving dim first
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)


def _field(reader, key: str):
    return reader.get_field(key).contents()


def test_every_matrix_is_q4_0_and_every_norm_float32_under_llama_cpp_names(checkpoint, written):
    _, weights = checkpoint
    assert "lm_head.weight" not in weights or _CONFIG["tie_word_embeddings"], "precondition: a tied output"
    types = {tensor.name: tensor.tensor_type for tensor in written.tensors}
    layer = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
    expected_q4 = {"token_embd.weight"} | {f"blk.{i}.{name}.weight" for i in range(2) for name in layer}
    expected_f32 = {"output_norm.weight", "rope_freqs.weight"} | {f"blk.{i}.{n}.weight" for i in range(2) for n in ("attn_norm", "ffn_norm")}
    assert set(types) == expected_q4 | expected_f32
    assert all(types[name] == gguf.GGMLQuantizationType.Q4_0 for name in expected_q4)
    assert all(types[name] == gguf.GGMLQuantizationType.F32 for name in expected_f32)


def test_weights_read_back_within_q4_0_rounding_with_rotary_rows_interleaved(checkpoint, written):
    _, weights = checkpoint
    for gguf_name, hf_name, heads in [("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", 4),
                                      ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", 2),
                                      ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", None)]:
        original = weights[hf_name]
        read = _dequantized(written, gguf_name)
        if heads:  # llama.cpp's rows pair (x_i, x_i+d/2) of each head: undo it
            read = read.reshape(heads, -1, 2, read.shape[1]).swapaxes(1, 2).reshape(original.shape)
        blocks = np.abs(original).reshape(original.shape[0], -1, 32).max(axis=-1, keepdims=True)
        error = np.abs(read - original).reshape(blocks.shape[0], -1, 32)
        assert error.max() > 0, "precondition: Q4_0 rounds"
        # Q4_0 maps a block's largest magnitude to -8 steps: the other side stops at +7, 1/8 of it short
        assert (error <= blocks / 8 * 1.01).all(), f"{gguf_name}: off by more than Q4_0 rounds"
        assert error.mean() < blocks.mean() / 20, f"{gguf_name}: rows out of place"
    np.testing.assert_array_equal(_dequantized(written, "output_norm.weight"), weights["model.norm.weight"])


def test_hyperparameters_and_llama3_rotary_divisors(checkpoint, written):
    assert _field(written, "general.architecture") == "llama"
    assert _field(written, "llama.block_count") == 2 and _field(written, "llama.attention.head_count_kv") == 2
    assert _field(written, "llama.vocab_size") == 96 and len(_field(written, "tokenizer.ggml.tokens")) == 96
    assert _field(written, "llama.rope.freq_base") == 500000.0
    divisors = _dequantized(written, "rope_freqs.weight")
    assert divisors.shape == (8,) and divisors[0] == 1.0 and divisors[-1] == 32.0, divisors  # high frequencies kept, low ones / factor
    assert json.loads((checkpoint[0] / "config.json").read_text())["rope_parameters"]["rope_type"] == "llama3"


def test_another_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(RuntimeError, match="Llama checkpoints only, not 'gpt2'"):
        write_q4_0_gguf(tmp_path, tmp_path / "model.gguf")
    assert not list(tmp_path.glob("*.gguf*"))
