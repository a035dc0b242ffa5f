"""Accuracy gates: task metrics of an artifact against the float32 eager model, on real data.

A pass that preserves the computation is held to atol/rtol. One that does not (an activation
change, a lower precision) cannot be: its outputs differ by design, and what matters is whether
the task still works. The workflow aot follows validates those with task metrics; a recipe
names the data and the thresholds under ``validate.accuracy`` (:class:`aot.recipe.schema.AccuracySpec`).

Metrics, each over the examples of the data set, the artifact against eager:

- ``cosine_mean`` / ``cosine_min``: the cosine similarity of each example's vector (the chosen
  output, pooled over its tokens by ``pooling``), ``a·b / (|a||b|)``: embeddings;
- ``top1_agreement``: the share of arg-maxes over the last axis that are eager's (per token
  where the output has a sequence axis and the inputs an attention_mask): classifiers;
- ``spearman``: Spearman's rank correlation between the pairwise cosine similarities of all
  examples under the artifact and under eager (``scipy.stats.spearmanr``): whether the
  artifact ranks sentence pairs as eager does, which is what embedding users rely on.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from aot.inputs import text_lines
from aot.recipe.plan import GatePlan
from aot.recipe.schema import AccuracySpec, DimSpec
from aot.tracing.outputs import flatten_outputs

Batch = dict[str, torch.Tensor]


@dataclass
class AccuracyData:
    """The gate's data set, as batches of inputs; ``examples`` real ones (a fixed batch may repeat some)."""

    batches: list[Batch]
    examples: int
    source: str


@dataclass
class AccuracyResult:
    artifact: str
    examples: int
    source: str
    metrics: dict[str, float] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    problem: str | None = None  # the artifact failed to run on the data

    @property
    def failed(self) -> list[str]:
        return [name for name, threshold in self.thresholds.items() if not self.metrics.get(name, float("-inf")) >= threshold]

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.failed

    def summary(self) -> str:
        where = f"on {self.examples} examples of {self.source}"
        if self.problem:
            return f"{self.artifact}: accuracy gate: {self.problem} ({where})"
        shortfalls = ", ".join(f"{name} {self.metrics.get(name, float('nan')):.4f} below {self.thresholds[name]:g}" for name in self.failed)
        return f"{self.artifact}: accuracy gate: {shortfalls or 'met'} ({where})"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "failed": self.failed}


def accuracy_data(plan: GatePlan | None, model: torch.nn.Module | None, tokenizer: Any = None) -> AccuracyData | None:
    """The recipe's accuracy data set, batched as the artifacts take it; None without a gate."""
    if plan is None:
        return None
    spec = plan.spec
    if spec.data.endswith(".safetensors"):
        return _tensor_batches(plan)
    texts = list(plan.texts) if spec.data == "texts" else read_texts(plan)
    if tokenizer is None:
        from aot.models import load_tokenizer

        tokenizer = load_tokenizer(plan.tokenizer)
    return _text_batches(plan, texts, tokenizer)


def read_texts(plan: GatePlan) -> list[str]:
    """The texts of the gate's .txt or .jsonl data file."""
    spec, path = plan.spec, plan.data_path
    lines = text_lines(path)
    if path.suffix == ".txt":
        return lines
    texts = []
    for number, line in enumerate(lines, 1):
        try:
            texts.append(str(json.loads(line)[spec.text_field]))
        except (ValueError, KeyError, TypeError):
            raise plan.locator.error(("validate", "accuracy", "data"), f"{path}:{number}: no '{spec.text_field}' field") from None
    return texts


def _batch_size(plan: GatePlan) -> int:
    """Examples per call: the recipe's batch_size within the first input's batch dim (its size when not dynamic)."""
    spec = plan.spec
    batch_name = plan.tensors[0].shape[0] if plan.tensors[0].shape else None
    batch_dim = plan.dims.get(batch_name) if isinstance(batch_name, str) else None
    if batch_dim is None:
        return spec.batch_size
    return min(spec.batch_size, batch_dim.max or spec.batch_size) if batch_dim.dynamic else batch_dim.size


def _sequence_dim(plan: GatePlan) -> DimSpec:
    """The sequence dim texts are tokenised to: the first input must be [batch_dim, sequence_dim]."""
    first = plan.tensors[0]
    if len(first.shape) != 2 or not all(isinstance(d, str) for d in first.shape):
        raise plan.locator.error(("inputs", "tensors", 0, "shape"), "an accuracy data set needs inputs shaped [batch_dim, sequence_dim]")
    return plan.dims[first.shape[1]]


def _text_batches(plan: GatePlan, texts: list[str], tokenizer: Any) -> AccuracyData:
    spec = plan.spec
    if len(texts) < 2:
        raise plan.locator.error(("validate", "accuracy", "data"), "an accuracy data set needs at least two examples")
    sequence, batch_size = _sequence_dim(plan), _batch_size(plan)
    fixed_sequence, longest = not sequence.dynamic, sequence.max if sequence.dynamic else sequence.size
    batches = []
    for start in range(0, len(texts), batch_size):
        chunk = _filled(texts[start : start + batch_size], batch_size, texts)
        encoded = tokenizer(chunk, padding="max_length" if fixed_sequence else "longest", truncation=True,
                            max_length=longest, return_tensors="pt")
        batches.append(_as_inputs(plan, encoded))
    source = "inputs.texts" if spec.data == "texts" else spec.data
    return AccuracyData(batches=batches, examples=len(texts), source=source)


def _filled(chunk: list[str], size: int, texts: list[str]) -> list[str]:
    """A last, short batch filled up to a fixed batch size with examples from the start (dropped from the metrics)."""
    return chunk + list(itertools.islice(itertools.cycle(texts), size - len(chunk)))


def _as_inputs(plan: GatePlan, encoded: Any) -> Batch:
    inputs = {}
    for index, tensor in enumerate(plan.tensors):
        if tensor.name not in encoded:
            raise plan.locator.error(("inputs", "tensors", index, "name"), f"the tokenizer gives no '{tensor.name}' (it gives: {', '.join(encoded)})")
        inputs[tensor.name] = encoded[tensor.name].to(getattr(torch, tensor.dtype)).to(plan.device)
    return inputs


def _tensor_batches(plan: GatePlan) -> AccuracyData:
    import safetensors.torch

    spec, path = plan.spec, plan.data_path
    try:
        tensors = safetensors.torch.load_file(str(path))
    except Exception as error:  # the library's own error types: a file of the user's that is no safetensors
        raise plan.locator.error(("validate", "accuracy", "data"), f"cannot read {path}: {error}") from None
    names = [tensor.name for tensor in plan.tensors]
    missing = [name for name in names if name not in tensors]
    if missing:
        raise plan.locator.error(("validate", "accuracy", "data"), f"{path} holds no tensor for input(s) {', '.join(missing)}")
    count = tensors[names[0]].shape[0]
    batch_size = _batch_size(plan)
    device = plan.device
    batches = [{name: tensors[name][start : start + batch_size].to(device) for name in names} for start in range(0, count, batch_size)]
    return AccuracyData(batches=batches, examples=count, source=spec.data)


def reference_outputs(run: Callable[[Batch], dict[str, Any]], data: AccuracyData) -> list[dict[str, torch.Tensor]]:
    with torch.no_grad():
        return [flatten_outputs(run(batch)) for batch in data.batches]


def measure(
    artifact: str, run: Callable[[Batch], Any], data: AccuracyData, expected: list[dict[str, torch.Tensor]], spec: AccuracySpec
) -> AccuracyResult:
    """``run`` on every batch, scored against eager's ``expected`` outputs."""
    thresholds = {name: value for name, value in spec.metrics.model_dump().items() if value is not None}
    result = AccuracyResult(artifact=artifact, examples=data.examples, source=data.source, thresholds=thresholds)
    try:
        with torch.no_grad():
            got = [flatten_outputs(_as_tensors(run(batch))) for batch in data.batches]
    except Exception as error:  # an artifact that fails on real data fails its gate
        result.problem = f"failed to run: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return result
    name = spec.output or next(iter(expected[0]))
    if name not in got[0]:
        result.problem = f"no output '{name}' (it has: {', '.join(got[0])})"
        return result
    result.metrics = _metrics(data, [e[name] for e in expected], [g[name] for g in got], spec, thresholds)
    return result


def _as_tensors(outputs: Any) -> Any:
    """ONNX Runtime's outputs come as numpy arrays by name."""
    if isinstance(outputs, dict):
        return {name: torch.as_tensor(value) if not isinstance(value, torch.Tensor) and hasattr(value, "shape") else value
                for name, value in outputs.items()}
    return outputs


def _metrics(data: AccuracyData, expected: list, got: list, spec: AccuracySpec, wanted: dict[str, float]) -> dict[str, float]:
    reference = torch.cat([pooled_vectors(e, b, spec.pooling) for e, b in zip(expected, data.batches)])[: data.examples]
    candidate = torch.cat([pooled_vectors(g, b, spec.pooling) for g, b in zip(got, data.batches)])[: data.examples]
    cosine = torch.nn.functional.cosine_similarity(reference, candidate, dim=1)
    metrics = {"cosine_mean": float(cosine.mean()), "cosine_min": float(cosine.min())}
    if "top1_agreement" in wanted:
        metrics["top1_agreement"] = _top1_agreement(expected, got, data)
    if "spearman" in wanted or len(reference) <= 4096:  # its cost grows with the square of the examples
        metrics["spearman"] = _spearman_of_similarities(reference, candidate)
    return metrics


def pooled_vectors(output: Any, batch: Batch, pooling: str) -> torch.Tensor:
    # On the CPU whatever device computed it: the metrics are CPU work, and a CUDA model's outputs meet the CPU masks here.
    values = torch.as_tensor(output).detach().to("cpu", torch.float64)
    if values.dim() == 2 or pooling == "none":
        return values.reshape(values.shape[0], -1)
    if pooling == "cls":
        return values[:, 0].reshape(values.shape[0], -1)
    mask = batch.get("attention_mask")
    weights = torch.ones(values.shape[:2], dtype=torch.float64) if mask is None else mask.to(torch.float64).cpu()
    weights = weights.reshape(*weights.shape, *([1] * (values.dim() - 2)))
    return ((values * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)).reshape(values.shape[0], -1)


def _top1_agreement(expected: list, got: list, data: AccuracyData) -> float:
    agree = total = 0
    for want, have, batch in zip(expected, got, data.batches):
        same = torch.as_tensor(want).argmax(dim=-1).cpu() == torch.as_tensor(have).argmax(dim=-1).cpu()
        mask = batch.get("attention_mask")
        if same.dim() == 2 and mask is not None:
            keep = mask.cpu().bool()
            agree, total = agree + int(same[keep].sum()), total + int(keep.sum())
        else:
            agree, total = agree + int(same.sum()), total + same.numel()
    return agree / max(total, 1)


def _spearman_of_similarities(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    from scipy.stats import spearmanr

    upper = torch.triu_indices(len(reference), len(reference), offset=1)

    def pairwise(vectors: torch.Tensor) -> torch.Tensor:
        unit = torch.nn.functional.normalize(vectors, dim=1)
        return (unit @ unit.T)[upper[0], upper[1]]

    if upper.shape[1] < 2:
        return float("nan")
    return float(spearmanr(pairwise(reference).numpy(), pairwise(candidate).numpy()).statistic)


@dataclass
class Gate:
    """A recipe's accuracy gate with eager's outputs on its data: :meth:`measure` scores one artifact."""

    spec: AccuracySpec
    data: AccuracyData
    expected: list[dict[str, torch.Tensor]]

    def measure(self, artifact: str, run: Callable[[Batch], Any]) -> AccuracyResult:
        return measure(artifact, run, self.data, self.expected, self.spec)


def make_gate(plan: GatePlan | None, eager: Callable[[Batch], Any], model: torch.nn.Module | None = None) -> Gate | None:
    """The recipe's gate, eager's reference taken (``eager(batch)`` runs the float32 eager model); None without one."""
    data = accuracy_data(plan, model)
    if data is None:
        return None
    return Gate(spec=plan.spec, data=data, expected=reference_outputs(eager, data))
