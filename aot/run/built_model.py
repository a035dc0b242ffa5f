"""``aot.load(DIR)``: a verified build directory as a model that takes text and answers in the task's terms.

    model = aot.load("out/minilm")                 # ONNX Runtime; runtime="torch" runs module.py (aot.export.kinds)
    model.embed(["A man is eating food.", "A man eats."])      # (2, 384): the recipe's pooling
    model.similarity(["A man is eating food.", "A man eats."]) # (2, 2) cosine similarities
    model.classify(["great film"])                 # [[("POSITIVE", 0.93), ...]]: id2label, softmax
    model.classify_images(["cat.jpg"])             # a vision build: through the shipped image processor
    model.embed(model.encode_ids([[101, 7592, 102]]))         # token ids where a build ships no tokenizer
    model.generate(["Once upon a time"], max_new_tokens=20)    # greedy text, stops at eos
    model({"input_ids": ..., "attention_mask": ...})           # token ids in, outputs out

Every file is checked against the manifest first, as ``aot validate`` does (exit 7 on a mismatch),
and an artifact that runs the directory's code (``runtime="torch"``'s ``module.py``, a compiled package) opens only
with consent (:mod:`aot.directory.consent`). The tokenizer and
config are the ones the build shipped and checked (:mod:`aot.bundle`); nothing is read from
elsewhere. Text longer than the build's largest sequence is truncated to it, and the result says
which inputs were (``truncated``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aot.bundle import DEPLOYMENT_KEY
from aot.directory.open import open_build
from aot.directory.signed import signed_manifest_sha256
from aot.errors import RecipeError
from aot.recipe.ranges import generation_length, position_table
from aot.export.kinds import OpenOptions, artifact_kinds, kind_of_runtime, runtimes

log = logging.getLogger(__name__)

POOLINGS = ("mean", "cls", "none")


@dataclass
class Encoded:
    """Token inputs for a batch of texts, and the indices of the texts that were cut to the longest sequence."""

    inputs: dict[str, torch.Tensor]
    truncated: list[int] = field(default_factory=list)


class BuiltModel:
    """A build directory's artifact with its tokenizer and config; see the module docstring."""

    def __init__(self, directory: Path, manifest: dict[str, Any], artifact: Any):
        self.directory = directory
        self.manifest = manifest
        self.artifact = artifact
        self.deployment = manifest.get(DEPLOYMENT_KEY) or {}
        self.task = self.deployment.get("task", "encoder")
        recipe = manifest["recipe"]["resolved"]
        self._tensors = {tensor["name"]: tensor for tensor in recipe["inputs"]["tensors"]}
        self._dims = recipe["inputs"]["dims"]
        accuracy = (recipe.get("validate") or {}).get("accuracy") or {}
        self.pooling = accuracy.get("pooling") or "mean"
        self._config = None

    # -- what the build shipped ------------------------------------------------------------------------------

    @property
    def runtime(self) -> str:
        return self.artifact.runtime

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The shipped tokenizer (``AutoTokenizer`` on the build directory); a clear error where none ships."""
        self._require_shipped("tokenizer", "tokenizer", "token ids instead (aot run --ids)")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.directory), local_files_only=True)

    @functools.cached_property
    def processor(self) -> Any:
        """The shipped image processor (``preprocessor_config.json``); a clear error where none ships."""
        self._require_shipped("processor", "image processor", "pixel_values instead")
        from aot.bundle import load_image_processor

        return load_image_processor(self.directory)

    def _require_shipped(self, key: str, what: str, instead: str) -> None:
        """A one-line error, with the manifest's reason, where the build ships no ``key`` (``deployment`` in the manifest)."""
        if not self.deployment.get(key):
            why = (self.deployment.get("missing") or {}).get(key, "its manifest names none")
            raise RecipeError(f"{self.directory}: this build ships no {what} ({why}): pass {instead}")

    @property
    def config(self) -> Any:
        """The shipped ``config.json`` as transformers reads it; None where the build has none."""
        if self._config is None and self.deployment.get("config"):
            from transformers import AutoConfig

            self._config = AutoConfig.from_pretrained(str(self.directory), local_files_only=True)
        return self._config

    @property
    def max_sequence(self) -> int | None:
        """The longest sequence the artifacts were built and validated for (the sequence dim's maximum)."""
        names = {tensor["shape"][1] for tensor in self._tensors.values() if len(tensor.get("shape") or []) == 2}
        sizes = [self._dims[name].get("max") or self._dims[name].get("size") for name in names if isinstance(name, str) and name in self._dims]
        positions = getattr(self.config.get_text_config(), "max_position_embeddings", None) if self.config is not None else None
        limits = [int(size) for size in sizes if size] + ([int(positions)] if positions else [])
        return min(limits) if limits else None

    # -- calls -----------------------------------------------------------------------------------------------

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Token (or pixel) inputs in, the artifact's outputs out, by name."""
        return self.artifact(inputs)

    def encode(self, texts: list[str]) -> Encoded:
        """``texts`` as the artifact's inputs, padded to the longest, cut at :attr:`max_sequence`."""
        _check_texts(texts)
        limit = self.max_sequence
        full = self.tokenizer(texts, truncation=False)["input_ids"]
        truncated = [index for index, ids in enumerate(full) if limit is not None and len(ids) > limit]
        encoded = self.tokenizer(texts, padding="longest", truncation=limit is not None, max_length=limit, return_tensors="pt")
        inputs = {name: encoded[name].to(getattr(torch, self._tensors[name].get("dtype", "int64")))
                  for name in self._tensors if name in encoded}
        missing = [name for name in self._tensors if name not in inputs]
        if missing:
            raise RecipeError(f"{self.directory}: the shipped tokenizer gives no {', '.join(missing)} (it gives: {', '.join(encoded)})")
        for index in truncated:
            log.warning("text %d is %d tokens long: cut to the build's %d", index + 1, len(full[index]), limit)
        return Encoded(inputs, truncated)

    def embed(self, texts: list[str] | Encoded, pooling: str | None = None) -> tuple[torch.Tensor, list[int]]:
        """One vector per text (or :meth:`encode_ids`'s rows), pooled over its tokens (``pooling``, else the recipe's,
        else mean); and the truncated."""
        self._require_task("encoder", "embed")
        pooling = pooling or self.pooling
        if pooling not in POOLINGS:
            raise RecipeError(f"pooling '{pooling}' is not one of {', '.join(POOLINGS)}")
        encoded = texts if isinstance(texts, Encoded) else self.encode(texts)
        outputs = self.artifact(encoded.inputs)
        name = "last_hidden_state" if "last_hidden_state" in outputs else next(iter(outputs))
        from aot.gates.accuracy import pooled_vectors

        return pooled_vectors(outputs[name], encoded.inputs, pooling).to(torch.float32), encoded.truncated

    def similarity(self, texts: list[str], pooling: str | None = None) -> tuple[torch.Tensor, list[int]]:
        """Cosine similarity of every pair of ``texts``' embeddings, (n, n)."""
        vectors, truncated = self.embed(texts, pooling)
        return cosine_similarities(vectors), truncated

    def encode_ids(self, rows: list[list[int]]) -> Encoded:
        """Token ids (one list a text, as a tokenizer gave them) as the artifact's inputs, right padded.

        Padding is the tokenizer's pad id, else the config's, else 0, masked out; ``token_type_ids`` are 0.
        """
        if not rows or any(not row for row in rows):
            raise RecipeError("no token ids given" if not rows else f"token ids {next(i for i, row in enumerate(rows) if not row) + 1} are empty")
        limit = self.max_sequence
        longest = max(len(row) for row in rows)
        if limit is not None and longest > limit:
            raise RecipeError(f"{longest} token ids are more than the build's longest sequence, {limit}")
        vocabulary = getattr(self.config.get_text_config(), "vocab_size", None) if self.config is not None else None
        for index, row in enumerate(rows):
            outside = [token for token in row if token < 0 or (vocabulary is not None and token >= vocabulary)]
            if outside:
                raise RecipeError(f"token ids {index + 1}: {outside[0]} is outside the vocabulary (0..{(vocabulary or 0) - 1})")
        pad = self._pad_id()
        ids = torch.tensor([row + [pad] * (longest - len(row)) for row in rows], dtype=torch.int64)
        mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in rows], dtype=torch.int64)
        made = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        missing = [name for name in self._tensors if name not in made]
        if missing:
            raise RecipeError(f"{self.directory}: token ids cannot feed its {', '.join(missing)}")
        return Encoded({name: made[name].to(getattr(torch, self._tensors[name].get("dtype", "int64"))) for name in self._tensors})

    def _require_task(self, task: str, verb: str) -> None:
        """RecipeError naming the build unless it is ``task``'s: the artifact's own error would name its missing inputs."""
        if self.task != task:
            raise RecipeError(f"{self.directory}: {_article(self.task)} build does not {verb} ({_article(task)} build does)")

    def _check_positions(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        """Each prompt and the new tokens fed back after it within the model's table of positions (where it has one:
        rotary positions have none), as the build checked its own generations (aot.recipe.ranges)."""
        text_config = self.config.get_text_config() if self.config is not None else None
        table = position_table(text_config.to_dict()) if text_config is not None else None
        if table is None:
            return
        key, limit = table
        for index, prompt in enumerate(prompts):
            fed = generation_length(len(prompt), max_new_tokens)
            if fed > limit:
                raise RecipeError(f"text {index + 1}: {len(prompt)} tokens + {max_new_tokens} new - 1 = {fed} positions, above "
                                  f"the model's {key} {limit}: a shorter prompt or fewer new tokens")

    def _pad_id(self) -> int:
        if self.deployment.get("tokenizer") and self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        pad = getattr(self.config.get_text_config(), "pad_token_id", None) if self.config is not None else None
        return int(pad) if pad is not None else 0

    def classify(self, texts: list[str] | Encoded, top: int = 3) -> tuple[list[list[tuple[str, float]]], list[int]]:
        """The ``top`` labels of each text (``id2label``) with their softmax scores (texts, or :meth:`encode_ids`'s)."""
        self._require_task("classifier", "classify texts")
        encoded = texts if isinstance(texts, Encoded) else self.encode(texts)
        return self._top_labels(self.artifact(encoded.inputs)["logits"], top), encoded.truncated

    def classify_images(self, paths: list[str], top: int = 3) -> list[list[tuple[str, float]]]:
        """The ``top`` labels of each image file (``id2label``) with their softmax scores, through the shipped processor."""
        self._require_task("vision", "classify images")
        pixels = self.processor(images=[_read_image(path) for path in paths], return_tensors="pt")["pixel_values"]
        dtype = getattr(torch, self._tensors.get("pixel_values", {}).get("dtype", "float32"))
        return self._top_labels(self.artifact({"pixel_values": pixels.to(dtype)})["logits"], top)

    def _top_labels(self, logits: torch.Tensor, top: int) -> list[list[tuple[str, float]]]:
        scores = logits.to(torch.float32).softmax(dim=-1)
        labels = getattr(self.config, "id2label", None) or {}
        best = scores.topk(min(top, scores.shape[-1]), dim=-1)
        return [[(labels.get(int(i), str(int(i))), float(s)) for s, i in zip(row_scores, row_ids)]
                for row_scores, row_ids in zip(best.values, best.indices)]

    def generate(self, texts: list[str], max_new_tokens: int = 32) -> list[str]:
        """Greedy continuations of ``texts`` (a batch, left padded), each stopping at the model's eos. A prompt whose
        generation would run past the model's table of positions is refused, not cut: a cut prompt is another prompt."""
        _check_texts(texts)
        self._require_task("decoder", "generate")
        tokenizer = self.tokenizer
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        empty = [index + 1 for index, row in enumerate(ids) if not row]
        if empty:
            raise RecipeError(f"text {empty[0]}: the tokenizer turns it into no tokens, which cannot be continued")
        self._check_positions(ids, max_new_tokens)
        longest = max(len(row) for row in ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([[pad] * (longest - len(row)) + row for row in ids], dtype=torch.int64)
        mask = torch.tensor([[0] * (longest - len(row)) + [1] * len(row) for row in ids], dtype=torch.int64)
        eos = _eos_ids(self.directory)
        tokens = self.artifact.generate(input_ids, mask, max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        new = tokens[:, longest:]
        return [_continuation(tokenizer, prompt, _until_eos(row.tolist(), eos)) for prompt, row in zip(ids, new)]


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _continuation(tokenizer, prompt: list[int], generated: list[int]) -> str:
    """What the tokenizer's decoding of prompt and continuation adds after the prompt's: the text to append to it.

    Decoded alone, a continuation loses what joins it to the prompt: a SentencePiece tokenizer drops its leading
    space (" Paris" becomes "Paris"), and a WordPiece one has none to keep (", I'm" after "there" is glued, "paris"
    after "is" is not). Decoding the whole sequence and taking what follows the prompt's own decoding is how the
    tokenizer itself joins them (transformers' TextStreamer does the same).
    """
    before = tokenizer.decode(prompt, skip_special_tokens=True)
    whole = tokenizer.decode(prompt + generated, skip_special_tokens=True)
    if whole.startswith(before):
        return whole[len(before):]
    return tokenizer.decode(generated, skip_special_tokens=True)  # a decoding that rewrites the prompt's end: the tokens alone


def load(directory: str | Path, runtime: str = "onnx", *, expect_sha256: str | None = None, trust_code: bool = False,
         threads: int | None = None, public_key: str | Path | None = None, signature: str | Path | None = None) -> BuiltModel:
    """A build directory, verified against its manifest, with the chosen artifact loaded; see the module docstring.

    ``public_key``: the directory's OpenSSF model signature (``signature``, by default ``DIR.sig`` beside it, else
    ``DIR/model.sig``) must verify with it over every file; the manifest's sha256 it signs then stands for
    ``expect_sha256``, and so gives consent to run the directory's code (:mod:`aot.directory.signed`).

    ``threads``: the runtime's intra-op threads, ONNX Runtime's session's or, for ``runtime="torch"``, torch's
    (``torch.set_num_threads``: one pool for the whole process); a kind that cannot take them (the AOTInductor
    package, compiled for its count) refuses them.
    """
    if runtime not in runtimes():
        raise RecipeError(f"runtime '{runtime}' is not one of {', '.join(runtimes())}")
    if signature is not None and public_key is None:
        raise RecipeError("signature= needs public_key=: the key to check it with")
    kind = kind_of_runtime(runtime)
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise RecipeError(f"threads must be a whole number of at least 1, got {threads!r}")
        if kind.fixed_threads:
            raise RecipeError(f"threads (--threads) cannot reach the {kind.title}: {kind.fixed_threads}")
    if public_key is not None:
        expect_sha256 = signed_manifest_sha256(directory, public_key, signature, expect_sha256, command="aot.load(public_key=...)")
    opened = open_build(directory, expect_sha256, trust_code)
    manifest = opened.manifest
    decoder = (manifest.get(DEPLOYMENT_KEY) or {}).get("task") == "decoder"
    others = " or ".join(f"'{other.runtime}'" for other in artifact_kinds() if other is not kind and opened.sha256_of(other.main_file))
    instead = f": use runtime {others}" if others else ""
    if opened.sha256_of(kind.main_file) is None or (kind.manifest_key and not manifest.get(kind.manifest_key)):
        raise RecipeError(f"{opened.directory}: this build has no {kind.title} (export.{kind.name}){instead}")
    if decoder and not kind.generates:
        raise RecipeError(f"{opened.directory}: a decoder's {kind.title} cannot generate{instead}")
    if kind.runs_code:
        opened.require_consent(f"the {runtime} runtime")
    artifact = kind.open(opened.directory, OpenOptions(manifest, opened.sha256_of, decoder=decoder, threads=threads))
    return BuiltModel(opened.directory, manifest, artifact)


def cosine_similarities(vectors: torch.Tensor) -> torch.Tensor:
    """The cosine of every pair of rows of ``vectors``, (n, n)."""
    unit = torch.nn.functional.normalize(vectors, dim=1)
    return unit @ unit.T


def _read_image(path: str) -> Any:
    """An image file as RGB, through Pillow (the ``vision`` extra); a clear error naming the file."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise RecipeError("reading images needs Pillow: pip install 'aot[vision]'") from None
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, UnidentifiedImageError) as error:
        reason = "not an image Pillow reads" if isinstance(error, UnidentifiedImageError) else (getattr(error, "strerror", None) or str(error))
        raise RecipeError(f"{path}: cannot read the image: {reason}") from None


def _check_texts(texts: list[str]) -> None:
    if isinstance(texts, str):  # iterated, it would be its characters
        raise RecipeError("texts: give a list of strings, not one string")
    if not texts:
        raise RecipeError("no text given")
    wrong = [index + 1 for index, text in enumerate(texts) if not isinstance(text, str)]
    if wrong:
        raise RecipeError(f"text {wrong[0]} is {type(texts[wrong[0] - 1]).__name__}, not a string")
    empty = [index + 1 for index, text in enumerate(texts) if not text.strip()]
    if empty:
        raise RecipeError(f"text {empty[0]} is empty")


def _eos_ids(directory: Path) -> list[int] | None:
    """The generation config's eos ids (an int or a list there)."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return None
    import json

    eos = json.loads(path.read_text()).get("eos_token_id")
    if eos is None:
        return None
    return [int(eos)] if isinstance(eos, int) else [int(token) for token in eos]


def _until_eos(tokens: list[int], eos: list[int] | None) -> list[int]:
    if not eos:
        return tokens
    cut = next((index for index, token in enumerate(tokens) if token in eos), len(tokens))
    return tokens[:cut]
