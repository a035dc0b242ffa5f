"""The recipe, from its file to the build plan, without torch until the pass registry is needed.

- :mod:`~aot.recipe.reader`: the YAML read within fixed limits, the line of every key kept;
- :mod:`~aot.recipe.overrides`: ``--set KEY=VALUE``, applied to the file's data before it is checked;
- :mod:`~aot.recipe.schema`: the typed recipe (pydantic), published as ``aot schema``;
- :mod:`~aot.recipe.ranges`: sizes checked against each other and against the model's limits;
- :mod:`~aot.recipe.load`: :func:`load_recipe`, everything a build would reject, with file and line;
- :mod:`~aot.recipe.locator`: where each key is written, for errors found later;
- :mod:`~aot.recipe.plan`: :func:`~aot.recipe.plan.plan_build`, the recipe resolved once into the section each stage takes;
(``aot check``, which also asks the model's config, is :mod:`aot.builder.check`, a layer above.)
"""

from aot.recipe.load import (
    LoadedRecipe,
    fidelity_gate,
    is_decoder_with_cache,
    load_recipe,
    passes_changing_computation,
    pretrained_directory,
    recipe_json_schema,
    recipe_json_schema_text,
    tokenizer_directory,
)

__all__ = [
    "LoadedRecipe", "fidelity_gate", "is_decoder_with_cache", "load_recipe", "passes_changing_computation",
    "pretrained_directory", "recipe_json_schema", "recipe_json_schema_text", "tokenizer_directory",
]
