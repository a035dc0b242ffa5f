"""The registry: names, typed options with descriptions, frontends, documentation."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import aot.passes
from aot.passes import Transformation, register_pass, registry

# Every pass `import aot.passes` registers, read when the tests are collected (before any test registers one).
BUILT_IN = registry.all_passes()
REVERSIBLE = {
    "merge_linears", "fuse_bias_in_linear", "change_true_div_to_mul_by_inverse", "prepack_linear_weights", "deep_copy", "lint_and_recompile",
}
# quantize_linear_int8 swaps nn.Linear modules, which an ATen graph holds as aten.linear on parameters;
# cast_precision: an ATen graph bakes in its dtypes.
FX_ONLY = {"quantize_linear_int8", "quantize_linear_weights", "cast_precision"}
NOT_REWRITING = {"deep_copy", "lint_and_recompile"}  # no graph before and after to show


def test_the_registry_holds_the_built_in_passes():
    assert BUILT_IN, "registry.all_passes() is empty: every test parametrized over it would check nothing"
    names = {info.name for info in BUILT_IN}
    assert REVERSIBLE | FX_ONLY | NOT_REWRITING <= names
    assert "prepack_linear_weights" in names


@pytest.mark.artifact
def test_importing_aot_passes_registers_the_built_in_passes():
    code = "import aot.passes; from aot.passes import registry; print([p.name for p in registry.all_passes()])"
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert listed.strip() == repr([info.name for info in BUILT_IN])


@pytest.mark.parametrize("info", BUILT_IN, ids=lambda info: info.name)
def test_built_in_pass_is_documented_typed_and_exported(info):
    assert info.cls is getattr(aot.passes, info.cls.__name__)
    assert info.cls.name == info.name
    assert info.reversible == (info.name in REVERSIBLE)
    assert info.frontends == ({"fx"} if info.name in FX_ONLY else {"fx", "export"})
    assert info.summary and info.summary == info.doc.splitlines()[0]
    assert info.options.model_config["extra"] == "forbid"
    assert all(field.description for field in info.options.model_fields.values())
    assert isinstance(info.create({}), info.cls)


@pytest.mark.parametrize("info", [info for info in BUILT_IN if info.name not in NOT_REWRITING], ids=lambda info: info.name)
def test_rewriting_pass_docs_show_the_graph_before_and_after_and_the_math(info):
    assert "Matches" in info.doc and "Rewrites to" in info.doc and "Math" in info.doc, info.doc


def test_options_are_validated_with_readable_errors():
    info = registry.get("merge_linears")
    assert info.create({"min_group_size": 3}).options.min_group_size == 3
    with pytest.raises(ValidationError, match="min_group_siz\\b|Extra inputs are not permitted"):
        info.create({"min_group_siz": 3})
    with pytest.raises(ValidationError, match="greater than or equal to 2"):
        info.create({"min_group_size": 1})
    with pytest.raises(ValidationError, match="valid boolean"):
        registry.get("change_true_div_to_mul_by_inverse").create({"exact_only": "maybe"})


def test_an_unknown_name_gives_one_short_line_with_the_closest_names():
    with pytest.raises(KeyError) as raised:
        registry.get("merge_linear")
    message = raised.value.args[0]
    assert message == "unknown pass 'merge_linear' (did you mean 'merge_linears'?)"
    assert "\n" not in message and len(message) < 200
    for name in (info.name for info in registry.all_passes()):  # every registered name is found from a typo of it
        with pytest.raises(KeyError, match=rf"did you mean '{name}'"):
            registry.get(name[:-1] + "X")
    with pytest.raises(KeyError, match=r"^\"unknown pass 'zzz' \(`aot passes` lists them\)\"$"):
        registry.get("zzz")


def test_duplicate_name_is_an_error():
    with pytest.raises(ValueError, match="'merge_linears' is already registered by MergeLinears"):

        @register_pass("merge_linears")
        class Again(Transformation):
            def transform(self, graph_module):
                return graph_module


def test_options_must_be_strict_documented_and_defaulted():
    class Loose(BaseModel):
        size: int = Field(default=1, description="a size")

    class Undocumented(BaseModel):
        model_config = ConfigDict(extra="forbid")
        size: int = 1

    for options, message in ((Loose, "extra='forbid'"), (Undocumented, "description")):
        with pytest.raises(TypeError, match=message):

            @register_pass(f"bad_{options.__name__.lower()}")
            class Bad(Transformation):
                Options = options

                def transform(self, graph_module):
                    return graph_module

    assert "bad_loose" not in {p.name for p in registry.all_passes()}


def test_frontends_are_checked():
    with pytest.raises(ValueError, match="frontends"):
        register_pass("onnx_only", frontends=("onnx",))
