"""``quantize_linear_weights`` with ``auto: true``: each layer kind's grid chosen by measured fidelity.

On the recipe's calibration texts (their prefills, in one call: :func:`one_batch`), the graph as the pass gets it
gives the reference: the next-token distribution ``p_t`` at every position ``t`` of every text. A probe then rounds the weights of some
layers to a grid (the codes and scales the artifacts store, multiplied in float32: the weights' error alone) and
scores the distributions ``q_t`` it gives as the fidelity gate does (:mod:`aot.decoding.fidelity`)::

    kl_mean = mean_t KL(p_t || q_t),   kl_max = max_t KL(p_t || q_t),   top1_agreement = mean_t [argmax q_t = argmax p_t]

1. **Sensitivity**: each kind alone on each candidate grid, every other layer float.
2. **Choice**: each kind starts on its fewest-bytes grid. Measured alone, a kind spends a share of the target
   (``e = max(kl_mean / target_kl_mean, kl_max / target_kl_max, (1 - top1) / (1 - target_top1))``); errors of
   small perturbations add up, so while the kinds' shares sum past 1, the kind whose next grid buys the most share
   per byte moves to it.
3. **Proof**: every kind on its chosen grid at once, measured; while that misses the target, the next upgrade by
   the same rule, measured again. A target no candidate meets leaves every kind on its most precise grid, noted:
   the build's fidelity gate then decides.
4. **Trim**: once the target is met, each kind in turn (the most bytes first) tries its cheaper grids, cheapest
   first, and keeps the first that still meets the target measured with every other kind as chosen. So no kind
   can move to fewer bytes alone and keep the target.

The target is the recipe's gate (``generation.fidelity``) times ``auto_margin``: the rest of the gate is left to
each runtime's rounding of the activations, which this probe does not do (the artifacts' int8 activations measured
KL 0.0065 against 0.0013 for their weights alone on SmolLM2-135M's int4 build).

Logits are the output projection's product on the hidden states at every position (a step that keeps the last
position's logits only slices those states first); a model that scales or caps its logits after the projection
is scored before that.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Interpreter, Node

from aot.errors import PassError
from aot.runtime.weight_only_linear import WeightOnlyLinear

from ._weight_grids import LayerGrid

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Score:
    kl_mean: float
    kl_max: float
    top1_agreement: float

    def share(self, target: Mapping[str, float]) -> float:
        """How much of ``target`` this score spends: 1.0 is all of it (the largest ratio over the metrics given)."""
        shares = [0.0]
        if "kl_mean" in target:
            shares.append(self.kl_mean / target["kl_mean"])
        if "kl_max" in target:
            shares.append(self.kl_max / target["kl_max"])
        if "top1_agreement" in target:
            shares.append((1 - self.top1_agreement) / max(1 - target["top1_agreement"], 1e-9))
        return max(shares)

    def to_json(self) -> dict[str, float]:
        return {name: round(value, 6) for name, value in asdict(self).items()}


class FidelityProbe:
    """The graph's next-token log-probabilities on the calibration inputs, with chosen layers on chosen grids."""

    def __init__(self, graph_module: GraphModule, inputs: list[dict[str, torch.Tensor]], head: str, symmetric: bool, zero_point: str):
        self.texts = len(inputs)
        self.inputs, self.scored = one_batch(inputs)
        self.graph_module, self.head = graph_module, head
        self.at_once = max(1, LOGITS_BYTES // (4 * graph_module.get_submodule(head).out_features))  # positions scored at once
        self.symmetric, self.zero_point = symmetric, zero_point
        self.hidden = _head_input(graph_module, head)
        self.placeholders = [node for node in graph_module.graph.nodes if node.op == "placeholder"]
        self.reference = [torch.log_softmax(logits, dim=-1).to(torch.float16) for logits in self._logits()]
        self.positions = sum(reference.shape[0] for reference in self.reference)

    def score(self, grids: Mapping[str, LayerGrid]) -> Score:
        """The scores with each layer of ``grids`` (module paths) on its grid, every other layer as it is."""
        kl_sum, kl_max, agree = 0.0, 0.0, 0
        with self._rounded(grids):
            for reference, logits in zip(self.reference, self._logits()):
                p_log = reference.float()
                q_log = torch.log_softmax(logits, dim=-1)
                kl = (p_log.exp() * (p_log - q_log)).sum(-1).clamp_min(0)
                kl_sum, kl_max = kl_sum + float(kl.sum()), max(kl_max, float(kl.max()))
                agree += int((p_log.argmax(-1) == q_log.argmax(-1)).sum())
        return Score(kl_sum / self.positions, kl_max, agree / self.positions)

    def _logits(self) -> Iterator[torch.Tensor]:
        """``(positions, vocabulary)`` float32 logits of the texts' positions, a bounded number of positions at a time
        (a 1B decoder's vocabulary makes half a gigabyte of them for 1,000 positions, and scoring copies them)."""
        head = self.graph_module.get_submodule(self.head)
        with torch.no_grad():
            for hidden in _run_in_lockstep(self.graph_module, self.hidden, self.inputs, self.placeholders):
                rows = hidden.reshape(-1, hidden.shape[-1])
                for chunk in (rows if self.scored is None else rows[self.scored]).split(self.at_once):
                    yield head(chunk).float()

    @contextmanager
    def _rounded(self, grids: Mapping[str, LayerGrid]) -> Iterator[None]:
        """Each layer of ``grids`` multiplies by its weight as rounded to its grid: quantised once, widened to float32
        once a run (every input takes a node in turn, :func:`_run_in_lockstep`), and let go after it."""
        patched = []
        try:
            for target, grid in grids.items():
                linear = self.graph_module.get_submodule(target)
                symmetric, zero_point = grid.encoding(self.symmetric, self.zero_point)
                rounded = WeightOnlyLinear.from_linear(linear, grid.bits, grid.groups, symmetric, "float", zero_point=zero_point)
                linear.forward = _RoundedForward(rounded, linear.bias)
                patched.append(linear)
            yield
        finally:
            for linear in patched:
                del linear.forward  # the class's forward again


LOGITS_BYTES = 64 * 2**20  # float32 logits scored at once

SEQUENCE_INPUTS = ("input_ids", "attention_mask", "position_ids")  # a decoder step's (aot.decoding.names)


def one_batch(inputs: list[dict[str, torch.Tensor]]) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor | None]:
    """The calibration texts (one a call, batch 1) as one call, and which of its positions are the texts' own (None:
    all of them); or the texts as they are, with None, where they cannot be one call.

    One call reads each weight once for all the texts, where one a call reads it once a text: a probe of a 1B decoder
    reads gigabytes of float32 weights a text. Texts of one shape are stacked. Texts of several lengths are padded at
    the end (ids 0, attention_mask 0, positions counting on), which leaves every position of a text as it was: the
    causal mask lets a position see only those before it, all the text's own, and each row is its own sequence. The
    padding's positions are left out of the scores. Texts without an attention_mask to pad, or with a past, stay apart.
    """
    if len(inputs) < 2 or any(given.keys() != inputs[0].keys() for given in inputs):
        return inputs, None
    if all(given[name].shape == inputs[0][name].shape for given in inputs for name in given):
        return [{name: torch.cat([given[name] for given in inputs]) for name in inputs[0]}], None
    lengths = [given["input_ids"].shape[-1] if "input_ids" in given else -1 for given in inputs]
    if "attention_mask" not in inputs[0] or any(given["attention_mask"].shape[-1] != length for given, length in zip(inputs, lengths)):
        return inputs, None  # nothing to pad with, or a past (the mask spans it)
    longest = max(lengths)
    batched = {}
    for name in inputs[0]:
        if name not in SEQUENCE_INPUTS:
            batched[name] = torch.cat([given[name] for given in inputs])  # the pasts, empty
            continue
        rows = []
        for given, length in zip(inputs, lengths):
            value = given[name]
            after = torch.arange(1, longest - length + 1, dtype=value.dtype) + value[:, -1:] if name == "position_ids" \
                else value.new_zeros((value.shape[0], longest - length))
            rows.append(torch.cat([value, after], dim=-1))
        batched[name] = torch.cat(rows)
    scored = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
    return [batched], scored.reshape(-1)


class _RoundedForward:
    """``x · Wᵀ + b`` with ``W`` a rounded layer's float32 weight, widened at its first call and kept until ``release``."""

    def __init__(self, rounded: WeightOnlyLinear, bias: torch.Tensor | None):
        self.rounded, self.bias, self.weight = rounded, bias, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            self.weight = self.rounded.dequantized_weight()
        return F.linear(x, self.weight.to(x.dtype), self.bias)

    def release(self) -> None:
        self.weight = None


def _run_in_lockstep(graph_module: GraphModule, stop: Node, inputs: list[dict[str, torch.Tensor]], placeholders: list[Node]) -> list[torch.Tensor]:
    """``stop``'s value for each of ``inputs``: the graph run node by node, each node for every input in turn, up to
    ``stop``. A rounded layer's weight is widened once for all inputs and let go after its node (one layer's float32
    weight at a time); each value is freed after its last reader, as fx's Interpreter does."""
    # The first run works out, as fx's Interpreter does for its own loop, after which node each value is read no more.
    runs = [Interpreter(graph_module, garbage_collect_values=index == 0) for index in range(len(inputs))]
    last_readers = runs[0].user_to_last_uses
    for run, given in zip(runs, inputs):
        run.args_iter = iter([given[node.target] if node.target in given else node.args[0] for node in placeholders])
    for node in graph_module.graph.nodes:
        for run in runs:
            run.env[node] = run.run_node(node)
            for read in last_readers.get(node, ()):
                if read is not stop:
                    del run.env[read]
        if node.op == "call_module":
            forward = getattr(graph_module.get_submodule(node.target), "forward", None)
            if isinstance(forward, _RoundedForward):
                forward.release()
        if node is stop:
            return [run.env[stop] for run in runs]
    raise PassError(f"auto: the graph never computed '{stop.name}', the output projection's input")


def _head_input(graph_module: GraphModule, head: str) -> Node:
    """The node whose value, at every position, the output projection ``head`` is applied to: its input, before the
    slices a step that keeps the last position's logits takes of it."""
    calls = [node for node in graph_module.graph.nodes if node.op == "call_module" and node.target == head]
    if len(calls) != 1 or not isinstance(calls[0].args[0], Node):
        raise PassError(f"auto: the output projection '{head}' is called {len(calls)} times; auto scores a graph that calls it once")
    node = calls[0].args[0]
    while node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], Node):
        node = node.args[0]
    return node


@dataclass
class KindChoice:
    layers: list[str]  # module paths
    grids: list[LayerGrid]  # candidates that fit, fewest bytes first
    bytes: dict[str, int]  # grid label -> the kind's bytes on it
    alone: dict[str, Score]  # grid label -> the scores with only this kind rounded to it
    chosen: int = 0  # index into grids

    @property
    def grid(self) -> LayerGrid:
        return self.grids[self.chosen]

    def to_json(self) -> dict:
        return {"layers": len(self.layers), "chosen": self.grid.label,
                "grids": {grid.label: {"bytes": self.bytes[grid.label], **self.alone[grid.label].to_json()} for grid in self.grids}}


def choose_grids(probe: FidelityProbe, kinds: dict[str, KindChoice], target: Mapping[str, float], rounds: int = 8) -> tuple[Score, list[dict]]:
    """Chooses each kind's grid (``KindChoice.chosen``, in place); the final measured score and each measured try."""
    for name, kind in kinds.items():
        for grid in kind.grids:
            kind.alone[grid.label] = probe.score({layer: grid for layer in kind.layers})
            logger.info("auto: %s on %s alone: %s", name, grid.label, kind.alone[grid.label])
    while sum(_share(kind, target) for kind in kinds.values()) > 1 and _upgrade(kinds, target):
        pass
    tries: list[dict] = []
    measured = _measure(probe, kinds, tries)
    for _ in range(rounds):
        if measured.share(target) <= 1 or not _upgrade(kinds, target):
            break
        measured = _measure(probe, kinds, tries)
    if measured.share(target) <= 1:
        measured = _trim(probe, kinds, target, measured, tries)
    return measured, tries


def _measure(probe: FidelityProbe, kinds: dict[str, KindChoice], tries: list[dict]) -> Score:
    measured = probe.score({layer: kind.grid for kind in kinds.values() for layer in kind.layers})
    tries.append({"grids": {name: kind.grid.label for name, kind in kinds.items()}, **measured.to_json()})
    logger.info("auto: every kind on its grid: %s", measured)
    return measured


def _trim(probe: FidelityProbe, kinds: dict[str, KindChoice], target: Mapping[str, float], measured: Score, tries: list[dict]) -> Score:
    """Each kind, the most bytes first, on the cheapest of its cheaper grids that keeps ``target`` (see the module doc)."""
    for kind in sorted(kinds.values(), key=lambda kind: -kind.bytes[kind.grid.label]):
        chosen = kind.chosen
        for index in range(chosen):
            kind.chosen = index
            cheaper = _measure(probe, kinds, tries)
            if cheaper.share(target) <= 1:
                measured = cheaper
                break
            kind.chosen = chosen
    return measured


def _share(kind: KindChoice, target: Mapping[str, float], index: int | None = None) -> float:
    return kind.alone[kind.grids[kind.chosen if index is None else index].label].share(target)


def _upgrade(kinds: dict[str, KindChoice], target: Mapping[str, float]) -> bool:
    """Moves the kind whose next grids buy the most share of the target per byte; False when none buys any."""
    best, best_rate = None, 0.0
    for kind in kinds.values():
        now = _share(kind, target)
        for index in range(kind.chosen + 1, len(kind.grids)):
            gained = now - _share(kind, target, index)
            extra = kind.bytes[kind.grids[index].label] - kind.bytes[kind.grid.label]
            rate = gained / max(extra, 1)
            if gained > 0 and rate > best_rate:
                best, best_rate = (kind, index), rate
    if best is None:
        return False
    best[0].chosen = best[1]
    return True
