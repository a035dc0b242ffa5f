"""FlatCacheDecoder as ONNX: the convention's names and axes, a valid model, eager's tokens in ONNX Runtime.

The first loop here is written against onnxruntime and numpy alone, so that the file is held
to the convention itself, not to aot's reading of it; ``OnnxStep`` must then agree.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from aot.decoding.export_spec import export_onnx
from aot.decoding.greedy import first_divergence, greedy_generate
from aot.decoding.onnx_step import OnnxStep
from tests.decoding.test_flat_cache import assert_same_tokens
from tests.decoding.zoo import MODELS, NEW_TOKENS, WINDOW, decoder, eager_generate, program, prompts


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    made = {}

    def path(name: str):
        if name not in made:
            made[name] = export_onnx(decoder(name), tmp_path_factory.mktemp(name) / "decoder.onnx", program=program(name))
        return made[name]

    return path


def ort_greedy(path, input_ids: np.ndarray, attention_mask: np.ndarray, new_tokens: int) -> np.ndarray:
    """Greedy decoding with a plain InferenceSession: empty past, then one token a step, positions as generate counts them."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {value.name: value for value in session.get_inputs()}
    outputs = [value.name for value in session.get_outputs()]
    batch = input_ids.shape[0]
    past = {
        name: np.zeros((batch, value.shape[1], 0, value.shape[3]), dtype=np.float32)
        for name, value in inputs.items()
        if name.startswith("past_key_values.")
    }
    mask = attention_mask.astype(np.int64)
    positions = np.where(mask == 1, np.cumsum(mask, axis=-1) - 1, 0)
    tokens, step_ids = input_ids, input_ids
    for _ in range(new_tokens):
        feed = {"input_ids": step_ids, "attention_mask": mask, "position_ids": positions, **past}
        result = dict(zip(outputs, session.run(outputs, feed)))
        next_tokens = result["logits"][:, -1, :].argmax(axis=-1).astype(np.int64)
        tokens = np.concatenate([tokens, next_tokens[:, None]], axis=1)
        past = {name: result[name.replace("past_key_values", "present")] for name in past}
        step_ids, positions = next_tokens[:, None], positions[:, -1:] + 1
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
    return tokens


@pytest.mark.artifact
@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_model_is_valid_and_named_by_the_convention(name, onnx_file):
    path = onnx_file(name)
    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path), load_external_data=False).graph
    assert [value.name for value in graph.input] == decoder(name).input_names()
    assert [value.name for value in graph.output] == decoder(name).output_names()
    dims = {value.name: [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim] for value in graph.input}
    sliding = decoder(name).windows[0] is not None
    past_length = "past_window_sequence" if sliding else "past_sequence"
    heads = 4 if name == "gpt2" else 2
    assert dims["input_ids"] == dims["position_ids"] == ["batch", "sequence"]
    assert dims["attention_mask"] == ["batch", "total_sequence"]
    assert dims["past_key_values.1.value"] == ["batch", heads, past_length, 16]
    outputs = {value.name: [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim] for value in graph.output}
    present_length = f"Min({WINDOW - 1}, sequence + past_window_sequence)" if sliding else "sequence + past_sequence"
    assert outputs["present.1.key"] == ["batch", heads, present_length, 16]
    assert outputs["logits"] == ["batch", "sequence", 128]


@pytest.mark.artifact
@pytest.mark.parametrize("name", list(MODELS))
def test_plain_onnx_runtime_loop_generates_eager_tokens(name, onnx_file):
    path = onnx_file(name)
    for label, ids, mask in prompts():
        expected = eager_generate(decoder(name).model, ids, mask).numpy()
        actual = ort_greedy(path, ids.numpy(), mask.numpy(), NEW_TOKENS)
        differing = np.argwhere(expected != actual)
        assert differing.size == 0, f"onnxruntime: tokens differ from eager generate for '{label}' at (row, position) {differing[0].tolist()}"


@pytest.mark.artifact
@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_step_generates_eager_tokens(name, onnx_file):
    step = OnnxStep(onnx_file(name))
    assert step.past_layout == decoder(name).past_layout
    assert_same_tokens("OnnxStep", step, decoder(name).model, step.past_layout)


@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_step_runs_a_one_token_prompt(name, onnx_file):
    step = OnnxStep(onnx_file(name))
    ids, mask = torch.tensor([[7]]), torch.tensor([[1]])
    expected = eager_generate(decoder(name).model, ids, mask, new_tokens=4)
    actual = greedy_generate(step, ids, mask, 4, past_layout=step.past_layout)
    divergence = first_divergence(expected, actual, 1)
    assert divergence is None, divergence.describe("OnnxStep", "len 1, batch 1")


def test_the_build_cuts_object_addresses_out_of_node_metadata(onnx_file):
    """Mistral's window calls torch.sym_min, whose repr ("<function sym_min at 0x7f...>") the exporter records in each
    node's module stack: an address that differs in every process. The build's ONNX writer cuts it out, so that two
    builds give the same bytes."""
    import onnx_ir as ir

    from aot.export.onnx_export import _drop_unreproducible_metadata

    model = ir.load(str(onnx_file("mistral_window_8")))
    values = lambda: [value for node in ir.traversal.RecursiveGraphIterator(model.graph) for value in node.metadata_props.values()]  # noqa: E731
    assert any("<function sym_min at 0x" in value for value in values())  # precondition: the exporter recorded an address
    _drop_unreproducible_metadata(model)
    assert any("<function sym_min>" in value for value in values())
    assert not [value for value in values() if " at 0x" in value]
