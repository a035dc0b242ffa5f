"""What ``aot run`` prints, computed: texts in batches through a :class:`~aot.run.BuiltModel`, answers as JSON values.

- an encoder: each text's pooled embedding, or with ``similarity`` the cosine of every pair;
- a classifier: each text's top labels (``id2label``) with softmax scores;
- a decoder: each prompt's greedy continuation, stopping at eos;
- a vision classifier: each image file's top labels, through the shipped image processor.

Where a build ships no tokenizer, encoders and classifiers take token ids instead (:func:`parse_ids`).

Texts are read from arguments, a file or a stream by :func:`read_texts`: one example a line, or a
JSONL file's ``field``; a blank line is an error naming its line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

from aot.errors import RecipeError

from .built_model import BuiltModel, cosine_similarities

BATCH_SIZE = 16


def _builds(tasks: list[str] | tuple[str, ...]) -> str:
    """``["encoder"]`` as "an encoder build", ``["classifier", "vision"]`` as "a classifier or vision build"."""
    return f"{'an' if tasks[0][0] in 'aeiou' else 'a'} {' or '.join(tasks)} build"


def read_texts(lines: Iterable[str], source: str, field: str | None = None) -> list[str]:
    """One text a line (a final newline is no line); with ``field``, each line a JSON object holding it."""
    texts = []
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            raise RecipeError(f"{source}:{number}: empty line")
        if field is None:
            texts.append(line)
            continue
        try:
            value = json.loads(line)[field]
        except (ValueError, KeyError, TypeError):
            raise RecipeError(f"{source}:{number}: not a JSON object with a '{field}' field") from None
        if not isinstance(value, str) or not value.strip():
            raise RecipeError(f"{source}:{number}: '{field}' is not a non-empty string")
        texts.append(value)
    if not texts:
        raise RecipeError(f"{source}: no text")
    return texts


def texts_from(arguments: tuple[str, ...], file: str | None, field: str | None, stdin: TextIO, ids: tuple[str, ...] = ()) -> list[str]:
    """The texts ``aot run`` answers: its arguments, else ``--file`` (``.jsonl``: ``field``, default ``text``), else stdin."""
    if ids:
        if arguments or file is not None:
            raise RecipeError("give either --ids or texts (TEXT or --file), not both")
        return []
    if arguments and file is not None:
        raise RecipeError("give either TEXT arguments or --file, not both")
    if arguments:
        empty = [index + 1 for index, text in enumerate(arguments) if not text.strip()]
        if empty:
            raise RecipeError(f"TEXT {empty[0]} is empty")
        return list(arguments)
    if file is not None:
        path = Path(file)
        if path.suffix == ".jsonl" and field is None:
            field = "text"
        try:
            with path.open(encoding="utf-8") as stream:
                return read_texts(stream, str(path), field)
        except (OSError, UnicodeDecodeError) as error:
            raise RecipeError(f"{path}: cannot read: {getattr(error, 'strerror', None) or error}") from None
    if stdin.isatty():
        raise RecipeError("no text: give TEXT arguments, --file, or lines on standard input")
    return read_texts(stdin, "stdin", field)


def parse_ids(values: tuple[str, ...]) -> list[list[int]]:
    """``--ids`` values (``"101 7592 102"`` or ``"101,7592,102"``) as rows of token ids; an error names the bad one."""
    rows = []
    for number, value in enumerate(values, 1):
        try:
            rows.append([int(token) for token in value.replace(",", " ").split()])
        except ValueError:
            raise RecipeError(f"--ids {number}: {value!r} is not integers separated by spaces or commas") from None
        if not rows[-1]:
            raise RecipeError(f"--ids {number} is empty")
    return rows


TOP_LABELS = 3  # a classifier's labels shown per text, unless ``top`` says
NEW_TOKENS = 32  # a decoder's tokens generated per prompt, unless ``max_new_tokens`` says

# The options that shape one task's answers, and the tasks they apply to: given for another task, they would be ignored.
_TASK_OPTIONS = {"pooling": ("encoder",), "top": ("classifier", "vision"), "max_new_tokens": ("decoder",)}


def answer(model: BuiltModel, texts: list[str], *, similarity: bool = False, pooling: str | None = None, top: int | None = None,
           max_new_tokens: int | None = None, on_batch: Callable[[int, int], None] | None = None,
           token_ids: list[list[int]] | None = None) -> dict[str, Any]:
    """The answers for ``texts`` (image paths for a vision build; or ``token_ids``' rows) with the task, runtime
    and truncated texts; see the module docstring. ``pooling``, ``top`` (default 3) and ``max_new_tokens`` (default
    32) shape one task's answers each: given for another task's build, they are an error."""
    examples: list[Any] = token_ids if token_ids else texts
    if token_ids and model.task not in ("encoder", "classifier"):
        raise RecipeError(f"{model.directory}: token ids feed an encoder or a classifier, not a {model.task} build")
    if similarity and (model.task != "encoder" or len(examples) < 2):
        raise RecipeError("--similarity needs an encoder build and at least two texts")
    options = {"pooling": pooling, "top": top, "max_new_tokens": max_new_tokens}
    for option, tasks in _TASK_OPTIONS.items():
        if options[option] is not None and model.task not in tasks:
            flag = "--" + option.replace("_", "-")
            raise RecipeError(f"{flag} applies to {_builds(tasks)}, not to {model.directory} ({_builds([model.task])})")
    top = TOP_LABELS if top is None else top
    max_new_tokens = NEW_TOKENS if max_new_tokens is None else max_new_tokens
    result: dict[str, Any] = {"task": model.task, "runtime": model.runtime, "build": str(model.directory), "items": [], "truncated": []}
    key = "ids" if token_ids else "text"
    vectors = []
    for start in range(0, len(examples), BATCH_SIZE):
        batch = examples[start:start + BATCH_SIZE]
        given = model.encode_ids(batch) if token_ids else batch
        if model.task == "decoder":
            for prompt, generated in zip(batch, model.generate(batch, max_new_tokens)):
                result["items"].append({"prompt": prompt, "generated": generated})
        elif model.task == "vision":
            result["items"] += [{"image": path, "labels": [{"label": label, "score": score} for label, score in row]}
                                for path, row in zip(batch, model.classify_images(batch, top))]
        elif model.task == "classifier":
            labels, truncated = model.classify(given, top)
            result["items"] += [{key: text, "labels": [{"label": label, "score": score} for label, score in row]}
                                for text, row in zip(batch, labels)]
            result["truncated"] += [start + index for index in truncated]
        else:
            embeddings, truncated = model.embed(given, pooling)
            vectors.append(embeddings)
            result["items"] += [{key: text, "embedding": row.tolist()} for text, row in zip(batch, embeddings)]
            result["truncated"] += [start + index for index in truncated]
        if on_batch is not None:
            on_batch(min(start + BATCH_SIZE, len(examples)), len(examples))
    if model.task == "encoder":
        result["pooling"] = pooling or model.pooling
    if similarity:
        import torch

        result["similarity"] = cosine_similarities(torch.cat(vectors)).tolist()
    return result
