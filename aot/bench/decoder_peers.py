"""Peers for a decoder build (``aot bench --peers decoder``): what else generates from the same checkpoint.

- ``eager_bf16``: the recipe's causal LM cast to bfloat16 under eager ``generate``: the usual way
  to halve the bytes a decode step reads without any tool;
- ``ort_genai``: onnxruntime-genai's model builder on the recipe's pretrained checkpoint, int4
  for the CPU (``-p int4 -e cpu``: ``MatMulNBits`` with block size 32 and its fast CPU settings,
  ``GroupQueryAttention``), generating through ``onnxruntime_genai``'s own loop. It needs
  ``pip install onnxruntime-genai`` and a recipe with ``model.pretrained``; the model is built
  once into the bench's work directory (the builder's time is not timed);
- ``llama_cpp``: llama.cpp (llama-cpp-python) on a Q4_0 GGUF file of the same checkpoint, written
  once into the bench's work directory (:mod:`aot.bench.llama_cpp_peer`).

Each is stamped as :mod:`aot.bench.generation` stamps every runner: once a step's logits exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


def eager_bf16_generate(causal_lm: torch.nn.Module):
    """Eager ``generate`` on the causal LM in bfloat16."""
    from aot.bench.generation import eager_generate

    return eager_generate(causal_lm.to(torch.bfloat16))


def genai_generate(checkpoint: Path, workdir: Path, threads: int):
    """onnxruntime-genai's int4 CPU model of ``checkpoint`` (built into ``workdir`` once), as a stamped greedy loop."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        raise RuntimeError("onnxruntime-genai is not installed: pip install onnxruntime-genai") from None
    model_dir = workdir / "ort_genai"
    if not (model_dir / "genai_config.json").is_file():
        _build_genai(checkpoint, model_dir, workdir / "ort_genai_cache")
    config_path = model_dir / "genai_config.json"
    config = json.loads(config_path.read_text())
    session = config["model"]["decoder"].setdefault("session_options", {})
    session["intra_op_num_threads"], session["inter_op_num_threads"] = threads, 1
    config_path.write_text(json.dumps(config, indent=2))
    model = og.Model(str(model_dir))

    def generate(input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int, stamp) -> Any:
        if not bool(attention_mask.all()):
            raise ValueError("ort_genai is timed on unpadded prompts")
        length = input_ids.shape[1] + new_tokens
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=length, min_length=length, batch_size=input_ids.shape[0])
        generator = og.Generator(model, params)
        generator.append_tokens(input_ids.to(torch.int32).numpy())  # the prefill: the first token's logits
        stamp()
        for _ in range(new_tokens - 1):
            generator.generate_next_token()  # picks a token, runs the step on it: the next logits
            stamp()
        return generator

    return generate


def _build_genai(checkpoint: Path, out: Path, cache: Path) -> None:
    """``python -m onnxruntime_genai.models.builder -i CHECKPOINT -o OUT -p int4 -e cpu``, its output kept for errors."""
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out),
               "-p", "int4", "-e", "cpu", "-c", str(cache)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "genai_config.json").is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"onnxruntime-genai's builder failed (exit {done.returncode}): {tail[0]}")
