"""Load a recipe file into typed objects, with errors that name file, line and key.

The YAML is read within fixed limits and composed into nodes first
(:mod:`aot.recipe.reader`), so that every key and list item keeps the line it
came from; pydantic's error locations are then mapped back onto those lines.
Sizes are checked against each other (:mod:`aot.recipe.ranges`), and pass
names and pass options against the registry, here, at load time, so a recipe
never fails half-way through a build for a reason that was visible in the file.
"""

from __future__ import annotations

import hashlib
import json
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pydantic

from aot.errors import RecipeError, did_you_mean, first_line
from aot.recipe.locator import Located, RecipeLocator
from aot.recipe.overrides import apply_overrides
from aot.recipe.ranges import check_cuda_graph_buckets, check_position_limit, check_validation_shapes, recipe_sequence_demands
from aot.recipe.reader import Location, parse_recipe_yaml, read_recipe_text
from aot.recipe.schema import FidelitySpec, PassSpec, Recipe, ToggleSection


def recipe_sha256(text: str) -> str:
    """The digest a manifest records for a recipe: of its text as read (UTF-8, universal newlines)."""
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class LoadedRecipe:
    """A parsed recipe plus what is needed to point at its lines.

    ``text`` and ``sha256`` are the file's; ``recipe`` is the file with its ``overrides`` (``--set``) applied.

    What a build needs from it is resolved once (paths, the tokenizer's source) and taken
    apart into the sections each stage takes by :func:`aot.recipe.plan.plan_build`: no stage takes this.
    """

    path: Path
    recipe: Recipe
    passes: list[PassSpec]
    text: str
    lines: dict[Location, int] = field(repr=False)
    graph_module_passes: list[PassSpec] = field(default_factory=list)
    overrides: tuple[str, ...] = ()  # the --set KEY=VALUE applied, as given, in order
    overridden: dict[Location, str] = field(default_factory=dict, repr=False)  # where each value a --set gave is

    @property
    def name(self) -> str:
        return self.recipe.name or self.path.stem

    @property
    def sha256(self) -> str:
        return recipe_sha256(self.text)

    @cached_property
    def locator(self) -> RecipeLocator:
        return RecipeLocator(self.path, self.lines, self.overridden)

    def where(self, *location: str | int) -> str:
        """``file:line`` of the deepest part of ``location`` the file spells out."""
        return self.locator.where(*location)

    def error(self, location: Location, message: str) -> RecipeError:
        return self.locator.error(location, message)

    def resolved(self) -> dict[str, Any]:
        """The recipe with every default filled in, as JSON-ready data."""
        data = self.recipe.model_dump(mode="json", by_alias=True)
        data["name"] = self.name
        data["passes"] = [spec.model_dump(mode="json") for spec in self.passes]
        data["export"]["graph_module"]["passes"] = [spec.model_dump(mode="json") for spec in self.graph_module_passes]
        return data

    @cached_property
    def pretrained_directory(self) -> Path | None:
        """``model.pretrained``, resolved (under ``model.package`` when given); None for a model from config or factory."""
        model = self.recipe.model
        if model.pretrained is None:
            return None
        return _resolved_directory(self, model.pretrained, model.package, ("model", "package"))

    @cached_property
    def tokenizer(self) -> Located | None:
        """The directory whose tokenizer encodes text, and the recipe key that names it: the accuracy gate's own,
        else a decoder's (``generation.tokenizer``), else the pretrained model's; None if none."""
        accuracy, generation = self.recipe.validate_.accuracy, self.recipe.generation
        for source, prefix in ((accuracy.tokenizer if accuracy is not None else None, ("validate", "accuracy", "tokenizer")),
                               (generation.tokenizer if generation is not None else None, ("generation", "tokenizer"))):
            if source is not None:
                directory = _resolved_directory(self, source.pretrained, source.package, prefix + ("package",))
                return Located(directory, prefix + ("pretrained",), self.locator)
        directory = self.pretrained_directory
        if directory is None:
            return None
        reads_pixels = any(tensor.name == "pixel_values" for tensor in self.recipe.inputs.tensors)
        if reads_pixels and not any((directory / name).is_file() for name in _TOKENIZER_FILES):
            return None  # an image model's checkpoint (ViT's, ResNet's) ships no tokenizer, and needs none
        return Located(directory, ("model", "pretrained"), self.locator)

    @cached_property
    def accuracy_data_path(self) -> Path | None:
        """The accuracy gate's data file, relative to the recipe file; None without one (no gate, or ``texts``)."""
        accuracy = self.recipe.validate_.accuracy
        if accuracy is None or accuracy.data == "texts":
            return None
        return (self.path.parent / accuracy.data).resolve()

    @cached_property
    def calibration_texts_path(self) -> Path | None:
        """``generation.calibration``'s texts file, relative to the recipe file; None without it."""
        generation = self.recipe.generation
        if generation is None or generation.calibration is None:
            return None
        return (self.path.parent / generation.calibration.texts).resolve()

    @cached_property
    def fidelity_prompts_path(self) -> Path | None:
        """The fidelity gate's prompts file, relative to the recipe file; None without the gate."""
        fidelity = fidelity_gate(self)
        return (self.path.parent / fidelity.prompts).resolve() if fidelity is not None else None


# What a tokenizer saved by transformers leaves in its directory (save_pretrained writes both; one is enough to load).
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> LoadedRecipe:
    """The recipe at ``path``, with ``overrides`` (``"model.config.num_hidden_layers=2"``, as ``--set`` takes them:
    :mod:`aot.recipe.overrides`) applied to its data before any check; the file is only read."""
    path = Path(path)
    if isinstance(overrides, str):
        raise TypeError("overrides is a sequence of 'KEY=VALUE' strings, not one string")
    if isinstance(overrides, Mapping):  # iterating it would give its keys alone
        raise TypeError(f"overrides is a sequence of 'KEY=VALUE' strings, not a mapping: "
                        f"{[f'{key}={value}' for key, value in overrides.items()]}?")
    overrides = tuple(overrides)
    text = read_recipe_text(path)
    data, lines = parse_recipe_yaml(path, text)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}:1: a recipe is a YAML mapping with at least a `model` key")
    data, overridden = apply_overrides(data, overrides)
    locator = RecipeLocator(path, lines, overridden)
    try:
        recipe = Recipe.model_validate(data)
    except pydantic.ValidationError as error:
        raise _pydantic_error(locator, error, rename={"validate_": "validate"}, model=Recipe) from None
    loaded = LoadedRecipe(path=path, recipe=recipe, passes=[], text=text, lines=lines, overrides=overrides, overridden=overridden)
    inputs = recipe.inputs
    check_validation_shapes(inputs.dims, recipe.validate_.shapes, loaded.locator)
    check_cuda_graph_buckets(recipe.export.graph_module.cuda_graphs, inputs.dims, is_decoder_with_cache(loaded), loaded.locator)
    # The pass registry imports torch (seconds): everything above is reported without it.
    loaded.passes = _resolve_passes(loaded, loaded.recipe.passes, ("passes",))
    loaded.graph_module_passes = _resolve_passes(
        loaded, loaded.recipe.export.graph_module.passes, ("export", "graph_module", "passes")
    )
    _check_files(loaded)
    _check_calibration(loaded)
    _check_accuracy_gate(loaded)
    _check_generation(loaded)
    return loaded


def is_decoder_with_cache(loaded: LoadedRecipe) -> bool:
    """Whether the recipe builds a decoder's KV-cache step (``generation.cache``)."""
    return loaded.recipe.generation is not None and loaded.recipe.generation.cache


def fidelity_gate(loaded: LoadedRecipe) -> FidelitySpec | None:
    """The recipe's ``generation.fidelity`` (a decoder's gate), or None."""
    generation = loaded.recipe.generation
    return generation.fidelity if generation is not None else None


def fidelity_target(loaded: LoadedRecipe) -> dict[str, float]:
    """The thresholds of the recipe's fidelity gate a pass may keep while it chooses (by the names its scores use)."""
    gate = fidelity_gate(loaded)
    if gate is None:
        return {}
    thresholds = {"kl_mean": gate.max_kl_mean, "kl_max": gate.max_kl, "top1_agreement": gate.min_top1_agreement}
    return {name: value for name, value in thresholds.items() if value is not None}


def _check_generation(loaded: LoadedRecipe) -> None:
    """A KV-cache step takes inputs made from the model, and is traced by torch.export."""
    if fidelity_gate(loaded) is not None and not loaded.recipe.generation.cache:
        raise loaded.error(("generation", "fidelity"), "a fidelity gate scores a decoder step: it needs generation.cache: true")
    if not is_decoder_with_cache(loaded):
        return
    recipe = loaded.recipe
    if recipe.inputs.tensors or recipe.inputs.dims or recipe.inputs.texts:
        raise loaded.error(("inputs",), "generation.cache makes the step's inputs from the model (ids, mask, positions, "
                           "past keys and values): leave `inputs` out")
    if recipe.validate_.shapes:
        raise loaded.error(("validate", "shapes"), "generation.cache checks its own step shapes (a prefill, a decode "
                           "step past the window) and generations: leave validate.shapes out")


def _pass_steps(loaded: LoadedRecipe) -> list[tuple[Location, PassSpec]]:
    """The recipe's passes, both pipelines, with where the recipe names each."""
    steps = [(("passes", i), spec) for i, spec in enumerate(loaded.passes)]
    return steps + [(("export", "graph_module", "passes", i), spec) for i, spec in enumerate(loaded.graph_module_passes)]


def passes_needing_calibration(loaded: LoadedRecipe) -> list[tuple[Location, PassSpec]]:
    """The recipe's passes (either pipeline) that run the graph on calibration texts, with where the recipe names them."""
    from aot.passes import registry

    return [(location, spec) for location, spec in _pass_steps(loaded)
            if registry.get(spec.name).create(spec.options).needs_calibration()]


def _check_calibration(loaded: LoadedRecipe) -> None:
    """A pass that fits to data has texts, read by a tokenizer, and runs in the pipeline that gets them."""
    needing = passes_needing_calibration(loaded)
    path = loaded.calibration_texts_path
    if path is None:
        if needing:
            location, spec = needing[0]
            raise loaded.error(location, f"pass '{spec.name}' fits to calibration texts: add generation.calibration "
                               "(a text file, one text a line) to the recipe")
        return
    if not loaded.recipe.generation.cache:
        raise loaded.error(("generation", "calibration"), "calibration texts run as prefills of a decoder step: "
                           "it needs generation.cache: true")
    for location, spec in needing:
        if location[0] != "passes":
            raise loaded.error(location, f"pass '{spec.name}' fits to calibration texts, which only the recipe's "
                               "`passes` get: move it there")
    if not path.is_file():
        raise loaded.error(("generation", "calibration", "texts"), f"texts file not found: {path}")
    if tokenizer_directory(loaded) is None:
        raise loaded.error(("generation", "calibration", "texts"), "texts need a tokenizer: model.pretrained, or "
                           "generation.tokenizer for a model built from a config")
    _check_fidelity_target(loaded)


def _check_fidelity_target(loaded: LoadedRecipe) -> None:
    """A pass that keeps the fidelity gate while it chooses has one to keep."""
    from aot.passes import registry

    for location, spec in _pass_steps(loaded):
        if registry.get(spec.name).create(spec.options).needs_fidelity_target() and not fidelity_target(loaded):
            raise loaded.error(location, f"pass '{spec.name}' chooses grids that keep the fidelity gate: add "
                               "generation.fidelity with max_kl_mean, max_kl or min_top1_agreement to the recipe")


def passes_changing_computation(loaded: LoadedRecipe) -> list[tuple[Location, PassSpec]]:
    """The recipe's passes (either pipeline) that do not preserve the computation, with where the recipe names them."""
    from aot.passes import registry

    return [(location, spec) for location, spec in _pass_steps(loaded) if not registry.get(spec.name).cls.preserves_computation]


def _check_accuracy_gate(loaded: LoadedRecipe) -> None:
    """A pass that changes the computation is judged by task metrics, so the recipe must name them (and their data)."""
    accuracy = loaded.recipe.validate_.accuracy
    changing = passes_changing_computation(loaded)
    if is_decoder_with_cache(loaded):
        _check_fidelity_gate(loaded, changing)
        return
    if changing and accuracy is None:
        location, spec = changing[0]
        raise loaded.error(
            location,
            f"pass '{spec.name}' changes the computation (it does not preserve it): add validate.accuracy with "
            "the data and the metric thresholds every artifact must reach",
        )
    if accuracy is None:
        return
    if accuracy.data == "texts":
        if not loaded.recipe.inputs.texts:
            raise loaded.error(("validate", "accuracy", "data"), "`texts` names inputs.texts, which this recipe does not give")
    else:
        path = loaded.accuracy_data_path
        if not path.is_file():
            raise loaded.error(("validate", "accuracy", "data"), f"data file not found: {path}")
        if path.suffix not in (".txt", ".jsonl", ".safetensors"):
            raise loaded.error(("validate", "accuracy", "data"), "a data file is .txt, .jsonl or .safetensors")
        if path.suffix == ".safetensors":
            return  # already the model's inputs: no tokenizer
    directory = tokenizer_directory(loaded)
    if directory is None:
        raise loaded.error(("validate", "accuracy", "data"), "text data needs a tokenizer: model.pretrained, or "
                           "validate.accuracy.tokenizer for a model built from a config")
    if not directory.is_dir():
        raise loaded.error(("validate", "accuracy", "tokenizer", "pretrained"), f"tokenizer directory not found: {directory}")


def _check_fidelity_gate(loaded: LoadedRecipe, changing: list[tuple[Location, PassSpec]]) -> None:
    """A decoder whose passes change the computation is judged by its next-token distributions on real prompts."""
    fidelity = fidelity_gate(loaded)
    if loaded.recipe.validate_.accuracy is not None:
        raise loaded.error(("validate", "accuracy"), "a decoder step is gated by generation.fidelity, not validate.accuracy")
    if changing and fidelity is None:
        location, spec = changing[0]
        raise loaded.error(location, f"pass '{spec.name}' changes the computation (it does not preserve it): add "
                           "generation.fidelity with the prompts and the thresholds every artifact must meet")
    if fidelity is None:
        return
    if not loaded.fidelity_prompts_path.is_file():
        raise loaded.error(("generation", "fidelity", "prompts"), f"prompts file not found: {loaded.fidelity_prompts_path}")
    if tokenizer_directory(loaded) is None:
        raise loaded.error(("generation", "fidelity", "prompts"), "prompts need a tokenizer: model.pretrained, or "
                           "generation.tokenizer for a model built from a config")


def _pydantic_error(
    locator: RecipeLocator, error: pydantic.ValidationError, rename: dict[str, str], prefix: Location = (),
    model: type[pydantic.BaseModel] | None = None,
) -> RecipeError:
    first = error.errors()[0]
    location = prefix + tuple(rename.get(str(part), part) for part in first["loc"] if not _is_union_tag(part))
    if first["type"] == "extra_forbidden":
        message = "unknown key" + did_you_mean(str(location[-1]), _sibling_keys(model, first["loc"]))
    elif first["type"] == "missing":
        message = "required key is missing"
    else:
        message = first["msg"].removeprefix("Value error, ")
        if "input" in first and first["type"] not in ("model_type",) and not isinstance(first["input"], dict):
            message += f" (got {first['input']!r})"
    more = len(error.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return locator.error(location, message + suffix)


def _sibling_keys(model: type[pydantic.BaseModel] | None, location: tuple) -> list[str]:
    """The keys (aliases where set) of the mapping that holds ``location``'s last key, walked from ``model``; [] if unknown."""
    for part in location[:-1]:
        if model is None:
            return []
        if isinstance(part, int) or _is_union_tag(part):
            continue  # a list index or a union member: the element's model, which _model_in unwrapped
        field = next((f for name, f in model.model_fields.items() if part in (name, f.alias)), None)
        model = _model_in(field.annotation) if field is not None else None
    return [field.alias or name for name, field in model.model_fields.items()] if model is not None else []


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The pydantic model inside an annotation (``X | None``, ``list[X]``, ``dict[str, X]``), if one."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None


def _is_union_tag(part: Any) -> bool:
    # pydantic inserts the tried union member ("str", "dict[str,...]") into error locations.
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "none"))


def _resolve_passes(loaded: LoadedRecipe, items: list, prefix: Location) -> list[PassSpec]:
    from aot.passes import registry

    frontend = loaded.recipe.trace.frontend
    specs = []
    for index, item in enumerate(items):
        location: Location = prefix + (index,)
        if isinstance(item, str):
            name, options = item, {}
        elif len(item) == 1:
            name, options = next(iter(item.items()))
            options = options or {}
        else:
            raise loaded.error(location, "a pass is a name or a one-key mapping {name: {options}}")
        try:
            info = registry.get(name)
        except KeyError:
            known = [p.name for p in registry.all_passes()]
            hint = did_you_mean(name, known) or " (`aot passes` lists them)"
            raise loaded.error(location, f"unknown pass '{name}'{hint}") from None
        if frontend not in info.frontends:
            raise loaded.error(
                location, f"pass '{name}' cannot run on the '{frontend}' frontend (it supports: {', '.join(sorted(info.frontends))})"
            )
        try:
            validated = info.options.model_validate(options)
        except pydantic.ValidationError as error:
            raise _pydantic_error(loaded.locator, error, rename={}, prefix=location + (name,), model=info.options) from None
        specs.append(PassSpec(name=name, options=validated.model_dump(mode="json")))
    return specs


def _check_files(loaded: LoadedRecipe) -> None:
    model = loaded.recipe.model
    if model.pretrained is not None:
        directory = pretrained_directory(loaded)
        if not directory.is_dir():
            raise loaded.error(("model", "pretrained"), f"pretrained directory not found: {directory}")
        config_path = directory / "config.json"
        if not config_path.is_file():
            raise loaded.error(("model", "pretrained"), f"no config.json in pretrained directory {directory}")
        demands = recipe_sequence_demands(loaded.recipe)
        check_position_limit(demands, _read_json_object(loaded, config_path), str(config_path), loaded.locator)
    if model.weights_dtype is not None:
        _check_weights_dtype(loaded)


def _check_weights_dtype(loaded: LoadedRecipe) -> None:
    """Narrow weights come from a checkpoint stored narrow, and widen into a wider dtype, under the fx tracer."""
    model, key = loaded.recipe.model, ("model", "weights_dtype")
    if model.pretrained is None:
        raise loaded.error(key, "keeps a pretrained checkpoint's own dtype: it needs model.pretrained (a model from "
                           "config or factory has float32 weights, and narrowing them would round them)")
    if _dtype_bits(model.dtype) <= _dtype_bits(model.weights_dtype):
        raise loaded.error(key, f"{model.weights_dtype} weights computing in {model.dtype} (model.dtype) is no widening: "
                           "leave weights_dtype out")
    if loaded.recipe.trace.frontend != "fx":
        raise loaded.error(key, "needs trace.frontend: fx (torch.export would trace the widening into the graph)")
    from aot.weights_dtype import stored_float_dtypes

    directory = pretrained_directory(loaded)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise loaded.error(key, f"needs safetensors weights, and {directory} has none")
    try:
        stored = stored_float_dtypes(files)
    except Exception as error:  # safetensors raises its own error type for a garbled header
        raise loaded.error(("model", "pretrained"), f"cannot read the weights in {directory}: {first_line(error)}") from None
    for name, dtypes in stored.items():
        if dtypes - {model.weights_dtype}:
            raise loaded.error(key, f"{directory / name} stores {', '.join(sorted(dtypes))} tensors: keeping them in "
                               f"{model.weights_dtype} would round them")


def _dtype_bits(name: str) -> int:
    return {"float16": 16, "bfloat16": 16, "float32": 32}[name]


def _read_json_object(loaded: LoadedRecipe, path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise loaded.error(("model", "pretrained"), f"cannot read {path}: {error}") from None
    if not isinstance(data, dict):
        raise loaded.error(("model", "pretrained"), f"{path} holds no JSON object")
    return data


def pretrained_directory(loaded: LoadedRecipe) -> Path:
    """``model.pretrained`` resolved: see :attr:`LoadedRecipe.pretrained_directory`."""
    assert loaded.pretrained_directory is not None
    return loaded.pretrained_directory


def tokenizer_directory(loaded: LoadedRecipe) -> Path | None:
    """The directory of :attr:`LoadedRecipe.tokenizer`; None if the recipe has no tokenizer."""
    return loaded.tokenizer.path if loaded.tokenizer is not None else None


def _resolved_directory(loaded: LoadedRecipe, relative: str, package: str | None, package_key: Location) -> Path:
    """``relative`` under ``package``'s install directory when given, else under the recipe file's directory."""
    if package:
        import importlib.util

        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise loaded.error(package_key, f"package '{package}' is not installed")
        base = Path(next(iter(spec.submodule_search_locations)))
    else:
        base = loaded.path.parent
    return (base / relative).resolve()


def recipe_json_schema() -> dict[str, Any]:
    schema = Recipe.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "aot recipe"
    _describe_passes(schema)
    _toggles_take_a_boolean(schema)
    return schema


def _toggles_take_a_boolean(schema: dict[str, Any]) -> None:
    """An artifact section may be a bare ``true``/``false`` (``ToggleSection``'s shorthand for ``enabled``), which pydantic's
    schema of the section's model does not say."""
    toggles = {f"#/$defs/{model.__name__}" for model in _subclasses(ToggleSection)}
    for definition in schema.get("$defs", {}).values():
        for name, value in definition.get("properties", {}).items():
            if value.get("$ref") in toggles:
                reference = {"$ref": value.pop("$ref")}
                value["anyOf"] = [reference, {"type": "boolean", "description": "`enabled` alone"}]


def _subclasses(cls: type) -> list[type]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]


def _describe_passes(schema: dict[str, Any]) -> None:
    """Every ``passes`` list of ``schema`` takes the registry's passes by name, each with its own options' schema, so an
    editor completes and checks them (pydantic's schema of :data:`~aot.recipe.schema.PassList` knows no pass)."""
    from aot.passes import registry

    definitions = schema.setdefault("$defs", {})
    by_name = {}
    for info in sorted(registry.all_passes(), key=lambda info: info.name):
        options = info.options.model_json_schema()
        for name, definition in options.pop("$defs", {}).items():  # nested models (a grid): referred to from the root
            if definitions.setdefault(name, definition) != definition:
                raise ValueError(f"pass '{info.name}': its option model {name} differs from another of that name")
        options["title"] = f"{info.name} options"
        by_name[info.name] = {"anyOf": [options, {"type": "null"}], "description": info.summary}
    definitions["Pass"] = {
        "description": "A registered pass (`aot passes` lists them): its name, or a one-key mapping {name: {option: value}}.",
        "anyOf": [
            {"type": "string", "enum": list(by_name)},
            {"type": "object", "properties": by_name, "additionalProperties": False, "minProperties": 1, "maxProperties": 1},
        ],
    }
    for holder in (schema, definitions["GraphModuleSpec"]):
        holder["properties"]["passes"]["items"] = {"$ref": "#/$defs/Pass"}


def recipe_json_schema_text() -> str:
    return json.dumps(recipe_json_schema(), indent=2, sort_keys=True) + "\n"
