"""``aot bench``: every runner of a build (and its peers) timed in a process of its own.

- :mod:`aot.bench.driver`: the grid, the shuffled rounds, the paired ratios, the report;
- :mod:`aot.bench.request`: what a bench is asked, checked against the build before anything runs;
- :mod:`aot.bench.worker`: one runner hosted alone, spoken to over a pipe;
- :mod:`aot.bench.peers`: what other tools make of the same eager model (their names: :mod:`aot.bench.peer_groups`);
- :mod:`aot.bench.chart`: the speedups as a chart.

The names below load the driver (and torch) when first used: the command line reads
:mod:`aot.bench.peer_groups` for its help without them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BenchReport", "RunnerFigures", "ShapeFigures", "bench", "cpu_model", "grid_shapes"]


def __getattr__(name: str) -> Any:
    if name == "grid_shapes":
        from aot.bench.request import grid_shapes

        return grid_shapes
    if name in __all__:
        from aot.bench import driver

        return getattr(driver, name)
    raise AttributeError(f"module 'aot.bench' has no attribute '{name}'")
