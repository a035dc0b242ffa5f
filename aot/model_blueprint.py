"""What a transformers model will be, known before any of its weights exist.

Building BERT-base takes about a minute on a CPU. The mistakes a recipe can
make about its model (an unknown config key, a value the config or the model
cannot take, an input its ``forward`` does not take, a sequence longer than its
position embeddings) show in the config and the class alone, so
:func:`model_blueprint` finds those two and checks them first. A factory model
is known only once it is built: it has no blueprint, and
:func:`check_forward_accepts` runs on the built model instead.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aot.compat.transformers_cache import CACHE_ARGUMENT_NAMES, is_cache_argument
from aot.errors import did_you_mean, first_line
from aot.recipe.plan import ModelPlan
from aot.recipe.ranges import POSITION_LIMIT_KEYS, check_position_limit
from aot.tracing.dummy_inputs import forward_parameters


@dataclass
class Blueprint:
    """A transformers model's config and classes, checked against the recipe."""

    config: Any  # a transformers PretrainedConfig
    model_class: type  # what the recipe asks to build: `model.class`, or AutoModel
    forward_class: type | None  # the class whose forward runs (AutoModel resolved), when transformers can tell


def model_blueprint(plan: ModelPlan) -> Blueprint | None:
    """The config and class of ``model.config`` or ``model.pretrained``, checked; None for a factory."""
    spec = plan.spec
    if spec.factory is not None:
        return None
    config = _inline_config(plan) if spec.config is not None else _pretrained_config(plan)
    model_class = requested_class(plan)
    blueprint = Blueprint(config=config, model_class=model_class, forward_class=_concrete_class(model_class, config))
    if blueprint.forward_class is not None:
        check_forward_accepts(plan, blueprint.forward_class.__name__, forward_parameters(blueprint.forward_class))
    return blueprint


def check_forward_accepts(plan: ModelPlan, owner: str, accepted: list[str]) -> None:
    """Every input the recipe names is a parameter of ``owner``'s forward, whose parameters are ``accepted``.

    With ``generation.cache`` the inputs come from the model, which must take a KV cache.
    """
    if plan.decoder_step:
        if not any(is_cache_argument(name) for name in accepted):
            raise plan.locator.error(("model", "class"), f"generation.cache needs a causal LM that takes a KV cache (e.g. "
                               f"LlamaForCausalLM); {owner}.forward takes neither {' nor '.join(CACHE_ARGUMENT_NAMES)}")
        return
    for index, name in enumerate(plan.input_names):
        if name not in accepted:
            raise plan.locator.error(
                ("inputs", "tensors", index, "name"),
                f"{owner}.forward has no input '{name}' (it takes: {', '.join(accepted)})",
            )
    if not plan.input_names:
        raise plan.locator.error(("inputs",), "name at least one input tensor under inputs.tensors")


def requested_class(plan: ModelPlan) -> type:
    import transformers

    name = plan.spec.model_class or "AutoModel"
    cls = getattr(transformers, name, None)
    if not isinstance(cls, type):
        raise plan.locator.error(("model", "class"), f"transformers has no class '{name}'")
    return cls


def _inline_config(plan: ModelPlan) -> Any:
    from transformers import AutoConfig

    overrides = dict(plan.spec.config)
    model_type = overrides.pop("model_type")
    invalid = _config_rejections()
    try:
        defaults = AutoConfig.for_model(model_type)
    except invalid as error:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        what = f"unknown transformers model_type '{model_type}'" if model_type not in CONFIG_MAPPING else (
            f"transformers cannot make a {model_type} config from its defaults: {first_line(_cause(error))}")
        raise plan.locator.error(("model", "config", "model_type"), what) from None
    known = set(defaults.to_dict()) | set(getattr(defaults, "attribute_map", {}))
    for key, value in overrides.items():
        # A special token id (T5's decoder_start_token_id) is read by the model from its config, though the
        # config class may not declare it: checkpoints carry it, so a recipe may too.
        token_id = key.endswith("_token_id") and (value is None or isinstance(value, int))
        if key not in known and not hasattr(defaults, key) and not token_id:
            raise plan.locator.error(("model", "config", key), f"unknown {type(defaults).__name__} key")
    try:
        with _token_id_warnings_held(overrides):  # _check_vocabulary says it in one line, naming the key
            config = AutoConfig.for_model(model_type, **overrides)
    except invalid as error:
        key = _key_at_fault(model_type, overrides, invalid)
        raise plan.locator.error(("model", "config") + ((key,) if key else ()),
                                 f"not a valid {type(defaults).__name__}: {first_line(_cause(error))}") from None
    _check_activation_names(plan, config, defaults, overrides)
    _check_vocabulary(plan, config, overrides)
    stated = any(key in overrides for key in POSITION_LIMIT_KEYS)
    source = "set in model.config" if stated else f"{type(config).__name__}'s default"
    check_position_limit(list(plan.sequence_demands), config.to_dict(), source, plan.locator)
    return config


def _config_rejections() -> tuple[type[Exception], ...]:
    """What making a transformers config raises for values it cannot take: transformers 5's configs are huggingface_hub
    strict dataclasses, whose field and class checks raise its StrictDataclassError (an Exception only); their
    ``__post_init__`` code fails as plain code does on a value it cannot use (``num_attention_heads: 0`` divides by
    zero, a ``rope_parameters`` without its keys is a KeyError). Caught around the config's construction alone."""
    plain = (ValueError, TypeError, KeyError, AttributeError, ArithmeticError)
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # a huggingface_hub before strict dataclasses
        return plain
    return (*plain, StrictDataclassError)


def _cause(error: Exception) -> Exception:
    """A strict config's error wraps the exception that says what is wrong under a header line: that one."""
    return error.__cause__ if isinstance(error.__cause__, Exception) else error


def _key_at_fault(model_type: str, overrides: dict[str, Any], invalid: tuple[type[Exception], ...]) -> str | None:
    """The one key of ``overrides`` without which the config is valid; None when no single one is (two that disagree).

    The strict dataclass errors name a field or a validator only in their text, and a validator may read several
    fields; leaving each key out in turn finds the one the recipe got wrong whatever the error says.
    """
    from transformers import AutoConfig

    at_fault = []
    for key in overrides:
        try:
            AutoConfig.for_model(model_type, **{other: value for other, value in overrides.items() if other != key})
        except invalid:
            continue
        at_fault.append(key)
    return at_fault[0] if len(at_fault) == 1 else None


_ACTIVATION_KEY = re.compile(r"(^|_)act(_|ivation|$)")  # hidden_act, activation_function, act_fn; not "factor", "exact"


def _check_activation_names(plan: ModelPlan, config: Any, defaults: Any, overrides: dict[str, Any]) -> None:
    """Every activation the config names is one transformers has (``ACT2FN``), which the model looks it up in when built.

    A config does not check them itself. A key holds an activation when its name says so (``_ACTIVATION_KEY``) and its
    default is one of ACT2FN's names: a key whose default is None or another word may hold something else. A key the
    recipe set under another name (``attribute_map``: GPT-2's ``activation_function`` is ``hidden_act``) is named as set.
    """
    from transformers.activations import ACT2FN

    set_as = {canonical: alias for alias, canonical in getattr(type(config), "attribute_map", {}).items() if alias in overrides}
    for key, default in defaults.to_dict().items():
        value = getattr(config, key, None)
        if not _ACTIVATION_KEY.search(key) or not isinstance(default, str) or default not in ACT2FN:
            continue
        if isinstance(value, str) and value not in ACT2FN:  # "" too: the model looks it up as it is
            known = did_you_mean(value, list(ACT2FN)) or f" (it has {', '.join(sorted(ACT2FN))})"
            named = key if key in overrides else set_as.get(key)
            if named is not None:
                raise plan.locator.error(("model", "config", named), f"'{value}' is no activation transformers knows{known}")
            raise plan.locator.error(("model", "config"), f"{key} '{value}', which {type(config).__name__} derives from these "
                                     f"values, is no activation transformers knows{known}")


_TOKEN_ID_WARNING = "must be `None` or an integer within the vocabulary"  # transformers' validate_token_ids


class _TokenIdWarningsDropped(logging.Filter):
    """Drops transformers' warning about the special token ids ``names``."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(f"{name} {_TOKEN_ID_WARNING}" in message for name in self.names)


@contextlib.contextmanager
def _token_id_warnings_held(overrides: dict[str, Any]) -> Iterator[None]:
    """transformers only warns of a special token id outside the vocabulary (checkpoints on the Hub carry such ids, so it
    must load them); an id the recipe sets itself is checked by :func:`_check_vocabulary` instead, as an error, and
    its warning would only repeat it. A default id the recipe's vocabulary leaves out stays a warning."""
    held = logging.getLogger("transformers.configuration_utils")
    dropped = _TokenIdWarningsDropped([key for key in overrides if key.endswith("_token_id")])
    held.addFilter(dropped)
    try:
        yield
    finally:
        held.removeFilter(dropped)


def _check_vocabulary(plan: ModelPlan, config: Any, overrides: dict[str, Any]) -> None:
    """The vocabulary holds at least one token (an embedding of none cannot embed the prompt), and every special token
    id the recipe sets itself (``bos_token_id``, ``pad_token_id``, ...) lies in it. An id from the config class's
    defaults is left as transformers leaves it, with a warning: a tiny test model's vocabulary often leaves GPT-2's
    50256 out, and builds and generates (it never emits that eos)."""
    text = config.get_text_config(decoder=True)
    vocabulary = getattr(text, "vocab_size", None)
    if not isinstance(vocabulary, int) or isinstance(vocabulary, bool):
        return
    if vocabulary < 1:
        key, said = (("vocab_size",), f"{vocabulary}") if "vocab_size" in overrides else ((), f"vocab_size {vocabulary}")
        raise plan.locator.error(("model", "config") + key, f"{said}: a vocabulary holds at least one token")
    for name, value in text.to_dict().items():
        if name not in overrides or not name.endswith("_token_id") or not isinstance(value, int) or isinstance(value, bool):
            continue
        if not 0 <= value < vocabulary:
            raise plan.locator.error(("model", "config", name), f"{value} is outside the vocabulary (vocab_size {vocabulary}: "
                                     f"ids 0..{vocabulary - 1})")


def _pretrained_config(plan: ModelPlan) -> Any:
    # load_recipe has read config.json as JSON and checked its position limit already.
    from transformers import AutoConfig

    directory = plan.pretrained
    try:
        return AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as error:
        raise plan.locator.error(("model", "pretrained"), f"cannot read {directory / 'config.json'}: {first_line(error)}") from None


def _concrete_class(model_class: type, config: Any) -> type | None:
    """The class an Auto class builds for ``config``; ``model_class`` itself when it is no Auto class."""
    mapping = getattr(model_class, "_model_mapping", None)  # transformers' Auto classes (a private attribute)
    if mapping is None:
        return model_class
    try:
        return mapping[type(config)]
    except (KeyError, ValueError, AttributeError):
        return None  # left to the build, which says which configs the Auto class takes

