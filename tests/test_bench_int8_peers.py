"""The int8 peers of aot bench: what their models hold, that they run close to eager, and how --peers names them."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import onnx
import pytest
import torch
from transformers import BertConfig, BertModel

from aot.bench.int8_peers import quantize_torch_dynamic
from aot.bench.peer_groups import ALL_PEERS, INT8_PEERS, ONNX_PEERS, peer_names
from aot.bench.peers import build_peer, write_peer_onnx

AXES = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
SHAPES = [(1, 5), (2, 8), (3, 12)]
# int8 is not exact; a broken model (a wrong scale, a transposed weight) lands far below this.
MIN_COSINE = 0.99


@pytest.fixture(scope="module")
def bert() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128)
    return BertModel(config).eval()


def make_inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    mask = torch.ones(batch, sequence, dtype=torch.long)
    mask[0, -2:] = 0  # a padded row: the mask has to reach attention in every peer
    return {"input_ids": torch.randint(0, 128, (batch, sequence), generator=generator), "attention_mask": mask}


def last_hidden_state(result) -> torch.Tensor:
    """The first output of an ONNX Runtime run (numpy arrays) or of an HF model."""
    first = result[0] if isinstance(result, (list, tuple)) else result.last_hidden_state
    return torch.as_tensor(first)


def eager_reference(model: BertModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).last_hidden_state


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def op_counts(path: Path) -> Counter:
    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def test_the_torchscript_export_leaves_the_eager_model_in_eval_mode(bert, tmp_path):
    inputs = make_inputs(2, 8)
    before = eager_reference(bert, inputs)
    assert not bert.training
    write_peer_onnx("ort_torchscript", bert, inputs, AXES, tmp_path)
    assert not bert.training, "the exporter put its wrapper's training mode onto the eager model (dropout on)"
    assert torch.equal(eager_reference(bert, inputs), before)


def test_ort_quantize_dynamic_quantises_every_matmul_of_the_torchscript_export(bert, tmp_path):
    inputs = make_inputs(2, 8)
    fp32_path = write_peer_onnx("ort_torchscript", bert, inputs, AXES, tmp_path)
    fp32 = op_counts(fp32_path)
    # 6 Linears a layer, plus Q @ K^T and P @ V in each layer; the pooler's Linear (on 2-d input) is a Gemm.
    assert fp32["MatMul"] == 2 * 6 + 2 * 2 and fp32["Gemm"] == 1, fp32
    assert fp32["MatMulInteger"] == fp32["DynamicQuantizeLinear"] == 0, fp32
    written = fp32_path.stat().st_mtime_ns

    int8_path = write_peer_onnx("ort_quantize_dynamic", bert, inputs, AXES, tmp_path)
    int8 = op_counts(int8_path)
    assert fp32_path.stat().st_mtime_ns == written, "the TorchScript export is reused, not written again"
    # ONNX Runtime's dynamic quantiser makes Gemms MatMuls first; like Optimum's, this peer quantises
    # attention's activation x activation MatMuls too (MatMulConstBOnly off).
    assert int8["MatMulInteger"] == fp32["MatMul"] + fp32["Gemm"] and int8["MatMul"] == int8["Gemm"] == 0, int8
    assert int8["DynamicQuantizeLinear"] >= int8["MatMulInteger"] // 2, int8
    model = onnx.load(str(int8_path))
    tables = {t.name: t.data_type for t in model.graph.initializer if len(t.dims) == 2}
    assert Counter(tables.values()) == {onnx.TensorProto.INT8: 2 * 6 + 1, onnx.TensorProto.UINT8: 3}, tables
    # The three embedding tables (Gather) are stored in 8 bits too, and dequantised after the lookup.
    assert all("embeddings" in name for name, kind in tables.items() if kind == onnx.TensorProto.UINT8), tables
    assert int8["DequantizeLinear"] == 3, int8
    onnx.checker.check_model(model, full_check=True)


def test_torch_ao_dynamic_holds_dynamic_int8_linears_and_leaves_the_eager_model_alone(bert):
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    linears = [name for name, module in bert.named_modules() if type(module) is torch.nn.Linear]
    assert len(linears) == 2 * 6 + 1

    quantized = quantize_torch_dynamic(bert)

    kinds = {name: type(module) for name, module in quantized.named_modules()}
    assert {kinds[name] for name in linears} == {DynamicLinear}
    assert not any(kind is torch.nn.Linear for kind in kinds.values())
    assert {quantized.get_submodule(name).weight().dtype for name in linears} == {torch.qint8}
    assert [name for name, module in bert.named_modules() if type(module) is torch.nn.Linear] == linears, "eager untouched"
    assert not quantized.training


@pytest.mark.parametrize("peer", INT8_PEERS)
def test_int8_peer_runs_close_to_eager_at_three_shapes(bert, tmp_path, peer):
    runner = build_peer(peer, bert, make_inputs(2, 8), AXES, tmp_path, threads=1)
    for batch, sequence in SHAPES:
        inputs = make_inputs(batch, sequence)
        expected = eager_reference(bert, inputs)
        with torch.inference_mode():
            got = last_hidden_state(runner(inputs))
        assert got.shape == expected.shape
        assert cosine(got, expected) > MIN_COSINE, (peer, batch, sequence, cosine(got, expected))
        assert not torch.equal(got, expected), f"{peer} gave eager's exact numbers: nothing was quantised"


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_ort_quantiser_logs_on_the_root_logger_and_the_peer_neither_shows_them_nor_configures_logging(bert, tmp_path):
    from onnxruntime.quantization import quantize_dynamic

    root = logging.getLogger()
    source = write_peer_onnx("ort_torchscript", bert, make_inputs(2, 8), AXES, tmp_path)
    saved = root.handlers[:], root.filters[:]
    try:
        root.handlers = []
        quantize_dynamic(str(source), str(tmp_path / "bare.onnx"))
        assert root.handlers, "ONNX Runtime's quantiser no longer calls logging.basicConfig: the NullHandler may go"
        root.handlers = []
        write_peer_onnx("ort_quantize_dynamic", bert, make_inputs(2, 8), AXES, tmp_path)
        assert root.handlers == []

        recorder = Recorder()
        root.handlers = [recorder]
        quantize_dynamic(str(source), str(tmp_path / "bare_again.onnx"))
        assert any(record.name == "root" and record.levelno == logging.WARNING for record in recorder.records)
        recorder.records.clear()
        (tmp_path / "torchscript_int8.onnx").unlink()
        write_peer_onnx("ort_quantize_dynamic", bert, make_inputs(2, 8), AXES, tmp_path)
        assert (tmp_path / "torchscript_int8.onnx").is_file() and recorder.records == []
        assert root.filters == saved[1], "the filter is the block's alone"
    finally:
        root.handlers, root.filters = saved


def test_peers_option_names_the_int8_group_and_its_peers():
    assert peer_names("int8") == INT8_PEERS == ("ort_quantize_dynamic", "torch_ao_dynamic")
    assert peer_names("ort_quantize_dynamic, torch_ao_dynamic") == INT8_PEERS
    assert set(INT8_PEERS) <= set(peer_names("all")) == set(ALL_PEERS)
    assert not set(INT8_PEERS) & set(peer_names("onnx")), "'onnx' stays the fp32 ONNX Runtime peers"
    assert peer_names("onnx") == ONNX_PEERS and peer_names("") == ()
    assert peer_names("torch_ao_dynamic, onnx,int8") == ("torch_ao_dynamic", *ONNX_PEERS, "ort_quantize_dynamic")
    with pytest.raises(ValueError, match=r"unknown peer\(s\) int4; known: .*ort_quantize_dynamic, torch_ao_dynamic.*groups: .*int8"):
        peer_names("int8,int4")


def test_cli_rejects_an_unknown_peer_naming_the_int8_ones(cli, tmp_path):
    result = cli("bench", tmp_path, "--peers", "torch_ao_dynamic,int4")
    assert result.exit_code == 2 and "unknown peer(s) int4" in result.stderr, result.described
    assert "ort_quantize_dynamic" in result.stderr and "int8" in result.stderr, result.described


@pytest.mark.artifact
def test_bench_times_the_int8_peers(cli, tiny_build):
    result = cli("bench", tiny_build, "--peers", "int8", "--runs", "2", "--warmup", "1", "--gap-ms", "0", "--in-process", "--json")
    assert result.exit_code == 0, result.described
    report = json.loads(result.stdout)
    assert report["peer_failures"] == {}
    assert [figures["runner"] for figures in report["shapes"][0]["runners"]][-2:] == list(INT8_PEERS)
