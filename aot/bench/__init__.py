"""``aot bench``: every runner of a build (and its peers) timed in a process of its own.

- :mod:`aot.bench.driver`: the grid, the shuffled rounds, the paired ratios, the report;
- :mod:`aot.bench.worker`: one runner hosted alone, spoken to over a pipe;
- :mod:`aot.bench.peers`: what other tools make of the same eager model;
- :mod:`aot.bench.chart`: the speedups as a PNG.
"""

from aot.bench.driver import BenchReport, RunnerFigures, ShapeFigures, bench, cpu_model, grid_shapes

__all__ = ["BenchReport", "RunnerFigures", "ShapeFigures", "bench", "cpu_model", "grid_shapes"]
