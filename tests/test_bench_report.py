"""What aot bench prints: the table's labels and footnotes, the --peers help from the groups, and the chart: its path
checked before anything runs, written only after the results are printed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from aot.bench.driver import BenchReport, RunnerFigures, ShapeFigures
from aot.bench.peer_groups import PEER_GROUPS
from aot.errors import RecipeError


def _figures(runner: str, median_ms: float, first_call_ms: float = 4321.0, peak_mib: float | None = 765.0) -> RunnerFigures:
    return RunnerFigures(runner=runner, median_ms=median_ms, p10_ms=median_ms, p90_ms=median_ms, speedup=1.0, paired_speedup=1.0,
                         paired_p10=1.0, paired_p90=1.0, first_call_ms=first_call_ms, peak_mib=peak_mib)


def _decoder_report(threads: int = 1, runs: int = 1) -> BenchReport:
    """A decoder's report as the driver makes it: per shape a prefill and a decode set, from one warm-up each."""
    shape = {"batch": 1, "prompt": 4}
    prefill = ShapeFigures(shape, [_figures("eager", 11.0), _figures("onnx", 5.0, 1234.0, None)], measure="prefill")
    decode = ShapeFigures(shape, [_figures("eager", 3.0), _figures("onnx", 1.0, 1234.0, None)], measure="decode")
    return BenchReport(build="b", cpu="a cpu", threads=threads, mode="processes", runs=runs, warmup=0, gap_ms=0.0,
                       shapes=[prefill, decode])


@pytest.fixture
def bench_returns(monkeypatch):
    """``aot bench`` answers ``report`` without timing anything."""
    import aot.bench.driver

    def answer(report: BenchReport) -> None:
        monkeypatch.setattr(aot.bench.driver, "bench", lambda *arguments, **options: report)

    return answer


def test_a_decoder_table_shows_the_warm_up_figures_once_per_shape_and_explains_its_columns(cli, bench_returns, tmp_path):
    report = _decoder_report()
    assert [s.measure for s in report.shapes] == ["prefill", "decode"] and report.shapes[0].shape == report.shapes[1].shape
    bench_returns(report)
    result = cli("bench", tmp_path)
    assert result.exit_code == 0, result.described
    assert "1 thread, 1 round," in result.stdout, result.described
    assert result.stdout.count("4321") == 1 and result.stdout.count("1234") == 1 and result.stdout.count("765") == 1, result.described
    rows = [line for line in result.stdout.splitlines() if "│" in line]
    assert "4321" in rows[0] and "prefill" in rows[0] and "decode" in rows[2] and "4321" not in rows[2], rows
    notes = result.stdout.split("└")[-1]
    assert "vs eager: eager's median / the runner's median" in notes, notes
    assert "peak MiB: the runner's process at its peak over the warm-up at this shape, less its size before it loaded the runner" in notes
    assert "not a size" in notes and "1st call ms, peak MiB: once per shape, on its prefill rows" in notes, notes


def test_the_title_counts_threads_and_rounds_in_the_plural(cli, bench_returns, tmp_path):
    bench_returns(_decoder_report(threads=2, runs=3))
    result = cli("bench", tmp_path)
    assert result.exit_code == 0 and "2 threads, 3 rounds," in result.stdout, result.described


def test_the_peers_help_names_every_group_with_its_members(cli):
    groups = {group: members for group, members in PEER_GROUPS.items() if group}
    assert len(PEER_GROUPS["onnx"]) == 5 and "hf_onnx" in PEER_GROUPS["onnx"]
    result = cli("bench", "--help")
    assert result.exit_code == 0, result.described
    text = " ".join(result.stdout.split())
    assert "four" not in text, text
    for group, members in groups.items():
        assert f"'{group}' (" in text and f", {len(members)}: " in text, (group, text)
        words = set(text.split(f"'{group}' (", 1)[1].split(")", 1)[0].replace(",", " ").split())
        for member in members:  # by name, or through a group it holds ("the onnx and int8 groups")
            assert member in words or any(other in words and member in PEER_GROUPS[other] for other in groups if other != group), (
                group, member, words)


def test_the_command_line_loads_without_torch_though_its_help_reads_the_peer_groups():
    code = "import sys, aot.cli; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_the_results_are_printed_before_the_chart_is_written(cli, bench_returns, tmp_path, monkeypatch, as_json):
    import aot.bench.chart

    def fail(report, path):
        raise RecipeError(f"--chart {path}: the disk filled up")

    monkeypatch.setattr(aot.bench.chart, "check_chart_path", lambda path: None)  # the chart's path looked fine up front
    monkeypatch.setattr(aot.bench.chart, "draw_chart", fail)
    bench_returns(_decoder_report())
    result = cli("bench", tmp_path, "--chart", tmp_path / "c.png", *(["--json"] if as_json else []))
    assert result.exit_code == 2 and "the disk filled up" in result.stderr, result.described
    if as_json:
        assert json.loads(result.stdout)["shapes"][0]["measure"] == "prefill", result.described
    else:
        assert "vs eager" in result.stdout and "4321" in result.stdout, result.described


def test_the_chart_needs_matplotlib_which_is_said_before_the_build(cli, write_recipe, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(ImportError):
        __import__("matplotlib")
    out = tmp_path / "out"
    result = cli("bench", write_recipe(), "-o", out, "--runs", "1", "--chart", tmp_path / "c.png")
    assert result.exit_code == 2 and result.stderr.strip() == "aot: error: --chart needs matplotlib: pip install 'aot[chart]'", result.described
    assert not out.exists(), "refused before the build"


@pytest.mark.parametrize(("where", "message"), [
    ("c.txt", "matplotlib writes no '.txt' files (it writes "),
    ("missing/c.png", "does not exist"),
    ("a_file/c.png", "a_file is not a directory"),
])
def test_a_chart_that_could_not_be_written_is_refused_before_the_build(cli, write_recipe, tmp_path, where, message):
    if where.endswith(".txt"):  # the directory's checks come first and need no matplotlib; the formats are its own
        pytest.importorskip("matplotlib", reason="the chart's formats are matplotlib's (pip install 'aot[chart]')")
        from matplotlib.figure import Figure

        assert "png" in Figure().canvas.get_supported_filetypes() and "txt" not in Figure().canvas.get_supported_filetypes()
    (tmp_path / "a_file").write_text("not a directory")
    out, chart = tmp_path / "out", tmp_path / where
    result = cli("bench", write_recipe(), "-o", out, "--runs", "1", "--chart", chart)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and f"--chart {chart}: " in lines[0] and message in lines[0], result.described
    assert not out.exists() and not chart.exists(), "refused before the build: nothing written"


def test_a_chart_is_written_in_the_format_its_extension_names(tmp_path):
    pytest.importorskip("matplotlib", reason="the chart's formats are matplotlib's (pip install 'aot[chart]')")
    from aot.bench.chart import check_chart_path, draw_chart

    for name, magic, written in (("c.png", b"\x89PNG", "c.png"), ("c.svg", b"<?xml", "c.svg"), ("c.pdf", b"%PDF", "c.pdf"),
                                 ("c", b"\x89PNG", "c.png")):  # no extension: NAME.png, as matplotlib names it
        path = tmp_path / name
        check_chart_path(path)
        assert not path.exists()
        draw_chart(_decoder_report(), path)
        assert (tmp_path / written).read_bytes().startswith(magic), name
