"""Which architectures and classes the coverage table holds.

Two lists of model types, and everything else found from transformers itself:

- ``HF_TRACER_4_53``: the model types transformers 4.53's ``HFTracer`` supported
  (``_REGULAR_SUPPORTED_MODEL_NAMES_AND_TASKS`` in ``transformers/utils/fx.py`` of the
  4.53.0 wheel), with ``HF_TRACER_4_53_SPECIAL``, the classes it special-cased
  (``_SPECIAL_SUPPORTED_MODELS``). transformers 5 removed ``utils/fx.py``, so nothing
  installed here can tell them: they are literal lists, copied from 4.53.0 and never to
  be edited, since issue #15 holds aot to exactly what that release traced.
- ``ALSO_REQUIRED``: the newer architectures issue #15 adds by name.

The classes of an architecture are its base class and every head transformers maps it
to, read from the auto-model mappings (``MODEL_FOR_*_MAPPING_NAMES``), so a head that a
later transformers adds joins the table without an edit here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

HF_TRACER_4_53 = (
    "altclip", "albert", "bart", "bert", "bitnet", "blenderbot", "blenderbot-small", "bloom", "clip",
    "convnext", "deberta", "deberta-v2", "dinov2", "distilbert", "donut-swin", "electra", "gpt2",
    "gpt_neo", "gptj", "hiera", "hubert", "ijepa", "layoutlm", "llama", "cohere", "lxmert", "m2m_100",
    "marian", "mbart", "megatron-bert", "mistral", "mixtral", "mobilebert", "mt5", "nezha", "opt",
    "pegasus", "plbart", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "resnet", "roberta", "segformer",
    "speech_to_text", "speech_to_text_2", "swin", "t5", "trocr", "vit", "vjepa2", "xglm", "wav2vec2",
)

# 4.53's special cases, each with the model type whose row it joins. PeftModelForCausalLM and
# PeftModelForSeq2SeqLM, also on that list, are peft's wrappers around these models, not
# transformers classes: they are left out.
HF_TRACER_4_53_SPECIAL = {
    "CLIPTextModel": "clip",
    "CLIPTextModelWithProjection": "clip",
    "CLIPVisionModel": "clip",
    "CLIPVisionModelWithProjection": "clip",
    "AltCLIPTextModel": "altclip",
    "AltCLIPVisionModel": "altclip",
    "GitVisionModel": "git",
    "GPT2DoubleHeadsModel": "gpt2",
    "Speech2Text2Decoder": "speech_to_text_2",
    "TrOCRDecoder": "trocr",
    "VJEPA2ForVideoClassification": "vjepa2",
}

ALSO_REQUIRED = (
    "gemma", "gemma2", "gemma3_text", "phi", "phi3", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
    "modernbert", "deberta-v2", "electra", "mpnet", "xlm-roberta", "mobilevit", "swin", "segformer", "dinov2",
    "siglip",
)


@dataclass(frozen=True)
class Architecture:
    model_type: str
    classes: tuple[str, ...]  # the base class(es) first, then the heads, then 4.53's special cases
    base_classes: tuple[str, ...]
    in_hf_tracer_4_53: bool
    also_required: bool


def _auto_mappings() -> dict[str, dict]:
    from transformers.models.auto import modeling_auto

    return {
        name: getattr(modeling_auto, name)
        for name in sorted(dir(modeling_auto))
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES")
    }


def _names(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def base_classes(model_type: str) -> tuple[str, ...]:
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return _names(MODEL_MAPPING_NAMES.get(model_type))


def head_classes(model_type: str) -> tuple[str, ...]:
    """Every class an auto mapping gives ``model_type``, the base classes excluded, each once."""
    bases = base_classes(model_type)
    heads: dict[str, None] = {}
    for mapping in _auto_mappings().values():
        for name in _names(mapping.get(model_type)):
            if name not in bases:
                heads[name] = None
    return tuple(heads)


def exists_in_transformers(model_type: str) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return model_type in CONFIG_MAPPING_NAMES


def special_classes(model_type: str) -> tuple[str, ...]:
    return tuple(name for name, owner in HF_TRACER_4_53_SPECIAL.items() if owner == model_type and find_class(owner, name))


def architectures() -> list[Architecture]:
    """The table's rows: 4.53's list, its special cases' own types and ``ALSO_REQUIRED``, as transformers 5 has them."""
    ordered = dict.fromkeys([*HF_TRACER_4_53, *HF_TRACER_4_53_SPECIAL.values(), *ALSO_REQUIRED])
    rows = []
    for model_type in ordered:
        if not exists_in_transformers(model_type):
            continue
        in_list = model_type in HF_TRACER_4_53
        listed = in_list or model_type in ALSO_REQUIRED  # else a type only 4.53's special cases name (git)
        bases = base_classes(model_type) if listed else ()
        heads = head_classes(model_type) if listed else ()
        classes = tuple(dict.fromkeys([*bases, *heads, *special_classes(model_type)]))
        if classes:
            rows.append(Architecture(model_type, classes, bases, in_list, model_type in ALSO_REQUIRED))
    return rows


def gone_in_transformers_5() -> list[str]:
    """What 4.53 supported that transformers 5 no longer has: model types, and special classes."""
    gone = [model_type for model_type in HF_TRACER_4_53 if not exists_in_transformers(model_type)]
    for name, owner in HF_TRACER_4_53_SPECIAL.items():
        if not exists_in_transformers(owner) or find_class(owner, name) is None:
            gone.append(name)
    return gone


def find_class(model_type: str, name: str) -> type | None:
    """``transformers.<name>``, else the class in the model type's own modeling module (TrOCRDecoder is only there)."""
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    cls = getattr(transformers, name, None)
    if isinstance(cls, type):
        return cls
    if not exists_in_transformers(model_type):
        return None
    module_name = model_type_to_module_name(model_type)
    try:
        module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    except ImportError:
        return None
    cls = getattr(module, name, None)
    return cls if isinstance(cls, type) else None
