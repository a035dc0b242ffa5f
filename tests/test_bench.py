"""aot bench: each runner in its own process, paired ratios against eager from the same rounds, peers, memory."""

from __future__ import annotations

import json
import os

import pytest


@pytest.mark.artifact
def test_bench_runs_each_runner_in_its_own_process_with_paired_ratios(cli, tiny_build):
    result = cli("bench", tiny_build, "-s", "batch=1,3", "--runs", "3", "--warmup", "1", "--gap-ms", "1", "--peers", "ort_dynamo", "--json")
    assert result.exit_code == 0, result.described
    report = json.loads(result.stdout)
    assert report["mode"] == "processes" and report["cpu"] and report["threads"] >= 1
    assert set(report["pids"]) == {"eager", "graph_module", "onnx", "ort_dynamo"}
    assert len(set(report["pids"].values())) == 4 and os.getpid() not in report["pids"].values()
    assert [shape["shape"] for shape in report["shapes"]] == [{"batch": 1, "sequence": 8}, {"batch": 3, "sequence": 8}]
    assert report["peer_failures"] == {}
    for shape in report["shapes"]:
        by_name = {r["runner"]: r for r in shape["runners"]}
        assert set(by_name) == {"eager", "graph_module", "onnx", "ort_dynamo"}
        assert by_name["eager"]["speedup"] == 1.0 and by_name["eager"]["paired_speedup"] == 1.0
        for figures in by_name.values():
            assert 0 < figures["p10_ms"] <= figures["median_ms"] <= figures["p90_ms"]
            # the report rounds a speedup to 3 decimals: a runner ~90x slower than eager (0.011) is off by 1.3% from that alone
            assert figures["speedup"] == pytest.approx(by_name["eager"]["median_ms"] / figures["median_ms"], rel=1e-2, abs=5e-4)
            assert 0 < figures["paired_p10"] <= figures["paired_speedup"] <= figures["paired_p90"]
            assert figures["first_call_ms"] > 0
        for name in ("eager", "graph_module", "onnx"):
            assert by_name[name]["peak_mib"] is not None and 0 <= by_name[name]["peak_mib"] < 2048, by_name[name]
        assert by_name["ort_dynamo"]["peak_mib"] is None, "a peer's process built it first"


@pytest.mark.artifact
def test_in_process_mode_is_labelled_and_has_no_memory(cli, tiny_build):
    result = cli("bench", tiny_build, "--runs", "2", "--warmup", "1", "--gap-ms", "0", "--in-process", "--json")
    assert result.exit_code == 0, result.described
    report = json.loads(result.stdout)
    assert report["mode"] == "in-process"
    assert set(report["pids"].values()) == {os.getpid()}
    assert all(r["peak_mib"] is None for shape in report["shapes"] for r in shape["runners"])
    result = cli("bench", tiny_build, "--runs", "2", "--warmup", "1", "--gap-ms", "0", "--in-process")
    assert "ALL RUNNERS IN ONE PROCESS" in result.stdout, result.described


@pytest.mark.artifact
def test_bench_rejects_unknown_dim_and_peer(cli, tiny_build):
    result = cli("bench", tiny_build, "-s", "width=3", "--runs", "1", "--no-memory")
    assert result.exit_code == 2 and "no dim 'width'" in result.stderr, result.described
    result = cli("bench", tiny_build, "--peers", "tensorrt")
    assert result.exit_code == 2 and "unknown peer(s) tensorrt" in result.stderr, result.described


@pytest.mark.full
def test_transformers_own_exporter_is_a_peer_timed_in_its_own_process(cli, tiny_build):
    pytest.importorskip("transformers.exporters", reason="transformers' exporter ships from 5.24")
    result = cli("bench", tiny_build, "-s", "batch=1,2", "--runs", "2", "--warmup", "1", "--gap-ms", "0", "--no-memory",
                 "--peers", "hf_onnx", "--json")
    assert result.exit_code == 0, result.described
    report = json.loads(result.stdout)
    assert report["peer_failures"] == {}, report["peer_failures"]
    assert report["pids"]["hf_onnx"] not in {pid for name, pid in report["pids"].items() if name != "hf_onnx"}
    for shape in report["shapes"]:
        figures = {r["runner"]: r for r in shape["runners"]}["hf_onnx"]
        assert 0 < figures["median_ms"] and 0 < figures["paired_speedup"]
