"""What ``aot run`` prints, computed: texts in batches through a :class:`~aot.run.BuiltModel`, answers as JSON values.

- an encoder: each text's pooled embedding, or with ``similarity`` the cosine of every pair;
- a classifier: each text's top labels (``id2label``) with softmax scores;
- a decoder: each prompt's greedy continuation, stopping at eos.

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


def texts_from(arguments: tuple[str, ...], file: str | None, field: str | None, stdin: TextIO) -> list[str]:
    """The texts ``aot run`` answers: its arguments, else ``--file`` (``.jsonl``: ``field``, default ``text``), else stdin."""
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


def answer(model: BuiltModel, texts: list[str], *, similarity: bool = False, pooling: str | None = None, top: int = 3,
           max_new_tokens: int = 32, on_batch: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The answers for ``texts`` (see the module docstring) with the task, runtime and truncated texts."""
    if model.task == "vision":
        raise RecipeError(f"{model.directory}: a vision build takes images: call aot.load(...)({{'pixel_values': ...}})")
    if similarity and (model.task != "encoder" or len(texts) < 2):
        raise RecipeError("--similarity needs an encoder build and at least two texts")
    result: dict[str, Any] = {"task": model.task, "runtime": model.runtime, "build": str(model.directory), "items": [], "truncated": []}
    vectors = []
    for start in range(0, len(texts), BATCH_SIZE):
        batch = texts[start:start + BATCH_SIZE]
        if model.task == "decoder":
            for prompt, generated in zip(batch, model.generate(batch, max_new_tokens)):
                result["items"].append({"prompt": prompt, "generated": generated})
        elif model.task == "classifier":
            labels, truncated = model.classify(batch, top)
            result["items"] += [{"text": text, "labels": [{"label": label, "score": score} for label, score in row]}
                                for text, row in zip(batch, labels)]
            result["truncated"] += [start + index for index in truncated]
        else:
            embeddings, truncated = model.embed(batch, pooling)
            vectors.append(embeddings)
            result["items"] += [{"text": text, "embedding": row.tolist()} for text, row in zip(batch, embeddings)]
            result["truncated"] += [start + index for index in truncated]
        if on_batch is not None:
            on_batch(min(start + BATCH_SIZE, len(texts)), len(texts))
    if model.task == "encoder":
        result["pooling"] = pooling or model.pooling
    if similarity:
        import torch

        result["similarity"] = cosine_similarities(torch.cat(vectors)).tolist()
    return result
