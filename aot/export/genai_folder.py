"""A decoder build directory as an onnxruntime-genai model folder: ``genai_config.json`` beside ``model.onnx``.

onnxruntime-genai (``og.Model(DIR)``) runs a decoder ONNX model from a folder whose ``genai_config.json`` names
the model file, its inputs and outputs, its sizes and special tokens, and the search defaults; the tokenizer
(``tokenizer.json``, ``tokenizer_config.json``) it reads from the same folder. A decoder build directory has the
rest already (:mod:`aot.bundle`), so the ONNX unit writes this file beside its model (:func:`write_genai_config`),
made from the directory as written:

- ``config.json``: the model type, hidden size, attention heads, context length (``max_position_embeddings``);
- ``generation_config.json``, over ``config.json``: the bos, eos and pad ids, and the search defaults;
- ``model.onnx``: its input and output names, its layers, KV heads and head size, its vocabulary.

onnxruntime_genai is not imported: the file is written whether it is installed or not.

What genai's conventions ask of the model, and how this one meets them. Each is written out in the file, not left
to genai's default, and :attr:`GenaiFolder.note` sums them up in the manifest's ``deployment.genai`` line:

- **names**: Optimum's decoder-with-past names (:mod:`aot.decoding.names`), which are genai's own defaults;
- **the KV cache**: one key and one value a layer, (batch, kv_heads, past_sequence, head_size), the present being
  the past and the step's tokens: genai's default cache, with ``past_present_share_buffer: false``. A shared buffer
  is its GroupQueryAttention layout (a past of ``max_length`` positions, written in place), which these models do
  not take;
- **logits**: ``generation.logits: last`` gives (batch, 1, vocab) with a static 1, which genai reads as pruned logits
  (the last position's); ``all`` gives (batch, sequence, vocab), of which genai takes the last token's that is not
  ``pad_token_id``;
- **padding**: genai finds a batch's padding by ``pad_token_id`` (the generation config's, else the config's, else
  the first eos id, as ``generate`` defaults it) and pads on the right; aot's own loop pads on the left, by mask;
- **position_ids**, when the model takes them: genai counts them from 0 on each prompt's first token, as
  ``generate`` does on an unpadded prompt.

Refused (no file; the line says why):

- no ``model.onnx``, or no ``config.json``, or no ``generation_config.json`` (not built as a decoder:
  ``generation.cache``);
- a model type genai does not run as a plain decoder (:data:`GENAI_DECODER_TYPES`);
- a ``model.onnx`` without a past (no KV cache), with other inputs or outputs than the convention's, or with
  sliding-window layers whose past is kept to the window (``past_window_sequence``): genai's cache grows every
  layer's past by each step's tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aot.decoding.names import PAST_WINDOW_SEQUENCE, input_names, output_names

GENAI_CONFIG = "genai_config.json"
NOTE_KEY = "genai"  # the manifest's deployment section says under this key what was written, or why not

# onnxruntime-genai 0.18's decoder-only language models (its src/models/model_type.h, ModelType::IsLLM), which it
# runs from a genai_config.json and one decoder model, less the types it drives otherwise: gpt2 with one combined
# past_%d tensor a layer (its Gpt_Model), lfm2 with a convolution state beside the cache, and the hybrids that carry a
# recurrent state (granitemoehybrid, qwen3_5_text, qwen3_5_moe_text). The names are config.json's model_type values.
GENAI_DECODER_TYPES = frozenset({
    "chatglm", "ernie4_5", "gemma", "gemma2", "gemma3_text", "gemma4_text", "granite", "internlm2", "llama",
    "mistral", "nemotron", "olmo", "phi", "phi3", "phi3small", "phimoe", "qwen2", "qwen3", "smollm3",
})
_OTHERWISE_DRIVEN = {
    "gpt2": "onnxruntime-genai runs gpt2 with one combined past_%d tensor a layer, and this model takes a key and a value",
}

_PAST_KEY = re.compile(r"past_key_values\.(\d+)\.key")
# generation_config.json's search settings genai takes, with the value each has where the file is silent (genai's
# and transformers' defaults agree on these; top_p's 1.0 is "no nucleus filtering" in both).
_SEARCH_DEFAULTS: dict[str, Any] = {
    "do_sample": False, "num_beams": 1, "num_return_sequences": 1, "temperature": 1.0, "top_k": 50, "top_p": 1.0,
    "repetition_penalty": 1.0, "length_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0,
}


@dataclass(frozen=True)
class GenaiFolder:
    """What a build directory gives onnxruntime-genai: the config to write (None: none), and the manifest's line."""

    config: dict[str, Any] | None
    note: str


class _Refused(Exception):
    """Why the directory is no genai model folder (one line)."""


def genai_folder(directory: Path, model_file: str = "model.onnx") -> GenaiFolder:
    """``genai_config.json``'s content for the decoder build in ``directory``, or why there is none."""
    try:
        config, interface = _made_config(Path(directory), model_file)
    except _Refused as reason:
        return GenaiFolder(None, f"no {GENAI_CONFIG}: {reason}")
    return GenaiFolder(config, _choices(config, interface))


def write_genai_config(directory: Path, model_file: str = "model.onnx") -> GenaiFolder:
    """Write ``genai_config.json`` into ``directory`` where genai can run its decoder; what was decided either way."""
    folder = genai_folder(directory, model_file)
    if folder.config is not None:
        (Path(directory) / GENAI_CONFIG).write_text(json.dumps(folder.config, indent=2) + "\n", encoding="utf-8")
    return folder


def deployment_note(directory: Path) -> str:
    """The manifest's ``deployment.genai`` line for ``directory`` (read again from its files, as the writer read them)."""
    return genai_folder(directory).note


def _made_config(directory: Path, model_file: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config, and what :func:`_interface` read of the model file."""
    model_path = directory / model_file
    if not model_path.is_file():
        raise _Refused(f"no {model_file} (export.onnx)")
    config = _json(directory / "config.json", "the model is no transformers model")
    generation = _json(directory / "generation_config.json", "not built as a decoder with its KV cache (generation.cache)")
    model_type = config.get("model_type")
    if model_type in _OTHERWISE_DRIVEN:
        raise _Refused(_OTHERWISE_DRIVEN[model_type])
    if model_type not in GENAI_DECODER_TYPES:
        raise _Refused(f"model type '{model_type}' is not one onnxruntime-genai runs as a decoder")
    text = config.get("text_config") or config
    interface = _interface(model_path)
    context_length = _context_length(text)
    made = {
        "model": {
            "type": model_type,
            **_token_ids(config, generation),
            "context_length": context_length,
            "vocab_size": interface["vocab_size"] or _required(text, "vocab_size"),
            "decoder": {
                "filename": model_file,
                "session_options": {"provider_options": []},  # none: the CPU
                "hidden_size": _required(text, "hidden_size"),
                "num_attention_heads": _required(text, "num_attention_heads"),
                "num_key_value_heads": interface["kv_heads"],
                "head_size": interface["head_size"],
                "num_hidden_layers": interface["layers"],
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    **({"position_ids": "position_ids"} if interface["position_ids"] else {}),
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": _search(generation, context_length),
    }
    return made, interface


def _json(path: Path, missing: str) -> dict[str, Any]:
    if not path.is_file():
        raise _Refused(f"no {path.name}: {missing}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise _Refused(f"{path.name} is not readable JSON ({error})") from None
    if not isinstance(data, dict):
        raise _Refused(f"{path.name} is no JSON object")
    return data


def _required(text: dict[str, Any], key: str) -> int:
    value = text.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _Refused(f"config.json gives no {key}, which genai_config.json needs")
    return value


def _context_length(text: dict[str, Any]) -> int:
    """The longest sequence the model takes (genai's ``context_length``, and its default ``max_length``)."""
    for key in ("max_position_embeddings", "n_positions", "seq_length"):
        value = text.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise _Refused("config.json gives no max_position_embeddings, genai's context_length")


def _token_ids(config: dict[str, Any], generation: dict[str, Any]) -> dict[str, Any]:
    """bos, eos and pad ids: the generation config's, else the config's; pad defaults to the first eos, as generate's."""
    ids = {key: generation.get(key, config.get(key)) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    eos = ids["eos_token_id"]
    if isinstance(eos, list) and len(eos) == 1:
        eos = ids["eos_token_id"] = eos[0]
    if ids["pad_token_id"] is None and eos is not None:
        ids["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
    if isinstance(ids["bos_token_id"], list):  # genai takes one bos id
        ids["bos_token_id"] = ids["bos_token_id"][0] if ids["bos_token_id"] else None
    return {key: value for key, value in ids.items() if value is not None}


def _search(generation: dict[str, Any], context_length: int) -> dict[str, Any]:
    """genai's search defaults from the generation config; ``max_length`` counts the prompt too, as in both."""
    search = {key: default if generation.get(key) is None else generation[key] for key, default in _SEARCH_DEFAULTS.items()}
    max_length = generation.get("max_length")
    search["max_length"] = min(max_length, context_length) if isinstance(max_length, int) and max_length > 0 else context_length
    if isinstance(generation.get("early_stopping"), bool):  # transformers also allows "never", which genai does not
        search["early_stopping"] = generation["early_stopping"]
    search["past_present_share_buffer"] = False  # see the module docstring: the present is past + new tokens
    return search


def _interface(model_path: Path) -> dict[str, Any]:
    """What genai_config.json says of ``model.onnx``, read from its inputs and outputs (the weights are not loaded)."""
    import onnx

    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception as error:  # a file onnx cannot parse: genai could not either
        raise _Refused(f"{model_path.name} does not parse ({type(error).__name__})") from None
    inputs = {value.name: _shape(value) for value in graph.input}
    outputs = {value.name: _shape(value) for value in graph.output}
    layers = sum(1 for name in inputs if _PAST_KEY.fullmatch(name))
    if not layers:
        raise _Refused(f"{model_path.name} takes no past: a model without its KV cache (generation.cache)")
    position_ids = "position_ids" in inputs
    _check_names(model_path.name, "inputs", input_names(layers, position_ids), list(inputs))
    _check_names(model_path.name, "outputs", output_names(layers), list(outputs))
    windowed = [name for name, shape in inputs.items() if name.startswith("past_key_values.") and shape[2] == PAST_WINDOW_SEQUENCE]
    if windowed:
        raise _Refused(f"{windowed[0]} keeps a sliding window's past ({PAST_WINDOW_SEQUENCE}), and onnxruntime-genai's "
                       "cache grows every layer's past by each step's tokens")
    first = inputs["past_key_values.0.key"]
    if len(first) != 4 or not all(isinstance(size, int) for size in (first[1], first[3])):
        raise _Refused(f"past_key_values.0.key has shape {first}, not (batch, kv_heads, past_sequence, head_size)")
    logits = outputs["logits"]
    return {
        "layers": layers,
        "kv_heads": first[1],
        "head_size": first[3],
        "position_ids": position_ids,
        "vocab_size": logits[2] if len(logits) == 3 and isinstance(logits[2], int) else None,
        "last_logits_only": len(logits) == 3 and logits[1] == 1,
    }


def _shape(value: Any) -> list[int | str]:
    return [dim.dim_value if dim.HasField("dim_value") else dim.dim_param for dim in value.type.tensor_type.shape.dim]


def _check_names(file: str, what: str, expected: list[str], found: list[str]) -> None:
    if sorted(expected) != sorted(found):
        unexpected = [name for name in found if name not in expected]
        missing = [name for name in expected if name not in found]
        raise _Refused(f"{file}'s {what} are not the decoder-with-past convention's (unexpected {unexpected}, missing {missing})")


def _choices(config: dict[str, Any], interface: dict[str, Any]) -> str:
    """The manifest's line for a written config: the file, the model type, and the choices genai's conventions asked."""
    model, search = config["model"], config["search"]
    logits = ("logits of the last position only, which genai reads as pruned" if interface["last_logits_only"]
              else "logits at every position, genai taking the last token's")
    padding = f"pad_token_id {model['pad_token_id']} marks padding, on the right" if "pad_token_id" in model else "no pad_token_id"
    return (f"{GENAI_CONFIG}: an onnxruntime-genai model folder (type {model['type']}; past_present_share_buffer "
            f"{str(search['past_present_share_buffer']).lower()}: each step's present is its past and new tokens; "
            f"{logits}; {padding})")
