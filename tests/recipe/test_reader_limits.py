"""Hostile or broken recipe files fail fast, as one RecipeError line naming the file, never as a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from aot.errors import RecipeError
from aot.recipe import reader
from aot.recipe.load import load_recipe
from tests.conftest import TINY_BERT

RECIPES_DIR = Path(__file__).parents[2] / "recipes"


def _billion_laughs(indent: str) -> str:
    """Nine levels of nine-fold aliases: 9**9 (387 million) strings once expanded, in under 1 KiB."""
    lines = [f"{indent}l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"]
    for level in range(1, 9):
        alias = f"*l{level - 1}"
        lines.append(f"{indent}l{level}: &l{level} [{', '.join([alias] * 9)}]\n")
    return "".join(lines)


def _factory_recipe(kwargs_block: str) -> str:
    return f"model:\n  factory: tests.models:noisy_linear\n  factory_kwargs:\n{kwargs_block}"


def _load_error(path: Path) -> str:
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(path)), message
    return message


def test_a_recipe_with_small_factory_kwargs_loads(write_recipe):
    # The precondition of the tests below: the same recipe, without the hostile part, is fine.
    loaded = load_recipe(write_recipe(_factory_recipe("    features: 8\n")))
    assert loaded.recipe.model.factory_kwargs == {"features": 8}


def test_billion_laughs_inside_factory_kwargs_stops_at_the_node_budget(write_recipe):
    path = write_recipe(_factory_recipe(_billion_laughs("    ")))
    assert path.stat().st_size < 1024
    message = _load_error(path)
    assert "node budget" in message and str(reader.MAX_RECIPE_NODES) in message
    assert message.startswith(f"{path}:"), "names the line where the budget ran out"


def test_billion_laughs_at_the_top_level_stops_at_the_node_budget(write_recipe):
    message = _load_error(write_recipe(TINY_BERT + _billion_laughs("")))
    assert "node budget" in message


def test_aliases_below_the_budget_still_work(write_recipe):
    # An anchor reused by merge keys: parsed once, with the lines of the file kept.
    text = TINY_BERT.replace(
        "    batch: {size: 2, dynamic: true}\n    sequence: {size: 8, dynamic: true}\n",
        "    batch: &dynamic {size: 2, dynamic: true}\n    sequence: {<<: *dynamic, size: 8, bogus: 1}\n",
    )
    with pytest.raises(RecipeError, match=r"tiny.yaml:14: inputs.dims.sequence.bogus: unknown key"):
        load_recipe(write_recipe(text))
    loaded = load_recipe(write_recipe(text.replace(", bogus: 1", "")))
    assert loaded.recipe.inputs.dims["sequence"].size == 8
    assert loaded.recipe.inputs.dims["sequence"].dynamic


@pytest.mark.parametrize(
    "kwargs_block",
    ["    loop: &a [*a]\n", "    loop: &a {again: *a}\n", "    loop: &a [1, [2, {deeper: *a}]]\n"],
    ids=["list", "mapping", "nested"],
)
def test_recursive_alias_is_named(write_recipe, kwargs_block):
    message = _load_error(write_recipe(_factory_recipe(kwargs_block)))
    assert "tiny.yaml:4: alias *a is used inside its own anchor &a" in message


def test_deep_nesting_stops_at_the_depth_limit(write_recipe):
    depth = 10 * reader.MAX_RECIPE_DEPTH
    message = _load_error(write_recipe(_factory_recipe("    deep: " + "[" * depth + "]" * depth + "\n")))
    assert f"nested deeper than {reader.MAX_RECIPE_DEPTH} levels" in message


def test_depth_counts_what_aliases_add(write_recipe):
    half = reader.MAX_RECIPE_DEPTH // 2 + 1
    nested = "[" * half + "1" + "]" * half
    shallow = _factory_recipe(f"    a: &a {nested}\n")
    assert load_recipe(write_recipe(shallow)).recipe.model.factory_kwargs["a"]  # precondition: each half is fine
    message = _load_error(write_recipe(shallow + f"    b: {'[' * half}*a{']' * half}\n"))
    assert "tiny.yaml:5: nested deeper than" in message


class _RecordedReads:
    """A file whose reads are noted, to prove how much of it was asked for."""

    def __init__(self, file, sizes: list[int]) -> None:
        self.file, self.sizes = file, sizes

    def read(self, size: int = -1) -> bytes:
        self.sizes.append(size)
        return self.file.read(size)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.file.close()


def test_oversized_file_is_rejected_without_reading_it_all(write_recipe, monkeypatch):
    path = write_recipe(TINY_BERT + "#" * (4 * reader.MAX_RECIPE_BYTES) + "\n")
    read_sizes: list[int] = []
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *args, **kwargs: _RecordedReads(real_open(self, *args, **kwargs), read_sizes))
    message = _load_error(path)
    assert f"larger than {reader.MAX_RECIPE_BYTES} bytes" in message
    assert read_sizes == [reader.MAX_RECIPE_BYTES + 1]


def test_file_of_exactly_the_limit_is_read(write_recipe):
    padding = reader.MAX_RECIPE_BYTES - len(TINY_BERT.encode()) - 1
    path = write_recipe(TINY_BERT + "#" * padding + "\n")
    assert path.stat().st_size == reader.MAX_RECIPE_BYTES
    assert load_recipe(path).recipe.model.seed == 0


def test_flat_list_over_the_budget_is_rejected(write_recipe):
    items = ", ".join(["1"] * reader.MAX_RECIPE_NODES)
    message = _load_error(write_recipe(_factory_recipe(f"    many: [{items}]\n")))
    assert "node budget" in message


def test_non_utf8_recipe_names_the_byte(tmp_path):
    path = tmp_path / "latin1.yaml"
    text = TINY_BERT.replace("model:\n", "description: café\nmodel:\n")
    path.write_bytes(text.encode("latin-1"))
    assert load_recipe(_utf8_copy(path, text)).recipe.description == "café"  # precondition
    offset = text.encode("latin-1").index(b"\xe9")
    assert _load_error(path) == f"{path}:1: not UTF-8 at byte {offset}"


def _utf8_copy(path: Path, text: str) -> Path:
    copy = path.with_name("utf8.yaml")
    copy.write_text(text, encoding="utf-8")
    return copy


def test_directory_as_recipe_is_named(tmp_path):
    assert _load_error(tmp_path) == f"{tmp_path}: is a directory, not a recipe file"


def test_forbidden_character_names_its_line(write_recipe):
    message = _load_error(write_recipe(TINY_BERT.replace("  seed: 0\n", "  seed: 0\n  description: a\x07b\n")))
    assert "tiny.yaml:11: malformed YAML: unacceptable character #x0007" in message


def test_list_as_mapping_key_is_a_recipe_error(write_recipe):
    message = _load_error(write_recipe(TINY_BERT + "? [a, b]\n: 1\n"))
    assert "malformed YAML: found unhashable key" in message


def test_crlf_recipe_hashes_like_its_lf_copy(write_recipe, tmp_path):
    lf = load_recipe(write_recipe())
    crlf_path = tmp_path / "crlf.yaml"
    crlf_path.write_bytes(TINY_BERT.replace("\n", "\r\n").encode())
    assert load_recipe(crlf_path).sha256 == lf.sha256


@pytest.mark.parametrize("name", sorted(p.name for p in RECIPES_DIR.glob("*.yaml")))
def test_shipped_recipes_load_far_below_the_limits(name, monkeypatch):
    # An eighth of each limit is still plenty: no real recipe comes near enough to trip on them.
    for limit in ("MAX_RECIPE_BYTES", "MAX_RECIPE_NODES", "MAX_RECIPE_DEPTH"):
        monkeypatch.setattr(reader, limit, getattr(reader, limit) // 8)
    assert load_recipe(RECIPES_DIR / name).name == Path(name).stem
