"""quantize_linear_weights' grids per layer: ``layers`` patterns, and ``auto``'s choice by measured fidelity."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from aot.errors import PassError
from aot.passes import QuantizeLinearWeights
from aot.passes._grid_search import FidelityProbe
from aot.passes._weight_grids import DEFAULT_AUTO_GRIDS, LayerGrid, layer_kind, stored_bytes
from aot.passes.base import CALIBRATION_KEY, FIDELITY_TARGET_KEY
from aot.runtime import WeightOnlyLinear
from tests.passes.helpers import fx_graph

F = nn.functional
VOCABULARY, WIDTH = 96, 128
GATE = {"kl_mean": 0.02, "kl_max": 0.2}  # the recipe's fidelity gate the build hands the pass
KEPT = {name: value * 0.5 for name, value in GATE.items()}  # what the weights may spend of it (auto_margin 0.5)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up_proj = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.down_proj = nn.Linear(2 * WIDTH, WIDTH, bias=False)

    def forward(self, h):
        return h + self.down_proj(F.silu(self.up_proj(h)))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCABULARY, WIDTH)
        self.layers = nn.ModuleList(_Block() for _ in range(3))
        self.norm = nn.LayerNorm(WIDTH)


class ToyDecoder(nn.Module):
    """Blocks of up and down projections, then an output projection: confident next-token distributions, and down
    projections with a few outlier input columns, which groups of 128 share a scale with (they need a finer grid)."""

    def __init__(self, last_logits_only: bool):
        super().__init__()
        self.model, self.lm_head, self.last_logits_only = _Model(), nn.Linear(WIDTH, VOCABULARY, bias=False), last_logits_only
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5)
            self.lm_head.weight.mul_(6)  # peaked distributions, as a trained model's
            for block in self.model.layers:
                block.down_proj.weight[:, ::16] *= 12

    def forward(self, input_ids):
        h = self.model.embed_tokens(input_ids)
        for block in self.model.layers:
            h = block(h)
        h = self.model.norm(h)
        if self.last_logits_only:
            h = h[:, -1:, :]
        return self.lm_head(h)


def _graph(last_logits_only: bool = True, target: dict | None = None):
    model = ToyDecoder(last_logits_only).eval()
    graph_module = fx_graph(model, torch.zeros(1, 12, dtype=torch.long))
    generator = torch.Generator().manual_seed(1)
    graph_module.meta[CALIBRATION_KEY] = [{"input_ids": torch.randint(0, VOCABULARY, (1, 12), generator=generator)} for _ in range(6)]
    graph_module.meta[FIDELITY_TARGET_KEY] = target if target is not None else dict(GATE)
    return graph_module


def _grids_of(graph_module) -> dict[str, str]:
    return {name: LayerGrid(bits=module.bits, group_size=module.group_size if module.bits == 4 else None).label
            for name, module in graph_module.named_modules() if isinstance(module, WeightOnlyLinear)}


def _float_scores(grids: dict[str, LayerGrid]):
    """The probe's scores of ``grids`` on a fresh float graph (the pass's result is judged apart from the pass)."""
    fresh = _graph()
    return FidelityProbe(fresh, fresh.meta[CALIBRATION_KEY], "lm_head", True, "integer").score(grids)


def test_layer_kinds_replace_the_layer_index():
    assert layer_kind("model.layers.13.mlp.down_proj") == "model.layers.*.mlp.down_proj"
    assert layer_kind("lm_head") == "lm_head" and layer_kind("h.2.attn.c_attn") == "h.*.attn.c_attn"


def test_stored_bytes_are_the_buffers_the_artifacts_hold():
    linear = nn.Linear(256, 64)
    assert stored_bytes(linear, LayerGrid(bits=8), True, "integer") == 64 * 256 + 64 * 4
    assert stored_bytes(linear, LayerGrid(bits=4, group_size=128), True, "integer") == 64 * 128 + 64 * 2 * 4
    assert stored_bytes(linear, LayerGrid(bits=4, group_size=32), False, "float") == 64 * 128 + 2 * 64 * 8 * 4
    costs = [stored_bytes(linear, grid, True, "integer") for grid in DEFAULT_AUTO_GRIDS]
    assert costs == sorted(costs), "the default candidates go from fewest bytes to most"


def test_a_grid_names_a_group_size_only_for_int4():
    with pytest.raises(ValidationError, match="group_size is for int4 grids"):
        LayerGrid(bits=8, group_size=32)


def test_layers_patterns_give_named_layers_their_own_grid_the_first_match_winning():
    graph_module = _graph()
    pass_ = QuantizeLinearWeights(bits=4, group_size=64, layers={
        "*.down_proj": {"bits": 8}, "model.layers.0.*": {"bits": 4, "group_size": 32}, "lm_head": {"bits": 4, "group_size": 128}})
    result = pass_.apply(graph_module)
    assert result.modified and result.changed == 7
    grids = _grids_of(result.graph_module)
    assert grids == {
        "model.layers.0.up_proj": "int4_g32", "model.layers.0.down_proj": "int8",  # '*.down_proj' comes first
        "model.layers.1.up_proj": "int4_g64", "model.layers.1.down_proj": "int8",
        "model.layers.2.up_proj": "int4_g64", "model.layers.2.down_proj": "int8", "lm_head": "int4_g128"}
    assert not result.findings, "only auto reports findings"


@pytest.mark.parametrize("last_logits_only", [True, False])
def test_auto_takes_the_fewest_bytes_that_keep_the_target_and_no_kind_can_take_fewer(last_logits_only):
    graph_module = _graph(last_logits_only)
    result = QuantizeLinearWeights(auto=True).apply(graph_module)
    findings = result.findings["auto"]
    kinds = findings["kinds"]
    assert set(kinds) == {"model.layers.*.up_proj", "model.layers.*.down_proj", "lm_head"} and result.changed == 7
    chosen = {kind: value["chosen"] for kind, value in kinds.items()}
    assert len(set(chosen.values())) > 1, f"precondition: the kinds differ in what they need ({chosen})"
    grids = _grids_of(result.graph_module)
    assert all(grids[layer] == chosen[layer_kind(layer)] for layer in grids), "every layer on its kind's choice"
    assert not any(node.meta.get("aot_weight_grid") for node in result.graph_module.graph.nodes), "no state left behind"

    labels = {grid.label: grid for grid in DEFAULT_AUTO_GRIDS}
    layers = {kind: [layer for layer in grids if layer_kind(layer) == kind] for kind in kinds}

    def scores(choice: dict[str, str]):
        return _float_scores({layer: labels[choice[kind]] for kind, named in layers.items() for layer in named})

    measured = scores(chosen)
    assert measured.kl_mean <= KEPT["kl_mean"] and measured.kl_max <= KEPT["kl_max"], measured
    assert findings["target"] == KEPT
    assert findings["measured"] == measured.to_json(), "the manifest's figures are the choice's"
    for kind, value in kinds.items():  # no kind alone can move to fewer bytes and keep the target
        for label, figures in value["grids"].items():
            if figures["bytes"] < value["grids"][chosen[kind]]["bytes"]:
                cheaper = scores({**chosen, kind: label})
                assert cheaper.kl_mean > KEPT["kl_mean"] or cheaper.kl_max > KEPT["kl_max"], (kind, label, cheaper)


def test_auto_is_no_worse_in_bytes_than_any_single_grid_that_keeps_the_target():
    result = QuantizeLinearWeights(auto=True).apply(_graph())
    auto_bytes = result.findings["auto"]["bytes"]
    fresh = _graph()
    layers = [name for name, module in fresh.named_modules() if isinstance(module, nn.Linear)]
    for grid in DEFAULT_AUTO_GRIDS:
        score = _float_scores({layer: grid for layer in layers})
        if score.kl_mean <= KEPT["kl_mean"] and score.kl_max <= KEPT["kl_max"]:
            uniform = sum(stored_bytes(fresh.get_submodule(layer), grid, True, "integer") for layer in layers)
            assert auto_bytes <= uniform, (grid.label, auto_bytes, uniform)


def test_a_loose_target_takes_the_fewest_bytes_everywhere():
    result = QuantizeLinearWeights(auto=True).apply(_graph(target={"kl_mean": 100.0}))
    assert {value["chosen"] for value in result.findings["auto"]["kinds"].values()} == {"int4_g128"}
    assert len(result.findings["auto"]["tries"]) == 1


def test_a_target_no_grid_keeps_leaves_every_kind_on_its_most_precise_grid_and_says_so():
    result = QuantizeLinearWeights(auto=True).apply(_graph(target={"kl_mean": 1e-12}))
    assert {value["chosen"] for value in result.findings["auto"]["kinds"].values()} == {"int8"}
    assert result.findings["auto"]["target_met"] is False
    assert QuantizeLinearWeights(auto=True).apply(_graph()).findings["auto"]["target_met"] is True


def test_a_kind_no_candidate_fits_takes_the_pass_grid_and_is_named():
    result = QuantizeLinearWeights(auto=True, auto_grids=[{"bits": 4, "group_size": 256}]).apply(_graph())
    auto = result.findings["auto"]
    assert auto["no_candidate_fits"] == ["model.layers.*.up_proj", "lm_head"], "128 inputs hold no group of 256"
    assert list(auto["kinds"]) == ["model.layers.*.down_proj"]
    grids = _grids_of(result.graph_module)
    assert grids["model.layers.0.up_proj"] == "int4_g32" and grids["model.layers.0.down_proj"] == "int4_g256"


def test_auto_leaves_layers_that_patterns_name_and_skip_out_of_its_choice():
    result = QuantizeLinearWeights(auto=True, layers={"lm_head": {"bits": 8}}, skip=["model.layers.2.*"]).apply(_graph())
    assert set(result.findings["auto"]["kinds"]) == {"model.layers.*.up_proj", "model.layers.*.down_proj"}
    assert result.findings["auto"]["kinds"]["model.layers.*.up_proj"]["layers"] == 2
    grids = _grids_of(result.graph_module)
    assert grids["lm_head"] == "int8" and "model.layers.2.up_proj" not in grids


@pytest.mark.parametrize("meta, message", [
    ({CALIBRATION_KEY: None}, "auto needs calibration texts"),
    ({FIDELITY_TARGET_KEY: {}}, "auto needs a fidelity gate to keep"),
])
def test_auto_without_texts_or_a_gate_is_a_pass_error(meta, message):
    graph_module = _graph()
    graph_module.meta.update(meta)
    with pytest.raises(PassError, match=message):
        QuantizeLinearWeights(auto=True).apply(graph_module)


def test_candidates_are_tried_fewest_bytes_first_whatever_their_order():
    shuffled = [DEFAULT_AUTO_GRIDS[i] for i in (3, 0, 2, 1)]
    first = QuantizeLinearWeights(auto=True).apply(_graph()).findings["auto"]
    again = QuantizeLinearWeights(auto=True, auto_grids=[grid.model_dump() for grid in shuffled]).apply(_graph()).findings["auto"]
    assert {k: v["chosen"] for k, v in first["kinds"].items()} == {k: v["chosen"] for k, v in again["kinds"].items()}
    for kind in first["kinds"].values():
        costs = [figures["bytes"] for figures in kind["grids"].values()]
        assert len(costs) == 4 and costs == sorted(costs)


def test_texts_of_several_lengths_are_scored_in_one_call_as_they_are_one_a_call(monkeypatch):
    import transformers

    from aot.passes import _grid_search
    from aot.tracing import symbolic_trace

    config = transformers.LlamaConfig(vocab_size=VOCABULARY, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # peaked distributions, as a trained model's
    graph_module = symbolic_trace(model, input_names=["input_ids", "attention_mask", "position_ids"])
    generator = torch.Generator().manual_seed(2)
    texts = []
    for length in (5, 12, 9, 12):
        ids = torch.randint(0, VOCABULARY, (1, length), generator=generator)
        texts.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(length)[None]})
    batched, scored = _grid_search.one_batch(texts)
    assert len(batched) == 1 and batched[0]["input_ids"].shape == (4, 12) and int(scored.sum()) == 38, "precondition: one padded call"
    grids = {name: LayerGrid(bits=4, group_size=32) for name, module in model.named_modules() if isinstance(module, nn.Linear)}

    together = FidelityProbe(graph_module, texts, "lm_head", True, "integer")
    monkeypatch.setattr(_grid_search, "LOGITS_BYTES", 4 * VOCABULARY * 5)  # the logits of 5 positions at a time
    in_chunks = FidelityProbe(graph_module, texts, "lm_head", True, "integer")
    monkeypatch.setattr(_grid_search, "one_batch", lambda inputs: (inputs, None))
    apart = FidelityProbe(graph_module, texts, "lm_head", True, "integer")
    assert together.positions == in_chunks.positions == apart.positions == 38 and len(in_chunks.reference) == 8
    for left, right in ((together.score(grids), apart.score(grids)), (together.score({}), apart.score({})),
                        (together.score(grids), in_chunks.score(grids))):
        assert left.top1_agreement == right.top1_agreement
        assert left.kl_mean == pytest.approx(right.kl_mean, rel=1e-3, abs=1e-7)
        assert left.kl_max == pytest.approx(right.kl_max, rel=1e-3, abs=1e-7)
    assert together.score(grids).kl_mean > 10 * together.score({}).kl_mean, "precondition: the grids change the scores"
