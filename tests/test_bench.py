"""aot bench: interleaved timings, ratios against eager from the same run, peers, memory."""

from __future__ import annotations

import json

import pytest

from aot.bench_memory import measure_peak_mib

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory):
    from aot.build import build
    from tests.conftest import TINY_BERT

    root = tmp_path_factory.mktemp("bench")
    recipe = root / "tiny.yaml"
    recipe.write_text(TINY_BERT)
    return build(recipe, root / "out").output


def test_bench_reports_every_runner_per_shape_as_ratio_to_eager(cli, tiny_build):
    result = cli("bench", tiny_build, "-s", "batch=1,3", "--runs", "3", "--warmup", "1", "--no-memory", "--peers", "ort_dynamo", "--json")
    assert result.exit_code == 0, result.described
    report = json.loads(result.stdout)
    assert [shape["shape"] for shape in report["shapes"]] == [{"batch": 1, "sequence": 8}, {"batch": 3, "sequence": 8}]
    assert report["peer_failures"] == {}
    for shape in report["shapes"]:
        by_name = {r["runner"]: r for r in shape["runners"]}
        assert set(by_name) == {"eager", "graph_module", "onnx", "ort_dynamo"}
        assert by_name["eager"]["speedup"] == 1.0
        for figures in by_name.values():
            assert 0 < figures["p10_ms"] <= figures["median_ms"] <= figures["p90_ms"]
            assert figures["speedup"] == pytest.approx(by_name["eager"]["median_ms"] / figures["median_ms"], rel=1e-2)


def test_bench_rejects_unknown_dim_and_peer(cli, tiny_build):
    result = cli("bench", tiny_build, "-s", "width=3", "--runs", "1", "--no-memory")
    assert result.exit_code == 2 and "no dim 'width'" in result.stderr, result.described
    result = cli("bench", tiny_build, "--peers", "tensorrt")
    assert result.exit_code == 2 and "unknown peer(s) tensorrt" in result.stderr, result.described


def test_peak_memory_is_measured_per_runner_in_a_fresh_process(tiny_build):
    from pathlib import Path

    for runner in ("eager", "graph_module", "onnx"):
        peak = measure_peak_mib(Path(tiny_build), runner, {"batch": 2, "sequence": 8}, threads=1)
        assert peak is not None and 0 <= peak < 2048, (runner, peak)
