"""``aot bench --chart``: the speedups over eager as a bar chart (needs matplotlib: ``pip install 'aot[chart]'``).

:func:`check_chart_path` runs before anything is timed, so that a chart that could not be written does not cost the
run; the command prints its results before :func:`draw_chart` writes the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aot.bench.driver import BenchReport, counted
from aot.errors import RecipeError, first_line


def check_chart_path(path: Path) -> None:
    """A chart can be written at ``path``: matplotlib is there and writes its extension's format, and its directory
    exists and takes files. A RecipeError naming ``--chart`` otherwise; nothing is written. The directory is checked
    first: that needs no matplotlib."""
    parent = path.parent
    if not parent.exists():
        raise RecipeError(f"--chart {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise RecipeError(f"--chart {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise RecipeError(f"--chart {path}: not writable here")
    chart_format(path)


def chart_format(path: Path) -> str:
    """The format matplotlib writes ``path`` in: its extension's, else matplotlib's default (``savefig.format``)."""
    matplotlib = _matplotlib()
    from matplotlib.figure import Figure

    written = Figure().canvas.get_supported_filetypes()  # what savefig writes, as matplotlib itself says
    wanted = path.suffix[1:].lower() or matplotlib.rcParams["savefig.format"]
    if wanted not in written:
        raise RecipeError(f"--chart {path}: matplotlib writes no '.{wanted}' files (it writes {', '.join(sorted(written))})")
    return wanted


def draw_chart(report: BenchReport, path: Path) -> None:
    """A bar chart of the paired speedups over eager, per shape and runner."""
    written = chart_format(path)
    import matplotlib.pyplot as plt

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
    axes.set_title(f"aot bench: {Path(report.build).name}, {report.cpu if report.device == 'cpu' else report.device}, {counted(report.threads, 'thread')}, {report.mode}", fontsize=9)
    axes.legend()
    figure.tight_layout()
    # A PNG without matplotlib's version in it: the same figures, the same bytes. Other writers take other keys, or none.
    metadata = {"metadata": {"Software": None}} if written == "png" else {}
    if not path.suffix:  # as matplotlib names it given no format: NAME.png (the format's extension added)
        path = path.with_name(f"{path.name}.{written}")
    try:
        figure.savefig(path, format=written, dpi=120, **metadata)
    except (RuntimeError, ValueError) as error:  # a writer that needs more than matplotlib (pgf: a LaTeX)
        raise RecipeError(f"--chart {path}: matplotlib could not write it: {first_line(error)}") from None
    finally:
        plt.close(figure)


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise RecipeError("--chart needs matplotlib: pip install 'aot[chart]'") from None
    matplotlib.use("Agg")
    return matplotlib
