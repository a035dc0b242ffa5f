"""``aot bench`` on a decoder build: time to the first token and time per later token, per runner, each in its own process."""

from __future__ import annotations

import textwrap

import pytest

from aot.bench import bench
from aot.bench.generation import DECODE, PREFILL
from aot.builder.spine import build
from aot.errors import RecipeError


@pytest.fixture(scope="module")
def decoder_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_decoder")
    recipe = root / "tiny_gpt2.yaml"
    recipe.write_text(textwrap.dedent("""\
        model:
          config: {model_type: gpt2, n_embd: 64, n_layer: 2, n_head: 4, vocab_size: 128, n_positions: 128, initializer_range: 0.2}
          class: GPT2LMHeadModel
        trace: {frontend: export}
        generation: {cache: true, new_tokens: 8, prompt_lengths: [3]}
        """))
    return build(recipe, root / "out").output


@pytest.mark.artifact
def test_each_runner_gets_a_prefill_and_a_decode_figure_per_shape(decoder_build):
    report = bench(decoder_build, {"batch": [1, 2], "prompt": [6]}, runs=2, warmup=1, new_tokens=5, gap_ms=0)
    assert [(s.shape, s.measure) for s in report.shapes] == [
        ({"batch": 1, "prompt": 6}, PREFILL), ({"batch": 1, "prompt": 6}, DECODE),
        ({"batch": 2, "prompt": 6}, PREFILL), ({"batch": 2, "prompt": 6}, DECODE),
    ]
    for shape in report.shapes:
        assert [r.runner for r in shape.runners] == ["eager", "graph_module", "onnx"]
        assert all(r.median_ms > 0 and r.paired_speedup > 0 for r in shape.runners)
    assert len(set(report.pids.values())) == 3, "each runner in its own process"


@pytest.mark.artifact
@pytest.mark.parametrize(("arguments", "message"), [({"peers": ("ort_torchscript",)}, "takes only the decoder peers"), ({"new_tokens": 1}, "at least 2")])
def test_what_a_decoder_bench_cannot_do_is_refused(decoder_build, arguments, message):
    with pytest.raises(RecipeError, match=message):
        bench(decoder_build, runs=1, **arguments)


@pytest.mark.artifact
def test_an_unknown_dim_names_the_decoder_dims(decoder_build):
    with pytest.raises(RecipeError, match="it has: batch, prompt"):
        bench(decoder_build, {"sequence": [4]}, runs=1)


@pytest.mark.full
def test_eager_in_bfloat16_is_a_decoder_peer_and_the_group_skips_the_converting_peers_saying_why(decoder_build):
    report = bench(decoder_build, {"batch": [1], "prompt": [6]}, runs=2, warmup=1, new_tokens=4, gap_ms=0, peers=("decoder",))
    assert [r.runner for r in report.shapes[0].runners] == ["eager", "graph_module", "onnx", "eager_bf16"]
    assert all(r.median_ms > 0 for shape in report.shapes for r in shape.runners)
    assert report.peer_failures == {}
    for peer in ("ort_genai", "llama_cpp"):  # the tiny recipe is built from a config: there is no checkpoint to convert
        assert "model.pretrained checkpoint, which this recipe has not" in report.peers_skipped[peer], report.peers_skipped


def test_the_decoder_peers_are_refused_for_an_encoder(tiny_build):
    with pytest.raises(RecipeError, match="the decoder peers are for a decoder build"):
        bench(tiny_build, runs=1, peers=("eager_bf16",))
