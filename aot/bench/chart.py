"""``aot bench --chart``: the speedups over eager as a bar chart (needs matplotlib: ``pip install 'aot[chart]'``)."""

from __future__ import annotations

from pathlib import Path

from aot.bench.driver import BenchReport
from aot.errors import RecipeError


def draw_chart(report: BenchReport, path: Path) -> None:
    """A bar chart of the paired speedups over eager, per shape and runner."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RecipeError("--chart needs matplotlib: pip install 'aot[chart]'") from None
    labels = [",".join(f"{k}={v}" for k, v in s.shape.items()) + ("" if s.measure == "call" else f" {s.measure}") for s in report.shapes]
    runner_names = [r.runner for r in report.shapes[0].runners] if report.shapes else []
    figure, axes = plt.subplots(figsize=(max(4, 1.8 * len(labels) * len(runner_names) / 2), 3.5))
    width = 0.8 / max(len(runner_names), 1)
    for index, name in enumerate(runner_names):
        values = [next(r.paired_speedup for r in s.runners if r.runner == name) for s in report.shapes]
        positions = [i + index * width for i in range(len(labels))]
        bars = axes.bar(positions, values, width, label=name)
        axes.bar_label(bars, fmt="%.2fx", fontsize=8)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xticks([i + width * (len(runner_names) - 1) / 2 for i in range(len(labels))], labels)
    axes.set_ylabel("speedup over eager (paired median)")
    axes.set_title(f"aot bench: {Path(report.build).name}, {report.cpu if report.device == 'cpu' else report.device}, {report.threads} threads, {report.mode}", fontsize=9)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(figure)
